"""ggml's Q8_0: per 32 values an f16 scale and 32 int8, bit-exact with quantize_row_q8_0_ref."""

from __future__ import annotations

import numpy as np

_SIGN = np.uint32(0x80000000)
# Bits of the float32 just below 0.5. Adding it (with the value's sign) and truncating is C
# roundf(): adding 0.5 itself would round 0.49999997 up to 1.
_BELOW_HALF_BITS = np.float32(np.nextafter(np.float32(0.5), np.float32(0))).view(np.uint32)


def quantize_q8_0(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 (n*32,) -> Q8_0 blocks as bytes (n*34,): per 32 values an f16 scale and 32 int8.

    Same arithmetic as ggml's quantize_row_q8_0_ref: d = amax/127, q = roundf(x * (1/d)); ``importance``
    is ignored, as ggml's quantize_q8_0 ignores it.
    """
    b = x.reshape(-1, 32)
    a = np.abs(b)
    # max of non-negative floats == max of their bit patterns as int32, and numpy's integer
    # row reduction is faster; a NaN (largest pattern) still wins, as with a float max
    amax = a.view(np.int32).max(axis=1).view(np.float32)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.float32(1) / d
    inv[d == 0] = 0
    np.multiply(b, inv[:, None], out=a)
    a += ((a.view(np.uint32) & _SIGN) | _BELOW_HALF_BITS).view(np.float32)
    out = np.empty((b.shape[0], 34), dtype=np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
        out[:, 2:] = a.astype(np.int8).view(np.uint8)  # float -> int truncates toward zero
    return out.reshape(-1)
