"""inspect(): what a DFlash GGUF holds, and how to pair it with its target in llama.cpp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .format.family import DFLASH2, DSPARK, MARKOV_W1, SELECTOR_HIDDEN, SPEC_TYPES, draft_tokens_per_block, member_of
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


def member(g: GGUFFile) -> tuple[str, str]:
    """(DFlash, DFlash2 or DSpark; the --spec-type llama.cpp runs it with), from the file's tensors."""
    m = member_of({t.name for t in g.tensors})
    return m, SPEC_TYPES[m]


def member_line(g: GGUFFile) -> str:
    """One line naming the family member and the speculative type, with the tensor that decides it."""
    m, spec = member(g)
    why = {DSPARK: f"{MARKOV_W1} present", DFLASH2: f"{SELECTOR_HIDDEN} present"}.get(m, "no Markov head, no selector")
    return f"drafter: {m} (llama.cpp runs it as --spec-type {spec}: {why})"


def pairing_hint(g: GGUFFile) -> str:
    """The llama-server line that pairs this drafter with its target, with the member's speculative type;
    n-max is block_size - 1 (the anchor slot), or block_size for DSpark sampling from the anchor."""
    m, spec = member(g)
    sfa = g.metadata.get(key("sample_from_anchor", g.architecture or ARCH))
    n_max = max(1, draft_tokens_per_block(m, block_size(g), None if sfa is None else bool(sfa.value)))
    return f"llama-server -m TARGET.gguf -md {g.path} --spec-type {spec} --spec-draft-n-max {n_max} -fa on"


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
