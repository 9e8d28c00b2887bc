"""inspect(): what a DFlash GGUF holds, and how to pair it with its target in llama.cpp."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputFileError
from .format.ggml import GGMLType
from .format.keys import ValueType


@dataclass
class TensorInfo:
    name: str
    ne: tuple[int, ...]
    ggml_type: str
    nbytes: int


@dataclass
class GGUFSummary:
    path: Path
    architecture: str | None
    metadata: dict[str, Any]
    value_types: dict[str, str]
    tensors: list[TensorInfo] = field(default_factory=list)

    @property
    def block_size(self) -> int:
        return int(self.metadata.get(f"{self.architecture}.block_size", 16))

    def pairing_hint(self) -> str:
        n_max = max(1, self.block_size - 1)
        return (f"llama-server -m TARGET.gguf -md {self.path} --spec-type draft-dflash "
                f"--spec-draft-n-max {n_max} -fa on")


def _value(field) -> Any:
    vtype = ValueType(int(field.types[0]))
    if vtype == ValueType.ARRAY:
        sub = ValueType(int(field.types[-1]))
        if sub == ValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if vtype == ValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", "replace")
    return field.parts[-1].tolist()[0]


def read_summary(path: str | Path) -> GGUFSummary:
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise InputFileError("no such file", path)
    try:
        reader = GGUFReader(path, "r")
    except Exception as e:
        raise InputFileError(f"not a readable GGUF file: {e}", path) from e
    md: dict[str, Any] = {}
    types: dict[str, str] = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        md[name] = _value(f)
        vt = ValueType(int(f.types[0]))
        types[name] = vt.name if vt != ValueType.ARRAY else f"ARRAY[{ValueType(int(f.types[-1])).name}]"
    tensors = []
    for t in reader.tensors:
        try:
            tname = GGMLType(int(t.tensor_type)).name
        except ValueError:
            tname = str(int(t.tensor_type))
        tensors.append(TensorInfo(t.name, tuple(int(x) for x in t.shape), tname, int(t.n_bytes)))
    return GGUFSummary(path, md.get("general.architecture"), md, types, tensors)


def short(value: Any, limit: int = 8) -> str:
    if isinstance(value, list):
        head = ", ".join(repr(v) if isinstance(v, str) else str(v) for v in value[:limit])
        return f"[{head}{', ...' if len(value) > limit else ''}] ({len(value)})"
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:57] + "...")
    return repr(value) if isinstance(value, str) else str(value)
