"""ggml tensor types, their block geometry, and the file types the converter can write."""

from __future__ import annotations

from enum import IntEnum


class GGMLType(IntEnum):
    """ggml tensor type ids (ggml.h), the ones this package reads or writes."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


# the plain float types (ggml_is_quantized is false): what convert writes, what quantize reads without
# --allow-requantize, what a file type with no mixes and no fallback stores its matrices in
FLOAT_TYPES: tuple[GGMLType, ...] = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
FLOAT_TYPE_NAMES: tuple[str, ...] = tuple(t.name for t in FLOAT_TYPES)  # as ggml and safetensors spell them

# type ids llama.cpp 0c1e57098 knows: everything below GGML_TYPE_COUNT (ggml.h)
GGML_TYPE_COUNT = 43

# ids that once were ggml types and were removed from GGUF files (ggml.h comments); a file
# carrying one was written by an old or forked tool and will not load.
REMOVED_TYPES: dict[int, str] = {
    4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
    36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8",
}


# type -> (elements per block, bytes per block)
BLOCK_GEOMETRY: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.F64: (1, 8),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20),
    GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q8_1: (32, 36),
    GGMLType.Q2_K: (256, 84),
    GGMLType.Q3_K: (256, 110),
    GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210),
    GGMLType.Q8_K: (256, 292),
    GGMLType.IQ2_XXS: (256, 66),
    GGMLType.IQ2_XS: (256, 74),
    GGMLType.IQ3_XXS: (256, 98),
    GGMLType.IQ1_S: (256, 50),
    GGMLType.IQ4_NL: (32, 18),
    GGMLType.IQ3_S: (256, 110),
    GGMLType.IQ2_S: (256, 82),
    GGMLType.IQ4_XS: (256, 136),
    GGMLType.IQ1_M: (256, 56),
    GGMLType.TQ1_0: (256, 54),
    GGMLType.TQ2_0: (256, 66),
    GGMLType.MXFP4: (32, 17),
    GGMLType.NVFP4: (64, 36),
    GGMLType.Q1_0: (128, 18),
    GGMLType.Q2_0: (64, 18),
}


def tensor_nbytes(ggml_type: GGMLType, ne: tuple[int, ...]) -> int:
    """Bytes of a tensor with ggml shape ``ne`` (ne[0] fastest); ne[0] must fill whole blocks."""
    block, size = BLOCK_GEOMETRY[ggml_type]
    n = 1
    for d in ne:
        n *= d
    if ne and ne[0] % block:
        raise ValueError(f"ne[0]={ne[0]} is not a multiple of the {ggml_type.name} block size {block}")
    return n // block * size


GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32
# llama.cpp's reader limits (ggml/src/gguf.cpp, ggml.h)
GGUF_MAX_STRING_LENGTH = 1 << 30
GGUF_MAX_ARRAY_ELEMENTS = 1 << 30
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # tensor names must be shorter than this (the C struct holds a NUL)
QUANTIZATION_VERSION = 2
