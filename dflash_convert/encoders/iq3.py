"""Bit-exact ports of ggml's 3-bit grid quantizers: IQ3_XXS (256-point grid) and IQ3_S (512 points).

ggml's searches, run by a numba kernel (``_iq3_kernels``) or, without numba, by the numpy path here
(the same bytes, ~18x slower), with or without an importance matrix. Refuses non-finite input (ggml
aborts on it). Specification: docs/quantizers.md, "IQ3_XXS and IQ3_S".
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from ..format.iq3_grids import IQ3S_POINTS, IQ3XXS_POINTS
from . import jit
from .grid_neighbours import neighbour_block
from .legacy import as_blocks, fp16_bits

__all__ = ["quantize_iq3_s", "quantize_iq3_xxs"]

QK_K = 256
_F32 = np.float32
_KMAP_SIZE = 4096  # every 4-level combination (3 bits each)

# type -> (grid points, distinct distances whose points are listed as neighbours, block bytes)
_TYPES: dict[str, tuple[tuple[int, ...], int, int]] = {
    "IQ3_XXS": (IQ3XXS_POINTS, 2, 98),
    "IQ3_S": (IQ3S_POINTS, 3, 110),
}


_TABLES_LOCK = threading.Lock()  # the encode pool's threads would each build the tables on first use
_TILE_OFFSETS = 512  # off-grid points per distance tile: [512, 512, 4] int64 is 8 MiB


def tables(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``iq3xs_init_impl``'s tables: (grid int8 [G, 4] of 2l+1, kmap int32 [4096], neighbours uint16).

    kmap[u] is the grid index of level combination u, or ``-(offset + 1)`` into neighbours, where
    neighbours[offset] = n and the next n entries are the grid points at the ``nwant`` smallest
    distances from u, by (distance, index): ggml's qsort order, a total order, so deterministic.
    """
    with _TABLES_LOCK:
        return _tables(name)


