"""Faults of the values: a config or flag value that does not fit its GGUF type, has the wrong JSON
type, or that llama.cpp cannot run is refused before anything is written, naming the key; validate
fails such a file, and convert, quantize, migrate and check refuse to leave or pass one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import faults
import pytest
from faults import cli, leftovers, one_error_line

from dflash_convert import convert
from dflash_convert.errors import DFlashError
from dflash_convert.validate import validate
from fixtures.drafters import edit_config

drafter = faults.drafter  # the shared fixture


@pytest.mark.parametrize("change,key", [
    ({"max_position_embeddings": 2**40}, "max_position_embeddings"),
    ({"num_hidden_layers": 2**33}, "num_hidden_layers"),
    ({"hidden_size": 2**32}, "hidden_size"),
    ({"intermediate_size": 2**32 + 5}, "intermediate_size"),
    ({"num_attention_heads": 2**35}, "num_attention_heads"),
    ({"head_dim": 2**32}, "head_dim"),
    ({"vocab_size": 2**31}, "vocab_size"),
    ({"sliding_window": 2**32, "use_sliding_window": True, "layer_types": ["sliding_attention", "full_attention"]}, "sliding_window"),
    ({"rope_theta": 1e39}, "rope_theta"),
    ({"rope_theta": 10**400}, "rope_theta"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
])
def test_values_that_do_not_fit_are_refused(tmp_path, drafter, qwen3_target, change, key):
    d = tmp_path / "d"
    shutil.copytree(drafter, d)
    edit_config(d, **change)
    r = cli("convert", d, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf")
    assert r.returncode == 1, r.stderr
    line = one_error_line(r)
    assert key in line and ("does not fit" in line or "must be" in line or "exceeds" in line or "finite" in line), line
    assert not (tmp_path / "o.gguf").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("dflash_change,key", [
    ({"block_size": 2**32}, "block_size"),
    ({"mask_token_id": 2**32}, "mask_token_id"),
    ({"target_layer_ids": [0, 2**31]}, "target_layer_ids"),
])
def test_dflash_config_values_that_do_not_fit(tmp_path, drafter, qwen3_target, dflash_change, key):
    d = tmp_path / "d"
    shutil.copytree(drafter, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["dflash_config"].update(dflash_change)
    (d / "config.json").write_text(json.dumps(cfg))
    r = cli("convert", d, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf")
    assert r.returncode == 1
    assert key in one_error_line(r)
    assert not (tmp_path / "o.gguf").exists()


def test_migrate_flags_that_do_not_fit(tmp_path):
    from drafter_gguf import write_parts
    from test_migrate import buun

    src = write_parts(tmp_path / "buun.gguf", buun())
    for flags, what in ((["--mask-token-id", str(2**32)], "--mask-token-id"), (["--mask-token-id", "-3"], "--mask-token-id")):
        r = cli("migrate", src, tmp_path / "o.gguf", *flags)
        assert r.returncode != 0 and what in r.stderr and not (tmp_path / "o.gguf").exists(), r.stderr


@pytest.mark.parametrize("change,why", [
    ({"rms_norm_eps": -1e-6}, "layer_norm_rms_epsilon"),
    ({"rms_norm_eps": 0}, "layer_norm_rms_epsilon"),
    ({"rope_theta": -10000}, "rope.freq_base"),
    ({"rope_theta": 0}, "rope.freq_base"),
])
def test_convert_refuses_what_validate_fails(tmp_path, drafter, qwen3_target, change, why):
    d = tmp_path / "d"
    shutil.copytree(drafter, d)
    edit_config(d, **change)
    r = cli("convert", d, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf")
    assert r.returncode == 1
    line = one_error_line(r)
    assert "fails validate" in line and why in line, line
    assert not (tmp_path / "o.gguf").exists() and leftovers(tmp_path) == []


def test_validate_fails_bad_floats(tmp_path):
    from drafter_gguf import drafter_parts, kv, write_parts

    for short, value in (("rms_eps", float("nan")), ("rope_freq_base", float("inf")), ("rope_freq_base", -1.0),
                         ("value_scale", 0.0), ("embedding_scale", float("-inf"))):
        keys, tensors = drafter_parts()
        keys = [k for k in keys if not k.key.endswith(kv(short, 0.0).key.split("dflash.", 1)[-1])] + [kv(short, value)]
        path = write_parts(tmp_path / f"{short}.gguf", (keys, tensors))
        report = validate(path)
        assert report.exit_code == 1 and report.check("hparams").status == "fail", (short, value)


def test_tokenizer_pre_must_be_known(tmp_path, drafter, qwen3_target):
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf", "--tokenizer-pre", "qwen-9000")
    assert r.returncode == 1
    line = one_error_line(r)
    assert "qwen-9000" in line and "qwen35" in line and "llama-bpe" in line  # the list of names llama.cpp knows
    assert not (tmp_path / "o.gguf").exists()
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf", "--tokenizer-pre", "qwen2")
    assert r.returncode == 0, r.stderr


def test_migrate_refuses_instead_of_leaving_an_invalid_file(tmp_path):
    from drafter_gguf import write_parts
    from test_migrate import lucebox

    src = write_parts(tmp_path / "lucebox.gguf", lucebox(ids=None))  # holds no layer ids: --target-layers supplies them
    r = cli("migrate", src, tmp_path / "o.gguf", "--target-layers", "0,0", "--mask-token-id", "4")
    assert r.returncode == 1 and "fails validate" in one_error_line(r)
    assert not (tmp_path / "o.gguf").exists() and leftovers(tmp_path) == []
    r = cli("migrate", src, tmp_path / "o.gguf", "--target-layers", "-1,4,6", "--mask-token-id", "4")
    assert r.returncode == 1 and not (tmp_path / "o.gguf").exists()


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_json(path: Path, change: dict, sub: str | None = None) -> None:
    cfg = json.loads(path.read_text())
    (cfg[sub] if sub else cfg).update(change)
    path.write_text(json.dumps(cfg))


def test_a_string_false_never_turns_sliding_attention_on(tmp_path, drafter, qwen3_target):
    """The case that started it: use_sliding_window "false" (a string) used to enable SWA by truthiness."""
    d = _copy(drafter, tmp_path / "d")
    edit_config(d, use_sliding_window="false", sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    r = cli("convert", d, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf")
    assert r.returncode == 1, r.stderr
    line = one_error_line(r)
    assert str(d / "config.json") in line
    assert 'use_sliding_window is a string ("false"), expected a bool' in line, line
    assert not (tmp_path / "o.gguf").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("sub,change,phrase", [
    (None, {"num_hidden_layers": True}, "num_hidden_layers is a bool (true), expected an integer"),
    (None, {"hidden_size": 64.0}, "hidden_size is a number (64.0), expected an integer"),
    (None, {"rms_norm_eps": "1e-6"}, 'rms_norm_eps is a string ("1e-6"), expected a number'),
    (None, {"rope_is_neox_style": 0}, "rope_is_neox_style is an integer (0), expected a bool"),
    (None, {"layer_types": "full_attention"}, 'layer_types is a string ("full_attention"), expected a list of strings'),
    (None, {"layer_types": ["full_attention", 1]}, "layer_types is a list of mixed types"),
    (None, {"rope_parameters": [1000000.0]}, "rope_parameters is a list of floats ([1000000.0]), expected an object"),
    (None, {"rope_parameters": {"rope_theta": "1e6"}}, 'rope_parameters.rope_theta is a string ("1e6"), expected a number'),
    (None, {"text_config": "qwen3"}, 'text_config is a string ("qwen3"), expected an object'),
    (None, {"hidden_act": ["silu"]}, "hidden_act is a list of strings"),
    ("dflash_config", {"block_size": "16"}, 'dflash_config.block_size is a string ("16"), expected an integer'),
    ("dflash_config", {"mask_token_id": True}, "dflash_config.mask_token_id is a bool (true), expected an integer"),
    ("dflash_config", {"target_layer_ids": [0, "2"]}, "dflash_config.target_layer_ids is a list of mixed types"),
    ("dflash_config", {"target_layer_ids": [0, True]}, "expected a list of integers"),
    ("dflash_config", {"use_swa": "yes"}, 'dflash_config.use_swa is a string ("yes"), expected a bool'),
    ("dflash_config", {"causal": 1}, "dflash_config.causal is an integer (1), expected a bool"),
    ("dflash_config", {"attention_value_scale": "2"}, 'dflash_config.attention_value_scale is a string ("2"), expected a number'),
])
def test_config_values_of_the_wrong_json_type_are_refused(tmp_path, drafter, qwen3_target, sub, change, phrase):
    d = _copy(drafter, tmp_path / "d")
    _edit_json(d / "config.json", change, sub)
    with pytest.raises(DFlashError) as e:
        convert(d, qwen3_target, outfile=tmp_path / "o.gguf", outtype="f16")
    assert str(e.value).startswith(f"{d / 'config.json'}: "), str(e.value)
    assert phrase in str(e.value), str(e.value)
    assert not (tmp_path / "o.gguf").exists() and leftovers(tmp_path) == []


def test_an_integral_float_is_a_number_and_null_is_absent(tmp_path, drafter, qwen3_target):
    """An integer where a float is expected converts to the same value; null reads as absent."""
    base = tmp_path / "base.gguf"
    convert(drafter, qwen3_target, outfile=base, outtype="f16")
    d = _copy(drafter, tmp_path / "d")
    cfg = json.loads((d / "config.json").read_text())
    theta = cfg["rope_theta"]
    edit_config(d, rope_theta=int(theta), rope_scaling=None, sliding_window=None, partial_rotary_factor=None)
    out = tmp_path / "o.gguf"
    convert(d, qwen3_target, outfile=out, outtype="f16")
    from dflash_convert.sources.gguf_drafter import read_drafter

    a, b = read_drafter(base), read_drafter(out)
    assert b.rope_theta == a.rope_theta == float(theta) and b.sliding_window is None and b.n_rot is None
    assert validate(out).exit_code == 0


def test_target_config_values_are_typed(tmp_path, drafter, qwen3_target):
    for change, phrase in (({"tie_word_embeddings": "true"}, 'tie_word_embeddings is a string ("true"), expected a bool'),
                           ({"hidden_size": "64"}, 'hidden_size is a string ("64"), expected an integer'),
                           ({"architectures": "Qwen3ForCausalLM"}, "architectures is a string"),
                           ({"eos_token_id": "151645"}, "eos_token_id is a string")):
        t = _copy(qwen3_target, tmp_path / f"t{len(list(tmp_path.iterdir()))}")
        _edit_json(t / "config.json", change)
        with pytest.raises(DFlashError) as e:
            convert(drafter, t, outfile=tmp_path / "o.gguf", outtype="f16")
        assert str(e.value).startswith(f"{t / 'config.json'}: ") and phrase in str(e.value), str(e.value)
        assert not (tmp_path / "o.gguf").exists()


def test_tokenizer_config_fields_are_typed(tmp_path, drafter, qwen3_target):
    for change, phrase in (({"add_bos_token": "false"}, 'add_bos_token is a string ("false"), expected a bool'),
                           ({"eos_token": 151645}, "eos_token is an integer (151645), expected a string or an object"),
                           ({"eos_token": {"content": 7}}, "eos_token.content is an integer (7), expected a string"),
                           ({"chat_template": 3}, "chat_template is an integer (3), expected a string or a list of objects"),
                           ({"clean_up_tokenization_spaces": "no"}, "clean_up_tokenization_spaces is a string")):
        t = _copy(qwen3_target, tmp_path / f"t{len(list(tmp_path.iterdir()))}")
        _edit_json(t / "tokenizer_config.json", change)
        r = cli("convert", drafter, "--target-model-dir", t, "-o", tmp_path / "o.gguf") if "add_bos" in phrase else None
        if r is not None:  # once through the command: one line, exit 1
            assert r.returncode == 1 and phrase in one_error_line(r), r.stderr
        with pytest.raises(DFlashError) as e:
            convert(drafter, t, outfile=tmp_path / "o.gguf", outtype="f16")
        assert str(e.value).startswith(f"{t / 'tokenizer_config.json'}: ") and phrase in str(e.value), str(e.value)
        assert not (tmp_path / "o.gguf").exists()


def test_speculators_config_values_are_typed(tmp_path, qwen3_target):
    from fixtures.drafters import make_speculators_drafter

    src = make_speculators_drafter(tmp_path / "spec")
    for sub, change, phrase in ((None, {"aux_hidden_state_layer_ids": [1, 3.0]}, "aux_hidden_state_layer_ids is a list of mixed"),
                                (None, {"sample_from_anchor": "false"}, 'sample_from_anchor is a string ("false"), expected a bool'),
                                (None, {"block_size": 8.5}, "block_size is a number (8.5), expected an integer"),
                                ("transformer_layer_config", {"num_key_value_heads": "2"}, "num_key_value_heads is a string"),
                                (None, {"transformer_layer_config": []}, "transformer_layer_config is a list")):
        d = _copy(src, tmp_path / f"s{len(list(tmp_path.iterdir()))}")
        _edit_json(d / "config.json", change, sub)
        with pytest.raises(DFlashError) as e:
            convert(d, qwen3_target, outfile=tmp_path / "o.gguf", outtype="f16")
        assert str(e.value).startswith(f"{d / 'config.json'}: ") and phrase in str(e.value), str(e.value)
        assert not (tmp_path / "o.gguf").exists()


def _bad_parts(case: str):
    """An upstream drafter (head size 16, full rotary) with one value llama.cpp cannot run."""
    from drafter_gguf import KV, drafter_parts, kv, set_key

    from dflash_convert.format.keys import ValueType

    parts = drafter_parts()
    return {
        "sections_sum": set_key(parts, kv("rope_dimension_sections", [8, 8, 4, 0])),
        "sections_fourth_only": set_key(parts, kv("rope_dimension_sections", [0, 0, 0, 8])),
        "sections_negative": set_key(parts, kv("rope_dimension_sections", [-8, 16, 0, 0])),
        "sections_past_int32": set_key(parts, KV("dflash.rope.dimension_sections", ValueType.ARRAY, [2**31, 0, 0, 0],
                                                 ValueType.UINT32)),
        "n_rot_zero": set_key(parts, kv("rope_dimension_count", 0)),
        "n_rot_odd": set_key(parts, kv("rope_dimension_count", 7)),
        "n_rot_past_head": set_key(parts, kv("rope_dimension_count", 32)),
        "block_size_negative": set_key(parts, kv("block_size", 2**32 - 1)),  # -1 once llama.cpp reads it as int32_t
        "target_layers_past_int32": set_key(parts, KV("dflash.target_layers", ValueType.ARRAY, [1, 2**31], ValueType.UINT32)),
        "sliding_window_past_int32": set_key(drafter_parts(swa=[True, False]), kv("sliding_window", 2**31)),
        "context_past_int32": set_key(parts, kv("context_length", 2**31)),
        "embedding_past_int32": set_key(parts, kv("embedding_length", 2**31 + 32)),
    }[case]


UNRUNNABLE = {  # case -> (check id, phrase of the llama.cpp check it mirrors)
    "sections_sum": ("hparams", "GGML_ASSERT(sect_dims <= ne0)"),
    "sections_fourth_only": ("hparams", "GGML_ASSERT(sections[0] > 0 || sections[1] > 0 || sections[2] > 0)"),
    "sections_negative": ("hparams", "negative entry"),
    "sections_past_int32": ("keys.ranges", "std::array<int, 4> rope_sections"),
    "n_rot_zero": ("hparams", "powf(freq_base, -2.0f/n_dims) with n_dims 0"),
    "n_rot_odd": ("hparams", "GGML_ASSERT(n_dims % 2 == 0)"),
    "n_rot_past_head": ("hparams", "GGML_ASSERT(n_dims <= ne0)"),
    "block_size_negative": ("keys.ranges", "int32_t block_size = std::atoi(buf)"),
    "target_layers_past_int32": ("keys.ranges", "std::vector<int32_t> target_layer_ids"),
    "sliding_window_past_int32": ("keys.ranges", "(int32_t) n_swa"),
    "context_past_int32": ("keys.ranges", "int32_t llama_model_n_ctx_train()"),
    "embedding_past_int32": ("keys.ranges", "int32_t llama_model_n_embd()"),
}


@pytest.mark.parametrize("case", sorted(UNRUNNABLE))
def test_validate_fails_what_llama_cpp_cannot_run(tmp_path, case):
    from drafter_gguf import write_parts

    check_id, phrase = UNRUNNABLE[case]
    path = write_parts(tmp_path / f"{case}.gguf", _bad_parts(case))
    r = validate(path)
    c = r.check(check_id)
    assert r.exit_code == 1 and c.status == "fail", (case, [(x.id, x.status, x.details) for x in r.checks])
    assert any(phrase in d for d in c.details), c.details


def test_validate_passes_sections_and_ranges_llama_cpp_runs(tmp_path):
    from drafter_gguf import KV, drafter_parts, kv, set_key, write_parts

    from dflash_convert.format.keys import I32_MAX, ValueType

    for name, parts in (("degenerate", set_key(drafter_parts(), kv("rope_dimension_sections", [8, 0, 0, 0]))),
                        ("full", set_key(drafter_parts(), kv("rope_dimension_sections", [4, 2, 2, 0]))),
                        ("u32_ids", set_key(drafter_parts(), KV("dflash.target_layers", ValueType.ARRAY, [1, 3], ValueType.UINT32))),
                        ("big_block", set_key(drafter_parts(), kv("block_size", I32_MAX)))):
        r = validate(write_parts(tmp_path / f"{name}.gguf", parts))
        assert r.exit_code == 0, (name, [(c.id, c.details) for c in r.checks if c.status == "fail"])
        assert r.check("keys.ranges").status == "pass"


@pytest.mark.parametrize("change,phrase", [
    ({"partial_rotary_factor": 0.01}, "gives 0 rotary dimensions"),
    ({"partial_rotary_factor": 0.2}, "gives 3 rotary dimensions"),
    ({"rope_parameters": {"rope_theta": 1e6, "mrope_section": [8, 8, 8]}}, "GGML_ASSERT(sect_dims <= ne0)"),
    ({"rope_parameters": {"rope_theta": 1e6, "mrope_section": [8, -4]}}, "non-negative"),
])
def test_convert_refuses_rope_llama_cpp_cannot_run(tmp_path, drafter, qwen3_target, change, phrase):
    d = _copy(drafter, tmp_path / "d")
    edit_config(d, **change)
    r = cli("convert", d, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf")
    assert r.returncode == 1, r.stderr
    line = one_error_line(r)
    assert str(d / "config.json") in line and phrase in line, line
    assert not (tmp_path / "o.gguf").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("dflash_change,phrase", [
    ({"block_size": 2**31}, "std::atoi"),
    ({"block_size": -1}, "block_size must be an integer >= 2"),
])
def test_convert_refuses_a_block_size_llama_cpp_reads_as_another(tmp_path, drafter, qwen3_target, dflash_change, phrase):
    d = _copy(drafter, tmp_path / "d")
    _edit_json(d / "config.json", dflash_change, "dflash_config")
    r = cli("convert", d, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf")
    assert r.returncode == 1 and phrase in one_error_line(r), r.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_quantize_refuses_an_input_that_fails_validate(tmp_path):
    from drafter_gguf import drafter_parts, write_parts

    good = write_parts(tmp_path / "good.gguf", drafter_parts())
    assert cli("quantize", good, tmp_path / "good-q8.gguf", "Q8_0", "-q").returncode == 0
    assert validate(tmp_path / "good-q8.gguf").exit_code == 0
    for case in ("block_size_negative", "sections_sum", "n_rot_zero"):
        src = write_parts(tmp_path / f"{case}.gguf", _bad_parts(case))
        out = tmp_path / f"{case}-q8.gguf"
        r = cli("quantize", src, out, "Q8_0")
        assert r.returncode == 1, r.stderr
        line = one_error_line(r)
        assert str(src) in line and "refusing an input that fails validate" in line and "--skip-validation" in line, line
        assert UNRUNNABLE[case][1] in line, line
        assert not out.exists() and leftovers(tmp_path) == []
    # the explicit way through: it says so in a warning line, and writes what it was asked to
    src, out = tmp_path / "block_size_negative.gguf", tmp_path / "forced-q8.gguf"
    r = cli("quantize", src, out, "Q8_0", "--skip-validation")
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("dflash-convert: warning: ")]
    assert len(warnings) == 1 and "--skip-validation" in warnings[0] and "not validated" in warnings[0], r.stderr
    assert out.exists() and validate(out).check("keys.ranges").status == "fail"


def test_migrate_refuses_a_file_llama_cpp_cannot_run(tmp_path):
    from drafter_gguf import write_parts
    from test_migrate import buun

    for case in ("block_size_negative", "sections_sum"):  # (buun files carry their own rope.dimension_count)
        src = write_parts(tmp_path / f"buun-{case}.gguf", buun(_bad_parts(case)))
        out = tmp_path / f"{case}.gguf"
        r = cli("migrate", src, out)
        assert r.returncode == 1, r.stderr
        line = one_error_line(r)
        assert "fails validate" in line and UNRUNNABLE[case][1] in line, line
        assert not out.exists() and leftovers(tmp_path) == []


def test_check_fails_a_file_that_fails_validate(tmp_path, drafter, qwen3_target):
    """check runs the file in-process, where a value llama.cpp reads as another changes nothing: validate's verdict counts."""
    import torch
    from drafter_gguf import kv, read_parts, set_key, write_parts
    from safetensors.torch import save_file

    from dflash_convert.check import check

    t = _copy(qwen3_target, tmp_path / "t")  # the embedding and the (tied) head the drafter shares
    cfg = json.loads((t / "config.json").read_text())
    emb = torch.randn(cfg["vocab_size"], cfg["hidden_size"], generator=torch.Generator().manual_seed(7)) * 0.05
    save_file({"model.embed_tokens.weight": emb.to(torch.bfloat16)}, str(t / "model.safetensors"))
    good = tmp_path / "good.gguf"
    convert(drafter, t, outfile=good, outtype="f32")
    assert check(good, drafter, target_model_dir=t, device="cpu", context=7).passed
    bad = write_parts(tmp_path / "bad.gguf", set_key(read_parts(good), kv("context_length", 2**31)))  # -2**31 to llama.cpp
    rep = check(bad, drafter, target_model_dir=t, device="cpu", context=7)
    assert not rep.passed and rep.exit_code == 1
    assert any("fails validate" in f and "llama_model_n_ctx_train" in f for f in rep.failures), rep.failures
