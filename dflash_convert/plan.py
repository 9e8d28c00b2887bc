"""The conversion plan: which ggml type each tensor gets, its GGUF shape and size, and its encoder.

Type rules come from the one table in format/rules.py (storage_class / storage_type), with the
converter's fallback (Q8_0 rows that are not whole blocks become F16, with a warning, as upstream).
"""

from __future__ import annotations

import logging

from .codecs import COPY, encoder
from .drafter import Drafter, DrafterTensor
from .format.ggml import BLOCK_GEOMETRY, OUTTYPES, FileType, GGMLType, tensor_nbytes
from .format.rules import CONVERT_FALLBACK, storage_type
from .pipeline import PlannedTensor

log = logging.getLogger("dflash_convert")

BLOCK_OF: dict[str, int] = {t.name: geometry[0] for t, geometry in BLOCK_GEOMETRY.items()}


def choose_file_type(outtype: str, first_matrix_dtype: str | None) -> tuple[FileType, GGMLType]:
    """--outtype -> (general.file_type, matrix type); auto follows the first >=2-D tensor's dtype."""
    if outtype == "auto":
        outtype = "bf16" if first_matrix_dtype == "BF16" else "f16"
    return OUTTYPES[outtype]


def tensor_type(name: str, shape: tuple[int, ...], matrix_type: GGMLType,
                fallback: dict[str, str] = CONVERT_FALLBACK) -> tuple[GGMLType, str]:
    name_of_type, note = storage_type(name, shape, matrix_type.name, fallback, BLOCK_OF)
    return GGMLType[name_of_type], note


def plan_tensor(t: DrafterTensor, ggml_type: GGMLType, note: str = "", *, copy: bool = False) -> PlannedTensor:
    """A PlannedTensor for ``t`` written as ``ggml_type`` (``copy``: bytes unchanged)."""
    ne = tuple(reversed(t.shape)) or (1,)
    return PlannedTensor(t, ggml_type, ne, tensor_nbytes(ggml_type, ne), COPY if copy else encoder(t.dtype, ggml_type), note)


def plan_tensors(d: Drafter, matrix_type: GGMLType) -> list[PlannedTensor]:
    out = []
    for t in d.tensors:
        ggml_type, note = tensor_type(t.gguf_name, t.shape, matrix_type)
        if note:
            log.warning("%s: %s", t.gguf_name, note)
        out.append(plan_tensor(t, ggml_type, note))
    return out
