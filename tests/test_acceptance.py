"""capture and accept: features captured once from the target, acceptance counted as llama.cpp counts it.

* ``anchor_drafts`` (many anchors batched, context K/V once per sequence) drafts what
  ``run_gguf`` drafts from each anchor alone: the same tokens, logits to float32 rounding, for a
  full-attention and a sliding-window drafter and for an M-RoPE (Qwen3.5) one;
* ``loop_anchors`` replays llama-speculative-simple's loop with its exact counting (the first
  anchor is the prompt's last token, drafts shrink to the remaining budget, the loop stops past
  ``-n`` or at an end-of-generation token), checked on hand-made drafts;
* ``capture`` on a tiny real target (transformers' Qwen3 class) writes the documented schema: the
  greedy continuation transformers itself generates, and the layer inputs of one full pass;
* ``accept`` runs a GGUF and its checkpoint (reference forward) on those features with the same
  counts, and names a layer the file did not store; a hostile features file is one error line.

Agreement with llama-speculative-simple's own numbers on a trained pair is the runtime tier's
(tests/test_trained_pair.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import cli_server
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from dflash_convert import convert
from dflash_convert.accept import accept
from dflash_convert.capture import LOOKAHEAD, capture
from dflash_convert.errors import DFlashError, InputFileError
from dflash_convert.format.features import SCHEMA
from dflash_convert.runtime.accept import AnchorStats, LoopCount, anchor_drafts, anchor_lengths, loop_anchors
from dflash_convert.runtime.capture import load_target_model, run_target
from dflash_convert.runtime.forward import block_tokens, contiguous_positions, gather_features, run_gguf
from dflash_convert.runtime.weights import load_weights
from dflash_convert.sources.features import config_sha256, read_features
from dflash_convert.sources.gguf_drafter import read_drafter
from dflash_convert.sources.target import read_target
from fixtures.drafters import make_zlab_drafter
from fixtures.targets import make_target_dir

TAPS = [0, 2]  # z-lab target_layer_ids: llama.cpp target_layers [1, 3]
PROMPTS = ["The quick brown fox jumps over", "Speculative decoding drafts a block of tokens", "In 1901 the"]


def run_cli(*args: object) -> subprocess.CompletedProcess:
    return cli_server.run(*args, timeout=600)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(root, qwen3 target with weights, drafter checkpoints, their F32 GGUFs): no target model run."""
    root = tmp_path_factory.mktemp("acceptance")
    target = make_target_dir(root / "target", "qwen3", with_weights=True, seed=5)
    drafters = {
        "full": make_zlab_drafter(root / "full", target_layer_ids=TAPS, seed=1),
        "swa": make_zlab_drafter(root / "swa", target_layer_ids=TAPS, swa_layers=[True, False], sliding_window=5, seed=2),
    }
    ggufs = {k: convert(v, target, outfile=root / f"{k}-f32.gguf", outtype="f32").output for k, v in drafters.items()}
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    return root, target, drafters, ggufs


@pytest.fixture(scope="module")
def world(base):
    """``base`` and the features file capture writes for it (the target model runs: transformers, seconds)."""
    root, target, drafters, ggufs = base
    feats = capture(target, root / "prompts.txt", root / "features.safetensors", new_tokens=12, device="cpu").output
    return root, target, drafters, ggufs, feats


