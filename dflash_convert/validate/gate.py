"""The validate gates: convert, migrate and quantize never leave behind a file that their own validate
fails, and quantize refuses an input that fails it.

``ValidationGate`` is ``write_gguf``'s ``verify`` hook; it keeps the report of the finished temporary
file, so a command that reports validation (migrate) validates once. ``require_valid_input`` is the
input side (quantize): a file llama.cpp cannot run does not become another such file, with exit 0.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DFlashError
from ..sources.gguf import GGUFFile
from . import validate
from .report import FAIL, Report


def failure_summary(report: Report) -> str | None:
    """'id: message: first detail; and N more failing check(s)' for a failing report, None for a passing one."""
    bad = [c for c in report.checks if c.status == FAIL]
    if not bad:
        return None
    first = bad[0]
    detail = f": {first.details[0]}" if first.details else ""
    more = f"; and {len(bad) - 1} more failing check(s)" if len(bad) > 1 else ""
    return f"{first.id}: {first.message}{detail}{more}"


class ValidationGate:
    """``verify(tmp)``: validate's drafter checks on the finished temporary file; raises to refuse it."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.report: Report | None = None

    def __call__(self, tmp: Path) -> None:
        report = validate(tmp)
        report.file = self.out  # the report is of the file as it will be named
        self.report = report
        summary = failure_summary(report)
        if summary is not None:  # a message that names the temporary path names the output instead
            summary = summary.replace(os.fspath(tmp), os.fspath(self.out))
            raise DFlashError(f"refusing to write a file that fails validate ({summary})", self.out)


def require_valid_input(path: str | os.PathLike, skip_flag: str, *, parsed: GGUFFile | None = None) -> Report:
    """validate ``path``; raises (exit 1) naming the first failure and ``skip_flag``."""
    report = validate(path, parsed=parsed)
    summary = failure_summary(report)
    if summary is not None:
        raise DFlashError(f"refusing an input that fails validate ({summary}); fix the file, or pass {skip_flag} "
                          "to go ahead anyway", path)
    return report
