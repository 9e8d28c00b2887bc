"""Faults of the process: signals at every phase of a write (exit 130 / 143, nothing left, no traceback),
a reader of stdout that goes away (141), closed standard streams, children killed or out of memory,
an unforeseen exception (one line), and the exit codes of the README's table on every command.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import faults
import pytest
from faults import TIMEOUT, cli, leftovers, one_error_line

from dflash_convert import convert
from dflash_convert.validate import validate

drafter = faults.drafter  # the shared fixture


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

    from dflash_convert.errors import ResourceError
    from dflash_convert.tokenizer import probe

    for program, what in (("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL (the kernel's "
                                                                                       "out-of-memory killer, most likely)"),
                          ("import os, sys; sys.stderr.write('memory allocation of 8589934592 bytes failed\\n'); os.abort()",
                           "ran out of memory")):
        monkeypatch.setattr(probe, "child_command", lambda path, program=program: [sys.executable, "-c", program])
        with pytest.raises(ResourceError, match=re.escape(what)):
            probe.Probe(qwen3_target / "tokenizer.json").result()


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


COMMANDS = ("convert", "quantize", "validate", "migrate", "inspect", "check", "capture", "accept", "publish", "version",
            "imatrix")


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


def test_version_prints_the_program_and_its_version():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("dflash-convert ")


def test_help_shows_no_internal_type_names_and_says_when_an_option_is_needed():
    r = cli("convert", "--help")
    assert "<bool>" not in r.stdout and "unless --target-gguf" in r.stdout.replace("\n", " ").replace("  ", " ")


def test_quiet_convert_prints_nothing(tmp_path, drafter, qwen3_target):
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", tmp_path / "q.gguf", "-q")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
