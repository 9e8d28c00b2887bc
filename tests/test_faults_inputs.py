"""Faults of the inputs as files: FIFOs and devices, symbolic link loops, corrupt counts, JSON nested
thousands deep, missing files and tensors, modules planted to be imported, random config mutations.
Each is one error line with the README's exit code, never a hang, a traceback or code run from an input.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import faults
import pytest
from faults import TIMEOUT, cli, leftovers, one_error_line
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_convert import convert
from dflash_convert.errors import DFlashError
from dflash_convert.validate import validate
from fixtures.upstream import examples

drafter = faults.drafter  # the shared fixture


def test_fifos_and_devices_are_refused_by_every_command(tmp_path, drafter, qwen3_target):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    for bad in (fifo, Path("/dev/zero")):
        for args in (("inspect", bad), ("inspect", bad, "--drafter"), ("validate", bad), ("migrate", bad, tmp_path / "o.gguf"),
                     ("quantize", bad, tmp_path / "o.gguf", "Q8_0"),
                     ("convert", drafter, "--target-gguf", bad, "-o", tmp_path / "o.gguf")):
            r = cli(*args)
            assert r.returncode == 2, (args, r.stderr)
            assert ("a FIFO" in r.stderr or "a character device" in r.stderr), (args, r.stderr)
    # inside checkpoint and target directories: a FIFO where a file is read
    for where, name in (("draft", "model.safetensors"), ("draft", "config.json"), ("target", "tokenizer.json"),
                        ("target", "config.json")):
        d, t = tmp_path / f"d-{where}-{name}", tmp_path / f"t-{where}-{name}"
        shutil.copytree(drafter, d)
        shutil.copytree(qwen3_target, t)
        victim = (d if where == "draft" else t) / name
        victim.unlink()
        os.mkfifo(victim)
        r = cli("convert", d, "--target-model-dir", t, "-o", tmp_path / "o.gguf")
        assert r.returncode == 2, (where, name, r.stderr)
        assert "a FIFO" in one_error_line(r) and name in r.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_symbolic_link_loops_as_inputs_and_outputs(tmp_path, drafter, qwen3_target):
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    good = convert(drafter, qwen3_target, outfile=tmp_path / "good.gguf", outtype="f16").output
    for args in (("convert", loop, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf"),
                 ("convert", drafter, "--target-model-dir", loop, "-o", tmp_path / "o.gguf"),
                 ("inspect", loop), ("validate", loop), ("quantize", loop, tmp_path / "o.gguf", "Q8_0"),
                 ("validate", good, "--target", loop)):
        r = cli(*args)
        assert r.returncode == 2 and "is a symbolic link loop" in one_error_line(r), (args, r.stderr)
    for args in (("convert", drafter, "--target-model-dir", qwen3_target, "-o", loop),
                 ("quantize", good, loop, "Q8_0"), ("migrate", good, loop)):
        r = cli(*args)
        assert r.returncode == 1 and one_error_line(r).endswith(f"{loop}: output is a symbolic link loop; remove it or "
                                                                 "choose another path"), (args, r.stderr)
    r = cli("quantize", good, loop / "o.gguf", "Q8_0")
    assert r.returncode == 1 and one_error_line(r).endswith(f"{loop}: output folder is a symbolic link loop")
    assert leftovers(tmp_path) == []


def test_corrupt_tensor_count_offset(tmp_path):
    import struct

    from drafter_gguf import drafter_parts, write_parts

    path = write_parts(tmp_path / "a.gguf", drafter_parts())
    data = bytearray(path.read_bytes())
    data[8:16] = struct.pack("<Q", 10**12)  # the tensor count sits at byte 8
    path.write_bytes(bytes(data))
    r = cli("inspect", path)
    assert r.returncode == 2 and "tensor count" in r.stderr and "(at byte 8)" in r.stderr, r.stderr


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _nest_in(path: Path, depth: int = 100_000) -> None:
    """Give a JSON object file a key holding an array nested ``depth`` deep."""
    text = path.read_text().rstrip()
    assert text.endswith("}")
    path.write_text(text[:-1] + f', "deep": {_deep(depth)}}}')


@pytest.mark.parametrize("where,name", [("draft", "config.json"), ("target", "config.json"), ("target", "tokenizer_config.json"),
                                        ("target", "tokenizer.json"), ("draft", "model.safetensors.index.json")])
def test_json_nested_thousands_deep_is_one_line(tmp_path, drafter, qwen3_target, where, name):
    d, t = tmp_path / "draft", tmp_path / "target"
    shutil.copytree(drafter, d)
    shutil.copytree(qwen3_target, t)
    victim = (d if where == "draft" else t) / name
    if name == "model.safetensors.index.json":  # a sharded checkpoint whose index nests
        (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
        victim.write_text(json.dumps({"metadata": {}, "weight_map": {"fc.weight": "model-00001-of-00001.safetensors"}}))
    _nest_in(victim)
    out = tmp_path / "o.gguf"
    r = cli("convert", d, "--target-model-dir", t, "-o", out)
    line = one_error_line(r)
    assert r.returncode == 2 and name in line and "levels deep, deeper than the 100 levels accepted" in line, line
    assert not out.exists() and leftovers(tmp_path) == []


def test_validate_json_with_a_deep_target_still_prints_json(tmp_path, drafter, qwen3_target):
    t = tmp_path / "target"
    shutil.copytree(qwen3_target, t)
    _nest_in(t / "config.json")
    good = convert(drafter, qwen3_target, outfile=tmp_path / "o.gguf", outtype="f16").output
    r = cli("validate", good, "--target", t, "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 2 and doc["result"] == "error"
    assert any("config.json nests JSON 100001 levels deep" in c["message"] for c in doc["checks"]), doc["checks"]


def test_every_json_reader_bounds_the_depth(tmp_path):
    """The one loader: deep text is refused before the parser recurses; real files pass; depth in strings is not depth."""
    from dflash_convert.errors import InputFileError
    from dflash_convert.files import MAX_JSON_DEPTH, json_depth, parse_json

    assert parse_json(_deep(MAX_JSON_DEPTH), "x.json") is not None
    with pytest.raises(InputFileError, match=f"x.json nests JSON {MAX_JSON_DEPTH + 1} levels deep"):
        parse_json(_deep(MAX_JSON_DEPTH + 1), "x.json")
    assert json_depth(('["' + "[" * 5000 + '"]').encode()) == 1  # brackets in a string are text
    assert parse_json('{"a": "' + "{" * 5000 + '"}', "x.json") == {"a": "{" * 5000}
    from dflash_convert.capture import read_prompts

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"one"\n' + '{"prompt": ' + _deep(50_000) + "}\n")
    with pytest.raises(InputFileError, match="line 2 nests JSON 50001 levels deep"):
        read_prompts(prompts)


def _imported_roots() -> set[str]:
    """Every top-level module the package imports (standard library and third party), read from its source."""
    import ast

    roots = set()
    pkg = Path(__file__).resolve().parent.parent / "dflash_convert"
    for path in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots.add(node.module.split(".")[0])
    return roots - {"dflash_convert", "__future__"}


def test_no_code_runs_from_the_working_directory_or_the_inputs(tmp_path, drafter, qwen3_target):
    """Modules named after everything the package imports, planted in the working directory and in the
    checkpoint and target directories: the console command converts and validates, and none of them runs."""
    roots = _imported_roots()
    assert {"json", "numpy", "tokenizers", "torch"} <= roots
    marker = tmp_path / "RAN"
    d, t, cwd = tmp_path / "draft", tmp_path / "target", tmp_path / "cwd"
    shutil.copytree(drafter, d)
    shutil.copytree(qwen3_target, t)
    cwd.mkdir()
    for folder in (cwd, d, t):
        for name in roots:
            (folder / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    command = Path(sys.executable).with_name("dflash-convert")  # the installed entry point, as a user runs it
    assert command.is_file()
    runs = [[str(command), "convert", str(d), "--target-model-dir", str(t), "-o", str(tmp_path / "o.gguf"), "-q"],
            [str(command), "validate", str(tmp_path / "o.gguf"), "--target", str(t)],
            [str(command), "convert", ".", "--target-model-dir", str(t), "-o", str(tmp_path / "o2.gguf"), "-q"]]
    for i, args in enumerate(runs):
        r = subprocess.run(args, capture_output=True, text=True, cwd=d if i == 2 else cwd, timeout=TIMEOUT)
        assert r.returncode == 0, (args, r.stderr)
    assert not marker.exists(), marker.read_text()


_KEYS = ("max_position_embeddings", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
         "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "vocab_size", "sliding_window")


_DFLASH_KEYS = ("block_size", "mask_token_id", "target_layer_ids")


_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, 2, 3, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-6, 1e39, -1.0, 0.0, 1e-45]),
    st.booleans(), st.none(), st.text(max_size=5), st.lists(st.integers(min_value=-3, max_value=2**33), max_size=4),
)


MUTATION = st.tuples(st.sampled_from(_KEYS + _DFLASH_KEYS), _VALUES)


@settings(max_examples=int(os.environ.get("DFLASH_FUZZ_CONFIGS", examples(40, 10))), deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(MUTATION, min_size=1, max_size=3))
def test_fuzz_config_through_convert(tmp_path_factory, drafter, qwen3_target, ops):
    root = tmp_path_factory.mktemp("fuzz")
    d = root / "d"
    shutil.copytree(drafter, d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in ops:
        (cfg["dflash_config"] if k in _DFLASH_KEYS else cfg)[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    out = root / "o.gguf"
    try:
        convert(d, qwen3_target, outfile=out, outtype="f16")
    except DFlashError as e:
        assert "\n" not in str(e)  # one line
        assert not out.exists() and leftovers(root) == []
        return
    report = validate(out)
    assert report.exit_code == 0, [c for c in report.checks if c.status == "fail"]


def test_a_checkpoint_folder_that_does_not_exist_exits_2(tmp_path, qwen3_target):
    r = cli("convert", tmp_path / "nope", "--target-model-dir", qwen3_target)
    assert r.returncode == 2 and "does not exist" in one_error_line(r)


def test_a_target_folder_without_config_json_exits_2(tmp_path, drafter, qwen3_target):
    no_cfg = tmp_path / "t-no-config"
    shutil.copytree(qwen3_target, no_cfg)
    (no_cfg / "config.json").unlink()
    r = cli("convert", drafter, "--target-model-dir", no_cfg, "-o", tmp_path / "o.gguf")
    assert r.returncode == 2 and "target model directory" in one_error_line(r)


def test_a_missing_checkpoint_tensor_is_named_as_the_checkpoint_names_it(tmp_path, drafter, qwen3_target):
    d = tmp_path / "d"
    shutil.copytree(drafter, d)
    from safetensors.torch import load_file, save_file

    w = load_file(str(d / "model.safetensors"))
    del w["norm.weight"]
    save_file(w, str(d / "model.safetensors"))
    r = cli("convert", d, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf")
    assert r.returncode == 2 and "norm.weight (output_norm.weight)" in one_error_line(r)
