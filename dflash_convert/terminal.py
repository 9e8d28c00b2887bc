"""Text from files made safe to print: no byte a terminal acts on reaches it raw.

An escape sequence could rewrite what a user reads, a newline forge a line of our output.
``visible`` escapes every non-printable character (controls, line breaks, bidirectional overrides)
and undecodable path bytes; ``json_safe`` escapes what JSON leaves raw; ``human_size`` writes a byte
count. Specification: docs/validate.md, "Hostile files".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    o = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if 0xDC80 <= o <= 0xDCFF:  # surrogateescape: an undecodable byte of a file name
        return f"\\x{o - 0xDC00:02x}"
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def visible(text: object) -> str:
    """``text`` on one line with every non-printable character escaped."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in s)


def _json_escape(ch: str) -> str:
    o = ord(ch)
    if o < 0x10000:
        return f"\\u{o:04x}"
    o -= 0x10000
    return f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}"


def json_safe(doc: str) -> str:
    """A serialised JSON document with every non-printable character but its layout newlines
    escaped; the values it decodes to are unchanged (only strings can hold such characters)."""
    if all(line.isprintable() for line in doc.split("\n")):
        return doc
    return "".join(ch if ch == "\n" or ch.isprintable() else _json_escape(ch) for ch in doc)


def human_size(n: float) -> str:
    """A byte count as people read it: ``512 B``, ``1.5 KiB``, ... up to GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"



def short(value: Any, limit: int = 8) -> str:
    """A value in a few characters; strings as repr (escaped: nothing a terminal acts on, one line)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, tuple)):  # a list or a GGUF array
        items = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value[:limit]]
        head = ", ".join(repr(v) if isinstance(v, str) else str(v) for v in items)
        return f"[{head}{', ...' if len(value) > limit else ''}] ({len(value)})"
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:57] + "...")
    return repr(value) if isinstance(value, str) else str(value)
