"""What the tests of faults (tests/test_faults_*.py) share: the command line as a user runs it, with a
timeout (a command blocked on a FIFO would hang), the one-error-line rule, our temporary files left in a
folder, and a small drafter checkpoint and a GGUF that stands in for a target.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import cli_server
import pytest

from dflash_convert import convert
from dflash_convert.outputs import PARTIAL_SUFFIX
from fixtures.drafters import make_zlab_drafter

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

