"""``quantize --imatrix`` and ``convert --outtype TYPE --imatrix`` against the real ``llama-quantize --imatrix``: whole files.

The held-out shapes of test_quantize.py (a 256-aligned drafter with its own output head, and a 96-wide
one where every block fallback applies), an imatrix per drafter in both formats (GGUF with raw
sums, fractional and zero counts and an entry no tensor uses; legacy .dat with ncall 3, a chunk count
and a dataset), every file type, K-quant tensors with their entries included.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from gguf_compare import parity_differences

from dflash_convert import convert
from dflash_convert.errors import DFlashError
from dflash_convert.format.file_types import QUANT_TYPES
from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.quant_types import is_quantizable, requires_imatrix
from dflash_convert.quantize import quantize, quantize_options
from dflash_convert.sources.gguf import read_gguf
from fixtures.drafters import make_speculators_drafter, make_zlab_drafter
from fixtures.imatrix_files import write_gguf_imatrix, write_legacy_imatrix
from fixtures.targets import make_target_dir

pytestmark = pytest.mark.runtime

BIG = dict(layers=5, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64, vocab_size=916, draft_vocab_size=512,
           mask_token_id=4, aux_layer_ids=[1, 3])
SMALL = dict(layers=3, hidden=96, ffn=160, heads=3, kv_heads=1, head_dim=32, target_layer_ids=[0, 2])


@pytest.fixture(scope="module")
def drafters(tmp_path_factory) -> dict[str, Path]:
    """F16 GGUF files (big: 256-aligned, small: 96 wide) with a GGUF and a legacy imatrix each; the sources too."""
    root = tmp_path_factory.mktemp("quantize-imatrix")
    out: dict[str, Path] = {}
    out["big-target"] = make_target_dir(root / "gemma-256", "gemma4", hidden_size=256)
    out["small-target"] = make_target_dir(root / "qwen3-96", "qwen3", hidden_size=96)
    out["big-src"] = make_speculators_drafter(root / "big", dtype="f16", **BIG)
    out["small-src"] = make_zlab_drafter(root / "small", dtype="f16", **SMALL)
    rng = np.random.default_rng(31)
    for which in ("big", "small"):
        f16 = out[which] = convert(out[f"{which}-src"], out[f"{which}-target"], outfile=root / f"{which}-f16.gguf",
                                   outtype="f16").output
        g = read_gguf(f16)
        names = [(t.name, t.ne[0]) for t in g.tensors if is_quantizable(t.name, t.ne)]
        sums = {n: np.exp(rng.uniform(-4, 3, (1, ne0))) * 100 for n, ne0 in names}
        counts = {n: np.array([rng.choice([100.0, 37.5, 0.49, 2.5])]) for n, _ in names}  # lround: 100, 38, 0 (-> 1.0), 3
        sums["blk.99.unused.weight"], counts["blk.99.unused.weight"] = np.ones((1, 64)), np.array([1.0])
        out[f"{which}-gguf"] = write_gguf_imatrix(root / f"{which}.imatrix.gguf", sums, counts,
                                                  datasets=["calib-a.txt", "calib-b.txt"], chunk_count=7)
        out[f"{which}-dat"] = write_legacy_imatrix(root / f"{which}.imatrix.dat",
                                                   {n: np.exp(rng.uniform(-4, 3, ne0)) * 3 for n, ne0 in names},
                                                   ncall=3, chunk_count=12, dataset="wiki.train.raw")
    return out


def llama_quantize(src: Path, out: Path, qtype: str, *extra: str) -> subprocess.CompletedProcess:
    from fixtures.upstream import llama_tool

    return subprocess.run([str(llama_tool("llama-quantize")), *extra, str(src), str(out), qtype, "2"],
                          capture_output=True, text=True)


def assert_same_file(ours: Path, theirs: Path, what: str) -> None:
    if ours.read_bytes() != theirs.read_bytes():
        pytest.fail(f"{what}: files differ:\n" + "\n".join(parity_differences(ours, theirs)))


def run_both(drafters: dict[str, Path], tmp_path: Path, which: str, qtype: str, fmt: str, *flags: str) -> None:
    src, imatrix = drafters[which], drafters[f"{which}-{fmt}"]
    theirs, ours = tmp_path / "llama-quantize.gguf", tmp_path / "ours.gguf"
    pairs = list(zip(flags[::2], flags[1::2], strict=True))
    include = [v for f, v in pairs if f == "--include-weights"]
    exclude = [v for f, v in pairs if f == "--exclude-weights"]
    prune = next((v for f, v in pairs if f == "--prune-layers"), None)
    refusal = None
    try:
        quantize(src, ours, qtype, options=quantize_options(imatrix=str(imatrix), include_weights=include,
                                                            exclude_weights=exclude, prune_layers=prune))
    except DFlashError as e:
        refusal = str(e)
    r = llama_quantize(src, theirs, qtype, "--imatrix", str(imatrix), *flags)
    if refusal is not None:
        said = r.stdout + r.stderr
        assert r.returncode != 0 and not theirs.exists(), f"we refused ({refusal}), llama-quantize did not"
        assert ("importance matrix" in refusal and "Missing importance matrix" in said) or \
            ("defines no fallback" in refusal and "no tensor type fallback" in said), (refusal, said[-1500:])
        assert not ours.exists()
        return
    assert r.returncode == 0, r.stderr[-2000:]
    assert_same_file(ours, theirs, f"{which} {qtype} --imatrix {fmt} {' '.join(flags)}")


@pytest.mark.parametrize("qtype", QUANT_TYPES)
@pytest.mark.parametrize("which", ["big", "small"])
def test_bytes_with_a_gguf_imatrix(drafters, tmp_path, which, qtype):
    run_both(drafters, tmp_path, which, qtype, "gguf")


@pytest.mark.parametrize("which,qtype", [("big", "Q4_1"), ("big", "IQ3_S"), ("big", "IQ4_XS"), ("small", "Q5_0"),
                                         ("small", "IQ4_NL"), ("small", "Q2_K_S"), ("big", "Q5_K_M")])
def test_bytes_with_a_legacy_imatrix(drafters, tmp_path, which, qtype):
    """The .dat form (values divided by ncall, the trailer's chunk count and dataset recorded)."""
    run_both(drafters, tmp_path, which, qtype, "dat")


def test_bytes_with_pruned_layers(drafters, tmp_path):
    """--prune-layers: a renumbered layer takes its old name's entry (remap_imatrix)."""
    run_both(drafters, tmp_path, "small", "IQ4_NL", "gguf", "--prune-layers", "1")


def test_include_weights_and_the_keys(drafters, tmp_path):
    """--include-weights keeps matching entries only: the bytes and quantize.imatrix.entries_count follow."""
    run_both(drafters, tmp_path, "small", "Q4_0", "gguf", "--include-weights", "attn_", "--include-weights", "ffn_down")
    g = read_gguf(tmp_path / "ours.gguf")
    assert list(g.metadata)[-4:] == ["quantize.imatrix.file", "quantize.imatrix.dataset", "quantize.imatrix.entries_count",
                                     "quantize.imatrix.chunks_count"]
    assert g.get("quantize.imatrix.dataset") == "calib-a.txt" and g.get("quantize.imatrix.chunks_count") == 7
    assert g.get("quantize.imatrix.entries_count") == 3 * 5  # q, k, v, output and ffn_down of 3 layers


def test_an_imatrix_for_every_entry_changes_the_bytes(drafters, tmp_path):
    plain = quantize(drafters["small"], tmp_path / "plain.gguf", "Q4_0").output
    weighted = quantize(drafters["small"], tmp_path / "w.gguf", "Q4_0",
                        options=quantize_options(imatrix=str(drafters["small-gguf"]))).output
    assert plain.read_bytes() != weighted.read_bytes()


def test_convert_outtype_with_an_imatrix_is_convert_then_quantize(drafters, tmp_path):
    src, target, imatrix = drafters["small-src"], drafters["small-target"], drafters["small-gguf"]
    one = convert(src, target, outfile=tmp_path / "one.gguf", outtype="Q5_1", imatrix=str(imatrix)).output
    two = quantize(drafters["small"], tmp_path / "two.gguf", "Q5_1", options=quantize_options(imatrix=str(imatrix))).output
    assert one.read_bytes() == two.read_bytes()


# --- refusals: llama-quantize's, one error line each, nothing written

@pytest.mark.parametrize("case", ["missing-metadata", "non-finite", "wrong-length", "missing-entry"])
def test_refusals_agree_with_llama_quantize(drafters, tmp_path, case):
    g = read_gguf(drafters["big"])
    names = {t.name: t.ne[0] for t in g.tensors if is_quantizable(t.name, t.ne)}
    sums = {n: np.ones((1, ne0)) for n, ne0 in names.items()}
    counts = {n: np.array([1.0]) for n in names}
    kw: dict = {}
    qtype, theirs_says, ours_says = "Q4_0", "", ""
    if case == "missing-metadata":
        kw, theirs_says, ours_says = dict(chunk_size=None), "missing imatrix metadata", "missing imatrix metadata"
    elif case == "non-finite":
        sums["blk.1.attn_k.weight"][0, 5] = np.inf
        theirs_says, ours_says = "non-finite value", "non-finite value"
    elif case == "wrong-length":
        sums["blk.2.ffn_up.weight"] = np.ones((1, 128))
        theirs_says, ours_says = "imatrix size 128 is different from tensor size 256", "has 128 values; the tensor needs 256"
    else:
        del sums["blk.0.attn_q.weight"], counts["blk.0.attn_q.weight"]
        qtype, theirs_says, ours_says = "Q2_K_S", "Missing importance matrix for tensor blk.0.attn_q.weight", \
            "missing importance matrix for tensor blk.0.attn_q.weight"
    imatrix = write_gguf_imatrix(tmp_path / f"{case}.gguf", sums, counts, **kw)
    theirs = tmp_path / "theirs.gguf"
    r = llama_quantize(drafters["big"], theirs, qtype, "--imatrix", str(imatrix))
    assert r.returncode != 0 and theirs_says in r.stdout + r.stderr, (r.stdout + r.stderr)[-1500:]
    out = tmp_path / "ours.gguf"
    r = run_cli("quantize", "--imatrix", imatrix, drafters["big"], out, qtype)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("dflash-convert: error:") and ours_says in err[0], err
    assert str(imatrix) in err[0] or case == "missing-entry"
    assert not out.exists()


def test_include_and_exclude_together_is_a_usage_error(drafters, tmp_path):
    r = run_cli("quantize", "--imatrix", drafters["big-gguf"], "--include-weights", "attn", "--exclude-weights", "ffn",
                drafters["big"], tmp_path / "o.gguf", "Q4_0")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 64 and len(err) == 1 and "cannot be used together" in err[0]


def test_requires_imatrix_still_refused_without_one(drafters, tmp_path):
    assert requires_imatrix("blk.0.attn_q.weight", GGMLType.IQ3_XXS, "IQ3_XXS")
    with pytest.raises(DFlashError, match="needs an importance matrix"):
        quantize(drafters["big"], tmp_path / "o.gguf", "IQ3_XXS")
