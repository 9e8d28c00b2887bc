"""``check`` with a real target model: a tiny hybrid Qwen3.5 built and run by transformers.

What is proved:

* the hidden states our hooks capture are transformers' own ``output_hidden_states`` (entry L
  enters layer L), so each side's taps read the streams their runtimes read;
* a greedy speculative loop (draft a block, verify it with the target, accept the matching
  prefix plus the target's bonus token) run once with the runner on the F32 GGUF and once with the
  reference on the checkpoint drafts the same blocks, accepts the same tokens and ends with the
  same sequence; the same loop with a GGUF whose ``target_layers`` lost llama.cpp's +1 drafts
  other blocks;
* ``check --features target`` passes the right file and fails each broken one (wrong rope base,
  swapped tensors, scaled norm, wrong ``target_layers``) with a line that names what differs;
  the command line does the same with exit codes 0 and 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from drafter_gguf import (
    get_tensor,
    map_key,
    read_parts,
    scale_tensor,
    swap_tensors,
    write_parts,
)

from dflash_convert import convert
from dflash_convert.check import check
from dflash_convert.format.tensors import layer_name
from dflash_convert.runtime.capture import load_target_model, run_target
from dflash_convert.runtime.forward import block_tokens, contiguous_positions, gather_features, run_gguf
from dflash_convert.runtime.reference import load_reference, reference_features, reference_forward
from dflash_convert.runtime.weights import LAYER_ROLES, load_weights
from dflash_convert.sources.checkpoint import read_checkpoint
from dflash_convert.sources.gguf_drafter import read_drafter
from dflash_convert.sources.target import read_target
from fixtures.drafters import make_zlab_drafter
from fixtures.targets import make_target_dir

QWEN35 = dict(schema="nested", vocab_size=248320, mask_token_id=248077)
TAPS = [0, 2]  # z-lab target_layer_ids: the outputs of target layers 0 and 2 (llama.cpp: inputs of 1 and 3)
PROMPT = 12
STEPS = 4
CTX = 9


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(root, target dir with weights, checkpoint, F32 GGUF, target model, its decoder layers)."""
    root = tmp_path_factory.mktemp("check-target")
    target = make_target_dir(root / "target", "qwen35", with_weights=True, seed=3)
    src = make_zlab_drafter(root / "draft", **QWEN35, target_layer_ids=TAPS, swa_layers=[True, False], sliding_window=64)
    out = root / "draft-f32.gguf"
    convert(src, target, outfile=out, outtype="f32")
    model, layers = load_target_model(read_target(target))
    return root, target, src, out, model, layers


def _edit(world, name: str, edit) -> Path:
    root, _, _, f32, _, _ = world
    return write_parts(root / f"broken-{name}.gguf", edit(read_parts(f32)))


def _taps_without_offset(parts):
    """target_layers as the checkpoint spells them, without llama.cpp's +1: the user-reported bug."""
    return map_key(parts, "target_layers", lambda v: [int(x) - 1 for x in v])


def _wrong_rope_base(parts):
    return map_key(parts, "rope_freq_base", lambda v: v / 100)


def _swap_q_o(parts):
    """q and o are both [hidden, n_head * head_dim] = 64 x 64 here: a swap that keeps every shape."""
    q, o = layer_name(0, LAYER_ROLES["wq"]), layer_name(0, LAYER_ROLES["wo"])
    assert get_tensor(parts, q).ne == get_tensor(parts, o).ne
    return swap_tensors(parts, q, o)


def _scaled_norm(parts):
    return scale_tensor(parts, layer_name(0, LAYER_ROLES["attn_norm"]), 1.5)


# --- capture --------------------------------------------------------------------------------------