@functools.cache
def _tables(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    points, nwant, _ = _TYPES[name]
    pts = np.array(points, np.int64)
    levels = (pts[:, None] >> (3 * np.arange(4))) & 7
    grid = (2 * levels + 1).astype(np.int8)
    kmap = np.full(_KMAP_SIZE, -1, np.int32)
    kmap[pts] = np.arange(pts.size, dtype=np.int32)
    off = np.flatnonzero(kmap < 0)
    lists: list[np.ndarray] = []
    done = 0  # neighbour entries written by earlier tiles
    for c0 in range(0, off.size, _TILE_OFFSETS):
        u = off[c0:c0 + _TILE_OFFSETS]
        pos = 2 * ((u[:, None] >> (3 * np.arange(4))) & 7) + 1
        d2 = ((grid[None, :, :].astype(np.int64) - pos[:, None, :]) ** 2).sum(axis=2)  # [u, G]
        block, head = neighbour_block(d2, nwant, np.uint16)
        kmap[u] = -(done + head + 1)
        done += block.size
        lists.append(block)
    neigh = np.concatenate(lists)
    for a in (grid, kmap, neigh):
        a.flags.writeable = False
    return grid, kmap, neigh


@functools.cache
def _padded_neighbours(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(kmap, [4096, max n] grid indices of each off-grid point's neighbours, -1 past its n): the lists as a table."""
    _, kmap, neigh = tables(name)
    off = np.flatnonzero(kmap < 0)
    starts = -kmap[off] - 1
    counts = neigh[starts].astype(np.int64)
    table = np.full((_KMAP_SIZE, int(counts.max())), -1, np.int64)
    for j in range(table.shape[1]):
        has = counts > j
        table[off[has], j] = neigh[starts[has] + 1 + j]
    table.flags.writeable = False
    return kmap, table


def _importance(x: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    """The importance as float32 of whole super-blocks whose length divides the input, or an empty array."""
    if importance is None:
        return np.zeros(0, _F32)
    qw = np.asarray(importance)
    if qw.dtype != _F32 or qw.ndim != 1 or qw.size == 0 or qw.size % QK_K or x.size % qw.size:
        raise ValueError(f"importance must be float32 [row_length] (whole {QK_K}-value blocks) dividing the input; "
                         f"got {qw.dtype} {qw.shape} for {x.size} values")
    return np.ascontiguousarray(qw)


# --- the numpy path: ggml's loops over one sub-block become vector operations over all sub-blocks of
# a tile, position by position where C sums in order

_TILE = 256  # super-blocks per tile: the neighbour search's [pairs, 38, 4] scratch stays small
_MAGIC = _F32(12582912.0)
_FIFTEEN, _FIFTH, _HALF, _ONE = _F32(15.0), _F32(0.2), _F32(0.5), _F32(1.0)
_EPS_XXS = _F32(1e-8)  # GROUP_MAX_EPS_IQ3_XXS
_FUDGE = {"IQ3_XXS": _F32(1.0125), "IQ3_S": _F32(1.033)}
_SHIFTS = 3 * np.arange(4)


class _Abort(Exception):
    """ggml's GGML_ASSERT(grid_index >= 0): no neighbour at a finite distance."""


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """C's ``nearest_int``: the magic-number trick on the bits, for every float32 (garbage outside +-2**22 included)."""
    t = (v + _MAGIC).view(np.int32)
    return (t & np.int32(0x7FFFFF)) - np.int32(0x400000)


def _levels(xval: np.ndarray, id_: np.ndarray) -> np.ndarray:
    """``MAX(0, MIN(7, nearest_int(0.5f*(id*x - 1))))`` for [n, 32] values and [n] ``id``."""
    return np.clip(_nearest_int(_HALF * (id_[:, None] * xval - _ONE)), 0, 7).astype(np.int64)


def _codes(L: np.ndarray) -> np.ndarray:
    """[n, 32] levels -> [n, 8] 12-bit codes ``u |= l << 3i``."""
    return (L.reshape(-1, 8, 4) << _SHIFTS).sum(axis=2)


def _snap(name: str, L: np.ndarray, rows: np.ndarray, groups: np.ndarray, xval: np.ndarray, waux: np.ndarray,
          scale: np.ndarray) -> None:
    """``iq3_find_best_neighbour`` for the (row, group) pairs given: each off-grid group of L moved to its best neighbour."""
    grid, _, _ = tables(name)
    kmap, table = _padded_neighbours(name)
    u = _codes(L[rows].reshape(-1, 32))[np.arange(rows.size), groups]
    cand = table[u]  # [m, max n]
    q = grid[np.maximum(cand, 0)].astype(_F32)  # [m, max n, 4]
    cols = 4 * groups[:, None] + np.arange(4)
    xv, w = np.take_along_axis(xval[rows], cols, 1), np.take_along_axis(waux[rows], cols, 1)
    s = scale[rows][:, None]
    d2 = np.zeros(cand.shape, _F32)
    for i in range(4):  # C's order: d2 += weight[i]*diff*diff, i = 0..3
        diff = s * q[:, :, i] - xv[:, i:i + 1]
        d2 += w[:, i:i + 1] * diff * diff
    d2[cand < 0] = np.inf
    best = np.argmin(d2, axis=1)  # the first of equal distances, as C's strict <
    if not (d2[np.arange(best.size), best] < np.finfo(_F32).max).all():
        raise _Abort
    pts = grid[cand[np.arange(best.size), best]].astype(np.int64)
    L[rows[:, None], cols] = (pts - 1) // 2


def _sums(w: np.ndarray, xval: np.ndarray, L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``sumqx += w*xval*q; sumq2 += w*q*q`` over the 32 positions in order, q = 2l + 1."""
    q = (2 * L + 1).astype(_F32)
    sumqx, sumq2 = np.zeros(L.shape[0], _F32), np.zeros(L.shape[0], _F32)
    for i in range(32):
        sumqx += w[:, i] * xval[:, i] * q[:, i]
        sumq2 += w[:, i] * q[:, i] * q[:, i]
    return sumqx, sumq2


def _search(name: str, xb: np.ndarray, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sub-blocks of super-blocks ``xb`` [nb, 256]: (levels [n, 32], signs [n, 4], scale [n], stored [n])."""
    is_s = name == "IQ3_S"
    nb = xb.shape[0]
    sumx2 = np.zeros(nb, _F32)
    for i in range(QK_K):
        sumx2 += xb[:, i] * xb[:, i]
    sigma2 = _F32(2) * sumx2 / _F32(QK_K)
    x = xb.reshape(-1, 32)
    if qw.size:
        w_in = np.tile(qw.reshape(-1, QK_K), (nb // (qw.size // QK_K), 1)).reshape(-1, 32)
        weight = w_in * np.sqrt(np.repeat(sigma2, 8)[:, None] + x * x)
    else:
        weight = x * x
    waux = np.sqrt(weight)
    neg = ~(x >= 0)
    xval = np.where(neg, -x, x)
    bits = neg.reshape(-1, 4, 8).astype(np.int64) << np.arange(8)
    signs = bits.sum(axis=2)  # [n, 4]
    if not is_s:  # an odd count of negatives: the cheapest value keeps its sign instead
        odd = neg.reshape(-1, 4, 8).sum(axis=2) % 2 == 1
        imin = np.argmin((weight * x * x).reshape(-1, 4, 8), axis=2)
        r, k = np.nonzero(odd)
        xval[r, 8 * k + imin[r, k]] *= -1
        signs[r, k] ^= 1 << imin[r, k]
        signs &= 127
    mx = xval.max(axis=1)
    stored = ~(mx == 0) if is_s else ~(mx < _EPS_XXS)
    n = x.shape[0]
    L = np.zeros((n, 32), np.int64)
    scale = mx / _FIFTEEN
    best = np.zeros(n, _F32)
    on_grid = np.full((n, 8), not is_s)
    kmap = tables(name)[1]
    live = np.flatnonzero(stored)
    trials = 9 if is_s else 15
    for step in range(-trials, trials + 1):
        id_ = (_FIFTEEN + _F32(step) * _FIFTH) / mx[live]
        this_scale = np.zeros(n, _F32)
        this_scale[live] = _ONE / id_
        laux = np.zeros((n, 32), np.int64)
        laux[live] = _levels(xval[live], id_)
        off = np.zeros((n, 8), bool)
        off[live] = kmap[_codes(laux[live])] < 0
        r, g = np.nonzero(off)
        if r.size:
            _snap(name, laux, r, g, xval, waux, this_scale)
        sumqx, sumq2 = _sums(weight[live], xval[live], laux[live])
        upd = (sumq2 > 0) & (sumqx * sumqx > best[live] * sumq2)
        rows = live[upd]
        scale[rows] = sumqx[upd] / sumq2[upd]
        best[rows] = scale[rows] * sumqx[upd]
        L[rows] = laux[rows]
        on_grid[rows] = ~off[rows]
    again = stored & (~on_grid).any(axis=1) & (scale > 0)
    rows = np.flatnonzero(again)
    if rows.size:
        id_ = _ONE / scale[rows]
        redo = np.ones((rows.size, 8), bool) if is_s else ~on_grid[rows]
        lnew = _levels(xval[rows], id_)
        lsub = L[rows]
        sel = np.repeat(redo, 4, axis=1)
        lsub[sel] = lnew[sel]
        L[rows] = lsub
        r, g = np.nonzero(redo & (kmap[_codes(lsub)] < 0))
        if r.size:
            _snap(name, L, rows[r], g, xval, waux, scale)
        sumqx, sumq2 = _sums(weight[rows], xval[rows], L[rows])
        scale[rows] = np.where(sumq2 > 0, sumqx / np.where(sumq2 > 0, sumq2, _ONE), scale[rows])
    flip = stored & (scale < 0)  # "should never happen" in ggml; flipped as it flips it
    scale[flip] = -scale[flip]
    signs[flip] = ~signs[flip] & (255 if is_s else 127)
    scale[~stored] = 0
    return L, signs, scale, stored


def _pack(name: str, xb: np.ndarray, qw: np.ndarray, out: np.ndarray, d: np.ndarray) -> None:
    """The numpy path: ``out`` [nb, block bytes - 2] and ``d`` [nb] as the kernel fills them."""
    is_s = name == "IQ3_S"
    L, signs, scale, stored = _search(name, xb, qw)
    nb = xb.shape[0]
    g = tables(name)[1][_codes(L)].reshape(nb, 8, 8)  # [super-block, sub-block, group]
    if (g < 0).any():
        raise AssertionError(f"{name}: a level combination off the grid after snapping")
    scales = scale.reshape(nb, 8)
    max_scale = scales.max(axis=1)
    st = stored.reshape(nb, 8)
    if is_s:
        slot = np.cumsum(st, axis=1) - 1  # skipped sub-blocks do not advance qs and signs
        b, ib = np.nonzero(st)
        out[b[:, None], 8 * slot[b, ib][:, None] + np.arange(8)] = (g[b, ib] & 255).astype(np.uint8)
        out[b[:, None], 72 + 4 * slot[b, ib][:, None] + np.arange(4)] = signs.reshape(nb, 8, 4)[b, ib].astype(np.uint8)
        out[:, 64:72] = ((g >> 8) * st[:, :, None] << np.arange(8)).sum(axis=2).astype(np.uint8)
    else:
        out[:, :64] = (g * st[:, :, None]).reshape(nb, 64).astype(np.uint8)
        sg = signs.reshape(nb, 8, 4) * st[:, :, None]
        packed = sg[..., 0] | (sg[..., 1] << 7) | (sg[..., 2] << 14) | (sg[..., 3] << 21)
        out[:, 64:96] = packed.astype("<u4").view(np.uint8).reshape(nb, 32)
    has = max_scale != 0
    dd = np.where(has, max_scale / _F32(31), _ONE)
    d[:] = np.where(has, dd * _FUDGE[name], _F32(0))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        lv = np.clip(_nearest_int(_HALF * ((_ONE / dd)[:, None] * scales - _ONE)), 0, 15).astype(np.uint8)
    lv[~has] = 0
    if is_s:
        out[:, 104:108] |= lv[:, 0::2] | (lv[:, 1::2] << 4)
    else:
        out[:, 67:96:4] |= lv << 4
        out[~has] = 0


def _quantize(name: str, x: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    xb = as_blocks(x, QK_K)
    qw = _importance(x, importance)
    if not np.isfinite(xb).all():
        raise ValueError(f"{name} cannot quantize inf or NaN (ggml's search aborts on them)")
    _, _, block_bytes = _TYPES[name]
    out = np.zeros((xb.shape[0], block_bytes), np.uint8)
    if xb.shape[0] == 0:
        return out.reshape(-1)
    d = np.zeros(xb.shape[0], _F32)
    k = jit.iq3_kernels()
    with np.errstate(all="ignore"):  # C's float semantics: overflow to inf is part of the arithmetic
        if k is not None:
            grid, kmap, neigh = tables(name)
            bad = k.quantize_blocks(xb, qw, qw.size > 0, name == "IQ3_S", grid, kmap, neigh, out[:, 2:], d)
        else:
            bad = -1
            tile = _TILE if not qw.size else max(1, _TILE // (qw.size // QK_K)) * (qw.size // QK_K)  # whole rows
            for b0 in range(0, xb.shape[0], tile):
                try:
                    _pack(name, xb[b0:b0 + tile], qw, out[b0:b0 + tile, 2:], d[b0:b0 + tile])
                except _Abort:
                    bad = b0
                    break
    if bad >= 0:
        raise ValueError(f"{name} cannot quantize block {bad}: its values are so large that every squared distance "
                         "overflows (ggml aborts on it)")
    out[:, :2] = fp16_bits(d).view(np.uint8).reshape(-1, 2)
    return out.reshape(-1)


def quantize_iq3_xxs(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*256,)`` (whole rows) -> IQ3_XXS blocks as bytes ``(n*98,)``; ``importance``: float32 [row_length] or None."""
    return _quantize("IQ3_XXS", x, importance)


def quantize_iq3_s(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*256,)`` (whole rows) -> IQ3_S blocks as bytes ``(n*110,)``; ``importance``: float32 [row_length] or None."""
    return _quantize("IQ3_S", x, importance)
