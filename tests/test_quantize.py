"""quantize and convert --outtype TYPE: bit-identical to llama-quantize (no imatrix), one pass from a checkpoint.

The runtime tier runs the real llama-quantize (built from the 0.3.36 sdist) on the same F16 and
BF16 drafters and demands identical files, byte for byte, for every TYPE: a drafter whose rows
are all multiples of 256 (the K-quant and IQ4_XS paths, the Q4_K_M/Q5_K_M mixes over 5 layers,
the output rule on an own-vocabulary head, d2t kept as I64), and a small one whose rows force
the fallbacks.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import run_cli
from gguf_compare import parity_differences

from dflash_convert import convert
from dflash_convert.errors import DFlashError
from dflash_convert.quantize import QUANT_TYPES, quantize
from dflash_convert.sources.gguf import read_gguf
from fixtures.drafters import make_speculators_drafter, make_zlab_drafter
from fixtures.model_cards import write_model_card
from fixtures.targets import make_target_dir

SPEC = dict(layers=5, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64, vocab_size=916, draft_vocab_size=512,
            mask_token_id=4, aux_layer_ids=[1, 3])


# what we say when we refuse a TYPE for a drafter, and what llama-quantize says then
REFUSALS = (("needs an importance matrix", "requires an importance matrix"),  # IQ3_XXS, IQ3_XS, Q2_K_S on 256-wide rows
            ("defines no fallback", "no tensor type fallback is defined"))  # Q1_0 on rows not a multiple of 128


@pytest.fixture(scope="module")
def drafters(tmp_path_factory) -> dict[str, Path]:
    """F16 and BF16 GGUF files of a 256-aligned drafter and of a small one (fallbacks)."""
    root = tmp_path_factory.mktemp("quantize")
    big_target = make_target_dir(root / "gemma-256", "gemma4", hidden_size=256)
    small_target = make_target_dir(root / "qwen3-96", "qwen3", hidden_size=96)
    out = {}
    for dtype in ("f16", "bf16"):
        big = make_speculators_drafter(root / f"big-{dtype}", dtype=dtype, **SPEC)
        small = make_zlab_drafter(root / f"small-{dtype}", dtype=dtype, layers=3, hidden=96, ffn=160, heads=3, kv_heads=1,
                                  head_dim=32, target_layer_ids=[0, 2])
        write_model_card(small, "list_base")  # card keys (base models, datasets, tags, sampling) copied as llama-quantize copies them
        out[f"big-{dtype}"] = convert(big, big_target, outfile=root / f"big-{dtype}.gguf", outtype=dtype).output
        out[f"small-{dtype}"] = convert(small, small_target, outfile=root / f"small-{dtype}.gguf", outtype=dtype).output
        out[f"big-{dtype}-src"], out[f"small-{dtype}-src"] = big, small
    out["big-target"], out["small-target"] = big_target, small_target
    return out


def llama_quantize(src: Path, out: Path, qtype: str, *extra: str) -> subprocess.CompletedProcess:
    from fixtures.upstream import llama_tool

    return subprocess.run([str(llama_tool("llama-quantize")), *extra, str(src), str(out), qtype, "2"], capture_output=True, text=True)


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.parametrize("qtype", QUANT_TYPES)
@pytest.mark.parametrize("which", ["big-f16", "big-bf16", "small-f16", "small-bf16"])
def test_bit_identical_to_llama_quantize(drafters, tmp_path, which, qtype):
    src = drafters[which]
    theirs, ours = tmp_path / "llama-quantize.gguf", tmp_path / "ours.gguf"
    r = llama_quantize(src, theirs, qtype)
    try:
        plan = quantize(src, ours, qtype)
    except DFlashError as e:  # a type llama-quantize refuses on this drafter: refused by both, nothing written
        theirs_says = next((t for o, t in REFUSALS if o in str(e)), None)
        assert theirs_says is not None, e
        assert r.returncode != 0 and theirs_says in r.stdout + r.stderr, r.stderr[-2000:]
        assert not ours.exists() and not theirs.exists()
        return
    assert r.returncode == 0, r.stderr[-2000:]
    if which.startswith("small"):  # the model card's keys are among those both copy
        assert read_gguf(theirs).get("general.base_model.count") == 3 and read_gguf(theirs).get("general.tags") == ["dflash", "draft"]
    if ours.read_bytes() != theirs.read_bytes():
        diffs = parity_differences(ours, theirs)
        g, h = read_gguf(ours), read_gguf(theirs)
        diffs += [f"general differs: {k}" for k in g.metadata if k.startswith("general.") and g.metadata[k] != h.metadata.get(k)]
        pytest.fail(f"{which} {qtype}: files differ:\n" + "\n".join(diffs))
    # the fallbacks llama-quantize reports are the ones we planned
    if plan.fallbacks:
        assert f"{plan.fallbacks} of {len(plan.tensors)} tensor(s) required fallback quantization" in r.stdout + r.stderr
    if which.startswith("big") and qtype in ("Q4_K_M", "Q2_K", "IQ4_XS", "Q6_K"):
        assert plan.fallbacks == 0  # every row fills whole 256-blocks: no fallback hides the K-quant path


def test_small_drafter_uses_fallbacks(drafters, tmp_path):
    plan = quantize(drafters["small-bf16"], tmp_path / "q.gguf", "Q4_K_M", dry_run=True)
    assert plan.fallbacks > 0 and not (tmp_path / "q.gguf").exists()
    types = {p.tensor.gguf_name: p.ggml_type.name for p in plan.tensors}
    assert types["blk.0.attn_q.weight"] == "Q5_0"  # rows of 96: Q4_K -> Q5_0
    assert types["blk.0.attn_norm.weight"] == "F32"


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["Q4_K_M", "Q8_0", "IQ4_NL", "Q3_K_S"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_convert_outtype_is_convert_then_quantize(drafters, tmp_path, dtype, qtype):
    """One pass from the checkpoint writes exactly what convert (auto: bf16/f16) + quantize writes."""
    src, target = drafters[f"small-{dtype}-src"], drafters["small-target"]
    one = convert(src, target, outfile=tmp_path / "one.gguf", outtype=qtype).output
    two = quantize(convert(src, target, outfile=tmp_path / "mid.gguf", outtype=dtype).output, tmp_path / "two.gguf", qtype).output
    assert one.read_bytes() == two.read_bytes()


def test_keep_type(drafters, tmp_path):
    plan = quantize(drafters["big-bf16"], tmp_path / "k.gguf", "Q4_K_M", keep_types=["blk.[01].attn_*=Q8_0"])
    types = {t.name: t.ggml_type.name for t in read_gguf(plan.output).tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["blk.1.attn_output.weight"] == "Q8_0"
    assert types["blk.2.attn_q.weight"] == "Q4_K" and types["blk.0.ffn_up.weight"] == "Q4_K"
    assert types["blk.0.attn_norm.weight"] == "F32"  # not a quantized tensor: the glob leaves it alone
    with pytest.raises(DFlashError, match="unknown or unsupported tensor type"):
        quantize(drafters["big-bf16"], tmp_path / "x.gguf", "Q4_K_M", keep_types=["blk.0.*=Q9_9"])
    with pytest.raises(DFlashError, match="matches no quantized tensor"):
        quantize(drafters["big-bf16"], tmp_path / "x.gguf", "Q4_K_M", keep_types=["nothing.*=Q8_0"])
    with pytest.raises(DFlashError, match="expected PATTERN=TYPE"):
        quantize(drafters["big-bf16"], tmp_path / "x.gguf", "Q4_K_M", keep_types=["blk.0.attn_q.weight"])
    assert not (tmp_path / "x.gguf").exists()


def test_the_collector_is_back_as_it_was_after_a_pass(drafters, tmp_path):
    """The pipeline turns the cyclic collector off while chunks stream; it must be on again after a
    pass (and after one that fails), and stay off for a caller who had turned it off."""
    import gc

    assert gc.isenabled()
    quantize(drafters["big-f16"], tmp_path / "a.gguf", "Q4_0")
    assert gc.isenabled()
    with pytest.raises(DFlashError):
        quantize(drafters["big-f16"], tmp_path / "a.gguf", "Q4_0")  # exists: refused
    assert gc.isenabled()
    gc.disable()
    try:
        quantize(drafters["big-f16"], tmp_path / "b.gguf", "Q4_0")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_requantize_needs_the_flag(drafters, tmp_path):
    q8 = quantize(drafters["big-f16"], tmp_path / "q8.gguf", "Q8_0").output
    with pytest.raises(DFlashError, match="allow-requantize"):
        quantize(q8, tmp_path / "q4.gguf", "Q4_K_M")
    r = run_cli("quantize", q8, tmp_path / "q4.gguf", "Q4_K_M")
    assert r.returncode == 1 and "--allow-requantize" in r.stderr and not (tmp_path / "q4.gguf").exists()
    plan = quantize(q8, tmp_path / "q4.gguf", "Q4_K_M", allow_requantize=True)
    assert {t.ggml_type.name for t in read_gguf(plan.output).tensors} >= {"Q4_K", "Q6_K"}


def test_cli_dry_run_and_errors(drafters, tmp_path):
    src = drafters["big-bf16"]
    r = run_cli("quantize", src, tmp_path / "d.gguf", "q4_k_m", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "blk.0.attn_v.weight" in r.stdout and "BF16  -> Q6_K" in r.stdout and "dry run: nothing written" in r.stdout
    assert not (tmp_path / "d.gguf").exists()
    r = run_cli("quantize", src, tmp_path / "d.gguf", "Q7_K")
    assert r.returncode == 64 and "Invalid value for 'TYPE': 'Q7_K'" in r.stderr  # the command line is wrong
    r = run_cli("quantize", src, src, "Q8_0", "--force")
    assert r.returncode == 1 and "overwrite an input" in r.stderr
    r = run_cli("quantize", tmp_path / "missing.gguf", tmp_path / "o.gguf", "Q8_0")
    assert r.returncode == 2 and "missing.gguf" in r.stderr
    r = run_cli("quantize", src, tmp_path / "o.gguf", "Q8_0", "-q")
    assert r.returncode == 0 and r.stdout == "" and (tmp_path / "o.gguf").is_file()
    r = run_cli("quantize", src, tmp_path / "o2.gguf", "Q8_0")
    assert r.returncode == 0 and "wrote" in r.stdout
