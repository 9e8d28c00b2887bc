"""inspect(): what a DFlash GGUF holds, and how to pair it with its target in llama.cpp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .format.keys import ARCH, ValueType, key
from .format.rules import DEFAULT_BLOCK_SIZE
from .sources.gguf import GGUFFile, NumArray, read_gguf


def read_summary(path: str | Path) -> GGUFFile:
    return read_gguf(path)


def type_name(g: GGUFFile, key: str) -> str:
    v = g.metadata[key]
    return v.vtype.name if v.vtype != ValueType.ARRAY else f"ARRAY[{v.sub.name}]"  # type: ignore[union-attr]


def block_size(g: GGUFFile) -> int:
    return int(g.get(key("block_size", g.architecture or ARCH), DEFAULT_BLOCK_SIZE))


def pairing_hint(g: GGUFFile) -> str:
    """The llama-server line that pairs this drafter with its target; n-max = block_size - 1."""
    n_max = max(1, block_size(g) - 1)
    return f"llama-server -m TARGET.gguf -md {g.path} --spec-type draft-dflash --spec-draft-n-max {n_max} -fa on"


def short(value: Any, limit: int = 8) -> str:
    if isinstance(value, (list, NumArray)):
        items = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value[:limit]]
        head = ", ".join(repr(v) if isinstance(v, str) else str(v) for v in items)
        return f"[{head}{', ...' if len(value) > limit else ''}] ({len(value)})"
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:57] + "...")
    return repr(value) if isinstance(value, str) else str(value)
