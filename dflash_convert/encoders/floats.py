"""Element conversions between float types (F64, F32, F16, BF16), chunk by chunk.

Bit-exact with llama.cpp's converter (non-F16/F32 widened to F32, narrowed round-to-nearest-even).
Each function takes a 1-D chunk of raw words (BF16 as uint16), so a tensor streams in pieces. Pure
numpy, whose kernels release the GIL: chunks run on a thread pool (pipeline.py).
"""

from __future__ import annotations

import numpy as np

from .jit import float_kernels, legacy_kernels  # numba itself is imported only when a conversion asks for it

# element types whose raw words these functions read (the names of safetensors and ggml alike)
FLOAT_WORDS: tuple[str, ...] = ("F64", "F32", "F16", "BF16")


def widen_to_f32(raw: np.ndarray, src_dtype: str) -> np.ndarray:
    """Raw safetensors words -> float32 (exact). BF16 arrives as uint16 words."""
    if src_dtype == "BF16":
        w = np.empty(raw.size, dtype=np.uint32)
        np.left_shift(raw, 16, out=w, dtype=np.uint32)
        return w.view(np.float32)
    if src_dtype == "F32":
        return raw
    if src_dtype == "F16":
        k = legacy_kernels()
        if k is not None:  # numpy's cast converts one value at a time; the kernel is vectorised
            words = np.ascontiguousarray(raw).view(np.uint16).reshape(-1)
            out = np.empty(words.shape[0], dtype=np.float32)
            k.widen_f16(words, out)
            return out.reshape(np.shape(raw))
        return raw.astype(np.float32)
    if src_dtype == "F64":
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
    """Float values as F16, overflowing to inf as ggml does."""
    with np.errstate(over="ignore"):  # overflow to inf is the defined result, as upstream
        return x.astype(np.float16)


def f16_to_bf16(words: np.ndarray) -> np.ndarray:
    """float16 words -> bfloat16 words, equal to widening to float32 and rounding to bf16 as ggml does
    (round to nearest even, NaN forced quiet): one pass in the numba kernel where it is available,
    else two numpy passes."""
    k = float_kernels()
    if k is None:
        return f32_to_bf16(widen_to_f32(words, "F16"))
    h = np.ascontiguousarray(words).view(np.uint16).reshape(-1)
    out = np.empty(h.shape[0], dtype=np.uint16)
    fbuf = np.empty(1, dtype=np.float32)
    k.f16_to_bf16(h, out, fbuf, fbuf.view(np.uint32))
    return out


def bf16_to_f16(words: np.ndarray) -> np.ndarray:
    """bfloat16 words -> float16 words, equal to widening to float32 and rounding to f16 (RNE)."""
    e = (words >> 7) & np.uint16(0xFF)
    out = (words & np.uint16(0x8000)) | ((e - np.uint16(112)) << 10) | ((words & np.uint16(0x7F)) << 3)
    slow = np.flatnonzero((e < 113) | (e > 142))
    if slow.size:
        out[slow] = to_f16((words[slow].astype(np.uint32) << 16).view(np.float32)).view(np.uint16)
    return out
