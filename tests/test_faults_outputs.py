"""Faults of the outputs: no output is ever an input; nobody can aim a write; a killed, stopped, refused or
interrupted write leaves nothing behind, or only what the next write into the folder removes.

A writer holds an flock on its temporary file (``.<name>.<pid>-<boot>-<random>.dflash-partial``) for
its whole life. The next command that writes into the folder removes a partial of ours written in
this boot whose lock nobody holds, with one line (``-q`` or not); a live writer's partial, and any
partial it cannot prove abandoned (another boot or host, a link, not a regular file), is left and
reported as before, and removed with --force. Every writer here is a real child process.
Full disks, read-only and unwritable folders, trailing slashes, FIFOs as outputs: one line naming the output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import faults
import pytest
from faults import TIMEOUT, cli, leftovers, one_error_line

from dflash_convert import convert
from dflash_convert.errors import DFlashError
from dflash_convert.outputs import PARTIAL_SUFFIX, boot_tag
from dflash_convert.validate import validate

drafter = faults.drafter  # the shared fixture
target_gguf = faults.target_gguf  # the shared fixture

NEEDS_BOOT_ID = pytest.mark.skipif(boot_tag() is None, reason="no boot id on this system: partials are only reported")
REMOVED = re.compile(r"dflash-convert: warning: removed (?P<path>.+) \((?P<size>\d+) bytes\), left by a run "
                     r"\(pid (?P<pid>\d+)\) that was killed before it finished")


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

    from dflash_convert.runtime import check_io

    assert "TemporaryOutput" in std_inspect.getsource(check_io.write_npz_atomic)


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


def test_an_empty_output_path_is_refused_and_nothing_lands_in_the_working_directory(drafter, qwen3_target):
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", "")
    assert r.returncode == 1 and "output path is empty" in one_error_line(r)
    assert not any(Path.cwd().glob("*-F16.gguf")) and not any(Path.cwd().glob("*-BF16.gguf"))


def test_a_dry_run_shows_the_source_hashes_as_not_yet_computed(drafter, qwen3_target):
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "--dry-run")
    assert r.returncode == 0 and "(computed when written)" in r.stdout and "0" * 64 not in r.stdout


@pytest.fixture(scope="module")
def drafter_gguf(tmp_path_factory, drafter, qwen3_target) -> Path:
    return convert(drafter, qwen3_target, outfile=tmp_path_factory.mktemp("faults-outputs") / "d.gguf", outtype="f16").output


def killed_partial(folder: Path, src: Path, name: str = "killed.gguf") -> Path:
    """The partial a quantize SIGKILLed while writing its data leaves in ``folder``."""
    r = cli("quantize", src, folder / name, "Q8_0", env={"DFLASH_CONVERT_FAULT": "data:SIGKILL"})
    assert r.returncode == -signal.SIGKILL and not (folder / name).exists()
    (partial,) = leftovers(folder)
    return folder / partial


@NEEDS_BOOT_ID
def test_a_sigkilled_writers_partial_is_removed_by_the_next_write_into_the_folder(tmp_path, drafter_gguf):
    partial = killed_partial(tmp_path, drafter_gguf)
    size = partial.stat().st_size
    assert re.fullmatch(rf"\.killed\.gguf\.\d+-{boot_tag()}-[0-9a-f]{{16}}" + re.escape(PARTIAL_SUFFIX), partial.name)
    r = cli("quantize", drafter_gguf, tmp_path / "other.gguf", "Q8_0", "-q")  # another output, and -q: still said
    assert r.returncode == 0 and (tmp_path / "other.gguf").is_file()
    (line,) = r.stderr.splitlines()
    m = REMOVED.fullmatch(line)
    assert m and m["path"] == str(partial) and int(m["size"]) == size, r.stderr
    assert partial.name.split(".")[3].startswith(m["pid"] + "-")
    assert leftovers(tmp_path) == []
    r = cli("quantize", drafter_gguf, tmp_path / "third.gguf", "Q8_0")  # said once: nothing left to say
    assert r.returncode == 0 and r.stderr == ""


@NEEDS_BOOT_ID
def test_a_partial_whose_pid_was_reused_is_still_removed(tmp_path, drafter_gguf):
    """The name's pid now belongs to a live process (this one): the free lock still proves the writer gone."""
    partial = killed_partial(tmp_path, drafter_gguf)
    reused = partial.with_name(re.sub(r"\.\d+-", f".{os.getpid()}-", partial.name, count=1))
    partial.rename(reused)
    r = cli("quantize", drafter_gguf, tmp_path / "o.gguf", "Q8_0", "-q")
    assert r.returncode == 0 and REMOVED.fullmatch(r.stderr.strip())["path"] == str(reused)
    assert leftovers(tmp_path) == []


