"""Compare two GGUF files the way the parity tier demands.

Equal means: the same non-general keys with the same value types and values, in the same order;
the same tensor names in the same order, with the same shapes, ggml types and data bytes. Only
general.* may differ. (test_gguf_reader.py cross-checks our reader against gguf-py's.)
"""

from __future__ import annotations

from pathlib import Path

from dflash_convert.sources.gguf import read_gguf


def differences(ours: Path, theirs: Path) -> list[str]:
    """Human-readable differences; an empty list means parity."""
    diffs: list[str] = []
    a, b = read_gguf(ours), read_gguf(theirs)
    ka = [k for k in a.metadata if not k.startswith("general.")]
    kb = [k for k in b.metadata if not k.startswith("general.")]
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
            if isinstance(x.value, list) and len(x.value) == len(y.value):
                i = next(i for i, (p, q) in enumerate(zip(x.value, y.value, strict=True)) if p != q)
                diffs.append(f"{k}: differs at [{i}]: {x.value[i]!r} vs upstream {y.value[i]!r}")
            else:
                diffs.append(f"{k}: {str(x.value)[:80]} vs upstream {str(y.value)[:80]}")
    ta, tb = [t.name for t in a.tensors], [t.name for t in b.tensors]
    if ta != tb:
        diffs.append(f"tensor names/order differ: ours {ta} vs upstream {tb}")
        return diffs
    for x, y in zip(a.tensors, b.tensors, strict=True):
        if x.ne != y.ne:
            diffs.append(f"{x.name}: shape {list(x.ne)} vs upstream {list(y.ne)}")
        if x.ggml_type != y.ggml_type:
            diffs.append(f"{x.name}: type {x.ggml_type.name} vs upstream {y.ggml_type.name}")
        elif a.tensor_bytes(x).tobytes() != b.tensor_bytes(y).tobytes():
            diffs.append(f"{x.name}: data bytes differ")
    return diffs
