"""validate(): will this GGUF load and pair in llama.cpp 0c1e57098, and is it what it claims to be?

Checks by layer, each in its own module: the container (sources/gguf.py), the dialect, the
semantics, optionally a NaN/Inf scan and the pairing with a target. The file is parsed once and
read once leniently (``read_lenient``); ``report`` renders the results. Specification: docs/validate.md.
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
from .target import PairingTarget, pairing_target, target_checks

__all__ = ["Check", "PairingTarget", "Report", "pairing_target", "validate"]


def validate(path: str | os.PathLike, target: str | os.PathLike | PairingTarget | None = None, *, deep: bool = False,
             parsed: GGUFFile | None = None) -> Report:
    """Check one drafter GGUF; never raises for bad input (a fatal check says why instead)."""
    path = Path(path)
    target_path = None if target is None else target.path if isinstance(target, PairingTarget) else Path(target)
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
            checks += target_checks(reading, target if isinstance(target, PairingTarget) else target_path)
        return Report(path, target_path, checks, match.name)
    finally:
        if parsed is None:
            g.close()
