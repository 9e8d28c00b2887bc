"""Check results and their two renderings: one line per check for people, a JSON document for CI.

Every check has a stable id, a status (``pass``, ``warn``, ``fail``, ``skip``) and one line saying
what was found; ``details`` lists the findings behind a warn or fail. JSON schema:
``validate.schema.json`` next to this module, version ``SCHEMA_ID``. Specification: docs/validate.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..terminal import json_safe, visible

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
STATUSES = (PASS, WARN, FAIL, SKIP)
SCHEMA_ID = "dflash-convert/validate/v1"
SCHEMA_FILE = Path(__file__).with_name("validate.schema.json")
LLAMA_CPP_COMMIT = "0c1e57098"
MAX_DETAILS = 50  # longer lists are cut, with a last line saying how many more there were


@dataclass
class Check:
    """One check's outcome: its id, status (pass, warn, fail, skip), message and details."""
    id: str
    status: str
    message: str
    details: list[str] = field(default_factory=list)
    fatal: bool = False  # an input could not be read at all (exit code 2)

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status
        if len(self.details) > MAX_DETAILS:
            extra = len(self.details) - MAX_DETAILS + 1
            self.details = [*self.details[:MAX_DETAILS - 1], f"... and {extra} more"]


def passed(id_: str, message: str) -> Check:
    """A passing check."""
    return Check(id_, PASS, message)


def check_from(id_: str, problems: list[str], warnings: list[str], ok: str, bad: str, suspicious: str) -> Check:
    """fail with the problems if any, else warn with the warnings if any, else pass."""
    if problems:
        return Check(id_, FAIL, bad, problems + warnings)
    if warnings:
        return Check(id_, WARN, suspicious, warnings)
    return Check(id_, PASS, ok)


@dataclass
class Report:
    """validate's result for one file: its checks, the exit code they give, and the text and JSON renderings."""
    file: Path
    target: Path | None
    checks: list[Check]
    dialect: str | None = None

    @property
    def exit_code(self) -> int:
        """0 when every check passed, 1 when one failed, 2 when the file could not be read."""
        if any(c.fatal for c in self.checks):
            return 2
        return 1 if any(c.status == FAIL for c in self.checks) else 0

    @property
    def result(self) -> str:
        """``pass``, ``fail`` or ``error``, from the exit code."""
        return {0: "pass", 1: "fail", 2: "error"}[self.exit_code]

    def counts(self) -> dict[str, int]:
        """How many checks have each status."""
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def check(self, id_: str) -> Check | None:
        """The check with this id, or None."""
        return next((c for c in self.checks if c.id == id_), None)

    def failures(self) -> list[Check]:
        """The failing checks."""
        return [c for c in self.checks if c.status == FAIL]

    def error_line(self) -> str | None:
        """The one line that says why an input could not be read (exit code 2), else None."""
        fatal = next((c for c in self.checks if c.fatal), None)
        return None if fatal is None else fatal.message

    def to_json(self) -> dict[str, Any]:
        """The report as the ``dflash-convert/validate/v1`` JSON object."""
        return {
            "schema": SCHEMA_ID,
            "file": str(self.file),
            "target": None if self.target is None else str(self.target),
            "llama_cpp": LLAMA_CPP_COMMIT,
            "result": self.result,
            "exit_code": self.exit_code,
            "dialect": self.dialect,
            "summary": self.counts(),
            "checks": [{"id": c.id, "status": c.status, "message": c.message, "details": list(c.details)}
                       for c in self.checks],
        }


def render_json(report: Report) -> str:
    """The JSON document, values exact (``json_safe`` only escapes what JSON leaves raw)."""
    return json_safe(json.dumps(report.to_json(), indent=2, ensure_ascii=False))


def render_text(report: Report) -> str:
    """One line per check and per detail, everything quoted from the file through ``visible`` (no forged or hidden line)."""
    width = max((len(c.id) for c in report.checks), default=10)
    lines = [f"validate {visible(report.file)}" + (f" against {visible(report.target)}" if report.target else "")]
    for c in report.checks:
        lines.append(f"  {c.status:<4}  {c.id:<{width}}  {visible(c.message)}")
        lines.extend(f"  {'':<4}  {'':<{width}}    - {visible(d)}" for d in c.details)
    n = report.counts()
    lines.append(f"result: {report.result.upper()} ({n[FAIL]} fail, {n[WARN]} warn, {n[PASS]} pass, {n[SKIP]} skipped)")
    return "\n".join(lines)
