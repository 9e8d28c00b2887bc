"""ggml's Q2_K and Q3_K, bit-exact with ``quantize_row_q2_K_ref`` / ``quantize_row_q3_K_ref``.

With ``importance`` (float32 [row_length]) the bytes of ``quantize_row_q2_K_impl`` / ``q3_K_impl``.
numba kernels (``_kquant_kernels``) when present, numpy otherwise, same bytes. Refuses only an
importance that is not whole rows. Specification: docs/quantizers.md, "Q2_K and Q3_K".
"""

from __future__ import annotations

import numpy as np

from . import jit
from .kquants import check_importance, requantize_levels, run_imatrix_search

QK_K = 256
Q2_K_BLOCK_BYTES = 84  # scales[16] | qs[64] | d f16 | dmin f16
Q3_K_BLOCK_BYTES = 110  # hmask[32] | qs[64] | scales[12] | d f16

# super-blocks per chunk (cache-sized; Q3_K's many small calls want wider chunks)
_Q2_CHUNK_BLOCKS = 512
_Q3_CHUNK_BLOCKS = 1024

_F0 = np.float32(0)
_I0 = np.int32(0)
_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: nearest_int's rounding constant
_MANT = np.int32(0x007FFFFF)
_HALF_MANT = np.int32(0x00400000)
_RINT_SAFE = np.float32(4194303)  # |v| below this: nearest_int(v) == rint(v)
_GROUP_MAX_EPS = np.float32(1e-15)  # C: 1e-15f


