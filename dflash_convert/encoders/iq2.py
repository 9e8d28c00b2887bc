"""Bit-exact ports of ggml's 2-bit and 1-bit grid quantizers: IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M.

ggml's searches in one source (``_iq2_kernels``) that numba compiles or Python runs as it is (the
same bytes, far slower). IQ2_XXS, IQ2_XS and IQ1_S refuse a missing importance matrix (ggml asserts);
all refuse non-finite input (ggml aborts). Specification: docs/quantizers.md, "IQ2 and IQ1".
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from ..format.iq2_grids import IQ1S_POINTS, IQ2S_POINTS, IQ2XS_POINTS, IQ2XXS_POINTS
from . import jit
from .grid_neighbours import neighbour_block
from .legacy import as_blocks, fp16_bits

__all__ = ["IMPORTANCE_REQUIRED", "quantize_iq1_m", "quantize_iq1_s", "quantize_iq2_s", "quantize_iq2_xs", "quantize_iq2_xxs"]

QK_K = 256
_F32 = np.float32
_KMAP_SIZE = 43692  # every 8-level code with levels 0-2, as ggml sizes kmap (codes up to 0xAAAA)
_CHUNK = 1024  # codes per neighbour-distance tile: [1024, 2048] float32 is 8 MiB

# type -> (grid points, distinct distances whose points are listed as neighbours, iq2_blocks' kind (_iq2_kernels.XXS,
# XS, S; -1: iq1_blocks), block bytes, importance required)
_TYPES: dict[str, tuple[tuple[int, ...], int, int, int, bool]] = {
    "IQ2_XXS": (IQ2XXS_POINTS, 2, 0, 66, True),
    "IQ2_XS": (IQ2XS_POINTS, 2, 1, 74, True),
    "IQ2_S": (IQ2S_POINTS, 1, 2, 82, False),
    "IQ1_S": (IQ1S_POINTS, 3, -1, 50, True),
    "IQ1_M": (IQ1S_POINTS, 3, -1, 56, False),
}

# the types ggml asserts on without quantization weights (ggml.c's ggml_quantize_requires_imatrix)
IMPORTANCE_REQUIRED: frozenset[str] = frozenset(name for name, t in _TYPES.items() if t[4])


_TABLES_LOCK = threading.Lock()  # the encode pool's threads would each build the tables on first use


def tables(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``iq2xs_init_impl``'s tables: (grid float32 [G, 8] of 2l+1, its levels int64, kmap int64 [43692], neighbours int64).

    kmap[u] is the grid index of code u, or ``-(offset + 1)`` into neighbours, where neighbours[offset]
    = n and the next n entries are the grid points at the ``nwant`` smallest distances from u (levels
    3 included, as ggml computes them), by (distance, index): ggml's qsort order, a total order.
    """
    with _TABLES_LOCK:
        return _tables("IQ1_S" if name == "IQ1_M" else name)  # IQ1_M: the same grid and neighbour count


