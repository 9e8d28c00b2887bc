"""An ordered set of GGUF key/value pairs, typed from the key table.

Setting a key twice keeps its first position and takes the new value, which is what llama.cpp's
writer does; matching that keeps our key order identical to upstream's.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .arrays import StrArray
from .errors import DFlashError
from .format.keys import ARCH, BOOLEAN, FLOAT, INT, INT_TYPES, KEYS, VALUE_TYPES, ValueType


@dataclass(frozen=True)
class KV:
    """One GGUF key/value pair with its value type and an array's element type."""
    key: str
    vtype: ValueType
    value: Any
    sub: ValueType | None = None  # element type of an array


class Metadata:
    """Ordered GGUF metadata."""

    def __init__(self) -> None:
        self._kv: dict[str, KV] = {}

    def set(self, short: str, value: Any, arch: str = ARCH) -> None:
        """Set a key named in format.keys.KEYS, with the type the table gives it."""
        template, vtype, sub = KEYS[short]
        self.set_raw(template.format(arch=arch), vtype, value, sub)

    def set_raw(self, key: str, vtype: ValueType, value: Any, sub: ValueType | None = None) -> None:
        """Set a key with an explicit value type; refuses an empty array and a value out of its type's range."""
        if vtype == ValueType.ARRAY and not len(value):
            raise ValueError(f"empty array for {key}")  # GGUF arrays may not be empty in llama.cpp's writer
        self._kv[key] = KV(key, vtype, _coerce(vtype, value, sub, key), sub)

    def set_as_read(self, key: str, vtype: ValueType, value: Any, sub: ValueType | None = None) -> None:
        """Keep a value exactly as a reader found it: a file read back is described, not re-validated."""
        self._kv[key] = KV(key, vtype, value, sub)

    def kv(self, key: str) -> KV | None:
        """The key/value pair of ``key``, or None."""
        return self._kv.get(key)

    def remove(self, key: str) -> None:
        """Remove ``key`` if present."""
        self._kv.pop(key, None)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        kv = self._kv.get(key)
        return default if kv is None else kv.value

    def __contains__(self, key: str) -> bool:
        return key in self._kv

    def __iter__(self) -> Iterator[KV]:
        return iter(self._kv.values())

    def __len__(self) -> int:
        return len(self._kv)

    def keys(self) -> list[str]:
        """The keys in write order."""
        return list(self._kv)


_PYTHON_TYPE = {FLOAT: float, BOOLEAN: bool, INT: int}  # ValueTypeInfo.kind -> the Python type of a value


def _check_range(key: str, vtype: ValueType, values: Any) -> None:
    """Every integer must fit the type it is written as: refused here, before anything is written."""
    lo, hi = VALUE_TYPES[vtype].lowest, VALUE_TYPES[vtype].highest
    for v in values:
        if not lo <= v <= hi:
            raise DFlashError(f"{key} value {v} does not fit {vtype.name} ({lo} to {hi})")


F32_MAX = struct.unpack("<f", bytes.fromhex("ffff7f7f"))[0]  # the largest finite FLOAT32


def _check_f32(key: str, values: Any) -> None:
    """A finite value beyond FLOAT32's range cannot be written (struct refuses to pack it): refused here,
    before anything is written; inf and NaN pack as themselves."""
    for v in values:
        if math.isfinite(v) and abs(v) > F32_MAX:
            raise DFlashError(f"{key} value {v!r} does not fit FLOAT32 (largest finite value {F32_MAX:.6g})")


def _coerce(vtype: ValueType, value: Any, sub: ValueType | None, key: str = "") -> Any:
    if vtype == ValueType.ARRAY:
        assert sub is not None
        if sub == ValueType.STRING:
            # a string array read from a file stays compact: bytes are what a file holds, and its
            # 300k vocabulary items cost half a second as Python objects
            return value if isinstance(value, StrArray) else list(value)
        items = list(map(_PYTHON_TYPE[VALUE_TYPES[sub].kind], value))
        if sub in INT_TYPES:
            _check_range(key, sub, items)
        if sub == ValueType.FLOAT32:
            _check_f32(key, items)
        return items
    if vtype in INT_TYPES:
        _check_range(key, vtype, [int(value)])
    if vtype in (ValueType.FLOAT32, ValueType.FLOAT64):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > F32_MAX:
            raise DFlashError(f"{key} value {value} does not fit {vtype.name}")  # float() of it may itself overflow
        if vtype == ValueType.FLOAT32:
            _check_f32(key, [float(value)])
        return float(value)
    if vtype == ValueType.BOOL:
        return bool(value)
    if vtype == ValueType.STRING:
        return value
    return int(value)
