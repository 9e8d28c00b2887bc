"""IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M quantizers: byte-identical with ggml, with an importance matrix (and without one where ggml allows it).

The runtime tier compares with ``ggml_quantize_chunk`` itself on the legacy/IQ4 adversarial rows plus
cases aimed at these types' branches (zero sub-blocks, tiny groups under each type's cut-off, values
on the grids' level lattice, equal values that IQ1's sort must keep in order). The pure-Python
backend is slow, so it runs on the first 1024 values of each case. The fast tier checks the tables
against the vendored source, the input contract and the importance refusals.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from test_codecs_legacy_iq4 import adversarial_cases, assert_same_bytes

from dflash_convert.encoders import iq2
from dflash_convert.format import iq2_grids

pytestmark = pytest.mark.usefixtures("quantizer_backend")  # every test on both backends (conftest)

F = np.float32

# name: (ggml type id, quantizer, bytes per 256 values, ggml requires an importance matrix)
TYPES = {
    "IQ2_XXS": (16, iq2.quantize_iq2_xxs, 66, True),
    "IQ2_XS": (17, iq2.quantize_iq2_xs, 74, True),
    "IQ2_S": (22, iq2.quantize_iq2_s, 82, False),
    "IQ1_S": (19, iq2.quantize_iq1_s, 50, True),
    "IQ1_M": (29, iq2.quantize_iq1_m, 56, False),
}
# inputs ggml's searches abort on (GGML_ASSERT on every neighbour distance overflowing; non-finite
# values anywhere): refused by ours. IQ1's split search handles near_float_max without its neighbours.
ABORTS = {"inf_and_nan": tuple(TYPES), "near_float_max": ("IQ2_XXS", "IQ2_XS", "IQ2_S")}
# relative RMS error of a decode of N(0, 1) rows with an importance of ones must stay below this
# (measured: IQ2_XXS 0.350, IQ2_XS 0.296, IQ2_S 0.266, IQ1_S 0.513, IQ1_M 0.469)
RMS_TOLERANCE = {"IQ2_XXS": 0.4, "IQ2_XS": 0.34, "IQ2_S": 0.3, "IQ1_S": 0.56, "IQ1_M": 0.52}


@functools.cache
def cases() -> dict[str, np.ndarray]:
    """The legacy/IQ4 adversarial rows plus rows aimed at these types' branches; [rows, n_per_row] float32."""
    c = dict(adversarial_cases())
    rng = np.random.default_rng(20261205)
    z = rng.standard_normal((4, 512))
    z[0, 32:64] = 0  # a zero sub-block
    z[1, :16] = 0
    z[1, 200:216] = 1e-9  # below IQ2_S's 1e-8 and IQ1_M's 1e-7 cut-offs, above the 1e-15 of IQ2_XXS/XS
    z[1, 300:332] = 1e-13  # below IQ1_S's 1e-12
    z[2, 256:] = 0  # a whole zero super-block
    z[3, ::4] = 0
    c["zero_sub_blocks"] = z.astype(F)
    g = rng.integers(0, 3, (8, 512)) * 2 + 1.0  # on the IQ2 level lattice (mostly off the grids)
    c["grid_lattice"] = (g * rng.choice([-1, 1], g.shape) * 0.01).astype(F)
    t = rng.integers(-2, 3, (8, 512)).astype(F)  # many equal values: IQ1's stable sort decides the split
    t[::2] *= F(0.5)
    c["equal_values"] = t
    return c


