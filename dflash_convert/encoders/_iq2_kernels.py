"""ggml's IQ2_XXS / IQ2_XS / IQ2_S and IQ1_S / IQ1_M searches, loop for loop, in one source for both backends.

The kernels are plain Python over float32 numpy scalars, so they run as they are (the slow fallback:
numpy scalar arithmetic is IEEE float32, as C's) and compiled by numba (``_iq2_jit``, as fast as
ggml); helpers are ``register_jitable`` so both can call them. Every value is a named float32, sums
run in index order, no fastmath, C's ``nearest_int`` on the bits. Input must be finite (the caller
refuses the rest, ggml aborts). Specification: docs/quantizers.md, "IQ2 and IQ1".
"""

from __future__ import annotations

import numpy as np

try:  # numba compiles the helpers inline; without it they are ordinary functions
    from numba.extending import register_jitable as _jitable
except Exception:  # numba missing or refusing this numpy: the pure-Python path still runs
    def _jitable(f):
        return f

_F32 = np.float32
_ZERO = _F32(0.0)
_ONE = _F32(1.0)
_TWO = _F32(2.0)
_THREE = _F32(3.0)  # kMaxQ
_FOUR = _F32(4.0)  # make_qp_quants' nmax for IQ2_XXS (kMaxQ + 1)
_FIVE = _F32(5.0)  # 2*kMaxQ - 1
_HALF = _F32(0.5)
_QUARTER = _F32(0.25)
_TENTH = _F32(0.1)
_FIFTEEN = _F32(15.0)
_THIRTY_ONE = _F32(31.0)
_QK_K = _F32(256.0)
_FLT_MAX = _F32(3.4028234663852886e38)
_EPS = _F32(1e-15)  # GROUP_MAX_EPS
_EPS_IQ2_S = _F32(1e-8)
_EPS_IQ1_S = _F32(1e-12)
_EPS_IQ1_M = _F32(1e-7)
_FUDGE_IQ2_S = _F32(0.9875)
_FUDGE_IQ1_S = _F32(1.125)
_FUDGE_IQ1_M = _F32(1.1125)
_DELTA = _F32(0.125)  # IQ1S_DELTA == IQ1M_DELTA
_MAGIC = _F32(12582912.0)
_NI_HI = _F32(4194303.0)
_NI_LO = _F32(-4194303.0)

XXS, XS, S = 0, 1, 2  # iq2_blocks' kinds


@_jitable
def _nearest_int(v, fbuf, ibuf):
    """C's ``nearest_int``: the magic-number trick, garbage (as C's) outside +-2**22."""
    if v >= _NI_LO and v <= _NI_HI:
        return int((v + _MAGIC) - _MAGIC)
    fbuf[0] = v + _MAGIC
    return int((ibuf[0] & 0x7FFFFF) - 0x400000)