def synthetic_features(base, out: Path, layers: list[int]) -> Path:
    """A features file of the documented schema for ``base``'s target, written by capture's writer from
    seeded random layer inputs: what the reader checks (schema, shapes, sequences), without running the
    target model."""
    from dflash_convert.format.features import FEATURE_DTYPES
    from dflash_convert.write_features import FeatureWriter

    root, target, _, _ = base
    rng = np.random.default_rng(9)
    new_tokens, prompts = 4, [5, 7, 3]
    lengths = [p + new_tokens + LOOKAHEAD for p in prompts]  # what capture writes: N + LOOKAHEAD after each prompt
    hidden = json.loads((target / "config.json").read_text())["hidden_size"]
    meta = {"schema": SCHEMA, "target": str(target.resolve()), "target_config_sha256": config_sha256(target),
            "target_architecture": "Qwen3ForCausalLM", "layers": json.dumps(layers), "dtype": FEATURE_DTYPES["f32"],
            "prompts_sha256": "0" * 64, "sequences": str(len(lengths)), "new_tokens": str(new_tokens), "eos_ids": "[]"}
    w = FeatureWriter(out, lengths, len(layers), hidden, FEATURE_DTYPES["f32"], meta)
    for i, (n, p) in enumerate(zip(lengths, prompts, strict=True)):
        w.write(i, rng.integers(0, 1000, n), p, rng.standard_normal((len(layers), n, hidden)).astype(np.float32))
    return w.commit()


# --- the batched drafts are run_gguf's ------------------------------------------------------------------


def _compare_with_run_gguf(d, w, states: torch.Tensor, tokens: torch.Tensor, anchors: list[int]) -> None:
    n_max = d.block_size - 1
    feats = gather_features(d, states)
    drafts, logits = anchor_drafts(d, w, feats, tokens, anchors, n_max, batch=3, keep_logits=True)
    for row, c in enumerate(anchors):
        ids = block_tokens(d, int(tokens[c]))
        one = run_gguf(d, w, feats[:c], ids, contiguous_positions(c, len(ids)))
        assert torch.equal(drafts[row], one.tokens[:n_max]), c
        err = (logits[row] - one.logits[:n_max]).abs().max() / one.logits.abs().max()
        assert err < 1e-5, (c, float(err))


@pytest.mark.parametrize("which", ["full", "swa"])
def test_batched_anchor_drafts_equal_one_forward_per_anchor(base, which):
    _, target, _, ggufs = base
    d = read_drafter(ggufs[which])
    w = load_weights(d, read_target(target))
    g = torch.Generator().manual_seed(3)
    L = 20
    states = torch.randn(5, L, d.hidden_size, generator=g)
    tokens = torch.randint(0, 1000, (L,), generator=g)
    _compare_with_run_gguf(d, w, states, tokens, [0, 1, 4, 9, 13, 19])


def test_batched_anchor_drafts_with_mrope(tmp_path):
    """A Qwen3.5 drafter: M-RoPE sections, the degenerate ones an M-RoPE target gets."""
    target = make_target_dir(tmp_path / "target", "qwen35", with_weights=True, seed=3)
    src = make_zlab_drafter(tmp_path / "draft", hidden=64, target_layer_ids=[0, 1], vocab_size=248320,
                            mask_token_id=248070, schema="nested", seed=4)
    out = convert(src, target, outfile=tmp_path / "d.gguf", outtype="f32").output
    d = read_drafter(out)
    assert d.rope_sections and any(d.rope_sections)
    w = load_weights(d, read_target(target))
    g = torch.Generator().manual_seed(5)
    states = torch.randn(5, 11, d.hidden_size, generator=g)
    _compare_with_run_gguf(d, w, states, torch.randint(0, 1000, (11,), generator=g), [2, 7, 10])


