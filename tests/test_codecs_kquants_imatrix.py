"""K-quants with an importance matrix: byte-identical with ggml's ``quantize_row_q{2..6}_K_impl``.

Every type, both backends (the ``quantizer_backend`` fixture), against ggml itself
(``ggml_quantize_chunk`` with ``quant_weights``, what ``llama-quantize --imatrix`` runs per tensor):
adversarial values (normal, heavy-tailed, zero and constant blocks, tiny and huge magnitudes, one
outlier, rounding ties, inf/NaN), each under importance vectors with zeros, huge and tiny entries, in
rows of 256 and 512 values. Also: ``importance=None`` is still the no-imatrix ``_ref`` path, the
importance is tiled row by row (numpy tiles that split a row included), and bad importance is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dflash_convert.encoders import jit, kquants
from dflash_convert.encoders.kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from dflash_convert.encoders.kquants_low import quantize_q2_k, quantize_q3_k
from dflash_convert.format.ggml import GGMLType

backends = pytest.mark.usefixtures("quantizer_backend")  # numba and numpy (conftest)

QK_K = 256
ROWS = 8  # rows per input case and row length

TYPES: dict[str, tuple[Callable[..., np.ndarray], GGMLType]] = {
    "q2_k": (quantize_q2_k, GGMLType.Q2_K),
    "q3_k": (quantize_q3_k, GGMLType.Q3_K),
    "q4_k": (quantize_q4_k, GGMLType.Q4_K),
    "q5_k": (quantize_q5_k, GGMLType.Q5_K),
    "q6_k": (quantize_q6_k, GGMLType.Q6_K),
}


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(list(key))


def _bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) & np.uint32(0xFFFF0000)).view(np.float32)


# input cases: (rows, row length, seed) -> float64 [rows, row length]
def _normal(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    return r.standard_normal((n, row)) * 0.02


def _scaled(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    """Each row its own magnitude, 1e-12..1e8: fp16 super-scales underflow to 0 or overflow to inf."""
    return r.standard_normal((n, row)) * np.exp(r.uniform(np.log(1e-12), np.log(1e8), (n, 1)))


def _sub_block_scales(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    """Each 16-value group its own magnitude (1e-10..1e5): sub-scales that round to 0 keep the search's levels."""
    return (r.standard_normal((n, row // 16, 16)) * np.exp(r.uniform(np.log(1e-10), np.log(1e5), (n, row // 16, 1)))).reshape(n, row)


def _heavy_tailed(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    """Student-t(3) weights rounded to bf16 (rounding ties are common), as a bf16 checkpoint holds them."""
    return _bf16(r.standard_t(3, (n, row)) * 0.02)


def _zero_blocks(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    """Whole zero super-blocks and zero 32-value groups among noise."""
    x = r.standard_normal((n, row))
    x[::2, :QK_K] = 0
    x[1::3, 16:48] = 0
    return x


def _constant(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    """Constant rows (positive, negative, zero) and constant 16-value groups."""
    x = np.repeat(r.uniform(-3, 3, (n, 1)), row, axis=1)
    x[::4] = 0
    x[1, 32:48] = 7.0
    return x


def _ties(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    """Half-step grid values, and +-1 alternating: exact .5 roundings and tied maxima."""
    x = r.integers(-8, 9, (n, row)) * 0.5
    x[-1] = np.tile([1.0, -1.0], row // 2)
    return x


def _tiny(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    """1e-20 down to subnormals, and groups around GROUP_MAX_EPS (1e-15f)."""
    x = r.standard_normal((n, row)) * np.array([1e-20, 1e-30, 1e-38, 1e-40, 1e-15, 3e-16, 1e-44, 1e-10])[:n, None]
    return x


def _huge(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    """1e5 up to 1e18: sums of squares and weights near float32's range, fp16 scales far past 65504."""
    return r.standard_normal((n, row)) * np.array([1e5, 1e8, 1e12, 1e15, 1e18, 65504.0, 7e4, 1e6])[:n, None]


def _outlier(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    """One huge value per row among small ones: the other groups' scales round to 0."""
    x = r.standard_normal((n, row)) * 0.01
    x[np.arange(n), r.integers(0, row, n)] = r.choice([1e4, -1e4, 1e6, 3e3, -50.0], n)
    return x


def _nonfinite(r: np.random.Generator, n: int, row: int) -> np.ndarray:
    """inf, NaN and float32's extremes: not in sane checkpoints, but ggml's output is deterministic and we match it."""
    x = r.standard_normal((n, row))
    x[r.integers(0, n, 6), r.integers(0, row, 6)] = r.choice([np.inf, -np.inf, np.nan, 3e38, -3e38], 6)
    x[0, 0] = np.nan  # first in its group: C's min/max scans start from it
    return x


CASES: dict[str, Callable[[np.random.Generator, int, int], np.ndarray]] = {
    "normal": _normal, "scaled": _scaled, "sub_block_scales": _sub_block_scales, "heavy_tailed": _heavy_tailed,
    "zero_blocks": _zero_blocks, "constant": _constant, "ties": _ties, "tiny": _tiny, "huge": _huge,
    "outlier": _outlier, "nonfinite": _nonfinite,
}


def _importances(r: np.random.Generator, row: int) -> dict[str, np.ndarray]:
    """Importance vectors as imatrix files hold them (mean x^2 per column), and their extremes."""
    some_zero = r.gamma(0.5, 2e-3, row)
    some_zero[r.random(row) < 0.3] = 0
    q = {
        "typical": r.gamma(0.5, 2e-3, row),
        "some_zero": some_zero,
        "all_zero": np.zeros(row),
        "huge": r.random(row) * 1e30,
        "tiny": r.random(row) * 1e-30,
        "mixed": np.exp(r.uniform(np.log(1e-20), np.log(1e20), row)),
        "ones": np.ones(row),
    }
    return {k: v.astype(np.float32) for k, v in q.items()}


def _oracle(kind: str, rows: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    from fixtures.ggml_oracle import ggml_quantize

    return np.frombuffer(ggml_quantize(int(TYPES[kind][1]), rows, qw), np.uint8)


def _assert_same(kind: str, what: str, ours: np.ndarray, ref: np.ndarray, row_bytes: int) -> None:
    assert ours.dtype == np.uint8 and ours.shape == ref.shape, (what, ours.dtype, ours.shape, ref.shape)
    diff = np.flatnonzero(ours != ref)
    if diff.size:
        pytest.fail(f"{kind} {what}: {diff.size} differing bytes, first at byte {diff[0]} (row {diff[0] // row_bytes}): "
                    f"ours {ours[diff[0]]} ggml {ref[diff[0]]}")


@pytest.mark.parity
@backends
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", TYPES)
def test_bit_identical_with_ggml_impl(kind, case):
    """Every input case under every importance vector, in rows of 256 and of 512 values."""
    quantize = TYPES[kind][0]
    for row in (QK_K, 2 * QK_K):
        r = _rng(list(CASES).index(case), row)
        with np.errstate(over="ignore", invalid="ignore"):
            rows = CASES[case](r, ROWS, row).astype(np.float32)
        for name, qw in _importances(r, row).items():
            ref = _oracle(kind, rows, qw)
            _assert_same(kind, f"{case} row {row} importance {name}", quantize(rows.reshape(-1), qw), ref, ref.size // ROWS)


@pytest.mark.parity
@backends
@pytest.mark.parametrize("kind", TYPES)
def test_without_importance_is_the_ref_path(kind):
    """``importance=None`` (and no argument) gives ggml's bytes without an imatrix, which differ from the weighted ones."""
    quantize = TYPES[kind][0]
    r = _rng(99)
    rows = np.concatenate([_normal(r, 4, 512), _heavy_tailed(r, 4, 512), _sub_block_scales(r, 4, 512)]).astype(np.float32)
    ref = _oracle(kind, rows, None)
    _assert_same(kind, "no importance", quantize(rows.reshape(-1)), ref, ref.size // len(rows))
    _assert_same(kind, "importance=None", quantize(rows.reshape(-1), None), ref, ref.size // len(rows))
    weighted = quantize(rows.reshape(-1), _importances(r, 512)["typical"])
    assert (weighted != ref).mean() > 0.05  # the imatrix path really is another algorithm


@pytest.mark.parity
@backends
@pytest.mark.parametrize("kind", TYPES)
def test_importance_tiles_row_by_row(kind, monkeypatch):
    """Rows of 768 values (3 super-blocks each): the same bytes with numpy tiles of 2 super-blocks (which split
    rows) as in one call, and as ggml's; each row alone gives its slice of the whole."""
    quantize = TYPES[kind][0]
    r = _rng(7)
    rows = (r.standard_normal((5, 3 * QK_K)) * np.exp(r.uniform(-3, 3, (5, 1)))).astype(np.float32)
    qw = np.exp(r.uniform(-8, 2, 3 * QK_K)).astype(np.float32)
    ref = _oracle(kind, rows, qw)
    whole = quantize(rows.reshape(-1), qw)
    _assert_same(kind, "rows of 768", whole, ref, ref.size // 5)
    monkeypatch.setattr(kquants, "_IMATRIX_TILE", 2)
    _assert_same(kind, "tiles of 2 super-blocks", quantize(rows.reshape(-1), qw), ref, ref.size // 5)
    per_row = ref.size // 5
    assert np.array_equal(quantize(rows[3], qw), whole[3 * per_row:4 * per_row])


@backends
@pytest.mark.parametrize("kind", TYPES)
def test_bad_importance_is_refused(kind):
    quantize = TYPES[kind][0]
    x = np.zeros(2 * QK_K, np.float32)
    for bad in (np.ones(QK_K, np.float64), np.ones(3 * QK_K, np.float32), np.ones(QK_K + 16, np.float32),
                np.ones((1, QK_K), np.float32), np.ones(0, np.float32)):
        with pytest.raises(ValueError, match="importance must be float32"):
            quantize(x, bad)
    assert quantize(np.zeros(0, np.float32), np.ones(QK_K, np.float32)).shape == (0,)
    assert not quantize(x, np.ones(QK_K, np.float32)).any()  # zero blocks: all-zero bytes, as ggml


def _hard_groups(n_groups: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """([G, size] values, [G, size] weights): normal, grid (ties), constant, zero, nearly flat and huge groups
    in every tile; subnormal groups (iscale overflows), NaN and inf only in the second tile, which the exact
    kernel redoes. Weights with zeros (whole groups too), and per-value magnitudes 1e-20..1e20 (errors tie)."""
    r = _rng(seed, size)
    x = r.standard_normal((n_groups, size)) * 0.02
    x[1::9] = r.integers(-8, 9, (len(x[1::9]), size)) * 0.5
    x[2::13] = r.uniform(-3, 3, (len(x[2::13]), 1))
    x[3::17] = 0
    x[4::19] = 1.0 + r.standard_normal((len(x[4::19]), size)) * 1e-7
    x[6::29] *= 1e15
    x[64 + 5:128:23] *= 1e-40
    x = x.astype(np.float32)
    x[64 + 3, 5] = np.nan
    x[64 + 40, 7] = np.inf
    w = (r.gamma(0.5, 2e-3, (n_groups, size)) * np.exp(r.uniform(-30, 30, (n_groups, 1)))).astype(np.float32)
    w[r.random(w.shape) < 0.3] = 0
    w[7::11] = 0
    w[9::4] = np.exp(r.uniform(np.log(1e-20), np.log(1e20), (len(w[9::4]), size)))
    return np.ascontiguousarray(x), np.ascontiguousarray(w)


@pytest.mark.skipif(not jit.jit_available(), reason="numba is not installed")
def test_lane_kernels_equal_the_exact_kernels():
    """The 64-lane searches (selects, fast rounding, exact redo of a tile out of range) equal the group-by-group
    ports of make_qkx3_quants and weighted make_qx_quants, partial last tile included; no llama.cpp needed."""
    from dflash_convert.encoders import _kquant_kernels as k

    fbuf = np.empty(1, np.float32)
    ibuf = fbuf.view(np.int32)
    G = 3 * k.LANES + 17
    for n, nmax in ((16, 3), (32, 15), (32, 31)):
        x, w = _hard_groups(G, n, nmax)
        sc, mn, L = np.empty(G, np.float32), np.empty(G, np.float32), np.empty((G, n), np.uint8)
        k._qkx3_lanes(x, w, nmax, sc, mn, L)
        laux, Le = np.empty(n, np.int64), np.empty((G, n), np.uint8)
        want = np.array([k._qkx3(x[g], 0, n, w[g], nmax, Le[g], laux, fbuf, ibuf) for g in range(G)], np.float32)
        assert np.array_equal(np.stack([sc, mn], 1).view(np.uint32), want.view(np.uint32)), (n, nmax)
        assert np.array_equal(L, Le), (n, nmax)
    for nmax in (4, 32):
        x, w = _hard_groups(G, 16, nmax)
        sc, L = np.empty(G, np.float32), np.empty((G, 16), np.uint8)
        k._qx_lanes(x, w, nmax, sc, L)
        Le = np.empty((G, 16), np.uint8)
        want = np.array([k._qx_weighted(x[g], 0, 16, nmax, w[g], Le[g], fbuf, ibuf) for g in range(G)], np.float32)
        assert np.array_equal(sc.view(np.uint32), want.view(np.uint32)), nmax
        assert np.array_equal(L, Le), nmax


@backends
@pytest.mark.parametrize("kind", TYPES)
def test_thread_pool(kind):
    """Pure functions, as the pipeline's encode pool calls them: row chunks quantized concurrently give one call's bytes."""
    from concurrent.futures import ThreadPoolExecutor

    quantize = TYPES[kind][0]
    r = _rng(11)
    rows = (r.standard_normal((16, 2 * QK_K)) * 0.02).astype(np.float32)
    qw = r.gamma(0.5, 2e-3, 2 * QK_K).astype(np.float32)
    with ThreadPoolExecutor(2) as pool:
        parts = list(pool.map(lambda c: quantize(c.reshape(-1), qw), np.split(rows, 4)))
    assert np.array_equal(np.concatenate(parts), quantize(rows.reshape(-1), qw))
