"""Q2_K / Q3_K quantizers: bit-identical with ggml's reference quantizers, and sane round trips.

The oracle is ggml itself (``quantize_row_q2_K_ref`` / ``quantize_row_q3_K_ref`` through
``ggml_quantize_chunk`` with no importance matrix, i.e. what llama-quantize runs), so those
tests carry the ``runtime`` marker. The fast tier still runs the code: layout, chunking,
the summation-order assumption the implementation rests on, and closeness after dequantizing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from dflash_convert.encoders import kquants_low
from dflash_convert.encoders.kquants_low import quantize_q2_k, quantize_q3_k

pytestmark = pytest.mark.usefixtures("quantizer_backend")  # every test on both backends (conftest)

QK_K = 256
GGML_Q2_K, GGML_Q3_K = 10, 11

# name -> (quantizer, ggml type id, gguf-py type, block bytes, [(field, first byte, end byte)])
TYPES: dict[str, tuple[Callable[[np.ndarray], np.ndarray], int, GGMLQuantizationType, int, list[tuple[str, int, int]]]] = {
    "q2_k": (quantize_q2_k, GGML_Q2_K, GGMLQuantizationType.Q2_K, 84, [("scales", 0, 16), ("qs", 16, 80), ("d", 80, 82), ("dmin", 82, 84)]),
    "q3_k": (quantize_q3_k, GGML_Q3_K, GGMLQuantizationType.Q3_K, 110, [("hmask", 0, 32), ("qs", 32, 96), ("scales", 96, 108), ("d", 108, 110)]),
}
# closeness after a round trip, for well-behaved data: per super-block max |error| / max |x|,
# and RMS error / std (measured: Q2_K ~0.3-0.4 and ~0.3, Q3_K ~0.15-0.25 and ~0.15)
CLOSE = {"q2_k": (0.5, 0.36), "q3_k": (0.3, 0.2)}


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal_scaled() -> np.ndarray:
    """64 super-blocks of N(0,1), each scaled by its own factor, log-uniform in 1e-8..1e4."""
    r = _rng(1)
    return r.standard_normal((64, QK_K)) * np.exp(r.uniform(np.log(1e-8), np.log(1e4), (64, 1)))


def _moderate_scales() -> np.ndarray:
    """Like ``_normal_scaled`` within 1e-3..1e3, where fp16 super-scales neither underflow nor overflow (for closeness)."""
    r = _rng(12)
    return r.standard_normal((64, QK_K)) * np.exp(r.uniform(np.log(1e-3), np.log(1e3), (64, 1)))


def _sub_block_scales() -> np.ndarray:
    """Every 16-value sub-block its own magnitude (1e-10..1e5), so scales quantize to 0 and overflow the 4/6 bits."""
    r = _rng(2)
    return r.standard_normal((32, 16, 16)) * np.exp(r.uniform(np.log(1e-10), np.log(1e5), (32, 16, 1)))


def _constant() -> np.ndarray:
    """Whole super-blocks constant (0, positive, negative), then constant sub-blocks among noise."""
    blocks = [np.full(QK_K, v) for v in (0.0, 1.0, -1.0, 3.25, -1e-3, 7e4)]
    r = _rng(3)
    mixed = r.standard_normal((4, 16, 16))
    mixed[:, ::3] = r.standard_normal((4, 6, 1)) * 5  # constant sub-blocks
    mixed[:, 1::5] = 0  # zero sub-blocks
    return np.concatenate([*blocks, mixed.ravel()])


def _outlier() -> np.ndarray:
    r = _rng(4)
    x = r.standard_normal((8, QK_K)) * 0.01
    x[np.arange(8), r.integers(0, QK_K, 8)] = [1e4, -1e4, 50, -50, 1e3, 3, -3, 1e6]
    return x


def _signed() -> np.ndarray:
    r = _rng(5)
    a = np.abs(r.standard_normal((6, QK_K)))
    return np.concatenate([a[:3].ravel(), -a[3:].ravel(), a[:2].ravel() + 10, -a[2:4].ravel() - 10])


def _ties() -> np.ndarray:
    """Values on small binary grids: the searches' x*iscale and x/d land on .5 exactly, ties in max searches."""
    r = _rng(6)
    grid = r.integers(-8, 9, (16, QK_K)) * 0.5
    few = r.choice(np.array([-3.0, -1.0, 0.0, 1.0, 2.0, 0.5, -0.5]), (16, QK_K))
    pow2 = r.integers(-4, 4, (16, 16, 16)) * 2.0 ** r.integers(-10, 10, (16, 16, 1))
    sym = np.tile(np.array([1.0, -1.0]), (4, QK_K // 2))  # equal |max| of both signs: first one wins
    return np.concatenate([grid.ravel(), few.ravel(), pow2.ravel(), sym.ravel()])


def _tiny() -> np.ndarray:
    """Down to subnormals, and around GROUP_MAX_EPS (1e-15f), Q3_K's all-zero threshold."""
    r = _rng(7)
    parts = [r.standard_normal(4 * QK_K) * s for s in (1e-20, 1e-30, 1e-38, 1e-40)]
    parts.append(r.integers(-3, 4, 4 * QK_K) * 1.4e-45)  # multiples of the smallest subnormal
    # sub-blocks whose max |x| falls just below, on and just above 1e-15f
    eps = np.float32(1e-15)
    near = r.uniform(0.3, 1.0, (8, 16, 16)) * r.choice([-1.0, 1.0], (8, 16, 16)) * float(eps)
    near[:, :, 0] = np.array([np.nextafter(eps, np.float32(0)), eps, np.nextafter(eps, np.float32(1))])[r.integers(0, 3, (8, 16))]
    parts.append(near.ravel())
    return np.concatenate(parts)


def _fp16_edge() -> np.ndarray:
    """Magnitudes where the fp16 super-scales approach and pass 65504 (then inf, and NaN codes)."""
    r = _rng(8)
    parts = [r.uniform(-1, 1, 4 * QK_K) * s for s in (65504.0, 1.5e5, 1e6, 3e6, 1e8)]
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


def _nonfinite() -> np.ndarray:
    """inf / NaN / float32 extremes: not in sane checkpoints, but ggml's output is deterministic and we match it."""
    r = _rng(10)
    x = r.standard_normal(16 * QK_K)
    idx = r.integers(0, x.size, 40)
    x[idx] = r.choice(np.array([np.inf, -np.inf, np.nan, 3e38, -3e38, 1e20]), idx.size)
    return x


def _realistic() -> np.ndarray:
    return _rng(11).standard_normal((64, 1024)) * 0.02


def _bf16_weights() -> np.ndarray:
    """Weights as they come from a bf16 checkpoint: 8 significant bits, so rounding ties are common."""
    u = (_rng(13).standard_t(4, (32, 1024)) * 0.02).astype(np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> 16) & 1)) & np.uint32(0xFFFF0000)  # round to nearest even bf16
    return u.view(np.float32)


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
    "mixed_magnitudes": _mixed_magnitudes,
    "nonfinite": _nonfinite,
    "realistic": _realistic,
    "bf16_weights": _bf16_weights,
}


