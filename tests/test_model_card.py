"""Model-card keys: what convert writes from README.md, generation_config.json and --metadata, in
upstream's order; one error line for a bad card or --metadata file; quantize keeps them.

Equality with upstream's converter, shape by shape, is the parity tier (test_parity.py,
test_model_card_equal_to_upstream); these tests need no upstream run.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import run_cli
from gguf_compare import differences, parity_differences

from dflash_convert import convert, plan_conversion
from dflash_convert.errors import DFlashError
from dflash_convert.quantize import quantize
from dflash_convert.sources.gguf import read_gguf
from fixtures.drafters import make_zlab_drafter
from fixtures.model_cards import write_model_card

DRAFTER_NAME = "Qwen3-4B-DFlash-b16"


def drafter_with_card(root: Path, shape: str = "single_base", **kw) -> Path:
    return write_model_card(make_zlab_drafter(root / DRAFTER_NAME, target_layer_ids=[0, 2]), shape, **kw)


def general_keys(plan_or_path) -> list[str]:
    keys = plan_or_path.metadata.keys() if hasattr(plan_or_path, "metadata") else list(read_gguf(plan_or_path).metadata)
    return [k for k in keys if k.startswith("general.")]


def test_card_keys_in_upstreams_order(tmp_path, qwen3_target):
    plan = plan_conversion(drafter_with_card(tmp_path), qwen3_target, outtype="bf16", hash_sources=False)
    # gguf-py's set_gguf_meta_model order: sampling, name and naming parts, size label, license, base
    # models, tags, languages; then our provenance; general.file_type and the version after the hparams
    assert general_keys(plan) == [
        "general.architecture", "general.type",
        "general.sampling.top_k", "general.sampling.top_p", "general.sampling.temp", "general.sampling.penalty_repeat",
        "general.name", "general.finetune", "general.basename", "general.size_label", "general.license",
        "general.base_model.count", "general.base_model.0.name", "general.base_model.0.organization",
        "general.base_model.0.repo_url", "general.tags", "general.languages",
        "general.converter.name", "general.converter.version", "general.source.config_sha256",
        "general.source.files", "general.source.files_sha256", "general.file_type", "general.quantization_version"]
    md = plan.metadata
    assert md.kv("general.sampling.top_k").vtype.name == "INT32" and md.get("general.sampling.top_k") == 20
    assert md.kv("general.sampling.penalty_repeat").vtype.name == "FLOAT32"  # from repetition_penalty, as 0c1e57098
    assert md.get("general.sampling.penalty_repeat") == pytest.approx(1.05)
    assert md.kv("general.base_model.count").vtype.name == "UINT32"
    assert md.get("general.finetune") == "4b-DFlash-b16" and md.get("general.size_label") == "82K"


def test_no_card_names_the_file_as_upstream(tmp_path, qwen3_target):
    """Without README.md or generation_config.json: upstream's name from the directory, title-cased."""
    src = make_zlab_drafter(tmp_path / "my-drafter", target_layer_ids=[0, 2])
    plan = plan_conversion(src, qwen3_target, outtype="bf16", hash_sources=False)
    assert plan.metadata.get("general.name") == "My Drafter"
    assert not any(k.startswith(("general.sampling.", "general.license", "general.tags")) for k in plan.metadata.keys())


def test_malformed_card_is_one_error_line(tmp_path, qwen3_target):
    src = drafter_with_card(tmp_path, "malformed")
    out = tmp_path / "out.gguf"
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", out)
    assert r.returncode == 2 and "Traceback" not in r.stderr  # an input that cannot be read
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0] == (f"dflash-convert: error: {src / 'README.md'}: the model card's front matter is not valid YAML: "
                        "did not find expected ',' or ']' (line 4)")
    assert not out.exists() and not list(tmp_path.rglob("*.gguf"))


