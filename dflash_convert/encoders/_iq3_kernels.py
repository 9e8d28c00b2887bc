"""numba port of ggml's IQ3_XXS / IQ3_S searches (``quantize_row_iq3_xxs_impl``, ``quantize_row_iq3_s_impl``).

Importing this module imports numba; only ``jit.iq3_kernels()`` does, lazily. One kernel serves
both types (``is_s`` picks IQ3_S's branches), loop for loop as the C: every value a named float32,
sums in index order, no fastmath, C's ``nearest_int`` on the bits. Input must be finite (ggml
aborts on anything else; the caller refuses it). Specification: docs/quantizers.md, "IQ3_XXS and IQ3_S".
"""

from __future__ import annotations

import numba
import numpy as np

_F32 = np.float32
_ZERO = _F32(0.0)
_ONE = _F32(1.0)
_TWO = _F32(2.0)
_HALF = _F32(0.5)
_FIFTEEN = _F32(15.0)  # 2*kMaxQ - 1
_FIFTH = _F32(0.2)
_THIRTY_ONE = _F32(31.0)
_QK_K = _F32(256.0)
_FLT_MAX = _F32(3.4028234663852886e38)
_EPS_XXS = _F32(1e-8)  # GROUP_MAX_EPS_IQ3_XXS
_FUDGE_XXS = _F32(1.0125)
_FUDGE_S = _F32(1.033)
_MAGIC = _F32(12582912.0)
_NI_HI = _F32(4194303.0)
_NI_LO = _F32(-4194303.0)

_njit = numba.njit(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)


@_njit
def _nearest_int(v, fbuf, ibuf):
    if v >= _NI_LO and v <= _NI_HI:
        return np.int64((v + _MAGIC) - _MAGIC)
    fbuf[0] = v + _MAGIC
    return np.int64((ibuf[0] & 0x7FFFFF) - 0x400000)


@_njit
def _level(v, id_, fbuf, ibuf):
    """``MAX(0, MIN(7, nearest_int(0.5f*(id*v - 1))))``."""
    lv = _nearest_int(_HALF * (id_ * v - _ONE), fbuf, ibuf)
    return max(0, min(7, lv))