def test_captured_streams_are_transformers_hidden_states(world):
    _, _, _, _, model, layers = world
    ids = torch.arange(100, 100 + PROMPT)
    streams, logits = run_target(model, layers, ids)
    with torch.no_grad():
        out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    assert streams.shape == (len(layers) + 1, PROMPT, hs[0].shape[-1])
    for i in range(len(layers)):  # entry i enters layer i (HF's last entry is normed; ours is not)
        torch.testing.assert_close(streams[i], hs[i][0].float(), rtol=0, atol=0)
    torch.testing.assert_close(logits, out.logits[0].float(), rtol=0, atol=0)
    assert not torch.equal(streams[-1], hs[-1][0])  # the raw residual, not the final-norm output


# --- the speculative loop -------------------------------------------------------------------------


def speculative_decode(draft, model, layers, d, prompt: torch.Tensor, steps: int) -> tuple[torch.Tensor, list]:
    """Greedy speculative decoding: returns (committed sequence, [(drafted block, accepted count)] per step).

    ``draft(streams, block_ids, positions) -> tokens`` drafts block slots 1.. from the target's layer
    inputs of the committed tokens. Verification is one target pass over committed + anchor + drafts.
    """
    streams, logits = run_target(model, layers, prompt)
    seq, anchor = prompt.clone(), int(logits[-1].argmax())
    history = []
    for _ in range(steps):
        ctx = seq.shape[0]
        ids = block_tokens(d, anchor)
        drafts = draft(streams[:, :ctx], ids, contiguous_positions(ctx, ids.shape[0])).cpu()
        cand = torch.cat([seq, torch.tensor([anchor]), drafts])
        streams, logits = run_target(model, layers, cand)
        preds = logits[ctx:].argmax(-1)  # preds[i]: the target's token after cand[ctx + i]
        n = 0
        while n < drafts.shape[0] and int(preds[n]) == int(drafts[n]):
            n += 1
        seq = torch.cat([seq, torch.tensor([anchor]), drafts[:n]])
        anchor = int(preds[n])  # the target's own token after the accepted prefix
        history.append((drafts, n))
    return torch.cat([seq, torch.tensor([anchor])]), history


def _runner(gguf: Path, target: Path):
    d = read_drafter(gguf)
    w = load_weights(d, read_target(target))

    def draft(streams, ids, pos):
        return run_gguf(d, w, gather_features(d, streams), ids, pos).tokens
    return d, draft


def _reference(src: Path, target: Path):
    model = load_reference(read_checkpoint(src), read_target(target))

    def draft(streams, ids, pos):
        return reference_forward(model, reference_features(model, streams.double()), ids, pos, semantics="llama.cpp").tokens
    return model.drafter, draft


def test_speculative_loop_accepts_identical_tokens_at_f32(world):
    _, target, src, f32, model, layers = world
    prompt = torch.randint(0, 150000, (PROMPT,), generator=torch.Generator().manual_seed(5))
    d, runner = _runner(f32, target)
    dr, reference = _reference(src, target)
    seq_g, hist_g = speculative_decode(runner, model, layers, d, prompt, STEPS)
    seq_r, hist_r = speculative_decode(reference, model, layers, dr, prompt, STEPS)
    assert len(hist_g) == STEPS and all(b.shape == (d.block_size - 1,) for b, _ in hist_g)
    for step, ((bg, ng), (br, nr)) in enumerate(zip(hist_g, hist_r, strict=True)):
        assert torch.equal(bg, br), f"step {step}: drafted {bg.tolist()} vs reference {br.tolist()}"
        assert ng == nr, f"step {step}: accepted {ng} vs {nr}"
    assert torch.equal(seq_g, seq_r)
    # the accepted tokens are the same tokens, step by step
    assert [b[:n].tolist() for b, n in hist_g] == [b[:n].tolist() for b, n in hist_r]
    assert seq_g.shape[0] == PROMPT + STEPS + sum(n for _, n in hist_g) + 1