def _nearest_int(v: np.ndarray, out: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int`` into int32 ``out``, the garbage C stores for |v| >= 2**22, inf and NaN included."""
    f = out.view(np.float32)
    np.add(v, _MAGIC, out=f)
    np.bitwise_and(out, _MANT, out=out)
    np.subtract(out, _HALF_MANT, out=out)
    return out


def _round_clamp(v: np.ndarray, lo: int, hi: int, iout: np.ndarray, fout: np.ndarray | None = None) -> np.ndarray:
    """``MAX(lo, MIN(hi, nearest_int(v)))`` into int32 ``iout``, also as float32 (C's int->float) in ``fout``."""
    _nearest_int(v, iout)
    np.clip(iout, np.int32(lo), np.int32(hi), out=iout)
    if fout is not None:
        np.copyto(fout, iout, casting="same_kind")
    return iout


def _seqsum(t: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``s = 0; for (i = 0; i < n; ++i) s += t[i]`` for every column of a C-contiguous ``[..., n, m]``."""
    return np.add.reduce(t, axis=-2, out=out, initial=_F0)


def _mask_bits(mask: np.ndarray, out: np.ndarray) -> np.ndarray:
    """bool -> int32 all-ones / zero (``0 - (uint8)mask``), for ``_blend``."""
    return np.subtract(_I0, mask.view(np.uint8), out=out)


def _blend(bits: np.ndarray, src: np.ndarray, dst: np.ndarray, tmp: np.ndarray) -> None:
    """``dst = bits ? src : dst`` bit for bit on int32 views (``dst ^= (src ^ dst) & bits``)."""
    np.bitwise_xor(src, dst, out=tmp)
    np.bitwise_and(tmp, bits, out=tmp)
    np.bitwise_xor(dst, tmp, out=dst)


def _i32(a: np.ndarray) -> np.ndarray:
    return a.view(np.int32)


def _sub_blocks(x: np.ndarray, name: str) -> np.ndarray:
    """Validate ``x`` and view it as ``[n_blocks, 256]`` float32."""
    x = np.asarray(x)
    if x.ndim != 1 or x.size % QK_K:
        raise ValueError(f"{name}: need a 1-D array of whole {QK_K}-value super-blocks, got shape {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK_K)


def _transpose_sub_blocks(xb: np.ndarray) -> np.ndarray:
    """``[nb, 256]`` -> ``[16, nb*16]``: column ``16*b + j`` is sub-block j of super-block b."""
    return np.ascontiguousarray(xb.reshape(-1, 16).T)


def _pack_2bit(q: np.ndarray) -> np.ndarray:
    """``[nb, 256]`` 2-bit codes -> ``[nb, 64]`` ``qs``: byte ``32*h + l`` holds value ``128*h + 32*k + l`` at bits ``2k``."""
    q4 = q.astype(np.uint8).reshape(-1, 2, 4, 32)
    packed = q4[:, :, 0] | (q4[:, :, 1] << 2) | (q4[:, :, 2] << 4) | (q4[:, :, 3] << 6)
    return packed.reshape(-1, 64)


def _first_max(vals: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``if (key[i] > best) { best = key[i]; pick = vals[i]; }`` over axis 0: first of ties, NaN never wins."""
    best = np.zeros(key.shape[1:], np.float32)
    pick = np.zeros(vals.shape[1:], np.float32)
    for i in range(key.shape[0]):
        upd = key[i] > best
        np.copyto(best, key[i], where=upd)
        np.copyto(pick, vals[i], where=upd)
    return best, pick


def _f16(v: np.ndarray) -> np.ndarray:
    """GGML_FP32_TO_FP16 (docs/quantizers.md, fp16 scales), as little-endian fp16."""
    return v.astype(np.float16).astype("<f2", copy=False)


def _f16_bytes(h: np.ndarray) -> np.ndarray:
    return h.view(np.uint8).reshape(-1, 2)


# ---------------------------------------------------------------------------------------- Q2_K


def _make_qkx2_quants(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx2_quants(16, 3, x, |x|, L, &the_min, Laux, -0.5f, 0.1f, 15, true)`` on ``[16, n_sub]``."""
    n = xs.shape[1]
    nmax = np.float32(3)
    w = np.abs(xs)
    # C: min = max = x[0]; if (x[i] < min) min = x[i]; ... NaN never replaces, but a NaN x[0] stays
    lo = np.fmin.reduce(xs, axis=0)
    mx = np.fmax.reduce(xs, axis=0)
    nan0 = np.isnan(xs[0])
    if nan0.any():
        lo[nan0] = xs[0, nan0]
        mx[nan0] = xs[0, nan0]
    # sum_w = w[0]; sum_x = sum_w * x[0]; then += in order (no leading 0 +)
    sum_w = np.add.reduce(w, axis=0)
    sum_x = np.add.reduce(w * xs, axis=0)
    mn0 = np.where(lo > 0, _F0, lo)
    flat = mx == mn0  # C returns early: L = 0, scale 0, the_min = -min

    t = np.empty_like(xs)
    lf = np.empty_like(xs)
    prods = np.empty((3, *xs.shape), np.float32)
    sums = np.empty((3, n), np.float32)
    sum_l, sum_l2, sum_xl = sums
    bound = np.empty(n, np.float32)
    tmp = np.empty(n, np.float32)
    # state and candidate: error, iscale, min the codes came from, scale, min
    state = np.empty((5, n), np.float32)
    cand = np.empty((5, n), np.float32)
    best_error, best_iscale, best_from, scale, mn = state
    cur, iscale, from_, this_scale, this_min = cand
    bits = np.empty(n, np.int32)
    btmp = np.empty((5, n), np.int32)

    def codes(isc: np.ndarray, m: np.ndarray) -> None:
        """lf = MAX(0, MIN(nmax, nearest_int(isc*(x - m)))) as float32; ``rint`` where ``bound`` proves it exact."""

        np.subtract(xs, m, out=t)
        np.multiply(t, isc, out=t)
        np.subtract(mx, m, out=bound)
        np.abs(bound, out=bound)
        np.subtract(lo, m, out=tmp)
        np.abs(tmp, out=tmp)
        np.maximum(bound, tmp, out=bound)
        np.abs(isc, out=tmp)
        np.multiply(bound, tmp, out=bound)
        safe = bound < _RINT_SAFE
        safe |= flat
        if safe.all():
            np.clip(t, _F0, nmax, out=t)
            np.rint(t, out=lf)
        else:
            _round_clamp(t, 0, 3, np.empty(xs.shape, np.int32), lf)

    def error(sc: np.ndarray, m: np.ndarray, out: np.ndarray) -> None:
        # sum of w * fabsf(scale*l + min - x), in index order
        np.multiply(lf, sc, out=t)
        np.add(t, m, out=t)
        np.subtract(t, xs, out=t)
        np.abs(t, out=t)
        np.multiply(w, t, out=t)
        _seqsum(t, out)

    mn[:] = mn0
    np.subtract(mx, mn, out=tmp)
    np.divide(nmax, tmp, out=best_iscale)
    np.divide(np.float32(1), best_iscale, out=scale)
    best_from[:] = mn
    codes(best_iscale, mn)
    error(scale, mn, best_error)
    rmin, rdelta = np.float32(-0.5), np.float32(0.1)
    for step in range(16):
        np.subtract(mx, mn, out=tmp)
        np.divide((rmin + rdelta * np.float32(step)) + nmax, tmp, out=iscale)
        from_[:] = mn
        codes(iscale, mn)
        np.multiply(w, lf, out=prods[0])
        np.multiply(prods[0], lf, out=prods[1])
        np.multiply(prods[0], xs, out=prods[2])
        _seqsum(prods, sums)
        d = sum_w * sum_l2 - sum_l * sum_l
        np.divide(sum_w * sum_xl - sum_x * sum_l, d, out=this_scale)
        np.divide(sum_l2 * sum_x - sum_l * sum_xl, d, out=this_min)
        clip = this_min > 0
        if clip.any():
            np.copyto(this_min, _F0, where=clip)
            np.copyto(this_scale, sum_xl / sum_l2, where=clip)
        error(this_scale, this_min, cur)
        better = d > 0
        better &= cur < best_error
        if better.any():
            _mask_bits(better, bits)
            _blend(bits, _i32(cand), _i32(state), btmp)
    np.subtract(xs, best_from, out=t)
    np.multiply(t, best_iscale, out=t)
    lq = _round_clamp(t, 0, 3, np.empty(xs.shape, np.int32))
    lq[:, flat] = 0
    np.copyto(scale, _F0, where=flat)
    np.copyto(mn, mn0, where=flat)
    return scale.copy(), -mn, lq


def _q2_k_chunk(xb: np.ndarray, out: np.ndarray) -> None:
    """quantize_row_q2_K_ref over ``xb`` ``[nb, 256]`` into ``out`` ``[nb, 84]``."""
    nb = xb.shape[0]
    k = jit.kquant_kernels()
    if k is None:
        xs = _transpose_sub_blocks(xb)
        scales, mins, lq = _make_qkx2_quants(xs)
    else:  # the same search compiled (see jit)
        G = nb * 16
        scales, mins, lq = np.empty(G, np.float32), np.empty(G, np.float32), np.empty((G, 16), np.uint8)
        k.qkx2_search(xb.reshape(G, 16), 3, np.float32(-0.5), np.float32(0.1), 15, True, False, scales, mins, lq)
    scales = scales.reshape(nb, 16)
    mins = mins.reshape(nb, 16)
    q4scale = np.float32(15)

    max_scale, _ = _first_max(scales.T, scales.T)
    max_min, _ = _first_max(mins.T, mins.T)
    li = np.empty((nb, 16), np.int32)
    sc = np.zeros((nb, 16), np.int32)
    has = max_scale > 0
    _nearest_int((q4scale / max_scale)[:, None] * scales, li)
    np.copyto(sc, li & 0xFF, where=has[:, None])  # uint8 store of an int
    has = max_min > 0
    _nearest_int((q4scale / max_min)[:, None] * mins, li)
    np.copyto(sc, sc | ((li << 4) & 0xFF), where=has[:, None])
    d16 = _f16(max_scale / q4scale)  # = fp16(0.f) when max_scale is 0, as C's else branch
    dmin16 = _f16(max_min / q4scale)

    # requantize with the rounded scales; a sub-block whose scale rounds to 0 keeps its L
    d = (d16.astype(np.float32)[:, None] * (sc & 0xF).astype(np.float32)).reshape(-1)
    dm = (dmin16.astype(np.float32)[:, None] * (sc >> 4).astype(np.float32)).reshape(-1)
    if k is None:
        v = np.add(xs, dm)
        np.divide(v, d, out=v)
        lnew = _round_clamp(v, 0, 3, np.empty(xs.shape, np.int32))
        np.copyto(lq, lnew, where=d != 0)  # C: if (!d) continue; a NaN d goes on
        out[:, 16:80] = _pack_2bit(lq.T.reshape(nb, QK_K))
    else:
        k.q2_finish(xb.reshape(-1), d, dm, lq.reshape(-1), out)
    out[:, 0:16] = sc.astype(np.uint8)
    out[:, 80:82] = _f16_bytes(d16)
    out[:, 82:84] = _f16_bytes(dmin16)


def quantize_q2_k(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 whole rows -> Q2_K bytes ``(n*84,)``, as quantize_row_q2_K_ref, or _impl with ``importance`` [row_length]."""

    xb = _sub_blocks(x, "quantize_q2_k")
    if importance is not None:
        return _q2_k_imatrix(xb, importance)
    out = np.empty((xb.shape[0], Q2_K_BLOCK_BYTES), np.uint8)
    with np.errstate(all="ignore"):
        for s in range(0, xb.shape[0], _Q2_CHUNK_BLOCKS):
            _q2_k_chunk(xb[s:s + _Q2_CHUNK_BLOCKS], out[s:s + _Q2_CHUNK_BLOCKS])
    return out.reshape(-1)


# ---------------------------------------------------------------------------------------- Q3_K


def _make_q3_quants(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``make_q3_quants(16, 4, x, L, true)`` on ``[16, n_sub]`` -> ``(scale, L)``, L in 0..7."""
    n = xs.shape[1]
    ax = np.abs(xs)
    # amax/max: first x of largest |x| (C: if (ax > amax) {amax = ax; max = x;}, NaN never wins)
    amax = np.fmax.reduce(ax, axis=0, initial=_F0)
    mx = np.zeros(n, np.float32)
    bits = np.empty(n, np.int32)
    tmp_i = np.empty(n, np.int32)
    for i in range(15, -1, -1):  # last assignment wins: the first index
        _mask_bits(ax[i] == amax, bits)
        _blend(bits, _i32(xs[i]), _i32(mx), tmp_i)
    zero = amax < _GROUP_MAX_EPS  # C returns early: L = 0 (not nmax), scale 0
    # iscale*x is within [-4, 4] unless an infinity makes it NaN: the exact nearest_int, once
    lf = np.empty_like(xs)
    _round_clamp(xs * (np.float32(-4) / mx), -4, 3, np.empty(xs.shape, np.int32), lf)
    w = xs * xs
    wx = w * xs
    sums = np.empty((2, n), np.float32)
    sumlx, suml2 = sums
    _seqsum(wx * lf, sumlx)  # w*x*l = (w*x)*l
    _seqsum((w * lf) * lf, suml2)

    new_i = np.empty(n, np.int32)
    new_f = np.empty(n, np.float32)
    cand = np.empty((2, n), np.float32)
    slx, sl2 = cand
    a = np.empty(n, np.float32)
    b = np.empty(n, np.float32)
    ctmp = np.empty((2, n), np.int32)
    for _ in range(5):
        changed = False
        for i in range(16):
            lf_i, x_i, w_i, wx_i = lf[i], xs[i], w[i], wx[i]
            np.multiply(wx_i, lf_i, out=a)
            np.subtract(sumlx, a, out=slx)
            np.multiply(w_i, lf_i, out=a)
            np.multiply(a, lf_i, out=a)
            np.subtract(suml2, a, out=sl2)
            np.multiply(x_i, sl2, out=a)
            np.divide(a, slx, out=a)
            _round_clamp(a, -4, 3, new_i, new_f)  # nearest_int(x*sl2/slx): may be huge
            ok = slx > 0
            ok &= new_f != lf_i
            np.multiply(wx_i, new_f, out=a)
            np.add(slx, a, out=slx)
            np.multiply(w_i, new_f, out=a)
            np.multiply(a, new_f, out=a)
            np.add(sl2, a, out=sl2)
            ok &= sl2 > 0
            np.multiply(slx, slx, out=a)
            np.multiply(a, suml2, out=a)
            np.multiply(sumlx, sumlx, out=b)
            np.multiply(b, sl2, out=b)
            ok &= a > b  # slx*slx*suml2 > sumlx*sumlx*sl2
            k = np.count_nonzero(ok)
            if k:
                changed = True
                if k * 16 < n:  # sparse: the masked copy is cheap
                    np.copyto(lf_i, new_f, where=ok)
                    np.copyto(sums, cand, where=ok)
                else:
                    _mask_bits(ok, bits)
                    _blend(bits, _i32(new_f), _i32(lf_i), tmp_i)
                    _blend(bits, _i32(cand), _i32(sums), ctmp)
        if not changed:
            break
    scale = np.zeros(n, np.float32)
    pos = suml2 > 0
    np.divide(sumlx, suml2, out=scale, where=pos)
    scale[zero] = 0
    lf[:, zero] = -4  # -> L = 0 below
    lq = lf.astype(np.int32)
    lq += 4
    return scale, lq


def _q3_k_chunk(xb: np.ndarray, out: np.ndarray) -> None:
    """quantize_row_q3_K_ref over ``xb`` ``[nb, 256]`` into ``out`` ``[nb, 110]``."""
    nb = xb.shape[0]
    k = jit.kquant_kernels()
    if k is None:
        xs = _transpose_sub_blocks(xb)
        scales, lq = _make_q3_quants(xs)
    else:  # the same search compiled (see jit)
        scales, lq = np.empty(nb * 16, np.float32), np.empty((nb * 16, 16), np.uint8)
        k.q3_search(xb.reshape(nb * 16, 16), scales, lq)
    scales = scales.reshape(nb, 16)

    _, max_scale = _first_max(scales.T, np.abs(scales.T))
    has = max_scale != 0
    iscale = np.float32(-32) / max_scale
    li = _nearest_int(iscale[:, None] * scales, np.empty((nb, 16), np.int32))
    li = ((li + 128) & 0xFF) - 128
    np.clip(li, -32, 31, out=li)
    li += 32
    li[~has] = 0  # memset: a zero super-scale stores all-zero scale bytes
    d16 = _f16(np.where(has, np.float32(1) / iscale, _F0))

    lo = li & 0xF
    hi = li >> 4
    packed = np.empty((nb, 12), np.int32)
    packed[:, 0:8] = lo[:, 0:8] | (lo[:, 8:16] << 4)
    packed[:, 8:12] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)

    # requantize with the 6-bit scales (decoded: stored - 32); a zero scale keeps L
    d = (d16.astype(np.float32)[:, None] * (li - 32).astype(np.float32)).reshape(-1)
    if k is None:
        v = np.divide(xs, d)
        lnew = _round_clamp(v, -4, 3, np.empty(xs.shape, np.int32))
        lnew += 4
        np.copyto(lq, lnew, where=d != 0)  # C: if (!d) continue; a NaN d goes on

        lq = lq.T.reshape(nb, QK_K)
        high = lq > 3
        lq -= 4 * high
        hb = high.reshape(nb, 8, 32).astype(np.uint8)  # value 32*k + m -> bit k of hmask[m]
        hmask = np.zeros((nb, 32), np.uint8)
        for bit in range(8):
            hmask |= hb[:, bit] << bit

        out[:, 0:32] = hmask
        out[:, 32:96] = _pack_2bit(lq)
    else:
        k.q3_finish(xb.reshape(-1), d, lq.reshape(-1), out)
    out[:, 96:108] = packed.astype(np.uint8)
    out[:, 108:110] = _f16_bytes(d16)


def quantize_q3_k(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 whole rows -> Q3_K bytes ``(n*110,)``, as quantize_row_q3_K_ref, or _impl with ``importance`` [row_length]."""

    xb = _sub_blocks(x, "quantize_q3_k")
    if importance is not None:
        return _q3_k_imatrix(xb, importance)
    out = np.empty((xb.shape[0], Q3_K_BLOCK_BYTES), np.uint8)
    with np.errstate(all="ignore"):
        for s in range(0, xb.shape[0], _Q3_CHUNK_BLOCKS):
            _q3_k_chunk(xb[s:s + _Q3_CHUNK_BLOCKS], out[s:s + _Q3_CHUNK_BLOCKS])
    return out.reshape(-1)


# ------------------------------------------------------------------ with an importance matrix (_impl)


def _q2_k_imatrix(xb: np.ndarray, importance: np.ndarray) -> np.ndarray:
    """quantize_row_q2_K_impl row by row: make_qkx3_quants per 16 values, make_qp_quants for the 4-bit scales and mins."""
    qw = check_importance(xb, importance, "quantize_q2_k")
    nb = xb.shape[0]
    out = np.empty((nb, Q2_K_BLOCK_BYTES), np.uint8)
    if nb == 0:
        return out.reshape(-1)
    L = np.empty((nb, QK_K), np.uint8)
    ls, lm = np.empty((nb, 16), np.int64), np.empty((nb, 16), np.int64)
    d_block, m_block = np.empty(nb, np.float32), np.empty(nb, np.float32)
    run_imatrix_search("qkx3_imatrix", xb, qw, L, ls, lm, d_block, m_block, args=(16, 3, np.float32(1.0)))
    sc = (ls | (lm << 4)) & 0xFF  # y.scales[j] = Ls[j] | (Lm[j] << 4), a uint8 store
    with np.errstate(all="ignore"):  # an overflowing super-scale becomes fp16 inf, as in C
        d16, dmin16 = _f16(d_block), _f16(m_block)
        d = (d16.astype(np.float32)[:, None] * (sc & 0xF).astype(np.float32)).reshape(-1)
        dm = (dmin16.astype(np.float32)[:, None] * (sc >> 4).astype(np.float32)).reshape(-1)
        k = jit.kquant_kernels()
        if k is not None:
            k.q2_finish(xb.reshape(-1), d, dm, L.reshape(-1), out)
        else:
            requantize_levels(xb.reshape(-1), d, dm, 0, 3, 0, L.reshape(-1))
            out[:, 16:80] = _pack_2bit(L)
    out[:, 0:16] = sc.astype(np.uint8)
    out[:, 80:82] = _f16_bytes(d16)
    out[:, 82:84] = _f16_bytes(dmin16)
    return out.reshape(-1)


def _q3_k_imatrix(xb: np.ndarray, importance: np.ndarray) -> np.ndarray:
    """quantize_row_q3_K_impl row by row: weighted make_qx_quants per 16 values, then on the 16 scales."""
    qw = check_importance(xb, importance, "quantize_q3_k")
    nb = xb.shape[0]
    out = np.empty((nb, Q3_K_BLOCK_BYTES), np.uint8)
    if nb == 0:
        return out.reshape(-1)
    L = np.empty((nb, QK_K), np.uint8)
    ls = np.empty((nb, 16), np.int64)
    d_block = np.empty(nb, np.float32)
    run_imatrix_search("q3_imatrix", xb, qw, L, ls, d_block)
    lo, hi = ls & 0xF, ls >> 4
    packed = np.empty((nb, 12), np.int64)
    packed[:, 0:8] = lo[:, 0:8] | (lo[:, 8:16] << 4)
    packed[:, 8:12] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)
    with np.errstate(all="ignore"):
        d16 = _f16(d_block)
        d = (d16.astype(np.float32)[:, None] * (ls - 32).astype(np.float32)).reshape(-1)
        k = jit.kquant_kernels()
        if k is not None:
            k.q3_finish(xb.reshape(-1), d, L.reshape(-1), out)
        else:
            requantize_levels(xb.reshape(-1), d, None, -4, 3, 4, L.reshape(-1))
            lq = L.astype(np.int32)
            high = lq > 3
            lq -= 4 * high
            hb = high.reshape(nb, 8, 32).astype(np.uint8)  # value 32*k + m -> bit k of hmask[m]
            hmask = np.zeros((nb, 32), np.uint8)
            for bit in range(8):
                hmask |= hb[:, bit] << bit
            out[:, 0:32] = hmask
            out[:, 32:96] = _pack_2bit(lq)
    out[:, 96:108] = packed.astype(np.uint8)
    out[:, 108:110] = _f16_bytes(d16)
    return out.reshape(-1)


__all__ = ["Q2_K_BLOCK_BYTES", "Q3_K_BLOCK_BYTES", "quantize_q2_k", "quantize_q3_k"]
