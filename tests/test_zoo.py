"""Every published checkpoint shape: speculators own/full vocabulary, embed-only, sinks,
interleaved RoPE, mask_embedding.pt, gelu. Parity with upstream wherever upstream converts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from gguf_compare import parity_differences
from safetensors.torch import load_file, save_file

from dflash_convert import convert
from dflash_convert.errors import InputFileError
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.sources.gguf_drafter import describe, read_drafter
from fixtures.drafters import (
    add_tensors,
    draft_vocabulary,
    edit_config,
    make_speculators_drafter,
    make_zlab_drafter,
    write_mask_embedding,
)
from fixtures.targets import make_target_dir
from fixtures.upstream import run_upstream_convert

VD = 2048


def _tensors(path: Path) -> dict:
    g = read_gguf(path)
    return {t.name: (t, g.tensor_bytes(t)) for t in g.tensors}


@pytest.fixture(scope="module")
def weighted_target(tmp_path_factory) -> Path:
    """Qwen3 target with real (random) weights, untied head, 4 layers, hidden 64."""
    return make_target_dir(tmp_path_factory.mktemp("wt") / "qwen3", "qwen3", with_weights=True, tie_word_embeddings=False)


def _target_weights(target: Path) -> dict[str, torch.Tensor]:
    w = load_file(str(target / "model.safetensors"))
    return {"embed": w["model.embed_tokens.weight"], "head": w["lm_head.weight"]}


def test_speculators_own_vocabulary(tmp_path, qwen3_target):
    src = make_speculators_drafter(tmp_path / "spec", draft_vocab_size=VD, aux_layer_ids=[1, 3])
    out = tmp_path / "spec.gguf"
    convert(src, qwen3_target, outfile=out, outtype="bf16")
    g = read_gguf(out)
    t = _tensors(out)
    assert g.get("dflash.target_layers") == [1, 3]  # aux ids are llama.cpp's convention already
    assert g.get("dflash.block_size") == 8
    assert g.get("tokenizer.ggml.mask_token_id") == 151669
    info, data = t["d2t"]
    assert info.ggml_type.name == "I64" and info.ne == (VD,)
    offsets, t2d = draft_vocabulary(151936, VD, 0)
    expected = (offsets + torch.arange(VD)).numpy()
    assert np.array_equal(data.view(np.int64), expected)  # absolute target ids
    assert np.flatnonzero(t2d.numpy()).tolist() == expected.tolist()
    assert t["output.weight"][0].ne == (64, VD)
    assert t["token_embd.weight"][0].ne == (64, 151936)
    assert "t2d" not in t


def test_speculators_full_vocabulary_keeps_both_without_target_weights(tmp_path, qwen3_target):
    src = make_speculators_drafter(tmp_path / "spec", draft_vocab_size=None)
    out = tmp_path / "full.gguf"
    convert(src, qwen3_target, outfile=out, outtype="bf16")
    t = _tensors(out)
    assert "d2t" not in t
    assert t["token_embd.weight"][0].ne == (64, 151936) and t["output.weight"][0].ne == (64, 151936)


def test_full_vocabulary_equal_to_target_is_shared(tmp_path, weighted_target):
    w = _target_weights(weighted_target)
    src = make_speculators_drafter(tmp_path / "spec", draft_vocab_size=None, embed=w["embed"], head=w["head"],
                                   aux_layer_ids=[1, 2])
    out = tmp_path / "shared.gguf"
    convert(src, weighted_target, outfile=out, outtype="bf16")
    names = set(_tensors(out))
    assert "token_embd.weight" not in names and "output.weight" not in names
    kept = tmp_path / "kept.gguf"
    convert(src, weighted_target, outfile=kept, outtype="bf16", keep_embeddings=True)
    assert {"token_embd.weight", "output.weight"} <= set(_tensors(kept))


def test_embed_only_drafter(tmp_path, qwen3_target, weighted_target):
    """embed_tokens without lm_head: never written alone (the runtime would tie the head)."""
    w = _target_weights(weighted_target)
    same = add_tensors(make_zlab_drafter(tmp_path / "same"), {"embed_tokens.weight": w["embed"]})
    out = tmp_path / "same.gguf"
    convert(same, weighted_target, outfile=out, outtype="bf16")
    names = set(_tensors(out))
    assert "token_embd.weight" not in names and "output.weight" not in names  # shared from the target
    own = add_tensors(make_zlab_drafter(tmp_path / "own"), {"embed_tokens.weight": w["embed"] * 2})
    out = tmp_path / "own.gguf"
    convert(own, weighted_target, outfile=out, outtype="bf16")
    t = _tensors(out)
    assert set(t) >= {"token_embd.weight", "output.weight"}
    head = t["output.weight"][1].view(np.uint16)
    assert np.array_equal(head, w["head"].view(torch.int16).numpy().view(np.uint16).reshape(-1))  # the target's head
    r = run_cli("convert", own, "--target-model-dir", qwen3_target, "-o", tmp_path / "x.gguf")
    assert r.returncode != 0 and "needs the target's output head" in r.stderr and "tie" in r.stderr
    assert not (tmp_path / "x.gguf").exists()


def _break(src: Path, name: str, value: torch.Tensor) -> None:
    t = load_file(str(src / "model.safetensors"))
    t[name] = value
    save_file(t, str(src / "model.safetensors"), metadata={"format": "pt"})


def _d2t_cases():
    off, t2d = draft_vocabulary(151936, VD, 0)
    ids = off + torch.arange(VD)

    def offsets(new_ids):
        return (new_ids - torch.arange(VD)).to(torch.int64)

    dup = ids.clone()
    dup[5] = dup[4]
    dec = ids.clone()
    dec[5], dec[6] = ids[6], ids[5]
    big = ids.clone()
    big[-1] = 151936
    t2d_sum = t2d.clone()
    t2d_sum[int(torch.nonzero(~t2d)[0])] = True
    t2d_miss = t2d.clone()
    t2d_miss[int(ids[7])] = False
    t2d_miss[int(torch.nonzero(~t2d)[0])] = True
    return {
        "d2t_length": ("d2t", off[:-1], "'d2t' has shape [2047], expected [2048]"),
        "d2t_out_of_range": ("d2t", offsets(big), "outside [0, 151936)"),
        "d2t_duplicate": ("d2t", offsets(dup), "not unique and increasing: duplicate"),
        "d2t_decreasing": ("d2t", offsets(dec), "not unique and increasing: decreasing"),
        "d2t_dtype": ("d2t", off.to(torch.float32), "expected I64 offsets"),
        "t2d_sum": ("t2d", t2d_sum, "t2d.sum() is 2049, expected draft_vocab_size 2048"),
        "t2d_not_at_ids": ("t2d", t2d_miss, "t2d is false at target id"),
        "t2d_shape": ("t2d", t2d[:-1], "t2d has shape [151935], expected [151936]"),
        "lm_head_rows": ("lm_head.weight", torch.zeros(VD + 1, 64, dtype=torch.bfloat16), "'lm_head.weight' has shape [2049, 64], expected [2048, 64]"),
    }


@pytest.mark.parametrize("case", sorted(_d2t_cases()))
def test_broken_own_vocabulary_invariants(tmp_path, qwen3_target, case):
    name, value, needle = _d2t_cases()[case]
    src = make_speculators_drafter(tmp_path / "spec", draft_vocab_size=VD)
    _break(src, name, value)
    out = tmp_path / "out" / "x.gguf"
    out.parent.mkdir()
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", out)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "warning" not in ln]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert list(out.parent.iterdir()) == []


def test_missing_d2t_with_reduced_vocabulary(tmp_path, qwen3_target):
    src = make_speculators_drafter(tmp_path / "spec", draft_vocab_size=VD)
    t = load_file(str(src / "model.safetensors"))
    del t["d2t"], t["t2d"]
    save_file(t, str(src / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputFileError, match="no d2t tensor"):
        convert(src, qwen3_target, outfile=tmp_path / "x.gguf")


def test_speculators_config_checks(tmp_path, qwen3_target):
    src = make_speculators_drafter(tmp_path / "spec", draft_vocab_size=VD)
    for change, needle in (({"aux_hidden_state_layer_ids": None}, "aux_hidden_state_layer_ids is missing"),
                           ({"sample_from_anchor": True}, "sample_from_anchor is true"),
                           ({"aux_hidden_state_layer_ids": [0, 2]}, "include 0"),
                           ({"target_hidden_size": 128}, "target_hidden_size 128 differs"),
                           ({"speculators_model_type": "eagle3"}, "'eagle3' is not supported")):
        cfg = json.loads((src / "config.json").read_text())
        (tmp_path / "c.json").write_text(json.dumps(cfg))
        cfg.update(change)
        (src / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(Exception, match=needle):
            convert(src, qwen3_target, outfile=tmp_path / "x.gguf")
        shutil.copy(tmp_path / "c.json", src / "config.json")


# ---- parity with upstream where upstream converts -------------------------------------------

@pytest.mark.parity
@pytest.mark.slow
@pytest.mark.parametrize("shape", ["sinks", "interleaved", "mask_embedding", "gelu"])
def test_zoo_parity(tmp_path, qwen3_target, weighted_target, shape):
    target = qwen3_target
    src = make_zlab_drafter(tmp_path / shape, dtype="bf16")
    if shape == "sinks":
        g = torch.Generator().manual_seed(5)
        add_tensors(src, {f"layers.{i}.self_attn.sinks": torch.randn(4, generator=g).to(torch.bfloat16) for i in range(2)})
    elif shape == "interleaved":
        edit_config(src, rope_is_neox_style=False)
    elif shape == "mask_embedding":
        write_mask_embedding(src, 151669, 64)
        target = weighted_target
    elif shape == "gelu":
        edit_config(src, hidden_act="gelu_pytorch_tanh")
    ours, theirs = tmp_path / "ours.gguf", tmp_path / "upstream.gguf"
    convert(src, target, outfile=ours, outtype="bf16")
    r = run_upstream_convert(src, theirs, outtype="bf16", target_model_dir=target)
    assert r.returncode == 0, r.stderr[-3000:]
    diffs = parity_differences(ours, theirs)
    g = read_gguf(ours)
    if shape == "gelu":  # deliberate: upstream omits the key, so llama.cpp would run SiLU
        assert g.get("dflash.hidden_activation") == "gelu_pytorch_tanh"
        assert diffs == ["keys only in ours: ['dflash.hidden_activation']; only upstream: []"]
        return
    assert diffs == [], "\n".join(diffs)
    assert describe(read_drafter(theirs)) == describe(read_drafter(ours))
    t = _tensors(ours)
    if shape == "sinks":
        assert t["blk.0.attn_sinks.weight"][0].ggml_type.name == "F32" and t["blk.0.attn_sinks.weight"][0].ne == (4,)
    if shape == "interleaved":  # rows really moved: even rows of each head first
        q = load_file(str(src / "model.safetensors"))["layers.0.self_attn.q_proj.weight"].float().numpy()
        got = t["blk.0.attn_q.weight"][1].view(np.uint16)
        got = ((got.astype(np.uint32) << 16).view(np.float32)).reshape(q.shape)
        assert np.array_equal(got[:8], q[0:16:2]) and np.array_equal(got[8:16], q[1:16:2])
    if shape == "mask_embedding":
        emb = t["token_embd.weight"][1].view(np.uint16).reshape(151936, 64)
        mask = torch.load(src / "mask_embedding.pt", weights_only=True)["embedding"].to(torch.bfloat16)
        assert np.array_equal(emb[151669], mask.view(torch.int16).numpy().view(np.uint16))
        assert [n for n in t][:2] == ["output.weight", "token_embd.weight"]