@pytest.mark.parametrize("which", ["full", "swa"])
def test_drafts_until_rejected_are_the_whole_drafts_up_to_their_first_rejected_slot(base, which):
    """What measure reads: the whole draft's tokens through its first slot the next tokens reject, -1 after it.
    The next tokens are the drafts themselves with one slot changed per anchor, at every depth of the rounds."""
    _, target, _, ggufs = base
    d = read_drafter(ggufs[which])
    w = load_weights(d, read_target(target))
    n_max = d.block_size - 1
    g = torch.Generator().manual_seed(7)
    L = 24
    feats = gather_features(d, torch.randn(5, L, d.hidden_size, generator=g))
    tokens = torch.randint(0, 1000, (L,), generator=g)
    for c in (3, 8, 20):  # 20: fewer than n_max tokens follow it (-1 past the end is never accepted)
        whole = anchor_drafts(d, w, feats, tokens, [c], n_max)[0]
        k = min(n_max, L - 1 - c)
        for first_wrong in (0, 1, 2, 5, 9, n_max):  # n_max: every slot accepted (as far as the sequence goes)
            seq = tokens.clone()
            seq[c + 1:c + 1 + k] = whole[:k]
            if first_wrong < k:
                seq[c + 1 + first_wrong] = (whole[first_wrong] + 1) % 1000
            part = anchor_drafts(d, w, feats, seq, [c], n_max, until_rejected=True)[0]
            known = part >= 0
            stop = min(first_wrong, k, n_max - 1)
            assert bool(known[:stop + 1].all()), (c, first_wrong, part)
            assert torch.equal(part[known], whole[known]), (c, first_wrong, part, whole)
            assert not bool(known.all()) or stop >= 7, (c, first_wrong, part)  # a round past the rejection is skipped
    anchors = [3, 8]
    with pytest.raises(ValueError):
        anchor_drafts(d, w, feats, tokens, anchors, n_max, keep_logits=True, until_rejected=True)


def test_anchor_drafts_refuse_a_bad_n_max(base):
    _, target, _, ggufs = base
    d = read_drafter(ggufs["full"])
    w = load_weights(d, read_target(target))
    with pytest.raises(DFlashError, match="n_max 16 must be in 1..15"):
        anchor_drafts(d, w, torch.zeros(4, 2 * d.hidden_size), torch.zeros(4, dtype=torch.int64), [1], 16)


# --- llama-speculative-simple's count ---------------------------------------------------------------------


def test_loop_counts_as_llama_speculative_simple():
    """tokens 0..29, prompt of 5: the first anchor is position 4. A drafter right on the first 3 slots
    of every draft: each step accepts 3 and the target adds its own token, so anchors 4, 8, 12, ...
    With -n 10 the draft is cut to the budget n_predict - predicted - 1 while it is positive: 7 (of 9),
    then 5 (10 - 4 - 1), then 1 (10 - 8 - 1, accepted: 10 predicted); then the budget is spent and
    common_speculative_draft, which truncates only for a positive limit, drafts a full 7 again (3
    accepted: 14 > 10, the loop ends). n_drafted 7 + 5 + 1 + 7 = 20, n_accept 3 + 3 + 1 + 3 = 10: the
    trained fixture's replay (which equals llama.cpp's own counts) gives the same."""
    tokens = list(range(30))

    def draft_at(c: int) -> list[int]:
        return [c + 1, c + 2, c + 3, 999, 999, 999, 999]

    n = loop_anchors(tokens, 5, 10, 7, set(), draft_at)
    assert (n.n_drafted, n.n_accept, n.n_predict, n.steps) == (20, 10, 14, 4)
    assert n.accepted_per_step == [3, 3, 1, 3] and abs(n.accept - 10 / 20) < 1e-12
    from fixtures.trained import replay_acceptance

    assert replay_acceptance({c: draft_at(c) for c in range(30)}, tokens, 5, 10) == (n.n_drafted, n.n_accept)
    # an end-of-generation token among the accepted ones ends the loop after that step
    n = loop_anchors(tokens, 5, 100, 7, {10}, draft_at)
    assert n.steps == 2 and n.n_predict == 8
    # a continuation shorter than -n needs: one line saying how to capture it
    with pytest.raises(DFlashError, match="capture with --new-tokens >= 40"):
        loop_anchors(tokens, 5, 40, 7, set(), draft_at)



