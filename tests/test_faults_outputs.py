"""Faults of the outputs: what a killed or stopped writer leaves in the folder, and who removes it.

A writer holds an flock on its temporary file (``.<name>.<pid>-<boot>-<random>.dflash-partial``) for
its whole life. The next command that writes into the folder removes a partial of ours written in
this boot whose lock nobody holds, with one line (``-q`` or not); a live writer's partial, and any
partial it cannot prove abandoned (another boot or host, a link, not a regular file), is left and
reported as before, and removed with --force. Every writer here is a real child process.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cli_server
import pytest

from dflash_convert import convert
from dflash_convert.outputs import PARTIAL_SUFFIX, boot_tag
from fixtures.drafters import make_zlab_drafter

TIMEOUT = 60
REMOVED = re.compile(r"dflash-convert: warning: removed (?P<path>.+) \((?P<size>\d+) bytes\), left by a run "
                     r"\(pid (?P<pid>\d+)\) that was killed before it finished")

pytestmark = pytest.mark.skipif(boot_tag() is None, reason="no boot id on this system: partials are only reported")


def cli(*args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return cli_server.run(*args, env=dict(os.environ, **(env or {})), timeout=TIMEOUT)


def leftovers(folder: Path) -> list[str]:
    """Temporary files of ours (today's .dflash-partial names and earlier versions' .partial-<pid>)."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(PARTIAL_SUFFIX) or ".partial-" in p.name)


@pytest.fixture(scope="module")
def drafter_gguf(tmp_path_factory, qwen3_target) -> Path:
    root = tmp_path_factory.mktemp("faults-outputs")
    d = make_zlab_drafter(root / "draft", target_layer_ids=[0, 2])
    return convert(d, qwen3_target, outfile=root / "d.gguf", outtype="f16").output


def killed_partial(folder: Path, src: Path, name: str = "killed.gguf") -> Path:
    """The partial a quantize SIGKILLed while writing its data leaves in ``folder``."""
    r = cli("quantize", src, folder / name, "Q8_0", env={"DFLASH_CONVERT_FAULT": "data:SIGKILL"})
    assert r.returncode == -signal.SIGKILL and not (folder / name).exists()
    (partial,) = leftovers(folder)
    return folder / partial


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


def test_a_partial_whose_pid_was_reused_is_still_removed(tmp_path, drafter_gguf):
    """The name's pid now belongs to a live process (this one): the free lock still proves the writer gone."""
    partial = killed_partial(tmp_path, drafter_gguf)
    reused = partial.with_name(re.sub(r"\.\d+-", f".{os.getpid()}-", partial.name, count=1))
    partial.rename(reused)
    r = cli("quantize", drafter_gguf, tmp_path / "o.gguf", "Q8_0", "-q")
    assert r.returncode == 0 and REMOVED.fullmatch(r.stderr.strip())["path"] == str(reused)
    assert leftovers(tmp_path) == []


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
