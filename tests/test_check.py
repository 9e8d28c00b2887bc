"""``dflash_convert.check``: the API behind ``dflash-convert check``.

What is proved, on tiny converted drafters: a correct F32 file passes with every draft token
equal; F16 and Q8_0 files pass their looser limits (and the quantization report against the F32
sibling is filled in); files broken on purpose (wrong rope base, gate/up swapped, a scaled norm)
fail, naming the metric that differs; ``save_io`` writes exactly its schema, atomically and never
over an input; a Qwen3.5-style drafter whose sliding window is smaller than the block gets the
semantics-gap warning, a plain drafter does not.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from drafter_gguf import (
    Tensor,
    get_tensor,
    map_key,
    read_parts,
    scale_tensor,
    set_tensor,
    swap_tensors,
    write_parts,
)
from safetensors.torch import save_file

from dflash_convert import convert
from dflash_convert.check import SCHEMA, CheckReport, check, precision_class
from dflash_convert.drafter import Origin
from dflash_convert.errors import DFlashError, InputFileError
from dflash_convert.format.check_limits import THRESHOLDS
from dflash_convert.format.tensors import layer_name
from dflash_convert.quantize import quantize
from dflash_convert.runtime.compare import compare, kl_mean, near_ties
from dflash_convert.runtime.diagnose import hparam_differences, tensor_differences
from dflash_convert.runtime.forward import ForwardResult
from dflash_convert.runtime.reference import load_reference
from dflash_convert.runtime.weights import LAYER_ROLES
from dflash_convert.sources.checkpoint import read_checkpoint
from dflash_convert.sources.dispatch import read_checkpoint_drafter
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.sources.gguf_drafter import drafter_from_gguf, read_drafter
from dflash_convert.sources.target import read_target
from dflash_convert.tensor_source import ArraySource
from fixtures.drafters import make_zlab_drafter

CTX = 7  # a short context keeps every check well under a second of compute
EMBED_NAMES = {"qwen3": "model.embed_tokens.weight", "qwen35": "model.language_model.embed_tokens.weight"}
QWEN35 = dict(schema="nested", vocab_size=248320, mask_token_id=248077)


def _target(root: Path, source: Path, kind: str) -> Path:
    """The session's target directory plus an embedding-only safetensors (all a drafter reads; the head is tied)."""
    out = root / f"target-{kind}"
    shutil.copytree(source, out)
    cfg = json.loads((out / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    g = torch.Generator().manual_seed(7)
    emb = (torch.randn(text["vocab_size"], text["hidden_size"], generator=g) * 0.05).to(torch.bfloat16)
    save_file({EMBED_NAMES[kind]: emb}, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def dense(tmp_path_factory, qwen3_target) -> tuple[Path, Path, Path, Path]:
    """(work folder, checkpoint, target directory, F32 GGUF) of a plain Qwen3-layout drafter."""
    root = tmp_path_factory.mktemp("check")
    src = make_zlab_drafter(root / "dense", target_layer_ids=[0, 2])
    tgt = _target(root, qwen3_target, "qwen3")
    out = root / "dense-f32.gguf"
    convert(src, tgt, outfile=out, outtype="f32")
    return root, src, tgt, out


def _check(dense, gguf: Path, **kw) -> CheckReport:
    _, src, tgt, _ = dense
    return check(gguf, src, target_model_dir=tgt, device="cpu", context=CTX, **kw)


# --- correct files pass ---------------------------------------------------------------------------


def test_f32_passes_with_every_token_equal(dense):
    rep = _check(dense, dense[3])
    assert rep.passed and rep.exit_code == 0, rep.render_text()
    assert rep.file_type == "F32" and rep.precision_class == "F32"
    assert rep.metrics["top1_agreement"] == 1.0 and rep.metrics["slots"] == 15
    assert rep.metrics["hidden_max_rel_err"] < 1e-5
    assert not rep.semantics_gap["differs"] and not any("as it was trained" in w for w in rep.warnings)
    doc = json.loads(rep.to_json())
    assert doc["schema"] == SCHEMA and doc["result"] == "pass" and doc["device"] == "cpu"
    for k in ("file", "checkpoint", "device", "file_type", "metrics", "thresholds", "result", "warnings", "semantics_gap"):
        assert k in doc, k
    assert doc["thresholds"] == THRESHOLDS["F32"].as_dict()
    assert rep.render_text().endswith("PASS")


@pytest.mark.parametrize("qtype,cls", [("F16", "F16"), ("Q8_0", "Q8_0"), ("Q4_K_M", "Q4")])
def test_quantized_files_pass(dense, qtype, cls):
    root, _, _, f32 = dense
    out = root / f"dense-{qtype}.gguf"
    quantize(f32, out, qtype)
    rep = _check(dense, out, reference_gguf=f32)
    assert rep.passed, rep.render_text()
    assert rep.precision_class == cls and rep.file_type == qtype
    q = rep.metrics["against_reference_gguf"]
    assert q["file_type"] == "F32" and q["hidden_max_rel_err"] < THRESHOLDS[cls].hidden_max_rel
    assert "top-1 agreement" in rep.render_text()


def test_quantized_file_finds_its_full_precision_sibling(dense, tmp_path):
    """model-Q8_0.gguf next to model-f16.gguf: the quantization report needs no flag."""
    _, _, _, f32 = dense
    f16, q8 = tmp_path / "model-f16.gguf", tmp_path / "model-Q8_0.gguf"
    quantize(f32, f16, "F16")
    quantize(f16, q8, "Q8_0")
    rep = _check(dense, q8)
    q = rep.metrics["against_reference_gguf"]
    assert q is not None and q["file"] == str(f16) and q["file_type"] == "F16" and q["found_by_name"] is True
    assert "the full-precision sibling found by name" in rep.render_text()
    alone = tmp_path / "alone-Q8_0.gguf"
    shutil.copyfile(q8, alone)
    assert _check(dense, alone).metrics["against_reference_gguf"] is None
    assert _check(dense, f16).metrics["against_reference_gguf"] is None  # full precision: no sibling sought
    (tmp_path / "bogus-f32.gguf").write_bytes(b"not a gguf")
    shutil.copyfile(q8, tmp_path / "bogus-Q8_0.gguf")
    rep = _check(dense, tmp_path / "bogus-Q8_0.gguf")
    assert rep.passed and rep.metrics["against_reference_gguf"] is None
    assert any(w.startswith("no quantization report: the file named like a full-precision sibling is not one") for w in rep.warnings)


# --- files broken on purpose fail, naming what differs ---------------------------------------------


def _wrong_rope_base(parts):
    return map_key(parts, "rope_freq_base", lambda v: v / 100)


def _swap_gate_up(parts):
    return swap_tensors(parts, layer_name(0, LAYER_ROLES["gate"]), layer_name(0, LAYER_ROLES["up"]))


def _scaled_norm(parts):
    return scale_tensor(parts, layer_name(1, LAYER_ROLES["ffn_norm"]), 1.5)


@pytest.mark.parametrize("what,edit", [("rope-base", _wrong_rope_base), ("swapped-gate-up", _swap_gate_up),
                                       ("scaled-norm", _scaled_norm)])
def test_broken_file_fails(dense, what, edit):
    root, _, _, f32 = dense
    out = write_parts(root / f"broken-{what}.gguf", edit(read_parts(f32)))
    rep = _check(dense, out)
    assert not rep.passed and rep.exit_code == 1
    assert any(f.startswith("hidden states differ: max rel error") for f in rep.failures), rep.failures
    text = rep.render_text()
    assert "FAIL: hidden states differ" in text and text.endswith("FAIL")
    assert json.loads(rep.to_json())["result"] == "fail"


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_K_M", "Q2_K"])
def test_diagnosis_names_nothing_in_a_right_file(dense, qtype):
    """The tensor and hyper-parameter diagnosis stays silent on correct files of every precision."""
    root, src, tgt, f32 = dense
    out = root / f"diag-{qtype}.gguf"
    quantize(f32, out, qtype)
    ckpt = read_checkpoint_drafter(read_checkpoint(src), read_target(tgt), keep_embeddings=True)
    d = read_drafter(out)
    assert hparam_differences(d, ckpt) == []
    assert tensor_differences(d, ckpt) == []


def test_diagnosis_reports_a_shape_and_a_scale(dense):
    """Edge cases of the tensor diagnosis: a vector scaled by 0.5, and a tensor of another shape."""
    root, src, tgt, f32 = dense
    ckpt = load_reference(read_checkpoint(src), read_target(tgt)).drafter
    name = layer_name(0, LAYER_ROLES["q_norm"])
    t = get_tensor(read_parts(f32), name)
    halved = set_tensor(read_parts(f32), Tensor(t.name, t.ne, t.gtype,
                                                (np.frombuffer(t.data, "<f4") * 0.5).astype("<f4").tobytes()))
    lines = tensor_differences(read_drafter(write_parts(root / "diag-half.gguf", halved)), ckpt)
    assert len(lines) == 1 and lines[0].startswith(f"{name}: relative RMS error 0.5 ") and "about 0.5 times" in lines[0]
    d = read_drafter(f32)
    d.tensors = [dataclasses.replace(x, source=ArraySource(np.zeros((3,), np.float32), "F32")) if x.gguf_name == name else x
                 for x in d.tensors]
    assert tensor_differences(d, ckpt) == [f"{name}: shape [3], checkpoint's {next(x.hf_name for x in ckpt.tensors if x.gguf_name == name)} "
                                           f"[{t.ne[0]}]"]


# --- save_io -------------------------------------------------------------------------------------


def test_save_io_writes_exact_schema(dense, tmp_path):
    out = tmp_path / "io.npz"
    rep = _check(dense, dense[3], save_io=out)
    d = drafter_from_gguf(read_gguf(dense[3]))
    E, V, B, T = d.hidden_size, d.vocab_size, d.block_size, len(d.target_layers)
    want = {"target_hidden": (np.float32, (CTX, T * E)), "block_ids": (np.int64, (B,)), "positions": (np.int64, (CTX + B,)),
            "hidden_gguf": (np.float32, (B, E)), "hidden_ref": (np.float32, (B, E)),
            "logits_gguf": (np.float32, (B - 1, V)), "logits_ref": (np.float32, (B - 1, V)),
            "tokens_gguf": (np.int64, (B - 1,)), "tokens_ref": (np.int64, (B - 1,))}
    with np.load(out) as z:
        assert set(z.files) == set(want)
        for name, (dtype, shape) in want.items():
            assert z[name].dtype == dtype and z[name].shape == shape, name
        assert np.array_equal(z["positions"], np.arange(CTX + B))
        assert int(z["block_ids"][0]) != d.mask_token_id and (z["block_ids"][1:] == d.mask_token_id).all()
        assert np.array_equal(z["tokens_gguf"], z["tokens_ref"])
        assert float(np.abs(z["hidden_gguf"] - z["hidden_ref"]).max()) == pytest.approx(rep.metrics["hidden_max_abs_err"], rel=1e-2, abs=1e-7)
    assert [p.name for p in tmp_path.iterdir()] == ["io.npz"]  # no temporary file left behind
    again = _check(dense, dense[3], save_io=out)  # same seed: same inputs and metrics; the dump is replaced
    assert again.metrics == rep.metrics


def test_save_io_never_over_an_input(dense):
    _, src, _, f32 = dense
    before = f32.read_bytes()
    with pytest.raises(DFlashError, match="overwrite an input"):
        _check(dense, f32, save_io=f32)
    with pytest.raises(DFlashError, match="overwrite an input"):
        _check(dense, f32, save_io=src / "config.json")
    assert f32.read_bytes() == before


def test_unreadable_inputs_raise_input_file_error(dense, tmp_path):
    _, src, tgt, f32 = dense
    with pytest.raises(InputFileError):
        check(tmp_path / "missing.gguf", src, target_model_dir=tgt, device="cpu", context=CTX)
    with pytest.raises(InputFileError):
        check(f32, tmp_path / "no-checkpoint", target_model_dir=tgt, device="cpu", context=CTX)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(InputFileError):
        check(junk, src, target_model_dir=tgt, device="cpu", context=CTX)


# --- pieces --------------------------------------------------------------------------------------


class _DrafterStub:
    """The two things precision_class reads from a drafter: its file type and its tensors' types."""

    def __init__(self, file_type: int | None, *types: str) -> None:
        self.origin = Origin(Path("stub.gguf"), Path("stub.gguf"), file_type=file_type)
        self.source = "stub.gguf"
        self.tensors = [SimpleNamespace(shape=(64, 64), dtype=t) for t in types] + [SimpleNamespace(shape=(64,), dtype="F32")]


def test_precision_class_is_the_loosest_type():
    assert precision_class(_DrafterStub(0, "F32")) == ("F32", "F32")
    assert precision_class(_DrafterStub(15, "Q4_K", "Q6_K")) == ("Q4_K_M", "Q4")
    assert precision_class(_DrafterStub(15, "F32")) == ("Q4_K_M", "Q4")  # the label counts too
    assert precision_class(_DrafterStub(7, "Q8_0", "Q2_K")) == ("Q8_0", "Q2_K")  # a mix: its worst tensor
    assert precision_class(_DrafterStub(None, "F16")) == ("F16", "F16")
    assert precision_class(_DrafterStub(36, "TQ1_0", "Q4_K")) == ("TQ1_0", "Q1")  # 1-2 bits: the loosest class
    assert precision_class(_DrafterStub(None, "IQ3_S")) == ("IQ3_S", "Q3_K")
    assert precision_class(_DrafterStub(29, "IQ2_S", "Q4_K", "IQ3_S")) == ("IQ2_M", "Q1")  # IQ2/IQ1: class Q1 too
    with pytest.raises(InputFileError, match="no check thresholds"):
        precision_class(_DrafterStub(None, "MXFP4"))
    assert list(THRESHOLDS)[0] == "F32" and all(0 < t.top1_min <= 1.0 for t in THRESHOLDS.values())
    order = list(THRESHOLDS.values())
    assert all(a.hidden_max_rel <= b.hidden_max_rel and a.kl_max <= b.kl_max and a.top1_min >= b.top1_min
               and a.tie_margin <= b.tie_margin and a.tie_sd <= b.tie_sd
               for a, b in zip(order, order[1:], strict=False))  # each class at most as strict as the one above


def test_near_ties_count_as_agreement_in_the_gate():
    want = ForwardResult(hidden=torch.zeros(3, 2), logits=torch.tensor([[0.0, 1.0, 0.95], [2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
                         tokens=torch.tensor([1, 0, 1]))
    got = ForwardResult(hidden=torch.zeros(3, 2), logits=want.logits, tokens=torch.tensor([2, 1, 1]))
    assert near_ties(want.logits, got.tokens).tolist() == [True, False, True]
    assert near_ties(want.logits, got.tokens, THRESHOLDS["F32"].tie_margin).tolist() == [False, False, True]
    m = compare(got, want)
    assert m["top1_matches"] == 1 and m["top1_agreement_tie_aware"] == pytest.approx(2 / 3)
    # in standard deviations of the slot's logits: slot 0's flip is 0.05 nats = 0.09 sd of [0, 1, 0.95],
    # slot 1's is 2 nats = 1.73 sd of [2, 0, 0]
    assert near_ties(want.logits, got.tokens, 1e-4, 0.08).tolist() == [False, False, True]
    assert near_ties(want.logits, got.tokens, 1e-4, 0.1).tolist() == [True, False, True]
    assert near_ties(want.logits, got.tokens, 1e-4, 1.8).tolist() == [True, True, True]
    # -inf entries (outside a d2t vocabulary) do not enter the spread; a ruled-out token is never a tie
    masked = torch.tensor([[2.0, 0.0, 0.0, float("-inf")]])
    assert near_ties(masked, torch.tensor([1]), 0.0, 1.7).tolist() == [False]
    assert near_ties(masked, torch.tensor([1]), 0.0, 1.8).tolist() == [True]
    assert near_ties(masked, torch.tensor([3]), 0.0, 100.0).tolist() == [False]


def test_kl_handles_a_reduced_vocabulary():
    ref = torch.tensor([[0.0, 1.0, float("-inf")]])
    assert kl_mean(ref, ref) == 0.0
    assert kl_mean(ref, torch.tensor([[0.0, 2.0, float("-inf")]])) > 0.0
    assert kl_mean(ref, torch.tensor([[float("-inf"), 1.0, 0.0]])) == float("inf")


# --- semantics gap -------------------------------------------------------------------------------


def test_semantics_gap_warning_for_window_below_block(tmp_path_factory, qwen35_target):
    """Qwen3.5 layout, sliding layer with window 4 < block 16: trained causal + windowed, llama.cpp neither."""
    root = tmp_path_factory.mktemp("check-swa")
    src = make_zlab_drafter(root / "hybrid", **QWEN35, swa_layers=[True, False], sliding_window=4, target_layer_ids=[0, 2])
    tgt = _target(root, qwen35_target, "qwen35")
    out = root / "hybrid-f32.gguf"
    convert(src, tgt, outfile=out, outtype="f32")
    rep = check(out, src, target_model_dir=tgt, device="cpu", context=CTX)
    assert rep.passed, rep.render_text()  # the file is right; the runtime's semantics are the gap
    assert rep.semantics_gap["differs"] and rep.semantics_gap["hidden_max_abs_err"] > 1e-3
    gap = [w for w in rep.warnings if w.startswith("llama.cpp does not run this drafter as it was trained")]
    assert len(gap) == 1 and f"{rep.semantics_gap['top1_agreement']:.3f}" in gap[0]
    assert json.loads(rep.to_json())["semantics_gap"]["differs"] is True


# --- CUDA (bench/gpu_check.sh runs this on a GPU machine) -------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_check_on_cuda_agrees_with_cpu(dense):
    cpu = _check(dense, dense[3])
    gpu = check(dense[3], dense[1], target_model_dir=dense[2], device="cuda", context=CTX)
    assert gpu.passed and gpu.device.startswith("cuda"), gpu.render_text()
    assert gpu.metrics["top1_agreement"] == cpu.metrics["top1_agreement"] == 1.0
    assert abs(gpu.metrics["hidden_max_abs_err"] - cpu.metrics["hidden_max_abs_err"]) < 1e-4
    auto = check(dense[3], dense[1], target_model_dir=dense[2], device="auto", context=CTX)
    assert auto.device.startswith("cuda")