@pytest.mark.parametrize("card,message", [
    (b"---\nlicense: \xff\n---\n", "the model card is not UTF-8 text (byte 13)"),
    (b"---\nlicense: 3\n---\n", "general.license must be a string, not 3"),
    (b"---\ntags:\n- 2024\n---\n", "general.tags must be a list of strings, not [2024]"),
    (b"---\nversion: 2024-01-01\n---\n", "general.version must be a string, not datetime.date(2024, 1, 1)"),
])
def test_bad_card_values(tmp_path, qwen3_target, card, message):
    src = make_zlab_drafter(tmp_path / "d", target_layer_ids=[0, 2])
    (src / "README.md").write_bytes(card)
    with pytest.raises(DFlashError) as e:
        plan_conversion(src, qwen3_target, outtype="bf16", hash_sources=False)
    assert str(e.value) == f"{src / 'README.md'}: {message}"


def test_front_matter_not_a_mapping_is_a_warning(tmp_path, qwen3_target, caplog):
    src = drafter_with_card(tmp_path, "not_a_mapping", generation_config=False)
    with caplog.at_level(logging.WARNING, "dflash_convert"):
        plan = plan_conversion(src, qwen3_target, outtype="bf16", hash_sources=False)
    assert "front matter is list, not a mapping; ignored" in caplog.text
    assert "general.license" not in plan.metadata and plan.metadata.get("general.name") == "Qwen3 4B DFlash B16"


