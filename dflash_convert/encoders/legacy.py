"""Bit-exact ports of ggml's legacy block quantizers: Q4_0, Q4_1, Q5_0 and Q5_1.

The bytes of ``quantize_row_q{4,5}_{0,1}_ref``, or with an importance matrix (float32 [row_length])
of ``quantize_row_*_impl``. numba kernels (``_legacy_kernels``) when present, numpy otherwise, same
bytes. Nothing is refused: inf, NaN and denormal scales are reproduced. Pure functions.
Specification: docs/quantizers.md, "Legacy types".
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import jit

__all__ = ["quantize_from_f16", "quantize_q4_0", "quantize_q4_1", "quantize_q5_0", "quantize_q5_1"]

QK = 32
_F32 = np.float32
_FLT_MAX = _F32(np.finfo(np.float32).max)

# ggml's block structs (ggml-common.h); packed, as the C structs are
BLOCK_Q4_0 = np.dtype([("d", "<u2"), ("qs", "u1", (16,))])
BLOCK_Q4_1 = np.dtype([("d", "<u2"), ("m", "<u2"), ("qs", "u1", (16,))])
BLOCK_Q5_0 = np.dtype([("d", "<u2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))])
BLOCK_Q5_1 = np.dtype([("d", "<u2"), ("m", "<u2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))])
assert (BLOCK_Q4_0.itemsize, BLOCK_Q4_1.itemsize, BLOCK_Q5_0.itemsize, BLOCK_Q5_1.itemsize) == (18, 20, 22, 24)


# --- helpers shared with iq4.py

def as_blocks(x: np.ndarray, block: int) -> np.ndarray:
    """The float32 input as a C-contiguous ``[n_blocks, block]`` array; other dtypes refused, not silently rounded."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"expected float32 values, got {x.dtype}")
    if x.ndim != 1 or x.size % block:
        raise ValueError(f"expected a 1-D array of whole {block}-value blocks, got shape {x.shape}")
    return np.ascontiguousarray(x).reshape(-1, block)


