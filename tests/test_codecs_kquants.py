"""Q4_K / Q5_K / Q6_K quantizers: bit-identical with ggml's reference quantizers, and sane round trips.

The oracle is ggml itself (``quantize_row_q{4,5,6}_K_ref`` through ``ggml_quantize_chunk`` with no
importance matrix, i.e. what llama-quantize runs), so those tests carry the ``runtime`` marker.
The fast tier still runs the code: layout, validation, tiling, the summation-order fallback, use
from a thread pool, and closeness after dequantizing with gguf-py.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from dflash_convert.encoders import kquants
from dflash_convert.encoders.kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from dflash_convert.format.ggml import GGMLType

pytestmark = pytest.mark.usefixtures("quantizer_backend")  # every test on both backends (conftest)

QK_K = 256
_KQ_FIELDS = [("d", 0, 2), ("dmin", 2, 4), ("scales", 4, 16)]

# name -> (quantizer, ggml type, gguf-py type, block bytes, [(field, first byte, end byte)])
TYPES: dict[str, tuple[Callable[[np.ndarray], np.ndarray], GGMLType, GGMLQuantizationType, int, list[tuple[str, int, int]]]] = {
    "q4_k": (quantize_q4_k, GGMLType.Q4_K, GGMLQuantizationType.Q4_K, 144, [*_KQ_FIELDS, ("qs", 16, 144)]),
    "q5_k": (quantize_q5_k, GGMLType.Q5_K, GGMLQuantizationType.Q5_K, 176, [*_KQ_FIELDS, ("qh", 16, 48), ("qs", 48, 176)]),
    "q6_k": (quantize_q6_k, GGMLType.Q6_K, GGMLQuantizationType.Q6_K, 210, [("ql", 0, 128), ("qh", 128, 192), ("scales", 192, 208), ("d", 208, 210)]),
}
# closeness after a round trip, for well-behaved data: per super-block max |error| / max |x|, and
# RMS error / std (measured on the data below: Q4_K ~0.08 and ~0.07-0.08, Q5_K ~0.045 and ~0.04,
# Q6_K ~0.02-0.04 and ~0.02)
CLOSE = {"q4_k": (0.12, 0.10), "q5_k": (0.06, 0.05), "q6_k": (0.06, 0.03)}


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal_scaled() -> np.ndarray:
    """64 super-blocks of N(0,1), each scaled by its own factor, log-uniform in 1e-8..1e4."""
    r = _rng(1)
    return r.standard_normal((64, QK_K)) * np.exp(r.uniform(np.log(1e-8), np.log(1e4), (64, 1)))


def _moderate_scales() -> np.ndarray:
    """Like ``_normal_scaled`` within 1e-3..1e3, where the fp16 super-scales neither underflow nor overflow."""
    r = _rng(2)
    return r.standard_normal((64, QK_K)) * np.exp(r.uniform(np.log(1e-3), np.log(1e3), (64, 1)))


def _sub_block_scales() -> np.ndarray:
    """Every 16-value group its own magnitude (1e-10..1e5): 6-bit scales round to 0 (the kept search levels), or saturate."""
    r = _rng(3)
    return r.standard_normal((32, 16, 16)) * np.exp(r.uniform(np.log(1e-10), np.log(1e5), (32, 16, 1)))


def _constant() -> np.ndarray:
    """Whole super-blocks constant (0, positive, negative), then constant and zero groups among noise."""
    blocks = [np.full(QK_K, v) for v in (0.0, -0.0, 0.37, 1.0, -1.0, -2.5, 3.25, -1e-3, 7e4)]
    r = _rng(4)
    mixed = r.standard_normal((4, 16, 16))
    mixed[:, ::3] = r.standard_normal((4, 6, 1)) * 5  # constant 16-value groups
    mixed[:, 1::5] = 0  # zero groups
    halves = r.standard_normal((4, 8, 32))
    halves[:, ::2] = r.uniform(-3, 3, (4, 4, 1))  # constant 32-value groups (Q4_K/Q5_K's early return when <= 0)
    return np.concatenate([*blocks, mixed.ravel(), halves.ravel()])


def _outlier() -> np.ndarray:
    """One huge value per super-block: the other groups' scales quantize to 0."""
    r = _rng(5)
    x = r.standard_normal((8, QK_K)) * 0.01
    x[np.arange(8), r.integers(0, QK_K, 8)] = [1e4, -1e4, 50, -50, 1e3, 3, -3, 1e6]
    return x


