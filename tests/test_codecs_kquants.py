"""K-quant quantizers (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): bit-identical with ggml's reference quantizers, and sane round trips.

One table (``TYPES``) drives the tests every type shares: layout and validation, closeness after
dequantizing with gguf-py, bit identity case by case and on a random mix, and dequantized equality.
The oracle is ggml itself (``quantize_row_q*_K_ref`` through ``ggml_quantize_chunk`` with no
importance matrix, i.e. what llama-quantize runs), so those tests carry the ``runtime`` marker.
Each family's own machinery has its own tests: Q4_K..Q6_K's tiling, summation-order fallback and
thread safety (``encoders/kquants.py``); Q2_K/Q3_K's chunking, sequential sums and exact rounding
path (``encoders/kquants_low.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from dflash_convert.encoders import kquants, kquants_low
from dflash_convert.encoders.kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from dflash_convert.encoders.kquants_low import quantize_q2_k, quantize_q3_k
from dflash_convert.format.ggml import GGMLType

pytestmark = pytest.mark.usefixtures("quantizer_backend")  # every test on both backends (conftest)

QK_K = 256


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# --- inputs ------------------------------------------------------------------------------------------
# Each family has its own set (seeds and shapes chosen when its quantizers were written, and its
# own edge cases: Q4_K/Q5_K's 32-value groups and tiles, Q2_K's mixed magnitudes); the generators
# that both use take the family's seed.


def _normal_scaled() -> np.ndarray:
    """64 super-blocks of N(0,1), each scaled by its own factor, log-uniform in 1e-8..1e4."""
    r = _rng(1)
    return r.standard_normal((64, QK_K)) * np.exp(r.uniform(np.log(1e-8), np.log(1e4), (64, 1)))


def _moderate_scales(seed: int) -> np.ndarray:
    """Like ``_normal_scaled`` within 1e-3..1e3, where the fp16 super-scales neither underflow nor overflow."""
    r = _rng(seed)
    return r.standard_normal((64, QK_K)) * np.exp(r.uniform(np.log(1e-3), np.log(1e3), (64, 1)))


def _sub_block_scales(seed: int) -> np.ndarray:
    """Every 16-value group its own magnitude (1e-10..1e5): scales round to 0 (the kept search levels), or saturate."""
    r = _rng(seed)
    return r.standard_normal((32, 16, 16)) * np.exp(r.uniform(np.log(1e-10), np.log(1e5), (32, 16, 1)))


def _constant(seed: int, values: tuple[float, ...], halves: bool) -> np.ndarray:
    """Whole super-blocks constant (0, positive, negative), then constant and zero groups among noise;
    with ``halves``, constant 32-value groups too (Q4_K/Q5_K's early return when <= 0)."""
    blocks = [np.full(QK_K, v) for v in values]
    r = _rng(seed)
    mixed = r.standard_normal((4, 16, 16))
    mixed[:, ::3] = r.standard_normal((4, 6, 1)) * 5  # constant 16-value groups
    mixed[:, 1::5] = 0  # zero groups
    if not halves:
        return np.concatenate([*blocks, mixed.ravel()])
    halves_ = r.standard_normal((4, 8, 32))
    halves_[:, ::2] = r.uniform(-3, 3, (4, 4, 1))  # constant 32-value groups
    return np.concatenate([*blocks, mixed.ravel(), halves_.ravel()])


def _outlier(seed: int) -> np.ndarray:
    """One huge value per super-block: the other groups' scales quantize to 0."""
    r = _rng(seed)
    x = r.standard_normal((8, QK_K)) * 0.01
    x[np.arange(8), r.integers(0, QK_K, 8)] = [1e4, -1e4, 50, -50, 1e3, 3, -3, 1e6]
    return x


def _signed(seed: int) -> np.ndarray:
    """All-positive and all-negative super-blocks, near zero and offset from it."""
    r = _rng(seed)
    a = np.abs(r.standard_normal((6, QK_K)))
    return np.concatenate([a[:3].ravel(), -a[3:].ravel(), a[:2].ravel() + 10, -a[2:4].ravel() - 10])


def _ties(seed: int, anti: bool) -> np.ndarray:
    """Values on small binary grids: x*iscale and x/d land on .5 exactly, and the max searches tie."""
    r = _rng(seed)
    grid = r.integers(-8, 9, (16, QK_K)) * 0.5
    few = r.choice(np.array([-3.0, -1.0, 0.0, 1.0, 2.0, 0.5, -0.5]), (16, QK_K))
    pow2 = r.integers(-4, 4, (16, 16, 16)) * 2.0 ** r.integers(-10, 10, (16, 16, 1))
    sym = np.tile(np.array([1.0, -1.0]), (4, QK_K // 2))  # equal |max| of both signs: the first one wins
    parts = [grid.ravel(), few.ravel(), pow2.ravel(), sym.ravel()]
    if anti:
        parts.append(np.tile(np.array([-1.0, 1.0]), (4, QK_K // 2)).ravel())
    return np.concatenate(parts)


def _tiny(seed: int) -> np.ndarray:
    """Down to subnormals (where the searches' iscale overflows to inf), and around GROUP_MAX_EPS (1e-15f),
    Q3_K's all-zero threshold: groups whose max |x| falls just below, on and just above it."""
    r = _rng(seed)
    parts = [r.standard_normal(4 * QK_K) * s for s in (1e-20, 1e-30, 1e-38, 1e-40)]
    parts.append(r.integers(-3, 4, 4 * QK_K) * 1.4e-45)  # multiples of the smallest subnormal
    eps = np.float32(1e-15)
    near = r.uniform(0.3, 1.0, (8, 16, 16)) * r.choice([-1.0, 1.0], (8, 16, 16)) * float(eps)
    near[:, :, 0] = np.array([np.nextafter(eps, np.float32(0)), eps, np.nextafter(eps, np.float32(1))])[r.integers(0, 3, (8, 16))]
    parts.append(near.ravel())
    return np.concatenate(parts)


def _fp16_edge(seed: int, scales: tuple[float, ...]) -> np.ndarray:
    """Magnitudes around fp16 overflow (65504) and far past it, where d / dmin become inf (and NaN codes)."""
    r = _rng(seed)
    parts = [r.uniform(-1, 1, 4 * QK_K) * s for s in scales]
    parts.append(np.tile(np.array([65504.0, -65504.0, 65519.0, 65520.0]), 2 * QK_K // 4))
    return np.concatenate(parts)


def _mixed_magnitudes() -> np.ndarray:
    """A large constant sub-block next to small ones: requantization ratios far past 2**22 (nearest_int garbage).

    Q2_K: sub-block 0 sets dmin (min 1e4), so the others' mins (~300) round to 0 while their
    scales (range 1e-4) stay representable: (x + 0)/d is about -1e7.
    """
    r = _rng(9)
    x = r.standard_normal((16, 16, 16)) * 1e-6
    x[:, 0] = -1e4
    x[1::2, 5] = 3e3
    x[2::3, 9, :] = r.standard_normal((5, 16)) * 1e-30
    x[8:] = -300 + r.standard_normal((8, 16, 16)) * 1e-4
    x[8:, 0] = -1e4
    return x


def _nonfinite(nan_first: bool) -> np.ndarray:
    """inf / NaN / float32 extremes: not in sane checkpoints, but ggml's output is deterministic and we match it."""
    r = _rng(10)
    x = r.standard_normal(16 * QK_K)
    idx = r.integers(0, x.size, 40)
    x[idx] = r.choice(np.array([np.inf, -np.inf, np.nan, 3e38, -3e38, 1e20]), idx.size)
    if nan_first:
        x[0] = np.nan  # a NaN first in its group: C's min/max scans start from it
    return x


def _realistic() -> np.ndarray:
    """A weight matrix: N(0, 0.02), 64 rows of 1024."""
    return _rng(11).standard_normal((64, 1024)) * 0.02


def _to_bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) & np.uint32(0xFFFF0000)).view(np.float32)  # round to nearest even bf16


def _heavy_tailed() -> np.ndarray:
    """Student-t weights rounded to bf16 (8 significant bits: rounding ties are common), and Laplace rows."""
    r = _rng(12)
    u = _to_bf16(r.standard_t(4, (16, 1024)) * 0.02)
    return np.concatenate([u.ravel(), (r.laplace(size=(16, 1024)) * 0.05).ravel()])


def _bf16_weights() -> np.ndarray:
    """Weights as they come from a bf16 checkpoint: 8 significant bits, so rounding ties are common."""
    return _to_bf16(_rng(13).standard_t(4, (32, 1024)) * 0.02)


def _multi_tile() -> np.ndarray:
    """More super-blocks than one tile holds (512), ending in a partial tile."""
    return _rng(13).standard_normal((130, 1024)) * 0.05


def _zeros() -> np.ndarray:
    return np.zeros(2 * QK_K)


Cases = dict[str, Callable[[], np.ndarray]]

CASES_Q4_Q6: Cases = {
    "normal_scaled": _normal_scaled,
    "moderate_scales": partial(_moderate_scales, 2),
    "sub_block_scales": partial(_sub_block_scales, 3),
    "zeros": _zeros,
    "constant": partial(_constant, 4, (0.0, -0.0, 0.37, 1.0, -1.0, -2.5, 3.25, -1e-3, 7e4), True),
    "outlier": partial(_outlier, 5),
    "signed": partial(_signed, 6),
    "ties": partial(_ties, 7, True),
    "tiny": partial(_tiny, 8),
    "fp16_edge": partial(_fp16_edge, 9, (6e4, 65504.0, 1.5e5, 1e6, 5e6, 1e8)),
    "nonfinite": partial(_nonfinite, True),
    "realistic": _realistic,
    "heavy_tailed": _heavy_tailed,
    "multi_tile": _multi_tile,
}
CASES_Q2_Q3: Cases = {
    "normal_scaled": _normal_scaled,
    "moderate_scales": partial(_moderate_scales, 12),
    "sub_block_scales": partial(_sub_block_scales, 2),
    "zeros": _zeros,
    "constant": partial(_constant, 3, (0.0, 1.0, -1.0, 3.25, -1e-3, 7e4), False),
    "outlier": partial(_outlier, 4),
    "signed": partial(_signed, 5),
    "ties": partial(_ties, 6, False),
    "tiny": partial(_tiny, 7),
    "fp16_edge": partial(_fp16_edge, 8, (65504.0, 1.5e5, 1e6, 3e6, 1e8)),
    "mixed_magnitudes": _mixed_magnitudes,
    "nonfinite": partial(_nonfinite, False),
    "realistic": _realistic,
    "bf16_weights": _bf16_weights,
}


# --- the types -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KQuant:
    """One K-quant type and how its tests drive it."""

    quantize: Callable[[np.ndarray], np.ndarray]
    ggml_type: GGMLType
    qtype: GGMLQuantizationType  # gguf-py's, for its dequantizer
    block_bytes: int
    fields: list[tuple[str, int, int]]  # (field, first byte, end byte) within a block
    close: tuple[float, float]  # closeness after a round trip (see CLOSE below)
    cases: Cases
    round_trip: tuple[str, ...]  # the cases closeness is judged on
    mix_blocks: int  # super-blocks in the random mix
    dequant_cases: tuple[str, str]
    dequant_row: int | None  # row length the dequantized comparison walks, None: the whole input as one row


_KQ_FIELDS = [("d", 0, 2), ("dmin", 2, 4), ("scales", 4, 16)]
_Q4_Q6 = dict(cases=CASES_Q4_Q6, round_trip=("realistic", "moderate_scales", "heavy_tailed"), mix_blocks=2048,
              dequant_cases=("realistic", "heavy_tailed"), dequant_row=1024)
# 1024 super-blocks: rare rounding-order slips (one float op in another order) show up in a few
# sub-blocks per hundred thousand values, hence the size
_Q2_Q3 = dict(cases=CASES_Q2_Q3, round_trip=("realistic", "moderate_scales", "sub_block_scales"), mix_blocks=1024,
              dequant_cases=("realistic", "moderate_scales"), dequant_row=None)

# closeness after a round trip, for well-behaved data: per super-block max |error| / max |x|, and
# RMS error / std (measured on the data above: Q2_K ~0.3-0.4 and ~0.3, Q3_K ~0.15-0.25 and ~0.15,
# Q4_K ~0.08 and ~0.07-0.08, Q5_K ~0.045 and ~0.04, Q6_K ~0.02-0.04 and ~0.02)
TYPES: dict[str, KQuant] = {
    "q2_k": KQuant(quantize_q2_k, GGMLType.Q2_K, GGMLQuantizationType.Q2_K, 84,
                   [("scales", 0, 16), ("qs", 16, 80), ("d", 80, 82), ("dmin", 82, 84)], (0.5, 0.36), **_Q2_Q3),
    "q3_k": KQuant(quantize_q3_k, GGMLType.Q3_K, GGMLQuantizationType.Q3_K, 110,
                   [("hmask", 0, 32), ("qs", 32, 96), ("scales", 96, 108), ("d", 108, 110)], (0.3, 0.2), **_Q2_Q3),
    "q4_k": KQuant(quantize_q4_k, GGMLType.Q4_K, GGMLQuantizationType.Q4_K, 144, [*_KQ_FIELDS, ("qs", 16, 144)],
                   (0.12, 0.10), **_Q4_Q6),
    "q5_k": KQuant(quantize_q5_k, GGMLType.Q5_K, GGMLQuantizationType.Q5_K, 176, [*_KQ_FIELDS, ("qh", 16, 48), ("qs", 48, 176)],
                   (0.06, 0.05), **_Q4_Q6),
    "q6_k": KQuant(quantize_q6_k, GGMLType.Q6_K, GGMLQuantizationType.Q6_K, 210,
                   [("ql", 0, 128), ("qh", 128, 192), ("scales", 192, 208), ("d", 208, 210)], (0.06, 0.03), **_Q4_Q6),
}
Q4_Q6 = ("q4_k", "q5_k", "q6_k")
Q2_Q3 = ("q2_k", "q3_k")


def _pairs(field: str) -> list:
    """(kind, case) for every type and each case its ``field`` names, as pytest parameters."""
    return [pytest.param(k, c, id=f"{k}-{c}") for k, t in TYPES.items() for c in getattr(t, field)]


def _case(kind: str, name: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(TYPES[kind].cases[name](), dtype=np.float32).reshape(-1)


def _oracle(kind: str, x: np.ndarray, row: int = QK_K) -> np.ndarray:
    from fixtures.ggml_oracle import ggml_quantize

    return np.frombuffer(ggml_quantize(int(TYPES[kind].ggml_type), x.reshape(-1, row)), dtype=np.uint8)


def _assert_same_blocks(kind: str, x: np.ndarray, ours: np.ndarray, ref: np.ndarray) -> None:
    """Equal bytes, or a message naming the first differing block, field and byte."""
    block_bytes, fields = TYPES[kind].block_bytes, TYPES[kind].fields
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
    max_rel, rms_rel = TYPES[kind].close
    assert y.shape == x.shape and np.isfinite(y).all()
    xb, eb = x.reshape(-1, QK_K).astype(np.float64), (y - x).reshape(-1, QK_K).astype(np.float64)
    worst = np.abs(eb).max(1) / np.abs(xb).max(1)
    assert worst.max() <= max_rel, (kind, worst.max(), int(worst.argmax()))
    rms = np.sqrt((eb ** 2).mean(1)) / xb.std(1)
    assert rms.max() <= rms_rel * 1.5 and np.median(rms) <= rms_rel, (kind, rms.max(), np.median(rms))


# --- every type: fast tier -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TYPES)
def test_layout_and_validation(kind):
    quantize, block_bytes = TYPES[kind].quantize, TYPES[kind].block_bytes
    y = quantize(_case(kind, "realistic")[:3 * QK_K])
    assert y.dtype == np.uint8 and y.shape == (3 * block_bytes,)
    assert not quantize(np.zeros(2 * QK_K, np.float32)).any()  # zero blocks: all-zero bytes
    assert quantize(np.zeros(0, np.float32)).shape == (0,)
    for bad in (np.zeros(QK_K + 16, np.float32), np.zeros((2, QK_K), np.float32)):
        with pytest.raises(ValueError, match="super-blocks"):
            quantize(bad)


@pytest.mark.parametrize("kind,case", _pairs("round_trip"))
def test_round_trip_close(kind, case):
    """gguf-py dequantizes our bytes back to within the type's usual error.

    (Not for super-blocks below ~1e-6 or above ~1e6: their fp16 super-scales underflow to 0 or
    overflow, in ggml too; the bit-identity tests cover those.)
    """
    x = _case(kind, case)
    _assert_close(kind, x, dequantize(TYPES[kind].quantize(x), TYPES[kind].qtype))


# --- every type: against ggml ------------------------------------------------------------------------------


@pytest.mark.runtime
@pytest.mark.parametrize("kind,case", _pairs("cases"))
def test_bit_identical_with_ggml(kind, case):
    x = _case(kind, case)
    _assert_same_blocks(kind, x, TYPES[kind].quantize(x), _oracle(kind, x))


@pytest.mark.runtime
@pytest.mark.parametrize("kind", TYPES)
def test_bit_identical_random_mix(kind):
    """Super-blocks drawn from every generator of the type's family, each 16-value group re-scaled on its own."""
    n = TYPES[kind].mix_blocks
    r = _rng(30)
    blocks = np.concatenate([_case(kind, c).reshape(-1, QK_K) for c in TYPES[kind].cases])
    x = blocks[r.integers(0, len(blocks), n)].reshape(-1, 16, 16).astype(np.float64)
    x *= np.exp(r.uniform(-20, 8, (n, 1, 1))) * np.exp(r.uniform(-5, 5, (n, 16, 1)))
    with np.errstate(over="ignore", invalid="ignore"):
        x = x.astype(np.float32).reshape(-1)
    _assert_same_blocks(kind, x, TYPES[kind].quantize(x), _oracle(kind, x))


@pytest.mark.runtime
@pytest.mark.parametrize("kind", TYPES)
def test_dequantized_equals_ggml(kind):
    """Row by row through gguf-py's dequantizer, our blocks and ggml's give the same floats, close to the input."""
    t = TYPES[kind]
    x = np.concatenate([_case(kind, c) for c in t.dequant_cases])
    row = t.dequant_row or x.size
    rows = x.reshape(-1, row)
    ours = t.quantize(x).reshape(len(rows), -1)
    ref = _oracle(kind, x, row=row).reshape(len(rows), -1)
    assert ours.shape == (len(rows), row // QK_K * t.block_bytes)
    for i, one in enumerate(rows):
        y = dequantize(ours[i], t.qtype)
        assert np.array_equal(y.view(np.uint32), dequantize(ref[i], t.qtype).view(np.uint32)), i
        _assert_close(kind, one, y)


# --- Q4_K, Q5_K, Q6_K: tiles and the single-call reduction ---------------------------------------------------


@pytest.mark.parametrize("kind", Q4_Q6)
def test_tiling_and_summation_fallback(kind, monkeypatch):
    """Same bytes with tiny tiles (padding in the last one), each super-block alone, and with the
    explicit per-position summation loop instead of the single-call reduction."""
    quantize, block_bytes = TYPES[kind].quantize, TYPES[kind].block_bytes
    x = np.concatenate([_case(kind, "sub_block_scales")[:7 * QK_K], _case(kind, "constant")[:3 * QK_K], _case(kind, "tiny")[:2 * QK_K]])
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


@pytest.mark.parametrize("kind", Q4_Q6)
def test_thread_pool(kind):
    """Pure functions: chunks quantized concurrently give the bytes of one call."""
    quantize = TYPES[kind].quantize
    x = _case(kind, "realistic")
    chunks = np.split(x, 8)
    with ThreadPoolExecutor(2) as pool:
        parts = list(pool.map(quantize, chunks))
    assert np.array_equal(np.concatenate(parts), quantize(x))


# --- Q2_K, Q3_K: chunks, sequential sums, exact rounding ---------------------------------------------------------


def test_axis_reduction_is_sequential():
    """The implementation's premise: numpy reduces a C-contiguous array over a non-last axis in index order.

    A pairwise or blocked order would round these sums differently (terms spanning 1e-20..1e20,
    cancelling), so this pins it for the installed numpy.
    """
    r = _rng(20)
    for shape in ((16, 4096), (3, 16, 1000)):
        t = (r.standard_normal(shape) * np.exp(r.uniform(-46, 46, shape))).astype(np.float32)
        out = np.empty(shape[:-2] + shape[-1:], np.float32)
        kquants_low._seqsum(t, out)
        ref = np.zeros_like(out)
        for i in range(shape[-2]):
            ref = ref + t[..., i, :]  # float32 + float32, one row at a time
        assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("kind", Q2_Q3)
def test_super_blocks_independent_of_chunking(kind, monkeypatch):
    """Same bytes whatever the chunking, and each super-block alone gives its own bytes."""
    quantize, block_bytes = TYPES[kind].quantize, TYPES[kind].block_bytes
    x = np.concatenate([_case(kind, "sub_block_scales")[:7 * QK_K], _case(kind, "constant")[:3 * QK_K]])
    whole = quantize(x)
    monkeypatch.setattr(kquants_low, "_Q2_CHUNK_BLOCKS", 3)
    monkeypatch.setattr(kquants_low, "_Q3_CHUNK_BLOCKS", 3)
    assert np.array_equal(quantize(x), whole)
    for b in range(0, 10, 3):
        assert np.array_equal(quantize(x[b * QK_K:(b + 1) * QK_K]), whole[b * block_bytes:(b + 1) * block_bytes])


@pytest.mark.runtime
def test_q2_k_exact_rounding_fallback(monkeypatch):
    """Q2_K's search rounds with rint where a bound proves it equal to nearest_int; force the exact path everywhere."""
    monkeypatch.setattr(kquants_low, "_RINT_SAFE", np.float32(0))
    for case in ("realistic", "sub_block_scales", "ties", "tiny"):
        x = _case("q2_k", case)
        _assert_same_blocks("q2_k", x, quantize_q2_k(x), _oracle("q2_k", x))