def _importance(n_per_row: int, seed: int) -> np.ndarray:
    """A per-column importance vector like an imatrix's: positive, spanning a few decades, some zeros."""
    rng = np.random.default_rng(seed)
    w = np.exp(rng.uniform(-6, 2, n_per_row)).astype(F)
    w[rng.integers(0, n_per_row, n_per_row // 64)] = 0
    return w


def _rows(case: str, backend: str) -> np.ndarray:
    """The case's rows; for the pure-Python backend their first 1024 values (whole rows cut to 1024 columns)."""
    rows = cases()[case]
    return rows if backend == "numba" else rows[:max(1, 1024 // rows.shape[1]), :1024]


# --------------------------------------------------------------------------------------------
# runtime tier: ggml itself
# --------------------------------------------------------------------------------------------

@pytest.mark.runtime
@pytest.mark.parametrize("case", list(cases()))
@pytest.mark.parametrize("name", list(TYPES))
def test_bit_identical_with_ggml_with_importance(name: str, case: str, quantizer_backend: str) -> None:
    from fixtures.ggml_oracle import ggml_quantize

    type_id, quantize, block_bytes, _ = TYPES[name]
    rows = _rows(case, quantizer_backend)
    qw = _importance(rows.shape[1], len(case))
    if name in ABORTS.get(case, ()):
        with pytest.raises(ValueError, match=f"{name} cannot quantize"):
            quantize(rows.reshape(-1), qw)
        return
    ours = quantize(rows.reshape(-1), qw).tobytes()
    assert_same_bytes(f"{name} on {case} with importance", ours, ggml_quantize(type_id, rows, qw), block_bytes)


@pytest.mark.runtime
@pytest.mark.parametrize("case", list(cases()))
@pytest.mark.parametrize("name", [n for n, t in TYPES.items() if not t[3]])
def test_bit_identical_with_ggml_without_importance(name: str, case: str, quantizer_backend: str) -> None:
    """IQ2_S and IQ1_M run without an importance matrix too (weights from the values alone)."""
    from fixtures.ggml_oracle import ggml_quantize

    type_id, quantize, block_bytes, _ = TYPES[name]
    rows = _rows(case, quantizer_backend)
    if name in ABORTS.get(case, ()):
        with pytest.raises(ValueError, match=f"{name} cannot quantize"):
            quantize(rows.reshape(-1))
        return
    assert_same_bytes(f"{name} on {case}", quantize(rows.reshape(-1)).tobytes(), ggml_quantize(type_id, rows), block_bytes)


@pytest.mark.runtime
@pytest.mark.parametrize("name", list(TYPES))
def test_our_decoder_matches_ggml(name: str) -> None:
    """runtime/dequant.py against ggml's own to_float, on our blocks and on random bytes (any code, any finite fp16 d)."""
    import torch

    from dflash_convert.format.ggml import GGMLType
    from dflash_convert.runtime.dequant import dequantize as ours
    from fixtures.ggml_oracle import ggml_dequantize

    type_id, quantize, block_bytes, _ = TYPES[name]
    rng = np.random.default_rng(4)
    rows = cases()["normal_mixed_subblock_scales"][:1, :2048]
    blocks = [quantize(rows.reshape(-1), _importance(rows.shape[1], 3)), rng.integers(0, 256, block_bytes * 64, dtype=np.uint8)]
    finite = blocks[1].reshape(-1, block_bytes)
    if name == "IQ1_M":  # d's bits 8-11 are byte 53's top nibble: clearing bit 10 keeps the exponent below all-ones
        finite[:, 53] &= 0xBF
    else:
        finite[:, 1] &= 0x7B  # exponent bits below all-ones: a finite fp16 d
    for q in blocks:
        got = ours(torch.from_numpy(q.copy()), GGMLType[name], (q.size // block_bytes * 256,)).numpy()
        assert np.array_equal(got.view(np.uint32), ggml_dequantize(type_id, q).view(np.uint32))


# --------------------------------------------------------------------------------------------
# fast tier
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(TYPES))
def test_round_trip_close_to_input(name: str) -> None:
    _, quantize, block_bytes, _ = TYPES[name]
    x = np.random.default_rng(7).standard_normal(8 * 256).astype(F)
    q = quantize(x, np.ones(256, F))
    assert q.dtype == np.uint8 and q.shape == (x.size // 256 * block_bytes,)
    y = dequantize(q, GGMLQuantizationType[name])
    assert y.shape == x.shape
    assert np.sqrt(np.mean((y - x) ** 2)) < RMS_TOLERANCE[name]


@pytest.mark.parametrize("name", list(TYPES))
def test_importance_is_checked_and_required_where_ggml_requires_it(name: str) -> None:
    _, quantize, _, required = TYPES[name]
    x = np.random.default_rng(11).standard_normal(2 * 512).astype(F)
    qw = _importance(512, 2)
    assert quantize(x, qw).tobytes() != quantize(x, np.ones(512, F)).tobytes()
    if required:
        with pytest.raises(ValueError, match=f"{name} needs an importance matrix"):
            quantize(x, None)
    else:
        assert quantize(x, None).tobytes() != quantize(x, np.ones(512, F)).tobytes()
    for bad in (np.ones(512, np.float64), np.ones(300, F), np.ones(768, F), np.ones((2, 256), F)):
        with pytest.raises(ValueError, match="importance must be"):
            quantize(x, bad)


@pytest.mark.parametrize("name", list(TYPES))
def test_input_contract(name: str) -> None:
    _, quantize, _, _ = TYPES[name]
    qw = np.ones(256, F)
    assert quantize(np.zeros(0, F), qw).size == 0
    with pytest.raises(TypeError):
        quantize(np.zeros(256, np.float64), qw)
    with pytest.raises(ValueError):
        quantize(np.zeros(257, F), qw)
    x = np.random.default_rng(3).standard_normal(2 * 256).astype(F)
    before = x.copy()
    assert quantize(np.repeat(x, 2)[::2], qw).tobytes() == quantize(x, qw).tobytes()  # strided views are fine
    assert np.array_equal(x, before)  # and the input is left alone


@pytest.mark.parity
def test_iq2_grids_are_ggmls() -> None:
    """The grids are ggml-quants.c's kgrid tables, and ggml-common.h's decoder grids are their levels mapped to bytes."""
    from fixtures.upstream import llama_cpp_dir

    src = llama_cpp_dir() / "ggml" / "src"
    header, quants = (src / "ggml-common.h").read_text(), (src / "ggml-quants.c").read_text()
    for name, table, points, values in (
            ("iq2xxs_grid", "kgrid_2bit_256", iq2_grids.IQ2XXS_POINTS, iq2_grids.IQ2_VALUES),
            ("iq2xs_grid", "kgrid_2bit_512", iq2_grids.IQ2XS_POINTS, iq2_grids.IQ2_VALUES),
            ("iq2s_grid", "kgrid_2bit_1024", iq2_grids.IQ2S_POINTS, iq2_grids.IQ2_VALUES),
            ("iq1s_grid", "kgrid_1bit_2048", iq2_grids.IQ1S_POINTS, iq2_grids.IQ1S_VALUES)):
        m = re.search(r"GGML_TABLE_BEGIN\(uint64_t, " + name + r",[^)]*\)\s*(.*?)GGML_TABLE_END", header, re.S)
        words = [int(v, 16) for v in re.findall(r"0x([0-9a-fA-F]+)", m.group(1))]
        assert words == [sum((values[(p >> 2 * i) & 3] & 255) << 8 * i for i in range(8)) for p in points], name
        m = re.search(table + r"\[[^\]]+\]\s*=\s*\{(.*?)\};", quants, re.S)
        assert tuple(int(v) for v in re.findall(r"\d+", m.group(1))) == points, table


def test_iq2_neighbour_lists_are_iq2xs_init_impls() -> None:
    """kmap finds every grid point; each off-grid code lists the points at its nwant nearest distances, by (distance, index)."""
    from dflash_convert.encoders import _iq2_kernels

    assert [iq2._TYPES[n][2] for n in ("IQ2_XXS", "IQ2_XS", "IQ2_S")] == [_iq2_kernels.XXS, _iq2_kernels.XS, _iq2_kernels.S]
    for name, n_points, nwant in (("IQ2_XXS", 256, 2), ("IQ2_XS", 512, 2), ("IQ2_S", 1024, 1), ("IQ1_S", 2048, 3)):
        grid, levels, kmap, neigh = iq2.tables(name)
        assert grid.shape == (n_points, 8) and (kmap >= 0).sum() == n_points
        # every off-grid code lists the grid points at its nwant nearest distances, sorted by (distance, index)
        for u in (1, 3, 7, 1000, 43690, 43691):
            if kmap[u] >= 0:
                continue
            off = -kmap[u] - 1
            listed = neigh[off + 1: off + 1 + neigh[off]].astype(int)
            pos = 2 * ((u >> 2 * np.arange(8)) & 3) + 1
            d2 = ((grid.astype(int) - pos) ** 2).sum(axis=1)
            near = np.unique(d2)[:nwant]
            assert list(listed) == sorted(np.flatnonzero(np.isin(d2, near)), key=lambda j: (d2[j], j)), (name, u)