def _signed() -> np.ndarray:
    """All-positive and all-negative super-blocks, near zero and offset from it."""
    r = _rng(6)
    a = np.abs(r.standard_normal((6, QK_K)))
    return np.concatenate([a[:3].ravel(), -a[3:].ravel(), a[:2].ravel() + 10, -a[2:4].ravel() - 10])


def _ties() -> np.ndarray:
    """Values on small binary grids: x*iscale and x/d land on .5 exactly, and the max searches tie."""
    r = _rng(7)
    grid = r.integers(-8, 9, (16, QK_K)) * 0.5
    few = r.choice(np.array([-3.0, -1.0, 0.0, 1.0, 2.0, 0.5, -0.5]), (16, QK_K))
    pow2 = r.integers(-4, 4, (16, 16, 16)) * 2.0 ** r.integers(-10, 10, (16, 16, 1))
    sym = np.tile(np.array([1.0, -1.0]), (4, QK_K // 2))  # equal |max| of both signs: the first one wins
    anti = np.tile(np.array([-1.0, 1.0]), (4, QK_K // 2))
    return np.concatenate([grid.ravel(), few.ravel(), pow2.ravel(), sym.ravel(), anti.ravel()])


def _tiny() -> np.ndarray:
    """Down to subnormals (where the searches' iscale overflows to inf), and around GROUP_MAX_EPS (1e-15f)."""
    r = _rng(8)
    parts = [r.standard_normal(4 * QK_K) * s for s in (1e-20, 1e-30, 1e-38, 1e-40)]
    parts.append(r.integers(-3, 4, 4 * QK_K) * 1.4e-45)  # multiples of the smallest subnormal
    eps = np.float32(1e-15)
    near = r.uniform(0.3, 1.0, (8, 16, 16)) * r.choice([-1.0, 1.0], (8, 16, 16)) * float(eps)
    near[:, :, 0] = np.array([np.nextafter(eps, np.float32(0)), eps, np.nextafter(eps, np.float32(1))])[r.integers(0, 3, (8, 16))]
    parts.append(near.ravel())
    return np.concatenate(parts)


def _fp16_edge() -> np.ndarray:
    """Magnitudes around fp16 overflow (6e4) and far past it, where d / dmin become inf."""
    r = _rng(9)
    parts = [r.uniform(-1, 1, 4 * QK_K) * s for s in (6e4, 65504.0, 1.5e5, 1e6, 5e6, 1e8)]
    parts.append(np.tile(np.array([65504.0, -65504.0, 65519.0, 65520.0]), 2 * QK_K // 4))
    return np.concatenate(parts)


def _nonfinite() -> np.ndarray:
    """inf / NaN / float32 extremes: not in sane checkpoints, but ggml's output is deterministic and we match it."""
    r = _rng(10)
    x = r.standard_normal(16 * QK_K)
    idx = r.integers(0, x.size, 40)
    x[idx] = r.choice(np.array([np.inf, -np.inf, np.nan, 3e38, -3e38, 1e20]), idx.size)
    x[0] = np.nan  # a NaN first in its group: C's min/max scans start from it
    return x


def _realistic() -> np.ndarray:
    """A weight matrix: N(0, 0.02), 64 rows of 1024."""
    return _rng(11).standard_normal((64, 1024)) * 0.02


def _heavy_tailed() -> np.ndarray:
    """Student-t weights rounded to bf16 (8 significant bits: rounding ties are common), and Laplace rows."""
    r = _rng(12)
    u = (r.standard_t(4, (16, 1024)) * 0.02).astype(np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> 16) & 1)) & np.uint32(0xFFFF0000)  # round to nearest even bf16
    return np.concatenate([u.view(np.float32).ravel(), (r.laplace(size=(16, 1024)) * 0.05).ravel()])


def _multi_tile() -> np.ndarray:
    """More super-blocks than one tile holds (512), ending in a partial tile."""
    return _rng(13).standard_normal((130, 1024)) * 0.05


CASES: dict[str, Callable[[], np.ndarray]] = {
    "normal_scaled": _normal_scaled,
    "moderate_scales": _moderate_scales,
    "sub_block_scales": _sub_block_scales,
    "zeros": lambda: np.zeros(2 * QK_K),
    "constant": _constant,
    "outlier": _outlier,
    "signed": _signed,
    "ties": _ties,
    "tiny": _tiny,
    "fp16_edge": _fp16_edge,
    "nonfinite": _nonfinite,
    "realistic": _realistic,
    "heavy_tailed": _heavy_tailed,
    "multi_tile": _multi_tile,
}


def _case(name: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(CASES[name](), dtype=np.float32).reshape(-1)


def _oracle(kind: str, x: np.ndarray, row: int = QK_K) -> np.ndarray:
    from fixtures.ggml_oracle import ggml_quantize

    return np.frombuffer(ggml_quantize(int(TYPES[kind][1]), x.reshape(-1, row)), dtype=np.uint8)


def _assert_same_blocks(kind: str, x: np.ndarray, ours: np.ndarray, ref: np.ndarray) -> None:
    """Equal bytes, or a message naming the first differing block, field and byte."""
    _, _, _, block_bytes, fields = TYPES[kind]
    assert ours.dtype == np.uint8 and ours.shape == ref.shape, (ours.dtype, ours.shape, ref.shape)
    diff = np.flatnonzero(ours != ref)
    if diff.size == 0:
        return
    first = int(diff[0])
    block, off = divmod(first, block_bytes)
    field = next(f"{name}[{off - lo}]" for name, lo, hi in fields if lo <= off < hi)
    bad_blocks = np.unique(diff // block_bytes)
    sl = slice(block * block_bytes, (block + 1) * block_bytes)
    pytest.fail(f"{kind}: {diff.size} differing bytes in {bad_blocks.size} of {ours.size // block_bytes} blocks; "
                f"first at byte {first}: block {block}, {field}: ours {ours[first]} ggml {ref[first]}\n"
                f"ours {ours[sl].tolist()}\nggml {ref[sl].tolist()}\n"
                f"input block {block}: {x[block * QK_K:(block + 1) * QK_K].tolist()}")


def _assert_close(kind: str, x: np.ndarray, y: np.ndarray) -> None:
    max_rel, rms_rel = CLOSE[kind]
    assert y.shape == x.shape and np.isfinite(y).all()
    xb, eb = x.reshape(-1, QK_K).astype(np.float64), (y - x).reshape(-1, QK_K).astype(np.float64)
    worst = np.abs(eb).max(1) / np.abs(xb).max(1)
    assert worst.max() <= max_rel, (kind, worst.max(), int(worst.argmax()))
    rms = np.sqrt((eb ** 2).mean(1)) / xb.std(1)
    assert rms.max() <= rms_rel * 1.5 and np.median(rms) <= rms_rel, (kind, rms.max(), np.median(rms))


# ---------------------------------------------------------------------------------- fast tier


@pytest.mark.parametrize("kind", TYPES)
def test_layout_and_validation(kind):
    quantize, _, _, block_bytes, _ = TYPES[kind]
    y = quantize(_case("realistic")[:3 * QK_K])
    assert y.dtype == np.uint8 and y.shape == (3 * block_bytes,)
    assert not quantize(np.zeros(2 * QK_K, np.float32)).any()  # zero blocks: all-zero bytes
    assert quantize(np.zeros(0, np.float32)).shape == (0,)
    for bad in (np.zeros(QK_K + 16, np.float32), np.zeros((2, QK_K), np.float32)):
        with pytest.raises(ValueError, match="super-blocks"):
            quantize(bad)


@pytest.mark.parametrize("kind", TYPES)
def test_tiling_and_summation_fallback(kind, monkeypatch):
    """Same bytes with tiny tiles (padding in the last one), each super-block alone, and with the
    explicit per-position summation loop instead of the single-call reduction."""
    quantize, _, _, block_bytes, _ = TYPES[kind]
    x = np.concatenate([_case("sub_block_scales")[:7 * QK_K], _case("constant")[:3 * QK_K], _case("tiny")[:2 * QK_K]])
    whole = quantize(x)
    for b in range(0, 12, 5):
        assert np.array_equal(quantize(x[b * QK_K:(b + 1) * QK_K]), whole[b * block_bytes:(b + 1) * block_bytes])
    with monkeypatch.context() as m:
        m.setattr(kquants, "_QKX_TILE_GROUPS", 3 * 8)  # 3 super-blocks per tile
        m.setattr(kquants, "_QX_TILE_GROUPS", 5 * 16)  # 5 super-blocks per tile
        assert np.array_equal(quantize(x), whole)
    with monkeypatch.context() as m:
        m.setattr(kquants, "_reduce_is_sequential", lambda *a: False)
        assert np.array_equal(quantize(x), whole)


def test_single_call_reduction_is_used():
    """The one-call reduction matches C's order on the layouts the quantizers use (else they still
    work, through the loop, but several times slower)."""
    with np.errstate():
        for shape, axis, bufsize in [((3, 32, 4096), 1, 4096), ((32, 4096), 0, 4096), ((2, 16, 8192), 1, 8192), ((32, 24), 0, 16)]:
            np.setbufsize(bufsize)
            assert kquants._reduce_is_sequential(shape, axis, bufsize), shape


@pytest.mark.parametrize("kind", TYPES)
def test_thread_pool(kind):
    """Pure functions: chunks quantized concurrently give the bytes of one call."""
    quantize = TYPES[kind][0]
    x = _case("realistic")
    chunks = np.split(x, 8)
    with ThreadPoolExecutor(2) as pool:
        parts = list(pool.map(quantize, chunks))
    assert np.array_equal(np.concatenate(parts), quantize(x))


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("case", ["realistic", "moderate_scales", "heavy_tailed"])
def test_round_trip_close(kind, case):
    """gguf-py dequantizes our bytes back to within the type's usual error.

    (Not for super-blocks below ~1e-6 or above ~1e6: their fp16 super-scales underflow to 0 or
    overflow, in ggml too; the bit-identity tests cover those.)
    """
    x = _case(case)
    _assert_close(kind, x, dequantize(TYPES[kind][0](x), TYPES[kind][2]))


# ---------------------------------------------------------------------------------- against ggml


@pytest.mark.runtime
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", TYPES)
def test_bit_identical_with_ggml(kind, case):
    x = _case(case)
    _assert_same_blocks(kind, x, TYPES[kind][0](x), _oracle(kind, x))


@pytest.mark.runtime
@pytest.mark.parametrize("kind", TYPES)
def test_bit_identical_random_mix(kind):
    """2048 super-blocks drawn from every generator above, each 16-value group re-scaled on its own."""
    r = _rng(30)
    blocks = np.concatenate([_case(c).reshape(-1, QK_K) for c in CASES])
    x = blocks[r.integers(0, len(blocks), 2048)].reshape(-1, 16, 16).astype(np.float64)
    x *= np.exp(r.uniform(-20, 8, (2048, 1, 1))) * np.exp(r.uniform(-5, 5, (2048, 16, 1)))
    with np.errstate(over="ignore", invalid="ignore"):
        x = x.astype(np.float32).reshape(-1)
    _assert_same_blocks(kind, x, TYPES[kind][0](x), _oracle(kind, x))


@pytest.mark.runtime
@pytest.mark.parametrize("kind", TYPES)
def test_dequantized_equals_ggml(kind):
    """Row by row through gguf-py's dequantizer, our blocks and ggml's give the same floats, close to the input."""
    quantize, _, qtype, block_bytes, _ = TYPES[kind]
    rows = np.concatenate([_case("realistic"), _case("heavy_tailed")]).reshape(-1, 1024)
    ours = quantize(rows.reshape(-1)).reshape(len(rows), -1)
    ref = _oracle(kind, rows.reshape(-1), row=1024).reshape(len(rows), -1)
    assert ours.shape == (len(rows), 4 * block_bytes)
    for i, row in enumerate(rows):
        y = dequantize(ours[i], qtype)
        assert np.array_equal(y.view(np.uint32), dequantize(ref[i], qtype).view(np.uint32)), i
        _assert_close(kind, row, y)
