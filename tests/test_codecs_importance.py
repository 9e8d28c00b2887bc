"""Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS with an importance matrix: byte-identical with ggml's ``_impl`` paths.

``ggml_quantize_chunk`` with an imatrix (what llama-quantize --imatrix runs per tensor) on the
adversarial rows of test_codecs_legacy_iq4 (ties, denormals, fp16 edges, inf and NaN), each with
importance vectors that matter: lognormal, zeros, one huge weight, denormal weights; on both
backends (numba and numpy). Q8_0 ignores the importance, as ggml does.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_codecs_legacy_iq4 import TYPES, adversarial_cases, assert_same_bytes

from dflash_convert.encoders import QUANTIZERS
from dflash_convert.encoders.q8_0 import quantize_q8_0
from dflash_convert.format.ggml import GGMLType

pytestmark = [pytest.mark.runtime, pytest.mark.usefixtures("quantizer_backend")]

F = np.float32
# one case of each kind keeps the tier fast (~1 s per type); the rounding-tie and non-finite ones stay in
CASES = ("normal_scales_1e-8_to_1e4", "zeros_and_signed_zeros", "constant_blocks", "one_huge_outlier", "all_positive",
         "absmax_ties_pos_neg", "exact_rounding_ties", "denormals", "near_fp16_overflow", "near_float_max",
         "multi_block_rows", "inf_and_nan")


def importance_vectors(n: int) -> dict[str, np.ndarray]:
    """Importance [n] that steer the weighted searches differently: smooth, sparse, extreme."""
    rng = np.random.default_rng(30)
    lognormal = np.exp(rng.uniform(-6, 4, n))
    sparse = np.where(rng.random(n) < 0.3, 0.0, rng.uniform(0, 2, n))
    spike = np.full(n, 1e-3)
    spike[rng.integers(0, n, max(1, n // 64))] = 1e6
    tiny = rng.uniform(0, 1, n) * 1e-40  # denormal weights: the sums underflow
    return {k: v.astype(F) for k, v in (("lognormal", lognormal), ("sparse", sparse), ("spike", spike), ("tiny", tiny))}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", list(TYPES))
def test_importance_bit_identical_with_ggml(name: str, case: str) -> None:
    from fixtures.ggml_oracle import ggml_quantize

    type_id, quantize, _, block_bytes = TYPES[name]
    rows = adversarial_cases()[case]
    for kind, qw in importance_vectors(rows.shape[1]).items():
        with np.errstate(divide="raise", over="raise", invalid="raise"):  # no stray warnings leak out of the quantizer
            ours = quantize(rows.reshape(-1), qw).tobytes()
        assert_same_bytes(f"{name} on {case} ({kind} importance)", ours, ggml_quantize(type_id, rows, qw), block_bytes)


def test_importance_changes_the_bytes_and_q8_0_ignores_it() -> None:
    rows = adversarial_cases()["realistic_weights"]
    qw = importance_vectors(rows.shape[1])["lognormal"]
    for name, (_, quantize, _, _) in TYPES.items():
        assert quantize(rows.reshape(-1), qw).tobytes() != quantize(rows.reshape(-1)).tobytes(), name
    assert quantize_q8_0(rows.reshape(-1), qw).tobytes() == quantize_q8_0(rows.reshape(-1)).tobytes()
    assert QUANTIZERS[GGMLType.Q8_0] is quantize_q8_0


@pytest.mark.parametrize("name", list(TYPES))
def test_importance_must_fit_whole_rows(name: str) -> None:
    _, quantize, block, _ = TYPES[name]
    x = np.zeros(4 * 256, F)
    for bad in (np.ones(256, np.float64), np.ones(3 * 256, F), np.ones((2, 128), F), np.ones(block // 2 or 1, F)):
        with pytest.raises(ValueError, match="importance must be float32"):
            quantize(x, bad)
