"""Bit-exact ports of ggml's 4-bit non-linear quantizers: IQ4_NL and IQ4_XS.

``quantize_row_iq4_nl_impl`` with ``ntry = 7`` (what llama-quantize runs), optionally with an
importance matrix (float32 [row_length]). Nothing is refused: inf or NaN take the general path.
Pure functions. Specification: docs/quantizers.md, "IQ4_NL and IQ4_XS".
"""

from __future__ import annotations

import numpy as np

from .legacy import as_blocks, as_rows, first_absmax, fp16_bits, reciprocal_or_zero

__all__ = ["KVALUES_IQ4NL", "quantize_iq4_nl", "quantize_iq4_xs"]

QK4_NL = 32
QK_K = 256
_NTRY = 7
_F32 = np.float32
_ZERO = _F32(0)
_GROUP_MAX_EPS = _F32(1e-15)  # the float literal 1e-15f
_MAGIC = _F32(12582912.0)  # nearest_int: 1.5 * 2**23

BLOCK_IQ4_NL = np.dtype([("d", "<u2"), ("qs", "u1", (16,))])
BLOCK_IQ4_XS = np.dtype([("d", "<u2"), ("scales_h", "<u2"), ("scales_l", "u1", (4,)), ("qs", "u1", (128,))])
assert (BLOCK_IQ4_NL.itemsize, BLOCK_IQ4_XS.itemsize) == (18, 136)

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
KVALUES_IQ4NL.flags.writeable = False
_VALUES = KVALUES_IQ4NL.astype(_F32)

