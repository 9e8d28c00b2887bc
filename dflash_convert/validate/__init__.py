"""validate(): will this GGUF load and pair in llama.cpp 0c1e57098, and is it what it claims to be?

Layers of checks, each in its own module: the container (sources/gguf.py, the bounds-checked
reader), the dialect (dialects.py), the semantics of an upstream dflash drafter (semantics.py),
optionally a NaN/Inf scan (numerics.py), and optionally the pairing with a target (target.py). The
file is parsed once, and read once leniently into a Drafter and the reader's findings
(``sources.gguf_drafter.read_lenient``); every check reads those.
Results are ``report.Check`` objects; ``report`` renders them for people and as JSON.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputFileError
from ..format.keys import ARCH
from ..sources.gguf import GGUFFile, read_gguf
from ..sources.gguf_drafter import read_lenient
from .dialects import detect, dialect_check
from .file_name import file_name_check
from .numerics import scan
from .report import FAIL, PASS, SKIP, Check, Report
from .semantics import Reading, semantic_checks, skipped_semantics
from .target import target_checks

__all__ = ["Check", "Report", "validate"]


def validate(path: str | os.PathLike, target: str | os.PathLike | None = None, *, deep: bool = False,
             parsed: GGUFFile | None = None) -> Report:
    """Check one drafter GGUF; never raises for bad input (a fatal check says why instead).

    ``parsed``: ``path`` already read by ``read_gguf`` (quantize has it in hand, and a vocabulary is
    not parsed twice); the caller keeps it open and closes it.
    """
    path = Path(path)
    target_path = None if target is None else Path(target)
    if parsed is not None:
        g = parsed
    else:
        try:
            g = read_gguf(path)
        except InputFileError as e:
            return Report(path, target_path, [Check("container", FAIL, str(e), fatal=True)])
    try:
        checks = [Check("container", PASS, f"GGUF v{g.version}, {len(g.metadata)} keys, {len(g.tensors)} tensors, "
                        f"data aligned to {g.alignment}, every bound checked")]
        match = detect(g)
        checks.append(dialect_check(match))
        if g.architecture != ARCH:
            reason = ("not a DFlash drafter" if not match.is_drafter
                      else f"the file is in the {match.name} dialect; run dflash-convert migrate first")
            checks += skipped_semantics(reason)
            checks.append(Check("numerics", SKIP, reason))
            if target_path is not None:
                checks.append(Check("target", SKIP, reason))
            return Report(path, target_path, checks, match.name)
        reading = Reading(*read_lenient(g))
        checks += semantic_checks(reading)
        checks.append(file_name_check(path, reading.d))
        if deep:
            checks.append(scan(g))
        else:
            checks.append(Check("numerics", SKIP, "NaN/Inf scan not run (pass --deep)"))
        if target_path is None:
            checks.append(Check("target", SKIP, "no --target: hidden size, tokenizer and layer range not checked against the target"))
        else:
            checks += target_checks(reading, target_path)
        return Report(path, target_path, checks, match.name)
    finally:
        if parsed is None:
            g.close()
