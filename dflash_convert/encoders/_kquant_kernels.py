"""numba ports of ggml's per-group K-quant searches, loop for loop (see ``jit`` for when they run).

Imports numba: only ``jit.kquant_kernels()`` imports it, lazily. float32 throughout, sums in index
order, no fastmath, as ggml-base is built. The imatrix paths are ggml's ``_impl`` up to the super-scales.
Specification: docs/quantizers.md, "K-quants".
"""

from __future__ import annotations

import numba
import numpy as np

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

# error_model numpy: a float division by zero gives inf/NaN as in C. Every helper a kernel calls
# lives in this file: numba's on-disk cache is keyed on the compiled function's file.
_njit = numba.njit(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _nearest_int(v, fbuf, ibuf):
    if v >= _NI_LO and v <= _NI_HI:
        return np.int64((v + _MAGIC) - _MAGIC)
    fbuf[0] = v + _MAGIC
    return np.int64((ibuf[0] & 0x7FFFFF) - 0x400000)


@_njit
def qkx2_search_exact(xg, nmax, rmin, rdelta, nstep, mad, av_weights, scales, the_mins, L, g_start, g_end):
    """``make_qkx2_quants`` for rows g_start..g_end-1 of ``xg`` [G, n] in C's order, any input (inf, NaN).

    Weights: Q4_K/Q5_K's ``av_x + |x|`` (av_x = sqrtf(sum x*x / n)) when ``av_weights``, else Q2_K's ``|x|``.
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
    """``make_qx_quants(16, 32, x, L, 1, NULL)`` (Q6_K's) for rows g_start..g_end-1 of ``xg`` [G, 16], in C's order, any input."""
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


# --- lane kernels: LANES groups at once, C's branches as selects; a tile with a rounding outside
# nearest_int's fast range is redone by the exact kernel

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
    """``make_q3_quants(16, 4, x, L, true)`` (Q3_K's) for rows g_start..g_end-1 of ``xg`` [G, 16], in C's order."""
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


# Q3_K's sweeps (C: until one changes nothing, at most five); settled lanes are compacted out between sweeps

Q3_SWEEPS = 5
_inline = numba.njit(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False, inline="always")


@_njit
def _q3_sweep(X, W, WX, LF, sumlx, suml2, changed, bad, n):
    """One of make_q3_quants' sweeps for lanes 0..n-1: levels LF and sums updated in place,
    ``changed[b]`` the lane's changes, ``bad[b]`` its roundings outside nearest_int's fast range."""
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
    """``q3_search_exact`` for every group (row) of ``xg`` [G, 16], LANES groups per sweep (see the lane kernels)."""
    G = xg.shape[0]
    B = LANES
    S = Q3_SWEEPS
    # queue k: groups that have swept k times and changed in the last sweep (queue 0: new groups)
    QX = np.empty((S, 16, 2 * B), np.float32)
    QW = np.empty((S, 16, 2 * B), np.float32)
    QWX = np.empty((S, 16, 2 * B), np.float32)
    QLF = np.empty((S, 16, 2 * B), np.float32)
    Qsx = np.empty((S, 2 * B), np.float32)
    Qs2 = np.empty((S, 2 * B), np.float32)
    Qg = np.empty((S, 2 * B), np.int64)
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
    (d == 0 keeps the search's, C's ``if (!d) continue;``), packed into ``out[:, 16:80]``."""
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
    the 2 low bits, into ``out[:, 0:96]``."""
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


# --- the importance-matrix paths (quantize_row_q{2..6}_K_impl): scalar, in C's order, exact nearest_int

_QKX3_RMIN = _F32(-0.9)
_QKX3_RDELTA = _F32(0.05)
_QKX3_NSTEP = 36
_QP_STEP = _F32(0.1)


@_njit
def _qkx3(x, o, n, w, nmax, L, laux, fbuf, ibuf):
    """``make_qkx3_quants(n, nmax, x+o, w, L+o, &the_min, Laux, -0.9f, 0.05f, 36, false)``: (scale, the_min)."""
    mn = x[o]
    mx = x[o]
    sum_w = w[0]
    sum_x = sum_w * x[o]
    for i in range(1, n):
        xi = x[o + i]
        if xi < mn:
            mn = xi
        if xi > mx:
            mx = xi
        sum_w += w[i]
        sum_x += w[i] * xi
    if mn > _ZERO:
        mn = _ZERO
    if mx <= mn:
        for i in range(n):
            L[o + i] = 0
        return _ZERO, -mn
    nmax_f = _F32(nmax)
    iscale = nmax_f / (mx - mn)
    scale = _ONE / iscale
    best = _ZERO
    for i in range(n):
        li = max(0, min(nmax, _nearest_int(iscale * (x[o + i] - mn), fbuf, ibuf)))
        L[o + i] = li
        diff = scale * _F32(li) + mn - x[o + i]
        best += w[i] * (diff * diff)
    for step in range(_QKX3_NSTEP + 1):
        iscale = (_QKX3_RMIN + _QKX3_RDELTA * _F32(step) + nmax_f) / (mx - mn)
        sum_l = _ZERO
        sum_l2 = _ZERO
        sum_xl = _ZERO
        for i in range(n):
            li = max(0, min(nmax, _nearest_int(iscale * (x[o + i] - mn), fbuf, ibuf)))
            laux[i] = li
            lf = _F32(li)
            wl = w[i] * lf
            sum_l += wl
            sum_l2 += wl * lf
            sum_xl += wl * x[o + i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > _ZERO:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > _ZERO:
                this_min = _ZERO
                this_scale = sum_xl / sum_l2
            mad = _ZERO
            for i in range(n):
                diff = this_scale * _F32(laux[i]) + this_min - x[o + i]
                mad += w[i] * (diff * diff)
            if mad < best:
                for i in range(n):
                    L[o + i] = laux[i]
                best = mad
                scale = this_scale
                mn = this_min
    return scale, -mn


@_njit
def _qp(x, n, nmax, w, L, fbuf, ibuf):
    """``make_qp_quants(n, nmax, x, L, w)``: the scale; L holds the uint8 values C stores (0..255)."""
    mx = _ZERO
    for i in range(n):
        mx = mx if mx > x[i] else x[i]
    if mx < _GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _ZERO
    nmax_f = _F32(nmax)
    iscale = nmax_f / mx
    for i in range(n):
        L[i] = _nearest_int(iscale * x[i], fbuf, ibuf) & 0xFF
    scale = _ONE / iscale
    best = _ZERO
    for i in range(n):
        diff = x[i] - scale * _F32(L[i])
        best += w[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_s = (_QP_STEP * _F32(step) + nmax_f) / mx
        scale_s = _ONE / iscale_s
        mse = _ZERO
        for i in range(n):
            li = min(nmax, _nearest_int(iscale_s * x[i], fbuf, ibuf))
            diff = x[i] - scale_s * _F32(li)
            mse += w[i] * diff * diff
        if mse < best:
            best = mse
            iscale = iscale_s
    sumlx = _ZERO
    suml2 = _ZERO
    for i in range(n):
        li = min(nmax, _nearest_int(iscale * x[i], fbuf, ibuf))
        L[i] = li & 0xFF
        lf = _F32(li)
        sumlx += w[i] * x[i] * lf
        suml2 += w[i] * lf * lf
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            lf = _F32(L[i])
            slx = sumlx - w[i] * x[i] * lf
            sl2 = suml2 - w[i] * lf * lf
            if slx > _ZERO and sl2 > _ZERO:
                new_l = min(nmax, _nearest_int(x[i] * sl2 / slx, fbuf, ibuf))
                if new_l != L[i]:
                    nf = _F32(new_l)
                    slx += w[i] * x[i] * nf
                    sl2 += w[i] * nf * nf
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > _ZERO else _ZERO


@_njit
def _qx_weighted(x, o, n, nmax, w, L, fbuf, ibuf):
    """``make_qx_quants(n, nmax, x+o, L+o, 1, w)``: the scale; L = level + nmax (0 for an all-zero group)."""
    amax = _ZERO
    mx = _ZERO
    for i in range(n):
        ax = abs(x[o + i])
        if ax > amax:
            amax = ax
            mx = x[o + i]
    if amax < _GROUP_MAX_EPS:
        for i in range(n):
            L[o + i] = 0
        return _ZERO
    nmax_f = _F32(nmax)
    iscale = _F32(-nmax) / mx
    sumlx = _ZERO
    suml2 = _ZERO
    for i in range(n):
        li = max(-nmax, min(nmax - 1, _nearest_int(iscale * x[o + i], fbuf, ibuf)))
        L[o + i] = li + nmax
        lf = _F32(li)
        sumlx += w[i] * x[o + i] * lf
        suml2 += w[i] * lf * lf
    scale = sumlx / suml2 if suml2 != _ZERO else _ZERO
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(nmax_f + _TENTH * _F32(step)) / mx
        sumlx = _ZERO
        suml2 = _ZERO
        for i in range(n):
            li = max(-nmax, min(nmax - 1, _nearest_int(iscale * x[o + i], fbuf, ibuf)))
            lf = _F32(li)
            sumlx += w[i] * x[o + i] * lf
            suml2 += w[i] * lf * lf
        if suml2 > _ZERO and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[o + i] = max(-nmax, min(nmax - 1, _nearest_int(iscale * x[o + i], fbuf, ibuf))) + nmax
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@_njit
def _sigma2(x, num):
    """``num*sum_x2/QK_K`` with sum_x2 = 0 + x0*x0 + ... over one super-block (num 1 or 2)."""
    s = _ZERO
    for i in range(256):
        s += x[i] * x[i]
    return num * s / _F32(256.0)


@_njit
def _qkx3_lanes(xg, wg, nmax, scales, mins, L):
    """``_qkx3`` for every group (row) of ``xg`` [G, n] with weights ``wg``, LANES groups at a time (see the lane kernels)."""
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    G, n = xg.shape
    B = LANES
    X = np.empty((n, B), np.float32)
    W = np.empty((n, B), np.float32)
    T = np.empty((n, B), np.float32)
    laux = np.empty(n, np.int64)
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
    for g0 in range(0, G, B):
        if G - g0 < B:  # a partial tile: C's loop, group by group
            for g in range(g0, G):
                scales[g], mins[g] = _qkx3(xg[g], 0, n, wg[g], nmax, L[g], laux, fbuf, ibuf)
            break
        for b in range(B):
            for i in range(n):
                X[i, b] = xg[g0 + b, i]
                W[i, b] = wg[g0 + b, i]
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
            flat[b] = mx[b] <= mn[b]
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
                best[b] += W[i, b] * (diff * diff)
        for step in range(_QKX3_NSTEP + 1):
            c = _QKX3_RMIN + _QKX3_RDELTA * _F32(step) + nmax_f
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
                    cur[b] += W[i, b] * (diff * diff)
            for b in range(B):
                take = dd[b] > _ZERO and cur[b] < best[b]
                best[b] = cur[b] if take else best[b]
                scale[b] = ts[b] if take else scale[b]
                b_isc[b] = isc[b] if take else b_isc[b]
                b_mn[b] = mn[b] if take else b_mn[b]
                mn[b] = tm[b] if take else mn[b]
        if bad:
            for g in range(g0, g0 + B):
                scales[g], mins[g] = _qkx3(xg[g], 0, n, wg[g], nmax, L[g], laux, fbuf, ibuf)
            continue
        for b in range(B):
            g = g0 + b
            scales[g] = _ZERO if flat[b] else scale[b]
            mins[g] = -mn[b]
            # the accepted step's levels, recomputed from the iscale and min that made them
            for i in range(n):
                r = _round_in_range(b_isc[b] * (X[i, b] - b_mn[b]))
                r = _ZERO if r < _ZERO else r
                r = nmax_f if r > nmax_f else r
                L[g, i] = 0 if flat[b] else np.int32(r)


@_njit
def _qx_lanes(xg, wg, nmax, scales, L):
    """``_qx_weighted`` for every group (row) of ``xg`` [G, n] with weights ``wg``, LANES groups at a time."""
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    G, n = xg.shape
    B = LANES
    X = np.empty((n, B), np.float32)
    W = np.empty((n, B), np.float32)
    WX = np.empty((n, B), np.float32)
    amax = np.empty(B, np.float32)
    mx = np.empty(B, np.float32)
    isc = np.empty(B, np.float32)
    b_isc = np.empty(B, np.float32)
    scale = np.empty(B, np.float32)
    best = np.empty(B, np.float32)
    slx = np.empty(B, np.float32)
    sl2 = np.empty(B, np.float32)
    zero = np.empty(B, np.bool_)
    nmax_f = _F32(nmax)
    lo = _F32(-nmax)
    hi = _F32(nmax - 1)
    for g0 in range(0, G, B):
        if G - g0 < B:
            for g in range(g0, G):
                scales[g] = _qx_weighted(xg[g], 0, n, nmax, wg[g], L[g], fbuf, ibuf)
            break
        for b in range(B):
            for i in range(n):
                X[i, b] = xg[g0 + b, i]
                W[i, b] = wg[g0 + b, i]
        for b in range(B):
            amax[b] = _ZERO
            mx[b] = _ZERO
        for i in range(n):
            for b in range(B):
                xi = X[i, b]
                ax = abs(xi)
                gt = ax > amax[b]
                amax[b] = ax if gt else amax[b]
                mx[b] = xi if gt else mx[b]
                WX[i, b] = W[i, b] * xi
        for b in range(B):
            zero[b] = amax[b] < _GROUP_MAX_EPS
            isc[b] = _ZERO if zero[b] else lo / mx[b]
            slx[b] = _ZERO
            sl2[b] = _ZERO
        bad = 0
        for i in range(n):
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
            c = -(nmax_f + _TENTH * _F32(step))
            for b in range(B):
                isc[b] = _ZERO if zero[b] else c / mx[b]
                slx[b] = _ZERO
                sl2[b] = _ZERO
            for i in range(n):
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
            for g in range(g0, g0 + B):
                scales[g] = _qx_weighted(xg[g], 0, n, nmax, wg[g], L[g], fbuf, ibuf)
            continue
        for b in range(B):
            g = g0 + b
            scales[g] = _ZERO if zero[b] else scale[b]
            for i in range(n):
                r = _round_in_range(b_isc[b] * X[i, b])
                r = lo if r < lo else r
                r = hi if r > hi else r
                L[g, i] = 0 if zero[b] else np.int32(r) + nmax


_CHUNK = 64  # super-blocks per weights scratch: a multiple of LANES groups for 16- and 32-value groups


@_njit
def _weights(xb, qw, s, e, num, W):
    """W[b - s] = qw * sqrtf(sigma2 + x*x) for super-blocks s..e-1, sigma2 = num*sum_x2/256 (num 0: W = qw)."""
    nbr = qw.shape[0]
    for b in range(s, e):
        x = xb[b]
        q = qw[b % nbr]
        w = W[b - s]
        if num == _ZERO:
            for i in range(256):
                w[i] = q[i]
            continue
        sigma2 = _sigma2(x, num)
        for i in range(256):
            w[i] = q[i] * np.sqrt(sigma2 + x[i] * x[i])


@_njit
def _group_sums(w, gsize, sw):
    """sw[j] = 0 + w[gsize*j] + ... in order, per group of one super-block's weights."""
    for j in range(256 // gsize):
        s = _ZERO
        for i in range(gsize):
            s += w[gsize * j + i]
        sw[j] = s


@_njit
def qkx3_imatrix(xb, qw, gsize, nmax, num, L, ls, lm, d_block, m_block):
    """Q2_K (gsize 16, nmax 3, num 1) / Q4_K, Q5_K (gsize 32, nmax 15 or 31, num 2) with weights, up to
    the super-scales: levels L [nb, 256], make_qp_quants' Ls / Lm and scales per super-block.
    ``qw`` [nbr, 256] is the importance of one row, super-block b using row ``b % nbr``."""
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    nb = xb.shape[0]
    ng = 256 // gsize
    nsc = 15 if gsize == 16 else 63
    W = np.empty((_CHUNK, 256), np.float32)
    scales = np.empty(_CHUNK * ng, np.float32)
    mins = np.empty(_CHUNK * ng, np.float32)
    sw = np.empty(ng, np.float32)
    lsb = np.empty(ng, np.int64)
    for s in range(0, nb, _CHUNK):
        e = min(nb, s + _CHUNK)
        m = e - s
        _weights(xb, qw, s, e, num, W)
        _qkx3_lanes(xb[s:e].reshape(m * ng, gsize), W[:m].reshape(m * ng, gsize), nmax, scales, mins,
                    L[s:e].reshape(m * ng, gsize))
        for b in range(m):
            _group_sums(W[b], gsize, sw)
            d_block[s + b] = _qp(scales[b * ng:(b + 1) * ng], ng, nsc, sw, lsb, fbuf, ibuf)
            for j in range(ng):
                ls[s + b, j] = lsb[j]
            m_block[s + b] = _qp(mins[b * ng:(b + 1) * ng], ng, nsc, sw, lsb, fbuf, ibuf)
            for j in range(ng):
                lm[s + b, j] = lsb[j]


@_njit
def q3_imatrix(xb, qw, L, ls, d_block):
    """Q3_K with weights up to the super-scale: levels L [nb, 256] (l + 4), Ls [nb, 16] (l + 32), d_block [nb]."""
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    nb = xb.shape[0]
    W = np.empty((_CHUNK, 256), np.float32)
    scales = np.empty(_CHUNK * 16, np.float32)
    sw = np.empty(16, np.float32)
    for s in range(0, nb, _CHUNK):
        e = min(nb, s + _CHUNK)
        m = e - s
        _weights(xb, qw, s, e, _F32(2.0), W)
        _qx_lanes(xb[s:e].reshape(m * 16, 16), W[:m].reshape(m * 16, 16), 4, scales, L[s:e].reshape(m * 16, 16))
        for b in range(m):
            _group_sums(W[b], 16, sw)
            d_block[s + b] = _qx_weighted(scales[b * 16:(b + 1) * 16], 0, 16, 32, sw, ls[s + b], fbuf, ibuf)


@_njit
def q6_imatrix(xb, qw, scales, L):
    """Q6_K's group search with the importance itself as weights: scales [nb, 16], levels L [nb, 256] (l + 32)."""
    nb = xb.shape[0]
    W = np.empty((_CHUNK, 256), np.float32)
    for s in range(0, nb, _CHUNK):
        e = min(nb, s + _CHUNK)
        m = e - s
        _weights(xb, qw, s, e, _ZERO, W)
        _qx_lanes(xb[s:e].reshape(m * 16, 16), W[:m].reshape(m * 16, 16), 32, scales[s:e].reshape(m * 16),
                  L[s:e].reshape(m * 16, 16))
