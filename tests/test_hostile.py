"""Hostile and careless use, one test per class of fault, several variants each.

1. No output may be an input (or a picked-up name in an input directory), --force or not.
2. Values that do not fit their GGUF type are refused before anything is written, naming the key.
3. Nothing that fails validate is ever left behind; validate fails bad floats; --tokenizer-pre is checked.
4. FIFOs and devices are refused by every command, never read (a hang is a failure: timeouts).
5. SIGINT / SIGTERM at every phase of the write: no partial file, no traceback, exit 130 / 143.
6. The small things a user notices.
7. Fuzz: random config mutations through convert end to end: a clean error or a file validate passes.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import cli_server
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_convert import convert
from dflash_convert.errors import DFlashError
from dflash_convert.outputs import PARTIAL_SUFFIX
from dflash_convert.validate import validate
from fixtures.drafters import edit_config, make_zlab_drafter
from fixtures.upstream import examples

TIMEOUT = 60  # a command blocked on a FIFO would hang: the timeout turns that into a failure


def cli(*args, env: dict[str, str] | None = None, timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    return cli_server.run(*args, env=dict(os.environ, **(env or {})), timeout=timeout)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dflash-convert: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    """Temporary files of ours (today's .dflash-partial names and earlier versions' .partial-<pid>)."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(PARTIAL_SUFFIX) or ".partial-" in p.name)


@pytest.fixture(scope="module")
def drafter(tmp_path_factory) -> Path:
    return make_zlab_drafter(tmp_path_factory.mktemp("hostile") / "draft", target_layer_ids=[0, 2])


@pytest.fixture(scope="module")
def target_gguf(tmp_path_factory, drafter, qwen3_target) -> Path:
    """A GGUF that stands in for a target file: any GGUF with the target's tokenizer keys will do for these tests."""
    out = tmp_path_factory.mktemp("tgguf") / "t.gguf"
    # the drafter file carries the target's tokenizer; read as a target it is refused as a drafter, so
    # rename its architecture to a target one with migrate's table-free route: rewrite via drafter_gguf
    from drafter_gguf import kv, read_parts, write_parts

    tmp = tmp_path_factory.mktemp("tg") / "d.gguf"
    convert(drafter, qwen3_target, outfile=tmp, outtype="f16")
    keys, tensors = read_parts(tmp)
    keys = [kv("architecture", "qwen3") if k.key == "general.architecture" else k for k in keys]
    return write_parts(out, (keys, tensors))


# --- 1. never replace an input -------------------------------------------------------------------

def test_no_output_is_an_input(tmp_path, drafter, qwen3_target, target_gguf):
    t = tmp_path / "target"
    shutil.copytree(qwen3_target, t)
    d = tmp_path / "draft"
    shutil.copytree(drafter, d)
    before = {p: p.read_bytes() for p in [*t.iterdir(), *d.iterdir(), target_gguf] if p.is_file()}
    (tmp_path / "hard.gguf").hardlink_to(t / "tokenizer.json")
    (tmp_path / "soft.gguf").symlink_to(d / "model.safetensors")
    cases = [
        ("convert", d, "--target-model-dir", t, "-o", t / "config.json", "--force"),
        ("convert", d, "--target-model-dir", t, "-o", t / "tokenizer.json", "--force"),
        ("convert", d, "--target-model-dir", t, "-o", d / "model.safetensors", "--force"),
        ("convert", d, "--target-model-dir", t, "-o", tmp_path / "hard.gguf", "--force"),  # a hard link to an input
        ("convert", d, "--target-model-dir", t, "-o", tmp_path / "soft.gguf", "--force"),  # a symlink to an input
        ("convert", d, "--target-model-dir", t, "-o", t / "tokenizer_config.json", "--force"),  # picked up by the target reader
        ("convert", d, "--target-gguf", target_gguf, "-o", target_gguf, "--force"),
        ("quantize", target_gguf, target_gguf, "Q8_0", "--force"),
        ("migrate", target_gguf, target_gguf, "--force"),
    ]
    for args in cases:
        r = cli(*args)
        assert r.returncode != 0, args
        line = one_error_line(r)
        assert "input" in line, (args, line)
    after = {p: p.read_bytes() for p in before}
    assert after == before
    assert leftovers(t) == leftovers(d) == leftovers(tmp_path) == []


def test_migrate_never_writes_over_its_target_gguf(tmp_path, target_gguf):
    from drafter_gguf import write_parts
    from test_migrate import buun

    src = write_parts(tmp_path / "buun.gguf", buun())
    t = tmp_path / "t.gguf"
    shutil.copy(target_gguf, t)
    before = t.read_bytes()
    r = cli("migrate", src, t, "--target-gguf", t, "--force")
    assert r.returncode == 1 and "input" in one_error_line(r)
    assert t.read_bytes() == before


# --- 2. values that do not fit their GGUF type ------------------------------------------------------

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


# --- 3. nothing that fails validate is written ----------------------------------------------------

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


# --- 4. special files ------------------------------------------------------------------------------

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


def test_a_fifo_as_output_is_named_as_a_fifo_not_offered_force(tmp_path, drafter, qwen3_target):
    """--force cannot make a FIFO a file: the message says what the output is, with or without it."""
    out = tmp_path / "o.gguf"
    os.mkfifo(out)
    gguf = tmp_path / "in.gguf"
    assert cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", gguf).returncode == 0
    for args in (("convert", drafter, "--target-model-dir", qwen3_target, "-o", out), ("quantize", gguf, out, "Q8_0"),
                 ("migrate", gguf, out)):
        for force in ((), ("--force",)):
            r = cli(*args, *force)
            assert r.returncode != 0, (args, force, r.stderr)
            line = one_error_line(r)
            assert "output is a FIFO" in line and "--force" not in line, (args, force, line)
    assert stat.S_ISFIFO(os.lstat(out).st_mode)


# --- 5. signals --------------------------------------------------------------------------------------