def test_speculative_loop_sees_a_wrong_target_layers(world):
    """The loop is sensitive: without the +1, the runner reads other streams and drafts other blocks."""
    _, target, src, _, model, layers = world
    bad = _edit(world, "taps", _taps_without_offset)
    prompt = torch.randint(0, 150000, (PROMPT,), generator=torch.Generator().manual_seed(5))
    d, runner = _runner(bad, target)
    dr, reference = _reference(src, target)
    assert d.target_layers == TAPS and dr.target_layers == [t + 1 for t in TAPS]
    _, hist_g = speculative_decode(runner, model, layers, d, prompt, 1)
    _, hist_r = speculative_decode(reference, model, layers, dr, prompt, 1)
    assert not torch.equal(hist_g[0][0], hist_r[0][0])


# --- check with captured features ----------------------------------------------------------------


def _check(world, gguf: Path, **kw):
    _, target, src, _, _, _ = world
    return check(gguf, src, target_model_dir=target, device="cpu", context=CTX, features="target", **kw)


def test_check_with_target_features_passes_the_right_file(world, tmp_path):
    rep = _check(world, world[3], save_io=tmp_path / "io.npz")
    assert rep.passed, rep.render_text()
    assert rep.metrics["top1_agreement"] == 1.0 and rep.metrics["hidden_max_rel_err"] < 1e-5
    io = np.load(tmp_path / "io.npz")
    d = read_drafter(world[3])
    assert io["target_hidden"].shape == (CTX, len(d.target_layers) * d.hidden_size)
    # the saved features are the target's layer inputs at the file's taps, in target_layers order
    streams, logits = run_target(world[4], world[5], torch.randint(
        0, d.vocab_size, (CTX,), generator=torch.Generator().manual_seed(0), dtype=torch.int64))
    np.testing.assert_array_equal(io["target_hidden"], torch.cat([streams[t] for t in d.target_layers], -1).numpy())
    assert int(io["block_ids"][0]) == int(logits[-1, : d.vocab_size].argmax())  # the anchor: the target's next token


@pytest.mark.parametrize("what,edit,named", [
    ("target-layers", _taps_without_offset, "hyper-parameter differs from the checkpoint's: target_layers: file [0, 2], checkpoint [1, 3]"),
    ("rope-base", _wrong_rope_base, "hyper-parameter differs from the checkpoint's: rope_theta: file 100000.0, checkpoint 10000000.0"),
    ("swapped", _swap_q_o, "(swapped?)"),
    ("scaled-norm", _scaled_norm, "about 1.5 times the checkpoint's values"),
])
def test_check_with_target_features_names_what_differs(world, what, edit, named):
    rep = _check(world, _edit(world, what, edit))
    assert not rep.passed and rep.exit_code == 1
    assert any(f.startswith("hidden states differ") for f in rep.failures), rep.failures
    assert any(named in f for f in rep.failures), rep.failures
    if what == "swapped":
        swapped = [f for f in rep.failures if f.startswith("tensor differs:")]
        assert len(swapped) == 2 and all("(swapped?)" in f for f in swapped), swapped
    if what == "scaled-norm":
        assert [f.split(":")[1].strip() for f in rep.failures if f.startswith("tensor differs:")] == [
            layer_name(0, LAYER_ROLES["attn_norm"])]