@_njit
def _best_neighbour(neigh, off, grid, xval, waux, k, scale, L):
    """``iq3_find_best_neighbour`` for group k: the weighted-nearest listed point; its levels into L[4k..4k+3]."""
    n = np.int64(neigh[off])
    best_d2 = _FLT_MAX
    best = -1
    for j in range(1, n + 1):
        g = np.int64(neigh[off + j])
        d2 = _ZERO
        for i in range(4):
            diff = scale * _F32(grid[g, i]) - xval[4 * k + i]
            d2 += waux[4 * k + i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            best = g
    if best < 0:  # every distance inf or NaN: ggml's GGML_ASSERT(grid_index >= 0) aborts here
        return -1
    for i in range(4):
        L[4 * k + i] = (grid[best, i] - 1) // 2
    return best


@_njit
def quantize_blocks(x, qw, has_qw, is_s, grid, kmap, neigh, out, dvals):
    """Super-blocks ``x`` [nb, 256] -> ``out`` [nb, block bytes - 2] (qs onwards) and ``dvals`` [nb] (d before fp16).

    Returns -1, or the first super-block where ggml would abort (no neighbour at a finite distance).

    ``qw`` holds one row's importance (a multiple of 256 values; super-block b of the input reads
    the 256 at ``(b mod len/256) * 256``); ``grid`` [G, 4] int8 holds 2l+1; ``kmap``/``neigh`` as
    ``iq3xs_init_impl`` builds them.
    """
    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    nb = x.shape[0]
    per_row = max(1, qw.shape[0] // 256)
    weight = np.empty(32, np.float32)
    waux = np.empty(32, np.float32)
    xval = np.empty(32, np.float32)
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    on_grid = np.zeros(8, np.bool_)
    on_grid_aux = np.zeros(8, np.bool_)
    signs = np.zeros(4, np.int64)
    scales = np.zeros(8, np.float32)
    n_trials = 9 if is_s else 15
    for b in range(nb):
        xbl = x[b]
        o = out[b]
        for i in range(o.shape[0]):
            o[i] = 0
        qs_pos = 0  # IQ3_S: qs and signs advance only past the sub-blocks it stores
        sg_pos = 72
        max_scale = _ZERO
        sumx2 = _ZERO
        for i in range(256):
            sumx2 += xbl[i] * xbl[i]
        sigma2 = _TWO * sumx2 / _QK_K
        qoff = (b % per_row) * 256
        for ib in range(8):
            for i in range(32):
                xi = xbl[32 * ib + i]
                if has_qw:
                    weight[i] = qw[qoff + 32 * ib + i] * np.sqrt(sigma2 + xi * xi)
                else:
                    weight[i] = xi * xi
                waux[i] = np.sqrt(weight[i])
            for k in range(4):
                nflip = 0
                s = 0
                for i in range(8):
                    xi = xbl[32 * ib + 8 * k + i]
                    if xi >= _ZERO:
                        xval[8 * k + i] = xi
                    else:
                        xval[8 * k + i] = -xi
                        nflip += 1
                        s |= 1 << i
                if not is_s and nflip % 2:
                    imin = 0
                    x0 = xbl[32 * ib + 8 * k]
                    mn = weight[8 * k] * x0 * x0
                    for i in range(1, 8):
                        xi = xbl[32 * ib + 8 * k + i]
                        ax = weight[8 * k + i] * xi * xi
                        if ax < mn:
                            mn = ax
                            imin = i
                    xval[8 * k + imin] = -xval[8 * k + imin]
                    s ^= 1 << imin
                signs[k] = s if is_s else s & 127
            mx = xval[0]
            for i in range(1, 32):
                if xval[i] > mx:
                    mx = xval[i]
            for i in range(32):
                L[i] = 0
            if (is_s and mx == _ZERO) or (not is_s and mx < _EPS_XXS):
                scales[ib] = _ZERO
                continue
            best = _ZERO
            scale = mx / _FIFTEEN
            for k in range(8):
                on_grid[k] = not is_s
            for step in range(-n_trials, n_trials + 1):
                id_ = (_FIFTEEN + _F32(step) * _FIFTH) / mx
                this_scale = _ONE / id_
                for k in range(8):
                    u = 0
                    for i in range(4):
                        lv = _level(xval[4 * k + i], id_, fbuf, ibuf)
                        Laux[4 * k + i] = lv
                        u |= lv << (3 * i)
                    on_grid_aux[k] = True
                    if kmap[u] < 0:
                        on_grid_aux[k] = False
                        if _best_neighbour(neigh, -kmap[u] - 1, grid, xval, waux, k, this_scale, Laux) < 0:
                            return b
                sumqx = _ZERO
                sumq2 = _ZERO
                for i in range(32):
                    w = weight[i]
                    q = _F32(2 * Laux[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > _ZERO and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    for i in range(32):
                        L[i] = Laux[i]
                    for k in range(8):
                        on_grid[k] = on_grid_aux[k]
            n_off = 0
            for k in range(8):
                if not on_grid[k]:
                    n_off += 1
            if n_off > 0 and scale > _ZERO:
                id_ = _ONE / scale
                for k in range(8):
                    if on_grid[k] and not is_s:
                        continue
                    u = 0
                    for i in range(4):
                        u |= _level(xval[4 * k + i], id_, fbuf, ibuf) << (3 * i)
                    g = kmap[u]
                    if g < 0:
                        g = _best_neighbour(neigh, -g - 1, grid, xval, waux, k, scale, L)
                        if g < 0:
                            return b
                    for i in range(4):
                        L[4 * k + i] = (grid[g, i] - 1) // 2
                sumqx = _ZERO
                sumq2 = _ZERO
                for i in range(32):
                    w = weight[i]
                    q = _F32(2 * L[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > _ZERO:
                    scale = sumqx / sumq2
            if scale < _ZERO:  # "should never happen" in ggml; flipped as it flips it
                scale = -scale
                for k in range(4):
                    signs[k] = (~signs[k]) & (255 if is_s else 127)
            for k in range(8):
                u = 0
                for i in range(4):
                    u |= L[4 * k + i] << (3 * i)
                g = kmap[u]  # on the grid by construction (ggml aborts otherwise)
                if is_s:
                    o[qs_pos + k] = g & 255
                    o[64 + ib] |= (g >> 8) << k
                else:
                    o[8 * ib + k] = g
            if is_s:
                qs_pos += 8
                for k in range(4):
                    o[sg_pos + k] = signs[k]
                sg_pos += 4
            else:
                packed = signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21)
                for k in range(4):
                    o[64 + 4 * ib + k] = (packed >> (8 * k)) & 255
            scales[ib] = scale
            if scale > max_scale:
                max_scale = scale
        if max_scale == _ZERO:
            dvals[b] = _ZERO
            if not is_s:
                for i in range(o.shape[0]):
                    o[i] = 0
            continue
        d = max_scale / _THIRTY_ONE
        dvals[b] = d * (_FUDGE_S if is_s else _FUDGE_XXS)
        id_ = _ONE / d
        for ib in range(8):
            lv = _nearest_int(_HALF * (id_ * scales[ib] - _ONE), fbuf, ibuf)
            lv = max(0, min(15, lv))
            if is_s:
                o[104 + ib // 2] |= lv << (4 * (ib % 2))
            else:
                o[64 + 4 * ib + 3] |= lv << 4
    return -1