def test_unreadable_generation_config_is_left_out(tmp_path, qwen3_target, caplog):
    """As upstream: a generation_config.json that is not JSON gives no sampling keys (we also warn)."""
    src = drafter_with_card(tmp_path)
    (src / "generation_config.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, "dflash_convert"):
        plan = plan_conversion(src, qwen3_target, outtype="bf16", hash_sources=False)
    assert "generation_config.json is not valid JSON" in caplog.text
    assert not [k for k in plan.metadata.keys() if k.startswith("general.sampling.")]
    assert plan.metadata.get("general.license") == "mit"


@pytest.mark.parametrize("content,message", [
    ("{oops", "--metadata file is not valid JSON"),
    ("[1, 2]", "the --metadata file must hold a JSON object of general.* keys"),
    ('{"general.sampling.top_k": "forty"}', "general.sampling.top_k must be an integer, not 'forty'"),
    ('{"general.sampling.temp": true}', "general.sampling.temp must be a number, not True"),
    ('{"general.tags": "one"}', "general.tags must be a list of strings, not 'one'"),
    ('{"general.base_models": ["x"]}', "base_models must be a list of objects, not ['x']"),
    ('{"general.name": 7}', "general.name must be a string, not 7"),
    # values that do not fit the GGUF type they are written as: named with the file, before anything is written
    ('{"general.sampling.top_k": 99999999999999999999}',
     "general.sampling.top_k value 99999999999999999999 does not fit INT32"),
    ('{"general.sampling.top_p": 1e300}', "general.sampling.top_p value 1e+300 does not fit FLOAT32"),
    ('{"general.sampling.temp": 1' + '0' * 400 + '}', "general.sampling.temp value 1" + "0" * 400 + " does not fit FLOAT32"),
])
def test_bad_metadata_file(tmp_path, qwen3_target, content, message):
    src = drafter_with_card(tmp_path)
    override = tmp_path / "meta.json"
    override.write_text(content)
    with pytest.raises(DFlashError) as e:
        plan_conversion(src, qwen3_target, outtype="bf16", hash_sources=False, metadata=override)
    assert str(e.value).startswith(f"{override}: {message}")


def test_metadata_flag(tmp_path, qwen3_target, caplog):
    src = drafter_with_card(tmp_path)
    override = tmp_path / "meta.json"
    override.write_text(json.dumps({"general.name": "Renamed", "general.sampling.temp": 1, "general.license": "x",
                                    "general.tags": [], "general.sampling.top_k": None}))
    out = tmp_path / "out.gguf"
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", out, "--metadata", override)
    assert r.returncode == 0, r.stderr
    assert "upstream's --metadata does not set general.license; ignored" in r.stderr
    g = read_gguf(out)
    assert g.get("general.name") == "Renamed" and g.get("general.license") == "mit"
    assert g.metadata["general.sampling.temp"].vtype.name == "FLOAT32" and g.get("general.sampling.temp") == 1.0
    assert "general.tags" not in g.metadata and "general.sampling.top_k" not in g.metadata  # emptied, as upstream
    # the parity comparison sees general.*, the reference comparison does not
    plain = convert(src, qwen3_target, outfile=tmp_path / "plain.gguf", outtype="bf16").output
    assert differences(out, plain) == []
    diffs = parity_differences(out, plain)
    assert any(d.startswith("keys only in") for d in diffs), diffs
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", tmp_path / "x.gguf", "--metadata", tmp_path / "none.json")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "none.json" in r.stderr


def test_quantize_keeps_card_keys(tmp_path, qwen3_target):
    """llama-quantize copies every key in order and moves the version and file type last: so do we."""
    src = drafter_with_card(tmp_path, "list_base")
    f16 = convert(src, qwen3_target, outfile=tmp_path / "f16.gguf", outtype="f16").output
    q = tmp_path / "q8.gguf"
    quantize(f16, q, "Q8_0")
    before, after = read_gguf(f16).metadata, read_gguf(q).metadata
    moved = ("general.quantization_version", "general.file_type")
    assert [k for k in general_keys(q) if k not in moved] == [k for k in general_keys(f16) if k not in moved]
    assert list(after)[-2:] == list(moved)
    for k in general_keys(f16):
        if k not in moved:
            assert (after[k].vtype, after[k].value) == (before[k].vtype, before[k].value), k
    assert read_gguf(q).get("general.dataset.1.repo_url") == "https://huggingface.co/datasets/Open-Orca/SlimOrca"


# --- hostile cards: the same README judged the same way by convert and publish, quickly, in bounded memory ---

LAUGHS = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
LAUGHS += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
# a card bomb ran for minutes and 2 GB: a run still going after this long is killed, and fails on its exit code
# (a watchdog, not a timing assertion: how long a refusal takes on a loaded machine is the benchmark's business)
HANG_SECONDS = 120


def run_measured(*args: object) -> tuple[int, str, float, int]:
    """``dflash-convert ARGS`` in its own process: exit code, stderr, seconds, peak resident KiB."""
    import os
    import subprocess
    import sys
    import time

    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "dflash_convert.cli", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    timer = __import__("threading").Timer(HANG_SECONDS, proc.kill)  # a hang fails the test, never the run
    timer.start()
    try:
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, err, time.monotonic() - start, usage.ru_maxrss


def both_commands(src: Path, target: Path, tmp_path: Path) -> dict[str, tuple[int, str, float, int]]:
    return {"convert": run_measured("convert", src, "--target-model-dir", target, "-o", tmp_path / "x.gguf", "-q"),
            "publish": run_measured("publish", src, "--target-model-dir", target, "-o", tmp_path / "release",
                                    "--types", "Q8_0", "-q")}


@pytest.mark.parametrize("field", ["base_model", "datasets", "tags"])
def test_an_alias_bomb_is_one_error_line_in_both_commands(tmp_path, qwen3_target, field):
    """A 600-byte card whose aliases stand for 10**9 strings: refused before anything is built from it."""
    src = make_zlab_drafter(tmp_path / "d", target_layer_ids=[0, 2])
    (src / "README.md").write_text("---\n" + "\n".join(LAUGHS) + f"\n{field}: *l8\n---\n")
    import resource

    own_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for command, (code, err, seconds, rss_kib) in both_commands(src, qwen3_target, tmp_path).items():
        assert err.splitlines() == [f"dflash-convert: error: {src / 'README.md'}: the model card's front matter uses a "
                                    "YAML alias (*name), which can make a small card expand without bound; write the "
                                    "values out"], (command, err[:500])
        # Linux keeps a process's peak RSS across exec: the child starts from this worker's, so the bound is
        # ours plus what a refusal may use (a bomb grew past 2 GB)
        assert code == 2 and rss_kib < own_peak + 500_000, (command, code, seconds, rss_kib, own_peak)
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def test_a_card_of_60000_tags_is_read_whole_and_a_larger_one_refused(tmp_path, qwen3_target):
    """A 650 KB card (under the 1 MiB cap) is read by both commands (the hang watchdog bounds it; the demo of issue 31
    times it: about a second); a card over the cap is refused."""
    src = make_zlab_drafter(tmp_path / "d", target_layer_ids=[0, 2])
    (src / "README.md").write_text("---\ntags:\n" + "".join(f"- tag{i}\n" for i in range(60000)) + "---\n")
    code, err, seconds, _ = run_measured("convert", src, "--target-model-dir", qwen3_target, "-o", tmp_path / "x.gguf", "-q")
    assert code == 0, (err, seconds)
    assert len(read_gguf(tmp_path / "x.gguf").get("general.tags")) == 60000
    code, err, seconds, _ = run_measured("publish", src, "--target-model-dir", qwen3_target, "-o", tmp_path / "r", "--dry-run")
    assert code == 0, (err, seconds)
    (src / "README.md").write_text("---\ntags:\n" + "".join(f"- tag{i}\n" for i in range(120000)) + "---\n")
    with pytest.raises(DFlashError, match=r"README.md: README.md is \d+ bytes, larger than the 1048576-byte limit"):
        plan_conversion(src, qwen3_target, outtype="bf16", hash_sources=False)


@pytest.mark.parametrize("shape", ["malformed", "not_a_mapping"])
def test_convert_and_publish_judge_a_card_alike(tmp_path, qwen3_target, shape):
    """One reader: a malformed card is the same error line and exit code (2) in both commands; a front matter
    that is not a mapping is the same warning in both (upstream logs it and goes on)."""
    src = drafter_with_card(tmp_path, shape, generation_config=False)
    convert_run = run_cli("convert", src, "--target-model-dir", qwen3_target, "-o", tmp_path / "x.gguf", "--dry-run")
    publish_run = run_cli("publish", src, "--target-model-dir", qwen3_target, "-o", tmp_path / "r", "--dry-run")
    card = src / "README.md"
    if shape == "malformed":
        for r in (convert_run, publish_run):
            assert r.returncode == 2 and r.stderr.splitlines() == [
                f"dflash-convert: error: {card}: the model card's front matter is not valid YAML: did not find expected "
                "',' or ']' (line 4)"], r.stderr
    else:
        for r in (convert_run, publish_run):
            assert r.returncode == 0, r.stderr
            assert f"{card}: the model card's front matter is list, not a mapping; ignored" in r.stderr


def test_entries_gguf_py_cannot_use_are_said_shortened(tmp_path, qwen3_target, caplog):
    """A base model that is a 100,000-item list: gguf-py would log it whole; we say it in one short line and
    write the empty entry gguf-py makes of it."""
    src = make_zlab_drafter(tmp_path / "d", target_layer_ids=[0, 2])
    (src / "README.md").write_text("---\nbase_model:\n- [" + ", ".join(["1234567"] * 100000) + "]\n- Qwen/Qwen3-4B\n---\n")
    with caplog.at_level(logging.WARNING):
        plan = plan_conversion(src, qwen3_target, outtype="bf16", hash_sources=False)
    assert max(len(r.getMessage()) for r in caplog.records) < 300
    assert "base model entry [1234567, 1234567, 1234567, 1234567, 1234567, 1234567, ...] is neither" in caplog.text
    assert plan.metadata.get("general.base_model.count") == 2
    assert plan.metadata.get("general.base_model.1.name") == "Qwen3 4B"


def test_metadata_refuses_floats_float32_cannot_hold():
    """The key table's mechanism: a finite FLOAT32 beyond its range is refused where it is set (struct would
    refuse to pack it mid-write); inf, NaN and the largest finite value are kept."""
    import math

    from dflash_convert.format.keys import ValueType
    from dflash_convert.metadata import F32_MAX, Metadata

    md = Metadata()
    for v in (F32_MAX, -F32_MAX, math.inf, 0.5):
        md.set_raw("x", ValueType.FLOAT32, v)
    md.set_raw("n", ValueType.FLOAT32, math.nan)
    assert math.isnan(md.get("n"))
    md.set_raw("big64", ValueType.FLOAT64, 1e300)  # FLOAT64 holds it
    for bad in (3.5e38, -1e39, 10 ** 400):
        with pytest.raises(DFlashError, match="does not fit FLOAT32"):
            md.set_raw("x", ValueType.FLOAT32, bad)
    with pytest.raises(DFlashError, match="does not fit FLOAT32"):
        md.set_raw("a", ValueType.ARRAY, [1.0, 1e39], ValueType.FLOAT32)
