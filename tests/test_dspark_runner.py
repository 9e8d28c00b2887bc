"""DSpark drafters in the runner, the checkpoint reference and ``check``.

Three tiny DSpark checkpoints (2 layers, hidden 64, the 916-token synthetic Gemma-4 vocabulary) cover
what llama.cpp 0c1e57098 runs: a DFlash-lineage drafter (full vocabulary, confidence head, sampling
from the anchor, the target's head), a speculators export (own 512-token vocabulary through d2t, own
embeddings and head, ``sample_from_anchor`` false) and a Gemma-4 DSpark drafter (shared K/V,
sandwich norms, layer scalar, proportional RoPE, GELU). Each is converted to F32, run by the GGUF
runner and by the reference on the checkpoint's own tensors: every drafted token must agree, and
the Markov conditioning is checked by hand against the heads' tensors. ``check`` passes them at F32
and in the quantized types, fails the sabotaged files naming the cause, and ``--save-io`` carries the
confidences.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from drafter_gguf import map_key, read_parts, scale_tensor, swap_tensors, write_parts
from safetensors.torch import save_file

from dflash_convert import convert
from dflash_convert.check import THRESHOLDS, check, synthetic_inputs
from dflash_convert.errors import InputFileError
from dflash_convert.format.family import CONF_PROJ_BIAS, MARKOV_W1, MARKOV_W2
from dflash_convert.quantize import quantize
from dflash_convert.runtime.dspark import driver_draft
from dflash_convert.runtime.forward import run_gguf
from dflash_convert.runtime.reference import load_reference, reference_forward
from dflash_convert.runtime.weights import load_weights
from dflash_convert.sources.checkpoint import read_checkpoint
from dflash_convert.sources.gguf_drafter import read_drafter
from dflash_convert.sources.target import read_target
from fixtures.family import make_dspark_drafter, make_gemma4_dspark_drafter, make_speculators_dspark
from fixtures.targets import make_target_dir

CTX = 7
G4 = dict(vocab_size=916, mask_token_id=4)  # the synthetic Gemma-4 target vocabulary
# name -> (builder, drafted slots per block)
MARKOV = dict(markov_scale=0.3)  # a Markov bias as large as the logits: the tests see what it does
MEMBERS = {
    "dspark": (lambda p: make_dspark_drafter(p, target_layer_ids=[0, 2], **MARKOV, **G4), 16),
    "speculators": (lambda p: make_speculators_dspark(p, dtype="f16", draft_vocab_size=512, aux_layer_ids=[1, 3],
                                                      block_size=8, **MARKOV, **G4), 7),
    "gemma4": (lambda p: make_gemma4_dspark_drafter(p, **MARKOV), 7),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(root, target directory, {name: (checkpoint, F32 GGUF)}), built as they are asked for."""
    root = tmp_path_factory.mktemp("dspark")
    tgt = make_target_dir(root / "target", "gemma4")
    text = json.loads((tgt / "config.json").read_text())["text_config"]
    emb = torch.randn(text["vocab_size"], text["hidden_size"], generator=torch.Generator().manual_seed(7)) * 0.05
    # the embedding is all a DSpark drafter without its own reads from the target (the head is tied to it)
    save_file({"model.language_model.embed_tokens.weight": emb.to(torch.bfloat16)}, str(tgt / "model.safetensors"))
    built: dict[str, tuple[Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in built:
            src = MEMBERS[name][0](root / name)
            built[name] = src, convert(src, tgt, outfile=root / f"{name}-f32.gguf", outtype="f32").output
        return built[name]

    return root, tgt, get


def _runs(world, name: str, gguf: Path | None = None):
    _, tgt, get = world
    src, f32 = get(name)
    d = read_drafter(gguf or f32)
    target = read_target(tgt)
    feats, ids, pos = synthetic_inputs(d, CTX, seed=3)
    w = load_weights(d, target)
    model = load_reference(read_checkpoint(src), target)
    return d, w, feats, ids, pos, run_gguf(d, w, feats, ids, pos), reference_forward(model, feats.double(), ids, pos)


@pytest.mark.parametrize("name", list(MEMBERS))
def test_f32_runner_and_checkpoint_reference_draft_the_same_tokens(world, name):
    d, w, _, _, _, got, want = _runs(world, name)
    n = MEMBERS[name][1]
    assert w.markov is not None and got.tokens.shape == (n,) and want.tokens.shape == (n,)
    assert torch.equal(got.tokens, want.tokens)
    finite = torch.isfinite(want.logits)
    assert torch.equal(finite, torch.isfinite(got.logits))  # the same -inf outside a d2t vocabulary
    assert float((got.logits.double() - want.logits)[finite].abs().max()) < 1e-4
    assert got.confidence is not None and want.confidence is not None
    assert float((got.confidence.double() - want.confidence).abs().max()) < 1e-5
    assert bool(((got.confidence > 0) & (got.confidence < 1)).all())


def test_each_slot_is_conditioned_on_the_token_before_it(world):
    """By hand, from the file's tensors: logits_i = base_i + markov_w2 @ markov_w1[previous token], the
    previous token of slot 0 being the anchor (sample_from_anchor), of slot i the draft's token i-1; the
    confidence is sigmoid(conf_proj . [z_i ; markov_w1[prev]] + bias)."""
    d, w, _, ids, _, got, _ = _runs(world, "dspark")
    m = w.markov
    assert m is not None and m.sample_from_anchor and d.sample_from_anchor is True
    base = w.head.project(got.hidden)  # every slot, full vocabulary (no d2t)
    prev = torch.cat([ids[:1], got.tokens[:-1]])
    assert torch.allclose(got.logits, base + m.w1[prev] @ m.w2.T, atol=1e-5)
    assert not torch.equal(got.tokens, base.argmax(-1))  # the bias changes this draft: the test can fail
    conf = torch.sigmoid(torch.cat([got.hidden, m.w1[prev]], dim=-1) @ m.conf_w + m.conf_b)
    assert torch.allclose(got.confidence, conf, atol=1e-6)


def test_bonus_anchor_layout_drafts_the_mask_slots_only(world):
    """sample_from_anchor false (the speculators export): slot 0 is never read, slot 1 is conditioned on the
    anchor; the draft-vocabulary bias lands on the d2t rows only."""
    _, w, _, ids, _, got, _ = _runs(world, "speculators")
    m = w.markov
    assert m is not None and not m.sample_from_anchor and w.d2t is not None
    base = w.head.project(got.hidden[1:])
    prev = torch.cat([ids[:1], got.tokens[:-1]])
    want = torch.full_like(got.logits, float("-inf"))
    want[:, w.d2t] = base + m.w1[prev] @ m.w2.T
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got.logits))
    assert torch.allclose(got.logits[finite], want[finite], atol=1e-5)


