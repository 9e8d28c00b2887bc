"""Bit-exact ports of ggml's 1- and 2-bit reference quantizers: Q1_0 and Q2_0 (``quantize_row_q*_0_ref``).

Q1_0 stores per 128 values ``d = sum|x|/128`` (fp16) and one bit per value, set where ``x >= 0``
(decoded as ``+d`` or ``-d``). Q2_0 stores per 64 values ``d = max|x|`` and ``roundf(x/d) + 1``
clamped to 0..3 in 2 bits (decoded ``(q - 1)*d``); a NaN or infinite ``x/d`` gives 0, as C's
``(int)`` conversion (``INT_MIN``) clamped does. Both ignore an importance matrix, as ggml does.
Pure numpy. Specification: docs/quantizers.md, "Q1_0 and Q2_0".
"""

from __future__ import annotations

import numpy as np

from .legacy import as_blocks, fp16_bits

__all__ = ["quantize_q1_0", "quantize_q2_0"]

QK1_0, QK2_0 = 128, 64
_F32 = np.float32

BLOCK_Q1_0 = np.dtype([("d", "<u2"), ("qs", "u1", (QK1_0 // 8,))])
BLOCK_Q2_0 = np.dtype([("d", "<u2"), ("qs", "u1", (QK2_0 // 4,))])
assert (BLOCK_Q1_0.itemsize, BLOCK_Q2_0.itemsize) == (18, 18)


def quantize_q1_0(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*128,)`` -> Q1_0 blocks as bytes ``(n*18,)`` (fp16 ``d``, 16 bytes of sign bits); ``importance`` ignored, as by ggml."""
    xb = as_blocks(x, QK1_0)
    out = np.zeros(xb.shape[0], BLOCK_Q1_0)
    a = np.abs(xb)
    total = np.zeros(xb.shape[0], _F32)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN sums are C's too
        for j in range(QK1_0):  # C's sequential float sum, not numpy's pairwise one
            total += a[:, j]
        out["d"] = fp16_bits(total / _F32(QK1_0))
    bits = (xb >= 0).reshape(-1, QK1_0 // 8, 8).astype(np.uint8)  # NaN: no bit, as the C comparison
    out["qs"] = np.bitwise_or.reduce(bits << np.arange(8, dtype=np.uint8), axis=2)
    return out.view(np.uint8)


def quantize_q2_0(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 ``(n*64,)`` -> Q2_0 blocks as bytes ``(n*18,)`` (fp16 ``d``, 2-bit codes); ``importance`` ignored, as by ggml."""
    xb = as_blocks(x, QK2_0)
    out = np.zeros(xb.shape[0], BLOCK_Q2_0)
    a = np.abs(xb)
    d = np.max(np.where(np.isnan(a), _F32(0), a), axis=1, initial=_F32(0)) if xb.size else np.zeros(0, _F32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        idv = np.zeros_like(d)
        np.divide(_F32(1), d, out=idv, where=d > 0)
        v = xb * idv[:, None]
        r = np.trunc(v)
        q = r + np.where(np.abs(v - r) >= _F32(0.5), np.sign(v), _F32(0))  # roundf: half away from zero
    q = np.where(np.isfinite(v), np.clip(q + 1, 0, 3), 0).astype(np.uint8)  # (int)NaN/inf = INT_MIN: clamped to 0
    out["d"] = fp16_bits(d)
    out["qs"] = np.bitwise_or.reduce(q.reshape(-1, QK2_0 // 4, 4) << (np.arange(4, dtype=np.uint8) * 2), axis=2)
    return out.view(np.uint8)