@pytest.mark.parametrize("which", ["full", "swa"])
def test_live_loop_walks_sequences_together_as_one_at_a_time(base, tmp_path, which):
    """live_loop advances up to ``batch`` sequences together and projects each draft only up to its first
    rejected slot: the counts of llama-speculative-simple's loop drafted one anchor at a time, every slot,
    as before. Continuations that follow the drafter's own drafts (accept_p 0.7) make steps accept 0 to
    n_max, so every round of the lazy head runs; batch 2 over 3 sequences refills a finished walk."""
    from dflash_convert.runtime.accept import context_kv, live_loop, sequence_inputs
    from fixtures.drafted_features import drafted_features

    _, target, _, ggufs = base
    d = read_drafter(ggufs[which])
    w = load_weights(d, read_target(target))
    n_max = d.block_size - 1
    feats = read_features(drafted_features(tmp_path / "f.safetensors", d, w, 3, 6, 40, accept_p=0.7, seed=4))
    slots = feats.check_drafter(d, "drafter", n_max)
    one_at_a_time = []
    for i in range(3):
        features, tokens, prompt_length = sequence_inputs(feats, i, slots)
        ctx = context_kv(d, w, features, cpu_matmul=True)

        def draft_at(c: int, features=features, tokens=tokens, ctx=ctx) -> list[int]:
            return anchor_drafts(d, w, features, torch.tensor(tokens), [c], n_max, batch=1, cpu_matmul=True,
                                 kv_cache_dtype=torch.float16, ctx_kv=ctx)[0].tolist()

        one_at_a_time.append(loop_anchors(tokens, prompt_length, feats.new_tokens, n_max, set(), draft_at))
    together = live_loop(d, w, feats, slots, n_max, batch=2)
    steps = [k for n in one_at_a_time for k in n.accepted_per_step]
    assert together.accepted_per_step == steps
    assert (together.n_drafted, together.n_accept, together.n_predict, together.steps) == (
        sum(n.n_drafted for n in one_at_a_time), sum(n.n_accept for n in one_at_a_time),
        sum(n.n_predict for n in one_at_a_time), len(steps))
    assert 0 in steps and max(steps) >= 8  # rejected at slot 1, and accepted into the last round
    # one sequence alone, and the order of ``indices`` kept in the summed steps
    alone = live_loop(d, w, feats, slots, n_max, indices=[2, 0], batch=16)
    assert alone.accepted_per_step == one_at_a_time[2].accepted_per_step + one_at_a_time[0].accepted_per_step

def test_measure_drafts_only_the_anchors_it_reads(tmp_path):
    """measure drafts, in one call per sequence, the anchors anchor_lengths scores (n_max tokens after them), and
    the anchors past them only where the loop reaches them (a continuation an end-of-generation token cut short),
    all in one more call: the same counts and lengths as drafting every anchor of the continuation."""
    from dflash_convert.runtime.accept import measure, sequence_inputs
    from dflash_convert.write_features import FeatureWriter

    n_max, eos, prompt = 3, 99, 4
    g = np.random.default_rng(3)
    full = [int(t) for t in g.integers(0, 90, prompt + 6 + LOOKAHEAD)]  # -n 6, and the lookahead capture stores
    short = [int(t) for t in g.integers(0, 90, prompt + 4)] + [eos]  # ended by the end-of-generation token
    meta = {"schema": SCHEMA, "target": "", "target_config_sha256": "", "target_architecture": "synthetic",
            "layers": "[1]", "dtype": "F16", "prompts_sha256": "", "sequences": "2", "new_tokens": "6",
            "eos_ids": json.dumps([eos])}
    out = FeatureWriter(tmp_path / "f.safetensors", [len(full), len(short)], 1, 8, "F16", meta)
    for i, tokens in enumerate((full, short)):
        out.write(i, np.array(tokens, dtype=np.int64), prompt, np.zeros((1, len(tokens), 8), dtype=np.float16))
    feats = read_features(out.commit())

    def draft(tokens: list[int], c: int) -> list[int]:  # right for (c + 1) % 3 slots, then a wrong token
        right = (c + 1) % 3
        return [tokens[c + 1 + k] if k < right and c + 1 + k < len(tokens) else 100 + k for k in range(n_max)]

    calls = []

    def drafts_of(features: torch.Tensor, ids: torch.Tensor, anchors: list[int]) -> torch.Tensor:
        calls.append((len(ids), list(anchors)))
        return torch.tensor([draft(ids.tolist(), c) for c in anchors], dtype=torch.int64)

    loop, stats = measure(drafts_of, feats, [0], n_max)
    every_loop, every_stats = LoopCount(), AnchorStats(n_max=n_max)
    for i in range(2):
        _, tokens, p = sequence_inputs(feats, i, [0])
        every = {c: draft(tokens, c) for c in range(p - 1, len(tokens) - 1)}
        every_loop.add(loop_anchors(tokens, p, 6, n_max, {eos}, every.__getitem__))
        every_stats.add(anchor_lengths(tokens, list(every), every, n_max))
    assert (loop.n_drafted, loop.n_accept, loop.n_predict, loop.accepted_per_step) == (
        every_loop.n_drafted, every_loop.n_accept, every_loop.n_predict, every_loop.accepted_per_step)
    assert stats.lengths == every_stats.lengths and len(stats.lengths) == (len(full) - n_max - prompt + 1) + 3
    # the full continuation: one call, its scored anchors only; the short one: its scored anchors, then those from
    # the first the loop reaches past them to the end (anchors 3 -> 5 -> 6, whose draft takes the end-of-generation token)
    assert calls == [(len(full), list(range(prompt - 1, len(full) - n_max))), (len(short), [3, 4, 5]),
                     (len(short), [6, 7])]


