"""`dflash-convert validate`: semantic checks on real files, the target pairing, the CLI and its JSON.

Each broken variant is a real GGUF written by our writer from a good drafter with one thing
changed; the test names the check that must catch it, the status, and a phrase of the message.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from drafter_gguf import (
    KV,
    Tensor,
    drafter_parts,
    drop_keys,
    drop_tensors,
    get_key,
    get_tensor,
    kv,
    read_parts,
    rename_keys,
    set_key,
    set_tensor,
    tensor,
    write_parts,
)

from dflash_convert import convert
from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.keys import ValueType, key
from dflash_convert.validate import validate
from dflash_convert.validate.report import SCHEMA_FILE, SCHEMA_ID
from fixtures.drafters import make_zlab_drafter

F32, I32, U32, ARR = ValueType.FLOAT32, ValueType.INT32, ValueType.UINT32, ValueType.ARRAY


def _status(report, check_id: str) -> tuple[str, str]:
    c = report.check(check_id)
    assert c is not None, [x.id for x in report.checks]
    return c.status, " | ".join([c.message, *c.details])


def test_good_synthetic_drafter_passes(tmp_path):
    path = write_parts(tmp_path / "ok.gguf", drafter_parts())
    r = validate(path, deep=True)
    assert r.exit_code == 0, [(c.id, c.status, c.message, c.details) for c in r.checks if c.status != "pass"]
    assert r.dialect == "upstream" and r.counts()["fail"] == 0 and r.check("numerics").status == "pass"


def _d2t_parts(vd: int = 3, values: list[int] | None = None, with_output: bool = True, gtype: GGMLType = GGMLType.I64):
    p = drafter_parts()
    ids = np.array(values if values is not None else [0, 2, 4][:vd], dtype="<i8")
    data = ids.tobytes() if gtype == GGMLType.I64 else ids.astype("<f4").tobytes()
    p = set_tensor(p, Tensor("d2t", (vd,), gtype, data))
    if with_output:
        p = set_tensor(p, tensor("output.weight", (32, vd), GGMLType.F16))
    return p


def _fc_taps(n: int):
    p = set_key(drafter_parts(), kv("target_layers", list(range(1, n + 1))))
    return p


# name -> (parts, check id, status, phrase in message or details)
VARIANTS: dict[str, tuple[Any, str, str, str]] = {
    "target_layers_missing": (drop_keys(drafter_parts(), "dflash.target_layers"), "target_layers", "fail",
                              "DFlash model requires 'target_layers'"),
    "target_layers_missing_required": (drop_keys(drafter_parts(), "dflash.target_layers"), "keys.required", "fail",
                                       "dflash.target_layers is missing"),
    "target_layers_all_equal": (set_key(drafter_parts(), kv("target_layers", [2, 2])), "target_layers", "fail",
                                "same target layer 2 times"),
    "target_layers_float": (set_key(drafter_parts(), KV("dflash.target_layers", ARR, [1.0, 3.0], F32)), "target_layers",
                            "fail", "INT32 or UINT32 array"),
    "target_layers_negative": (set_key(drafter_parts(), kv("target_layers", [-1, 3])), "target_layers", "fail", "negative"),
    "target_layers_zero": (set_key(drafter_parts(), kv("target_layers", [0, 3])), "target_layers", "warn",
                           "taps the token embeddings"),
    "target_layers_unordered": (set_key(drafter_parts(), kv("target_layers", [3, 1])), "target_layers", "warn",
                                "not increasing"),
    "target_layers_vs_fc": (set_key(drafter_parts(), kv("target_layers", [1, 2, 3])), "target_layers", "fail",
                            "fc.weight takes 2 taps"),
    "swa_without_pattern": (drop_keys(drafter_parts(swa=[True, False]), "dflash.attention.sliding_window_pattern"), "swa",
                            "fail", "array key not found"),
    "swa_pattern_short": (set_key(drafter_parts(swa=[True, False]), kv("sliding_window_pattern", [True])), "swa", "fail",
                          "1 entries for 2 layers"),
    "swa_pattern_unused": (drafter_parts(swa=[False, False]), "swa", "warn", "no layer uses it"),
    "pattern_without_window": (drop_keys(drafter_parts(swa=[True, False]), "dflash.attention.sliding_window"), "swa", "warn",
                               "llama.cpp ignores it"),
    "mask_missing": (drop_keys(drafter_parts(), "tokenizer.ggml.mask_token_id"), "mask_token", "fail", "drafting fails"),
    "mask_out_of_range": (set_key(drafter_parts(), kv("mask_token_id", 5)), "mask_token", "fail", "not below the vocabulary size 5"),
    "key_wrong_type": (set_key(drafter_parts(), KV("dflash.block_count", I32, 2)), "keys.types", "fail",
                       "dflash.block_count is INT32, llama.cpp expects UINT32"),
    "eps_as_double": (set_key(drafter_parts(), KV("dflash.attention.layer_norm_rms_epsilon", ValueType.FLOAT64, 1e-6)),
                      "keys.types", "fail", "FLOAT64, llama.cpp expects FLOAT32"),
    "unknown_dflash_key": (rename_keys(drafter_parts(), {"dflash.block_size": "dflash.dflash.block_size"}), "keys.types",
                           "warn", "dflash.dflash.block_size is not a key llama.cpp reads"),
    "block_count_missing": (drop_keys(drafter_parts(), "dflash.block_count"), "keys.required", "fail",
                            "dflash.block_count is missing (required"),
    "eps_missing": (drop_keys(drafter_parts(), "dflash.attention.layer_norm_rms_epsilon"), "keys.required", "fail",
                    "required=true"),
    "kv_heads_not_divisor": (set_key(drafter_parts(H=3, KV_=2), kv("head_count_kv", 2)), "hparams", "fail",
                             "not a multiple of head_count_kv"),
    "key_value_length_differ": (set_key(drafter_parts(), kv("value_length", 8)), "hparams", "fail", "value_length 8"),
    "bad_activation": (set_key(drafter_parts(), kv("hidden_activation", "relu")), "hparams", "fail",
                       "unsupported DFlash hidden activation"),
    "sections_length": (set_key(drafter_parts(), kv("rope_dimension_sections", [8, 0])), "hparams", "fail",
                        "llama.cpp wants 4"),
    "per_layer_ffn_array_wrong_length": (set_key(drafter_parts(), KV("dflash.feed_forward_length", ARR, [64], I32)), "hparams",
                                         "fail", "1 entries for 2 layers"),
    "block_size_missing": (drop_keys(drafter_parts(), "dflash.block_size"), "block_size", "warn", "assumes 16"),
    "block_size_one": (set_key(drafter_parts(), kv("block_size", 1)), "block_size", "fail", "nothing is drafted"),
    "merges_missing": (drop_keys(drafter_parts(), "tokenizer.ggml.merges"), "tokenizer", "fail", "without tokenizer.ggml.merges"),
    "token_type_length": (set_key(drafter_parts(), kv("tok_token_type", [1, 1])), "tokenizer", "fail", "2 entries for 5 tokens"),
    "tokens_missing": (drop_keys(drafter_parts(), "tokenizer.ggml.tokens"), "tokenizer", "fail", "tokenizer.ggml.tokens is missing"),
    "eos_out_of_range": (set_key(drafter_parts(), KV("tokenizer.ggml.eos_token_id", U32, 99)), "tokenizer", "warn",
                         "eos_token_id 99 is not below"),
    "t2d_stray": (set_tensor(drafter_parts(), Tensor("t2d", (4,), GGMLType.I64, bytes(32))), "tensors.inventory", "fail",
                  "t2d is never written"),
    "stray_layer": (set_tensor(drafter_parts(), tensor("blk.2.attn_norm.weight", (32,))), "tensors.inventory", "fail",
                    "layer 2 but block_count is 2"),
    "wrong_number_of_tensors": (set_tensor(drafter_parts(), tensor("rotary_emb.inv_freq", (8,))), "tensors.inventory", "fail",
                                "wrong number of tensors; expected 26, got 25"),
    "tensor_missing": (drop_tensors(drafter_parts(), "blk.1.ffn_up.weight"), "tensors.inventory", "fail",
                       "blk.1.ffn_up.weight is missing (required)"),
    "attn_v_missing": (drop_tensors(drafter_parts(), "blk.0.attn_v.weight"), "tensors.inventory", "warn", "shared-KV variant"),
    # a DSpark head is checked by the family check (the full catalogue is tests/test_family.py)
    "dspark_head": (set_tensor(drafter_parts(), tensor("markov_w1.weight", (8, 5))), "family", "fail",
                    "markov_w2.weight is missing"),
    "wrong_shape": (set_tensor(drafter_parts(), tensor("blk.0.attn_k.weight", (16, 32), GGMLType.F16)), "tensors.shapes", "fail",
                    "blk.0.attn_k.weight has shape {16, 32}, llama.cpp expects {32, 16}"),
    "wrong_shape_fc": (set_tensor(drafter_parts(), tensor("fc.weight", (96, 32), GGMLType.F16)), "tensors.shapes", "fail",
                       "fc.weight has shape {96, 32}, llama.cpp expects {64, 32}"),
    "norm_in_f16": (set_tensor(drafter_parts(), tensor("blk.0.ffn_norm.weight", (32,), GGMLType.F16)), "tensors.types", "fail",
                    "blk.0.ffn_norm.weight is F16, must be F32"),
    "tied_head": (set_tensor(drafter_parts(), tensor("token_embd.weight", (32, 5), GGMLType.F16)), "tied_head", "fail",
                  "uses the embedding as the output head"),
    "d2t_out_of_range": (_d2t_parts(values=[0, 2, 9]), "d2t", "fail", "outside [0, 5)"),
    "d2t_duplicate": (_d2t_parts(values=[0, 2, 2]), "d2t", "fail", "same target id"),
    "d2t_without_head": (_d2t_parts(with_output=False), "d2t", "fail", "needs the drafter's own head"),
    "d2t_not_i64": (_d2t_parts(gtype=GGMLType.F32), "d2t", "fail", "d2t is F32; the graph asserts I64"),
    "d2t_full_vocab": (_d2t_parts(vd=5, values=[0, 1, 2, 3, 4]), "d2t", "warn", "a full vocabulary needs no d2t"),
    "d2t_wrong_head_shape": (set_tensor(_d2t_parts(), tensor("output.weight", (32, 5), GGMLType.F16)), "tensors.shapes", "fail",
                             "output.weight has shape {32, 5}, llama.cpp expects {32, 3}"),
    "architecture_eagle3": (set_key(drafter_parts(), kv("architecture", "eagle3")), "dialect", "fail",
                            "an eagle3 drafter, not DFlash"),
    "target_model": (set_key(drafter_parts(), kv("architecture", "qwen3")), "dialect", "fail", "not a DFlash drafter"),
}


def test_variant_catalogue_covers_every_semantic_check():
    assert {check for _, check, _, _ in VARIANTS.values()} >= {
        "target_layers", "swa", "mask_token", "keys.types", "keys.required", "hparams", "block_size", "tokenizer",
        "tensors.inventory", "tensors.shapes", "tensors.types", "tied_head", "d2t", "dialect"}


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_semantic_variant(tmp_path, case):
    parts, check_id, status, phrase = VARIANTS[case]
    path = write_parts(tmp_path / f"{case}.gguf", parts)
    r = validate(path)
    got, text = _status(r, check_id)
    assert got == status, text
    assert phrase in text
    assert r.exit_code == (1 if r.failures() else 0)


@pytest.mark.parametrize("case", [c for c in VARIANTS if VARIANTS[c][2] == "fail"][:3] + [None])
def test_an_already_parsed_file_gives_the_same_report(tmp_path, case):
    """quantize hands validate the file it has already read (``parsed``): every check's verdict and
    words must be those of validate reading the file itself, passing and failing files alike."""
    from dflash_convert.sources.gguf import read_gguf

    parts = drafter_parts() if case is None else VARIANTS[case][0]
    path = write_parts(tmp_path / f"{case}.gguf", parts)
    own = validate(path)
    handed = validate(path, parsed=read_gguf(path))
    assert [(c.id, c.status, c.message, c.details) for c in handed.checks] == \
        [(c.id, c.status, c.message, c.details) for c in own.checks]
    assert (own.exit_code == 0) == (case is None)


def test_d2t_good(tmp_path):
    r = validate(write_parts(tmp_path / "d2t.gguf", _d2t_parts()))
    assert r.exit_code == 0 and _status(r, "d2t")[0] == "pass"


def test_foreign_architecture_skips_upstream_checks(tmp_path):
    r = validate(write_parts(tmp_path / "e.gguf", set_key(drafter_parts(), kv("architecture", "eagle3"))))
    assert r.exit_code == 1 and r.dialect is None
    assert {c.status for c in r.checks if c.id not in ("container", "dialect")} == {"skip"}


def test_deep_scan_finds_nan_and_inf(tmp_path):
    parts = drafter_parts()
    q = get_tensor(parts, "blk.0.attn_q.weight")
    words = bytearray(q.data)
    words[0:2] = np.float16(np.nan).tobytes()
    words[10:12] = np.float16(np.inf).tobytes()
    parts = set_tensor(parts, Tensor(q.name, q.ne, q.gtype, bytes(words)))
    parts = set_tensor(parts, tensor("blk.1.ffn_norm.weight", (32,), fill=math.inf))
    path = write_parts(tmp_path / "nan.gguf", parts)
    assert validate(path).exit_code == 0  # without --deep nothing reads the data
    r = validate(path, deep=True)
    status, text = _status(r, "numerics")
    assert status == "fail" and "blk.0.attn_q.weight: 2 of 1024 values are NaN or Inf" in text
    assert "blk.1.ffn_norm.weight: 32 of 32" in text


def test_deep_scan_dequantizes_q8_0(tmp_path):
    parts = drafter_parts(matrix=GGMLType.Q8_0)
    fc = get_tensor(parts, "fc.weight")
    data = bytearray(fc.data)
    data[34:36] = np.float16(np.inf).tobytes()  # the scale of the second block
    path = write_parts(tmp_path / "q.gguf", set_tensor(parts, Tensor(fc.name, fc.ne, fc.gtype, bytes(data))))
    status, text = _status(validate(path, deep=True), "numerics")
    assert status == "fail" and "fc.weight:" in text


@pytest.mark.parametrize("qtype, values", [(GGMLType.Q1_0, 128), (GGMLType.Q2_0, 64), (GGMLType.IQ3_S, 256)])
def test_deep_scan_reads_the_new_low_bit_types(tmp_path, qtype, values):
    """Q1_0/Q2_0 (no gguf-py decoder: scanned by their block scales) and IQ3_S: one inf scale, one block of non-finite values."""
    from dflash_convert.encoders import QUANTIZERS

    parts = drafter_parts(E=128)  # fc.weight's rows: 2 x 128, whole blocks of every type
    fc = get_tensor(parts, "fc.weight")
    data = bytearray(QUANTIZERS[qtype](np.random.default_rng(0).standard_normal(int(np.prod(fc.ne))).astype(np.float32)))
    path = write_parts(tmp_path / "ok.gguf", set_tensor(parts, Tensor(fc.name, fc.ne, qtype, bytes(data))))
    assert _status(validate(path, deep=True), "numerics")[0] == "pass"
    size = len(data) * values // int(np.prod(fc.ne))
    data[size:size + 2] = np.float16(np.inf).tobytes()  # the scale of the second block (at byte 0 of each)
    path = write_parts(tmp_path / "q.gguf", set_tensor(parts, Tensor(fc.name, fc.ne, qtype, bytes(data))))
    status, text = _status(validate(path, deep=True), "numerics")
    assert status == "fail" and f"fc.weight: {values} of {int(np.prod(fc.ne))} values are NaN or Inf" in text


# --- real converted files and their targets ------------------------------------------------------

@pytest.fixture(scope="module")
def dense(tmp_path_factory, qwen3_target) -> Path:
    d = tmp_path_factory.mktemp("validate")
    src = make_zlab_drafter(d / "draft", target_layer_ids=[0, 2])
    out = d / "dflash-draft-Q8_0.gguf"  # a name llama.cpp's -hf finds: the file_name check passes too
    convert(src, qwen3_target, outfile=out, outtype="q8_0")
    return out


def test_converted_file_pairs_with_its_target_dir(dense, qwen3_target):
    r = validate(dense, qwen3_target, deep=True)
    assert r.exit_code == 0, [(c.id, c.message, c.details) for c in r.failures()]
    assert [c.id for c in r.checks if c.id.startswith("target.")] == [
        "target.read", "target.hidden_size", "target.layers", "target.tokenizer", "target.vocab"]
    assert all(c.status == "pass" for c in r.checks)


def test_wrong_target_dir_is_caught(dense, qwen35_target):
    r = validate(dense, qwen35_target)
    assert r.exit_code == 1
    assert _status(r, "target.tokenizer")[0] == "fail" and "tokenizer.ggml.pre" in _status(r, "target.tokenizer")[1]
    assert "drafter vocabulary 151936 != target vocabulary 248320" in _status(r, "target.vocab")[1]


def _target_gguf(tmp_path: Path, drafter: Path, *, arch: str = "qwen3", hidden: int = 64, blocks: int = 4,
                 edit=None, name: str = "target.gguf") -> Path:
    kvs, _ = read_parts(drafter)
    tok = [k for k in kvs if k.key.startswith("tokenizer.") and k.key != "tokenizer.ggml.mask_token_id"]
    head = [kv("architecture", arch), KV(f"{arch}.embedding_length", U32, hidden), KV(f"{arch}.block_count", U32, blocks)]
    parts = (head + tok, [tensor("token_embd.weight", (hidden, 8))])
    if edit is not None:
        parts = edit(parts)
    return write_parts(tmp_path / name, parts)


def test_target_gguf_pairs(tmp_path, dense):
    r = validate(dense, _target_gguf(tmp_path, dense))
    assert r.exit_code == 0 and _status(r, "target.read")[1].startswith("GGUF qwen3, 4 layers, hidden 64, 151936 tokens")


@pytest.mark.parametrize("case", ["hidden", "too_few_layers", "no_layer_inputs", "token_differs", "special_id", "is_drafter"])
def test_target_gguf_mismatches(tmp_path, dense, case):
    def swap_token(parts):
        toks = get_key(parts, "tokenizer.ggml.tokens")
        values = list(toks.value)
        values[100] = b"<other>"
        return set_key(parts, KV(toks.key, toks.vtype, values, toks.sub))

    target = {
        "hidden": lambda: _target_gguf(tmp_path, dense, hidden=128),
        "too_few_layers": lambda: _target_gguf(tmp_path, dense, blocks=2),
        "no_layer_inputs": lambda: _target_gguf(tmp_path, dense, arch="qwen2"),
        "token_differs": lambda: _target_gguf(tmp_path, dense, edit=swap_token),
        "special_id": lambda: _target_gguf(tmp_path, dense, edit=lambda p: set_key(p, KV("tokenizer.ggml.eos_token_id", U32, 7))),
        "is_drafter": lambda: dense,
    }[case]()
    expect = {
        "hidden": ("target.hidden_size", "drafter hidden size 64 != target hidden size 128"),
        "too_few_layers": ("target.layers", "layer 3 does not exist: the target has 2 layers"),
        "no_layer_inputs": ("target.layers", "qwen2 graph publishes no layer inputs"),
        "token_differs": ("target.tokenizer", "1 tokens differ, first at id 100"),
        "special_id": ("target.tokenizer", "tokenizer.ggml.eos_token_id: drafter 151645 vs target 7"),
        "is_drafter": ("target.read", "is a drafter"),
    }[case]
    r = validate(dense, target)
    status, text = _status(r, expect[0])
    assert status == "fail" and expect[1] in text
    assert r.exit_code == 1


def test_tap_of_the_last_layer(tmp_path, dense):
    r = validate(dense, _target_gguf(tmp_path, dense, blocks=3))
    status, text = _status(r, "target.layers")
    assert status == "fail" and "last-layer output" in text
    r = validate(dense, _target_gguf(tmp_path, dense, arch="nemotron_h", blocks=3, name="nemo.gguf"))
    assert _status(r, "target.layers")[0] == "pass"


def test_unreadable_target_is_exit_2(tmp_path, dense):
    bad = tmp_path / "t.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<I", 9))
    r = validate(dense, bad)
    assert r.exit_code == 2 and "GGUF version 9 is newer" in r.error_line()
    r = validate(dense, tmp_path / "missing")
    assert r.exit_code == 2 and "target not found" in r.error_line()


# --- the command line and the JSON schema --------------------------------------------------------

def _check_schema(value: Any, schema: dict, where: str = "$") -> None:
    """The subset of JSON Schema that validate.schema.json uses."""
    if "const" in schema:
        assert value == schema["const"], where
    if "enum" in schema:
        assert value in schema["enum"], where
    types = schema.get("type")
    if types is not None:
        py = {"object": dict, "array": list, "string": str, "integer": int, "null": type(None)}
        allowed = tuple(py[t] for t in ([types] if isinstance(types, str) else types))
        assert isinstance(value, allowed) and not isinstance(value, bool), where
    if isinstance(value, dict):
        for k in schema.get("required", []):
            assert k in value, f"{where}.{k} missing"
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(props), f"{where}: unexpected {set(value) - set(props)}"
        for k, v in value.items():
            if k in props:
                _check_schema(v, props[k], f"{where}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            _check_schema(v, schema["items"], f"{where}[{i}]")
    if "minimum" in schema:
        assert value >= schema["minimum"], where


def test_cli_pass_fail_and_json(tmp_path, dense, qwen3_target):
    schema = json.loads(SCHEMA_FILE.read_text())
    assert schema["$id"] == SCHEMA_ID
    r = run_cli("validate", dense, "--target", qwen3_target)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "  pass  target.tokenizer" in r.stdout and r.stdout.rstrip().endswith("skipped)")
    assert "result: PASS" in r.stdout

    broken = write_parts(tmp_path / "b.gguf", set_key(drafter_parts(), kv("target_layers", [2, 2])))
    r = run_cli("validate", broken, "--json", "--deep")
    assert r.returncode == 1 and r.stderr == ""
    doc = json.loads(r.stdout)
    _check_schema(doc, schema)
    assert doc["result"] == "fail" and doc["exit_code"] == 1 and doc["dialect"] == "upstream"
    fails = [c for c in doc["checks"] if c["status"] == "fail"]
    assert [c["id"] for c in fails] == ["target_layers"] and doc["summary"]["fail"] == 1

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00")
    r = run_cli("validate", bad, "--json")
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    _check_schema(doc, schema)
    assert doc["result"] == "error" and doc["checks"][0]["id"] == "container" and "truncated" in doc["checks"][0]["message"]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("dflash-convert: error: ")


def test_cli_human_output_lists_findings(tmp_path):
    path = write_parts(tmp_path / "dflash-x-F16.gguf", drop_keys(drafter_parts(), "tokenizer.ggml.mask_token_id", "dflash.block_size"))
    r = run_cli("validate", path)
    assert r.returncode == 1
    assert "  fail  mask_token" in r.stdout and "  warn  block_size" in r.stdout
    assert "- tokenizer.ggml.mask_token_id is missing" in r.stdout
    assert "result: FAIL (2 fail, 1 warn," in r.stdout


def test_key_names_come_from_the_tables():
    assert key("target_layers") == "dflash.target_layers"
    assert key("mask_token_id") == "tokenizer.ggml.mask_token_id"