def _case(name: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(CASES[name](), dtype=np.float32).reshape(-1)


def _oracle(kind: str, x: np.ndarray) -> np.ndarray:
    from fixtures.ggml_oracle import ggml_quantize

    return np.frombuffer(ggml_quantize(TYPES[kind][1], x.reshape(-1, QK_K)), dtype=np.uint8)


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


# ---------------------------------------------------------------------------------- fast tier


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
def test_super_blocks_independent_of_chunking(kind, monkeypatch):
    """Same bytes whatever the chunking, and each super-block alone gives its own bytes."""
    quantize, _, _, block_bytes, _ = TYPES[kind]
    x = np.concatenate([_case("sub_block_scales")[:7 * QK_K], _case("constant")[:3 * QK_K]])
    whole = quantize(x)
    monkeypatch.setattr(kquants_low, "_Q2_CHUNK_BLOCKS", 3)
    monkeypatch.setattr(kquants_low, "_Q3_CHUNK_BLOCKS", 3)
    assert np.array_equal(quantize(x), whole)
    for b in range(0, 10, 3):
        assert np.array_equal(quantize(x[b * QK_K:(b + 1) * QK_K]), whole[b * block_bytes:(b + 1) * block_bytes])


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("case", ["realistic", "moderate_scales", "sub_block_scales"])
def test_round_trip_close(kind, case):
    """gguf-py dequantizes our bytes back to within the type's usual error.

    (Not for super-blocks below ~1e-6 or above ~1e6: their fp16 super-scale underflows to 0 or
    overflows, in ggml too; the bit-identity tests cover those.)
    """
    x = _case(case)
    _assert_close(kind, x, dequantize(TYPES[kind][0](x), TYPES[kind][2]))


def _assert_close(kind: str, x: np.ndarray, y: np.ndarray) -> None:
    max_rel, rms_rel = CLOSE[kind]
    assert y.shape == x.shape and np.isfinite(y).all()
    xb, eb = x.reshape(-1, QK_K).astype(np.float64), (y - x).reshape(-1, QK_K).astype(np.float64)
    worst = np.abs(eb).max(1) / np.abs(xb).max(1)
    assert worst.max() <= max_rel, (kind, worst.max(), int(worst.argmax()))
    rms = np.sqrt((eb ** 2).mean(1)) / xb.std(1)
    assert rms.max() <= rms_rel * 1.5 and np.median(rms) <= rms_rel, (kind, rms.max(), np.median(rms))


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
    """1024 super-blocks drawn from every generator above, each sub-block re-scaled on its own.

    Rare rounding-order slips (one float op in another order) show up in a few sub-blocks per
    hundred thousand values, hence the size; this is still ~0.1 s per type.
    """
    r = _rng(30)
    blocks = np.concatenate([_case(c).reshape(-1, QK_K) for c in CASES])
    x = blocks[r.integers(0, len(blocks), 1024)].reshape(-1, 16, 16).astype(np.float64)
    x *= np.exp(r.uniform(-20, 8, (1024, 1, 1))) * np.exp(r.uniform(-5, 5, (1024, 16, 1)))
    with np.errstate(over="ignore", invalid="ignore"):
        x = x.astype(np.float32).reshape(-1)
    _assert_same_blocks(kind, x, TYPES[kind][0](x), _oracle(kind, x))


@pytest.mark.runtime
def test_q2_k_exact_rounding_fallback(monkeypatch):
    """Q2_K's search rounds with rint where a bound proves it equal to nearest_int; force the exact path everywhere."""
    monkeypatch.setattr(kquants_low, "_RINT_SAFE", np.float32(0))
    for case in ("realistic", "sub_block_scales", "ties", "tiny"):
        x = _case(case)
        _assert_same_blocks("q2_k", x, quantize_q2_k(x), _oracle("q2_k", x))


@pytest.mark.runtime
@pytest.mark.parametrize("kind", TYPES)
def test_dequantized_equals_ggml(kind):
    """Through gguf-py's dequantizer our blocks and ggml's give the same floats, close to the input."""
    quantize, _, qtype, _, _ = TYPES[kind]
    x = np.concatenate([_case("realistic"), _case("moderate_scales")])
    ours = dequantize(quantize(x), qtype)
    ref = dequantize(_oracle(kind, x), qtype)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
    _assert_close(kind, x, ours)