# best_index_int8(x) == #{k : x >= (val[k-1] + val[k]) / 2} == _LUT_INDEX[floor(2x) + 512] for
# floor(2x) in [-512, 511] (all 2*midpoints lie in [-231, 202]); larger |x| is clamped into it first.
# Indices are kept non-negative: np.take's wrapping of negative ones is its slow path.
_LUT_SIZE = 1024
_LUT_OFFSET = _F32(_LUT_SIZE // 2)
_T_MIN, _T_MAX = _F32(-_LUT_SIZE // 2), _F32(_LUT_SIZE // 2 - 1)


def _tables() -> tuple[np.ndarray, np.ndarray]:
    twice_mid = KVALUES_IQ4NL[:-1].astype(np.int32) + KVALUES_IQ4NL[1:]
    n = np.arange(_LUT_SIZE) - _LUT_SIZE // 2
    index = (n[:, None] >= twice_mid[None, :]).sum(axis=1).astype(np.uint8)
    value = _VALUES[index]
    index.flags.writeable = False
    value.flags.writeable = False
    return index, value


_LUT_INDEX, _LUT_VALUE = _tables()


def _reduce_is_sequential() -> bool:
    """Does ``np.add.reduce(a, axis=0, initial=0)`` on our scratch layout add rows in index order?"""
    for shape in ((32, 2, 1), (32, 2, 3), (32, 2, 257), (32, 3, 40)):
        a = np.full(shape, _F32(2.0**-24), _F32)
        a[0] = 1
        a[5, 0, 0] = _F32(-0.75)
        want = np.zeros(shape[1:], _F32)
        for row in a:
            want += row
        got = np.add.reduce(a, axis=0, initial=_ZERO)
        if not np.array_equal(want.view(np.uint32), got.view(np.uint32)):
            return False
    return True


_SEQUENTIAL = _reduce_is_sequential()


def _sums(p: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``float s = 0; for (j = 0; j < 32; ++j) s += p[j];`` for every trailing index."""
    if _SEQUENTIAL:
        return np.add.reduce(p, axis=0, out=out, initial=_ZERO)
    np.add(p[0], _ZERO, out=out)
    for row in p[1:]:
        np.add(out, row, out=out)
    return out


# --- per-call scratch

# blocks per tile: [32, tile] scratch around L2's size; a multiple of 8 (whole IQ4_XS super-blocks)
_TILE = 1024
_PAGE = 4096


def _staggered(nbytes: int, slot: int) -> np.ndarray:
    """Uninitialised bytes starting ``slot * 320`` bytes into a page, so one ufunc's loads and stores never 4K-alias."""

    raw = np.empty(nbytes + 2 * _PAGE, np.uint8)
    start = (-raw.ctypes.data) % _PAGE + (slot * 320) % _PAGE
    return raw[start:start + nbytes]


class _Scratch:
    """Preallocated work arrays for tiles of up to ``cap`` blocks; ``view(n)`` gives C-contiguous views for n <= cap."""

    # name -> (dtype, planes): [32, n] for 1 plane, else [32, planes, n] ([3, 32, n] for t3/i3)
    _LAYOUT: dict[str, tuple[type, int]] = {
        "x": (_F32, 1), "w": (_F32, 1), "al": (_F32, 1), "q": (_F32, 1), "wq": (_F32, 1), "mid": (_F32, 1),
        "mask": (np.int32, 1), "p": (_F32, 2), "hi": (_F32, 2), "diff": (_F32, 2), "t3": (_F32, 3), "i3": (np.intp, 3),
    }
    _FITS = 2 * _NTRY + 2  # the first fit and the 15 trials

    def __init__(self, cap: int) -> None:
        self._buf = {k: _staggered(cap * 32 * planes * np.dtype(dt).itemsize, slot)
                     for slot, (k, (dt, planes)) in enumerate(self._LAYOUT.items())}
        self._sums = np.empty(self._FITS * 2 * cap, _F32)
        self._cand = np.empty(self._FITS * 2 * cap, _F32)

    def view(self, n: int) -> dict[str, np.ndarray]:
        v = {}
        for k, (dt, planes) in self._LAYOUT.items():
            flat = self._buf[k].view(dt)[:32 * planes * n]
            if planes == 1:
                v[k] = flat.reshape(32, n)
            elif k in ("t3", "i3"):
                v[k] = flat.reshape(planes, 32, n)
            else:
                v[k] = flat.reshape(32, planes, n)
        v["i"] = v["i3"][0]
        v["L"] = self._buf["mask"][:32 * n].reshape(32, n)  # uint8 indices (the mask is free by then)
        v["sums"] = self._sums[:self._FITS * 2 * n].reshape(self._FITS, 2, n)  # (sumqx, sumq2) per fit
        v["cand"] = self._cand[:self._FITS * 2 * n].reshape(self._FITS, 2, n)  # (d, best) per fit
        return v


def _best_index(al: np.ndarray, s: dict[str, np.ndarray]) -> np.ndarray:
    """``best_index_int8(16, kvalues_iq4nl, al)`` element-wise, for any float32 (inf and NaN included). Returns s["L"]."""
    t = s["q"] if al is not s["q"] else s["wq"]
    with np.errstate(over="ignore"):
        np.multiply(al, _F32(2), out=t)  # exact (overflow to inf is clamped next)
    np.fmin(t, _T_MAX, out=t)  # fmin maps NaN to the top, where C's search ends for NaN
    np.maximum(t, _T_MIN, out=t)
    np.floor(t, out=t)
    t += _LUT_OFFSET
    i = s["i"]
    np.copyto(i, t, casting="unsafe")
    return np.take(_LUT_INDEX, i, out=s["L"], mode="wrap")


def _terms(w: np.ndarray, x: np.ndarray, q: np.ndarray, wq: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``p[:, 0] = w*q*x``, ``p[:, 1] = w*q*q``: the terms of sumqx and sumq2, rounded as C does."""
    np.multiply(w, q, out=wq)
    np.multiply(wq, x, out=p[:, 0])
    np.multiply(wq, q, out=p[:, 1])
    return p


def _block_scales(xb: np.ndarray, s: dict[str, np.ndarray], weight: np.ndarray | None = None) -> np.ndarray:
    """The per-block scale ``d`` of ``quantize_row_iq4_nl_impl``'s search, for the rows of ``xb`` ``[n, 32]``
    (``weight`` [n, 32]: the importance weights; None: ``x*x``)."""
    x, w, al, q, wq, p = s["x"], s["w"], s["al"], s["q"], s["wq"], s["p"]
    sums = s["sums"]  # [16, 2, n]: (sumqx, sumq2) of the first fit, then of each trial
    np.copyto(x, xb.T)
    finite = bool(np.isfinite(x).all())
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if weight is None:
            np.multiply(x, x, out=w)
        else:
            np.copyto(w, weight.T)
        amax, vmax = first_absmax(xb)
        skip = amax < _GROUP_MAX_EPS
        m = np.where(skip, _F32(1), vmax)  # any finite stand-in: skipped blocks get scale 0 below
        d0 = np.negative(m) / _VALUES[0]
        # id = (itry + values[0])/max for itry = -7..7 (the int sum is exact in float)
        trial_ids = (np.arange(-_NTRY, _NTRY + 1, dtype=_F32) + _VALUES[0])[:, None] / m[None, :]

        if finite:
            # q of the first fit and of the two extreme trials by table lookup, in one batch
            ids = np.empty((3, m.size), _F32)
            np.divide(_F32(1), d0, out=ids[0])
            ids[1:] = trial_ids[[0, -1]]
            ids *= _F32(2)  # fl(x*2id) == 2*fl(x*id): doubling is exact (and |al| <= ~135 here)
            t3, i3 = s["t3"], s["i3"]
            np.multiply(x[None], ids[:, None, :], out=t3)
            np.floor(t3, out=t3)
            t3 += _LUT_OFFSET
            np.copyto(i3, t3, casting="unsafe")
            np.take(_LUT_VALUE, i3, out=t3, mode="wrap")  # t3 now holds the quant values
            _sums(_terms(w, x, t3[0], wq, p), sums[0])

            # every trial's q is the one at itry = -7 or +7 (docs/quantizers.md): select bitwise per trial
            hi, diff, mid, mask = s["hi"], s["diff"], s["mid"], s["mask"]
            np.maximum(t3[1], t3[2], out=q)
            np.minimum(t3[1], t3[2], out=t3[0])
            np.add(q, t3[0], out=mid)
            mid *= _F32(0.5)
            _terms(w, x, q, wq, hi)
            _terms(w, x, t3[0], wq, diff)
            np.bitwise_xor(diff.view(np.int32), hi.view(np.int32), out=diff.view(np.int32))
            for k in range(2 * _NTRY + 1):
                np.multiply(x, trial_ids[k], out=al)
                np.subtract(al, mid, out=al)  # exact sign; +0 (the upper q) only where al == mid
                np.right_shift(al.view(np.int32), 31, out=mask)
                np.bitwise_and(diff.view(np.int32), mask[:, None, :], out=p.view(np.int32))
                np.bitwise_xor(p.view(np.int32), hi.view(np.int32), out=p.view(np.int32))
                _sums(p, sums[k + 1])
        else:
            np.multiply(x, _F32(1) / d0, out=al)
            np.take(_VALUES, _best_index(al, s), out=q)
            _sums(_terms(w, x, q, wq, p), sums[0])
            for k in range(2 * _NTRY + 1):
                np.multiply(x, trial_ids[k], out=al)
                np.take(_VALUES, _best_index(al, s), out=q)
                _sums(_terms(w, x, q, wq, p), sums[k + 1])

        # if (sumq2 > 0 && sumqx*sumqx > best*sumq2) { d = sumqx/sumq2; best = d*sumqx; }, batched
        sumqx, sumq2 = sums[:, 0], sums[:, 1]
        cand = s["cand"]  # [16, 2, n]: (d, best) each fit would set
        np.divide(sumqx, sumq2, out=cand[:, 0])
        np.multiply(cand[:, 0], sumqx, out=cand[:, 1])
        square = np.where(sumq2 > 0, sumqx * sumqx, _F32(-np.inf))  # -inf: never better, like the && in C
        state = np.where(sumq2[0] > 0, cand[0], _ZERO)  # [2, n]: (d, best)
        state[1] = state[0] * sumqx[0]
        for k in range(1, 2 * _NTRY + 2):
            np.copyto(state, cand[k], where=square[k] > state[1] * sumq2[k])
    d = state[0]
    d[skip] = 0
    return d


def _pack(L: np.ndarray) -> np.ndarray:
    """``q4[16i + j] = L[32i + j] | L[32i + 16 + j] << 4`` for position-major ``L`` ``[32, n]`` -> ``[n, 16]``."""
    return (L[:16] | (L[16:] << np.uint8(4))).T


def _weights(xb: np.ndarray, qw: np.ndarray | None, b0: int, b1: int, super_block: int) -> np.ndarray | None:
    """``qw[j] * sqrtf(sigma2 + x*x)`` for blocks [b0, b1) of ``xb`` [n, 32] (whole super-blocks), or None without ``qw``."""
    if qw is None:
        return None
    per = super_block // QK4_NL
    xs = xb[b0:b1].reshape(-1, super_block)
    sigma2 = np.zeros(xs.shape[0], _F32)
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(super_block):  # C's order: one running sum over the super-block
            sigma2 += xs[:, j] * xs[:, j]
        sigma2 *= _F32(2.0 / super_block)  # 2.f/super_block_size: a power of two, exact
        qwb = qw.reshape(-1, QK4_NL)
        w = qwb[np.arange(b0, b1) % qwb.shape[0]]  # the blocks' positions in their rows
        return w * np.sqrt(np.repeat(sigma2, per)[:, None] + xb[b0:b1] * xb[b0:b1])


def quantize_iq4_nl(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*32,)`` -> IQ4_NL blocks as bytes ``(n*18,)``; ``importance``: float32 [row_length] or None."""
    xb = as_blocks(x, QK4_NL)
    qw = None if importance is None else as_rows(x, importance, QK4_NL)[1]
    nb = xb.shape[0]
    out = np.empty(nb, BLOCK_IQ4_NL)
    scratch = _Scratch(min(_TILE, max(nb, 1)))
    for b0 in range(0, nb, _TILE):
        b1 = min(nb, b0 + _TILE)
        s = scratch.view(b1 - b0)
        d = _block_scales(xb[b0:b1], s, _weights(xb, qw, b0, b1, QK4_NL))
        out["d"][b0:b1] = fp16_bits(d)
        with np.errstate(over="ignore", invalid="ignore"):  # inf/NaN are C's too
            al = np.multiply(s["x"], reciprocal_or_zero(d), out=s["al"])
        out["qs"][b0:b1] = _pack(_best_index(al, s))
    return out.view(np.uint8)


def quantize_iq4_xs(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*256,)`` -> IQ4_XS blocks as bytes ``(n*136,)``; ``importance``: float32 [row_length] or None."""
    xb = as_blocks(x, QK_K).reshape(-1, QK4_NL)
    qw = None if importance is None else as_rows(x, importance, QK_K)[1]
    nb = xb.shape[0]
    out = np.empty(nb // 8, BLOCK_IQ4_XS)
    scratch = _Scratch(min(_TILE, max(nb, 8)))
    for b0 in range(0, nb, _TILE):
        b1 = min(nb, b0 + _TILE)
        s = scratch.view(b1 - b0)
        scales = _block_scales(xb[b0:b1], s, _weights(xb, qw, b0, b1, QK_K)).reshape(-1, 8)
        # max_scale: the first block scale of largest magnitude (``abs_d > amax_scale``, from 0)
        amax_s = np.zeros(scales.shape[0], _F32)
        max_s = np.zeros(scales.shape[0], _F32)
        for ib in range(8):
            sc = scales[:, ib]
            a = np.abs(sc)
            upd = a > amax_s
            amax_s[upd] = a[upd]
            max_s[upd] = sc[upd]
        with np.errstate(over="ignore", invalid="ignore"):
            d = np.negative(max_s) / _F32(32)
            t = reciprocal_or_zero(d)[:, None] * scales
            t += _MAGIC  # nearest_int: round via the mantissa of fval + 1.5*2**23
            ls = (t.view(np.int32) & np.int32(0x7FFFFF)) - np.int32(0x400000)
            np.clip(ls, -32, 31, out=ls)
            dl = d[:, None] * ls.astype(_F32)
            al = np.multiply(s["x"], reciprocal_or_zero(dl).reshape(-1), out=s["al"])
        sb = slice(b0 // 8, b1 // 8)
        out["d"][sb] = fp16_bits(d)
        ls += 32
        lu = ls.astype(np.uint16)
        out["scales_l"][sb] = ((lu[:, 0::2] & 0xF) | ((lu[:, 1::2] & 0xF) << 4)).astype(np.uint8)
        out["scales_h"][sb] = ((lu >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1, dtype=np.uint16)
        out["qs"][sb] = _pack(_best_index(al, s)).reshape(-1, 128)
    return out.view(np.uint8)
