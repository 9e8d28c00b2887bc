"""Compare two GGUF files the way parity with upstream is judged (tests and bench/ use this).

Equal: the same non-general keys, types and values in the same order, and the same tensors (names,
order, shapes, types, bytes). general.* is compared too, but for our provenance keys, only with
``general``. Tensor data is compared chunk by chunk, in bounded memory.
"""

from __future__ import annotations

from pathlib import Path

from ..arrays import StrArray
from ..files import FdCache
from ..format.keys import GENERAL_PREFIX, is_provenance_key
from ..sources.gguf import GGUFTensor, read_gguf

CHUNK_BYTES = 16 << 20


def _same_bytes(x: GGUFTensor, y: GGUFTensor, fds: FdCache) -> bool:
    rows = x.n_elements // x.ne[0]
    step = max(1, CHUNK_BYTES // x.row_nbytes)
    for a in range(0, rows, step):
        b = min(rows, a + step)
        if x.rows(a, b, fds).tobytes() != y.rows(a, b, fds).tobytes():
            return False
    return True


def _compared(name: str, general: bool) -> bool:
    if is_provenance_key(name):
        return False
    return general or not name.startswith(GENERAL_PREFIX)


def differences(ours: str | Path, theirs: str | Path, *, general: bool = False) -> list[str]:
    """Human-readable differences; an empty list means parity (``general``: general.* compared too)."""
    diffs: list[str] = []
    a, b = read_gguf(ours), read_gguf(theirs)
    ka = [k for k in a.metadata if _compared(k, general)]
    kb = [k for k in b.metadata if _compared(k, general)]
    if set(ka) != set(kb):
        diffs.append(f"keys only in ours: {sorted(set(ka) - set(kb))}; only upstream: {sorted(set(kb) - set(ka))}")
    elif ka != kb:
        diffs.append(f"key order differs: ours {ka} vs upstream {kb}")
    for k in ka:
        if k not in b.metadata:
            continue
        x, y = a.metadata[k], b.metadata[k]
        if (x.vtype, x.sub) != (y.vtype, y.sub):
            diffs.append(f"{k}: type {x.vtype.name}/{x.sub} vs upstream {y.vtype.name}/{y.sub}")
        elif x.value != y.value:
            if isinstance(x.value, (list, StrArray)) and len(x.value) == len(y.value):
                i = next(i for i, (p, q) in enumerate(zip(x.value, y.value, strict=True)) if p != q)
                diffs.append(f"{k}: differs at [{i}]: {x.value[i]!r} vs upstream {y.value[i]!r}")
            else:
                diffs.append(f"{k}: {str(x.value)[:80]} vs upstream {str(y.value)[:80]}")
    ta, tb = [t.name for t in a.tensors], [t.name for t in b.tensors]
    if ta != tb:
        diffs.append(f"tensor names/order differ: ours {ta} vs upstream {tb}")
        return diffs
    with FdCache() as fds:
        for x, y in zip(a.tensors, b.tensors, strict=True):
            if x.ne != y.ne:
                diffs.append(f"{x.name}: shape {list(x.ne)} vs upstream {list(y.ne)}")
            elif x.ggml_type != y.ggml_type:
                diffs.append(f"{x.name}: type {x.ggml_type.name} vs upstream {y.ggml_type.name}")
            elif not _same_bytes(x, y, fds):
                diffs.append(f"{x.name}: data bytes differ")
    return diffs
