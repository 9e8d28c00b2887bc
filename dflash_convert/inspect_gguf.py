"""inspect: what a DFlash GGUF holds, and how to pair it with its target in llama.cpp.

The key and tensor listing shows the container as stored (that is what inspect is for); the
summary lines read the Drafter the lenient reader makes of the file (``read_lenient``), the same
reading validate judges.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .drafter import Drafter
from .format.family import DFLASH2, DSPARK, MARKOV_W1, SELECTOR_HIDDEN, SPEC_TYPES, draft_tokens_per_block, member_of
from .format.keys import ARCH, CHOSEN_KEYS, CHOSEN_TENSOR_TYPE, ValueType
from .format.rules import DEFAULT_BLOCK_SIZE
from .sources.gguf import GGUFFile, GGUFValue, read_gguf
from .sources.gguf_drafter import read_lenient
from .terminal import human_size, short, visible
from .validate.file_name import name_problem


@dataclass
class Summary:
    """What inspect shows: the file as stored, and the Drafter its lenient reading gives."""

    gguf: GGUFFile
    drafter: Drafter

    def lines(self) -> list[str]:
        """The keys and tensors as stored; for a dflash file, its member, how it was chosen and its pairing line."""
        g, d = self.gguf, self.drafter
        out = [f"file: {g.path}", f"architecture: {g.architecture}", f"keys ({len(g.metadata)}):"]
        out += [f"  {visible(k):<48} {type_name(v):<14} {short(v.value)}" for k, v in g.metadata.items()]
        out.append(f"tensors ({len(g.tensors)}, {human_size(sum(t.nbytes for t in g.tensors))}):")
        out += [f"  {visible(t.name):<32} {t.ggml_type.name:<6} {{{', '.join(map(str, t.ne))}}}  {human_size(t.nbytes)}"
                for t in g.tensors]
        if g.architecture != ARCH:
            return out
        out += [f"target layers (llama.cpp layer inputs): {d.target_layers}; block size: {block_size(d)}", member_line(d)]
        if (problem := file_name_warning(d)) is not None:  # with the summary, as validate reports it: not on stderr
            out.append(f"warning: {problem}")
        if (how := chosen_line(g)) is not None:
            out.append(how)
        return [*out, "pair with the target in llama.cpp:", f"  {pairing_hint(d)}"]


def read_summary(path: str | Path) -> Summary:
    """The parsed file and the Drafter its lenient reading gives."""
    g = read_gguf(path)
    return Summary(g, read_lenient(g)[0])


def type_name(v: GGUFValue) -> str:
    """A value's GGUF type as text, ``ARRAY[ELEMENT]`` for arrays."""
    return v.vtype.name if v.vtype != ValueType.ARRAY else f"ARRAY[{v.sub.name}]"  # type: ignore[union-attr]


def block_size(d: Drafter) -> int:
    """The drafter's block size, llama.cpp's default when the file has none."""
    return d.block_size if d.block_size is not None else DEFAULT_BLOCK_SIZE


def member(d: Drafter) -> tuple[str, str]:
    """(DFlash, DFlash2 or DSpark; the --spec-type llama.cpp runs it with), from the file's tensors."""
    m = member_of({t.gguf_name for t in d.tensors})
    return m, SPEC_TYPES[m]


def member_line(d: Drafter) -> str:
    """One line naming the family member and the speculative type, with the tensor that decides it."""
    m, spec = member(d)
    why = {DSPARK: f"{MARKOV_W1} present", DFLASH2: f"{SELECTOR_HIDDEN} present"}.get(m, "no Markov head, no selector")
    return f"drafter: {m} (llama.cpp runs it as --spec-type {spec}: {why})"


def file_name_warning(d: Drafter) -> str | None:
    """Why llama.cpp's -hf would not find this drafter by its file name (validate's file_name check), or None."""
    return name_problem(d.origin.path, d)


def chosen_line(g: GGUFFile) -> str | None:
    """How quantize --min-acceptance chose the file (format.keys.CHOSEN_KEYS), or None for another file."""
    def get(short: str) -> Any:
        v = g.metadata.get(CHOSEN_KEYS[short][0])
        return None if v is None else (v.value.decode("utf-8", "replace") if isinstance(v.value, bytes) else v.value)

    base = get("base_type")
    if base is None:
        return None
    n = get("tensor_type_count") or 0
    items = []
    for i in range(int(n)):
        v = g.metadata.get(CHOSEN_TENSOR_TYPE.format(i=i))
        if v is not None:
            items.append(v.value.decode("utf-8", "replace") if isinstance(v.value, bytes) else str(v.value))
    acc, ref, want = get("acceptance"), get("baseline_acceptance"), get("min_acceptance")
    rel = f" = {acc / ref:.4f} of the unquantized file's {ref:.4f}" if acc is not None and ref else ""
    recipe = " ".join(f"--tensor-type {i}" for i in items) or "the plain mix"
    return (f"chosen by acceptance (quantize --min-acceptance {want:.4g}): {base} with {recipe}; held-out accept "
            f"{acc:.4f}{rel} on {get('held_out_sequences')} sequences")


def pairing_hint(d: Drafter) -> str:
    """The llama-server line that pairs this drafter with its target (n-max from format/family.draft_tokens_per_block)."""
    m, spec = member(d)
    n_max = max(1, draft_tokens_per_block(m, block_size(d), d.sample_from_anchor))
    return f"llama-server -m TARGET.gguf -md {visible(d.origin.path)} --spec-type {spec} --spec-draft-n-max {n_max} -fa on"
