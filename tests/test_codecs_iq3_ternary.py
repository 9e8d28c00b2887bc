"""TQ1_0, TQ2_0, IQ3_XXS, IQ3_S, Q1_0 and Q2_0 quantizers: byte-identical with ggml, with and without an importance matrix.

The runtime tier compares with ``ggml_quantize_chunk`` itself (the libggml-base of the cached build)
on the adversarial inputs of the legacy/IQ4 tests plus cases aimed at these types' own branches
(sub-blocks of zeros, which shift IQ3_S's packed bytes; values on and off the IQ3 grids). The fast
tier checks the ternary codes against their definition and that every type decodes (gguf-py)
close to its input (gguf-py's decoders; Q1_0 and Q2_0, which gguf-py lacks, by our runtime's, which the
runtime tier compares with ggml's own ``to_float``).
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from test_codecs_legacy_iq4 import adversarial_cases, assert_same_bytes

from dflash_convert.encoders import iq3, low_bit, ternary
from dflash_convert.format import iq3_grids
from dflash_convert.format.ggml import GGMLType

pytestmark = pytest.mark.usefixtures("quantizer_backend")  # every test on both backends (conftest)

F = np.float32

# name: (ggml type id, quantizer, bytes per 256 values, takes an importance matrix)
TYPES = {
    "TQ1_0": (34, ternary.quantize_tq1_0, 54, False),
    "TQ2_0": (35, ternary.quantize_tq2_0, 66, False),
    "IQ3_XXS": (18, iq3.quantize_iq3_xxs, 98, True),
    "IQ3_S": (21, iq3.quantize_iq3_s, 110, True),
    "Q1_0": (41, low_bit.quantize_q1_0, 36, False),
    "Q2_0": (42, low_bit.quantize_q2_0, 72, False),
}
BLOCK = {"Q1_0": 128, "Q2_0": 64}  # values per block where not 256
IQ3 = [n for n, (_, _, _, takes) in TYPES.items() if takes]
# inputs ggml's IQ3 search aborts on (GGML_ASSERT): refused by ours instead
IQ3_ABORTS = ("inf_and_nan", "near_float_max")

# relative RMS error of a decode of N(0, 1) rows must stay below this (measured: TQ 0.797: ternary
# with d = max|x| rounds most of a Gaussian to 0; IQ3_XXS 0.214, IQ3_S 0.167; Q1_0 0.601, Q2_0 0.711)
RMS_TOLERANCE = {"TQ1_0": 0.85, "TQ2_0": 0.85, "IQ3_XXS": 0.25, "IQ3_S": 0.2, "Q1_0": 0.65, "Q2_0": 0.75}


def decode(name: str, q: np.ndarray) -> np.ndarray:
    """Blocks -> float32 values: gguf-py's decoder, or ours (runtime/dequant.py) for the types gguf-py lacks."""
    if name in BLOCK:
        import torch

        from dflash_convert.runtime.dequant import dequantize as ours

        n = q.size // 18 * BLOCK[name]
        return ours(torch.from_numpy(q.copy()), GGMLType[name], (n,)).numpy()
    return dequantize(q, GGMLQuantizationType[name])


@functools.cache
def cases() -> dict[str, np.ndarray]:
    """The legacy/IQ4 adversarial rows plus rows aimed at these types' branches; [rows, n_per_row] float32."""
    c = dict(adversarial_cases())
    rng = np.random.default_rng(20261205)
    z = rng.standard_normal((4, 512))
    z[0, 32:64] = 0  # a zero sub-block: IQ3_S skips it and writes the next sub-blocks' bytes earlier
    z[1, :32] = 0
    z[1, 200:232] = 1e-9  # below IQ3_XXS's 1e-8 cut-off, above IQ3_S's (exactly 0)
    z[2, 256:] = 0  # a whole zero super-block
    z[3, ::4] = 0
    c["zero_sub_blocks"] = z.astype(F)
    g = rng.integers(0, 8, (8, 512)) * 2 + 1.0  # on the IQ3 level lattice (mostly off the grids)
    c["grid_lattice"] = (g * rng.choice([-1, 1], g.shape) * 0.01).astype(F)
    return c


