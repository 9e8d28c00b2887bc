"""Read a prompts file (``capture``'s input): one prompt per line, or JSONL; every check of that input here.

Lines end at "\n" only ("\r\n" tolerated). ``.jsonl``/``.json`` is JSONL, ``.txt`` plain text, any
other name JSONL when its first non-blank line is a JSON string or object; a JSONL line must be a
string or an object with a "prompt" (or "text") string. UTF-8, at most MAX_PROMPTS_BYTES.
Specification: docs/acceptance.md, "capture".
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputFileError
from ..files import parse_json, read_regular_bytes

MAX_PROMPTS_BYTES = 64 << 20
JSONL_SUFFIXES, TEXT_SUFFIXES = (".jsonl", ".json"), (".txt",)


def prompt_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each non-blank line, split on "\\n" alone, a trailing "\\r" dropped."""
    out = []
    for n, ln in enumerate(text.split("\n"), 1):
        ln = ln[:-1] if ln.endswith("\r") else ln
        if ln.strip():
            out.append((n, ln))
    return out


def is_jsonl(path: Path, lines: list[tuple[int, str]]) -> bool:
    """Whether the file is JSONL: by its suffix, else by its first non-blank line."""
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES or suffix in TEXT_SUFFIXES:
        return suffix in JSONL_SUFFIXES
    if not lines:
        return False
    try:
        first = json.loads(lines[0][1])
    except (ValueError, RecursionError):
        return False
    return isinstance(first, (str, dict))


def read_prompts(path: str | Path) -> list[str]:
    """One prompt per line, or JSONL (a string, or an object with "prompt" or "text", per line); blank lines skipped."""
    path = Path(path)
    raw = read_regular_bytes(path, "prompts file", MAX_PROMPTS_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"prompts file is not UTF-8 text (byte {e.start})", path) from None
    lines = prompt_lines(text.removeprefix("\ufeff"))
    if not is_jsonl(path, lines):
        prompts = [ln for _, ln in lines]
    else:
        prompts = []
        for n, ln in lines:
            v = parse_json(ln, f"line {n}", path)
            if isinstance(v, dict):
                v = v.get("prompt", v.get("text"))
            if not isinstance(v, str) or not v:
                raise InputFileError(f"line {n}: expected a string, or an object with a \"prompt\" string (the file "
                                     "is JSONL)", path)
            prompts.append(v)
    if not prompts:
        raise InputFileError("prompts file holds no prompt", path)
    return prompts
