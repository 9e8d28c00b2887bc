"""Which DFlash dialect a GGUF speaks: upstream llama.cpp's, another fork's, or none at all."""

from __future__ import annotations

from dataclasses import dataclass

from ..format.dialects import DIALECTS, PRE_MERGE, UPSTREAM_ARCH, Dialect, dialect_for_arch
from ..format.keys import key
from ..format.rules import DRAFTER_ARCHS
from ..sources.gguf import GGUFFile
from .report import FAIL, PASS, Check

UPSTREAM = "upstream"
# tensor names no upstream dflash file has, but other dialects do: a DFlash-like file whatever its arch
_FOREIGN_MARKERS = frozenset(name for d in DIALECTS for name in d.tensor_map if "{bid}" not in name)


@dataclass
class DialectMatch:
    """The dialect ``detect`` found, with the message validate prints for it."""
    name: str | None  # UPSTREAM, a dialect name, or None when the file is no DFlash drafter
    dialect: Dialect | None  # the foreign dialect's table entry
    message: str
    is_drafter: bool

    @property
    def upstream(self) -> bool:
        """Whether the file is upstream's dialect."""
        return self.name == UPSTREAM


def layer_ids_key(g: GGUFFile, d: Dialect) -> str | None:
    """The full key that holds the tapped layer ids in a file of dialect ``d``, if it has one."""
    arch = g.architecture or ""
    return next((f"{arch}.{s}" for s in d.layer_ids_keys if f"{arch}.{s}" in g.metadata), None)


def detect(g: GGUFFile) -> DialectMatch:
    """Which dialect a GGUF file is written in: upstream's ``dflash``, another fork's, or no drafter at all."""
    arch = g.architecture
    if arch == UPSTREAM_ARCH:
        if key("target_layers") in g.metadata:
            return DialectMatch(UPSTREAM, None, f"upstream llama.cpp dflash ({key('architecture')} = dflash, "
                                f"{key('target_layers')} present)", True)
        return _foreign(g, PRE_MERGE)
    d = dialect_for_arch(arch)
    if d is not None:
        return _foreign(g, d)
    if arch is None:
        return DialectMatch(None, None, f"no {key('architecture')} (string): not a model file", False)
    names = {t.name for t in g.tensors}
    if names & _FOREIGN_MARKERS:
        return DialectMatch(f"unknown:{arch}", None, f"architecture {arch!r} with DFlash tensors "
                            f"({', '.join(sorted(names & _FOREIGN_MARKERS))}): a DFlash dialect this tool does not know; "
                            "convert the checkpoint again with dflash-convert convert", True)
    if arch in DRAFTER_ARCHS:
        return DialectMatch(None, None, f"an {arch} drafter, not DFlash (llama.cpp pairs it with --spec-type draft-{arch})", False)
    return DialectMatch(None, None, f"a {arch!r} model, not a DFlash drafter", False)


def _foreign(g: GGUFFile, d: Dialect) -> DialectMatch:
    where = layer_ids_key(g, d)
    if d.layer_offset is not None:
        ids = f"its layer ids ({where}) are upstream's minus {d.layer_offset}" if where else "it holds no layer ids"
    else:
        ids = (f"its layer ids ({where}) do not say which convention they follow" if where
               else "it holds no target layer ids at all")
    how = f"fix: {d.fix}" if d.migratable else f"migrate cannot rewrite it ({d.not_migratable_because}); fix: {d.fix}"
    msg = f"{d.title} dialect, written by {d.producer}; llama.cpp 0c1e57098 will not load it; {ids}; {how}"
    return DialectMatch(d.name, d, msg, True)


def dialect_check(match: DialectMatch) -> Check:
    """The ``dialect`` check: passes for upstream's dialect."""
    return Check("dialect", PASS if match.upstream else FAIL, match.message)
