"""Bit-exact ports of ggml's K-quant quantizers: Q4_K, Q5_K and Q6_K.

The bytes of ``quantize_row_q{4,5,6}_K_ref``, or with ``importance`` (float32 [row_length]) of the
``_impl`` paths, whose numpy searches serve Q2_K/Q3_K too. numba kernels (``_kquant_kernels``) when
present, numpy otherwise, same bytes. Refuses an importance that is not whole rows of super-blocks.
Pure functions, safe on a thread pool. Specification: docs/quantizers.md, "K-quants".
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import jit

__all__ = ["quantize_q4_k", "quantize_q5_k", "quantize_q6_k"]

QK_K = 256
Q4_K_BYTES = 144
Q5_K_BYTES = 176
Q6_K_BYTES = 210

_F32 = np.float32
_ZERO = _F32(0.0)
_MAGIC = _F32(12582912.0)  # 1.5 * 2**23: adding it leaves round(x) in the low mantissa bits
_NI_LIMIT = 4194303.0  # nearest_int is round-half-even only for |x| <= 2**22 - 1
_GROUP_MAX_EPS = _F32(1e-15)  # GROUP_MAX_EPS is the float literal 1e-15f

# Groups per tile (512 super-blocks): multiples of 1024 make every scratch row whole pages
_QKX_TILE_GROUPS = 4096
_QX_TILE_GROUPS = 8192
_PAGE = 4096


# --- helpers

def _page_aligned(shape: tuple[int, ...], dtype: type = _F32, offset: int = 0) -> np.ndarray:
    """Uninitialised scratch starting ``offset`` bytes into a page (half a page keeps loads from 4K-aliasing stores)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + _PAGE + offset, dtype=np.uint8)
    start = (-raw.ctypes.data) % _PAGE + offset
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int`` bit for bit, as a new int32 array: the wrap beyond |v| <= 2**22 - 1 included."""
    t = np.add(v, _MAGIC, dtype=_F32)
    i = t.view(np.int32)
    np.bitwise_and(i, np.int32(0x7FFFFF), out=i)
    np.subtract(i, np.int32(0x400000), out=i)
    return i


def _nearest_int_inplace(t: np.ndarray) -> np.ndarray:
    """``_nearest_int`` overwriting the float32 array ``t``; returns the int32 view of it."""
    np.add(t, _MAGIC, out=t)
    i = t.view(np.int32)
    np.bitwise_and(i, np.int32(0x7FFFFF), out=i)
    np.subtract(i, np.int32(0x400000), out=i)
    return i


def _to_fp16(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fp16 bits as uint16, the fp16 value as float32), as GGML_FP32_TO_FP16 / FP16_TO_FP32 give them.

    Never passed NaN (the callers' maxima skip it), whose payload numpy would convert differently."""
    h = np.asarray(v, dtype=_F32).astype(np.float16)
    return h.view(np.uint16), h.astype(_F32)


def _round_clamp(t: np.ndarray, lo: np.ndarray, hi: np.ndarray, tmin: float, tmax: float, exact: bool) -> None:
    """``MAX(lo, MIN(hi, nearest_int(t)))`` as float32, in place; ``tmin``/``tmax`` bound t (NaN: unknown).

    A -0.0 left where C has 0 only meets sums and squares, where its sign vanishes.
    """
    lo_v, hi_v = float(lo.flat[0]), float(hi.flat[0])
    if exact or not (-_NI_LIMIT <= tmin and tmax <= _NI_LIMIT):
        li = _nearest_int(t)
        np.clip(li, int(lo_v), int(hi_v), out=li)
        t[...] = li
        return
    np.rint(t, out=t)
    if tmax >= hi_v + 0.5:
        np.minimum(t, hi, out=t)
    if tmin <= lo_v - 0.5:
        np.maximum(t, lo, out=t)


@functools.lru_cache(maxsize=64)
def _reduce_is_sequential(shape: tuple[int, ...], axis: int, bufsize: int) -> bool:
    """Whether ``np.add.reduce(a, axis)`` on this layout adds the slices in C's order, checked bit for bit."""
    a = _page_aligned(shape)
    moved = np.moveaxis(a, axis, 0)
    if moved.shape[0] < 2 or moved[0].size < 2:
        return False
    # hashed floats of both signs over 2**-16..2**16
    h = np.arange(a.size, dtype=np.uint32).reshape(shape)
    h *= np.uint32(2654435761)
    h ^= h >> np.uint32(15)
    a[...] = ((h & np.uint32(0x801FFFFF)) | ((((h >> np.uint32(21)) & np.uint32(31)) + np.uint32(111)) << np.uint32(23))).view(_F32)
    # and a lane of 1 then half-ulps: only left to right do they all round away
    lane = moved[(slice(None),) + (0,) * (moved.ndim - 1)]
    lane[...] = _F32(2.0**-24)
    lane[0] = _F32(1.0)
    for from_zero in (True, False):
        want = _Sums.loop(a, axis, np.empty(moved.shape[1:], _F32), from_zero)
        got = np.empty(moved.shape[1:], _F32)
        if from_zero:
            np.add.reduce(a, axis=axis, out=got, initial=_ZERO)
        else:
            np.add.reduce(a, axis=axis, out=got)
        if not np.array_equal(want.view(np.uint32), got.view(np.uint32)):
            return False
    return True


class _Sums:
    """Sums over the position axis in C's order (``np.sum`` pairs terms and rounds differently)."""

    def __init__(self, *layouts: tuple[np.ndarray, int]) -> None:
        bufsize = np.getbufsize()
        self.fast = all(_reduce_is_sequential(a.shape, axis, bufsize) for a, axis in layouts)

    @staticmethod
    def loop(a: np.ndarray, axis: int, out: np.ndarray, from_zero: bool) -> np.ndarray:
        """The reference: one vector add per position."""
        a = np.moveaxis(a, axis, 0)
        if from_zero:
            np.add(a[0], _ZERO, out=out)
        else:
            out[...] = a[0]
        for i in range(1, a.shape[0]):
            np.add(out, a[i], out=out)
        return out

    def from_zero(self, a: np.ndarray, out: np.ndarray, axis: int = 0) -> np.ndarray:
        """``float s = 0; for (i) s += a[i];``"""
        if self.fast:
            return np.add.reduce(a, axis=axis, out=out, initial=_ZERO)
        return self.loop(a, axis, out, True)

    def from_first(self, a: np.ndarray, out: np.ndarray, axis: int = 0) -> np.ndarray:
        """``float s = a[0]; for (i = 1..) s += a[i];``"""
        if self.fast:
            return np.add.reduce(a, axis=axis, out=out)
        return self.loop(a, axis, out, False)