@pytest.mark.slow  # runs a model (or a whole release) end to end
def test_check_command_with_target_features(world):
    _, target, src, f32, _, _ = world
    ok = run_cli("check", f32, "--checkpoint", src, "--target-model-dir", target, "--features", "target",
                 "--context", str(CTX), "--device", "cpu", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["result"] == "pass"
    bad = run_cli("check", _edit(world, "taps-cli", _taps_without_offset), "--checkpoint", src, "--target-model-dir",
                  target, "--features", "target", "--context", str(CTX), "--device", "cpu")
    assert bad.returncode == 1
    assert "FAIL: hyper-parameter differs from the checkpoint's: target_layers" in bad.stdout


def test_target_features_need_the_target_directory(world):
    _, target, src, f32, _, _ = world
    gg = run_cli("check", f32, "--checkpoint", src, "--target-gguf", f32, "--features", "target", "--device", "cpu")
    assert gg.returncode == 1 and "features from the target need --target-model-dir" in gg.stderr
    wrong = run_cli("check", f32, "--checkpoint", src, "--target-model-dir", target, "--features", "bogus", "--device", "cpu")
    # neither a kind of features nor a file: the missing input it names (exit 2), as every reader does
    assert wrong.returncode == 2 and "bogus: no such features file (--features takes synthetic, target, or a file" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1


def test_context_beyond_the_drafter_is_refused_before_loading(world):
    _, target, src, f32, _, _ = world
    n = read_drafter(f32).context_length
    r = run_cli("check", f32, "--checkpoint", src, "--target-model-dir", target, "--features", "target",
                "--context", str(n), "--device", "cpu")
    assert r.returncode == 1 and r.stderr.strip().endswith(f"exceeds the drafter's context length {n}"), r.stderr
    assert len(r.stderr.splitlines()) == 1


@pytest.mark.slow  # the error comes from transformers' loader: it imports transformers and torch (5-10 s)
def test_target_without_weights_is_named(world, tmp_path):
    """A target dir without its final norm (every layer there, the model still cannot run as trained)."""
    import shutil

    from safetensors.torch import load_file, save_file
    _, target, src, f32, _, _ = world
    partial = tmp_path / "partial"
    shutil.copytree(target, partial)
    st = partial / "model.safetensors"
    every = load_file(st)
    kept = {k: v for k, v in every.items() if k != "model.language_model.norm.weight"}
    assert len(kept) == len(every) - 1
    save_file(kept, str(st))
    r = run_cli("check", f32, "--checkpoint", src, "--target-model-dir", partial, "--features", "target",
                "--device", "cpu")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"dflash-convert: error: {partial}: the target's safetensors lack ")
    assert "the model cannot run to capture features" in r.stderr and len(r.stderr.splitlines()) == 1


def _target_copy(world, tmp_path, edit_config) -> Path:
    import shutil
    out = tmp_path / "target-copy"
    shutil.copytree(world[1], out)
    cfg = json.loads((out / "config.json").read_text())
    edit_config(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.slow  # the error comes from transformers' loader: it imports transformers and torch (5-10 s)
def test_remote_code_architecture_is_refused_not_run(world, tmp_path):
    """A target naming an architecture transformers does not ship (its code would come from the repo)."""
    def remote(cfg):
        cfg["architectures"] = ["EvilForCausalLM"]
        cfg["auto_map"] = {"AutoModelForCausalLM": "evil.EvilForCausalLM"}
    target = _target_copy(world, tmp_path, remote)
    (target / "evil.py").write_text("raise SystemExit('remote code ran')\n")
    r = run_cli("check", world[3], "--checkpoint", world[2], "--target-model-dir", target, "--features", "target",
                "--device", "cpu")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "remote code ran" not in r.stdout + r.stderr
    assert r.stderr.startswith(f"dflash-convert: error: {target}: architecture 'EvilForCausalLM' is not a transformers class")
    assert len(r.stderr.splitlines()) == 1


@pytest.mark.slow  # the error comes from transformers' loader: it imports transformers and torch (5-10 s)
def test_target_that_does_not_fit_its_weights_is_one_line(world, tmp_path):
    """A config whose sizes do not match the safetensors: transformers' loader error becomes one line."""
    def wider(cfg):
        cfg["text_config"]["intermediate_size"] = 96
    target = _target_copy(world, tmp_path, wider)
    r = run_cli("check", world[3], "--checkpoint", world[2], "--target-model-dir", target, "--features", "target",
                "--device", "cpu")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"dflash-convert: error: {target}: transformers cannot load the target weights: "
                               "tensor shapes in the safetensors do not match config.json")
    assert len(r.stderr.splitlines()) == 1
