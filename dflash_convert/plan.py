"""The conversion plan: which ggml type each tensor gets, its GGUF shape and size, and its bytes.

Type rules are llama.cpp's converter's: 1-D tensors and *_norm.weight stay F32, names that do not
end in .weight stay F32, everything else takes the output type; Q8_0 needs ne[0] % 32 == 0 and
falls back to F16 otherwise (with a warning, as upstream).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .drafter import Drafter, DrafterTensor
from .format.ggml import BLOCK_GEOMETRY, OUTTYPES, FileType, GGMLType, tensor_nbytes
from .quant import as_torch, encode
from .write import OutTensor

log = logging.getLogger("dflash_convert")

CHUNK_ELEMENTS = 1 << 21  # 2M values per chunk: large enough for fast kernels, small for memory


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


def _prefetched(items: Iterable[np.ndarray], depth: int = 3) -> Iterator[np.ndarray]:
    """Run a producer in a thread so reading and encoding overlap with writing."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # hand the error to the consumer
            q.put(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        th.join()


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


def _encoded_chunks(p: PlannedTensor, fds: FdCache) -> Iterator[np.ndarray]:
    ref = p.tensor.ref
    n = ref.n_elements
    fd = fds.get(ref.path)
    perm = p.tensor.permute_head_dim
    step = CHUNK_ELEMENTS
    if perm:  # whole heads per chunk: rows of one head are permuted together
        row = ref.shape[1] if len(ref.shape) > 1 else 1
        head = perm * row
        step = max(head, CHUNK_ELEMENTS // head * head)
    for start in range(0, n, step):
        count = min(step, n - start)
        words = as_torch(ref.read(start, count, fd), ref.dtype)
        if perm:
            words = _neox_permute(words, perm, row)
        yield encode(words, p.ggml_type)


def _neox_permute(words, head_dim: int, row: int):
    """Interleaved (GPT-J) rotary layout -> NeoX: within each head, even rows first, then odd."""
    x = words.view(-1, head_dim // 2, 2, row)
    return x.transpose(1, 2).reshape(-1)


def out_tensors(planned: list[PlannedTensor], fds: FdCache) -> list[OutTensor]:
    return [OutTensor(p.tensor.gguf_name, p.ne, p.ggml_type, p.nbytes,
                      (lambda p=p: _prefetched(_encoded_chunks(p, fds)))) for p in planned]