def test_driver_cuts_the_draft_below_p_min():
    tokens, conf = torch.tensor([5, 6, 7, 8]), torch.tensor([0.9, 0.7, 0.2, 0.95])
    assert driver_draft(tokens, conf, 0.0).tolist() == [5, 6, 7, 8]
    assert driver_draft(tokens, conf, 0.5).tolist() == [5, 6]  # stops at the first slot below, never resumes
    assert driver_draft(tokens, conf, 0.95).tolist() == []
    with pytest.raises(InputFileError, match="no confidence head"):
        driver_draft(tokens, None, 0.5)


# --- check ------------------------------------------------------------------------------------------


def _check(world, name: str, gguf: Path, **kw):
    _, tgt, get = world
    return check(gguf, get(name)[0], target_model_dir=tgt, device="cpu", context=CTX, **kw)


@pytest.mark.parametrize("name", list(MEMBERS))
def test_check_passes_f32_with_every_drafted_token_equal(world, name):
    rep = _check(world, name, world[2](name)[1])
    assert rep.passed, rep.render_text()
    m = rep.metrics
    assert rep.precision_class == "F32" and m["top1_agreement"] == 1.0 and m["slots"] == MEMBERS[name][1]
    assert m["confidence_max_abs_err"] < 1e-5 and "confidence max abs err" in rep.render_text()
    assert m["draft_top1_agreement"] == 1.0  # the file's own greedy chain is the checkpoint's draft, token for token


@pytest.mark.parametrize("qtype,cls", [("F16", "F16"), ("BF16", "BF16"), ("Q8_0", "Q8_0"), ("Q4_K_M", "Q4"),
                                       ("Q2_K", "Q2_K")])
