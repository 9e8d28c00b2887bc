"""Shared fixtures: target directories with real vocabularies, built once per session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures.targets import make_target_dir  # noqa: E402


@pytest.fixture(scope="session")
def qwen3_target(tmp_path_factory) -> Path:
    """Dense Qwen3 target (config + real Qwen3 tokenizer), hidden 64, 4 layers."""
    return make_target_dir(tmp_path_factory.mktemp("targets") / "qwen3", "qwen3")


@pytest.fixture(scope="session")
def qwen35_target(tmp_path_factory) -> Path:
    """Hybrid Qwen3.5 target (linear + full attention, M-RoPE), hidden 64, 4 layers."""
    return make_target_dir(tmp_path_factory.mktemp("targets") / "qwen35", "qwen35")


def run_cli(*args: str | Path) -> subprocess.CompletedProcess:
    """Run the installed command line as a user would."""
    return subprocess.run([sys.executable, "-m", "dflash_convert.cli", *map(str, args)], capture_output=True, text=True)
