"""The one streaming pipeline: tensor sources -> row chunks -> encode -> the atomic writer.

Every whole-file pass goes through here: convert (safetensors or computed sources, float
encoders), migrate (GGUF sources, byte copy) and quantize (any source, quantizing encoders).
Chunks are whole rows (whole heads for permuted sources), read by position, encoded on a thread
pool and handed to the writer in order; the look-ahead window bounds memory whatever the model
size.
"""

from __future__ import annotations

import ctypes
import gc
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .encoders import COPY
from .files import FdCache
from .format.ggml import GGMLType
from .plan import PlannedTensor
from .tensor_source import n_rows, row_length
from .write import OutTensor

CHUNK_ELEMENTS = 1 << 20  # about 1M values per chunk: cache-friendly kernels, bounded memory
# quantizers work on several temporaries per value: smaller chunks stay in cache
SMALL_CHUNK_TYPES = frozenset({GGMLType.Q8_0})


def recycle_chunk_memory() -> None:
    """Keep freed chunk buffers in the process instead of returning them to the kernel."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 256 << 20)
    mallopt(m_top_pad, 64 << 20)


def return_free_memory() -> None:
    """Hand the heap's free pages back to the kernel (glibc's malloc_trim; a no-op elsewhere).

    A long measurement frees many mid-sized tensors between phases; glibc keeps their pages resident
    (below the mmap threshold) until trimmed, and they would count in the next phase's peak.
    """
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def row_spans(p: PlannedTensor, chunk_elements: int | None = None) -> list[tuple[int, int]]:
    """Row ranges [a, b) of about ``chunk_elements`` values each, aligned to the source's row groups."""
    if chunk_elements is None:
        chunk_elements = CHUNK_ELEMENTS
    shape = p.tensor.shape
    rows, row = n_rows(shape), row_length(shape)
    if p.ggml_type in SMALL_CHUNK_TYPES:
        chunk_elements //= 2
    step = max(1, chunk_elements // max(1, row))
    align = getattr(p.tensor.source, "row_align", 1)
    step = max(align, step // align * align)
    return [(a, min(rows, a + step)) for a in range(0, rows, step)]


def file_span(p: PlannedTensor) -> tuple[Path, int] | None:
    """(path, offset) of a tensor whose output bytes lie as they are in a source file, for the writer's in-kernel copy."""
    if p.encode is not COPY:
        return None
    src = p.tensor.source
    path, offset, nbytes = getattr(src, "path", None), getattr(src, "offset", None), getattr(src, "nbytes", None)
    if not isinstance(path, Path) or not isinstance(offset, int) or nbytes != p.nbytes:
        return None
    return path, offset


def _encoded(p: PlannedTensor, a: int, b: int, fds: FdCache) -> np.ndarray:
    return p.encode(p.tensor.source.rows(a, b, fds))


class ChunkPipeline:
    """Encode chunks on a thread pool, hand them out in order; memory bounded by the look-ahead."""

    def __init__(self, workers: int | None = None, lookahead: int = 12) -> None:
        recycle_chunk_memory()
        # The cyclic collector stays off while chunks stream: every chunk allocates a few objects, and
        # the collections they trigger walk everything numba and the readers left in the heap (a full
        # one takes tens of ms). What a pass allocates is bounded by the look-ahead; close() turns
        # the collector back on (if it was on) and the next collection sees any cycles.
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        self.pool = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2, thread_name_prefix="encode")
        self.lookahead = lookahead
        self.fds = FdCache()

    def chunks(self, p: PlannedTensor) -> Iterator[np.ndarray]:
        """The encoded row spans of ``p`` in order, encoded ahead on the pool."""
        pending: deque[Future] = deque()
        try:
            for a, b in row_spans(p):
                pending.append(self.pool.submit(_encoded, p, a, b, self.fds))
                if len(pending) >= self.lookahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()

    def out_tensors(self, planned: list[PlannedTensor]) -> list[OutTensor]:
        """An OutTensor per planned tensor, its data streamed from ``chunks``."""
        return [OutTensor(p.tensor.gguf_name, p.ne, p.ggml_type, p.nbytes, (lambda p=p: self.chunks(p)), file_span(p))
                for p in planned]

    def close(self) -> None:
        """Shut the pool down, close the sources and re-enable the garbage collector."""
        try:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.fds.close()
        finally:
            if self._gc_was_enabled:
                gc.enable()

    def __enter__(self) -> ChunkPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