def _importance(n_per_row: int, seed: int) -> np.ndarray:
    """A per-column importance vector like an imatrix's: positive, spanning a few decades, some zeros."""
    rng = np.random.default_rng(seed)
    w = np.exp(rng.uniform(-6, 2, n_per_row)).astype(F)
    w[rng.integers(0, n_per_row, n_per_row // 64)] = 0
    return w


# --------------------------------------------------------------------------------------------
# runtime tier: ggml itself
# --------------------------------------------------------------------------------------------

@pytest.mark.runtime
@pytest.mark.parametrize("case", list(cases()))
@pytest.mark.parametrize("name", list(TYPES))
def test_bit_identical_with_ggml(name: str, case: str) -> None:
    from fixtures.ggml_oracle import ggml_quantize

    type_id, quantize, block_bytes, takes = TYPES[name]
    block_bytes = 18 if name in BLOCK else block_bytes
    rows = cases()[case]
    if takes and case in IQ3_ABORTS:
        with pytest.raises(ValueError, match=f"{name} cannot quantize"):
            quantize(rows.reshape(-1))
        return
    ours = quantize(rows.reshape(-1)).tobytes()
    assert_same_bytes(f"{name} on {case}", ours, ggml_quantize(type_id, rows), block_bytes)


@pytest.mark.runtime
@pytest.mark.parametrize("case", [c for c in cases() if c not in IQ3_ABORTS])
@pytest.mark.parametrize("name", IQ3)
def test_bit_identical_with_ggml_with_importance(name: str, case: str) -> None:
    """With an importance matrix (per column, the same for every row) the weights take ggml's other path."""
    from fixtures.ggml_oracle import ggml_quantize

    type_id, quantize, block_bytes, _ = TYPES[name]
    rows = cases()[case]
    qw = _importance(rows.shape[1], len(case))
    ours = quantize(rows.reshape(-1), qw).tobytes()
    assert_same_bytes(f"{name} on {case} with importance", ours, ggml_quantize(type_id, rows, qw), block_bytes)


@pytest.mark.runtime
@pytest.mark.parametrize("name", [n for n in TYPES if n not in IQ3])
def test_importance_ignored_as_ggml_ignores_it(name: str) -> None:
    """TQ1_0/TQ2_0/Q1_0/Q2_0 ignore an importance matrix: ggml's bytes with one are its bytes without one, and ours."""
    from fixtures.ggml_oracle import ggml_quantize

    type_id, quantize, _, _ = TYPES[name]
    rows = cases()["realistic_weights"]
    qw = _importance(rows.shape[1], 1)
    assert ggml_quantize(type_id, rows, qw) == quantize(rows.reshape(-1)).tobytes() == quantize(rows.reshape(-1), qw).tobytes()


# --------------------------------------------------------------------------------------------
# fast tier
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["TQ1_0", "TQ2_0"])
def test_ternary_codes_are_the_definition(name: str) -> None:
    """Decoded values are fp16(max|x|) times x/max|x| rounded half away from zero, for every value."""
    _, quantize, _, _ = TYPES[name]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 256)).astype(F)
    x[0, :] = np.repeat([-1.0, -0.5, 0.5, 1.0], 64)  # exact halves: away from zero
    x[1] = 0
    d = np.abs(x).max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(d > 0, x / d, 0)
    trit = np.sign(r) * np.floor(np.abs(r) + 0.5)
    want = trit * d.astype(np.float16).astype(F)
    got = dequantize(quantize(x.reshape(-1)), GGMLQuantizationType[name]).reshape(x.shape)
    assert np.array_equal(got, want.astype(F))