@pytest.mark.parametrize("name", ["dspark", "gemma4"])
def test_check_passes_quantized_files(world, name, qtype, cls):
    root, _, get = world
    out = root / f"{name}-{qtype}.gguf"
    if not out.exists():
        quantize(get(name)[1], out, qtype)
    rep = _check(world, name, out)
    assert rep.passed, rep.render_text()
    assert rep.precision_class == cls and rep.metrics["confidence_max_abs_err"] <= THRESHOLDS[cls].hidden_max_rel


# sabotage: each edit fails check with a line that names it
def _swap_markov(parts):
    return swap_tensors(parts, MARKOV_W1, MARKOV_W2)  # [V, R] both: a full-vocabulary drafter


def _scaled_conf_bias(parts):
    return scale_tensor(parts, CONF_PROJ_BIAS, 3.0)


def _flipped_anchor(parts):
    return map_key(parts, "sample_from_anchor", lambda v: not v)


SABOTAGE = {
    "markov-swapped": (_swap_markov, [f"tensor differs: {MARKOV_W1}: ", "it holds the checkpoint's markov_head.markov_w2.weight (swapped?)",
                                      f"tensor differs: {MARKOV_W2}: "]),
    "conf-bias-scaled": (_scaled_conf_bias, [f"tensor differs: {CONF_PROJ_BIAS}: ", "about 3 times the checkpoint's values",
                                             "confidences differ: max abs error"]),
    "anchor-flipped": (_flipped_anchor, ["hyper-parameter differs from the checkpoint's: sample_from_anchor: file False, checkpoint True",
                                         "drafted slots differ: the file drafts 15 slots per block, the checkpoint 16"]),
}


@pytest.mark.parametrize("what", list(SABOTAGE))
def test_sabotaged_file_fails_naming_the_cause(world, what):
    root, _, get = world
    edit, lines = SABOTAGE[what]
    out = write_parts(root / f"dspark-{what}.gguf", edit(read_parts(get("dspark")[1])))
    rep = _check(world, "dspark", out)
    assert not rep.passed and rep.exit_code == 1
    text = rep.render_text()
    for line in lines:
        assert line in text, (line, rep.failures)
    assert text.endswith("FAIL")


def test_markov_swap_changes_the_draft_not_the_trunk(world):
    """The swap leaves the hidden states alone (the heads follow the trunk) and conditions every slot wrongly."""
    root, _, get = world
    out = write_parts(root / "dspark-markov-swapped-run.gguf", _swap_markov(read_parts(get("dspark")[1])))
    *_, got, want = _runs(world, "dspark", out)
    assert float((got.hidden.double() - want.hidden).abs().max()) < 1e-5
    assert not torch.allclose(got.logits.double(), want.logits, atol=1e-2)


def test_save_io_carries_the_markov_logits_and_confidences(world, tmp_path):
    _, _, get = world
    out = tmp_path / "io.npz"
    rep = _check(world, "speculators", get("speculators")[1], save_io=out)
    d = read_drafter(get("speculators")[1])
    B, V, n = d.block_size, d.vocab_size, MEMBERS["speculators"][1]
    with np.load(out) as z:
        assert set(z.files) == {"target_hidden", "block_ids", "positions", "hidden_gguf", "hidden_ref", "logits_gguf",
                                "logits_ref", "tokens_gguf", "tokens_ref", "draft_slots", "confidence_gguf", "confidence_ref",
                                "logits_gguf_given_ref", "confidence_gguf_given_ref"}
        for name in ("logits_gguf", "logits_ref", "logits_gguf_given_ref"):
            assert z[name].shape == (n, V) and z[name].dtype == np.float32, name
        for name in ("confidence_gguf", "confidence_ref", "confidence_gguf_given_ref"):
            assert z[name].shape == (n,) and z[name].dtype == np.float32, name
        assert z["draft_slots"].tolist() == list(range(B - n, B)) and z["draft_slots"].dtype == np.int64
        assert float(np.abs(z["confidence_gguf_given_ref"] - z["confidence_ref"]).max()) == pytest.approx(
            rep.metrics["confidence_max_abs_err"], abs=1e-7)
        # at F32 the file's own chain is the checkpoint's draft, so both conditionings coincide
        assert np.array_equal(z["tokens_gguf"], z["tokens_ref"])
        assert np.allclose(z["logits_gguf"], z["logits_gguf_given_ref"], equal_nan=True)
    shutil.rmtree(tmp_path)
