"""Convert tiny real checkpoints and read the GGUF files back."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from safetensors.torch import load_file

from dflash_convert import convert, plan_conversion
from dflash_convert.conversion import write_plan
from dflash_convert.errors import DFlashError, InputFileError
from dflash_convert.sources.gguf import read_gguf
from fixtures.drafters import make_zlab_drafter


def fields(path: Path) -> dict:
    g = read_gguf(path)
    return {k: g.get(k) for k in g.metadata}


class _T:
    def __init__(self, g, t) -> None:
        self.shape, self.tensor_type, self.data = list(t.ne), t.ggml_type, g.tensor_bytes(t)


def tensors(path: Path) -> dict:
    g = read_gguf(path)
    return {t.name: _T(g, t) for t in g.tensors}


@pytest.fixture(scope="module")
def dense(tmp_path_factory, qwen3_target):
    d = tmp_path_factory.mktemp("dense")
    src = make_zlab_drafter(d / "draft", target_layer_ids=[0, 2])
    out = d / "draft.gguf"
    convert(src, qwen3_target, outfile=out, outtype="bf16")
    return src, out


def test_dense_qwen3_keys(dense):
    _, out = dense
    f = fields(out)
    assert f["general.architecture"] == "dflash"
    assert f["dflash.block_count"] == 2
    assert f["dflash.embedding_length"] == 64
    assert f["dflash.feed_forward_length"] == 128
    assert f["dflash.attention.head_count"] == 4
    assert f["dflash.attention.head_count_kv"] == 2
    assert f["dflash.attention.key_length"] == 16
    assert f["dflash.context_length"] == 40960
    assert f["dflash.rope.freq_base"] == 1e6
    assert f["dflash.block_size"] == 16
    assert f["dflash.target_layers"] == [1, 3]  # z-lab ids + 1
    assert f["general.file_type"] == 32
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "qwen2"
    assert len(f["tokenizer.ggml.tokens"]) == 151936
    assert f["tokenizer.ggml.tokens"][151669] == "[PAD151669]"  # the mask id is a padded slot
    assert f["tokenizer.ggml.mask_token_id"] == 151669
    assert f["tokenizer.ggml.eos_token_id"] == 151645
    for absent in ("dflash.attention.sliding_window", "dflash.rope.dimension_sections", "dflash.attention.causal",
                   "dflash.hidden_activation"):
        assert absent not in f


def test_dense_qwen3_tensors(dense):
    src, out = dense
    t = tensors(out)
    assert len(t) == 3 + 11 * 2
    assert "token_embd.weight" not in t and "output.weight" not in t
    assert list(t["fc.weight"].shape) == [128, 64] and t["fc.weight"].tensor_type.name == "BF16"
    assert list(t["blk.0.attn_k.weight"].shape) == [64, 32]
    assert list(t["blk.1.ffn_down.weight"].shape) == [128, 64]
    for name, ti in t.items():
        if name.endswith("norm.weight"):
            assert ti.tensor_type.name == "F32", name
    # bf16 payload equals the checkpoint's words, and norms are exact in f32
    ck = load_file(str(src / "model.safetensors"))
    fc = t["fc.weight"].data.view(np.uint16).reshape(64, 128)
    assert np.array_equal(fc, ck["fc.weight"].view(torch.int16).numpy().view(np.uint16))
    norm = t["blk.0.ffn_norm.weight"].data.view(np.float32)
    assert np.array_equal(norm, ck["layers.0.post_attention_layernorm.weight"].float().numpy())


def test_provenance_in_general_keys(dense):
    src, out = dense
    f = fields(out)
    assert f["general.converter.name"] == "dflash-convert"
    assert f["general.source.files"] == ["model.safetensors"]
    assert f["general.source.files_sha256"] == [hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()]
    assert f["general.source.config_sha256"] == hashlib.sha256((src / "config.json").read_bytes()).hexdigest()


def test_hybrid_qwen35_swa(tmp_path, qwen35_target):
    src = make_zlab_drafter(tmp_path / "draft", schema="nested", vocab_size=248320, mask_token_id=248077,
                            swa_layers=[True, False], sliding_window=2048, target_layer_ids=[0, 3])
    out = tmp_path / "d.gguf"
    convert(src, qwen35_target, outfile=out, outtype="f16")
    f = fields(out)
    assert f["dflash.rope.dimension_sections"] == [8, 0, 0, 0]  # M-RoPE target: degenerate sections
    assert f["dflash.attention.sliding_window"] == 2048
    assert f["dflash.attention.sliding_window_pattern"] == [True, False]
    assert f["dflash.rope.freq_base"] == 1e7
    assert f["dflash.context_length"] == 262144
    assert f["tokenizer.ggml.pre"] == "qwen35" and len(f["tokenizer.ggml.tokens"]) == 248320
    assert f["general.file_type"] == 1
    assert tensors(out)["blk.0.attn_q.weight"].tensor_type.name == "F16"


def _data(path: Path) -> dict[str, bytes]:
    return {n: t.data.tobytes() for n, t in tensors(path).items()}


def test_sharded_and_prefixed_equal_single_file(tmp_path, qwen3_target):
    outs = {}
    for kind, kw in {"single": {}, "sharded": {"shards": 3}, "prefixed": {"prefix": "model."}}.items():
        src = make_zlab_drafter(tmp_path / kind, seed=7, **kw)
        outs[kind] = tmp_path / f"{kind}.gguf"
        convert(src, qwen3_target, outfile=outs[kind], outtype="q8_0")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert fields(outs["sharded"])["general.source.files"] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    ref = _data(outs["single"])
    assert _data(outs["sharded"]) == ref
    assert _data(outs["prefixed"]) == ref
    assert [n for n in tensors(outs["single"])] == [n for n in tensors(outs["prefixed"])]


def test_auto_outtype_follows_checkpoint_dtype(tmp_path, qwen3_target):
    for dtype, ftype in (("bf16", 32), ("f16", 1), ("f32", 1)):
        src = make_zlab_drafter(tmp_path / dtype, dtype=dtype)
        plan = plan_conversion(src, qwen3_target)
        assert int(plan.file_type) == ftype, dtype
        # <Name> is general.name as upstream's heuristics derive it from the directory ("bf16" -> "Bf16")
        name = plan.metadata.get("general.name").replace(" ", "-")
        assert name.lower() == dtype
        assert plan.output == src / f"dflash-{name}-{'BF16' if ftype == 32 else 'F16'}.gguf"


def test_same_input_gives_identical_bytes(tmp_path, qwen3_target):
    src = make_zlab_drafter(tmp_path / "d")
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    convert(src, qwen3_target, outfile=a, outtype="q8_0")
    convert(src, qwen3_target, outfile=b, outtype="q8_0")
    assert a.read_bytes() == b.read_bytes()


def test_dry_run_prints_plan_and_writes_nothing(tmp_path, qwen3_target):
    src = make_zlab_drafter(tmp_path / "d")
    out = tmp_path / "x.gguf"
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", out, "--dry-run", "--outtype", "q8_0")
    assert r.returncode == 0, r.stderr
    assert "dflash.target_layers" in r.stdout and "blk.1.ffn_down.weight" in r.stdout and "Q8_0" in r.stdout
    assert "dry run: nothing written" in r.stdout
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_existing_output_needs_force(tmp_path, qwen3_target):
    src = make_zlab_drafter(tmp_path / "d")
    out = tmp_path / "x.gguf"
    out.write_bytes(b"keep me")
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", out, "-q")
    assert r.returncode != 0 and "--force" in r.stderr
    assert out.read_bytes() == b"keep me"
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", out, "-q", "--force")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:4] == b"GGUF"


def test_never_overwrites_an_input(tmp_path, qwen3_target):
    src = make_zlab_drafter(tmp_path / "d")
    before = (src / "model.safetensors").read_bytes()
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", src / "model.safetensors", "--force", "-q")
    assert r.returncode != 0 and "overwrite an input" in r.stderr
    assert (src / "model.safetensors").read_bytes() == before


def test_failure_while_writing_leaves_no_file(tmp_path, qwen3_target):
    src = make_zlab_drafter(tmp_path / "d")
    out = tmp_path / "out" / "x.gguf"
    out.parent.mkdir()
    plan = plan_conversion(src, qwen3_target, outfile=out)
    st = src / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size - 1000])  # truncated after planning
    with pytest.raises(InputFileError, match="truncated"):
        write_plan(plan)
    assert list(out.parent.iterdir()) == []


def test_a_drafter_is_not_a_target_gguf(tmp_path, dense):
    _, drafter_gguf = dense
    src = make_zlab_drafter(tmp_path / "d")
    with pytest.raises(InputFileError, match="drafter, not a target"):
        plan_conversion(src, target_gguf=drafter_gguf)


def test_no_target_is_an_error(tmp_path):
    src = make_zlab_drafter(tmp_path / "d")
    with pytest.raises(DFlashError, match="target-model-dir"):
        plan_conversion(src)


def test_interleaved_config_keeps_neox_rows(tmp_path, qwen3_target):
    """A checkpoint without rope_is_neox_style converts rows unchanged (no silent permutation)."""
    src = make_zlab_drafter(tmp_path / "d", dtype="f32")
    out = tmp_path / "x.gguf"
    convert(src, qwen3_target, outfile=out, outtype="f32")
    q = tensors(out)["blk.0.attn_q.weight"].data.view(np.float32)
    ck = load_file(str(src / "model.safetensors"))["layers.0.self_attn.q_proj.weight"].numpy()
    assert np.array_equal(q.reshape(ck.shape), ck)
    cfg = json.loads((src / "config.json").read_text())
    assert "rope_is_neox_style" not in cfg
