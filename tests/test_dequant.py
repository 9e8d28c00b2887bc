"""Torch dequantizers (runtime/dequant.py) against gguf-py's numpy reference, bit for bit.

The in-process runner must see exactly the weights llama.cpp would: results are compared as
float32 bit patterns (stricter than torch.equal: -0.0 and +0.0 differ). Blocks come from gguf-py's
quantizer where it has one, and otherwise (and in addition) from random bytes with finite fp16
scale fields, which reach every code, scale and sign combination rather than only those a
quantizer happens to pick.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from dflash_convert.format.ggml import BLOCK_GEOMETRY, GGMLType
from dflash_convert.runtime import dequant
from dflash_convert.runtime.dequant import SUPPORTED_TYPES, dequantize

# Byte offsets of the fp16 fields in each block, read off the structs in ggml-common.h (kept apart
# from dequant.BLOCK_FIELDS so a wrong offset there cannot hide by generating matching data here).
FP16_OFFSETS: dict[GGMLType, tuple[int, ...]] = {
    GGMLType.Q4_0: (0,),
    GGMLType.Q4_1: (0, 2),
    GGMLType.Q5_0: (0,),
    GGMLType.Q5_1: (0, 2),
    GGMLType.Q8_0: (0,),
    GGMLType.Q2_K: (80, 82),
    GGMLType.Q3_K: (108,),
    GGMLType.Q4_K: (0, 2),
    GGMLType.Q5_K: (0, 2),
    GGMLType.Q6_K: (208,),
    GGMLType.IQ4_NL: (0,),
    GGMLType.IQ4_XS: (0,),
    GGMLType.TQ1_0: (52,),
    GGMLType.TQ2_0: (64,),
    GGMLType.IQ3_XXS: (0,),
    GGMLType.IQ3_S: (0,),
    GGMLType.IQ2_XXS: (0,),
    GGMLType.IQ2_XS: (0,),
    GGMLType.IQ2_S: (0,),
    GGMLType.IQ1_S: (0,),
}
BLOCK_TYPES = tuple(FP16_OFFSETS)
QUANTIZABLE = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0)  # gguf-py can quantize these
FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
# What the brief requires; the module may support more (F64, I8, I16).
REQUIRED = {*BLOCK_TYPES, *FLOAT_TYPES, GGMLType.I32, GGMLType.I64}

_HALF_BITS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
FINITE_F16_BITS = _HALF_BITS[(_HALF_BITS & 0x7C00) != 0x7C00]  # every finite fp16, subnormals and -0 included
# scales worth pinning: +0, -0, smallest subnormal, largest subnormal, 1, largest finite, its negative
EDGE_F16_BITS = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x3C00, 0x7BFF, 0xFBFF], dtype=np.uint16)
FINITE_BF16_BITS = _HALF_BITS[(_HALF_BITS & 0x7F80) != 0x7F80]

# (rows..., row) shapes per block size: multi-row 2-D and a 3-D one
SHAPES: dict[int, tuple[tuple[int, ...], ...]] = {
    32: ((1, 32), (3, 64), (2, 3, 96), (7, 4096)),
    256: ((1, 256), (3, 512), (2, 3, 256), (5, 2048)),
}


def _bits(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    """float32 values -> their int32 bit patterns, for exact comparison."""
    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x.cpu().contiguous()
    assert t.dtype == torch.float32
    return t.view(torch.int32)


def random_blocks(t: GGMLType, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Uniform random block bytes with every fp16 field a finite fp16 (first blocks get the edge cases).

    Returns uint8 shaped like gguf stores it: shape[:-1] + (bytes per row,).
    """
    rng = np.random.default_rng(seed)
    block, size = BLOCK_GEOMETRY[t]
    n_blocks = int(np.prod(shape)) // block
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for k, off in enumerate(FP16_OFFSETS[t]):
        half = rng.choice(FINITE_F16_BITS, n_blocks)
        edge = np.roll(EDGE_F16_BITS, k)[:n_blocks]  # differing d/dmin pairs on the edge blocks
        half[: edge.size] = edge
        b[:, off : off + 2] = half.view(np.uint8).reshape(n_blocks, 2)
    return b.reshape(*shape[:-1], shape[-1] // block * size)


def reference(data: np.ndarray, t: GGMLType) -> np.ndarray:
    return quants.dequantize(data, GGMLQuantizationType(int(t)))


def check(data: np.ndarray, t: GGMLType, shape: tuple[int, ...], device: str = "cpu") -> None:
    raw = torch.from_numpy(np.ascontiguousarray(data).reshape(-1)).to(device)
    got = dequantize(raw, t, shape)
    want = reference(data, t)
    assert got.device.type == device
    assert got.dtype == torch.float32
    assert tuple(got.shape) == shape == want.shape
    assert torch.equal(_bits(got), _bits(want)), f"{t.name} {shape}: {(_bits(got) != _bits(want)).sum()} values differ"


def _weights(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Weights with varied magnitudes, plus an all-zero block and exact ties for the quantizers."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    x = (rng.standard_normal(n) * rng.uniform(1e-4, 30, n)).astype(np.float32)
    x[:32] = 0
    if n >= 96:
        x[32:64] = 0.5
        x[64:96] = -np.arange(32, dtype=np.float32) - 0.5
    return x.reshape(shape)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.name)
def test_random_blocks_match_gguf_py(t: GGMLType) -> None:
    block = BLOCK_GEOMETRY[t][0]
    for i, shape in enumerate(SHAPES[block]):
        check(random_blocks(t, shape, seed=i), t, shape)


@pytest.mark.parametrize("t", QUANTIZABLE, ids=lambda t: t.name)
def test_gguf_py_quantized_blocks_match(t: GGMLType) -> None:
    for i, shape in enumerate(SHAPES[32]):
        data = quants.quantize(_weights(shape, seed=i), GGMLQuantizationType(int(t)))
        check(data, t, shape)


NATIVE = {GGMLType.F32: torch.float32, GGMLType.F16: torch.float16, GGMLType.BF16: torch.bfloat16}


def float_case(t: GGMLType) -> tuple[np.ndarray, tuple[int, ...], np.ndarray]:
    """(bytes, shape, expected float32): F16 and BF16 every finite bit pattern; F32 random values plus signed zeros and subnormals."""
    if t == GGMLType.F32:
        f32 = np.random.default_rng(0).standard_normal(4 * 1024).astype(np.float32) * 1e3
        f32[:4] = [0.0, -0.0, 1e-45, -3.4e38]
        data = f32.view(np.uint8).reshape(4, -1)
        return data, (4, 1024), data.view(np.float32)
    bits = FINITE_F16_BITS if t == GGMLType.F16 else FINITE_BF16_BITS
    n = bits.size // 64 * 64
    data = bits[:n].view(np.uint8).reshape(2, 8, -1)
    return data, (2, 8, n // 16), reference(data, t)


@pytest.mark.parametrize("t", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_types_match_gguf_py(t: GGMLType) -> None:
    data, shape, want = float_case(t)
    raw = torch.from_numpy(data.reshape(-1).copy())
    got = dequantize(raw, t, shape)
    assert got.dtype == torch.float32 and tuple(got.shape) == shape
    assert torch.equal(_bits(got), _bits(want))
    # asking for the stored dtype is a pure reinterpretation of the bytes
    native = dequantize(raw, t, shape, dtype=NATIVE[t])
    assert native.dtype == NATIVE[t]
    assert native.view(torch.uint8).numpy().tobytes() == data.tobytes()


INT_NP_DTYPES = {GGMLType.I8: np.int8, GGMLType.I16: np.int16, GGMLType.I32: np.int32, GGMLType.I64: np.int64}


@pytest.mark.parametrize("t", INT_NP_DTYPES, ids=lambda t: t.name)
def test_integer_types_come_back_as_int64(t: GGMLType) -> None:
    np_dtype = INT_NP_DTYPES[t]
    info = np.iinfo(np_dtype)
    vals = np.random.default_rng(1).integers(info.min, info.max, size=(3, 40), dtype=np_dtype, endpoint=True)
    vals[0, :2] = (info.min, info.max)
    got = dequantize(torch.from_numpy(vals.view(np.uint8).reshape(-1).copy()), t, (3, 40), dtype=torch.float16)  # dtype is ignored
    assert got.dtype == torch.int64
    assert torch.equal(got, torch.from_numpy(vals.astype(np.int64)))


def test_f64() -> None:
    vals = np.array([[0.1, -2.5e300, 5e-324, -0.0]])
    got = dequantize(torch.from_numpy(vals.view(np.uint8).reshape(-1).copy()), GGMLType.F64, (1, 4), dtype=torch.float64)
    assert torch.equal(got, torch.from_numpy(vals))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q6_K, GGMLType.IQ4_XS], ids=lambda t: t.name)
def test_other_dtypes_round_the_float32_result(t: GGMLType, dtype: torch.dtype) -> None:
    shape = SHAPES[BLOCK_GEOMETRY[t][0]][2]
    raw = torch.from_numpy(random_blocks(t, shape, seed=5).reshape(-1))
    got = dequantize(raw, t, shape, dtype=dtype)
    assert got.dtype == dtype
    assert torch.equal(got, dequantize(raw, t, shape).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("t", [GGMLType.Q5_1, GGMLType.Q3_K], ids=lambda t: t.name)
def test_chunked_path(monkeypatch: pytest.MonkeyPatch, t: GGMLType, dtype: torch.dtype) -> None:
    """Tensors larger than one CPU chunk, with a ragged last chunk, give the same values."""
    block = BLOCK_GEOMETRY[t][0]
    shape = (7, 3 * block)
    data = random_blocks(t, shape, seed=9)
    want = torch.from_numpy(reference(data, t)).to(dtype)
    monkeypatch.setattr(dequant, "_CHUNK_VALUES_CPU", 4 * block)  # 21 blocks in chunks of 4
    got = dequantize(torch.from_numpy(data.reshape(-1)), t, shape, dtype=dtype)
    assert torch.equal(got, want)


def test_empty_and_unaligned_inputs() -> None:
    assert dequantize(torch.empty(0, dtype=torch.uint8), GGMLType.Q4_K, (0, 256)).shape == (0, 256)
    assert dequantize(torch.empty(0, dtype=torch.uint8), GGMLType.F32, (4, 0)).shape == (4, 0)
    # a slice at an odd offset of a larger buffer (say, a file mapping) is copied, not refused
    vals = np.arange(12, dtype=np.float32)
    buf = torch.from_numpy(np.concatenate([np.zeros(1, np.uint8), vals.view(np.uint8)]))
    assert torch.equal(dequantize(buf[1:], GGMLType.F32, (3, 4)), torch.from_numpy(vals).reshape(3, 4))
    data = random_blocks(GGMLType.Q6_K, (2, 256), seed=3)
    buf = torch.from_numpy(np.concatenate([np.zeros(3, np.uint8), data.reshape(-1)]))
    assert torch.equal(_bits(dequantize(buf[3:], GGMLType.Q6_K, (2, 256))), _bits(reference(data, GGMLType.Q6_K)))


def test_wrong_byte_count() -> None:
    raw = torch.zeros(2 * 18 + 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"Q4_0 tensor of shape \(1, 64\) needs 36 bytes, got 37"):
        dequantize(raw, GGMLType.Q4_0, (1, 64))
    with pytest.raises(ValueError, match="needs 144 bytes, got 143"):
        dequantize(torch.zeros(143, dtype=torch.uint8), GGMLType.Q4_K, (256,))
    with pytest.raises(ValueError, match="needs 16 bytes"):
        dequantize(torch.zeros(8, dtype=torch.uint8), GGMLType.F32, (2, 2))


def test_row_not_whole_blocks() -> None:
    with pytest.raises(ValueError, match="not a multiple of the Q4_K block size 256"):
        dequantize(torch.zeros(144, dtype=torch.uint8), GGMLType.Q4_K, (2, 128))
    with pytest.raises(ValueError, match="scalar"):
        dequantize(torch.zeros(18, dtype=torch.uint8), GGMLType.Q4_0, ())


def test_bad_raw() -> None:
    with pytest.raises(ValueError, match="1-D torch.uint8"):
        dequantize(torch.zeros(36, dtype=torch.int8), GGMLType.Q4_0, (64,))
    with pytest.raises(ValueError, match="1-D torch.uint8"):
        dequantize(torch.zeros(2, 18, dtype=torch.uint8), GGMLType.Q4_0, (64,))


@pytest.mark.parametrize("type_id, name", [(int(GGMLType.MXFP4), "MXFP4"), (int(GGMLType.Q8_K), "Q8_K"), (4, r"id 4 \(Q4_2, removed"), (999, "id 999")])
def test_unsupported_type(type_id: int, name: str) -> None:
    with pytest.raises(ValueError, match=f"cannot dequantize ggml type {name}"):
        dequantize(torch.zeros(66, dtype=torch.uint8), type_id, (256,))


def test_supported_types() -> None:
    assert REQUIRED <= SUPPORTED_TYPES
    assert all(isinstance(t, int) for t in SUPPORTED_TYPES)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("t", (*BLOCK_TYPES, *FLOAT_TYPES), ids=lambda t: t.name)
def test_cuda_matches_gguf_py(t: GGMLType) -> None:
    if t in FLOAT_TYPES:
        data, shape, want = float_case(t)
        got = dequantize(torch.from_numpy(data.reshape(-1).copy()).cuda(), t, shape)
        assert got.is_cuda and torch.equal(_bits(got), _bits(want))
        return
    block = BLOCK_GEOMETRY[t][0]
    for i, shape in enumerate(SHAPES[block]):
        check(random_blocks(t, shape, seed=100 + i), t, shape, device="cuda")
    # large enough for several blocks per thread, and a half-precision output
    shape = (64, 16 * 256)
    data = random_blocks(t, shape, seed=7)
    got = dequantize(torch.from_numpy(data.reshape(-1)).cuda(), t, shape, dtype=torch.float16)
    assert got.is_cuda and torch.equal(got.cpu(), torch.from_numpy(reference(data, t)).to(torch.float16))
