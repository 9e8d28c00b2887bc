"""Encoders: raw source words of one chunk -> the bytes of a ggml type, keyed by (source, destination).

Float-to-float conversions live in ``floats``; each quantized type has its module, fed float32;
``COPY`` passes bytes through (migrate, and a tensor quantize keeps). Kept on purpose: upstream sends
BF16 through float32 and back, which quiets signalling NaNs, so BF16 -> BF16 gets ``quiet_bf16_nans``.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable

import numpy as np

from ..format.ggml import BLOCK_GEOMETRY, GGMLType
from . import jit
from .floats import FLOAT_WORDS, bf16_to_f16, f16_to_bf16, f32_to_bf16, quiet_bf16_nans, to_f16, widen_to_f32
from .iq2 import IMPORTANCE_REQUIRED, quantize_iq1_m, quantize_iq1_s, quantize_iq2_s, quantize_iq2_xs, quantize_iq2_xxs
from .iq3 import quantize_iq3_s, quantize_iq3_xxs
from .iq4 import quantize_iq4_nl, quantize_iq4_xs
from .kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from .kquants_low import quantize_q2_k, quantize_q3_k
from .legacy import quantize_from_f16, quantize_q4_0, quantize_q4_1, quantize_q5_0, quantize_q5_1
from .low_bit import quantize_q1_0, quantize_q2_0
from .q8_0 import quantize_q8_0
from .ternary import quantize_tq1_0, quantize_tq2_0

Encoder = Callable[[np.ndarray], np.ndarray]


def COPY(raw: np.ndarray) -> np.ndarray:  # noqa: N802 - a constant-like encoder
    """Bytes through unchanged."""
    return raw


# quantized destination -> float32 chunk (whole blocks) -> block bytes
QUANTIZERS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.Q8_0: quantize_q8_0,
    GGMLType.Q4_0: quantize_q4_0,
    GGMLType.Q4_1: quantize_q4_1,
    GGMLType.Q5_0: quantize_q5_0,
    GGMLType.Q5_1: quantize_q5_1,
    GGMLType.Q2_K: quantize_q2_k,
    GGMLType.Q3_K: quantize_q3_k,
    GGMLType.Q4_K: quantize_q4_k,
    GGMLType.Q5_K: quantize_q5_k,
    GGMLType.Q6_K: quantize_q6_k,
    GGMLType.IQ4_NL: quantize_iq4_nl,
    GGMLType.IQ4_XS: quantize_iq4_xs,
    GGMLType.TQ1_0: quantize_tq1_0,
    GGMLType.TQ2_0: quantize_tq2_0,
    GGMLType.IQ3_XXS: quantize_iq3_xxs,
    GGMLType.IQ3_S: quantize_iq3_s,
    GGMLType.Q1_0: quantize_q1_0,
    GGMLType.Q2_0: quantize_q2_0,
    GGMLType.IQ2_XXS: quantize_iq2_xxs,
    GGMLType.IQ2_XS: quantize_iq2_xs,
    GGMLType.IQ2_S: quantize_iq2_s,
    GGMLType.IQ1_S: quantize_iq1_s,
    GGMLType.IQ1_M: quantize_iq1_m,
}

# float destination -> float32 chunk -> words
_FROM_F32: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.F32: lambda x: x,
    GGMLType.F16: to_f16,
    GGMLType.BF16: f32_to_bf16,
}

_LEGACY_FROM_F16 = ("Q4_0", "Q4_1", "Q5_0", "Q5_1")

# conversions that skip float32 (faster, same bits)
_DIRECT: dict[tuple[str, GGMLType], Encoder] = {
    ("F16", GGMLType.F16): COPY,
    ("F32", GGMLType.F32): COPY,
    ("BF16", GGMLType.BF16): quiet_bf16_nans,
    ("BF16", GGMLType.F16): bf16_to_f16,
    ("F16", GGMLType.BF16): f16_to_bf16,
    ("I64", GGMLType.I64): COPY,
    ("I32", GGMLType.I32): COPY,
}


def dequantizer(src: str, row_length: int) -> Callable[[np.ndarray], np.ndarray]:
    """Block bytes of quantized type ``src`` -> float32, with gguf-py's dequantizer (ggml's arithmetic)."""
    # gguf-py's dequantizers: only requantizing needs them
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType(int(GGMLType[src]))
    block, size = BLOCK_GEOMETRY[GGMLType[src]]
    row_bytes = row_length // block * size
    return lambda raw: dequantize(raw.view(np.uint8).reshape(-1, row_bytes), qtype).reshape(-1).astype(np.float32, copy=False)


@functools.cache
def takes_importance(dst: GGMLType) -> bool:
    """Whether ``QUANTIZERS[dst]`` takes an importance matrix (``quantize(x, importance)``); float types never need one."""
    return dst in QUANTIZERS and "importance" in inspect.signature(QUANTIZERS[dst]).parameters


def encoder(src: str, dst: GGMLType, *, row_length: int | None = None, importance: np.ndarray | None = None) -> Encoder:
    """The encoder from source element type ``src`` to ggml type ``dst``; ValueError when there is none.

    ``importance`` (float32 [row_length]) goes to the quantizer as ``QUANTIZERS[dst](x, importance)``; chunks
    are whole rows, so it is tiled row by row. Float destinations ignore it."""
    if importance is not None and dst in QUANTIZERS:
        if not takes_importance(dst):
            raise ValueError(f"the {dst.name} quantizer takes no importance matrix yet")
        widen_to = _widening(src, row_length)
        quantize_w = QUANTIZERS[dst]
        return lambda raw: quantize_w(np.ascontiguousarray(widen_to(raw), dtype=np.float32), importance)
    direct = _DIRECT.get((src, dst))
    if direct is not None:
        return direct
    if src == "F16" and dst.name in _LEGACY_FROM_F16:
        # the legacy kernels widen F16 tile by tile: the whole-tensor numpy widening cost as much as quantizing
        return quantize_from_f16(dst.name)
    if src not in FLOAT_WORDS and src in GGMLType.__members__ and BLOCK_GEOMETRY[GGMLType[src]][0] > 1 and row_length:
        widen = dequantizer(src, row_length)
        if dst in _FROM_F32:
            narrow = _FROM_F32[dst]
            return lambda raw: narrow(widen(raw))
        if dst in QUANTIZERS:
            quantize_q = QUANTIZERS[dst]
            return lambda raw: quantize_q(np.ascontiguousarray(widen(raw)))
    if src in FLOAT_WORDS:
        if dst in _FROM_F32:
            narrow = _FROM_F32[dst]
            return lambda raw: narrow(widen_to_f32(raw, src))
        if dst in QUANTIZERS:
            quantize = QUANTIZERS[dst]
            return lambda raw: quantize(np.ascontiguousarray(widen_to_f32(raw, src), dtype=np.float32))
    raise ValueError(f"no encoder from {src} to {dst.name}")


def _widening(src: str, row_length: int | None) -> Callable[[np.ndarray], np.ndarray]:
    """Source words (float, or quantized blocks with ``row_length``) -> float32; ValueError when there is no way."""
    if src in FLOAT_WORDS:
        return lambda raw: widen_to_f32(raw, src)
    if src in GGMLType.__members__ and BLOCK_GEOMETRY[GGMLType[src]][0] > 1 and row_length:
        return dequantizer(src, row_length)
    raise ValueError(f"no encoder from {src}")


def can_encode(src: str, dst: GGMLType) -> bool:
    """Whether a tensor of element type ``src`` can be written as ``dst``."""
    try:
        encoder(src, dst)
    except ValueError:
        return False
    return True


def warm_up_kernels() -> float:
    """Compile or load every numba kernel (8 zero super-blocks per quantizer); returns the seconds taken, 0 without numba."""
    if not jit.jit_available():
        return 0.0
    t0 = time.perf_counter()
    block = np.zeros(256 * 8, np.float32)
    ones = np.ones(256, np.float32)  # one 256-value row: the importance paths are other kernels
    for t, quantize in QUANTIZERS.items():
        if t.name not in IMPORTANCE_REQUIRED:
            quantize(block)
        if takes_importance(t):
            quantize(block, ones)
    words = block.astype(np.float16)  # the kernels that read F16 words themselves
    for name in _LEGACY_FROM_F16:
        encoder("F16", GGMLType[name])(words)
    encoder("F16", GGMLType.BF16)(words)
    widen_to_f32(words, "F16")  # the K-quants and IQ4 from F16
    return time.perf_counter() - t0


__all__ = ["COPY", "IMPORTANCE_REQUIRED", "QUANTIZERS", "Encoder", "can_encode", "encoder", "takes_importance",
           "warm_up_kernels"]
