"""Shared fixtures: target directories with real vocabularies, built once per session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

# pytest-xdist runs one worker per core: each worker's torch and command-line children get their share of the
# cores, so OpenMP threads of two workers do not contend for the same cores. Set before torch loads.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import cli_server  # noqa: E402
import pytest  # noqa: E402

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
    r = cli_server.run(*args)
    if args and str(args[0]) == "convert" and r.returncode == 0 and "--dry-run" not in map(str, args):
        m = _WROTE.search(r.stdout)
        if m:
            _check_conversion_output(Path(m.group(1)))
    return r


# --- every file the suite's conversions write must pass `dflash-convert validate` ------------------
#
# In-process conversions all write through dflash_convert.conversion.write_gguf, which the session
# fixture below wraps; command-line conversions go through run_cli above. Each output is validated
# (drafter-side checks, no target) right after it is written; any failing check is collected and
# the session fails at the end, naming the test and the file.

_WROTE = re.compile(r"^wrote (.+?) \(\d+ tensors", re.M)
_CONVERSION_FAILURES: list[str] = []
_CONVERSIONS_VALIDATED: list[Path] = []


def _check_conversion_output(path: Path) -> None:
    from dflash_convert.validate import validate

    report = validate(path)
    _CONVERSIONS_VALIDATED.append(path)
    for c in report.checks:
        if c.status == "fail" or c.fatal:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
            _CONVERSION_FAILURES.append(f"{test}: {path}: {c.id}: {c.message} {c.details}")


@pytest.fixture(scope="session", autouse=True)
def validate_every_conversion_output():
    from dflash_convert import conversion as converter

    original = converter.write_gguf

    def write_and_validate(out, *args, **kwargs):
        n = original(out, *args, **kwargs)
        _check_conversion_output(Path(out))
        return n

    converter.write_gguf = write_and_validate
    try:
        yield
    finally:
        converter.write_gguf = original
    assert not _CONVERSION_FAILURES, "conversion outputs that fail validate:\n" + "\n".join(_CONVERSION_FAILURES)


@pytest.fixture(params=["numba", "numpy"])
def quantizer_backend(request, monkeypatch) -> str:
    """Run a quantizer test with the numba kernels and with the pure-numpy fallback: both must give
    ggml's bytes. The numba leg is skipped where numba is not installed."""
    from dflash_convert.encoders import jit

    if request.param == "numba":
        if not jit.jit_available():
            pytest.skip("numba is not installed (or DFLASH_CONVERT_NO_JIT is set)")
    else:
        monkeypatch.setattr(jit, "kquant_kernels", lambda: None)
        monkeypatch.setattr(jit, "legacy_kernels", lambda: None)
        monkeypatch.setattr(jit, "iq3_kernels", lambda: None)
        monkeypatch.setattr(jit, "iq2_kernels", lambda: None)
    return request.param


# make test hands whole files to the workers in collection order (--dist loadfile --no-loadscope-reorder).
# These take minutes each (make test's --durations): started first, they run beside the many short files
# instead of after them, where one worker would finish them alone. The rest follow, most tests first.
LONG_FILES = ("test_gguf_capture.py", "test_trained_pair.py")


def pytest_collection_modifyitems(config, items) -> None:
    per_file: dict[str, int] = {}
    for item in items:
        per_file[item.path.name] = per_file.get(item.path.name, 0) + 1
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -per_file[item.path.name], str(item.path)))


# under pytest-xdist each worker validates its own conversions: the workers report their counts
# back (workeroutput) and the controller prints the sum
_WORKER_COUNTS: list[tuple[int, int]] = []


def pytest_sessionfinish(session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["conversions_validated"] = (len(_CONVERSIONS_VALIDATED), len(_CONVERSION_FAILURES))


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown where xdist is not installed
def pytest_testnodedown(node, error) -> None:
    counts = getattr(node, "workeroutput", {}).get("conversions_validated")
    if counts:
        _WORKER_COUNTS.append(tuple(counts))


def pytest_terminal_summary(terminalreporter) -> None:
    checked = len(_CONVERSIONS_VALIDATED) + sum(n for n, _ in _WORKER_COUNTS)
    bad = len(_CONVERSION_FAILURES) + sum(b for _, b in _WORKER_COUNTS)
    if checked:
        terminalreporter.write_line(f"dflash-convert validate: {checked} conversion outputs checked, "
                                    f"{bad} failing check(s)")