@functools.cache
def _tables(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    points, nwant, _, _, _ = _TYPES[name]
    pts = np.array(points, np.int64)
    levels = (pts[:, None] >> (2 * np.arange(8))) & 3
    grid = (2 * levels + 1).astype(_F32)
    kmap = np.full(_KMAP_SIZE, -1, np.int64)
    kmap[pts] = np.arange(pts.size)
    off = np.flatnonzero(kmap < 0)
    g2 = (grid * grid).sum(axis=1)
    lists: list[np.ndarray] = []
    done = 0  # neighbour entries written by earlier tiles
    for c0 in range(0, off.size, _CHUNK):
        u = off[c0:c0 + _CHUNK]
        pos = (2 * ((u[:, None] >> (2 * np.arange(8))) & 3) + 1).astype(_F32)
        # exact in float32: every term is a small integer
        d2 = pos @ (-2 * grid.T)
        d2 += g2[None, :]
        d2 += (pos * pos).sum(axis=1)[:, None]
        block, head = neighbour_block(d2, nwant, np.int64)
        kmap[u] = -(done + head + 1)
        done += block.size
        lists.append(block)
    neigh = np.concatenate(lists)
    for a in (grid, levels, kmap, neigh):
        a.flags.writeable = False
    return grid, levels, kmap, neigh


def _importance(name: str, x: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    """The importance as float32 of whole super-blocks whose length divides the input, or an empty array."""
    if importance is None:
        if _TYPES[name][4]:
            raise ValueError(f"{name} needs an importance matrix (ggml asserts on quantizing without one)")
        return np.zeros(0, _F32)
    qw = np.asarray(importance)
    if qw.dtype != _F32 or qw.ndim != 1 or qw.size == 0 or qw.size % QK_K or x.size % qw.size:
        raise ValueError(f"importance must be float32 [row_length] (whole {QK_K}-value blocks) dividing the input; "
                         f"got {qw.dtype} {qw.shape} for {x.size} values")
    return np.ascontiguousarray(qw)


def _quantize(name: str, x: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    xb = as_blocks(x, QK_K)
    qw = _importance(name, x, importance)
    if not np.isfinite(xb).all():
        raise ValueError(f"{name} cannot quantize inf or NaN (ggml's search aborts on them)")
    _, _, kind, block_bytes, _ = _TYPES[name]
    out = np.zeros((xb.shape[0], block_bytes), np.uint8)
    if xb.shape[0] == 0:
        return out.reshape(-1)
    d = np.zeros(xb.shape[0], _F32)
    k = jit.iq2_kernels()
    if k is None:
        # lazy: the kernel source imports numba's register_jitable when it can; commands that never quantize skip it
        from . import _iq2_kernels as k
    grid, levels, kmap, neigh = tables(name)
    with np.errstate(all="ignore"):  # C's float semantics: overflow to inf is part of the arithmetic
        if kind >= 0:
            bad = k.iq2_blocks(xb, qw, qw.size > 0, kind, grid, levels, kmap, neigh, out[:, 2:], d)
        else:
            bad = k.iq1_blocks(xb, qw, qw.size > 0, name == "IQ1_M", levels, kmap, neigh, out if name == "IQ1_M" else out[:, 2:], d)
    if bad >= 0:
        raise ValueError(f"{name} cannot quantize block {bad}: its values are so large that every squared distance "
                         "overflows (ggml aborts on it)")
    bits = fp16_bits(d)
    if name == "IQ1_M":  # no d field: its fp16 bits are the top nibbles of the four 16-bit scale words
        for j in range(4):
            out[:, 49 + 2 * j] |= (((bits >> (4 * j)) & 15) << 4).astype(np.uint8)
    else:
        out[:, :2] = bits.view(np.uint8).reshape(-1, 2)
    return out.reshape(-1)


def quantize_iq2_xxs(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*256,)`` (whole rows) -> IQ2_XXS blocks ``(n*66,)``; ``importance``: float32 [row_length], required."""
    return _quantize("IQ2_XXS", x, importance)


def quantize_iq2_xs(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*256,)`` (whole rows) -> IQ2_XS blocks ``(n*74,)``; ``importance``: float32 [row_length], required."""
    return _quantize("IQ2_XS", x, importance)


def quantize_iq2_s(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*256,)`` (whole rows) -> IQ2_S blocks ``(n*82,)``; ``importance``: float32 [row_length] or None."""
    return _quantize("IQ2_S", x, importance)


def quantize_iq1_s(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*256,)`` (whole rows) -> IQ1_S blocks ``(n*50,)``; ``importance``: float32 [row_length], required."""
    return _quantize("IQ1_S", x, importance)


def quantize_iq1_m(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*256,)`` (whole rows) -> IQ1_M blocks ``(n*56,)``; ``importance``: float32 [row_length] or None."""
    return _quantize("IQ1_M", x, importance)
