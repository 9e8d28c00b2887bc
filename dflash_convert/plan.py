"""The conversion plan: which ggml type each tensor gets, its GGUF shape and size, and its bytes.

Type rules are llama.cpp's converter's: 1-D tensors and *_norm.weight stay F32, names that do not
end in .weight stay F32, everything else takes the output type; Q8_0 needs ne[0] % 32 == 0 and
falls back to F16 otherwise (with a warning, as upstream).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .drafter import Drafter, DrafterTensor
from .format.ggml import BLOCK_GEOMETRY, OUTTYPES, FileType, GGMLType, tensor_nbytes
from .quant import encode
from .write import OutTensor

log = logging.getLogger("dflash_convert")

CHUNK_ELEMENTS = 1 << 20  # 1M values per chunk: cache-friendly kernels, bounded memory


@dataclass
class PlannedTensor:
    tensor: DrafterTensor
    ggml_type: GGMLType
    ne: tuple[int, ...]
    nbytes: int
    note: str = ""


def choose_file_type(outtype: str, first_matrix_dtype: str | None) -> tuple[FileType, GGMLType]:
    """--outtype -> (general.file_type, matrix type); auto follows the first >=2-D tensor's dtype."""
    if outtype == "auto":
        outtype = "bf16" if first_matrix_dtype == "BF16" else "f16"
    return OUTTYPES[outtype]


def tensor_type(name: str, shape: tuple[int, ...], matrix_type: GGMLType) -> tuple[GGMLType, str]:
    if name == "d2t":
        return GGMLType.I64, ""  # the runtime asserts I64
    if len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return GGMLType.F32, ""
    block = BLOCK_GEOMETRY[matrix_type][0]
    if shape[-1] % block:
        return GGMLType.F16, f"ne0={shape[-1]} not a multiple of {block}, F16 instead of {matrix_type.name}"
    return matrix_type, ""


def plan_tensors(d: Drafter, matrix_type: GGMLType) -> list[PlannedTensor]:
    out = []
    for t in d.tensors:
        ggml_type, note = tensor_type(t.gguf_name, t.shape, matrix_type)
        if note:
            log.warning("%s: %s", t.gguf_name, note)
        ne = tuple(reversed(t.shape)) or (1,)
        out.append(PlannedTensor(t, ggml_type, ne, tensor_nbytes(ggml_type, ne), note))
    return out


class FdCache:
    """One read-only descriptor per source file for the whole conversion."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def get(self, path: os.PathLike) -> int:
        key = os.fspath(path)
        if key not in self._fds:
            self._fds[key] = os.open(key, os.O_RDONLY)
        return self._fds[key]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _read_encoded(p: PlannedTensor, fd: int, start: int, count: int) -> np.ndarray:
    t = p.tensor
    if t.computed is not None:
        return t.computed.reshape(-1)[start:start + count]
    ref = t.ref
    raw = ref.read(start, count, fd)
    if t.permute_head_dim:
        raw = _neox_permute(raw, t.permute_head_dim, ref.shape[1] if len(ref.shape) > 1 else 1)
    if t.row_override is not None:
        row, values = t.row_override  # values: raw words of the source dtype, one row
        lo, hi = row * values.size, (row + 1) * values.size
        a, b = max(lo, start), min(hi, start + count)
        if a < b:
            raw = raw.copy()
            raw[a - start:b - start] = values[a - lo:b - lo]
    return encode(raw, ref.dtype, p.ggml_type)


def _chunk_spans(p: PlannedTensor) -> list[tuple[int, int]]:
    ref = p.tensor.ref
    n = p.tensor.computed.size if p.tensor.computed is not None else ref.n_elements
    # Q8_0 works on several temporaries per value: smaller chunks stay in cache
    step = CHUNK_ELEMENTS // 2 if p.ggml_type == GGMLType.Q8_0 else CHUNK_ELEMENTS
    if p.tensor.permute_head_dim:  # whole heads per chunk: rows of one head are permuted together
        row = ref.shape[1] if len(ref.shape) > 1 else 1
        head = p.tensor.permute_head_dim * row
        step = max(head, step // head * head)
    return [(s, min(step, n - s)) for s in range(0, n, step)]


def _neox_permute(words: np.ndarray, head_dim: int, row: int) -> np.ndarray:
    """Interleaved (GPT-J) rotary layout -> NeoX: within each head, even rows first, then odd."""
    return np.ascontiguousarray(words.reshape(-1, head_dim // 2, 2, row).transpose(0, 2, 1, 3)).reshape(-1)


def recycle_chunk_memory() -> None:
    """Keep freed chunk buffers in the process instead of returning them to the kernel.

    Every chunk allocates a few MB of numpy temporaries. glibc serves such sizes with fresh
    mmaps and unmaps them on free, so each chunk page-faults its memory back in; on the 2-core
    VM this costs seconds per 3 GB converted (bench/). Raising the mmap and trim thresholds makes
    glibc reuse the same heap pages; memory stays bounded by the look-ahead window. No effect
    (and no error) outside glibc.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 256 << 20)
    mallopt(m_top_pad, 64 << 20)


class ChunkPipeline:
    """Encode chunks on a thread pool, hand them out in order; memory bounded by the look-ahead."""

    def __init__(self, workers: int | None = None, lookahead: int = 12) -> None:
        recycle_chunk_memory()
        self.pool = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2, thread_name_prefix="encode")
        self.lookahead = lookahead
        self.fds = FdCache()

    def chunks(self, p: PlannedTensor) -> Iterator[np.ndarray]:
        fd = self.fds.get(p.tensor.ref.path)
        pending: deque[Future] = deque()
        spans = iter(_chunk_spans(p))
        try:
            for start, count in spans:
                pending.append(self.pool.submit(_read_encoded, p, fd, start, count))
                if len(pending) >= self.lookahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.fds.close()


def out_tensors(planned: list[PlannedTensor], pipeline: ChunkPipeline) -> list[OutTensor]:
    return [OutTensor(p.tensor.gguf_name, p.ne, p.ggml_type, p.nbytes, (lambda p=p: pipeline.chunks(p))) for p in planned]