@_jitable
def _qp_scale(n, x, w, L, fbuf, ibuf):
    """``make_qp_quants(n, 4, x, L, w)``'s scale; L is C's uint8_t array (negative levels wrap to 255)."""
    mx = _ZERO
    for i in range(n):
        if not mx > x[i]:
            mx = x[i]
    if mx < _EPS:
        return _ZERO
    iscale = _FOUR / mx
    for i in range(n):
        L[i] = _nearest_int(iscale * x[i], fbuf, ibuf) & 255
    scale = _ONE / iscale
    best_mse = _ZERO
    for i in range(n):
        diff = x[i] - scale * _F32(L[i])
        best_mse += w[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (_TENTH * _F32(step) + _FOUR) / mx
        scale_is = _ONE / iscale_is
        mse = _ZERO
        for i in range(n):
            lv = min(4, _nearest_int(iscale_is * x[i], fbuf, ibuf))
            diff = x[i] - scale_is * _F32(lv)
            mse += w[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = _ZERO
    suml2 = _ZERO
    for i in range(n):
        lv = min(4, _nearest_int(iscale * x[i], fbuf, ibuf))
        L[i] = lv & 255
        sumlx += w[i] * x[i] * _F32(lv)
        suml2 += w[i] * _F32(lv) * _F32(lv)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            wi = w[i]
            li = _F32(L[i])
            slx = sumlx - wi * x[i] * li
            sl2 = suml2 - wi * li * li
            if slx > _ZERO and sl2 > _ZERO:
                new_l = min(4, _nearest_int(x[i] * sl2 / slx, fbuf, ibuf))
                if new_l != L[i]:
                    slx += wi * x[i] * _F32(new_l)
                    sl2 += wi * _F32(new_l) * _F32(new_l)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 255
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > _ZERO else _ZERO


@_jitable
def _iq2_neighbour(neigh, off, gridf, gridl, xval, waux, base, scale, L):
    """``iq2_find_best_neighbour`` for the 8 values at ``base``: the weighted-nearest listed point, its levels into L; -1 if none."""
    best_d2 = _FLT_MAX
    best = -1
    for j in range(1, neigh[off] + 1):
        g = neigh[off + j]
        d2 = _ZERO
        for i in range(8):
            diff = scale * gridf[g, i] - xval[base + i]
            d2 += waux[base + i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            best = g
    if best >= 0:
        for i in range(8):
            L[base + i] = gridl[best, i]
    return best


@_jitable
def _levels(xval, base, id_, L, fbuf, ibuf):
    """``MAX(0, MIN(2, nearest_int(0.5f*(id*x - 1))))`` for the 8 values at ``base`` into L; their grid code."""
    u = 0
    for i in range(8):
        lv = max(0, min(2, _nearest_int(_HALF * (id_ * xval[base + i] - _ONE), fbuf, ibuf)))
        L[base + i] = lv
        u |= lv << (2 * i)
    return u


@_jitable
def _code(L, base):
    u = 0
    for i in range(8):
        u |= L[base + i] << (2 * i)
    return u


def iq2_blocks(x, qw, has_qw, kind, gridf, gridl, kmap, neigh, out, dvals):
    """Super-blocks ``x`` [nb, 256] -> ``out`` [nb, block bytes - 2] (after d) and ``dvals`` [nb] (d before fp16).

    ``kind``: XXS, XS or S. Returns -1, or the first super-block where ggml would abort (no
    neighbour at a finite distance). ``qw`` holds one row's importance (super-block b reads the 256
    at ``(b mod len/256) * 256``); ``gridf`` [G, 8] float32 holds 2l+1, ``gridl`` the levels;
    ``kmap``/``neigh`` as ``iq2xs_init_impl`` builds them.
    """
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    per_row = max(1, qw.shape[0] // 256)
    bs = 32 if kind == XXS else 16
    ng = bs // 8
    weight = np.zeros(32, np.float32)
    waux = np.zeros(32, np.float32)
    xval = np.zeros(32, np.float32)
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    Lqp = np.zeros(32, np.int64)
    on_grid = np.zeros(4, np.bool_)
    on_grid_aux = np.zeros(4, np.bool_)
    signs = np.zeros(4, np.int64)
    scales = np.zeros(16, np.float32)
    n_trials = 6 if kind == XXS else 9
    sign_mask = 255 if kind == S else 127
    eps = _EPS_IQ2_S if kind == S else _EPS
    for b in range(x.shape[0]):
        xbl = x[b]
        o = out[b]
        for i in range(o.shape[0]):
            o[i] = 0
        max_scale = _ZERO
        sumx2 = _ZERO
        for i in range(256):
            sumx2 += xbl[i] * xbl[i]
        sigma2 = _TWO * sumx2 / _QK_K if kind == S else sumx2 / _QK_K
        qoff = (b % per_row) * 256
        for ib in range(256 // bs):
            base = bs * ib
            for i in range(bs):
                xi = xbl[base + i]
                if has_qw:
                    weight[i] = qw[qoff + base + i] * np.sqrt(sigma2 + xi * xi)
                else:  # IQ2_S only: the others require weights
                    weight[i] = _QUARTER * sigma2 + xi * xi
                waux[i] = np.sqrt(weight[i])
            for k in range(ng):
                nflip = 0
                s = 0
                for i in range(8):
                    xi = xbl[base + 8 * k + i]
                    if xi >= _ZERO:
                        xval[8 * k + i] = xi
                    else:
                        xval[8 * k + i] = -xi
                        nflip += 1
                        s |= 1 << i
                if kind != S and nflip % 2:  # odd negatives: the cheapest value keeps its sign
                    imin = 0
                    x0 = xbl[base + 8 * k]
                    mn = weight[8 * k] * x0 * x0
                    for i in range(1, 8):
                        xi = xbl[base + 8 * k + i]
                        ax = weight[8 * k + i] * xi * xi
                        if ax < mn:
                            mn = ax
                            imin = i
                    xval[8 * k + imin] = -xval[8 * k + imin]
                    s ^= 1 << imin
                signs[k] = s & sign_mask
            mx = xval[0]
            for i in range(1, bs):
                if not mx > xval[i]:
                    mx = xval[i]
            for i in range(bs):
                L[i] = 0
            if mx < eps:
                scales[ib] = _ZERO
                continue
            if kind == XXS:
                scale = _qp_scale(32, xval, weight, Lqp, fbuf, ibuf)
                denom = scale * _THREE
                if denom <= _ZERO:
                    scales[ib] = _ZERO
                    continue
            else:
                scale = mx / _FIVE
                denom = mx
            best = _ZERO
            for k in range(ng):
                on_grid[k] = True
            for step in range(-n_trials, n_trials + 1):
                id_ = (_FIVE + _F32(step) * _TENTH) / denom
                this_scale = _ONE / id_
                for k in range(ng):
                    u = _levels(xval, 8 * k, id_, Laux, fbuf, ibuf)
                    on_grid_aux[k] = kmap[u] >= 0
                    if kmap[u] < 0 and _iq2_neighbour(neigh, -kmap[u] - 1, gridf, gridl, xval, waux, 8 * k, this_scale,
                                                      Laux) < 0:
                        return b
                sumqx = _ZERO
                sumq2 = _ZERO
                for i in range(bs):
                    w = weight[i]
                    q = _F32(2 * Laux[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > _ZERO and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    for i in range(bs):
                        L[i] = Laux[i]
                    for k in range(ng):
                        on_grid[k] = on_grid_aux[k]
            n_off = 0
            for k in range(ng):
                if kind == XXS or not on_grid[k]:  # IQ2_XXS redoes every group, the others the off-grid ones
                    n_off += 1
            if n_off > 0 and scale > _ZERO:
                id_ = _ONE / scale
                for k in range(ng):
                    if kind != XXS and on_grid[k]:
                        continue
                    u = _levels(xval, 8 * k, id_, L, fbuf, ibuf)
                    if kmap[u] < 0 and _iq2_neighbour(neigh, -kmap[u] - 1, gridf, gridl, xval, waux, 8 * k, scale, L) < 0:
                        return b
                sumqx = _ZERO
                sumq2 = _ZERO
                for i in range(bs):
                    w = weight[i]
                    q = _F32(2 * L[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > _ZERO:
                    scale = sumqx / sumq2
            if scale < _ZERO:  # "should never happen" in ggml; flipped as it flips it
                scale = -scale
                for k in range(ng):
                    signs[k] = (~signs[k]) & sign_mask
            packed = 0
            for k in range(ng):
                g = kmap[_code(L, 8 * k)]  # on the grid by construction (ggml aborts otherwise)
                if kind == XXS:
                    o[8 * ib + k] = g
                    packed |= signs[k] << (7 * k)
                elif kind == XS:
                    v = g | (signs[k] << 9)
                    o[4 * ib + 2 * k] = v & 255
                    o[4 * ib + 2 * k + 1] = v >> 8
                else:
                    i8 = 2 * ib + k
                    o[i8] = g & 255
                    o[64 + i8 // 4] |= (g >> 8) << (2 * (i8 % 4))
                    o[32 + i8] = signs[k]
            if kind == XXS:
                for k in range(4):
                    o[8 * ib + 4 + k] = (packed >> (8 * k)) & 255
            scales[ib] = scale
            if scale > max_scale:
                max_scale = scale
        if max_scale == _ZERO:
            dvals[b] = _ZERO
            if kind != S:  # IQ2_XXS/XS never copy their codes; IQ2_S wrote them in place
                for i in range(o.shape[0]):
                    o[i] = 0
            continue
        d = max_scale / _THIRTY_ONE
        dvals[b] = d * _FUDGE_IQ2_S if kind == S else d
        id_ = _ONE / d
        for ib in range(256 // bs):
            lv = max(0, min(15, _nearest_int(_HALF * (id_ * scales[ib] - _ONE), fbuf, ibuf)))
            if kind == XXS:
                o[8 * ib + 7] |= lv << 4
            else:
                o[(64 if kind == XS else 72) + ib // 2] |= lv << (4 * (ib % 2))
    return -1


@_jitable
def _iq1_neighbour(neigh, off, gridl, xb, weight, base, scale, xx, L):
    """``iq1_find_best_neighbour2`` for the 8 values at ``base``: the weighted-nearest listed point, its levels into L; -1 if none.

    ggml's fallback (every listed distance inf or NaN) reads past its arrays; only values that
    overflow float32 reach it, and those are refused instead.
    """
    best_d2 = _FLT_MAX
    best = -1
    for j in range(1, neigh[off] + 1):
        g = neigh[off + j]
        d2 = _ZERO
        for i in range(8):
            diff = scale * xx[gridl[g, i]] - xb[base + i]
            d2 += weight[base + i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            best = g
    if best >= 0:
        for i in range(8):
            L[base + i] = gridl[best, i]
    return best


@_jitable
def _sort_index(v, n, idx):
    """The stable ascending order of v[:n] into idx (glibc's qsort is a merge sort at these sizes: ties keep their order)."""
    for i in range(n):
        j = i
        while j > 0 and v[i] < v[idx[j - 1]]:
            idx[j] = idx[j - 1]
            j -= 1
        idx[j] = i


def iq1_blocks(x, qw, has_qw, is_m, gridl, kmap, neigh, out, dvals):
    """IQ1_S (``is_m`` False: ``out`` after d) or IQ1_M (the whole block; ``dvals`` is the d its scales' top nibbles get).

    Returns -1, or the first super-block where ggml would abort. Tables as ``iq2_blocks``'.
    """
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    per_row = max(1, qw.shape[0] // 256)
    bs = 16 if is_m else 32
    nsub = 256 // bs
    eps = _EPS_IQ1_M if is_m else _EPS_IQ1_S
    x_p = np.array([-_ONE + _DELTA, _DELTA, _ONE + _DELTA], np.float32)
    x_m = np.array([-_ONE - _DELTA, -_DELTA, _ONE - _DELTA], np.float32)
    weight = np.zeros(32, np.float32)
    xbv = np.zeros(32, np.float32)
    idx = np.zeros(32, np.int64)
    sumx = np.zeros(33, np.float32)
    sumw = np.zeros(33, np.float32)
    px = np.zeros((2, 17), np.float32)
    pw = np.zeros((2, 17), np.float32)
    sq = np.zeros(4, np.float32)
    s2 = np.zeros(4, np.float32)
    L = np.zeros(32, np.int64)
    index = np.zeros(4, np.int64)
    scales = np.zeros(16, np.float32)
    shifts = np.zeros(16, np.int64)
    cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1]
    cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2]
    cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1]
    cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2]
    for b in range(x.shape[0]):
        xbl = x[b]
        o = out[b]
        for i in range(o.shape[0]):
            o[i] = 0
        qh0 = 32  # qh: IQ1_S uint16[8] after qs, IQ1_M uint8[16]
        max_scale = _ZERO
        sumx2 = _ZERO
        for i in range(256):
            sumx2 += xbl[i] * xbl[i]
        sigma2 = _TWO * sumx2 / _QK_K
        qoff = (b % per_row) * 256
        for ib in range(nsub):
            base = bs * ib
            for i in range(bs):
                xi = xbl[base + i]
                xbv[i] = xi
                if has_qw:
                    weight[i] = qw[qoff + base + i] * np.sqrt(sigma2 + xi * xi)
                else:  # IQ1_M only: IQ1_S requires weights
                    weight[i] = xi * xi
            mx = abs(xbv[0])
            for i in range(1, bs):
                if not mx > abs(xbv[i]):
                    mx = abs(xbv[i])
            if mx < eps:
                scales[ib] = _ZERO
                shifts[ib] = 0 if is_m else 1
                continue
            _sort_index(xbv, bs, idx)
            best_score = -_FLT_MAX
            scale = mx
            besti1 = -1
            besti2 = -1
            best_k = -1 if is_m else 0  # IQ1_M: a 2-bit code; IQ1_S: the shift, 0 for none
            if not is_m:
                sumx[0] = _ZERO
                sumw[0] = _ZERO
                for j in range(bs):
                    i = idx[j]
                    sumx[j + 1] = sumx[j] + weight[i] * xbv[i]
                    sumw[j + 1] = sumw[j] + weight[i]
                for i1 in range(bs + 1):
                    for i2 in range(i1, bs + 1):
                        for sh in range(2):  # x_p (shift 1), then x_m (shift -1)
                            xx = x_p if sh == 0 else x_m
                            sumqx = (sumx[i1] - sumx[0]) * xx[0] + (sumx[i2] - sumx[i1]) * xx[1] + (sumx[bs] - sumx[i2]) * xx[2]
                            sumq2 = ((sumw[i1] - sumw[0]) * xx[0] * xx[0] + (sumw[i2] - sumw[i1]) * xx[1] * xx[1]
                                     + (sumw[bs] - sumw[i2]) * xx[2] * xx[2])
                            if sumq2 > _ZERO and sumqx * sumqx > best_score * sumq2:
                                scale = sumqx / sumq2
                                best_score = scale * sumqx
                                besti1 = i1
                                besti2 = i2
                                best_k = 1 if sh == 0 else -1
            else:
                for h in range(2):
                    px[h, 0] = _ZERO
                    pw[h, 0] = _ZERO
                for j in range(bs):
                    i = idx[j]
                    h = 0 if i < bs // 2 else 1
                    px[h, j + 1] = px[h, j] + weight[i] * xbv[i]
                    px[1 - h, j + 1] = px[1 - h, j]
                    pw[h, j + 1] = pw[h, j] + weight[i]
                    pw[1 - h, j + 1] = pw[1 - h, j]
                p2 = x_p[2]
                m2 = x_m[2]
                for i1 in range(bs + 1):
                    for i2 in range(i1, bs + 1):
                        sx0 = px[0, i1] + px[0, i2]
                        sx1 = px[1, i1] + px[1, i2]
                        qxp0 = px[0, bs] * p2 - sx0
                        qxm0 = px[0, bs] * m2 - sx0
                        qxp1 = px[1, bs] * p2 - sx1
                        qxm1 = px[1, bs] * m2 - sx1
                        q2p0 = pw[0, bs] * p2 * p2 + pw[0, i1] * cp1 + pw[0, i2] * cp2
                        q2m0 = pw[0, bs] * m2 * m2 + pw[0, i1] * cm1 + pw[0, i2] * cm2
                        q2p1 = pw[1, bs] * p2 * p2 + pw[1, i1] * cp1 + pw[1, i2] * cp2
                        q2m1 = pw[1, bs] * m2 * m2 + pw[1, i1] * cm1 + pw[1, i2] * cm2
                        sq[0] = qxp0 + qxp1
                        sq[1] = qxp0 + qxm1
                        sq[2] = qxm0 + qxp1
                        sq[3] = qxm0 + qxm1
                        s2[0] = q2p0 + q2p1
                        s2[1] = q2p0 + q2m1
                        s2[2] = q2m0 + q2p1
                        s2[3] = q2m0 + q2m1
                        for k in range(4):
                            if s2[k] > _ZERO and sq[k] * sq[k] > best_score * s2[k]:
                                scale = sq[k] / s2[k]
                                best_score = scale * sq[k]
                                besti1 = i1
                                besti2 = i2
                                best_k = k
            if besti1 < 0 or besti2 < 0 or (best_k == 0 if not is_m else best_k < 0):
                scales[ib] = _ZERO
                shifts[ib] = 0 if is_m else 1
                continue
            for j in range(bs):
                L[idx[j]] = 0 if j < besti1 else (1 if j < besti2 else 2)
            if scale < _ZERO:
                for j in range(bs):
                    L[j] = 2 - L[j]
                scale = -scale
                best_k = 3 - best_k if is_m else -best_k
            all_on_grid = True
            for k in range(bs // 8):
                xx = _iq1_values(is_m, best_k, k, x_p, x_m)
                u = _code(L, 8 * k)
                g = kmap[u]
                if g < 0:
                    all_on_grid = False
                    g = _iq1_neighbour(neigh, -g - 1, gridl, xbv, weight, 8 * k, scale, xx, L)
                    if g < 0:
                        return b
                index[k] = g
            if not all_on_grid:
                sumqx = _ZERO
                sumq2 = _ZERO
                for k in range(bs // 8):
                    xx = _iq1_values(is_m, best_k, k, x_p, x_m)
                    for j in range(8):
                        w = weight[8 * k + j]
                        q = xx[gridl[index[k], j]]
                        sumqx += w * q * xbv[8 * k + j]
                        sumq2 += w * q * q
                if sumqx > _ZERO and sumq2 > _ZERO:
                    scale = sumqx / sumq2
            if is_m:
                o[2 * ib] = index[0] & 255
                o[2 * ib + 1] = index[1] & 255
                o[qh0 + ib] = (index[0] >> 8) | ((index[1] >> 8) << 4)
            else:
                h16 = 0
                for k in range(4):
                    o[4 * ib + k] = index[k] & 255
                    h16 |= (index[k] >> 8) << (3 * k)
                o[qh0 + 2 * ib] = h16 & 255
                o[qh0 + 2 * ib + 1] = h16 >> 8
            scales[ib] = scale
            shifts[ib] = best_k
            if scale > max_scale:
                max_scale = scale
        if max_scale == _ZERO:
            dvals[b] = _ZERO
            continue
        d = max_scale / _FIFTEEN
        id_ = _ONE / d
        if not is_m:
            dvals[b] = d * _FUDGE_IQ1_S
            for ib in range(nsub):
                lv = max(0, min(7, _nearest_int(_HALF * (id_ * scales[ib] - _ONE), fbuf, ibuf)))
                if shifts[ib] == -1:
                    lv |= 8
                o[qh0 + 2 * ib + 1] |= lv << 4
            continue
        sumqx = _ZERO
        sumq2 = _ZERO
        for ib in range(nsub):
            lv = max(0, min(7, _nearest_int(_HALF * (id_ * scales[ib] - _ONE), fbuf, ibuf)))
            sc = lv << (3 * (ib % 4))  # sc[ib/4] |= l << 3*(ib%4), a uint16 over two bytes
            o[48 + 2 * (ib // 4)] |= sc & 255
            o[48 + 2 * (ib // 4) + 1] |= sc >> 8
            o[qh0 + ib] |= (0x80 if shifts[ib] % 2 == 1 else 0) | (0x08 if shifts[ib] >= 2 else 0)
            base = bs * ib
            for i in range(bs):
                xi = xbl[base + i]
                if has_qw:
                    weight[i] = qw[qoff + base + i] * np.sqrt(sigma2 + xi * xi)
                else:
                    weight[i] = xi * xi
            for k in range(2):
                xx = _iq1_values(True, shifts[ib], k, x_p, x_m)
                g = np.int64(o[2 * ib + k]) + ((np.int64(o[qh0 + ib]) << (8 - 4 * k)) & 0x700)
                for j in range(8):
                    w = weight[8 * k + j]
                    q = xx[gridl[g, j]] * _F32(2 * lv + 1)
                    sumqx += w * q * xbl[base + 8 * k + j]
                    sumq2 += w * q * q
        if sumq2 > _ZERO:
            d = sumqx / sumq2
        dvals[b] = d * _FUDGE_IQ1_M
    return -1


@_jitable
def _iq1_values(is_m, shift, k, x_p, x_m):
    """The three values group k uses: IQ1_S by its shift (1: x_p), IQ1_M by bit k of its 2-bit shift code (0: x_p)."""
    if not is_m:
        return x_p if shift == 1 else x_m
    if k == 0:
        return x_p if shift < 2 else x_m
    return x_p if shift % 2 == 0 else x_m
