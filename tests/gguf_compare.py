"""Compare two GGUF files the way the parity tier demands.

Equal means: the same non-general keys with the same value types and values (in the same order),
the same tensor names in the same order, with the same shapes, ggml types and data bytes. Only
general.* may differ. Reads the raw file with gguf-py's reader (fine to use for tests).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader


def _fields(path: Path) -> list[tuple[str, tuple[int, ...], object]]:
    r = GGUFReader(path, "r")
    out = []
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name.startswith("general."):
            continue
        types = tuple(int(t) for t in f.types)
        if types[0] == 9:  # array
            value = [bytes(f.parts[i]) if types[-1] == 8 else f.parts[i].tolist()[0] for i in f.data]
        elif types[0] == 8:
            value = bytes(f.parts[-1])
        else:
            value = f.parts[-1].tolist()[0]
        out.append((name, types, value))
    return out


def differences(ours: Path, theirs: Path, *, check_general_order: bool = False) -> list[str]:
    """Human-readable differences; an empty list means parity."""
    diffs: list[str] = []
    a, b = _fields(ours), _fields(theirs)
    ka, kb = [x[0] for x in a], [x[0] for x in b]
    if set(ka) != set(kb):
        diffs.append(f"keys only in ours: {sorted(set(ka) - set(kb))}; only upstream: {sorted(set(kb) - set(ka))}")
    elif ka != kb:
        diffs.append(f"key order differs: ours {ka} vs upstream {kb}")
    bmap = {x[0]: x for x in b}
    for name, types, value in a:
        if name not in bmap:
            continue
        _, t2, v2 = bmap[name]
        if types != t2:
            diffs.append(f"{name}: type {types} vs upstream {t2}")
        elif value != v2:
            if isinstance(value, list) and isinstance(v2, list) and len(value) == len(v2):
                i = next(i for i, (x, y) in enumerate(zip(value, v2, strict=True)) if x != y)
                diffs.append(f"{name}: differs at [{i}]: {value[i]!r} vs upstream {v2[i]!r}")
            else:
                diffs.append(f"{name}: {str(value)[:80]} vs upstream {str(v2)[:80]}")
    ra, rb = GGUFReader(ours, "r"), GGUFReader(theirs, "r")
    ta, tb = [t.name for t in ra.tensors], [t.name for t in rb.tensors]
    if ta != tb:
        diffs.append(f"tensor names/order differ: ours {ta} vs upstream {tb}")
        return diffs
    for x, y in zip(ra.tensors, rb.tensors, strict=True):
        if list(x.shape) != list(y.shape):
            diffs.append(f"{x.name}: shape {list(x.shape)} vs upstream {list(y.shape)}")
        if int(x.tensor_type) != int(y.tensor_type):
            diffs.append(f"{x.name}: type {x.tensor_type.name} vs upstream {y.tensor_type.name}")
        elif not np.array_equal(np.asarray(x.data).view(np.uint8), np.asarray(y.data).view(np.uint8)):
            diffs.append(f"{x.name}: data bytes differ")
    return diffs