def test_anchor_lengths_and_slot_curve():
    tokens = list(range(12))
    drafts = {0: [1, 2, 9], 1: [2, 9, 9], 2: [3, 4, 5], 3: [9, 9, 9], 9: [10, 11, 12]}
    s = anchor_lengths(tokens, [0, 1, 2, 3, 9], drafts, 3)
    assert s.lengths == [2, 1, 3, 0]  # anchor 9 has fewer than 3 tokens after it: left out
    assert s.mean_length == 1.5
    assert s.slot_curve() == [3 / 4, 2 / 3, 1 / 2]
    total = AnchorStats(n_max=3)
    total.add(s)
    total.add(s)
    assert total.lengths == s.lengths * 2


# --- capture ----------------------------------------------------------------------------------------------


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_capture_writes_the_documented_schema(world):
    root, target, _, _, path = world
    f = read_features(path)
    assert f.metadata["schema"] == SCHEMA and json.loads(f.metadata["layers"]) == list(range(5)) == f.layers
    assert f.metadata["new_tokens"] == "12" and f.metadata["dtype"] == "F32" and len(f.sequences) == len(PROMPTS)
    raw = load_file(str(path))
    assert sorted(raw) == sorted(f"seq.{i:05d}.{n}" for i in range(3) for n in ("tokens", "prompt_length", "layer_inputs"))
    model, layers = load_target_model(read_target(target))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    for i, prompt in enumerate(PROMPTS):
        tokens, n_prompt = f.sequences[i].read_tokens()
        ids = tok.encode(prompt).ids
        assert n_prompt == len(ids) and tokens[:n_prompt].tolist() == ids
        # the continuation is the target's greedy one: --new-tokens 12, plus what the loop's last draft can reach
        want = model.generate(torch.tensor([ids]), max_new_tokens=12 + LOOKAHEAD, do_sample=False)[0].tolist()
        assert tokens.tolist() == want
        streams, _ = run_target(model, layers, torch.tensor(tokens))
        got = np.stack([f.sequences[i].read_layer(s) for s in range(5)])
        assert np.array_equal(got, streams.numpy())


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_capture_stores_only_what_a_drafter_reads(world, tmp_path):
    root, target, _, ggufs, _ = world
    prompts = root / "prompts.txt"
    out = capture(target, prompts, tmp_path / "f.safetensors", new_tokens=3, for_draft=ggufs["full"], dtype="bf16",
                  device="cpu")
    f = read_features(out.output)
    assert f.layers == [1, 3] and f.dtype == "BF16"
    r = run_cli("capture", "--target-model-dir", target, "--prompts", prompts, "-o", tmp_path / "g.safetensors",
                "--layers", "1,9", "--device", "cpu")
    assert r.returncode == 64 and r.stderr.strip() == ("dflash-convert: error: --layers: layer input 9 does not exist: the "
                                                      "target has 4 layers (inputs 0..4, 4 being the last layer's output)")
    r = run_cli("capture", "--target-model-dir", target, "--prompts", prompts, "-o", prompts, "--device", "cpu")
    assert r.returncode == 1 and "output would overwrite an input file" in r.stderr


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_capture_prompts_as_jsonl(world, tmp_path):
    root, target, _, _, _ = world
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n" + json.dumps(PROMPTS[1]) + "\n")
    f = read_features(capture(target, p, tmp_path / "f.safetensors", new_tokens=2, layers="1,3", device="cpu").output)
    assert len(f.sequences) == 2 and f.layers == [1, 3]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    with pytest.raises(InputFileError, match="line 1: expected a string"):
        capture(target, bad, tmp_path / "x.safetensors", new_tokens=2, device="cpu")


