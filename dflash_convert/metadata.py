"""An ordered set of GGUF key/value pairs, typed from the key table.

Setting a key twice keeps its first position and takes the new value, which is what llama.cpp's
writer does; matching that keeps our key order identical to upstream's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .format.keys import KEYS, ValueType


@dataclass(frozen=True)
class KV:
    key: str
    vtype: ValueType
    value: Any
    sub: ValueType | None = None  # element type of an array


class Metadata:
    """Ordered GGUF metadata."""

    def __init__(self) -> None:
        self._kv: dict[str, KV] = {}

    def set(self, short: str, value: Any, arch: str = "dflash") -> None:
        """Set a key named in format.keys.KEYS, with the type the table gives it."""
        template, vtype, sub = KEYS[short]
        self.set_raw(template.format(arch=arch), vtype, value, sub)

    def set_raw(self, key: str, vtype: ValueType, value: Any, sub: ValueType | None = None) -> None:
        if vtype == ValueType.ARRAY and not len(value):
            raise ValueError(f"empty array for {key}")  # GGUF arrays may not be empty in llama.cpp's writer
        self._kv[key] = KV(key, vtype, _coerce(vtype, value, sub), sub)

    def remove(self, key: str) -> None:
        self._kv.pop(key, None)

    def get(self, key: str, default: Any = None) -> Any:
        kv = self._kv.get(key)
        return default if kv is None else kv.value

    def __contains__(self, key: str) -> bool:
        return key in self._kv

    def __iter__(self) -> Iterator[KV]:
        return iter(self._kv.values())

    def __len__(self) -> int:
        return len(self._kv)

    def keys(self) -> list[str]:
        return list(self._kv)


_ARRAY_ITEM = {ValueType.FLOAT32: float, ValueType.FLOAT64: float, ValueType.BOOL: bool}


def _coerce(vtype: ValueType, value: Any, sub: ValueType | None) -> Any:
    if vtype == ValueType.ARRAY:
        assert sub is not None
        if sub == ValueType.STRING:
            return list(value)
        return list(map(_ARRAY_ITEM.get(sub, int), value))
    if vtype in (ValueType.FLOAT32, ValueType.FLOAT64):
        return float(value)
    if vtype == ValueType.BOOL:
        return bool(value)
    if vtype == ValueType.STRING:
        return value
    return int(value)