@NEEDS_BOOT_ID
def test_a_live_writers_partial_is_left_alone(tmp_path, drafter_gguf):
    """A writer stopped before its rename still holds its lock: another run into the folder leaves its
    partial alone and says nothing; the writer, resumed, finishes."""
    out = tmp_path / "slow.gguf"
    env = dict(os.environ, DFLASH_CONVERT_FAULT="verify:SIGSTOP")
    slow = subprocess.Popen([sys.executable, "-m", "dflash_convert.cli", "quantize", str(drafter_gguf), str(out), "Q8_0", "-q"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not leftovers(tmp_path) or Path(f"/proc/{slow.pid}/stat").read_text().split()[2] != "T":
            assert time.monotonic() < deadline and slow.poll() is None, "the writer never reached its rename"
            time.sleep(0.05)
        before = leftovers(tmp_path)
        r = cli("quantize", drafter_gguf, tmp_path / "fast.gguf", "Q8_0")
        assert r.returncode == 0 and r.stderr == "" and leftovers(tmp_path) == before
    finally:
        slow.send_signal(signal.SIGCONT)
    _, err = slow.communicate(timeout=TIMEOUT)
    assert slow.returncode == 0 and err == "" and out.is_file() and leftovers(tmp_path) == []


@NEEDS_BOOT_ID
def test_partials_not_provably_abandoned_are_reported_and_left_then_cleared_with_force(tmp_path, drafter_gguf):
    """Another boot's (or host's) partial, a second link to one, a symbolic link with our name: each is
    reported as a dead run's leftover when it is beside the output, left in place, and --force removes it."""
    out = tmp_path / "k.gguf"
    partial = killed_partial(tmp_path, drafter_gguf, out.name)
    pid = partial.name.split(".")[3].split("-")[0]
    other_boot = "0" * 8 if boot_tag() != "0" * 8 else "f" * 8
    foreign = partial.with_name(partial.name.replace(f"-{boot_tag()}-", f"-{other_boot}-"))
    partial.rename(foreign)
    linked = tmp_path / f".{out.name}.{pid}-{boot_tag()}-{'a' * 16}{PARTIAL_SUFFIX}"
    shutil.copy(foreign, linked)
    os.link(linked, tmp_path / "a-second-name")
    planted = tmp_path / f".{out.name}.{pid}-{boot_tag()}-{'b' * 16}{PARTIAL_SUFFIX}"
    planted.symlink_to(drafter_gguf)
    left = leftovers(tmp_path)
    r = cli("quantize", drafter_gguf, out, "Q8_0")
    assert r.returncode == 0 and out.is_file() and leftovers(tmp_path) == left
    assert sorted(r.stderr.splitlines()) == sorted(
        f"dflash-convert: warning: {tmp_path / n} was left by a run that did not finish; remove it, or pass --force to "
        "have it removed" for n in left)
    r = cli("quantize", drafter_gguf, out, "Q8_0", "--force", "-q")
    assert r.returncode == 0 and leftovers(tmp_path) == [] and drafter_gguf.is_file()
    assert (tmp_path / "a-second-name").is_file()  # only our name was removed