# --- accept -----------------------------------------------------------------------------------------------


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_accept_counts_a_file_and_its_checkpoint_alike(world):
    root, target, drafters, ggufs, feats = world
    rep = accept([ggufs["full"], ggufs["swa"]], feats, checkpoint=drafters["full"], device="cpu", numerics="exact")
    full, swa = rep.results
    base = rep.baseline
    assert base is not None and base.name.startswith("checkpoint")
    # the F32 file drafts what its checkpoint drafts: the same live loop, step by step
    assert full.loop.accepted_per_step == base.loop.accepted_per_step and full.loop.n_drafted == base.loop.n_drafted
    assert full.anchors.lengths == base.anchors.lengths
    for r in (full, swa):
        assert r.loop.n_predict > 0 and r.loop.n_drafted >= r.loop.n_accept >= 0 and r.file_type == "F32"
    doc = rep.to_dict()
    assert doc["schema"] == "dflash-convert/accept/v1" and doc["n_max"] == 15 and doc["new_tokens"] == 12
    assert [x["file"] for x in doc["files"]] == [str(ggufs["full"]), str(ggufs["swa"])]
    assert doc["files"][0]["accept_minus_baseline"] == full.loop.accept - base.loop.accept
    text = rep.render_text()
    assert "accept = n_accept / n_drafted" in text and "slot curve" in text


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_accept_command_line(world):
    root, target, _, ggufs, feats = world
    r = run_cli("accept", ggufs["full"], ggufs["swa"], "--features", feats, "--n-max", "7", "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["n_max"] == 7 and len(doc["files"]) == 2 and all(len(x["slot_curve"]) == 7 for x in doc["files"])
    r = run_cli("accept", ggufs["full"], "--features", feats, "--device", "cpu")
    assert r.returncode == 0 and "accept = n_accept / n_drafted" in r.stdout


def test_accept_names_a_layer_the_file_did_not_store(base, tmp_path):
    root, target, _, ggufs = base
    f = synthetic_features(base, tmp_path / "f.safetensors", [0, 1])
    r = run_cli("accept", ggufs["full"], "--features", f, "--device", "cpu")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"dflash-convert: error: {f}: {ggufs['full']} taps target layer 3, which this features "
                                "file does not store (it stores [0, 1]); capture again with --layers all or --for that drafter")


def _rewrite(src: Path, dst: Path, edit) -> Path:
    tensors = load_file(str(src))
    from safetensors import safe_open

    with safe_open(str(src), "np") as fh:
        meta = dict(fh.metadata())
    tensors, meta = edit(tensors, meta)
    save_file(tensors, str(dst), metadata=meta)
    return dst