def _check_input(x: np.ndarray, name: str) -> np.ndarray:
    """Validate ``x`` (1-D, whole super-blocks) and return it as contiguous float32."""
    x = np.asarray(x)
    if x.ndim != 1 or x.size % QK_K:
        raise ValueError(f"{name}: need a 1-D array of whole {QK_K}-value super-blocks, got shape {x.shape}")
    return np.ascontiguousarray(x, dtype=_F32)


def _pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """The 12-byte 6-bit scale/min packing of block_q4_K/q5_K (inverse of get_scale_min_k4), from uint8 [nb, 8] each."""
    out = np.empty((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    return out


# --- Q4_K / Q5_K: make_qkx2_quants per 32 values, then 6-bit scales and mins per super-block

_PROD_A = np.array([0, 2, 0, 1, 3, 2])  # rows of [sum_w, sum_x, sum_l, sum_l2, sum_xl] ...
_PROD_B = np.array([3, 2, 4, 2, 1, 4])  # ... multiplied pairwise: D = p0 - p1, num_scale = p2 - p3, num_min = p4 - p5


def _qkx_super_scales(scales: np.ndarray, mins: np.ndarray) -> tuple[np.ndarray, ...]:
    """The super-block half of quantize_row_q4_K_ref / q5_K_ref: (ls, lm, d bits, dmin bits, d, dm)."""
    nb = scales.shape[0]
    # `if (scale > max_scale) max_scale = scale;` from 0, likewise for mins
    max_scale = np.zeros(nb, dtype=_F32)
    max_min = np.zeros(nb, dtype=_F32)
    for j in range(8):
        np.putmask(max_scale, scales[:, j] > max_scale, scales[:, j])
        np.putmask(max_min, mins[:, j] > max_min, mins[:, j])
    with np.errstate(all="ignore"):
        inv_scale = np.where(max_scale > 0, _F32(63.0) / max_scale, _ZERO).astype(_F32)
        inv_min = np.where(max_min > 0, _F32(63.0) / max_min, _ZERO).astype(_F32)
        # uint8_t ls = nearest_int(...): truncated to 8 bits before MIN(63, ls)
        ls = np.minimum(_nearest_int(inv_scale[:, None] * scales).astype(np.uint8), np.uint8(63))
        lm = np.minimum(_nearest_int(inv_min[:, None] * mins).astype(np.uint8), np.uint8(63))
        d_bits, d16 = _to_fp16(max_scale / _F32(63.0))
        dmin_bits, dmin16 = _to_fp16(max_min / _F32(63.0))
        d = (d16[:, None] * ls).reshape(nb * 8)
        dm = (dmin16[:, None] * lm).reshape(nb * 8)
    return ls, lm, d_bits, dmin_bits, d, dm


class _QkxTile:
    """Scratch and kernels for quantize_row_q4_K_ref / q5_K_ref over ``B`` groups of 32 values."""

    def __init__(self, B: int, nmax: int, rmin: float, rdelta: float, nstep: int) -> None:
        self.B, self.nmax, self.nstep = B, nmax, nstep
        self.rmin, self.rdelta = _F32(rmin), _F32(rdelta)
        self.X = _page_aligned((32, B))
        self.W = _page_aligned((32, B))
        self.T = _page_aligned((32, B))
        self.S = _page_aligned((3, 32, B))  # w*l, w*l*l, w*l*x; S[0] then holds the squared errors
        self.lo = _page_aligned((32, B))
        self.hi = _page_aligned((32, B))
        self.lo.fill(0)
        self.hi.fill(nmax)
        self.E = _page_aligned((2, B))  # data min and max: t = iscale*(x - min) peaks at these
        self.E2 = _page_aligned((2, B))
        # broadcast against [32, B]: cur_error, this_scale, iscale, min (running), this_min
        self.VT = _page_aligned((5, B), offset=_PAGE // 2)
        self.ST = _page_aligned((4, B))  # best_error, scale, best_iscale, best_min (min before the update)
        self.V5 = _page_aligned((5, B))  # sum_w, sum_x, sum_l, sum_l2, sum_xl
        self.A6 = _page_aligned((6, B))
        self.B6 = _page_aligned((6, B))
        self.R3 = _page_aligned((3, B))  # D, scale numerator, min numerator
        self.alt = _page_aligned((B,))
        self.vr = _page_aligned((B,))
        self.ZD = _page_aligned((2, B), offset=_PAGE // 2)
        self.upd = np.empty(B, dtype=bool)
        self.msk = np.empty(B, dtype=bool)
        self.sums = _Sums((self.S, 1), (self.T, 0))

    # -- make_qkx2_quants

    def _levels(self, exact: bool) -> None:
        """T = MAX(0, MIN(nmax, nearest_int(iscale*(x - min)))) with the running min and iscale."""
        X, T, E2, VT = self.X, self.T, self.E2, self.VT
        iscale, m = VT[2], VT[3]
        # x - min is monotonic in x and the product monotonic in that, so t peaks at the data extremes
        np.subtract(self.E, m, out=E2)
        np.multiply(E2, iscale, out=E2)
        tmin, tmax = float(E2.min()), float(E2.max())
        np.subtract(X, m, out=T)
        np.multiply(T, iscale, out=T)
        _round_clamp(T, self.lo, self.hi, tmin, tmax, exact)

    def _error(self, scale: np.ndarray, mn: np.ndarray, out: np.ndarray) -> np.ndarray:
        """sum_i w*(diff*diff), diff = scale*L + min - x: the C expression, in C's order."""
        D2 = self.S[0]
        np.multiply(self.T, scale, out=D2)
        np.add(D2, mn, out=D2)
        np.subtract(D2, self.X, out=D2)
        np.multiply(D2, D2, out=D2)
        np.multiply(D2, self.W, out=D2)
        return self.sums.from_zero(D2, out)

    def search(self, finite: bool) -> np.ndarray:
        """``make_qkx2_quants(32, nmax, x, weights, ..., use_mad=false)`` for every group at once."""
        X, W, T, S, VT, ST, V5 = self.X, self.W, self.T, self.S, self.VT, self.ST, self.V5
        cur, ts, iscale, m, tm = VT
        best_err, scale, best_iscale, best_min = ST
        sum_w, sum_x = V5[0], V5[1]
        mx = self.E[1]
        nmax_f = _F32(self.nmax)
        if finite:  # order-free for finite values (a zero's sign is moot, see _round_clamp)
            np.minimum.reduce(X, axis=0, out=m)
            np.maximum.reduce(X, axis=0, out=mx)
        else:  # C's scan: `if (x[i] < min) min = x[i];` skips NaN unless x[0] is NaN
            m[...] = X[0]
            mx[...] = X[0]
            for i in range(1, 32):
                np.putmask(m, X[i] < m, X[i])
                np.putmask(mx, X[i] > mx, X[i])
        self.E[0] = m  # data min; with max the extremes of x - min
        # float sum_w = weights[0], sum_x = sum_w*x[0]; then += in index order
        self.sums.from_first(W, sum_w)
        np.multiply(W, X, out=T)
        self.sums.from_first(T, sum_x)
        np.putmask(m, m > 0, _ZERO)
        flat = mx == m  # if (max == min) { L = 0; the_min = -min; return 0; }
        has_flat = bool(flat.any())
        exact = not finite

        with np.errstate(all="ignore"):  # flat groups divide by zero (their iscale is then zeroed)
            np.subtract(mx, m, out=self.vr)
            np.divide(nmax_f, self.vr, out=iscale)
            if has_flat:
                np.putmask(iscale, flat, _ZERO)
            np.divide(_F32(1.0), iscale, out=ts)
            self._levels(exact)
            self._error(ts, m, best_err)
            scale[...] = ts
            best_iscale[...] = iscale
            best_min[...] = m

            for step in range(self.nstep + 1):
                c = (self.rmin + self.rdelta * _F32(step)) + nmax_f  # rmin + rdelta*is + nmax, float32
                np.subtract(mx, m, out=self.vr)
                np.divide(c, self.vr, out=iscale)
                if has_flat:  # iscale 0 gives levels 0 and D = 0: never accepted, as C never gets here
                    np.putmask(iscale, flat, _ZERO)
                self._levels(exact)
                np.multiply(W, T, out=S[0])
                np.multiply(S[0], T, out=S[1])
                np.multiply(S[0], X, out=S[2])
                self.sums.from_zero(S, V5[2:5], axis=1)
                np.take(V5, _PROD_A, axis=0, out=self.A6)
                np.take(V5, _PROD_B, axis=0, out=self.B6)
                np.multiply(self.A6, self.B6, out=self.A6)
                np.subtract(self.A6[0::2], self.A6[1::2], out=self.R3)  # D, sum_w*sum_xl - sum_x*sum_l, ...
                np.divide(self.R3[1:3], self.R3[0], out=VT[1::3])
                np.greater(tm, _ZERO, out=self.msk)  # if (this_min > 0) { this_min = 0; this_scale = sum_xl/sum_l2; }
                np.divide(V5[4], V5[3], out=self.alt)
                np.putmask(ts, self.msk, self.alt)
                np.putmask(tm, self.msk, _ZERO)
                self._error(ts, tm, cur)
                np.greater(self.R3[0], _ZERO, out=self.upd)  # D > 0 && cur_error < best_error
                np.less(cur, best_err, out=self.msk)
                np.logical_and(self.upd, self.msk, out=self.upd)
                np.copyto(ST, VT[0:4], where=self.upd)  # best_error, scale, best_iscale, best_min (pre-update)
                np.putmask(m, self.upd, tm)
        np.putmask(scale, flat, _ZERO)
        return flat

    # -- quantize_row_q4_K_ref / q5_K_ref

    def quantize(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One tile: x holds at most B/8 super-blocks. Returns (d bits, dmin bits, packed scales,
        levels uint8 [nb, 256] in natural order)."""
        nb = x.size // QK_K
        G = nb * 8
        X, W, T = self.X, self.W, self.T
        X[:, :G] = x.reshape(G, 32).T
        X[:, G:] = 0  # padding groups: all zero, flat, harmless
        finite = bool(np.isfinite(X[:, :G]).all())

        # weights[l] = av_x + fabsf(x[l]) with av_x = sqrtf(sum_x2/32), sum_x2 = 0 + x0*x0 + ...
        with np.errstate(all="ignore"):
            np.multiply(X, X, out=T)
        av = self.sums.from_zero(T, self.VT[0])
        np.divide(av, _F32(32.0), out=av)
        np.sqrt(av, out=av)
        np.abs(X, out=W)
        np.add(W, av, out=W)

        flat = self.search(finite)
        scales = self.ST[1][:G].reshape(nb, 8)
        mins = np.negative(self.VT[3][:G]).reshape(nb, 8)

        ls, lm, d_bits, dmin_bits, d, dm = _qkx_super_scales(scales, mins)
        with np.errstate(all="ignore"):
            # L = MAX(0, MIN(nmax, nearest_int((x + dm)/d))), block-major straight from x
            xb = x.reshape(G, 32)
            v = np.add(xb, dm[:, None])
            np.divide(v, d[:, None], out=v)
            li = _nearest_int_inplace(v)
            np.clip(li, 0, self.nmax, out=li)
            L = li.astype(np.uint8)

            # `if (!d) continue;` keeps the search's levels for those groups: recompute just them
            skip = np.flatnonzero(d == 0)
            if skip.size:
                t = (xb[skip] - self.ST[3][skip, None]) * self.ST[2][skip, None]
                lk = np.clip(_nearest_int(t), 0, self.nmax).astype(np.uint8)
                lk[flat[skip]] = 0
                L[skip] = lk
        return d_bits, dmin_bits, _pack_scales_k4(ls, lm), L.reshape(nb, QK_K)


def _quantize_qkx(x: np.ndarray, name: str, block_bytes: int, nmax: int, rmin: float, rdelta: float, nstep: int,
                  pack: Callable[[np.ndarray, np.ndarray], None]) -> np.ndarray:
    """quantize_row_q4_K_ref / q5_K_ref over whole tiles of super-blocks."""
    x = _check_input(x, name)
    nb = x.size // QK_K
    out = np.empty((nb, block_bytes), dtype=np.uint8)
    if nb == 0:
        return out.reshape(-1)
    k = jit.kquant_kernels()
    if k is not None:
        G = nb * 8
        scales, mins, L = np.empty(G, _F32), np.empty(G, _F32), np.empty(x.size, np.uint8)
        k.qkx2_search(x.reshape(G, 32), nmax, _F32(rmin), _F32(rdelta), nstep, False, True, scales, mins, L.reshape(G, 32))
        ls, lm, d_bits, dmin_bits, d, dm = _qkx_super_scales(scales.reshape(nb, 8), mins.reshape(nb, 8))
        k.qkx_final_levels(x, d, dm, nmax, L)
        out[:, 0:2] = d_bits.view(np.uint8).reshape(-1, 2)
        out[:, 2:4] = dmin_bits.view(np.uint8).reshape(-1, 2)
        out[:, 4:16] = _pack_scales_k4(ls, lm)
        pack(out, L.view(np.uint64).reshape(-1, 4, 2, 4))
        return out.reshape(-1)
    per_tile = _QKX_TILE_GROUPS // 8
    B = min(nb, per_tile) * 8
    with np.errstate(all="ignore"):  # restores the bufsize too, thread-locally
        np.setbufsize(max(16, B - B % 16))  # <= one row: rows are never gathered into buffers
        tile = _QkxTile(B, nmax, rmin, rdelta, nstep)
        for s in range(0, nb, per_tile):
            e = min(nb, s + per_tile)
            d, dmin, sc, L = tile.quantize(x[s * QK_K:e * QK_K])
            o = out[s:e]
            o[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
            o[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
            o[:, 4:16] = sc
            pack(o, L.view(np.uint64).reshape(-1, 4, 2, 4))
    return out.reshape(-1)


# packers: levels as uint64 [block, 64-value chunk, first/second 32, 8 per word]; levels < 64 never carry
_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_LOW_BITS = np.uint64(0x0101010101010101)


def _pack_q4(o: np.ndarray, L64: np.ndarray) -> None:
    """qs[32c + l] = L[64c + l] | L[64c + 32 + l] << 4."""
    o[:, 16:144] = (L64[:, :, 0] | (L64[:, :, 1] << np.uint64(4))).view(np.uint8).reshape(-1, 128)


_Q5_SHIFTS = np.arange(8, dtype=np.uint64).reshape(4, 2, 1)


def _pack_q5(o: np.ndarray, L64: np.ndarray) -> None:
    """qh[l] bit 2c / 2c+1 = fifth bit of L[64c + l] / L[64c + 32 + l]; qs as Q4_K with the low nibbles."""
    hb = ((L64 >> np.uint64(4)) & _LOW_BITS) << _Q5_SHIFTS
    o[:, 16:48] = np.bitwise_or.reduce(hb.reshape(-1, 8, 4), axis=1).view(np.uint8).reshape(-1, 32)
    lo = L64 & _LOW_NIBBLES
    o[:, 48:176] = (lo[:, :, 0] | (lo[:, :, 1] << np.uint64(4))).view(np.uint8).reshape(-1, 128)


def quantize_q4_k(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 whole rows -> block_q4_K bytes, as quantize_row_q4_K_ref, or _impl with ``importance`` [row_length]."""
    if importance is not None:
        return _quantize_qkx_imatrix(x, importance, "quantize_q4_k", Q4_K_BYTES, 15, _pack_q4)
    return _quantize_qkx(x, "quantize_q4_k", Q4_K_BYTES, 15, -1.0, 0.1, 20, _pack_q4)


def quantize_q5_k(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 whole rows -> block_q5_K bytes, as quantize_row_q5_K_ref, or _impl with ``importance`` [row_length]."""
    if importance is not None:
        return _quantize_qkx_imatrix(x, importance, "quantize_q5_k", Q5_K_BYTES, 31, _pack_q5)
    return _quantize_qkx(x, "quantize_q5_k", Q5_K_BYTES, 31, -0.5, 0.1, 15, _pack_q5)


# --- Q6_K: make_qx_quants per 16 values (rmse_type 1, no imatrix), then 8-bit scales

def _qx_super_scales(scales: np.ndarray) -> tuple[np.ndarray, ...]:
    """The super-block half of quantize_row_q6_K_ref: (empty blocks, d fp16 bits, int8 scales, fp16(d)*scale per group)."""
    nb = scales.shape[0]
    # `if (fabsf(scale) > max_abs_scale) { max_abs_scale = fabsf(scale); max_scale = scale; }`
    abs_scales = np.abs(scales)
    max_abs = np.zeros(nb, dtype=_F32)
    max_scale = np.zeros(nb, dtype=_F32)
    for j in range(16):
        gt = abs_scales[:, j] > max_abs
        np.putmask(max_abs, gt, abs_scales[:, j])
        np.putmask(max_scale, gt, scales[:, j])
    empty = max_abs < _GROUP_MAX_EPS  # the whole block is memset to 0 (and d = fp16(0) = 0)

    with np.errstate(all="ignore"):
        iscale = _F32(-128.0) / max_scale
        d_bits, d16 = _to_fp16(_F32(1.0) / iscale)
        sc = np.minimum(_nearest_int(iscale[:, None] * scales), 127).astype(np.int8)  # MIN(127, ...) into int8_t
        d = (d16[:, None] * sc).reshape(nb * 16)
    return empty, d_bits, sc, d


def _pack_q6(out: np.ndarray, L: np.ndarray, sc: np.ndarray, d_bits: np.ndarray, empty: np.ndarray) -> None:
    """block_q6_K bytes into ``out`` [nb, 210] from the levels (l + 32) uint8 [nb*256]."""
    nb = out.shape[0]
    L64 = L.reshape(nb, QK_K).view(np.uint64)
    lo = (L64 & np.uint64(0x0F0F0F0F0F0F0F0F)).reshape(nb, 2, 2, 8)  # [block, half, +0/+64, 64 levels]
    out[:, 0:128] = (lo[:, :, 0] | (lo[:, :, 1] << np.uint64(4))).view(np.uint8).reshape(nb, 128)
    hb = ((L64 >> np.uint64(4)) & np.uint64(0x0303030303030303)).reshape(nb, 2, 4, 4)  # [block, half, +32k, 32]
    qh = hb[:, :, 0] | (hb[:, :, 1] << np.uint64(2)) | (hb[:, :, 2] << np.uint64(4)) | (hb[:, :, 3] << np.uint64(6))
    out[:, 128:192] = qh.view(np.uint8).reshape(nb, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d_bits.view(np.uint8).reshape(nb, 2)
    out[empty] = 0


class _QxTile:
    """Scratch and kernels for quantize_row_q6_K_ref over ``B`` groups of 16 values."""

    def __init__(self, B: int) -> None:
        self.B = B
        self.X = _page_aligned((16, B))
        self.W = _page_aligned((16, B))  # w = x*x (rmse_type 1)
        self.WX = _page_aligned((16, B))  # w*x: C's w*x[i]*l is (w*x)*l
        self.T = _page_aligned((16, B))
        self.S = _page_aligned((2, 16, B))  # (w*x)*l, (w*l)*l
        self.lo = _page_aligned((16, B))
        self.hi = _page_aligned((16, B))
        self.lo.fill(-32)
        self.hi.fill(31)
        self.E = _page_aligned((2, B))  # data min and max: iscale*x peaks at these
        self.E2 = _page_aligned((2, B))
        self.VT = _page_aligned((2, B), offset=_PAGE // 2)  # candidate scale, iscale (broadcast)
        self.ST = _page_aligned((2, B))  # scale, best_iscale
        self.sumv = _page_aligned((2, B))  # sumlx, suml2
        self.mx = _page_aligned((B,))
        self.best = _page_aligned((B,))
        self.t1 = _page_aligned((B,))
        self.t2 = _page_aligned((B,))
        self.d = _page_aligned((B,), offset=_PAGE // 2)
        self.upd = np.empty(B, dtype=bool)
        self.msk = np.empty(B, dtype=bool)
        self.sums = _Sums((self.S, 1))

    def _sums_for(self, exact: bool) -> None:
        """Levels for the iscale in VT[1] and their sums: sumlx += w*x*l, suml2 += w*l*l."""
        X, T, S, E2 = self.X, self.T, self.S, self.E2
        iscale = self.VT[1]
        np.multiply(self.E, iscale, out=E2)
        tmin, tmax = float(E2.min()), float(E2.max())
        np.multiply(X, iscale, out=T)
        _round_clamp(T, self.lo, self.hi, tmin, tmax, exact)  # l = MAX(-nmax, MIN(nmax-1, nearest_int(iscale*x)))
        np.multiply(self.WX, T, out=S[0])
        np.multiply(self.W, T, out=S[1])
        np.multiply(S[1], T, out=S[1])
        self.sums.from_zero(S, self.sumv, axis=1)

    def search(self, finite: bool) -> np.ndarray:
        """``make_qx_quants(16, 32, x, L, rmse_type=1, NULL)`` for every group at once."""
        X, VT, ST, mx, B = self.X, self.VT, self.ST, self.mx, self.B
        cand, iscale = VT
        sumlx, suml2 = self.sumv
        # `if (ax > amax) { amax = ax; max = x[i]; }`: max is the first x of the largest |x|
        lo, hi = self.E
        if finite:
            np.minimum.reduce(X, axis=0, out=lo)
            np.maximum.reduce(X, axis=0, out=hi)
            amax = np.maximum(hi, np.negative(lo))  # the largest |x| is max or -min
            at_hi = hi == amax
            mx[...] = lo
            np.putmask(mx, at_hi, hi)
            tie = at_hi & (lo == -amax) & (amax > 0)  # +amax and -amax both present: the first one counts
            if tie.any():
                cols = np.flatnonzero(tie)
                sub = X[:, cols]
                first = np.argmax(np.abs(sub) == amax[cols], axis=0)
                mx[cols] = sub[first, np.arange(cols.size)]
            np.putmask(mx, amax == 0, _ZERO)  # never updated from 0 when all |x| are 0
        else:
            A = np.abs(X)
            amax = np.zeros(B, dtype=_F32)
            mx[...] = 0
            for i in range(16):
                gt = A[i] > amax
                np.putmask(amax, gt, A[i])
                np.putmask(mx, gt, X[i])
            self.E[...] = np.nan  # extremes unknown: forces exact rounding
        zero = amax < _GROUP_MAX_EPS
        has_zero = bool(zero.any())
        exact = not finite

        with np.errstate(all="ignore"):  # zero groups divide by ~0 (their iscale is then zeroed)
            np.multiply(X, X, out=self.W)
            np.multiply(self.W, X, out=self.WX)
            np.divide(_F32(-32.0), mx, out=iscale)
            if has_zero:
                np.putmask(iscale, zero, _ZERO)
            self._sums_for(exact)
            np.divide(sumlx, suml2, out=cand)
            np.putmask(cand, suml2 == 0, _ZERO)
            ST[...] = VT
            np.multiply(ST[0], sumlx, out=self.best)
            for step in range(-9, 10):
                if step == 0:
                    continue
                c = -(_F32(32.0) + _F32(0.1) * _F32(step))  # -(nmax + 0.1f*is), float32
                np.divide(c, mx, out=iscale)
                if has_zero:  # levels 0, suml2 = 0: never accepted
                    np.putmask(iscale, zero, _ZERO)
                self._sums_for(exact)
                # if (suml2 > 0 && sumlx*sumlx > best*suml2) { scale = sumlx/suml2; best = scale*sumlx; }
                np.multiply(sumlx, sumlx, out=self.t1)
                np.multiply(self.best, suml2, out=self.t2)
                np.greater(self.t1, self.t2, out=self.upd)
                np.greater(suml2, _ZERO, out=self.msk)
                np.logical_and(self.upd, self.msk, out=self.upd)
                np.divide(sumlx, suml2, out=cand)
                np.copyto(ST, VT, where=self.upd)
                np.multiply(ST[0], sumlx, out=self.t1)
                np.putmask(self.best, self.upd, self.t1)
        np.putmask(ST[0], zero, _ZERO)
        return zero

    def quantize(self, x: np.ndarray, out: np.ndarray) -> None:
        """One tile of at most B/16 super-blocks, written to ``out`` [nb, 210]."""
        nb = x.size // QK_K
        G = nb * 16
        X = self.X
        X[:, :G] = x.reshape(G, 16).T
        X[:, G:] = 0
        finite = bool(np.isfinite(X[:, :G]).all())
        zero = self.search(finite)
        scales = self.ST[0][:G].reshape(nb, 16)

        empty, d_bits, sc, d = _qx_super_scales(scales)
        with np.errstate(all="ignore"):
            # L = MAX(-32, MIN(31, nearest_int(x/d))) + 32, block-major straight from x
            v = np.divide(x.reshape(G, 16), d[:, None])
            np.add(v, _MAGIC, out=v)
            li = v.view(np.int32)
            np.bitwise_and(li, np.int32(0x7FFFFF), out=li)
            np.subtract(li, np.int32(0x400000 - 32), out=li)
            np.clip(li, 0, 63, out=li)
            L = li.astype(np.uint8)

            skip = np.flatnonzero(d == 0)  # `if (!d) continue;` keeps make_qx_quants' levels
            if skip.size:
                lk = np.clip(_nearest_int(X[:, skip].T * self.ST[1][skip, None]), -32, 31) + 32
                lk[zero[skip]] = 0  # make_qx_quants' all-zero early return leaves 0, not nmax
                L[skip] = lk.astype(np.uint8)

        _pack_q6(out, L, sc, d_bits, empty)


def quantize_q6_k(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 whole rows -> block_q6_K bytes, as quantize_row_q6_K_ref, or _impl with ``importance`` [row_length]."""
    if importance is not None:
        return _quantize_q6_imatrix(x, importance)
    x = _check_input(x, "quantize_q6_k")
    nb = x.size // QK_K
    out = np.empty((nb, Q6_K_BYTES), dtype=np.uint8)
    if nb == 0:
        return out.reshape(-1)
    k = jit.kquant_kernels()
    if k is not None:
        scales, L = np.empty(nb * 16, _F32), np.empty(x.size, np.uint8)
        k.qx_search(x.reshape(nb * 16, 16), scales, L.reshape(nb * 16, 16))
        empty, d_bits, sc, d = _qx_super_scales(scales.reshape(nb, 16))
        k.qx_final_levels(x, d, L)
        _pack_q6(out, L, sc, d_bits, empty)
        return out.reshape(-1)
    per_tile = _QX_TILE_GROUPS // 16
    B = min(nb, per_tile) * 16
    with np.errstate(all="ignore"):  # restores the bufsize too, and is local to this thread's context
        np.setbufsize(max(16, B - B % 16))  # <= one row: rows are never gathered into buffers
        tile = _QxTile(B)
        for s in range(0, nb, per_tile):
            e = min(nb, s + per_tile)
            tile.quantize(x[s * QK_K:e * QK_K], out[s:e])
    return out.reshape(-1)


# --- the importance-matrix paths (quantize_row_q{2..6}_K_impl): numpy mirrors of the numba kernels

_IMATRIX_TILE = 512  # super-blocks per numpy call
_QKX3_RMIN, _QKX3_RDELTA, _QKX3_NSTEP = _F32(-0.9), _F32(0.05), 36
_TENTH = _F32(0.1)


def check_importance(x: np.ndarray, importance: np.ndarray, name: str) -> np.ndarray:
    """The importance as float32 [row_length / 256, 256]; the row length must be whole super-blocks dividing ``x``."""
    qw = np.asarray(importance)
    if qw.dtype != _F32 or qw.ndim != 1 or qw.size == 0 or qw.size % QK_K or x.size % qw.size:
        raise ValueError(f"{name}: importance must be float32 [row_length] (whole {QK_K}-value super-blocks) dividing "
                         f"the input; got {qw.dtype} {qw.shape} for {x.size} values")
    return np.ascontiguousarray(qw).reshape(-1, QK_K)


def _seq_sum(a: np.ndarray) -> np.ndarray:
    """``s = 0; for (i) s += a[i];`` over axis 0 of [n, G]."""
    s = np.zeros(a.shape[1:], _F32)
    for i in range(a.shape[0]):
        s += a[i]
    return s


def _np_levels(X: np.ndarray, iscale: np.ndarray, sub: np.ndarray | None, lo: int, hi: int) -> np.ndarray:
    """``MAX(lo, MIN(hi, nearest_int(iscale*(x - sub))))`` (``iscale*x`` when ``sub`` is None) as int32 [n, G]."""
    t = X - sub if sub is not None else X.copy()
    np.multiply(iscale, t, out=t)
    li = _nearest_int_inplace(t)
    np.clip(li, lo, hi, out=li)
    return li


def _np_qkx3(X: np.ndarray, W: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx3_quants(n, nmax, x, w, L, &the_min, Laux, -0.9f, 0.05f, 36, false)`` per column of X [n, G]:
    (scale, the_min, L int32 [n, G])."""
    n = X.shape[0]
    nmax_f = _F32(nmax)
    mn, mx = X[0].copy(), X[0].copy()
    sum_w = W[0].copy()
    sum_x = sum_w * X[0]
    for i in range(1, n):  # C's scans: NaN never replaces, a NaN x[0] stays
        np.putmask(mn, X[i] < mn, X[i])
        np.putmask(mx, X[i] > mx, X[i])
        sum_w += W[i]
        sum_x += W[i] * X[i]
    np.putmask(mn, mn > 0, _ZERO)
    flat = mx <= mn  # C returns early: L = 0, scale 0, the_min = -min
    mn_flat = mn.copy()

    def error(lf: np.ndarray, scale: np.ndarray, m: np.ndarray) -> np.ndarray:
        d = lf * scale
        d += m
        d -= X
        d *= d
        d *= W
        return _seq_sum(d)

    iscale = nmax_f / (mx - mn)
    scale = _F32(1.0) / iscale
    L = _np_levels(X, iscale, mn, 0, nmax)
    best = error(L.astype(_F32), scale, mn)
    for step in range(_QKX3_NSTEP + 1):
        iscale = (_QKX3_RMIN + _QKX3_RDELTA * _F32(step) + nmax_f) / (mx - mn)
        la = _np_levels(X, iscale, mn, 0, nmax)
        lf = la.astype(_F32)
        wl = W * lf
        sum_l, sum_l2, sum_xl = _seq_sum(wl), _seq_sum(wl * lf), _seq_sum(wl * X)
        D = sum_w * sum_l2 - sum_l * sum_l
        ts = (sum_w * sum_xl - sum_x * sum_l) / D
        tm = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = tm > 0
        np.copyto(ts, sum_xl / sum_l2, where=pos)
        np.putmask(tm, pos, _ZERO)
        mad = error(lf, ts, tm)
        upd = (D > 0) & (mad < best)
        np.copyto(L, la, where=upd)
        np.copyto(best, mad, where=upd)
        np.copyto(scale, ts, where=upd)
        np.copyto(mn, tm, where=upd)
    L[:, flat] = 0
    scale[flat] = 0
    mn[flat] = mn_flat[flat]
    return scale, -mn, L


def _np_qp(V: np.ndarray, W: np.ndarray, nmax: int, L: np.ndarray) -> np.ndarray:
    """``make_qp_quants(n, nmax, x, L, w)`` per column of V [n, G]: the scale; L [G, n] gets the uint8 values C stores."""
    n, G = V.shape
    nmax_f = _F32(nmax)
    mx = np.zeros(G, _F32)
    for i in range(n):  # MAX(max, x): a NaN x replaces, as C's ternary does
        mx = np.where(mx > V[i], mx, V[i])
    zero = mx < _GROUP_MAX_EPS
    iscale = nmax_f / mx
    lw = _np_levels(V, iscale, None, -(2**31), 2**31 - 1) & 0xFF  # uint8 stores wrap
    scale = _F32(1.0) / iscale

    def mse(sc: np.ndarray, lf: np.ndarray) -> np.ndarray:
        d = V - sc * lf
        return _seq_sum(W * d * d)

    best = mse(scale, lw.astype(_F32))
    for step in range(-4, 5):
        if step == 0:
            continue
        isc = (_TENTH * _F32(step) + nmax_f) / mx
        e = mse(_F32(1.0) / isc, _np_levels(V, isc, None, -(2**31), nmax).astype(_F32))
        upd = e < best
        np.copyto(best, e, where=upd)
        np.copyto(iscale, isc, where=upd)
    li = _np_levels(V, iscale, None, -(2**31), nmax)
    lf = li.astype(_F32)
    sumlx, suml2 = _seq_sum(W * V * lf), _seq_sum(W * lf * lf)
    lw = li & 0xFF
    for _ in range(5):
        changed = False
        for i in range(n):
            w, x = W[i], V[i]
            cur = lw[i].astype(_F32)
            slx = sumlx - w * x * cur
            sl2 = suml2 - w * cur * cur
            ok = (slx > 0) & (sl2 > 0)
            new = np.minimum(nmax, _nearest_int(x * sl2 / slx))
            ok &= new != lw[i]
            nf = new.astype(_F32)
            slx += w * x * nf
            sl2 += w * nf * nf
            ok &= slx * slx * suml2 > sumlx * sumlx * sl2
            if ok.any():
                changed = True
                np.copyto(lw[i], new & 0xFF, where=ok)
                np.copyto(sumlx, slx, where=ok)
                np.copyto(suml2, sl2, where=ok)
        if not changed:  # an unchanged sweep changes nothing the next time either
            break
    lw[:, zero] = 0
    L[...] = lw.T
    out = np.where(suml2 > 0, sumlx / suml2, _ZERO)
    out[zero] = 0
    return out


def _np_qx_weighted(X: np.ndarray, W: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_qx_quants(n, nmax, x, L, 1, w)`` per column of X [n, G]: (scale, L int32 [n, G] = level + nmax)."""
    n, G = X.shape
    amax = np.zeros(G, _F32)
    mx = np.zeros(G, _F32)
    for i in range(n):  # the first x of the largest |x|; NaN never wins
        ax = np.abs(X[i])
        gt = ax > amax
        np.copyto(amax, ax, where=gt)
        np.copyto(mx, X[i], where=gt)
    zero = amax < _GROUP_MAX_EPS

    def sums(li: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lf = li.astype(_F32)
        return _seq_sum(W * X * lf), _seq_sum(W * lf * lf)

    L = _np_levels(X, _F32(-nmax) / mx, None, -nmax, nmax - 1)
    sumlx, suml2 = sums(L)
    scale = np.where(suml2 != 0, sumlx / suml2, _ZERO)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        li = _np_levels(X, -(_F32(nmax) + _TENTH * _F32(step)) / mx, None, -nmax, nmax - 1)
        slx, sl2 = sums(li)
        upd = (sl2 > 0) & (slx * slx > best * sl2)
        np.copyto(L, li, where=upd)
        np.copyto(scale, slx / sl2, where=upd)
        np.copyto(best, scale * slx, where=upd)
    L += nmax
    L[:, zero] = 0
    scale[zero] = 0
    return scale, L


def _np_weights(xb: np.ndarray, qw: np.ndarray, gsize: int, num: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X [gsize, G], weights qw*sqrtf(sigma2 + x*x) [gsize, G], their sums [G]); sigma2 = num*sum_x2/256 per super-block."""
    nb = xb.shape[0]
    q = qw[np.arange(nb) % qw.shape[0]]
    sigma2 = num * _seq_sum((xb * xb).T) / _F32(QK_K)
    X = np.ascontiguousarray(xb.reshape(-1, gsize).T)
    W = np.repeat(sigma2, QK_K // gsize) + X * X
    np.sqrt(W, out=W)
    W *= q.reshape(-1, gsize).T
    return X, W, _seq_sum(W)


def qkx3_imatrix_numpy(xb: np.ndarray, qw: np.ndarray, gsize: int, nmax: int, num: np.float32, L: np.ndarray,
                       ls: np.ndarray, lm: np.ndarray, d_block: np.ndarray, m_block: np.ndarray) -> None:
    """``_kquant_kernels.qkx3_imatrix`` in numpy (Q2_K, Q4_K, Q5_K up to the super-scales)."""
    nb, ng = xb.shape[0], QK_K // gsize
    X, W, sw = _np_weights(xb, qw, gsize, num)
    scales, mins, lv = _np_qkx3(X, W, nmax)
    L[...] = lv.T.reshape(nb, QK_K)
    nsc = 15 if gsize == 16 else 63
    swt = np.ascontiguousarray(sw.reshape(nb, ng).T)
    d_block[...] = _np_qp(np.ascontiguousarray(scales.reshape(nb, ng).T), swt, nsc, ls)
    m_block[...] = _np_qp(np.ascontiguousarray(mins.reshape(nb, ng).T), swt, nsc, lm)


def q3_imatrix_numpy(xb: np.ndarray, qw: np.ndarray, L: np.ndarray, ls: np.ndarray, d_block: np.ndarray) -> None:
    """``_kquant_kernels.q3_imatrix`` in numpy."""
    nb = xb.shape[0]
    X, W, sw = _np_weights(xb, qw, 16, _F32(2.0))
    scales, lv = _np_qx_weighted(X, W, 4)
    L[...] = lv.T.reshape(nb, QK_K)
    d_block[...], lsv = _np_qx_weighted(np.ascontiguousarray(scales.reshape(nb, 16).T), np.ascontiguousarray(sw.reshape(nb, 16).T), 32)
    ls[...] = lsv.T


def q6_imatrix_numpy(xb: np.ndarray, qw: np.ndarray, scales: np.ndarray, L: np.ndarray) -> None:
    """``_kquant_kernels.q6_imatrix`` in numpy."""
    nb = xb.shape[0]
    q = qw[np.arange(nb) % qw.shape[0]]
    X = np.ascontiguousarray(xb.reshape(-1, 16).T)
    sc, lv = _np_qx_weighted(X, np.ascontiguousarray(q.reshape(-1, 16).T), 32)
    scales[...] = sc.reshape(nb, 16)
    L[...] = lv.T.reshape(nb, QK_K)


def run_imatrix_search(kernel: str, xb: np.ndarray, qw: np.ndarray, *outs: np.ndarray, args: tuple = ()) -> None:
    """The numba kernel ``kernel`` over all super-blocks, or its numpy mirror tile by tile (outputs indexed by super-block)."""
    k = jit.kquant_kernels()
    with np.errstate(all="ignore"):  # C's float semantics: inf and NaN are part of the arithmetic
        if k is not None:
            getattr(k, kernel)(xb, qw, *args, *outs)
            return
        fn = globals()[kernel + "_numpy"]
        nbr = qw.shape[0]
        for s in range(0, xb.shape[0], _IMATRIX_TILE):
            e = min(xb.shape[0], s + _IMATRIX_TILE)
            fn(xb[s:e], qw[np.arange(s, e) % nbr], *args, *(o[s:e] for o in outs))


def _quantize_qkx_imatrix(x: np.ndarray, importance: np.ndarray, name: str, block_bytes: int, nmax: int,
                          pack: Callable[[np.ndarray, np.ndarray], None]) -> np.ndarray:
    """quantize_row_q4_K_impl / q5_K_impl, row by row."""
    x = _check_input(x, name)
    qw = check_importance(x, importance, name)
    nb = x.size // QK_K
    if nb == 0:
        return np.empty(0, np.uint8)
    xb = x.reshape(nb, QK_K)
    L = np.empty((nb, QK_K), np.uint8)
    ls, lm = np.empty((nb, 8), np.int64), np.empty((nb, 8), np.int64)
    d_block, m_block = np.empty(nb, _F32), np.empty(nb, _F32)
    run_imatrix_search("qkx3_imatrix", xb, qw, L, ls, lm, d_block, m_block, args=(32, nmax, _F32(2.0)))
    if nmax == 31:  # Q5_K's `ls = MIN(63, ls)` on the uint8; Q4_K stores them as they are
        np.minimum(ls, 63, out=ls)
        np.minimum(lm, 63, out=lm)
    sc = np.empty((nb, 12), np.int64)  # y.scales, each store truncated to 8 bits
    sc[:, 0:4] = (ls[:, :4] | ((ls[:, 4:] >> 4) << 6)) & 0xFF
    sc[:, 4:8] = (lm[:, :4] | ((lm[:, 4:] >> 4) << 6)) & 0xFF
    sc[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    # get_scale_min_k4 on those bytes
    s_dec = np.concatenate([sc[:, 0:4] & 63, (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)], axis=1)
    m_dec = np.concatenate([sc[:, 4:8] & 63, (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)], axis=1)
    with np.errstate(all="ignore"):  # an overflowing super-scale becomes fp16 inf, as in C
        d_bits, d16 = _to_fp16(d_block)
        dmin_bits, dmin16 = _to_fp16(m_block)
        d = (d16[:, None] * s_dec.astype(_F32)).reshape(-1)
        dm = (dmin16[:, None] * m_dec.astype(_F32)).reshape(-1)
        requantize_levels(x, d, dm, 0, nmax, 0, L.reshape(-1))
    out = np.empty((nb, block_bytes), dtype=np.uint8)
    out[:, 0:2] = d_bits.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = dmin_bits.view(np.uint8).reshape(-1, 2)
    out[:, 4:16] = sc
    pack(out, L.view(np.uint64).reshape(-1, 4, 2, 4))
    return out.reshape(-1)


def requantize_levels(x: np.ndarray, d: np.ndarray, add: np.ndarray | None, lo: int, hi: int, offset: int, L: np.ndarray) -> None:
    """The final rounding with the stored scales: ``L = MAX(lo, MIN(hi, nearest_int((x + add)/d))) + offset``
    per group of x.size/d.size values; a group with d == 0 keeps its L."""
    n = x.size // d.size
    k = jit.kquant_kernels()
    if k is not None and n == 32 and offset == 0:
        k.qkx_final_levels(x, d, add, hi, L)
        return
    if k is not None and n == 16 and add is None and lo == -32:
        k.qx_final_levels(x, d, L)
        return
    xg = x.reshape(-1, n)
    v = xg + add[:, None] if add is not None else xg.copy()
    v /= d[:, None]
    li = _nearest_int_inplace(v)
    np.clip(li, lo, hi, out=li)
    li += offset
    keep = d == 0  # C's `if (!d) continue;`; a NaN d goes on
    Lg = L.reshape(-1, n)
    np.copyto(Lg, li.astype(np.uint8), where=~keep[:, None])


def _quantize_q6_imatrix(x: np.ndarray, importance: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_impl, row by row: make_qx_quants with the importance as its weights."""
    x = _check_input(x, "quantize_q6_k")
    qw = check_importance(x, importance, "quantize_q6_k")
    nb = x.size // QK_K
    if nb == 0:
        return np.empty(0, np.uint8)
    scales, L = np.empty((nb, 16), _F32), np.empty((nb, QK_K), np.uint8)
    run_imatrix_search("q6_imatrix", x.reshape(nb, QK_K), qw, scales, L)
    with np.errstate(all="ignore"):
        empty, d_bits, sc, d = _qx_super_scales(scales)
        requantize_levels(x, d, None, -32, 31, 32, L.reshape(-1))
    out = np.empty((nb, Q6_K_BYTES), dtype=np.uint8)
    _pack_q6(out, L.reshape(-1), sc, d_bits, empty)
    return out.reshape(-1)
