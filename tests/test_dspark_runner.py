"""DSpark drafters in the runner, the checkpoint reference and ``check``.

Three tiny DSpark checkpoints (2 layers, hidden 64, the 916-token synthetic Gemma-4 vocabulary) cover
what llama.cpp 0c1e57098 runs: a DFlash-lineage drafter (full vocabulary, confidence head, sampling
from the anchor, the target's head), a speculators export (own 512-token vocabulary through d2t, own
embeddings and head, ``sample_from_anchor`` false) and a Gemma-4 DSpark drafter (shared K/V,
sandwich norms, layer scalar, proportional RoPE, GELU). Each is converted to F32, run by the GGUF
runner and by the reference on the checkpoint's own tensors: every drafted token must agree, and
the Markov conditioning is checked by hand against the heads' tensors. In the runtime tier a probe built
against libllama drafts 8 blocks per member through llama.cpp's own graph and chain: the drafted tokens
are the runner's (near-ties excepted, counted). ``check`` passes them at F32
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
from dflash_convert.check import check
from dflash_convert.errors import DFlashError, InputFileError
from dflash_convert.format.check_limits import THRESHOLDS
from dflash_convert.format.family import CONF_PROJ_BIAS, MARKOV_W1, MARKOV_W2
from dflash_convert.quantize import quantize
from dflash_convert.runtime.check_io import synthetic_inputs
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


@pytest.mark.parametrize("name", ["dspark", "speculators"])
def test_batched_anchor_drafts_are_the_single_drafts(world, name):
    """The acceptance measurement (runtime.accept) drafts from many anchors at once: each must be the draft
    run_gguf and the reference make from that anchor alone, through the Markov chain, in the driver's layout."""
    from dflash_convert.format.family import draft_tokens_per_block
    from dflash_convert.runtime.accept import anchor_drafts, reference_drafts
    from dflash_convert.runtime.forward import block_tokens, contiguous_positions

    _, tgt, get = world
    src, f32 = get(name)
    d = read_drafter(f32)
    target = read_target(tgt)
    w = load_weights(d, target)
    n_max = draft_tokens_per_block("DSpark", d.block_size, d.sample_from_anchor)
    assert n_max == MEMBERS[name][1]
    g = torch.Generator().manual_seed(5)
    L = 12
    feats = torch.randn(L, len(d.target_layers) * d.hidden_size, generator=g)
    tokens = torch.randint(5, d.vocab_size, (L,), generator=g)
    anchors = [3, 7, 11]
    batched = anchor_drafts(d, w, feats, tokens, anchors, n_max)
    ref = reference_drafts(load_reference(read_checkpoint(src), target), n_max)(feats, tokens, anchors)
    for row, c in enumerate(anchors):
        ids = block_tokens(d, int(tokens[c]))
        single = run_gguf(d, w, feats[:c], ids, contiguous_positions(c, len(ids)))
        assert torch.equal(batched[row], single.tokens[:n_max]), c
    assert torch.equal(batched, ref)
    with pytest.raises(DFlashError, match="n_max"):
        anchor_drafts(d, w, feats, tokens, anchors, n_max + 1)
    with pytest.raises(DFlashError, match="at most block_size"):
        run_gguf(d, w, feats[:3], block_tokens(d, 5, d.block_size + 1), contiguous_positions(3, d.block_size + 1))


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


# --- ground truth: libllama itself -------------------------------------------------------------------

PROBE = "dspark_runner"  # fixtures/probes/dspark_runner.cpp


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    """The probe, compiled against the llama.cpp build from the cached sdist (built first when absent)."""
    from fixtures.libllama_probe import compile_probe

    return compile_probe(PROBE, tmp_path_factory.mktemp("dspark-probe"))


def _self_contained(world, name: str) -> Path:
    """The F32 GGUF with the target's embedding written in (the tied head is the target's too): the probe
    has no target context."""
    from drafter_gguf import Tensor, set_tensor

    from dflash_convert.format.ggml import GGMLType
    from dflash_convert.format.rules import EMBEDDING_TENSOR

    root, tgt, get = world
    path = get(name)[1]
    d = read_drafter(path)
    w = load_weights(d, read_target(tgt))
    if w.embed_from == "drafter":
        return path
    assert w.head is w.embed  # the fixture target ties its head: the embedding alone makes the file whole
    v = w.embed.full().to(torch.float32).numpy()
    parts = set_tensor(read_parts(path), Tensor(EMBEDDING_TENSOR, (v.shape[1], v.shape[0]), GGMLType.F32, v.astype("<f4").tobytes()))
    return write_parts(root / f"{name}-self-contained.gguf", parts)