@pytest.mark.parametrize("name,edit,message", [
    ("schema", lambda t, m: (t, {**m, "schema": "x"}), "not a features file"),
    ("layers", lambda t, m: (t, {**m, "layers": "[1, 1]"}), "distinct layer indices"),
    ("layers_json", lambda t, m: (t, {**m, "layers": "nope"}), "JSON list of non-negative integers"),
    ("sequences", lambda t, m: (t, {**m, "sequences": "9"}), "sequence 3 has no seq.00003.tokens"),
    ("missing", lambda t, m: ({k: v for k, v in t.items() if k != "seq.00001.prompt_length"}, m),
     "sequence 1 has no seq.00001.prompt_length"),
    ("shape", lambda t, m: ({**t, "seq.00000.layer_inputs": t["seq.00000.layer_inputs"][:2]}, m), "must be [5 layers"),
    ("extra", lambda t, m: ({**t, "stray": np.zeros(2, np.float32)}, m), "unexpected tensor 'stray'"),
    ("prompt", lambda t, m: ({**t, "seq.00000.prompt_length": np.array([0], np.int64)}, m), "prompt_length 0 is not in"),
])
def test_hostile_features_files_are_one_error_line(base, tmp_path, name, edit, message):
    ggufs = base[3]
    feats = synthetic_features(base, tmp_path / "good.safetensors", [0, 1, 2, 3, 4])
    assert len(read_features(feats).sequences) == 3  # the file each case spoils is a good one
    bad = _rewrite(feats, tmp_path / f"{name}.safetensors", edit)
    r = run_cli("accept", ggufs["full"], "--features", bad, "--device", "cpu")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr, r.stderr


# --- check learns acceptance ------------------------------------------------------------------------------


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_check_with_a_features_file_reports_acceptance(world):
    from dflash_convert.check import check

    root, target, drafters, ggufs, feats = world
    rep = check(ggufs["full"], drafters["full"], target_model_dir=target, features=str(feats), device="cpu", context=6)
    a = rep.metrics["acceptance"]
    assert rep.passed, rep.failures
    assert a["file"]["n_drafted"] == a["checkpoint"]["n_drafted"] and a["lost"] == 0.0 and a["allowance"] == 0.005
    assert a["sequences"] == 3 and a["new_tokens"] == 12
    assert "acceptance" in rep.render_text() and rep.to_dict()["metrics"]["acceptance"]["file"]["n_accept"] >= 0
    r = run_cli("check", ggufs["full"], "--checkpoint", drafters["full"], "--target-model-dir", target, "--features",
                root / "missing.safetensors", "--device", "cpu")
    assert r.returncode == 2 and "no such features file (--features takes synthetic, target, or a file" in r.stderr


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_accept_an_own_vocabulary_drafter(world, tmp_path):
    """A speculators drafter with its own vocabulary (d2t): drafts scattered to target ids, the same as its checkpoint."""
    from fixtures.drafters import make_speculators_drafter

    root, target, _, _, feats = world
    src = make_speculators_drafter(tmp_path / "spec", hidden=64, draft_vocab_size=2048, aux_layer_ids=[1, 3], block_size=8,
                                   seed=7)
    out = convert(src, target, outfile=tmp_path / "spec-f32.gguf", outtype="f32").output
    assert read_drafter(out).draft_vocab_size == 2048
    rep = accept([out], feats, checkpoint=src, device="cpu", numerics="exact")
    (r,) = rep.results
    assert rep.n_max == 7 and r.loop.accepted_per_step == rep.baseline.loop.accepted_per_step
    assert r.anchors.lengths == rep.baseline.anchors.lengths and r.loop.n_drafted > 0


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_capture_never_replaces_an_existing_file_without_force(world, tmp_path):
    root, target, _, _, _ = world
    out = tmp_path / "f.safetensors"
    out.write_bytes(b"mine")
    r = run_cli("capture", "--target-model-dir", target, "--prompts", root / "prompts.txt", "-o", out, "--new-tokens", "2",
                "--device", "cpu")
    assert r.returncode == 1 and "output exists; pass --force to replace it" in r.stderr and out.read_bytes() == b"mine"
    r = run_cli("capture", "--target-model-dir", target, "--prompts", root / "prompts.txt", "-o", out, "--new-tokens", "2",
                "--device", "cpu", "--force", "-q")
    assert r.returncode == 0 and read_features(out).metadata["new_tokens"] == "2"
