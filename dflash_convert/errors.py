"""One exception type for every problem a user can fix.

Messages are written for the user: the file, what is wrong, and where possible how to fix it.
The command layer turns a DFlashError into one line on stderr and a non-zero exit code.
"""

from __future__ import annotations

from pathlib import Path


class DFlashError(Exception):
    """A problem with the user's input or request, reported as one line."""

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = None if path is None else str(path)
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path else message)


class InputFileError(DFlashError):
    """An input file is unreadable, corrupt or inconsistent (exit code 2 for readers)."""


class ConfigError(DFlashError):
    """A config value is missing or inconsistent; we refuse to guess."""
