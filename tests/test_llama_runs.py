"""fixtures.llama_runs: a run is kept by the bytes it reads, and run again when any of them changes.

A stand-in tool (a shell script that prints its input file and counts its own runs in a file) plays
llama-speculative-simple; the cache is a temporary DFLASH_CONVERT_CACHE.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from fixtures import llama_runs
from fixtures.llama_runs import FRESH_ENV, KEEP_DAYS, kept_run


@pytest.fixture
def tool(tmp_path, monkeypatch) -> dict[str, Path]:
    monkeypatch.setenv("DFLASH_CONVERT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(FRESH_ENV, raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "tool"
    runs = tmp_path / "runs.log"
    exe.write_text(f'#!/bin/sh\necho run >> {runs}\ncat "$2"\necho "{{$1}}" >&2\n[ "$1" != fail ]\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    (bin_dir / "libtool.so.0").write_bytes(b"library one")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"model bytes one\n")
    return {"exe": exe, "runs": runs, "model": model, "lib": bin_dir / "libtool.so.0", "cache": tmp_path / "cache"}


def _run(t: dict[str, Path], flag: str = "-v"):
    return kept_run([str(t["exe"]), flag, str(t["model"])], [t["model"]], timeout=30)


def _count(t: dict[str, Path]) -> int:
    return len(t["runs"].read_text().splitlines()) if t["runs"].exists() else 0


def test_a_run_is_kept_and_read_back_byte_for_byte(tool):
    first = _run(tool)
    assert (first.returncode, first.stdout, first.stderr, first.kept) == (0, b"model bytes one\n", b"{-v}\n", False)
    again = _run(tool)
    assert (again.returncode, again.stdout, again.stderr, again.kept) == (0, b"model bytes one\n", b"{-v}\n", True)
    assert _count(tool) == 1


@pytest.mark.parametrize("change", ["input", "argument", "library", "executable"])
def test_any_change_to_what_it_reads_runs_it_again(tool, change):
    _run(tool)
    flag = "-v"
    if change == "input":
        tool["model"].write_bytes(b"model bytes two\n")
    elif change == "argument":
        flag = "-vv"
    elif change == "library":
        tool["lib"].write_bytes(b"library two")
    else:
        tool["exe"].write_text(tool["exe"].read_text() + "true\n")
    got = _run(tool, flag)
    assert not got.kept and _count(tool) == 2
    assert got.stdout == tool["model"].read_bytes()


def test_a_moved_input_with_the_same_bytes_is_the_same_run(tool):
    _run(tool)
    moved = tool["model"].with_name("elsewhere.gguf")
    moved.write_bytes(tool["model"].read_bytes())
    got = kept_run([str(tool["exe"]), "-v", str(moved)], [moved], timeout=30)
    assert got.kept and got.stdout == b"model bytes one\n" and _count(tool) == 1


def test_failures_are_not_kept_and_torn_entries_run_again(tool, monkeypatch):
    assert _run(tool, "fail").returncode == 1 and _run(tool, "fail").returncode == 1 and _count(tool) == 2
    _run(tool)
    [entry] = (tool["cache"] / "runs").glob("*.json")
    entry.write_text(entry.read_text()[:20])  # a torn write
    assert not _run(tool).kept and _count(tool) == 4
    assert _run(tool).kept and _count(tool) == 4  # whole again
    monkeypatch.setenv(FRESH_ENV, "1")
    assert not _run(tool).kept and _count(tool) == 5


def test_entries_unread_for_keep_days_go_when_a_run_is_next_kept(tool, monkeypatch):
    import os
    import time

    _run(tool)
    [old] = (tool["cache"] / "runs").glob("*.json")
    stale = time.time() - (KEEP_DAYS + 1) * 86400
    os.utime(old, (stale, stale))
    monkeypatch.setattr(llama_runs, "_pruned", set())  # a new process
    _run(tool, "-x")  # another key, kept: the stale entry goes
    assert not old.exists() and len(list((tool["cache"] / "runs").glob("*.json"))) == 1
    _run(tool, "-x")
    [kept] = (tool["cache"] / "runs").glob("*.json")
    os.utime(kept, (stale, stale))
    assert _run(tool, "-x").kept and kept.stat().st_mtime > time.time() - 60  # a read keeps it fresh
