"""validate's ``file_name`` check: would llama.cpp's ``-hf`` find this drafter by its file name?

A warning, never a failure: the file loads with ``-md`` whatever it is called; only a published
repository's ``-hf`` discovery depends on the name (format/file_names.py has the rule).
"""

from __future__ import annotations

from pathlib import Path

from ..drafter import Drafter
from ..format.family import DSPARK, member_of
from ..format.file_names import discovery_problem
from .report import PASS, WARN, Check

CHECK_ID = "file_name"


def name_problem(path: str | Path, drafter: Drafter) -> str | None:
    """The one-line warning for this drafter's file name, or None."""
    dspark = member_of({t.gguf_name for t in drafter.tensors}) == DSPARK
    type_name = drafter.origin.file_type_name
    return discovery_problem(Path(path).name, dspark=dspark, type_name=type_name)


def file_name_check(path: str | Path, drafter: Drafter) -> Check:
    """The ``file_name`` check: warns when llama.cpp's ``-hf`` would not find the file as a draft."""
    problem = name_problem(path, drafter)
    if problem is not None:
        return Check(CHECK_ID, WARN, problem)
    return Check(CHECK_ID, PASS, "llama.cpp's -hf finds the file as a draft by its name, never as a main model")