PHASES = ("header", "data", "finish", "verify", "renamed")


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("sig,code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_signals_leave_nothing_and_no_traceback(tmp_path, drafter, qwen3_target, phase, sig, code):
    out = tmp_path / "o.gguf"
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", out, env={"DFLASH_CONVERT_FAULT": f"{phase}:{sig}"})
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr and "BufferError" not in r.stderr, r.stderr
    assert f"interrupted by {sig}" in r.stderr
    assert leftovers(tmp_path) == []
    if phase == "renamed":  # the signal came after the rename: the file is complete, and the exit says it was interrupted
        assert validate(out).exit_code == 0
    else:
        assert not out.exists()


@pytest.mark.parametrize("phase,sig,code", [("data", "SIGINT", 130), ("header", "SIGTERM", 143), ("finish", "SIGINT", 130)])
def test_signals_in_quantize_and_migrate(tmp_path, drafter, qwen3_target, phase, sig, code):
    from drafter_gguf import write_parts
    from test_migrate import buun

    src = write_parts(tmp_path / "buun.gguf", buun())
    f16 = convert(drafter, qwen3_target, outfile=tmp_path / "d-f16.gguf", outtype="f16").output
    env = {"DFLASH_CONVERT_FAULT": f"{phase}:{sig}"}
    for args, out in ((("migrate", src, tmp_path / "m.gguf"), tmp_path / "m.gguf"),
                      (("quantize", f16, tmp_path / "q.gguf", "Q4_K_M"), tmp_path / "q.gguf")):
        r = cli(*args, env=env)
        assert r.returncode == code and "Traceback" not in r.stderr and f"interrupted by {sig}" in r.stderr, (args, r.stderr)
        assert not out.exists()
    assert leftovers(tmp_path) == []


# --- 6. small things ----------------------------------------------------------------------------------

def test_small_things(tmp_path, drafter, qwen3_target):
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("dflash-convert ")
    r = cli("convert", tmp_path / "nope", "--target-model-dir", qwen3_target)
    assert r.returncode == 2 and "does not exist" in one_error_line(r)
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", "")
    assert r.returncode == 1 and "output path is empty" in one_error_line(r)
    assert not any(Path.cwd().glob("*-F16.gguf")) and not any(Path.cwd().glob("*-BF16.gguf"))
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "--dry-run")
    assert r.returncode == 0 and "(computed when written)" in r.stdout and "0" * 64 not in r.stdout
    no_cfg = tmp_path / "t-no-config"
    shutil.copytree(qwen3_target, no_cfg)
    (no_cfg / "config.json").unlink()
    r = cli("convert", drafter, "--target-model-dir", no_cfg, "-o", tmp_path / "o.gguf")
    assert r.returncode == 2 and "target model directory" in one_error_line(r)
    r = cli("convert", "--help")
    assert "<bool>" not in r.stdout and "unless --target-gguf" in r.stdout.replace("\n", " ").replace("  ", " ")
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", tmp_path / "q.gguf", "-q")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    # missing checkpoint tensor: named as the checkpoint names it
    d = tmp_path / "d"
    shutil.copytree(drafter, d)
    from safetensors.torch import load_file, save_file

    w = load_file(str(d / "model.safetensors"))
    del w["norm.weight"]
    save_file(w, str(d / "model.safetensors"))
    r = cli("convert", d, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf")
    assert r.returncode == 2 and "norm.weight (output_norm.weight)" in one_error_line(r)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_folder_names_the_output(tmp_path, drafter, qwen3_target):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", ro / "o.gguf")
    assert r.returncode == 1 and "o.gguf" in one_error_line(r) and ".partial" not in r.stderr


def test_unwritable_output_names_the_output(tmp_path, drafter, qwen3_target):
    """As root a read-only folder is writable; a path under a file is not, for anyone."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", blocker / "o.gguf")
    assert r.returncode == 1
    line = one_error_line(r)
    assert "o.gguf" in line or "file" in line
    assert ".partial" not in line


def test_corrupt_tensor_count_offset(tmp_path):
    import struct

    from drafter_gguf import drafter_parts, write_parts

    path = write_parts(tmp_path / "a.gguf", drafter_parts())
    data = bytearray(path.read_bytes())
    data[8:16] = struct.pack("<Q", 10**12)  # the tensor count sits at byte 8
    path.write_bytes(bytes(data))
    r = cli("inspect", path)
    assert r.returncode == 2 and "tensor count" in r.stderr and "(at byte 8)" in r.stderr, r.stderr


# --- 7. fuzz: config mutations through convert ------------------------------------------------------

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



# --- round 3, 1: temporary files nobody can aim ------------------------------------------------------

def test_a_planted_symlink_never_redirects_a_write(tmp_path, drafter, qwen3_target, monkeypatch):
    """Links planted at the old predictable names, and at the very names the writer draws (its random
    source pinned), are never followed: the input they point at is untouched and the output is right."""
    import dflash_convert.outputs as outputs

    d = tmp_path / "draft"
    shutil.copytree(drafter, d)
    victim = d / "model.safetensors"
    before = victim.read_bytes()
    out = tmp_path / "o.gguf"
    for pid in range(1, 200):  # the old scheme: .<name>.partial-<pid>
        (tmp_path / f".o.gguf.partial-{pid}").symlink_to(victim)
    tokens = iter(["a" * 16, "a" * 16, "b" * 16])  # the first draw collides with a planted link, the second too
    monkeypatch.setattr(outputs.secrets, "token_hex", lambda n: next(tokens))
    tag = "" if outputs.boot_tag() is None else f"{outputs.boot_tag()}-"  # the writer's names carry the boot's tag
    planted = tmp_path / outputs.temporary_name(out, os.getpid(), tag + "a" * 16)
    planted.symlink_to(victim)
    convert(d, qwen3_target, outfile=out, outtype="f16")
    assert victim.read_bytes() == before
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert validate(out).exit_code == 0 and not out.is_symlink()
    # the run wrote under the third name it drew, and left nothing; the planted links stay (no --force)
    assert outputs.temporary_name(out, os.getpid(), tag + "b" * 16) not in leftovers(tmp_path)
    assert all((tmp_path / n).is_symlink() for n in leftovers(tmp_path)) and len(leftovers(tmp_path)) == 200


def test_temporary_file_mode_comes_from_the_umask(tmp_path, drafter, qwen3_target):
    old = os.umask(0o027)
    try:
        out = convert(drafter, qwen3_target, outfile=tmp_path / "u.gguf", outtype="f16").output
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


def test_commit_never_replaces_a_file_that_appeared(tmp_path):
    from dflash_convert.outputs import TemporaryOutput

    out = tmp_path / "x.gguf"
    with TemporaryOutput(out) as tmp:
        os.write(tmp.fd, b"ours")
        out.write_bytes(b"theirs")  # another run finished first
        with pytest.raises(DFlashError, match="appeared while this run was writing it"):
            tmp.commit()
    assert out.read_bytes() == b"theirs" and leftovers(tmp_path) == []
    with TemporaryOutput(out) as tmp:  # with --force the later run replaces it
        os.write(tmp.fd, b"ours")
        tmp.commit(replace=True)
    assert out.read_bytes() == b"ours" and leftovers(tmp_path) == []


def test_force_replaces_by_exchange_and_removes_the_old_file(tmp_path):
    """--force over a regular file swaps the two names (no ext4 flush of the new data) and unlinks the
    old file: the output holds our bytes, the old inode is gone, nothing is left beside it. A symbolic
    link at the output is replaced itself, its target untouched, as a plain rename does."""
    from dflash_convert.outputs import TemporaryOutput

    out = tmp_path / "x.gguf"
    out.write_bytes(b"old")
    other = tmp_path / "other-name"
    os.link(out, other)  # a second name keeps the old inode observable
    with TemporaryOutput(out) as tmp:
        os.write(tmp.fd, b"new")
        mine = os.fstat(tmp.fd).st_ino
        tmp.commit(replace=True)
    assert out.read_bytes() == b"new" and out.stat().st_ino == mine and leftovers(tmp_path) == []
    assert other.read_bytes() == b"old" and other.stat().st_nlink == 1  # the old file's other name is all that is left of it
    target = tmp_path / "target.bin"
    target.write_bytes(b"target")
    link = tmp_path / "link.gguf"
    link.symlink_to(target)
    with TemporaryOutput(link) as tmp:
        os.write(tmp.fd, b"new")
        tmp.commit(replace=True)
    assert not link.is_symlink() and link.read_bytes() == b"new" and target.read_bytes() == b"target"
    assert leftovers(tmp_path) == []


def test_commit_refuses_a_temporary_file_swapped_under_it(tmp_path):
    from dflash_convert.outputs import TemporaryOutput

    victim = tmp_path / "input.bin"
    victim.write_bytes(b"input")
    out = tmp_path / "x.gguf"
    with TemporaryOutput(out) as tmp:
        os.write(tmp.fd, b"ours")
        os.unlink(tmp.path)
        tmp.path.symlink_to(victim)  # someone replaced our file by a link while we wrote
        with pytest.raises(DFlashError, match="moved or replaced while it was written"):
            tmp.commit()
    assert victim.read_bytes() == b"input" and not out.exists()


def test_temporary_name_keeps_a_legal_output_name_legal(tmp_path, drafter, qwen3_target):
    from dflash_convert.outputs import NAME_MAX, temporary_name

    name = "d" * (NAME_MAX - len(".gguf")) + ".gguf"  # 255 bytes: the longest legal name
    assert len(temporary_name(Path(name), 4194304, "f" * 16).encode()) <= NAME_MAX
    out = convert(drafter, qwen3_target, outfile=tmp_path / name, outtype="f16").output
    assert out.name == name and validate(out).exit_code == 0


def test_two_runs_on_one_output_never_replace_each_other(tmp_path, drafter, qwen3_target):
    """A run stopped just before its rename, while another writes the same output: the stopped run,
    resumed, refuses to replace the finished file (one line, exit 1) and leaves nothing behind."""
    import signal
    import time

    out = tmp_path / "race.gguf"
    env = dict(os.environ, DFLASH_CONVERT_FAULT="verify:SIGSTOP")
    slow = subprocess.Popen([sys.executable, "-m", "dflash_convert.cli", "convert", str(drafter), "--target-model-dir",
                             str(qwen3_target), "-o", str(out), "-q"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not any(p.name.endswith(PARTIAL_SUFFIX) for p in tmp_path.iterdir()) or \
                Path(f"/proc/{slow.pid}/stat").read_text().split()[2] != "T":
            assert time.monotonic() < deadline and slow.poll() is None, "the first run never reached its rename"
            time.sleep(0.05)
        r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", out, "-q")
        assert r.returncode == 0 and out.is_file()
        first = out.read_bytes()
    finally:
        slow.send_signal(signal.SIGCONT)
    _, err = slow.communicate(timeout=TIMEOUT)
    assert slow.returncode == 1
    assert err.strip().splitlines() == [f"dflash-convert: error: {out}: output appeared while this run was writing it "
                                        "(another run?); it was not replaced: pass --force to replace it"]
    assert out.read_bytes() == first and leftovers(tmp_path) == []


def test_save_io_writes_through_an_unaimable_temporary_file():
    """check --save-io uses the same TemporaryOutput (tested with check itself in test_check.py)."""
    import inspect as std_inspect

    from dflash_convert import check as check_module

    assert "TemporaryOutput" in std_inspect.getsource(check_module.write_npz_atomic)


# --- round 3, 2: no code from the working directory or the inputs -------------------------------------

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


# --- round 3, 5: every fault is one line ---------------------------------------------------------------

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


def test_names_that_are_not_utf8_are_escaped_never_a_crash(tmp_path, drafter, qwen3_target):
    root = os.fsencode(tmp_path)
    src, out = root + b"/d\xff", root + b"/o\xfe.gguf"
    shutil.copytree(drafter, os.fsdecode(src))
    r = cli("convert", os.fsdecode(src), "--target-model-dir", qwen3_target, "-o", os.fsdecode(out))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    from dflash_convert.sources.gguf import read_gguf

    g = read_gguf(os.fsdecode(out))
    # valid UTF-8, the byte written as an escape; title-cased, as upstream names a file after its directory
    assert g.metadata["general.name"].value in ("D\\xff", b"D\\xff")
    assert validate(os.fsdecode(out)).exit_code == 0
    r = cli("validate", os.fsdecode(out), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["file"] == os.fsdecode(out)
    r = cli("inspect", os.fsdecode(root + b"/missing\xfe.gguf"))
    assert r.returncode == 2 and "missing\\xfe.gguf: GGUF file does not exist" in one_error_line(r)


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


def _in_namespace_with(folder: Path, options: str) -> list[str] | None:
    """A command prefix that runs under a fresh tmpfs on ``folder`` (a private mount namespace), or None."""
    prefix = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
              f'mount -t tmpfs -o {options} tmpfs "$0" && exec "$@"', str(folder)]
    try:
        probe = subprocess.run(prefix + ["true"], capture_output=True, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if probe.returncode == 0 else None


def _fsize_limited() -> None:
    """In the child: writes past 16 KiB fail with EFBIG (SIGXFSZ ignored), as on a full disk."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, 16 << 10))


def test_a_full_disk_names_the_file(tmp_path, drafter, qwen3_target):
    """ENOSPC on a 16 KiB tmpfs (in a private mount namespace where one can be had, else RLIMIT_FSIZE: EFBIG):
    convert, quantize, migrate and check --save-io each say which file, and leave nothing."""
    from drafter_gguf import write_parts
    from test_migrate import buun

    good = convert(drafter, qwen3_target, outfile=tmp_path / "good.gguf", outtype="f16").output
    fork = write_parts(tmp_path / "buun.gguf", buun())
    full = tmp_path / "full"
    full.mkdir()
    prefix = _in_namespace_with(full, "size=16k")
    runs = {"convert": ["convert", drafter, "--target-model-dir", qwen3_target, "-o", full / "c.gguf"],
            "quantize": ["quantize", good, full / "q.gguf", "Q8_0"], "migrate": ["migrate", fork, full / "m.gguf"]}
    for what, args in runs.items():
        command = [sys.executable, "-m", "dflash_convert.cli", *map(str, args)]
        if prefix is not None:
            r = subprocess.run(prefix + command, capture_output=True, text=True, timeout=TIMEOUT)
            reason = "No space left on device"
        else:
            r = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=_fsize_limited)
            reason = "File too large"
        line = one_error_line(r)
        assert r.returncode == 1 and line == f"dflash-convert: error: {args[-2 if what == 'quantize' else -1]}: cannot write " \
                                              f"the output: {reason}", (what, line)
        assert leftovers(full) == [] and not any(full.iterdir())
    if prefix is not None:  # a read-only file system says so
        ro = _in_namespace_with(full, "ro,size=16k")
        r = subprocess.run(ro + [sys.executable, "-m", "dflash_convert.cli", "quantize", str(good), str(full / "q.gguf"), "Q8_0"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 1 and one_error_line(r).endswith(f"{full / 'q.gguf'}: output folder is on a read-only file system")


@pytest.mark.slow  # check runs both forwards (torch) before it writes
def test_check_save_io_on_a_full_disk_names_the_file(tmp_path, drafter, qwen3_target):
    import torch
    from safetensors.torch import save_file

    t = tmp_path / "target"
    shutil.copytree(qwen3_target, t)
    cfg = json.loads((t / "config.json").read_text())
    save_file({"model.embed_tokens.weight": torch.zeros(cfg["vocab_size"], cfg["hidden_size"], dtype=torch.bfloat16)},
              str(t / "model.safetensors"))
    f32 = convert(drafter, t, outfile=tmp_path / "f32.gguf", outtype="f32").output
    full = tmp_path / "full"
    full.mkdir()
    prefix = _in_namespace_with(full, "size=64k")
    command = [sys.executable, "-m", "dflash_convert.cli", "check", str(f32), "--checkpoint", str(drafter), "--target-model-dir",
               str(t), "--device", "cpu", "--context", "7", "--save-io", str(full / "io.npz")]
    if prefix is not None:
        r = subprocess.run(prefix + command, capture_output=True, text=True, timeout=120)
    else:
        r = subprocess.run(command, capture_output=True, text=True, timeout=120, preexec_fn=_fsize_limited)
    line = one_error_line(r)
    assert r.returncode == 1 and line.startswith(f"dflash-convert: error: {full / 'io.npz'}: cannot write") and \
        ("No space left on device" in line or "File too large" in line), line
    assert not any(full.iterdir())
    r = cli("check", f32, "--checkpoint", f32, "--target-model-dir", t, "--device", "cpu")  # the wording bug
    assert r.returncode == 2 and one_error_line(r).endswith("drafter checkpoint directory is a regular file, not a directory")


def _pipe_gone() -> tuple[int, int]:
    """A pipe whose reader has already gone: the first write to the other end fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return read_end, write_end


def test_a_reader_that_goes_away_exits_141_quietly(tmp_path, drafter, qwen3_target):
    good = convert(drafter, qwen3_target, outfile=tmp_path / "good.gguf", outtype="f16").output
    for args in (("inspect", good), ("inspect", good, "--drafter"), ("validate", good), ("validate", good, "--json"),
                 ("convert", drafter, "--target-model-dir", qwen3_target, "--dry-run"), ("-h",),
                 ("quantize", good, tmp_path / "q.gguf", "Q4_K_M", "--dry-run")):
        _, w = _pipe_gone()
        try:
            r = subprocess.run([sys.executable, "-m", "dflash_convert.cli", *map(str, args)], stdout=w, stderr=subprocess.PIPE,
                               text=True, timeout=TIMEOUT)
        finally:
            os.close(w)
        assert r.returncode == 141 and r.stderr == "", (args, r.returncode, r.stderr)
    # a convert whose 'wrote' line finds no reader: the file it wrote stays, whole
    _, w = _pipe_gone()
    out = tmp_path / "piped.gguf"
    try:
        r = subprocess.run([sys.executable, "-m", "dflash_convert.cli", "convert", str(drafter), "--target-model-dir",
                            str(qwen3_target), "-o", str(out)], stdout=w, stderr=subprocess.PIPE, text=True, timeout=TIMEOUT)
    finally:
        os.close(w)
    assert r.returncode == 141 and r.stderr == "" and validate(out).exit_code == 0


def _closed(fd: int, *args) -> subprocess.CompletedProcess:
    """The command run with descriptor ``fd`` closed, as ``>&-`` (1) or ``2>&-`` (2) leaves it; the other one captured."""
    return subprocess.run(["sh", "-c", f'exec "$@" {fd}>&-', "sh", sys.executable, "-m", "dflash_convert.cli", *map(str, args)],
                          stdout=subprocess.PIPE if fd != 1 else None, stderr=subprocess.PIPE if fd != 2 else None,
                          text=True, timeout=TIMEOUT)


def test_closed_stdout_or_stderr_is_a_clear_outcome(tmp_path, drafter, qwen3_target):
    out = tmp_path / "o.gguf"
    r = _closed(1, "convert", drafter, "--target-model-dir", qwen3_target, "-o", out)
    assert r.returncode == 0 and r.stderr.strip() == ("dflash-convert: warning: standard output is closed; what this "
                                                      "command printed there was discarded"), r.stderr
    assert validate(out).exit_code == 0
    r = _closed(1, "convert", drafter, "--target-model-dir", qwen3_target, "-o", tmp_path / "q.gguf", "-q")
    assert r.returncode == 0 and r.stderr == "" and validate(tmp_path / "q.gguf").exit_code == 0  # nothing lost, nothing said
    for args, code in ((("inspect", out), 0), (("validate", out), 0), (("inspect", tmp_path / "nope.gguf"), 2),
                       (("convert", "--bogus"), 64)):
        r = _closed(1, *args)
        assert r.returncode == code and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
    out2 = tmp_path / "o2.gguf"
    r = _closed(2, "convert", drafter, "--target-model-dir", qwen3_target, "-o", out2)
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {out2}") and validate(out2).exit_code == 0
    r = _closed(2, "inspect", tmp_path / "nope.gguf")
    assert r.returncode == 2 and r.stdout == ""


def test_tokenizer_child_out_of_memory_is_not_a_bad_tokenizer(tmp_path, drafter, qwen3_target):
    """The probe's child under a 100 MB address-space limit (injected: DFLASH_CONVERT_FAULT=probe:AS=...): exit 1,
    out of memory named, tokenizer.json not blamed; without the limit the same files convert."""
    out = tmp_path / "o.gguf"
    # --no-cache: the fault is in the probe, which a cached entry for these files would skip; 100 MB: the child,
    # no longer importing numpy, loads this 151k-token tokenizer within 200 MB
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", out, "--no-cache",
            env={"DFLASH_CONVERT_FAULT": "probe:AS=100000000"})
    line = one_error_line(r)
    assert r.returncode == 1 and "tokenizer.json: the tokenizer process ran out of memory" in line and "not judged" in line
    assert "cannot load" not in line and not out.exists() and leftovers(tmp_path) == []
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", out, "-q")
    assert r.returncode == 0 and out.is_file()


def test_probe_child_killed_by_a_signal_is_reported_as_such(tmp_path, qwen3_target, monkeypatch):
    """SIGKILL (the kernel's OOM killer) and a failed Rust allocation, without starving a real child."""
    import re

    from dflash_convert.errors import ResourceError
    from dflash_convert.tokenizer import probe

    for program, what in (("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL (the kernel's "
                                                                                       "out-of-memory killer, most likely)"),
                          ("import os, sys; sys.stderr.write('memory allocation of 8589934592 bytes failed\\n'); os.abort()",
                           "ran out of memory")):
        monkeypatch.setattr(probe, "child_command", lambda path, program=program: [sys.executable, "-c", program])
        with pytest.raises(ResourceError, match=re.escape(what)):
            probe.Probe(qwen3_target / "tokenizer.json").result()


def test_an_output_with_a_trailing_slash_is_a_folder(tmp_path, drafter, qwen3_target):
    good = convert(drafter, qwen3_target, outfile=tmp_path / "good.gguf", outtype="f16").output
    missing = f"{tmp_path / 'newdir'}/"
    for args in (("convert", drafter, "--target-model-dir", qwen3_target, "-o", missing), ("quantize", good, missing, "Q8_0"),
                 ("migrate", good, missing)):
        r = cli(*args)
        assert r.returncode == 1 and one_error_line(r).endswith(f"{missing}: output folder does not exist (a path ending in "
                                                                "/ names a folder)"), (args, r.stderr)
        assert not (tmp_path / "newdir").exists()
    there = tmp_path / "there"
    there.mkdir()
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", f"{there}/", "-q")  # a folder: the default name in it
    assert r.returncode == 0 and [p.suffix for p in there.iterdir()] == [".gguf"]
    r = cli("quantize", good, f"{there}/", "Q8_0", "-q")  # a folder too: the input's name, its type tag replaced
    assert r.returncode == 0 and (there / "dflash-good-Q8_0.gguf").is_file(), r.stderr


def test_an_unforeseen_exception_is_one_line(tmp_path):
    """A bug of ours still prints one line (and the variable that shows the traceback), exit 1."""
    program = ("import sys; import dflash_convert.cli as c; import dflash_convert.inspect_gguf as i\n"
               "def boom(*a, **k):\n    raise RuntimeError('something\\nwe did not foresee')\n"
               "i.read_summary = boom; sys.argv = ['dflash-convert', 'inspect', 'x.gguf']; c.main()")
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path)
    assert r.returncode == 1 and one_error_line(r) == ("dflash-convert: error: internal error: RuntimeError: something we did "
                                                       "not foresee (DFLASH_CONVERT_TRACEBACK=1 shows where; please report it)")
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path,
                       env=dict(os.environ, DFLASH_CONVERT_TRACEBACK="1"))
    assert r.returncode == 1 and "Traceback" in r.stderr and "boom" in r.stderr


# --- round 3, 6: exit codes ------------------------------------------------------------------------------

COMMANDS = ("convert", "quantize", "validate", "migrate", "inspect", "check", "capture", "accept", "publish", "version")


def test_usage_errors_exit_64_never_2(tmp_path):
    """2 says an input is unreadable; a command line that does not parse is 64 (EX_USAGE), one line."""
    for command in COMMANDS:
        r = cli(command, "--no-such-option")
        line = one_error_line(r)
        assert r.returncode == 64 and r.stdout == "", (command, r.returncode, r.stderr)
        assert line == f"dflash-convert: error: No such option: --no-such-option (see 'dflash-convert {command} -h')", line
    for args, says in ((("quantize", tmp_path / "a.gguf"), "Missing argument 'OUT'"),
                       (("check", tmp_path / "a.gguf", "--checkpoint", tmp_path, "--context", "0"), "'--context'"),
                       (("quantize", tmp_path / "a.gguf", tmp_path / "b.gguf", "Q8_0", "--threads", "x"), "'--threads'"),
                       (("no-such-command",), "No such command 'no-such-command'")):
        r = cli(*args)
        assert r.returncode == 64 and says in one_error_line(r), (args, r.stderr)
    r = cli()  # bare: the help, on stderr, and the usage status
    assert r.returncode == 64 and r.stdout == "" and r.stderr.startswith("Usage: dflash-convert ")


def test_h_is_help_on_every_command():
    for args in ((), *((c,) for c in COMMANDS)):
        short, long = cli(*args, "-h"), cli(*args, "--help")
        assert short.returncode == 0 and short.stderr == "", (args, short.stderr)
        assert short.stdout == long.stdout and short.stdout.startswith(" ".join(("Usage: dflash-convert", *args))), args
        assert "-h, --help" in short.stdout


def test_validate_gate_codes_are_unambiguous(tmp_path, drafter, qwen3_target):
    """What a CI gate sees: 0 pass, 1 a failing check, 2 an unreadable file, 64 its own typo; all four distinct."""
    from drafter_gguf import drafter_parts, kv, set_key, write_parts

    good = convert(drafter, qwen3_target, outfile=tmp_path / "good.gguf", outtype="f16").output
    failing = write_parts(tmp_path / "b.gguf", set_key(drafter_parts(), kv("target_layers", [2, 2])))
    corrupt = tmp_path / "c.gguf"
    corrupt.write_bytes(good.read_bytes()[:1000])
    codes = {what: cli("validate", *args, "--json").returncode
             for what, args in (("pass", (good, "--target", qwen3_target)), ("fail", (failing,)), ("unreadable", (corrupt,)),
                                ("typo", (good, "--targte", qwen3_target)))}
    assert codes == {"pass": 0, "fail": 1, "unreadable": 2, "typo": 64}


def test_the_readme_states_the_exit_codes_once_and_the_docs_agree():
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    rows = [ln for ln in readme.splitlines() if ln.startswith("| **")]
    assert [ln.split("|")[1].strip() for ln in rows] == ["**0**", "**1**", "**2**", "**64**", "**128 + N**"]
    assert readme.count("| exit | meaning |") == 1
    from dflash_convert.cli import EXIT_REFUSED, EXIT_SIGPIPE, EXIT_UNREADABLE, EXIT_USAGE

    assert (EXIT_REFUSED, EXIT_UNREADABLE, EXIT_USAGE, EXIT_SIGPIPE) == (1, 2, 64, 141)
    conversion = " ".join((root / "docs" / "conversion.md").read_text().split())
    assert "corrupt or truncated safetensors" in conversion and "exit code 1, and no output" not in conversion
    assert "is unreadable input (exit 2" in conversion
# --- round 3, 3: typed config reading ---

def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_json(path: Path, change: dict, sub: str | None = None) -> None:
    cfg = json.loads(path.read_text())
    (cfg[sub] if sub else cfg).update(change)
    path.write_text(json.dumps(cfg))


def test_round3_a_string_false_never_turns_sliding_attention_on(tmp_path, drafter, qwen3_target):
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
def test_round3_typed_config_values_are_refused(tmp_path, drafter, qwen3_target, sub, change, phrase):
    d = _copy(drafter, tmp_path / "d")
    _edit_json(d / "config.json", change, sub)
    with pytest.raises(DFlashError) as e:
        convert(d, qwen3_target, outfile=tmp_path / "o.gguf", outtype="f16")
    assert str(e.value).startswith(f"{d / 'config.json'}: "), str(e.value)
    assert phrase in str(e.value), str(e.value)
    assert not (tmp_path / "o.gguf").exists() and leftovers(tmp_path) == []


def test_round3_json_details_an_int_is_a_number_and_null_is_absent(tmp_path, drafter, qwen3_target):
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


def test_round3_target_config_values_are_typed(tmp_path, drafter, qwen3_target):
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


def test_round3_tokenizer_config_fields_are_typed(tmp_path, drafter, qwen3_target):
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


def test_round3_speculators_config_values_are_typed(tmp_path, qwen3_target):
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


# --- round 3, 4: values llama.cpp cannot run ---

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


ROUND3_BAD = {  # case -> (check id, phrase of the llama.cpp check it mirrors)
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


@pytest.mark.parametrize("case", sorted(ROUND3_BAD))
def test_round3_validate_fails_what_llama_cpp_cannot_run(tmp_path, case):
    from drafter_gguf import write_parts

    check_id, phrase = ROUND3_BAD[case]
    path = write_parts(tmp_path / f"{case}.gguf", _bad_parts(case))
    r = validate(path)
    c = r.check(check_id)
    assert r.exit_code == 1 and c.status == "fail", (case, [(x.id, x.status, x.details) for x in r.checks])
    assert any(phrase in d for d in c.details), c.details


def test_round3_validate_passes_sections_and_ranges_llama_cpp_runs(tmp_path):
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
def test_round3_convert_refuses_rope_llama_cpp_cannot_run(tmp_path, drafter, qwen3_target, change, phrase):
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
def test_round3_convert_refuses_a_block_size_llama_cpp_reads_as_another(tmp_path, drafter, qwen3_target, dflash_change, phrase):
    d = _copy(drafter, tmp_path / "d")
    _edit_json(d / "config.json", dflash_change, "dflash_config")
    r = cli("convert", d, "--target-model-dir", qwen3_target, "-o", tmp_path / "o.gguf")
    assert r.returncode == 1 and phrase in one_error_line(r), r.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_round3_quantize_refuses_an_input_that_fails_validate(tmp_path):
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
        assert ROUND3_BAD[case][1] in line, line
        assert not out.exists() and leftovers(tmp_path) == []
    # the explicit way through: it says so in a warning line, and writes what it was asked to
    src, out = tmp_path / "block_size_negative.gguf", tmp_path / "forced-q8.gguf"
    r = cli("quantize", src, out, "Q8_0", "--skip-validation")
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("dflash-convert: warning: ")]
    assert len(warnings) == 1 and "--skip-validation" in warnings[0] and "not validated" in warnings[0], r.stderr
    assert out.exists() and validate(out).check("keys.ranges").status == "fail"


def test_round3_migrate_refuses_a_file_llama_cpp_cannot_run(tmp_path):
    from drafter_gguf import write_parts
    from test_migrate import buun

    for case in ("block_size_negative", "sections_sum"):  # (buun files carry their own rope.dimension_count)
        src = write_parts(tmp_path / f"buun-{case}.gguf", buun(_bad_parts(case)))
        out = tmp_path / f"{case}.gguf"
        r = cli("migrate", src, out)
        assert r.returncode == 1, r.stderr
        line = one_error_line(r)
        assert "fails validate" in line and ROUND3_BAD[case][1] in line, line
        assert not out.exists() and leftovers(tmp_path) == []


def test_round3_check_fails_a_file_that_fails_validate(tmp_path, drafter, qwen3_target):
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
# --- round 3, 7: terminal safety ---------------------------------------------------------------------

FORGED = "\n  pass  everything         fine\nresult: PASS (0 fail, 0 warn, 20 pass, 0 skipped)"
HOSTILE_TEXT = "\x1b[2J\x1b]0;owned\x07\x9b31m\x7f\rover\u202eevil\x00"  # ESC/CSI/OSC, BEL, C1 CSI, DEL, CR, RLO, NUL


def _hostile_drafter(path: Path) -> Path:
    """A drafter that fails validate (no mask token id) and quotes hostile text in a key name, a
    string value and a tensor name, one of which tries to forge validate's last line."""
    from drafter_gguf import KV, drafter_parts, drop_keys, full_key, tensor, write_parts

    from dflash_convert.format.keys import ValueType

    keys, tensors = drop_keys(drafter_parts(), full_key("mask_token_id"))
    keys += [KV("dflash.x" + FORGED + HOSTILE_TEXT, ValueType.UINT32, 1),
             KV("general.description", ValueType.STRING, "text" + HOSTILE_TEXT + FORGED)]
    tensors.append(tensor("blk.9." + HOSTILE_TEXT[:12] + ".weight", (32,)))
    return write_parts(path, (keys, tensors))


def _on_a_terminal(*args: object, env: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Run the command with stdout and stderr on a pseudo-terminal (click strips ANSI codes only
    when the output is not a terminal, so a pipe would hide the fault); (exit code, bytes shown)."""
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "dflash_convert.cli", *map(str, args)], stdin=subprocess.DEVNULL,
                         stdout=slave, stderr=slave, env=dict(os.environ, **(env or {})))
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed its side
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return p.wait(timeout=TIMEOUT), out.replace(b"\r\n", b"\n")  # the terminal's own newline translation


def _nothing_raw(shown: bytes) -> None:
    for raw in (b"\x1b", b"\x07", b"\x7f", b"\r", b"\x00", "\x9b".encode(), "\u202e".encode()):
        assert raw not in shown, (raw, shown[:2000])


def test_visible_escapes_every_control_and_keeps_printable_text():
    from dflash_convert.terminal import json_safe, visible

    assert visible("plain ascii, ünïcödé, 中文 / path.gguf") == "plain ascii, ünïcödé, 中文 / path.gguf"
    assert visible("a\nb\rc\td\x1b[31me\x7f\x9b\u202e\U000e0041") == "a\\nb\\rc\\td\\x1b[31me\\x7f\\x9b\\u202e\\U000e0041"
    assert visible(os.fsdecode(b"/tmp/\xff\xfe.gguf")) == "/tmp/\\xff\\xfe.gguf"  # surrogateescape: the bytes
    assert visible(Path("x\ny")) == "x\\ny"
    doc = json.dumps({"k": "a\x7f\x9b\u202e\udcff\U000e0041é\n"}, ensure_ascii=False, indent=2)
    safe = json_safe(doc)
    assert json.loads(safe) == json.loads(doc) and safe.isascii() is False and "é" in safe
    assert all(line.isprintable() for line in safe.split("\n"))
    # warnings quote files too: the command line's log format escapes them the same way
    import logging

    from dflash_convert.cli import _VisibleFormatter

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "tensor %s skipped", ("a\nb\x1b[2K",), None)
    assert _VisibleFormatter("w: %(message)s").format(record) == "w: tensor a\\nb\\x1b[2K skipped"


def test_a_key_name_cannot_forge_a_validate_line(tmp_path):
    path = _hostile_drafter(tmp_path / "forged.gguf")
    r = cli("validate", path)
    assert r.returncode == 1, r.stderr
    results = [ln for ln in r.stdout.splitlines() if ln.startswith("result:")]
    assert results == [r.stdout.splitlines()[-1]] and results[0].startswith("result: FAIL"), r.stdout
    assert not any(ln.lstrip().startswith("pass  everything") for ln in r.stdout.splitlines())
    assert "dflash.x\\n  pass  everything" in r.stdout and "\\nresult: PASS" in r.stdout  # shown, escaped
    # every line is one of ours: the header, a check, a detail, the result
    for ln in r.stdout.splitlines()[1:-1]:
        assert ln.startswith("  ") and ln[2:6].strip() in ("pass", "warn", "fail", "skip", ""), ln
    # --json keeps the exact key name
    doc = json.loads(cli("validate", "--json", path).stdout)
    details = [d for c in doc["checks"] for d in c["details"]]
    assert any(d.startswith("dflash.x" + FORGED + HOSTILE_TEXT) for d in details), details


def test_no_escape_sequence_from_a_file_reaches_the_terminal(tmp_path):
    path = _hostile_drafter(tmp_path / "hostile.gguf")
    code, shown = _on_a_terminal("inspect", path)
    assert code == 0, shown
    _nothing_raw(shown)
    text = shown.decode()
    assert "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\x7f\\rover\\u202eevil\\x00" in text  # the key name, visibly
    assert "blk.9.\\x1b[2J\\x1b]0;ow" in text  # the tensor name
    assert not any(ln.startswith("result:") for ln in text.splitlines())
    code, shown = _on_a_terminal("validate", path)
    assert code == 1
    _nothing_raw(shown)
    assert [ln for ln in shown.decode().splitlines() if ln.startswith("result:")][0].startswith("result: FAIL")
    code, shown = _on_a_terminal("validate", "--json", path)
    assert code == 1
    _nothing_raw(shown)
    doc = json.loads(shown.decode())
    assert any(HOSTILE_TEXT in d for c in doc["checks"] for d in c["details"])  # the real values, exact


def test_error_lines_escape_what_they_quote(tmp_path):
    # a path with a newline and an escape sequence: still one error line, shown escaped
    r = cli("inspect", tmp_path / "a\nresult: PASS\x1b[2K.gguf")
    line = one_error_line(r)
    assert r.returncode == 2 and "a\\nresult: PASS\\x1b[2K.gguf" in line
    # a file whose magic is an escape sequence: the reader's message quotes it, escaped
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\x1b[2J" + b"\0" * 64)
    code, shown = _on_a_terminal("validate", bad)
    assert code == 2
    _nothing_raw(shown)
    assert b"not a GGUF file" in shown
    # an input error quoting a hostile duplicate key
    import struct

    from gguf_bytes import kv_u32

    dup = tmp_path / "dup.gguf"
    k = "dup\n\x1b[2Kkey"
    dup.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv_u32(k, 1) + kv_u32(k, 2))
    code, shown = _on_a_terminal("inspect", dup)
    assert code == 2
    _nothing_raw(shown)
    lines = [ln for ln in shown.decode().splitlines() if ln.strip()]
    assert len(lines) == 1 and "duplicate metadata key" in lines[0] and "dup\\n\\x1b[2Kkey" in lines[0], lines


def test_non_utf8_path_names_print_escaped_and_never_crash(tmp_path, drafter, qwen3_target):
    good = _hostile_drafter(tmp_path / "good.gguf")
    folder = os.fsencode(tmp_path)
    name = folder + b"/\xff\xfe\x1b[31m.gguf"
    os.link(good, name)
    strict = {"PYTHONIOENCODING": "utf-8:strict"}  # a UTF-8 terminal: a lone surrogate printed raw would crash
    for args, want in ((["inspect"], 0), (["validate"], 1), (["validate", "--json"], 1)):
        r = subprocess.run([sys.executable, "-m", "dflash_convert.cli", *args, name], capture_output=True, timeout=TIMEOUT,
                           env=dict(os.environ, **strict))
        assert r.returncode == want and b"Traceback" not in r.stderr, r.stderr
        assert b"\x1b" not in r.stdout and b"\xff" not in r.stdout
        if "--json" in args:
            assert os.fsencode(json.loads(r.stdout)["file"]) == name  # the exact bytes, as JSON escapes
        else:
            assert b"\\xff\\xfe\\x1b[31m.gguf" in r.stdout
    r = subprocess.run([sys.executable, "-m", "dflash_convert.cli", "inspect", folder + b"/missing-\xff.gguf"],
                       capture_output=True, timeout=TIMEOUT, env=dict(os.environ, **strict))
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "missing-\\xff.gguf" in lines[0] and "Traceback" not in lines[0]
    out = tmp_path / "o\n\x1b[2K.gguf"
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", out)
    assert r.returncode == 0 and r.stdout.count("\n") == 1 and "o\\n\\x1b[2K.gguf" in r.stdout, r.stdout


# --- round 3, 8: memory bounded for hostile GGUFs ------------------------------------------------------

# the peak resident memory of a command, measured in a child of its own (RUSAGE_CHILDREN is the
# largest of every waited-for child: the test process's other children must not count)
_PEAK = ("import resource, subprocess, sys\n"
         "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
         "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n")


def _peak_rss(*args: object) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of ``dflash-convert ARGS``."""
    r = subprocess.run([sys.executable, "-c", _PEAK, sys.executable, "-m", "dflash_convert.cli", *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    code, peak = r.stdout.split()
    return int(code), int(peak)


def _spliced(path: Path, short: str, sub: int, count: int, items: bytes) -> Path:
    """A complete small drafter with one more key, ``short``, an array of ``count`` items given as
    their bytes; the key is padded to the alignment so the tensor data moves as a whole."""
    import struct

    from drafter_gguf import drafter_parts, drop_keys, full_key, write_parts

    raw = write_parts(path.with_name("small.gguf"), drop_keys(drafter_parts(), full_key(short))).read_bytes()
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", raw, 4)
    name = full_key(short).encode()
    head = struct.pack("<Q", len(name)) + name + struct.pack("<IIQ", 9, sub, count)
    assert (len(head) + len(items)) % 32 == 0
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv + 1) + head + items + raw[24:])
    return path


def string_heavy_gguf(path: Path, size: int = 40 << 20, length: int = 3) -> Path:
    """A drafter whose tokenizer.ggml.tokens holds ``size`` bytes of ``length``-byte strings (millions of them)."""
    import struct

    import numpy as np

    n = size // (8 + length)
    items = np.zeros(n, dtype=[("n", "<u8"), ("s", f"S{length}")])
    items["n"] = length
    items["s"] = np.random.default_rng(0).integers(97, 123, (n, length), dtype=np.uint8).view(f"S{length}")[:, 0]
    body = items.tobytes()
    name_len = len("tokenizer.ggml.tokens")
    pad = (-(8 + name_len + 16 + len(body) + 8)) % 32  # a last string of pad bytes aligns the key
    return _spliced(path, "tok_tokens", 8, n + 1, body + struct.pack("<Q", pad) + b"z" * pad)


def int_heavy_gguf(path: Path, size: int = 40 << 20) -> Path:
    """A drafter whose tokenizer.ggml.token_type is an INT8 array of ``size`` entries none of them a cached small int."""
    import numpy as np

    name_len = len("tokenizer.ggml.token_type")
    n = size + (-(8 + name_len + 16 + size)) % 32
    return _spliced(path, "tok_token_type", 1, n, np.random.default_rng(0).integers(-128, -6, n, dtype="i1").tobytes())


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss units and madvise as on Linux")
@pytest.mark.parametrize("build", [string_heavy_gguf, int_heavy_gguf], ids=["strings", "ints"])
def test_inspect_and_validate_memory_is_bounded_by_the_file(tmp_path, build):
    """Peak memory of inspect and validate on a ~40 MB file of millions of short array items stays
    under twice the file's size over the same command on a small file (it was ~6x for strings,
    ~50x for integers that Python does not cache)."""
    big = build(tmp_path / "big.gguf")
    small = tmp_path / "small.gguf"
    size = big.stat().st_size
    assert size > 30 << 20
    for args, want in ((["inspect"], 0), (["validate"], 1), (["validate", "--json"], 1)):
        base_code, base = _peak_rss(*args, small)
        code, peak = _peak_rss(*args, big)
        assert base_code in (0, 1) and code == want, (args, code)
        extra = peak - base
        assert extra < 2 * size + (16 << 20), f"{args}: {extra / 2**20:.0f} MiB over the baseline for a {size / 2**20:.0f} MiB file"


def test_string_arrays_are_held_compact_and_read_exactly(tmp_path):
    """The reader keeps a string array as one buffer and offsets, and still gives every item exactly."""
    from drafter_gguf import read_parts, write_parts

    from dflash_convert.sources.gguf import StrArray, read_gguf

    path = string_heavy_gguf(tmp_path / "big.gguf", size=1 << 20)
    g = read_gguf(path)
    tokens = g.metadata["tokenizer.ggml.tokens"].value
    assert isinstance(tokens, StrArray) and len(tokens) == (1 << 20) // 11 + 1
    # held as the file holds it: each item's u64 length then its bytes, and the offset of each length
    assert tokens.offsets.itemsize == 4 and len(tokens.data) == 11 * (len(tokens) - 1) + 8 + len(tokens[-1])
    raw = path.read_bytes()
    first = raw.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 4 + 4 + 8
    assert tokens[0] == raw[first + 8:first + 11] and tokens[-1] == b"z" * len(tokens[-1])
    assert tokens[1:3] == [raw[first + 19:first + 22], raw[first + 30:first + 33]]
    assert tokens == list(tokens) and tokens == StrArray.of(list(tokens)) and tokens != list(tokens)[:-1]
    assert g.get("tokenizer.ggml.tokens")[:2] == [t.decode() for t in tokens[:2]]
    # written back through the writer (as migrate and quantize copy keys), byte for byte
    assert write_parts(tmp_path / "again.gguf", read_parts(path)).read_bytes() == raw


def test_an_integer_array_too_long_to_read_fails_by_its_length(tmp_path):
    """target_layers and a per-layer key with 70,000 entries: never expanded into Python ints,
    failed by their length (llama.cpp reads at most 512 into either)."""
    from drafter_gguf import KV, drafter_parts, full_key, kv, set_key, write_parts

    from dflash_convert.format.keys import ValueType

    keys, tensors = set_key(drafter_parts(), kv("target_layers", [1] * 70_000))
    heads = full_key("head_count")
    keys = [KV(heads, ValueType.ARRAY, [2] * 70_000, ValueType.INT32) if k.key == heads else k for k in keys]
    report = validate(write_parts(tmp_path / "long.gguf", (keys, tensors)))
    assert report.exit_code == 1
    tl = report.check("target_layers")
    assert tl.status == "fail" and "dflash.target_layers has 70000 entries; llama.cpp reads at most 512" in tl.message
    types = report.check("keys.types")
    assert types.status == "fail" and any("dflash.attention.head_count has 70000 entries" in d for d in types.details)


def test_millions_of_tiny_keys_or_tensors_are_refused_up_front(tmp_path):
    """Each key or tensor costs a few hundred bytes of Python objects against ~20 in the file: past
    65,536 of either (real files hold tens of keys, a few thousand tensors at most) the file is
    refused before anything is read, with one line naming the count."""
    import struct

    from dflash_convert.sources.gguf import MAX_KEYS, MAX_TENSORS

    keys = tmp_path / "keys.gguf"
    items = b"".join(struct.pack("<Q", 7) + b"k%06d" % i + struct.pack("<IB", 0, 1) for i in range(MAX_KEYS + 1))
    keys.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, MAX_KEYS + 1) + items)
    tensors = tmp_path / "tensors.gguf"
    tensors.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, MAX_TENSORS + 1, 0) + bytes(40 * (MAX_TENSORS + 1)))
    for path, what in ((keys, f"metadata count {MAX_KEYS + 1} is more than the {MAX_KEYS} keys"),
                       (tensors, f"tensor count {MAX_TENSORS + 1} is more than the {MAX_TENSORS} tensors")):
        for command in ("inspect", "validate"):
            r = cli(command, path)
            assert r.returncode == 2 and what in one_error_line(r), r.stderr
    # at the limit a file still reads
    at_limit = tmp_path / "at-limit.gguf"
    at_limit.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, MAX_KEYS) + items[:len(items) - 20])
    r = cli("inspect", at_limit)
    assert r.returncode == 0 and f"keys ({MAX_KEYS})" in r.stdout, r.stderr
