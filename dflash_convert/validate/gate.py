"""The validate-before-rename gate: convert, migrate and quantize never leave behind a file that
their own validate fails. Used as ``write_gguf``'s ``verify`` hook; it keeps the report of the
finished temporary file, so a command that reports validation (migrate) validates once."""

from __future__ import annotations

from pathlib import Path

from ..errors import DFlashError
from . import validate
from .report import FAIL, Report


class ValidationGate:
    """``verify(tmp)``: validate's drafter checks on the finished temporary file; raises to refuse it."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.report: Report | None = None

    def __call__(self, tmp: Path) -> None:
        report = validate(tmp)
        report.file = self.out  # the report is of the file as it will be named
        self.report = report
        bad = [c for c in report.checks if c.status == FAIL]
        if bad:
            first = bad[0]
            detail = f": {first.details[0]}" if first.details else ""
            raise DFlashError(f"refusing to write a file that fails validate ({first.id}: {first.message}{detail}"
                              f"{f'; and {len(bad) - 1} more failing check(s)' if len(bad) > 1 else ''})", self.out)
