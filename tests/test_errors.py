"""Bad input through the command line: one clear error line, non-zero exit, no output left behind."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from conftest import run_cli

from fixtures.drafters import make_zlab_drafter


def edit_config(src: Path, **changes) -> None:
    cfg = json.loads((src / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (src / "config.json").write_text(json.dumps(cfg))


def edit_dflash(src: Path, **changes) -> None:
    cfg = json.loads((src / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg["dflash_config"].pop(k, None)
        else:
            cfg["dflash_config"][k] = v
    (src / "config.json").write_text(json.dumps(cfg))


def rewrite_header(src: Path, mutate) -> None:
    path = src / "model.safetensors"
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    mutate(header)
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data[8 + n:])


def _drop_tensor(h):  # remove an entry and shift nothing: leaves a hole
    del h["layers.0.mlp.up_proj.weight"]


def _rename_tensor(h):
    h["layers.0.mlp.experts.weight"] = h.pop("layers.0.mlp.up_proj.weight")


def _bad_offsets(h):
    e = h["fc.weight"]
    e["data_offsets"] = [e["data_offsets"][0], e["data_offsets"][1] - 2]


def _bad_shape(h):
    h["fc.weight"]["shape"] = [h["fc.weight"]["shape"][0], h["fc.weight"]["shape"][1] // 2 * 2 + 64]


CASES = {
    # config problems: we refuse to guess
    "missing_target_layer_ids": (lambda s: edit_dflash(s, target_layer_ids=None), "target_layer_ids is missing"),
    "target_layer_out_of_range": (lambda s: edit_dflash(s, target_layer_ids=[1, 4]), "outside the target's 4 layers"),
    "missing_mask_token": (lambda s: edit_dflash(s, mask_token_id=None), "mask_token_id is missing"),
    "mask_token_too_big": (lambda s: edit_dflash(s, mask_token_id=151936), "not below vocab_size"),
    "missing_kv_heads": (lambda s: edit_config(s, num_key_value_heads=None), "'num_key_value_heads'"),
    "missing_hidden_size": (lambda s: edit_config(s, hidden_size=None), "'hidden_size'"),
    "missing_eps": (lambda s: edit_config(s, rms_norm_eps=None), "'rms_norm_eps'"),
    "swa_without_layer_types": (lambda s: edit_config(s, use_sliding_window=True, sliding_window=1024, layer_types=None),
                                "layer_types is missing"),
    "layer_types_wrong_length": (lambda s: edit_config(s, layer_types=["full_attention"]), "layer_types has 1 entries"),
    "not_a_dflash_config": (lambda s: edit_config(s, architectures=["Qwen3ForCausalLM"]), "not a DFlash drafter"),
    "config_not_json": (lambda s: (s / "config.json").write_text("{oops"), "not valid JSON"),
    "no_config": (lambda s: (s / "config.json").unlink(), "no config.json"),
    # checkpoint problems
    "truncated_safetensors": (lambda s: (s / "model.safetensors").write_bytes((s / "model.safetensors").read_bytes()[:-100]),
                              "truncated"),
    "header_offset_mismatch": (lambda s: rewrite_header(s, _bad_offsets), "data_offsets span"),
    "tensor_hole": (lambda s: rewrite_header(s, _drop_tensor), "hole"),
    "unknown_tensor_name": (lambda s: rewrite_header(s, _rename_tensor), "unknown tensor 'layers.0.mlp.experts.weight'"),
    "fc_width_wrong": (lambda s: rewrite_header(s, _bad_shape), "data_offsets span"),
    "no_weights": (lambda s: (s / "model.safetensors").unlink(), "no model*.safetensors"),
}


def _one_error_line(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("dflash-convert: error: ")
    return lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_drafter_input(tmp_path, qwen3_target, case):
    mutate, needle = CASES[case]
    src = make_zlab_drafter(tmp_path / "draft")
    mutate(src)
    out = tmp_path / "out" / "x.gguf"
    out.parent.mkdir()
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", out)
    assert r.returncode != 0
    line = _one_error_line(r)
    assert needle in line, line
    assert str(src) in line  # names the file or directory at fault
    assert list(out.parent.iterdir()) == []  # no output, no temporary file


def test_fc_width_must_match_taps(tmp_path, qwen3_target):
    """A consistent file whose fc does not take len(ids) * hidden inputs."""
    src = make_zlab_drafter(tmp_path / "draft", target_layer_ids=[0, 1, 2])
    edit_dflash(src, target_layer_ids=[0, 2])
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", tmp_path / "x.gguf")
    assert r.returncode != 0
    assert "fc.weight input width 192 != len(target_layer_ids) * hidden_size = 2 * 64" in _one_error_line(r)
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("case", ["hidden_mismatch", "no_tokenizer", "not_a_dir", "unknown_arch"])
def test_wrong_target(tmp_path, qwen3_target, case):
    src = make_zlab_drafter(tmp_path / "draft")
    target = tmp_path / "target"
    shutil.copytree(qwen3_target, target)
    needle = {"hidden_mismatch": "differs from the target's 128", "no_tokenizer": "no tokenizer.json",
              "not_a_dir": "not a directory", "unknown_arch": "no tokenizer route for target architecture 'MambaForCausalLM'"}[case]
    if case == "hidden_mismatch":
        edit_config(target, hidden_size=128)
    elif case == "no_tokenizer":
        (target / "tokenizer.json").unlink()
    elif case == "not_a_dir":
        shutil.rmtree(target)
        target.write_text("")
    else:
        edit_config(target, architectures=["MambaForCausalLM"])
    r = run_cli("convert", src, "--target-model-dir", target, "-o", tmp_path / "x.gguf")
    assert r.returncode != 0
    assert needle in _one_error_line(r)
    assert not (tmp_path / "x.gguf").exists()


def test_unknown_pre_tokenizer_hash_points_to_flag(tmp_path, qwen3_target):
    """Change the split regex: the probe hash is unknown; the error prints it and names --tokenizer-pre."""
    src = make_zlab_drafter(tmp_path / "draft")
    target = tmp_path / "target"
    shutil.copytree(qwen3_target, target)
    tj = json.loads((target / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    (target / "tokenizer.json").write_text(json.dumps(tj))
    out = tmp_path / "x.gguf"
    r = run_cli("convert", src, "--target-model-dir", target, "-o", out)
    assert r.returncode != 0
    line = _one_error_line(r)
    assert "pre-tokenizer not recognized (probe hash " in line and "--tokenizer-pre NAME" in line
    assert not out.exists()
    r = run_cli("convert", src, "--target-model-dir", target, "-o", out, "--tokenizer-pre", "qwen2", "-q")
    assert r.returncode == 0, r.stderr
    assert out.exists()
