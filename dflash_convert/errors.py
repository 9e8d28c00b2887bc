"""One exception type for every problem a user can fix.

Messages are written for the user: the file, what is wrong, and where possible how to fix it.
The command layer turns a DFlashError into one line on stderr and a non-zero exit code.
"""

from __future__ import annotations

import os
from pathlib import Path

# Fault injection for the tests: DFLASH_CONVERT_FAULT="<phase>:<what>" (the writer's phases in write.py
# send a signal; "probe:AS=<bytes>" runs the tokenizer probe's child under that address-space limit)
FAULT_ENV = "DFLASH_CONVERT_FAULT"


def printable(text: str | os.PathLike) -> str:
    """``text`` (or a path) with the bytes of a name that is not UTF-8 written as ``\\xNN``."""
    s = os.fspath(text)
    if isinstance(s, bytes):
        return s.decode("utf-8", "backslashreplace")
    try:
        raw = s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte (from JSON, say)
        return s.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


class DFlashError(Exception):
    """A problem with the user's input or request, reported as one line."""

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = None if path is None else str(path)
        self.message = message
        super().__init__(printable(f"{self.path}: {message}" if self.path else message))


class InputFileError(DFlashError):
    """An input file is unreadable, corrupt or inconsistent (exit code 2 for readers)."""


class ConfigError(DFlashError):
    """A config value is missing or inconsistent; we refuse to guess."""


class OptionValueError(DFlashError):
    """An option's value is out of range, or two options contradict each other: the command line is wrong (exit 64)."""


class ResourceError(DFlashError):
    """The machine, not the input, stopped the command: out of memory, a full disk (exit code 1)."""


class RepoError(InputFileError):
    """A Hugging Face repo id that does not resolve to a complete snapshot (named as ``org/name@revision``)."""
