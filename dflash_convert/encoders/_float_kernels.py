"""numba kernels for float conversions that numpy does in several whole-array passes (floats.py).

Compiled on first use and cached on disk like the quantizer kernels (jit.py); the numpy functions
of floats.py give the same words and are the fallback.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

_TWO_TO_MINUS_24 = np.float32(5.960464477539063e-08)


@numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
def _round_to_bf16(u):
    """float32 bits -> bf16 bits: round to nearest even, NaN forced quiet (ggml's narrowing)."""
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return (u >> np.uint32(16)) | np.uint32(0x40)
    return (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)


@numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
def f16_to_bf16(words, out, fbuf, ibuf):
    """float16 words (uint16) -> bfloat16 words in ``out``: as widening to float32 and rounding to
    bf16. One pass of integer selects that vectorise: a normal number, inf or NaN has its exponent
    rebiased (127 - 15; inf/NaN to all ones) and its mantissa moved into place; a zero keeps its
    sign. Subnormals (rare in weights) are fixed in a second, scalar pass: m * 2**-24 is exact in
    float32, and ``fbuf``/``ibuf`` (one float32 and its uint32 view) give its bits."""
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


@intrinsic
def _f16_to_f32(typingctx, bits):
    """The float32 of float16 bits (uint16), exactly as numpy's cast (NaN payloads kept, signalling
    or not), in 32-bit integer IR: numba's own integer arithmetic widens to int64, which halved the
    vector lanes. A normal number, inf or NaN has its exponent rebiased (127 - 15; inf/NaN to all
    ones) and its mantissa moved into place; a subnormal or zero is m * 2**-24 (exact in float32);
    the sign goes on last. Selects only, so a loop of it vectorises."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
        return None

    def codegen(context, builder, signature, args):
        i32, f32 = ir.IntType(32), ir.FloatType()

        def k(v: int) -> ir.Constant:
            return ir.Constant(i32, v)

        h = builder.zext(args[0], i32)
        exponent = builder.and_(h, k(0x7C00))
        u = builder.add(builder.shl(builder.and_(h, k(0x7FFF)), k(13)), k(112 << 23))
        u = builder.select(builder.icmp_unsigned("==", exponent, k(0x7C00)), builder.add(u, k(112 << 23)), u)
        small = builder.fmul(builder.sitofp(builder.and_(h, k(0x3FF)), f32), ir.Constant(f32, 2.0 ** -24))
        u = builder.select(builder.icmp_unsigned("==", exponent, k(0)), builder.bitcast(small, i32), u)
        return builder.bitcast(builder.or_(u, builder.shl(builder.and_(h, k(0x8000)), k(16))), f32)

    return types.float32(bits), codegen


@numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
def widen_f16(words, out):
    """float16 words (uint16) -> float32 ``out``, the values (and bits) numpy's cast gives, in one
    vectorised pass: several times faster than numpy's cast, which converts one value at a time."""
    for i in range(words.shape[0]):
        out[i] = _f16_to_f32(words[i])