def fp16_bits(f: np.ndarray) -> np.ndarray:
    """``GGML_FP32_TO_FP16`` as uint16 words."""
    with np.errstate(over="ignore", invalid="ignore"):
        h = np.asarray(f, dtype=_F32).astype(np.float16).view(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        sign = (np.asarray(f, dtype=_F32)[nan].view(np.uint32) >> np.uint32(16)).astype(np.uint16) & np.uint16(0x8000)
        h[nan] = sign | np.uint16(0x7E00)
    return h


def first_absmax(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: C's ``if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`` scan from ``amax = max = 0``."""
    a = np.abs(xb)
    idx = a.argmax(axis=1)[:, None]
    amax = np.take_along_axis(a, idx, axis=1)[:, 0]
    vmax = np.take_along_axis(xb, idx, axis=1)[:, 0]
    vmax[amax == 0] = 0  # +0.0: C never replaces its initial max when no |v| exceeds 0
    bad = np.flatnonzero(~np.isfinite(amax))
    if bad.size:
        sub = xb[bad]
        am = np.zeros(bad.size, _F32)
        vm = np.zeros(bad.size, _F32)
        for j in range(xb.shape[1]):
            v = sub[:, j]
            av = np.abs(v)
            upd = am < av  # false for NaN, as in C
            am[upd] = av[upd]
            vm[upd] = v[upd]
        amax[bad] = am
        vmax[bad] = vm
    return amax, vmax


def _min_max(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: C's ``min = FLT_MAX; max = -FLT_MAX; if (v < min) min = v; if (v > max) max = v;``."""
    mn = np.take_along_axis(xb, xb.argmin(axis=1)[:, None], axis=1)[:, 0]
    mx = np.take_along_axis(xb, xb.argmax(axis=1)[:, None], axis=1)[:, 0]
    bad = np.flatnonzero(~(np.isfinite(mn) & np.isfinite(mx)))
    if bad.size:
        sub = xb[bad]
        lo = np.full(bad.size, _FLT_MAX, _F32)
        hi = np.full(bad.size, -_FLT_MAX, _F32)
        for j in range(xb.shape[1]):
            v = sub[:, j]
            m = v < lo
            lo[m] = v[m]
            m = v > hi
            hi[m] = v[m]
        mn[bad] = lo
        mx[bad] = hi
    return mn, mx


def reciprocal_or_zero(d: np.ndarray) -> np.ndarray:
    """C's ``d ? 1.0f/d : 0.0f`` (a denormal d gives inf, as in C)."""
    out = np.zeros_like(d)
    with np.errstate(divide="ignore", over="ignore"):
        np.divide(_F32(1), d, out=out, where=d != 0)
    return out


def _truncate_to_byte(t: np.ndarray) -> np.ndarray:
    """C's ``(int8_t)t`` / ``(uint8_t)t`` for float t, as x86 compiles it: truncate to int32, keep the low byte."""
    with np.errstate(invalid="ignore"):
        i = t.astype(np.int32)
    return i.astype(np.int8)  # wraps: the low byte, as a signed char


# --- the quantizers

def _quant_symmetric(xb: np.ndarray, div: int, bias: float, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0/Q5_0: ``d = max / -div``, ``q = MIN(top, (int8_t)(x*id + bias))``. Returns (d, q as uint8)."""
    _, vmax = first_absmax(xb)
    d = vmax / _F32(-div)
    with np.errstate(invalid="ignore"):  # 0 * inf when the scale is a denormal, as in C
        t = xb * reciprocal_or_zero(d)[:, None]
    t += _F32(bias)
    q = _truncate_to_byte(t)
    np.minimum(q, np.int8(top), out=q)
    return d, q.view(np.uint8)  # uint8_t xi = MIN(...): the int8 result's byte


def _quant_affine(xb: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1/Q5_1: ``d = (max - min) / levels``, ``x0 = (x - min)*id``. Returns (d, min, x0 + 0.5f)."""
    mn, mx = _min_max(xb)
    with np.errstate(over="ignore", invalid="ignore"):
        d = (mx - mn) / _F32(levels)
        t = xb - mn[:, None]
        t *= reciprocal_or_zero(d)[:, None]
    t += _F32(0.5)
    return d, mn, t


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """``qs[j] = (q[j] & 0xF) | (q[j + 16] << 4)`` (uint8 arithmetic drops the shifted-out bits, as the C store does)."""
    return (q[:, :16] & np.uint8(0x0F)) | (q[:, 16:] << np.uint8(4))


def _fifth_bits(q: np.ndarray) -> np.ndarray:
    """Q5 ``qh``: bit 4 of quant ``p`` (``xi0`` at j, ``xi1`` at j + 16) is bit ``p`` of a little-endian uint32."""
    return np.packbits((q >> np.uint8(4)) & np.uint8(1), axis=1, bitorder="little")


def _quantize_jit(x: np.ndarray, name: str, block: np.dtype) -> np.ndarray | None:
    """The compiled quantizer (see ``jit``), or None without numba. Same bytes as the numpy path."""
    k = jit.legacy_kernels()
    if k is None:
        return None
    if x.dtype == np.float16:
        xb = as_blocks_f16(x)
        run = k.legacy_quantize_f16
    else:
        xb = as_blocks(x, QK)
        run = k.legacy_quantize
    out = np.empty((xb.shape[0], block.itemsize), np.uint8)
    run(xb, getattr(k, f"LEGACY_{name}"), out)
    return out.reshape(-1)


def as_blocks_f16(x: np.ndarray) -> np.ndarray:
    """F16 values as their uint16 words, ``[n_blocks, 32]`` (the contract of ``as_blocks``)."""
    if x.ndim != 1 or x.size % QK:
        raise ValueError(f"expected a 1-D array of whole {QK}-value blocks, got shape {x.shape}")
    return np.ascontiguousarray(x).view(np.uint16).reshape(-1, QK)


def quantize_q4_0(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*32,)`` -> Q4_0 blocks as bytes ``(n*18,)``: fp16 ``d`` then 16 bytes of nibbles."""
    if importance is not None:
        return _quantize_weighted(x, importance, "Q4_0")
    fast = _quantize_jit(x, "Q4_0", BLOCK_Q4_0)
    if fast is not None:
        return fast
    xb = as_blocks(x, QK)
    d, q = _quant_symmetric(xb, 8, 8.5, 15)
    out = np.empty(xb.shape[0], BLOCK_Q4_0)
    out["d"] = fp16_bits(d)
    out["qs"] = (q[:, :16] | (q[:, 16:] << np.uint8(4)))  # C: qs = xi0; qs |= xi1 << 4 (no mask on xi0)
    return out.view(np.uint8)


def quantize_q4_1(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*32,)`` -> Q4_1 blocks as bytes ``(n*20,)``: fp16 ``d``, fp16 ``m``, 16 bytes of nibbles."""
    if importance is not None:
        return _quantize_weighted(x, importance, "Q4_1")
    fast = _quantize_jit(x, "Q4_1", BLOCK_Q4_1)
    if fast is not None:
        return fast
    xb = as_blocks(x, QK)
    d, mn, t = _quant_affine(xb, 15)
    q = _truncate_to_byte(t)
    np.minimum(q, np.int8(15), out=q)
    q = q.view(np.uint8)
    out = np.empty(xb.shape[0], BLOCK_Q4_1)
    out["d"] = fp16_bits(d)
    out["m"] = fp16_bits(mn)
    out["qs"] = (q[:, :16] | (q[:, 16:] << np.uint8(4)))
    return out.view(np.uint8)


def quantize_q5_0(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*32,)`` -> Q5_0 blocks as bytes ``(n*22,)``: fp16 ``d``, 4 bytes of fifth bits, 16 of nibbles."""
    if importance is not None:
        return _quantize_weighted(x, importance, "Q5_0")
    fast = _quantize_jit(x, "Q5_0", BLOCK_Q5_0)
    if fast is not None:
        return fast
    xb = as_blocks(x, QK)
    d, q = _quant_symmetric(xb, 16, 16.5, 31)
    out = np.empty(xb.shape[0], BLOCK_Q5_0)
    out["d"] = fp16_bits(d)
    out["qh"] = _fifth_bits(q)
    out["qs"] = _pack_nibbles(q)
    return out.view(np.uint8)


def quantize_q5_1(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*32,)`` -> Q5_1 blocks as bytes ``(n*24,)``: fp16 ``d``, fp16 ``m``, 4 bytes ``qh``, 16 ``qs``."""
    if importance is not None:
        return _quantize_weighted(x, importance, "Q5_1")
    fast = _quantize_jit(x, "Q5_1", BLOCK_Q5_1)
    if fast is not None:
        return fast
    xb = as_blocks(x, QK)
    d, mn, t = _quant_affine(xb, 31)
    q = _truncate_to_byte(t).view(np.uint8)
    out = np.empty(xb.shape[0], BLOCK_Q5_1)
    out["d"] = fp16_bits(d)
    out["m"] = fp16_bits(mn)
    out["qh"] = _fifth_bits(q)
    out["qs"] = _pack_nibbles(q)
    return out.view(np.uint8)


def quantize_from_f16(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The Q4_0/Q4_1/Q5_0/Q5_1 encoder (``name``) taking F16 values (or their uint16 words)."""
    block = {"Q4_0": BLOCK_Q4_0, "Q4_1": BLOCK_Q4_1, "Q5_0": BLOCK_Q5_0, "Q5_1": BLOCK_Q5_1}[name]
    widened = {"Q4_0": quantize_q4_0, "Q4_1": quantize_q4_1, "Q5_0": quantize_q5_0, "Q5_1": quantize_q5_1}[name]

    def encode(raw: np.ndarray) -> np.ndarray:
        x = raw.view(np.float16).reshape(-1)
        fast = _quantize_jit(x, name, block)
        return fast if fast is not None else widened(x.astype(np.float32))

    return encode


# --- with an importance matrix (quantize_row_*_impl)

_MAGIC = _F32(12582912.0)
_GROUP_MAX_EPS = _F32(1e-15)
_KIND = {"Q4_0": 0, "Q4_1": 1, "Q5_0": 2, "Q5_1": 3}
_BLOCK = {"Q4_0": BLOCK_Q4_0, "Q4_1": BLOCK_Q4_1, "Q5_0": BLOCK_Q5_0, "Q5_1": BLOCK_Q5_1}


def as_rows(x: np.ndarray, importance: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(float32 rows ``[n, row_length]``, importance float32 ``[row_length]``): whole rows of whole blocks, checked."""
    qw = np.asarray(importance)
    xb = as_blocks(x, block)
    if qw.dtype != _F32 or qw.ndim != 1 or qw.size == 0 or qw.size % block or xb.size % qw.size:
        raise ValueError(f"importance must be float32 [row_length] (whole {block}-value blocks) dividing the input; "
                         f"got {qw.dtype} {qw.shape} for {xb.size} values")
    return xb.reshape(-1, qw.size), np.ascontiguousarray(qw)


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """C's ``nearest_int`` on the bits, for every float32 (as int64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        t = (v + _MAGIC).view(np.int32)
    return ((t & np.int32(0x7FFFFF)) - np.int32(0x400000)).astype(np.int64)


def row_sigma2(xr: np.ndarray) -> np.ndarray:
    """``sum_x2 += x[j]*x[j]`` over each row in order, ``/ n_per_row``: [n] float32."""
    s = np.zeros(xr.shape[0], _F32)
    for j in range(xr.shape[1]):
        s += xr[:, j] * xr[:, j]
    return s / _F32(xr.shape[1])


def _qx_quants(xb: np.ndarray, w: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(32, nmax, x, L, 1, w) for every block of ``xb`` [n, 32]: (scale [n], L [n, 32] in [0, 2*nmax))."""
    amax, vmax = first_absmax(xb)
    fn = _F32(nmax)
    n = xb.shape[0]

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        li = np.clip(_nearest_int(iscale[:, None] * xb), -nmax, nmax - 1)
        lf = li.astype(_F32)
        sumlx, suml2 = np.zeros(n, _F32), np.zeros(n, _F32)
        for i in range(32):
            sumlx += w[:, i] * xb[:, i] * lf[:, i]
            suml2 += w[:, i] * lf[:, i] * lf[:, i]
        return li + nmax, sumlx, suml2

    L, sumlx, suml2 = fit(_F32(-fn) / vmax)
    scale = np.where(suml2 != 0, sumlx / suml2, _F32(0)).astype(_F32)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        Ln, sumlx, suml2 = fit(-(fn + _F32(0.1) * _F32(step)) / vmax)
        upd = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L[upd] = Ln[upd]
        scale[upd] = sumlx[upd] / suml2[upd]
        best[upd] = scale[upd] * sumlx[upd]
    zero = amax < _GROUP_MAX_EPS
    scale[zero] = 0
    L[zero] = 0
    return scale, L


def _qkx3_quants(xb: np.ndarray, w: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx3_quants(32, nmax, x, w, L, &min, Laux, -0.9f, 0.05f, 36, false) per block: (scale, -the_min, L)."""
    n = xb.shape[0]
    mn, mx = xb[:, 0].copy(), xb[:, 0].copy()
    sum_w = w[:, 0].copy()
    sum_x = sum_w * xb[:, 0]
    for i in range(1, 32):
        v = xb[:, i]
        m = v < mn
        mn[m] = v[m]
        m = v > mx
        mx[m] = v[m]
        sum_w += w[:, i]
        sum_x += w[:, i] * v
    mn[mn > 0] = 0
    flat = mx <= mn  # C returns early (a NaN never does: C goes on with it)
    fn = _F32(nmax)
    iscale = fn / (mx - mn)
    scale = _F32(1) / iscale
    L = np.clip(_nearest_int(iscale[:, None] * (xb - mn[:, None])), 0, nmax)
    best_mad = np.zeros(n, _F32)
    for i in range(32):
        diff = scale * L[:, i].astype(_F32) + mn - xb[:, i]
        best_mad += w[:, i] * (diff * diff)
    for step in range(37):
        iscale = (_F32(-0.9) + _F32(0.05) * _F32(step) + fn) / (mx - mn)  # mn: the best fit's so far, as in C
        laux = np.clip(_nearest_int(iscale[:, None] * (xb - mn[:, None])), 0, nmax)
        lf = laux.astype(_F32)
        sum_l, sum_l2, sum_xl = np.zeros(n, _F32), np.zeros(n, _F32), np.zeros(n, _F32)
        for i in range(32):
            sum_l += w[:, i] * lf[:, i]
            sum_l2 += w[:, i] * lf[:, i] * lf[:, i]
            sum_xl += w[:, i] * lf[:, i] * xb[:, i]
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        this_min[pos] = 0
        this_scale[pos] = sum_xl[pos] / sum_l2[pos]
        mad = np.zeros(n, _F32)
        for i in range(32):
            diff = this_scale * lf[:, i] + this_min - xb[:, i]
            mad += w[:, i] * (diff * diff)
        upd = ok & (mad < best_mad) & ~flat
        L[upd] = laux[upd]
        best_mad[upd] = mad[upd]
        scale[upd] = this_scale[upd]
        mn[upd] = this_min[upd]
    scale[flat] = 0
    L[flat] = 0
    return scale, mn, L


def _quantize_weighted(x: np.ndarray, importance: np.ndarray, name: str) -> np.ndarray:
    """quantize_q{4,5}_{0,1} with importance: the numba kernel, else the numpy path (the same bytes)."""
    xr, qw = as_rows(x, importance, QK)
    block = _BLOCK[name]
    k = jit.legacy_kernels()
    if k is not None:
        out = np.empty((xr.size // QK, block.itemsize), np.uint8)
        k.legacy_quantize_weighted(np.ascontiguousarray(xr), qw, _KIND[name], out)
        return out.reshape(-1)
    return weighted_numpy(xr, qw, name)


def weighted_numpy(xr: np.ndarray, qw: np.ndarray, name: str) -> np.ndarray:
    """The numpy path of the importance quantizers (no numba): rows ``xr`` [n, row_length], ``qw`` [row_length]."""
    with np.errstate(all="ignore"):  # C's float semantics: inf and NaN are part of the arithmetic
        sigma2 = row_sigma2(xr)
        xb = xr.reshape(-1, QK)
        w = np.tile(qw, xr.shape[0]).reshape(-1, QK) * np.sqrt(np.repeat(sigma2, xr.shape[1] // QK)[:, None] + xb * xb)
        five = name.startswith("Q5")
        out = np.empty(xb.shape[0], _BLOCK[name])
        if name.endswith("_0"):
            d, L = _qx_quants(xb, w, 8 if name == "Q4_0" else 16)
        else:
            d, m, L = _qkx3_quants(xb, w, 15 if name == "Q4_1" else 31)
            out["m"] = fp16_bits(m)
    out["d"] = fp16_bits(d)
    q = L.astype(np.uint8)
    if five:
        out["qh"] = _fifth_bits(q)
    out["qs"] = _pack_nibbles(q)
    return out.view(np.uint8)
