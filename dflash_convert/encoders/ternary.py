"""Bit-exact ports of ggml's ternary quantizers: TQ1_0 and TQ2_0 (BitNet b1.58 / TriLM packing).

Each 256-value block stores ``d = max|x|`` (fp16) and every value as a trit ``lroundf(x/d)`` in
{-1, 0, 1}: TQ2_0 two bits each, TQ1_0 five trits per byte (base 3, scaled to a byte by a ceiling
division) and four in each of the last 4 bytes. llama-quantize ignores an importance matrix for
both. A NaN or an infinite ``x/d`` gives the trit 0, as C's ``lroundf`` (``LONG_MIN``) + 1 cut to
``int`` does. Pure numpy. Specification: docs/quantizers.md, "Ternary".
"""

from __future__ import annotations

import numpy as np

from .legacy import as_blocks, fp16_bits

__all__ = ["quantize_tq1_0", "quantize_tq2_0"]

QK_K = 256
_F32 = np.float32
_HALF = _F32(0.5)

BLOCK_TQ1_0 = np.dtype([("qs", "u1", (48,)), ("qh", "u1", (4,)), ("d", "<u2")])
BLOCK_TQ2_0 = np.dtype([("qs", "u1", (64,)), ("d", "<u2")])
assert (BLOCK_TQ1_0.itemsize, BLOCK_TQ2_0.itemsize) == (54, 66)

# TQ1_0's value layout: (first value, values per byte-run, stride between a byte's trits); the
# byte runs take 32, 16 and 4 bytes (qs[0:32], qs[32:48], qh[0:4])
_TQ1_RUNS: tuple[tuple[int, int, int, int], ...] = ((0, 32, 5, 32), (160, 16, 5, 16), (240, 4, 4, 4))


def _block_absmax(xb: np.ndarray) -> np.ndarray:
    """C's ``amax = MAX(amax, fabsf(v))`` scan from 0: a NaN is forgotten at the next value unless it is last."""
    a = np.abs(xb)
    amax = np.max(a, axis=1, initial=_F32(0)) if a.size else np.zeros(xb.shape[0], _F32)
    nan_rows = np.flatnonzero(np.isnan(a).any(axis=1))
    for r in nan_rows:  # rare: only a NaN weight gets here
        last = int(np.flatnonzero(np.isnan(a[r]))[-1])
        amax[r] = np.nan if last == a.shape[1] - 1 else np.max(a[r, last + 1:], initial=_F32(0))
    return amax.astype(_F32, copy=False)


def _trits(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d, ``lroundf(x*id) + 1`` per value as uint8): the shared first half of both quantizers."""
    d = _block_absmax(xb)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        nz = d != 0  # NaN != 0 too: C's ``d ? 1/d : 0`` takes 1/NaN
        idv = np.zeros_like(d)
        np.divide(_F32(1), d, out=idv, where=nz)
        v = xb * idv[:, None]
        r = np.trunc(v)
        up = np.abs(v - r) >= _HALF  # lroundf: half away from zero
        q = r + np.where(up, np.sign(v), _F32(0))
    q[~np.isfinite(v)] = 0  # lroundf's LONG_MIN, plus 1, cut to int: 1 (trit 0)
    return d, (q + _F32(1)).astype(np.uint8)


def quantize_tq1_0(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*256,)`` -> TQ1_0 blocks as bytes ``(n*54,)`` (48 + 4 bytes of trits, fp16 ``d``); ``importance`` ignored, as by ggml."""
    xb = as_blocks(x, QK_K)
    out = np.zeros(xb.shape[0], BLOCK_TQ1_0)
    if xb.shape[0] == 0:
        return out.view(np.uint8)
    d, t = _trits(xb)
    packed = []
    for start, nbytes, per_byte, stride in _TQ1_RUNS:
        q = np.zeros((xb.shape[0], nbytes), np.uint16)
        for n in range(per_byte):
            q = q * 3 + t[:, start + n * stride:start + n * stride + nbytes]
        if per_byte == 4:
            q = q * 3  # the first trit moves to the most significant of five
        packed.append(((q * 256 + 242) // 243).astype(np.uint8))  # ceiling division by 3**5
    out["qs"][:, :32], out["qs"][:, 32:], out["qh"] = packed
    out["d"] = fp16_bits(d)
    return out.view(np.uint8)


def quantize_tq2_0(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*256,)`` -> TQ2_0 blocks as bytes ``(n*66,)`` (64 bytes of 2-bit trits, fp16 ``d``); ``importance`` ignored, as by ggml."""
    xb = as_blocks(x, QK_K)
    out = np.zeros(xb.shape[0], BLOCK_TQ2_0)
    if xb.shape[0] == 0:
        return out.view(np.uint8)
    d, t = _trits(xb)
    t = (t & np.uint8(3)).reshape(-1, 2, 4, 32)  # [block, half, n, m]: value 128*half + 32*n + m
    shifts = (np.arange(4, dtype=np.uint8) * 2)[None, None, :, None]
    out["qs"] = np.bitwise_or.reduce(t << shifts, axis=2).reshape(-1, 64)
    out["d"] = fp16_bits(d)
    return out.view(np.uint8)
