"""How the command line prints: stdout lines escaped (terminal.visible), one error line on stderr.

Every line that may quote a file (a path, a key or tensor name, a value) is escaped, so it stays one
line and no escape sequence from a file reaches the terminal; a stderr that went away costs the line,
never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from ..errors import printable
from ..terminal import visible


def echo(text: str = "") -> None:
    """One line on stdout, as is (JSON, or text its producer escaped)."""
    sys.stdout.write(text + "\n")


def say(*lines: str | Iterable[str]) -> None:
    """Lines on stdout, each escaped; a list of lines counts as its lines."""
    for item in lines:
        for line in [item] if isinstance(item, str) else item:
            echo(visible(line))


def err(line: str) -> None:
    """One line on stderr, escaped; a stderr that went away costs the line, never a traceback."""
    try:
        sys.stderr.write(visible(printable(line)) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def error(message: object) -> None:
    """The error line: ``dflash-convert: error: MESSAGE``."""
    err(f"dflash-convert: error: {message}")
