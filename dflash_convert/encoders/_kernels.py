"""numba ports of ggml's per-group K-quant searches, loop for loop (see ``jit`` for when they run).

Importing this module imports numba; only ``jit.kernels()`` does, lazily. Each kernel is the C
code of ``ggml-quants.c`` written again, with the rules the numpy ports follow (see ``kquants``):
every value and constant is float32 (C's ``f`` literals; an int meeting a float is converted to
float first, as in C), sums run in index order, and there is no fastmath, so LLVM neither
contracts ``a*b + c`` into an FMA nor reassociates a sum: each operation rounds once, as in
ggml-base, which is built without FMA. A float64 creeping in would change bits, so every constant
is a named float32 and each accumulator starts from one.

``nearest_int`` is C's magic-number trick. In its valid range (|v| <= 2**22 - 1) ``(v + M) - M``
is exactly the rounded value; outside it (and for inf/NaN) the kernels reinterpret the float's
bits through a one-element scratch array, as C's memcpy does, so garbage is reproduced too.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

_F32 = np.float32
_ZERO = _F32(0.0)
_ONE = _F32(1.0)
_MAGIC = _F32(12582912.0)
_NI_HI = _F32(4194303.0)
_NI_LO = _F32(-4194303.0)
_GROUP_MAX_EPS = _F32(1e-15)
_THIRTY_TWO = _F32(32.0)
_NEG_THIRTY_TWO = _F32(-32.0)
_TENTH = _F32(0.1)

# nogil: the pipeline encodes on a thread pool. cache: compile once per machine. error_model
# numpy: a float division by zero gives inf/NaN as in C instead of raising.
_njit = numba.njit(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _nearest_int(v, fbuf, ibuf):
    if v >= _NI_LO and v <= _NI_HI:
        return np.int64((v + _MAGIC) - _MAGIC)
    fbuf[0] = v + _MAGIC
    return np.int64((ibuf[0] & 0x7FFFFF) - 0x400000)


@_njit
def qkx2_search_exact(xg, nmax, rmin, rdelta, nstep, mad, av_weights, scales, the_mins, L, g_start, g_end):
    """``make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux, rmin, rdelta, nstep, mad)`` for
    the groups (rows) g_start..g_end-1 of ``xg`` [G, n], one after the other as in C. Any input,
    inf and NaN included.

    Weights: quantize_row_q4_K_ref's / q5_K's ``av_x + |x|`` (av_x = sqrtf(sum x*x / n)) when
    ``av_weights``, else Q2_K's ``|x|``. Writes scales, the_mins float32 [G] and the search's
    levels into L [G, n].
    """
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    n = xg.shape[1]
    w = np.empty(n, np.float32)
    laux = np.empty(n, np.int32)
    nmax_f = _F32(nmax)
    n_f = _F32(n)
    for g in range(g_start, g_end):
        x = xg[g]
        if av_weights:
            sum_x2 = _ZERO
            for i in range(n):
                sum_x2 += x[i] * x[i]
            av_x = np.sqrt(sum_x2 / n_f)
            for i in range(n):
                w[i] = av_x + abs(x[i])
        else:
            for i in range(n):
                w[i] = abs(x[i])
        mn = x[0]
        mx = x[0]
        sum_w = w[0]
        sum_x = sum_w * x[0]
        for i in range(1, n):
            xi = x[i]
            if xi < mn:
                mn = xi
            if xi > mx:
                mx = xi
            sum_w += w[i]
            sum_x += w[i] * xi
        if mn > _ZERO:
            mn = _ZERO
        if mx == mn:
            for i in range(n):
                L[g, i] = 0
            the_mins[g] = -mn
            scales[g] = _ZERO
            continue
        iscale = nmax_f / (mx - mn)
        scale = _ONE / iscale
        best_error = _ZERO
        for i in range(n):
            li = max(0, min(nmax, _nearest_int(iscale * (x[i] - mn), fbuf, ibuf)))
            L[g, i] = li
            diff = scale * _F32(li) + mn - x[i]
            best_error += w[i] * (abs(diff) if mad else diff * diff)
        for step in range(nstep + 1):
            iscale = (rmin + rdelta * _F32(step) + nmax_f) / (mx - mn)
            sum_l = _ZERO
            sum_l2 = _ZERO
            sum_xl = _ZERO
            for i in range(n):
                li = max(0, min(nmax, _nearest_int(iscale * (x[i] - mn), fbuf, ibuf)))
                laux[i] = li
                lf = _F32(li)
                wl = w[i] * lf
                sum_l += wl
                sum_l2 += wl * lf
                sum_xl += wl * x[i]
            D = sum_w * sum_l2 - sum_l * sum_l
            if D > _ZERO:
                this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
                this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
                if this_min > _ZERO:
                    this_min = _ZERO
                    this_scale = sum_xl / sum_l2
                cur_error = _ZERO
                for i in range(n):
                    diff = this_scale * _F32(laux[i]) + this_min - x[i]
                    cur_error += w[i] * (abs(diff) if mad else diff * diff)
                if cur_error < best_error:
                    for i in range(n):
                        L[g, i] = laux[i]
                    best_error = cur_error
                    scale = this_scale
                    mn = this_min
        scales[g] = scale
        the_mins[g] = -mn


@_njit
def qkx_final_levels(x, d, dm, nmax, L):
    """``L = MAX(0, MIN(nmax, nearest_int((x + dm)/d)))`` per 32-value group; groups with d == 0
    keep the search's levels (C's ``if (!d) continue;``)."""
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    for g in range(d.size):
        dg = d[g]
        if dg == _ZERO:
            continue
        _requantize_group(x, g * 32, 32, dm[g], dg, 0, nmax, 0, L, fbuf, ibuf)


@_njit
def qx_search_exact(xg, scales, L, g_start, g_end):
    """``make_qx_quants(16, 32, x, L, 1, NULL)`` (Q6_K's) for the groups (rows) g_start..g_end-1
    of ``xg`` [G, 16], one after the other as in C. Any input, inf and NaN included.

    Writes scales float32 [G] and the levels L uint8 [G, 16] (l + 32; 0 for an all-zero group).
    """
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    laux = np.empty(16, np.uint8)
    for g in range(g_start, g_end):
        x = xg[g]
        amax = _ZERO
        mx = _ZERO
        for i in range(16):
            ax = abs(x[i])
            if ax > amax:
                amax = ax
                mx = x[i]
        if amax < _GROUP_MAX_EPS:
            for i in range(16):
                L[g, i] = 0
            scales[g] = _ZERO
            continue
        iscale = _NEG_THIRTY_TWO / mx
        sumlx = _ZERO
        suml2 = _ZERO
        for i in range(16):
            xi = x[i]
            li = max(-32, min(31, _nearest_int(iscale * xi, fbuf, ibuf)))
            L[g, i] = li + 32
            lf = _F32(li)
            wgt = xi * xi
            sumlx += wgt * xi * lf
            suml2 += wgt * lf * lf
        scale = sumlx / suml2 if suml2 != _ZERO else _ZERO
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(_THIRTY_TWO + _TENTH * _F32(step)) / mx
            sumlx = _ZERO
            suml2 = _ZERO
            for i in range(16):
                xi = x[i]
                li = max(-32, min(31, _nearest_int(iscale * xi, fbuf, ibuf)))
                laux[i] = li + 32
                lf = _F32(li)
                wgt = xi * xi
                sumlx += wgt * xi * lf
                suml2 += wgt * lf * lf
            if suml2 > _ZERO and sumlx * sumlx > best * suml2:
                for i in range(16):
                    L[g, i] = laux[i]
                scale = sumlx / suml2
                best = scale * sumlx
        scales[g] = scale


@_njit
def qx_final_levels(x, d, L):
    """``L = MAX(-32, MIN(31, nearest_int(x/d))) + 32`` per 16-value group; d == 0 keeps the search's."""
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    for g in range(d.size):
        dg = d[g]
        if dg == _ZERO:
            continue
        _requantize_group(x, g * 16, 16, _ZERO, dg, -32, 31, 32, L, fbuf, ibuf)


# ---------------------------------------------------------------------------------------------
# Lane kernels: the same searches for LANES groups at once, so that LLVM vectorises across groups
# (each group's sums still run in index order: a lane is one group). C's per-group branches become
# per-lane selects. Rounding takes the in-range form of nearest_int only; a tile where any
# argument falls outside it (only non-finite or absurdly spread input) is redone by the exact
# kernel, so the result is C's either way.
# ---------------------------------------------------------------------------------------------

LANES = 64  # groups per tile: x, weights and levels [32, 64] float32 are 8 KiB each, in L1


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _round_in_range(t):
    """nearest_int(t) as a float, for |t| <= 2**22 - 1 (the caller counts the others)."""
    return (t + _MAGIC) - _MAGIC


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _out_of_range(t):
    return 0 if (t >= _NI_LO and t <= _NI_HI) else 1


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _requantize_group(x, o, n, add, d, lo, hi, offset, L, fbuf, ibuf):
    """``L[o+i] = MAX(lo, MIN(hi, nearest_int((x[o+i] + add)/d))) + offset`` for i < n: the final
    rounding of every K-quant. The in-range form first (it vectorises); a group with any argument
    outside it is redone with the exact nearest_int. (``add`` is 0 where C has a bare ``x/d``:
    that turns a -0.0 into +0.0, whose quotient rounds to the same level.)"""
    lo_f = _F32(lo)
    hi_f = _F32(hi)
    bad = 0
    for i in range(n):
        t = (x[o + i] + add) / d
        bad += _out_of_range(t)
        r = _round_in_range(t)
        r = lo_f if r < lo_f else r
        r = hi_f if r > hi_f else r
        L[o + i] = np.int32(r) + offset
    if bad:
        for i in range(n):
            L[o + i] = max(lo, min(hi, _nearest_int((x[o + i] + add) / d, fbuf, ibuf))) + offset


@_njit
def qkx2_search(xg, nmax, rmin, rdelta, nstep, mad, av_weights, scales, the_mins, L):
    """``qkx2_search_exact`` for every group (row) of ``xg`` [G, n], LANES groups at a time."""
    G, n = xg.shape
    B = LANES
    X = np.empty((n, B), np.float32)
    W = np.empty((n, B), np.float32)
    T = np.empty((n, B), np.float32)
    mn = np.empty(B, np.float32)
    mx = np.empty(B, np.float32)
    sw = np.empty(B, np.float32)
    sx = np.empty(B, np.float32)
    isc = np.empty(B, np.float32)
    scale = np.empty(B, np.float32)
    best = np.empty(B, np.float32)
    b_isc = np.empty(B, np.float32)
    b_mn = np.empty(B, np.float32)
    sl = np.empty(B, np.float32)
    sl2 = np.empty(B, np.float32)
    sxl = np.empty(B, np.float32)
    ts = np.empty(B, np.float32)
    tm = np.empty(B, np.float32)
    dd = np.empty(B, np.float32)
    cur = np.empty(B, np.float32)
    flat = np.empty(B, np.bool_)
    nmax_f = _F32(nmax)
    n_f = _F32(n)
    for g0 in range(0, G, B):
        if G - g0 < B:  # a partial tile: C's loop, group by group
            qkx2_search_exact(xg, nmax, rmin, rdelta, nstep, mad, av_weights, scales, the_mins, L, g0, G)
            break
        for b in range(B):
            for i in range(n):
                X[i, b] = xg[g0 + b, i]
        if av_weights:  # weights[l] = av_x + fabsf(x[l]), av_x = sqrtf(sum_x2/n)
            for b in range(B):
                sl[b] = _ZERO
            for i in range(n):
                for b in range(B):
                    sl[b] += X[i, b] * X[i, b]
            for b in range(B):
                sl[b] = np.sqrt(sl[b] / n_f)
            for i in range(n):
                for b in range(B):
                    W[i, b] = sl[b] + abs(X[i, b])
        else:
            for i in range(n):
                for b in range(B):
                    W[i, b] = abs(X[i, b])
        for b in range(B):
            mn[b] = X[0, b]
            mx[b] = X[0, b]
            sw[b] = W[0, b]
            sx[b] = W[0, b] * X[0, b]
        for i in range(1, n):
            for b in range(B):
                xi = X[i, b]
                mn[b] = xi if xi < mn[b] else mn[b]
                mx[b] = xi if xi > mx[b] else mx[b]
                sw[b] += W[i, b]
                sx[b] += W[i, b] * xi
        for b in range(B):
            mn[b] = _ZERO if mn[b] > _ZERO else mn[b]
            flat[b] = mx[b] == mn[b]
            # flat groups return early in C; iscale 0 keeps their lanes harmless (levels 0, D = 0)
            isc[b] = _ZERO if flat[b] else nmax_f / (mx[b] - mn[b])
            scale[b] = _ONE / isc[b]
            best[b] = _ZERO
            b_isc[b] = isc[b]
            b_mn[b] = mn[b]
        bad = 0
        for i in range(n):
            for b in range(B):
                t = isc[b] * (X[i, b] - mn[b])
                bad += _out_of_range(t)
                r = _round_in_range(t)
                r = _ZERO if r < _ZERO else r
                r = nmax_f if r > nmax_f else r
                diff = scale[b] * r + mn[b] - X[i, b]
                best[b] += W[i, b] * (abs(diff) if mad else diff * diff)
        for step in range(nstep + 1):
            c = rmin + rdelta * _F32(step) + nmax_f
            for b in range(B):
                isc[b] = _ZERO if flat[b] else c / (mx[b] - mn[b])
                sl[b] = _ZERO
                sl2[b] = _ZERO
                sxl[b] = _ZERO
            for i in range(n):
                for b in range(B):
                    t = isc[b] * (X[i, b] - mn[b])
                    bad += _out_of_range(t)
                    r = _round_in_range(t)
                    r = _ZERO if r < _ZERO else r
                    r = nmax_f if r > nmax_f else r
                    T[i, b] = r
                    wl = W[i, b] * r
                    sl[b] += wl
                    sl2[b] += wl * r
                    sxl[b] += wl * X[i, b]
            for b in range(B):
                D = sw[b] * sl2[b] - sl[b] * sl[b]
                dd[b] = D
                s_ = (sw[b] * sxl[b] - sx[b] * sl[b]) / D
                m_ = (sl2[b] * sx[b] - sl[b] * sxl[b]) / D
                pos = m_ > _ZERO
                ts[b] = sxl[b] / sl2[b] if pos else s_
                tm[b] = _ZERO if pos else m_
                cur[b] = _ZERO
            for i in range(n):
                for b in range(B):
                    diff = ts[b] * T[i, b] + tm[b] - X[i, b]
                    cur[b] += W[i, b] * (abs(diff) if mad else diff * diff)
            for b in range(B):
                take = dd[b] > _ZERO and cur[b] < best[b]
                best[b] = cur[b] if take else best[b]
                scale[b] = ts[b] if take else scale[b]
                b_isc[b] = isc[b] if take else b_isc[b]
                b_mn[b] = mn[b] if take else b_mn[b]
                mn[b] = tm[b] if take else mn[b]
        if bad:
            qkx2_search_exact(xg, nmax, rmin, rdelta, nstep, mad, av_weights, scales, the_mins, L, g0, g0 + B)
            continue
        for b in range(B):
            g = g0 + b
            scales[g] = _ZERO if flat[b] else scale[b]
            the_mins[g] = -mn[b]
            # the accepted step's levels, recomputed from the iscale and min that made them
            for i in range(n):
                r = _round_in_range(b_isc[b] * (X[i, b] - b_mn[b]))
                r = _ZERO if r < _ZERO else r
                r = nmax_f if r > nmax_f else r
                L[g, i] = 0 if flat[b] else np.int32(r)


@_njit
def qx_search(xg, scales, L):
    """``qx_search_exact`` for every group (row) of ``xg`` [G, 16], LANES groups at a time."""
    G = xg.shape[0]
    B = LANES
    X = np.empty((16, B), np.float32)
    W = np.empty((16, B), np.float32)
    WX = np.empty((16, B), np.float32)
    amax = np.empty(B, np.float32)
    mx = np.empty(B, np.float32)
    isc = np.empty(B, np.float32)
    b_isc = np.empty(B, np.float32)
    scale = np.empty(B, np.float32)
    best = np.empty(B, np.float32)
    slx = np.empty(B, np.float32)
    sl2 = np.empty(B, np.float32)
    zero = np.empty(B, np.bool_)
    lo = _F32(-32.0)
    hi = _F32(31.0)
    for g0 in range(0, G, B):
        n = min(B, G - g0)
        if n < B:
            qx_search_exact(xg, scales, L, g0, G)
            break
        for b in range(B):
            for i in range(16):
                X[i, b] = xg[g0 + b, i]
        for b in range(B):
            amax[b] = _ZERO
            mx[b] = _ZERO
        for i in range(16):
            for b in range(B):
                xi = X[i, b]
                ax = abs(xi)
                gt = ax > amax[b]
                amax[b] = ax if gt else amax[b]
                mx[b] = xi if gt else mx[b]
                W[i, b] = xi * xi
                WX[i, b] = W[i, b] * xi
        for b in range(B):
            zero[b] = amax[b] < _GROUP_MAX_EPS
            isc[b] = _ZERO if zero[b] else _NEG_THIRTY_TWO / mx[b]
            slx[b] = _ZERO
            sl2[b] = _ZERO
        bad = 0
        for i in range(16):
            for b in range(B):
                t = isc[b] * X[i, b]
                bad += _out_of_range(t)
                r = _round_in_range(t)
                r = lo if r < lo else r
                r = hi if r > hi else r
                slx[b] += WX[i, b] * r
                sl2[b] += W[i, b] * r * r
        for b in range(B):
            scale[b] = slx[b] / sl2[b] if sl2[b] != _ZERO else _ZERO
            best[b] = scale[b] * slx[b]
            b_isc[b] = isc[b]
        for step in range(-9, 10):
            if step == 0:
                continue
            c = -(_THIRTY_TWO + _TENTH * _F32(step))
            for b in range(B):
                isc[b] = _ZERO if zero[b] else c / mx[b]
                slx[b] = _ZERO
                sl2[b] = _ZERO
            for i in range(16):
                for b in range(B):
                    t = isc[b] * X[i, b]
                    bad += _out_of_range(t)
                    r = _round_in_range(t)
                    r = lo if r < lo else r
                    r = hi if r > hi else r
                    slx[b] += WX[i, b] * r
                    sl2[b] += W[i, b] * r * r
            for b in range(B):
                take = sl2[b] > _ZERO and slx[b] * slx[b] > best[b] * sl2[b]
                s_ = slx[b] / sl2[b]
                scale[b] = s_ if take else scale[b]
                best[b] = s_ * slx[b] if take else best[b]
                b_isc[b] = isc[b] if take else b_isc[b]
        if bad:
            qx_search_exact(xg, scales, L, g0, g0 + B)
            continue
        for b in range(B):
            g = g0 + b
            scales[g] = _ZERO if zero[b] else scale[b]
            for i in range(16):
                r = _round_in_range(b_isc[b] * X[i, b])
                r = lo if r < lo else r
                r = hi if r > hi else r
                L[g, i] = 0 if zero[b] else np.uint8(np.int32(r) + 32)


@_njit
def q3_search_exact(xg, scales, L, g_start, g_end):
    """``make_q3_quants(16, 4, x, L, true)`` (Q3_K's) for the groups (rows) g_start..g_end-1 of
    ``xg`` [G, 16], one after the other as in C. Writes scales float32 [G] and L [G, 16] (l + 4;
    0 for an all-zero group)."""
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    li = np.empty(16, np.int64)
    neg_four = _F32(-4.0)
    for g in range(g_start, g_end):
        x = xg[g]
        amax = _ZERO
        mx = _ZERO
        for i in range(16):
            ax = abs(x[i])
            if ax > amax:
                amax = ax
                mx = x[i]
        if amax < _GROUP_MAX_EPS:
            for i in range(16):
                L[g, i] = 0
            scales[g] = _ZERO
            continue
        iscale = neg_four / mx
        sumlx = _ZERO
        suml2 = _ZERO
        for i in range(16):
            q = max(-4, min(3, _nearest_int(iscale * x[i], fbuf, ibuf)))
            li[i] = q
            w = x[i] * x[i]
            sumlx += w * x[i] * _F32(q)
            suml2 += w * _F32(q) * _F32(q)
        for _ in range(5):
            n_changed = 0
            for i in range(16):
                w = x[i] * x[i]
                slx = sumlx - w * x[i] * _F32(li[i])
                if slx > _ZERO:
                    sl2 = suml2 - w * _F32(li[i]) * _F32(li[i])
                    new_l = max(-4, min(3, _nearest_int(x[i] * sl2 / slx, fbuf, ibuf)))
                    if new_l != li[i]:
                        slx += w * x[i] * _F32(new_l)
                        sl2 += w * _F32(new_l) * _F32(new_l)
                        if sl2 > _ZERO and slx * slx * suml2 > sumlx * sumlx * sl2:
                            li[i] = new_l
                            sumlx = slx
                            suml2 = sl2
                            n_changed += 1
            if n_changed == 0:
                break
        for i in range(16):
            L[g, i] = li[i] + 4
        scales[g] = sumlx / suml2 if suml2 > _ZERO else _ZERO


# Q3_K's sweeps. C sweeps each group until a sweep changes nothing (at most five); most groups
# stop after one (80% on the bench drafter, 1.26 sweeps on average), but a lane tile that sweeps
# until its last lane settles ran 3.6 on average. So lanes are compacted between sweeps: a tile
# of groups sweeps once, the settled ones are written out and the others move to the queue of
# the next sweep, which runs when it holds a full tile (or at the end). Each queue receives at
# most one tile per tile of input, so two tiles of room is enough.

Q3_SWEEPS = 5
_inline = numba.njit(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False, inline="always")


@_njit
def _q3_sweep(X, W, WX, LF, sumlx, suml2, changed, bad, n):
    """One of make_q3_quants' sweeps for lanes 0..n-1: levels LF and sums updated in place,
    ``changed[b]`` the lane's changes, ``bad[b]`` its roundings outside nearest_int's fast range.
    The counters are float32 and every update a select: int counters kept LLVM from vectorising."""
    lo = _F32(-4.0)
    hi = _F32(3.0)
    one = _ONE
    for b in range(n):
        changed[b] = _ZERO
    for i in range(16):
        for b in range(n):
            li = LF[i, b]
            w = W[i, b]
            wx = WX[i, b]
            s1 = sumlx[b]
            s2 = suml2[b]
            slx = s1 - wx * li
            sl2 = s2 - w * li * li
            t = X[i, b] * sl2 / slx
            live = slx > _ZERO
            bad[b] += one if (live and not (t >= _NI_LO and t <= _NI_HI)) else _ZERO
            r = _round_in_range(t)
            r = lo if r < lo else r
            r = hi if r > hi else r
            slx2 = slx + wx * r
            sl22 = sl2 + w * r * r
            take = live and r != li and sl22 > _ZERO and slx2 * slx2 * s2 > s1 * s1 * sl22
            LF[i, b] = r if take else li
            sumlx[b] = slx2 if take else s1
            suml2[b] = sl22 if take else s2
            changed[b] += one if take else _ZERO


@_inline
def _q3_move(QX, QW, QWX, QLF, Qsx, Qs2, Qg, k, b, j, c):
    """Lane b of queue k -> lane c of queue j."""
    for i in range(16):
        QX[j, i, c] = QX[k, i, b]
        QW[j, i, c] = QW[k, i, b]
        QWX[j, i, c] = QWX[k, i, b]
        QLF[j, i, c] = QLF[k, i, b]
    Qsx[j, c] = Qsx[k, b]
    Qs2[j, c] = Qs2[k, b]
    Qg[j, c] = Qg[k, b]


@_njit
def q3_search(xg, scales, L):
    """``q3_search_exact`` for every group (row) of ``xg`` [G, 16], LANES groups per sweep.

    A group with any rounding outside nearest_int's fast range (only non-finite or absurdly
    spread input) is redone by the exact kernel, so the result is C's either way."""
    G = xg.shape[0]
    B = LANES
    S = Q3_SWEEPS
    # queue k: groups that have swept k times and changed in the last sweep (queue 0: new groups)
    QX = np.empty((S, 16, 2 * B), np.float32)
    QW = np.empty((S, 16, 2 * B), np.float32)  # x*x
    QWX = np.empty((S, 16, 2 * B), np.float32)  # x*x*x
    QLF = np.empty((S, 16, 2 * B), np.float32)  # levels -4..3
    Qsx = np.empty((S, 2 * B), np.float32)  # sumlx
    Qs2 = np.empty((S, 2 * B), np.float32)  # suml2
    Qg = np.empty((S, 2 * B), np.int64)  # the group
    count = np.zeros(S, np.int64)
    changed = np.empty(B, np.float32)
    bad = np.empty(B, np.float32)
    amax = np.empty(B, np.float32)
    mx = np.empty(B, np.float32)
    isc = np.empty(B, np.float32)
    lo = _F32(-4.0)
    hi = _F32(3.0)
    X, W, WX, LF, sx, s2 = QX[0], QW[0], QWX[0], QLF[0], Qsx[0], Qs2[0]
    for g0 in range(0, G + B, B):  # one pass beyond the input empties the queues
        n = min(B, G - g0) if g0 < G else 0
        for b in range(n):
            for i in range(16):
                X[i, b] = xg[g0 + b, i]
        for b in range(n):
            amax[b] = _ZERO
            mx[b] = _ZERO
            bad[b] = _ZERO
        for i in range(16):
            for b in range(n):
                xi = X[i, b]
                ax = abs(xi)
                gt = ax > amax[b]
                amax[b] = ax if gt else amax[b]
                mx[b] = xi if gt else mx[b]
                W[i, b] = xi * xi
                WX[i, b] = W[i, b] * xi
        for b in range(n):
            isc[b] = _ZERO if amax[b] < _GROUP_MAX_EPS else lo / mx[b]
            sx[b] = _ZERO
            s2[b] = _ZERO
        for i in range(16):
            for b in range(n):
                t = isc[b] * X[i, b]
                bad[b] += _ZERO if (t >= _NI_LO and t <= _NI_HI) else _ONE
                r = _round_in_range(t)
                r = lo if r < lo else r
                r = hi if r > hi else r
                LF[i, b] = r
                sx[b] += WX[i, b] * r
                s2[b] += W[i, b] * r * r
        m = 0  # queue 0 keeps the groups that sweep
        for b in range(n):
            g = g0 + b
            if amax[b] < _GROUP_MAX_EPS:  # C returns before any sweep: scale 0, levels 0
                scales[g] = _ZERO
                for i in range(16):
                    L[g, i] = 0
            elif bad[b] != _ZERO:
                q3_search_exact(xg, scales, L, g, g + 1)
            else:
                if m != b:
                    _q3_move(QX, QW, QWX, QLF, Qsx, Qs2, Qg, 0, b, 0, m)
                Qg[0, m] = g
                m += 1
        count[0] = m
        for k in range(S):
            # queue 0 sweeps every tile (the next tile overwrites it); the others when full
            while count[k] >= B or ((n == 0 or k == 0) and count[k] > 0):
                m = min(B, count[k])
                for b in range(m):
                    bad[b] = _ZERO
                _q3_sweep(QX[k], QW[k], QWX[k], QLF[k], Qsx[k], Qs2[k], changed, bad, m)
                for b in range(m):
                    g = Qg[k, b]
                    if bad[b] != _ZERO:
                        q3_search_exact(xg, scales, L, g, g + 1)
                    elif changed[b] == _ZERO or k + 1 == S:  # settled, or swept five times
                        sl2 = Qs2[k, b]
                        scales[g] = Qsx[k, b] / sl2 if sl2 > _ZERO else _ZERO
                        for i in range(16):
                            L[g, i] = np.int32(QLF[k, i, b]) + 4
                    else:
                        _q3_move(QX, QW, QWX, QLF, Qsx, Qs2, Qg, k, b, k + 1, count[k + 1])
                        count[k + 1] += 1
                rest = count[k] - m
                for c in range(rest):
                    _q3_move(QX, QW, QWX, QLF, Qsx, Qs2, Qg, k, m + c, k, c)
                count[k] = rest


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _pack_2bit_block(L, o, qs):
    """qs[32h + l] = L[o+128h+l] | L[o+128h+32+l] << 2 | ... << 4 | ... << 6 (Q2_K / Q3_K)."""
    for h in range(2):
        base = o + 128 * h
        for j in range(32):
            qs[32 * h + j] = (L[base + j] | (L[base + 32 + j] << 2) | (L[base + 64 + j] << 4) | (L[base + 96 + j] << 6)) & 0xFF


@_njit
def q2_finish(x, d, dm, L, out):
    """Q2_K after the scales: levels ``MAX(0, MIN(3, nearest_int((x + dm)/d)))`` per 16-value group
    (d == 0 keeps the search's, C's ``if (!d) continue;``), packed into ``out[:, 16:80]``.

    x float32 [nb*256]; d, dm float32 [nb*16]; L uint8 [nb*256], overwritten; out uint8 [nb, 84].
    """
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    for g in range(d.size):
        dg = d[g]
        if dg == _ZERO:
            continue
        _requantize_group(x, g * 16, 16, dm[g], dg, 0, 3, 0, L, fbuf, ibuf)
    for blk in range(out.shape[0]):
        _pack_2bit_block(L, blk * 256, out[blk, 16:80])


@_njit
def q3_finish(x, d, L, out):
    """Q3_K after the scales: levels ``MAX(-4, MIN(3, nearest_int(x/d))) + 4`` per 16-value group
    (d == 0 keeps the search's), then hmask (bit j/32 of byte j%32 = third bit of value j) and
    the 2 low bits, into ``out[:, 0:96]``.

    x float32 [nb*256]; d float32 [nb*16]; L uint8 [nb*256], overwritten; out uint8 [nb, 110].
    """
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    for g in range(d.size):
        dg = d[g]
        if dg == _ZERO:
            continue
        _requantize_group(x, g * 16, 16, _ZERO, dg, -4, 3, 4, L, fbuf, ibuf)
    for blk in range(out.shape[0]):
        o = blk * 256
        for m in range(32):
            hm = 0
            for bit in range(8):
                j = o + 32 * bit + m
                high = L[j] > 3
                hm |= (1 << bit) if high else 0
                L[j] -= 4 if high else 0
            out[blk, m] = hm
        _pack_2bit_block(L, o, out[blk, 32:96])


# ---------------------------------------------------------------------------------------------
# Half-precision conversions as intrinsics written in 32-bit LLVM IR. numba types ``int32 & int32``
# and friends as int64, which halves a loop's vector lanes (or keeps it scalar on AVX2, which has no
# float <-> int64 conversion), and LLVM's own ``half`` type needs F16C or a compiler-rt routine numba
# may not link. On i32 these are exact, portable, and a loop of them vectorises 8 wide on AVX2.
# (They live in this file on purpose: numba's on-disk cache is keyed on the file of the function
# it compiled, so a kernel would keep running a stale copy of a helper edited in another file.)
# ---------------------------------------------------------------------------------------------

_IR_I32 = ir.IntType(32)
_IR_F32 = ir.FloatType()


def _k(v: int) -> ir.Constant:
    return ir.Constant(_IR_I32, v)


@intrinsic
def f16_to_f32(typingctx, bits):
    """The float32 of float16 bits (uint16), exactly as numpy's cast (NaN payloads kept, signalling
    or not). A normal number, inf or NaN has its exponent rebiased (127 - 15; inf/NaN to all ones)
    and its mantissa moved into place; a subnormal or zero is m * 2**-24 (exact in float32); the
    sign goes on last. Selects only."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
        return None

    def codegen(context, builder, signature, args):
        h = builder.zext(args[0], _IR_I32)
        exponent = builder.and_(h, _k(0x7C00))
        u = builder.add(builder.shl(builder.and_(h, _k(0x7FFF)), _k(13)), _k(112 << 23))
        u = builder.select(builder.icmp_unsigned("==", exponent, _k(0x7C00)), builder.add(u, _k(112 << 23)), u)
        small = builder.fmul(builder.sitofp(builder.and_(h, _k(0x3FF)), _IR_F32), ir.Constant(_IR_F32, 2.0 ** -24))
        u = builder.select(builder.icmp_unsigned("==", exponent, _k(0)), builder.bitcast(small, _IR_I32), u)
        return builder.bitcast(builder.or_(u, builder.shl(builder.and_(h, _k(0x8000)), _k(16))), _IR_F32)

    return types.float32(bits), codegen


@intrinsic
def f32_to_f16_bits(typingctx, value):
    """``GGML_FP32_TO_FP16`` of a float32, as an int32 in 0..0xFFFF: round to nearest even, overflow
    to inf, every NaN to ``sign | 0x7E00`` (ggml's software conversion; numpy's cast equals it but
    for NaN). Normal halves round by adding 0xFFF plus the lowest kept bit, then shifting;
    subnormal ones by one float add of 0.5, whose ulp is the half's 2**-24: exact RNE too."""
    if not isinstance(value, types.Float) or value.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        x = builder.bitcast(args[0], _IR_I32)
        a = builder.and_(x, _k(0x7FFFFFFF))
        sign = builder.and_(builder.lshr(x, _k(16)), _k(0x8000))
        huge = builder.select(builder.icmp_unsigned(">", a, _k(0x7F800000)), _k(0x7E00), _k(0x7C00))
        tiny = builder.sub(builder.bitcast(builder.fadd(builder.bitcast(a, _IR_F32), ir.Constant(_IR_F32, 0.5)), _IR_I32), _k(0x3F000000))
        odd = builder.and_(builder.lshr(a, _k(13)), _k(1))
        normal = builder.lshr(builder.add(builder.add(a, _k(0xFFF - 0x38000000)), odd), _k(13))
        h = builder.select(builder.icmp_unsigned("<", a, _k(0x38800000)), tiny, normal)
        h = builder.select(builder.icmp_unsigned(">=", a, _k(0x47800000)), huge, h)
        return builder.or_(h, sign)

    return types.int32(value), codegen


@numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
def widen_f16(words, out):
    """float16 words (uint16) -> float32 ``out``, the values (and bits) numpy's cast gives, in one
    vectorised pass (``f16_to_f32``): several times faster than numpy's cast, which converts one
    value at a time."""
    for i in range(words.shape[0]):
        out[i] = f16_to_f32(words[i])


# ---------------------------------------------------------------------------------------------
# legacy 32-value blocks: Q4_0, Q4_1, Q5_0, Q5_1 (quantize_row_q{4,5}_{0,1}_ref)
# ---------------------------------------------------------------------------------------------

LEGACY_Q4_0, LEGACY_Q4_1, LEGACY_Q5_0, LEGACY_Q5_1 = 0, 1, 2, 3
_FLT_MAX = _F32(3.4028234663852886e38)
_INT32_LO = _F32(-2147483648.0)
_INT32_HI = _F32(2147483648.0)
_SIXTEEN = _F32(16.0)
_BYTE_TOP = _F32(128.0)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _c_float_to_byte(t):
    """C's ``(int8_t)t`` / ``(uint8_t)t`` as x86 compiles it: truncate to int32 (cvttss2si: out of
    range and NaN give INT32_MIN), keep the low byte. Returned as 0..255."""
    ok = t >= _INT32_LO and t < _INT32_HI
    return np.int64(np.int32(t) & np.int32(0xFF)) if ok else 0  # 0: INT32_MIN's low byte


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _legacy_quant(x, lo, idb, bias, top):
    """``MIN(top, (int8_t)((x - lo)*id + bias))`` stored as uint8_t, as 0..255: C's conversion for
    any value (the path of lanes the float rounding pass leaves)."""
    byte = _c_float_to_byte((x - lo) * idb + bias)
    signed = byte - 256 if byte >= 128 else byte
    return min(top, signed) & 0xFF


@_njit
def _legacy_scratch():
    """The work arrays of one call (per call, not per tile: an allocation per tile cost a fifth)."""
    B = LANES
    return (np.empty((32, B), np.float32), np.empty(B, np.float32), np.empty(B, np.float32), np.empty(B, np.float32),
            np.empty(B, np.float32), np.empty((16, B), np.float32), np.empty(B, np.float32), np.empty(B, np.float32),
            np.empty(B, np.float32))


@_njit
def legacy_quantize(xb, kind, out):
    """quantize_row_q4_0/q4_1/q5_0/q5_1_ref over ``xb`` float32 [nb, 32] (``kind`` LEGACY_*): the
    blocks' bytes as ggml lays them out (fp16 d, fp16 m, qh, qs) into ``out`` uint8 [nb, size]."""
    X, lo, hi, idb, dd, QF, HL, HH, bad = _legacy_scratch()
    B = LANES
    for g0 in range(0, xb.shape[0], B):
        n = min(B, xb.shape[0] - g0)
        for b in range(n):
            for j in range(32):
                X[j, b] = xb[g0 + b, j]
        _legacy_tile(X, n, g0, kind, out, lo, hi, idb, dd, QF, HL, HH, bad)


@_njit
def legacy_quantize_f16(words, kind, out):
    """``legacy_quantize`` straight from F16 words (uint16 [nb, 32]): each block's 32 halves widened
    in one contiguous vectorised pass (exactly, ``f16_to_f32``), then moved into its lane. Widening
    per tile, in cache, saves a whole-tensor float32 copy and the pass that makes it."""
    X, lo, hi, idb, dd, QF, HL, HH, bad = _legacy_scratch()
    row = np.empty(32, np.float32)
    B = LANES
    for g0 in range(0, words.shape[0], B):
        n = min(B, words.shape[0] - g0)
        for b in range(n):
            for j in range(32):
                row[j] = f16_to_f32(words[g0 + b, j])
            for j in range(32):
                X[j, b] = row[j]
        _legacy_tile(X, n, g0, kind, out, lo, hi, idb, dd, QF, HL, HH, bad)


@_njit
def _legacy_tile(X, n, g0, kind, out, lo, hi, idb, dd, QF, HL, HH, bad):
    """One tile of ``n`` blocks, block b in lane b of ``X`` [32, LANES]: C's scans become per-lane
    selects, and each pass is a loop over lanes that LLVM vectorises. Every running value is read
    into a local before its select: ``a[b] = v if c else a[b]`` became a masked store, slow on AMD."""
    symmetric = kind == LEGACY_Q4_0 or kind == LEGACY_Q5_0
    five = kind == LEGACY_Q5_0 or kind == LEGACY_Q5_1
    if kind == LEGACY_Q4_0:
        div, bias, top = _F32(-8.0), _F32(8.5), 15
    elif kind == LEGACY_Q5_0:
        div, bias, top = _F32(-16.0), _F32(16.5), 31
    elif kind == LEGACY_Q4_1:
        div, bias, top = _F32(15.0), _F32(0.5), 15
    else:
        # Q5_1: (uint8_t)(x0 + 0.5f), no MIN in C; MIN(127, signed byte) & 0xFF is the byte itself
        div, bias, top = _F32(31.0), _F32(0.5), 127
    if symmetric:  # `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` from 0: lo = amax, hi = max
        for b in range(n):
            lo[b] = _ZERO
            hi[b] = _ZERO
        for j in range(32):
            for b in range(n):
                v = X[j, b]
                # fabsf as a select: numba's abs() here kept the loop scalar (5x slower); -0.0 and NaN
                # staying as they are changes nothing, neither passes `lo < a`
                a = -v if v < _ZERO else v
                amax = lo[b]
                vmax = hi[b]
                gt = amax < a
                lo[b] = a if gt else amax
                hi[b] = v if gt else vmax
        for b in range(n):
            db = hi[b] / div
            dd[b] = db
            idb[b] = _ONE / db if db != _ZERO else _ZERO
            lo[b] = _ZERO  # x - (+0.0) is x for every float (-0.0 and NaN included): one rounding pass for all kinds
    else:  # min = FLT_MAX, max = -FLT_MAX; if (v < min) min = v; if (v > max) max = v;
        for b in range(n):
            lo[b] = _FLT_MAX
            hi[b] = -_FLT_MAX
        for j in range(32):
            for b in range(n):
                v = X[j, b]
                vmin = lo[b]
                vmax = hi[b]
                lo[b] = v if v < vmin else vmin
                hi[b] = v if v > vmax else vmax
        for b in range(n):
            db = (hi[b] - lo[b]) / div
            dd[b] = db
            idb[b] = _ONE / db if db != _ZERO else _ZERO
    # The rounding pass in float32: where t = (x - lo)*id + bias lies in [0, 128), C's (int8_t)t is
    # trunc(t) and MIN(top, .) the smaller of two floats; quants j and j + 16 share a byte as C pairs
    # them, Q5's fifth bits are summed as powers of two (exact: 16 per half of qh). A lane with any
    # t outside (only non-finite input, or a subnormal scale) is redone with C's conversion below.
    top_f = _F32(top)
    for b in range(n):
        bad[b] = _ZERO
        HL[b] = _ZERO
        HH[b] = _ZERO
    bit = _ONE
    for j in range(16):
        for b in range(n):
            t0 = (X[j, b] - lo[b]) * idb[b] + bias
            t1 = (X[j + 16, b] - lo[b]) * idb[b] + bias
            ok = t0 >= _ZERO and t0 < _BYTE_TOP and t1 >= _ZERO and t1 < _BYTE_TOP
            bad[b] += _ZERO if ok else _ONE
            q0 = np.float32(np.int32(t0)) if ok else _ZERO
            q1 = np.float32(np.int32(t1)) if ok else _ZERO
            q0 = top_f if q0 > top_f else q0
            q1 = top_f if q1 > top_f else q1
            if five:
                h0 = _ONE if q0 >= _SIXTEEN else _ZERO
                h1 = _ONE if q1 >= _SIXTEEN else _ZERO
                QF[j, b] = (q0 - _SIXTEEN * h0) + _SIXTEEN * (q1 - _SIXTEEN * h1)
                HL[b] += h0 * bit
                HH[b] += h1 * bit
            else:
                QF[j, b] = q0 + _SIXTEEN * q1
        bit = bit * _F32(2.0)
    # the blocks' bytes: fp16 d, fp16 m (affine), qh (Q5, little-endian), qs
    qs_at = (2 if symmetric else 4) + (4 if five else 0)
    for b in range(n):
        row = out[g0 + b]
        h = f32_to_f16_bits(dd[b])
        row[0] = np.uint8(h & 0xFF)
        row[1] = np.uint8(h >> 8)
        if not symmetric:
            h = f32_to_f16_bits(lo[b])
            row[2] = np.uint8(h & 0xFF)
            row[3] = np.uint8(h >> 8)
        if bad[b] == _ZERO:
            for j in range(16):
                row[qs_at + j] = np.uint8(np.int32(QF[j, b]))
            qh = np.int64(HL[b]) | (np.int64(HH[b]) << 16)
        else:
            qh = 0
            for j in range(16):
                q0 = _legacy_quant(X[j, b], lo[b], idb[b], bias, top)
                q1 = _legacy_quant(X[j + 16, b], lo[b], idb[b], bias, top)
                if five:
                    row[qs_at + j] = np.uint8((q0 & 0x0F) | ((q1 & 0x0F) << 4))
                    qh |= ((q0 >> 4) & 1) << j | ((q1 >> 4) & 1) << (j + 16)
                else:  # qs[j] = xi0; qs[j] |= xi1 << 4: no mask on xi0
                    row[qs_at + j] = np.uint8((q0 | (q1 << 4)) & 0xFF)
        if five:
            o = qs_at - 4
            for i in range(4):
                row[o + i] = np.uint8((qh >> (8 * i)) & 0xFF)


@_njit
def f16_bits_of(values, out):
    """``GGML_FP32_TO_FP16`` of float32 ``values`` into uint16 ``out`` (see ``_ir.f32_to_f16_bits``)."""
    for i in range(values.shape[0]):
        out[i] = np.uint16(f32_to_f16_bits(values[i]))
