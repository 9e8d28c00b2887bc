"""Element conversions between checkpoint dtypes and ggml output types, chunk by chunk.

Results are bit-exact with llama.cpp's converter (which widens everything that is not F16/F32 to
F32, then narrows with round-to-nearest-even) and with ggml's reference Q8_0 quantizer. Each
function takes a 1-D chunk, so callers stream a tensor in pieces of any size that is a multiple
of the block size. Pure numpy: its element-wise kernels release the GIL, so chunks run on all
cores from a thread pool (plan.py), and importing it costs a tenth of torch's memory.
"""

from __future__ import annotations

import numpy as np

from .format.ggml import GGMLType

_SIGN = np.uint32(0x80000000)
# Bits of the float32 just below 0.5. Adding it (with the value's sign) and truncating is C
# roundf(): adding 0.5 itself would round 0.49999997 up to 1.
_BELOW_HALF_BITS = np.float32(np.nextafter(np.float32(0.5), np.float32(0))).view(np.uint32)


def widen_to_f32(raw: np.ndarray, src_dtype: str) -> np.ndarray:
    """Raw safetensors words -> float32 (exact). BF16 arrives as uint16 words."""
    if src_dtype == "BF16":
        w = np.empty(raw.size, dtype=np.uint32)
        np.left_shift(raw, 16, out=w, dtype=np.uint32)
        return w.view(np.float32)
    if src_dtype == "F32":
        return raw
    if src_dtype in ("F16", "F64"):
        return raw.astype(np.float32)
    raise ValueError(f"cannot convert {src_dtype} to a float type")


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 words: round to nearest even, NaN forced quiet, as ggml does."""
    u = x.view(np.uint32)
    r = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return r


def quiet_bf16_nans(words: np.ndarray) -> np.ndarray:
    """bfloat16 words that upstream sends through float32 and back: only signalling NaNs change."""
    nan = (words & np.uint16(0x7FFF)) > np.uint16(0x7F80)
    if nan.any():
        words = words.copy()
        words[nan] |= np.uint16(0x40)
    return words


def to_f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # overflow to inf is the defined result, as upstream
        return x.astype(np.float16)


def bf16_to_f16(words: np.ndarray) -> np.ndarray:
    """bfloat16 words -> float16 words, equal to widening to float32 and rounding to f16 (RNE).

    Where the value is a normal f16 number the conversion is exact (bf16 has 7 mantissa bits,
    f16 has 10): only the exponent is rebiased and the mantissa shifted, in integer ops, 3x
    faster than numpy's float cast. The rest (f16 subnormals and zero, overflow, inf, NaN: about
    0.2% of typical weights) goes through the float cast.
    """
    e = (words >> 7) & np.uint16(0xFF)
    out = (words & np.uint16(0x8000)) | ((e - np.uint16(112)) << 10) | ((words & np.uint16(0x7F)) << 3)
    slow = np.flatnonzero((e < 113) | (e > 142))
    if slow.size:
        out[slow] = to_f16((words[slow].astype(np.uint32) << 16).view(np.float32)).view(np.uint16)
    return out


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 (n*32,) -> Q8_0 blocks as bytes (n*34,): per 32 values an f16 scale and 32 int8.

    Same arithmetic as ggml's quantize_row_q8_0_ref: d = amax/127, q = roundf(x * (1/d)).
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


def encode(raw: np.ndarray, src_dtype: str, out_type: GGMLType) -> np.ndarray:
    """Raw source words of one chunk -> the output type's bytes (as a numpy array)."""
    if out_type == GGMLType.BF16 and src_dtype == "BF16":
        return quiet_bf16_nans(raw)
    if out_type == GGMLType.F16 and src_dtype == "F16":
        return raw
    if out_type == GGMLType.F16 and src_dtype == "BF16":
        return bf16_to_f16(raw)
    x = widen_to_f32(raw, src_dtype)
    if out_type == GGMLType.F32:
        return x
    if out_type == GGMLType.F16:
        return to_f16(x)
    if out_type == GGMLType.BF16:
        return f32_to_bf16(x)
    if out_type == GGMLType.Q8_0:
        return quantize_q8_0(x)
    raise ValueError(f"output type {out_type.name} is not produced by the converter")