@pytest.mark.parametrize("name", list(TYPES))
def test_round_trip_close_to_input(name: str) -> None:
    _, quantize, block_bytes, _ = TYPES[name]
    x = np.random.default_rng(7).standard_normal(64 * 256).astype(F)
    q = quantize(x)
    assert q.dtype == np.uint8 and q.shape == (x.size // 256 * block_bytes,)
    y = decode(name, q)
    assert y.shape == x.shape
    assert np.sqrt(np.mean((y - x) ** 2)) < RMS_TOLERANCE[name]


@pytest.mark.parametrize("name", IQ3)
def test_importance_changes_the_result_and_is_checked(name: str) -> None:
    _, quantize, _, _ = TYPES[name]
    x = np.random.default_rng(11).standard_normal(4 * 512).astype(F)
    qw = _importance(512, 2)
    assert quantize(x, qw).tobytes() != quantize(x).tobytes()
    assert quantize(x, np.ones(512, F)).tobytes() != quantize(x).tobytes()  # qw*sqrt(sigma2 + x*x), not x*x
    for bad in (np.ones(512, np.float64), np.ones(300, F), np.ones(768, F), np.ones((2, 256), F)):
        with pytest.raises(ValueError, match="importance must be"):
            quantize(x, bad)


@pytest.mark.parity  # reads the vendored source: the sdist
def test_iq3_tables_are_ggmls() -> None:
    """The grids are ggml-common.h's (levels -> values) and ggml-quants.c's; the neighbour lists as iq3xs_init_impl builds them."""
    from fixtures.upstream import llama_cpp_dir

    src = llama_cpp_dir() / "ggml" / "src"
    if not src.is_dir():
        pytest.skip("the vendored llama.cpp source is not cached")
    header, quants = (src / "ggml-common.h").read_text(), (src / "ggml-quants.c").read_text()
    for name, table, points, values in (("iq3xxs_grid", "kgrid_256", iq3_grids.IQ3XXS_POINTS, iq3_grids.IQ3XXS_VALUES),
                                        ("iq3s_grid", "kgrid_512", iq3_grids.IQ3S_POINTS, iq3_grids.IQ3S_VALUES)):
        m = re.search(name + r"[^{]*?\)\s*(.*?)GGML_TABLE_END", header, re.S)
        words = [int(v, 16) for v in re.findall(r"0x([0-9a-fA-F]+)", m.group(1))]
        assert words == [sum(values[(p >> 3 * i) & 7] << 8 * i for i in range(4)) for p in points], name
        m = re.search(table + r"\[\d+\]\s*=\s*\{(.*?)\};", quants, re.S)
        assert tuple(int(v) for v in re.findall(r"\d+", m.group(1))) == points, table
    for name, n_points in (("IQ3_XXS", 256), ("IQ3_S", 512)):
        grid, kmap, neigh = iq3.tables(name)
        assert grid.shape == (n_points, 4) and (kmap >= 0).sum() == n_points
        # every off-grid point lists its nearest grid points first, sorted by (distance, index)
        for u in (1, 3, 100, 4095):
            if kmap[u] >= 0:
                continue
            off = -kmap[u] - 1
            listed = neigh[off + 1: off + 1 + neigh[off]].astype(int)
            pos = 2 * ((u >> 3 * np.arange(4)) & 7) + 1
            d2 = ((grid.astype(int) - pos) ** 2).sum(axis=1)
            assert d2[listed[0]] == d2.min() and list(listed) == sorted(listed, key=lambda j: (d2[j], j))


@pytest.mark.parametrize("name", list(TYPES))
def test_input_contract(name: str) -> None:
    _, quantize, _, _ = TYPES[name]
    assert quantize(np.zeros(0, F)).size == 0
    with pytest.raises(TypeError):
        quantize(np.zeros(256, np.float64))
    with pytest.raises(ValueError):
        quantize(np.zeros(257, F))
    x = np.random.default_rng(3).standard_normal(4 * 256).astype(F)
    before = x.copy()
    assert quantize(np.repeat(x, 2)[::2]).tobytes() == quantize(x).tobytes()  # strided views are fine
    assert np.array_equal(x, before)  # and the input is left alone


@pytest.mark.runtime
@pytest.mark.parametrize("name", list(BLOCK))
def test_our_decoder_matches_ggml_for_the_types_gguf_py_lacks(name: str) -> None:
    """Q1_0/Q2_0: runtime/dequant.py against ggml's own to_float, on our blocks and on random bytes (any code, any fp16 d)."""
    from fixtures.ggml_oracle import ggml_dequantize

    type_id, quantize, _, _ = TYPES[name]
    rng = np.random.default_rng(4)
    blocks = [quantize(cases()["realistic_weights"].reshape(-1)), rng.integers(0, 256, 18 * 64, dtype=np.uint8)]
    finite = blocks[1].reshape(-1, 18)
    finite[:, 1] &= 0x7B  # exponent bits below all-ones: a finite fp16 d
    for q in blocks:
        assert np.array_equal(decode(name, q).view(np.uint32), ggml_dequantize(type_id, q).view(np.uint32))
