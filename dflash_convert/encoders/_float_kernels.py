"""numba kernels for float conversions that numpy does in several whole-array passes (floats.py).

Compiled on first use and cached on disk like the quantizer kernels (jit.py); the numpy functions
of floats.py give the same words and are the fallback.
"""

from __future__ import annotations

import numba
import numpy as np

_TWO_TO_MINUS_24 = np.float32(5.960464477539063e-08)


@numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
def _round_to_bf16(u):
    """float32 bits -> bf16 bits: round to nearest even, NaN forced quiet (ggml's narrowing)."""
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return (u >> np.uint32(16)) | np.uint32(0x40)
    return (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)


@numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
def f16_to_bf16(words, out, fbuf, ibuf):
    """float16 words -> bfloat16 words in ``out``, as widening to float32 and rounding to bf16.

    Integer selects rebias normals/inf/NaN; subnormals get a scalar pass (m * 2**-24 is exact in float32).
    """
    n = words.shape[0]
    subnormals = 0
    for i in range(n):
        h = np.uint32(words[i])
        e = h & np.uint32(0x7C00)
        sign = h & np.uint32(0x8000)
        u = ((h & np.uint32(0x7FFF)) << np.uint32(13)) + np.uint32(112 << 23)
        u = u + np.uint32(112 << 23) if e == np.uint32(0x7C00) else u
        r = _round_to_bf16(u | (sign << np.uint32(16)))
        out[i] = np.uint16(sign if (h & np.uint32(0x7FFF)) == 0 else r)
        subnormals += 1 if e == 0 and (h & np.uint32(0x3FF)) != 0 else 0
    if subnormals:
        for i in range(n):
            h = np.uint32(words[i])
            if (h & np.uint32(0x7C00)) == 0 and (h & np.uint32(0x3FF)) != 0:
                fbuf[0] = np.float32(h & np.uint32(0x3FF)) * _TWO_TO_MINUS_24
                out[i] = np.uint16(_round_to_bf16(ibuf[0] | ((h & np.uint32(0x8000)) << np.uint32(16))))

