"""Text from files made safe to print: no byte a terminal acts on reaches it raw.

Key names, string values, tensor names and paths come from files; printed raw, an escape sequence
can rewrite what a user reads and a newline can forge a line of our output (a ``result: PASS``
under a failing file). ``visible`` writes every character that is not printable (C0 and C1
controls, DEL, line breaks, bidirectional overrides, ...) as a Python-style escape, and the
undecodable bytes of a non-UTF-8 path as ``\\xNN``; printable text, non-ASCII letters included, is
unchanged. ``json_safe`` writes the characters JSON leaves raw as ``\\uXXXX`` escapes, which decode
to the same string.

Specification: docs/validate.md, "Hostile files".
"""

from __future__ import annotations

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
    """``text`` (a str, a Path, anything ``str`` takes) with every non-printable character escaped:
    one line, nothing a terminal interprets."""
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
