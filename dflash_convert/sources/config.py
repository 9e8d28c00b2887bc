"""The one typed reader of config values: config.json, its nested objects, tokenizer_config.json.

Every value is checked against ``format.config_keys.CONFIG_KEYS`` before use, so a wrong type is one
line naming the file, the key and both types, never read by truthiness (the string "false" is true
in Python). ``null`` is absent. Range checks (``int_``, ``float_``) sit on top.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..format.config_keys import (
    BOOL,
    CONFIG_KEYS,
    FLOAT,
    INT,
    LIST,
    LIST_ENTRY,
    OBJECT,
    STRING,
    TYPE_NAMES,
)
from ..format.keys import U32_MAX

F32_MAX = float(np.finfo(np.float32).max)
_READ: Any = object()  # int_/float_ without a value: read the key from the view


def as_f32(v: float) -> float:
    """The value GGUF will store (F32): keeping it in the Drafter makes GGUF round trips exact."""
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def json_type(v: Any) -> str:
    """The JSON type of a parsed value, as the table names it (a list's entries are not looked at)."""
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, int):
        return INT
    if isinstance(v, float):
        return FLOAT
    if isinstance(v, str):
        return STRING
    if isinstance(v, dict):
        return OBJECT
    if isinstance(v, list):
        return LIST
    return type(v).__name__


def is_type(v: Any, want: str) -> bool:
    """Whether a (non-null) value is of a table type: bool is not an int, an int is a FLOAT."""
    found = json_type(v)
    if want == FLOAT:
        return found in (INT, FLOAT)
    if want in LIST_ENTRY:
        return found == LIST and all(x is not None and is_type(x, LIST_ENTRY[want]) for x in v)
    return found == want


def describe(v: Any) -> str:
    """'a string ("false")': the JSON type found and the value, short."""
    found = json_type(v)
    if found == LIST and v and any(json_type(x) != json_type(v[0]) for x in v):
        name = "a list of mixed types"
    elif found == LIST and v:
        name = f"a list of {json_type(v[0])}s"
    else:
        name = TYPE_NAMES.get(found, found).split(" (")[0]
    text = json.dumps(v, default=str)
    return f"{name} ({text if len(text) <= 40 else text[:37] + '...'})"


def expected(name: str) -> tuple[str, ...]:
    """The types the table accepts for a key (an assertion for a key it lacks: a read of ours escaped it)."""
    assert name in CONFIG_KEYS, f"config key {name!r} is not in format/config_keys.py"
    want = CONFIG_KEYS[name]
    return want if isinstance(want, tuple) else (want,)


class ConfigView:
    """Typed access to one config object (a file, or an object inside one) with one-line errors."""

    def __init__(self, cfg: dict[str, Any], path: Path, scope: str = "") -> None:
        self.cfg, self.path, self.scope = cfg, Path(path), scope

    def error(self, msg: str) -> ConfigError:
        """A ConfigError naming this config file."""
        return ConfigError(msg, self.path)

    def _check(self, name: str, v: Any, label: str | None = None) -> Any:
        want = expected(name)
        if v is not None and not any(is_type(v, w) for w in want):
            raise self.error(f"{label or self.scope + name} is {describe(v)}, expected "
                             f"{' or '.join(TYPE_NAMES[w] for w in want)}")
        return v

    def get(self, name: str, default: Any = None) -> Any:
        """The key's value, of the table's type; ``default`` when absent or null."""
        v = self._check(name, self.cfg.get(name))
        return default if v is None else v

    def has(self, name: str) -> bool:
        """Present and not null (type-checked)."""
        return self.get(name) is not None

    def flag(self, name: str, default: bool = False) -> bool:
        """A JSON bool; never a truthiness reading of another type."""
        v = self.get(name)
        return default if v is None else bool(v)

    def first(self, names: Iterable[str]) -> Any:
        """The first of several spellings that is present (each type-checked as it is met)."""
        return next((v for v in (self.get(n) for n in names) if v is not None), None)

    def sub(self, name: str) -> ConfigView:
        """A nested object (empty when absent or null) as a view of its own."""
        v = self.get(name)
        return ConfigView(v if v is not None else {}, self.path, f"{self.scope}{name}.")

    def int_(self, key: str, value: Any = _READ, *, required: bool = True, minimum: int = 1, maximum: int = U32_MAX,
             written_as: str = "UINT32") -> int | None:
        """An integer config value, range-checked against the GGUF type it is written as (UINT32 unless said)."""
        v = self.get(key) if value is _READ else value
        if v is None:
            if required:
                raise self.error(f"missing required key {key!r}")
            return None
        if not is_type(v, INT):
            raise self.error(f"{key} is {describe(v)}, expected {TYPE_NAMES[INT]}")
        if v < minimum:
            raise self.error(f"{key} must be an integer >= {minimum}, got {v!r}")
        if v > maximum:
            raise self.error(f"{key} {v} does not fit: it is written as {written_as}, at most {maximum}")
        return v

    def float_(self, key: str, value: Any = _READ, *, required: bool = False) -> float | None:
        """A float config value (a JSON int counts), checked finite; None when absent and not required."""
        v = self.get(key) if value is _READ else value
        if v is None:
            if required:
                raise self.error(f"missing required key {key!r}")
            return None
        if not is_type(v, FLOAT):
            raise self.error(f"{key} is {describe(v)}, expected {TYPE_NAMES[FLOAT]}")
        if isinstance(v, int) and abs(v) > F32_MAX:  # float(v) itself would overflow for huge ints
            raise self.error(f"{key} {v} does not fit a GGUF FLOAT32 (largest finite value {F32_MAX:.4g})")
        f = as_f32(v)
        if not math.isfinite(f):
            raise self.error(f"{key} is {v!r}: it is written as FLOAT32, which must be finite (largest {F32_MAX:.4g})")
        return f

    def string(self, name: str, default: str | None = None) -> str | None:
        """A string config value, or ``default``."""
        v = self.get(name)
        return default if v is None else v