DRAFTS = 8  # contexts (and anchors) per member


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.parametrize("name", list(MEMBERS))
def test_runner_matches_libllama(world, probe, name, tmp_path, record_property):
    """The tokens llama.cpp's draft-dspark path drafts are the runner's, over DRAFTS contexts and anchors.

    How llama.cpp's drafted tokens are extracted: the probe (fixtures/probes/dspark_runner.cpp, built against the sdist's libllama
    in the ``probe`` fixture) decodes each block as the driver does and writes every slot's logits, which the
    graph has already biased along its own greedy Markov chain (build_dspark_markov_head), and confidences.
    The driver takes each drafted slot's top candidate (top-k sampler, --spec-draft-p-min 0), so each slot's
    argmax is llama.cpp's drafted token: llama.cpp's own chain, not one we rebuild. Compared: (1) the
    runner's drafts, token for token, up to the first slot whose top two lie within check's F32 near-tie
    margin (after a flipped near-tie the two chains condition on different tokens); (2) every slot of the
    runner's heads conditioned on llama.cpp's draft (``markov_chain(forced=...)``): equal picks except
    near-ties, which are counted and recorded (``near_ties``), logits and confidences close.
    """
    import subprocess

    from dflash_convert.runtime.dspark import markov_chain
    from fixtures.libllama_probe import draft_agreement, tied_slots

    _, tgt, get = world
    d = read_drafter(get(name)[1])
    w = load_weights(d, read_target(tgt))
    inputs = [synthetic_inputs(d, CTX, seed=seed) for seed in range(DRAFTS)]
    io = tmp_path / "io.bin"
    n_block = len(inputs[0][1])
    io.write_bytes(np.array([DRAFTS, CTX, inputs[0][0].shape[1], n_block], np.int32).tobytes()
                   + b"".join(f.numpy().astype("<f4").tobytes() + ids.numpy().astype("<i4").tobytes() for f, ids, _ in inputs))
    r = subprocess.run([str(probe), str(_self_contained(world, name)), str(io)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"probe failed ({r.returncode}): {r.stderr[-2000:]}"
    raw = np.fromfile(io, np.uint8)
    n_vocab, has_conf = (int(x) for x in raw[:8].view(np.int32))
    assert has_conf
    per_draft = n_block * n_vocab + n_block
    body = raw[8:].view(np.float32).reshape(DRAFTS, per_draft)
    n = MEMBERS[name][1]
    picks, conditioned, all_logits, errors, conf_errors, chains_equal = [], [], [], [], [], 0
    for k, (feats, ids, pos) in enumerate(inputs):
        logits = torch.from_numpy(body[k, :n_block * n_vocab].reshape(n_block, n_vocab).copy())[n_block - n:]
        conf = torch.from_numpy(body[k, n_block * n_vocab:].copy())[n_block - n:]
        theirs = logits.argmax(-1)  # the draft llama.cpp's driver proposes
        got = run_gguf(d, w, feats, ids, pos, gelu_fp16_table=d.hidden_act != "silu")
        # (1) the free-running chains: equal up to the first near-tie, where they may part
        first_tie = int(torch.nonzero(tied_slots(logits)).flatten()[0]) if bool(tied_slots(logits).any()) else n
        assert torch.equal(got.tokens[:first_tie], theirs[:first_tie]), (k, got.tokens, theirs)
        chains_equal += torch.equal(got.tokens, theirs)
        # (2) every slot, conditioned on llama.cpp's chain
        given = markov_chain(w.markov, got.head_logits, got.hidden, ids[0], w.d2t, forced=theirs[:-1])
        assert given.confidence is not None
        picks.append(given.tokens[-n:])
        conditioned.append(theirs)
        all_logits.append(logits)
        finite = torch.isfinite(logits)
        assert torch.equal(finite, torch.isfinite(given.logits[-n:]))  # the same -inf outside a d2t vocabulary
        errors.append(float((given.logits[-n:] - logits)[finite].abs().max()))
        conf_errors.append(float((given.confidence[-n:] - conf).abs().max()))
    agreement = draft_agreement(torch.cat(picks), torch.cat(conditioned), torch.cat(all_logits))
    record_property("near_ties", agreement.tied)
    record_property("logits_max_abs_diff", max(errors))
    print(agreement.line(f"DSpark {name}"), f"logits max abs diff {max(errors):.3g}, "
          f"confidence {max(conf_errors):.3g}, free-running drafts equal {chains_equal}/{DRAFTS}")
    assert agreement.slots == DRAFTS * n
    assert agreement.untied_differences == (), agreement
    assert chains_equal == DRAFTS or agreement.tied > 0  # only a near-tie may part the two chains
    assert max(errors) < (1e-3 if d.hidden_act != "silu" else 1e-4)
    assert max(conf_errors) < 1e-4


@pytest.mark.slow  # check runs both forwards (torch)
def test_cli_check_fails_a_flipped_layout_with_one_line_per_cause(world):
    from conftest import run_cli

    root, tgt, get = world
    src, f32 = get("dspark")
    out = write_parts(root / "dspark-anchor-flipped-cli.gguf", _flipped_anchor(read_parts(f32)))
    r = run_cli("check", out, "--checkpoint", src, "--target-model-dir", tgt, "--device", "cpu", "--context", str(CTX))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL: drafted slots differ: the file drafts 15 slots per block, the checkpoint 16" in r.stdout
    assert "Traceback" not in r.stderr
    ok = run_cli("check", f32, "--checkpoint", src, "--target-model-dir", tgt, "--device", "cpu", "--context", str(CTX))
    assert ok.returncode == 0 and ok.stdout.rstrip().endswith("PASS"), ok.stdout + ok.stderr
