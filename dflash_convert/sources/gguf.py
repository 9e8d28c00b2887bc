"""The one place that parses GGUF files: bounds-checked before anything is allocated.

Every count and length read from the file is checked against the bytes that remain before it is
used, so a hostile file cannot make us allocate more than its own size or loop forever. Tensor
infos are checked for dimension count, element-count overflow, known types, block alignment,
data offsets (aligned, inside the file, non-overlapping) and sizes consistent with shape and type.
Errors are InputFileError with a message that says which field is wrong and where.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputFileError
from ..format.ggml import BLOCK_GEOMETRY, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLType
from ..format.keys import ValueType

MAX_DIMS = 4
MAX_STRING = 1 << 30
_SCALARS = {
    ValueType.UINT8: ("<B", 1), ValueType.INT8: ("<b", 1), ValueType.UINT16: ("<H", 2), ValueType.INT16: ("<h", 2),
    ValueType.UINT32: ("<I", 4), ValueType.INT32: ("<i", 4), ValueType.FLOAT32: ("<f", 4), ValueType.BOOL: ("<B", 1),
    ValueType.UINT64: ("<Q", 8), ValueType.INT64: ("<q", 8), ValueType.FLOAT64: ("<d", 8),
}
_NP = {
    ValueType.UINT8: "<u1", ValueType.INT8: "<i1", ValueType.UINT16: "<u2", ValueType.INT16: "<i2", ValueType.UINT32: "<u4",
    ValueType.INT32: "<i4", ValueType.FLOAT32: "<f4", ValueType.BOOL: "<u1", ValueType.UINT64: "<u8", ValueType.INT64: "<i8",
    ValueType.FLOAT64: "<f8",
}


@dataclass
class GGUFValue:
    vtype: ValueType
    value: Any  # python scalar, bytes for strings, list for arrays (strings as bytes)
    sub: ValueType | None = None

    def text(self) -> str:
        assert self.vtype == ValueType.STRING
        return self.value.decode("utf-8", "replace")


@dataclass
class GGUFTensor:
    name: str
    ne: tuple[int, ...]
    ggml_type: GGMLType
    offset: int  # absolute file offset
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, GGUFValue]
    tensors: list[GGUFTensor]
    alignment: int
    data_offset: int
    file_size: int
    _map: mmap.mmap | None = field(default=None, repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        v = self.metadata.get(key)
        if v is None:
            return default
        if v.vtype == ValueType.STRING:
            return v.text()
        if v.vtype == ValueType.ARRAY and v.sub == ValueType.STRING:
            return [s.decode("utf-8", "replace") for s in v.value]
        return v.value

    @property
    def architecture(self) -> str | None:
        return self.get("general.architecture")

    def tensor_bytes(self, t: GGUFTensor) -> np.ndarray:
        """The tensor's raw bytes (a read-only view of a memory map)."""
        if self._map is None:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if self.file_size else None
            finally:
                os.close(fd)
        assert self._map is not None
        return np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # views still alive; the map closes when they go
                pass
            self._map = None


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, msg: str) -> InputFileError:
        return InputFileError(f"{msg} (at byte {self.pos})", self.path)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"truncated: {what} needs {n} bytes, {len(self.buf) - self.pos} remain")

    def scalar(self, fmt: str, size: int, what: str) -> Any:
        self.need(size, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return v

    def u32(self, what: str) -> int:
        return self.scalar("<I", 4, what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", 8, what)

    def string(self, what: str) -> bytes:
        n = self.u64(f"{what} length")
        if n > MAX_STRING:
            raise self.fail(f"{what} length {n} is absurd")
        self.need(n, what)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s

    def value(self, vtype_raw: int, what: str, depth: int = 0) -> GGUFValue:
        try:
            vtype = ValueType(vtype_raw)
        except ValueError:
            raise self.fail(f"{what}: unknown value type {vtype_raw}") from None
        if vtype == ValueType.STRING:
            return GGUFValue(vtype, self.string(what))
        if vtype == ValueType.ARRAY:
            if depth:
                raise self.fail(f"{what}: nested arrays are not supported")
            sub_raw = self.u32(f"{what} element type")
            count = self.u64(f"{what} element count")
            try:
                sub = ValueType(sub_raw)
            except ValueError:
                raise self.fail(f"{what}: unknown array element type {sub_raw}") from None
            if sub == ValueType.ARRAY:
                raise self.fail(f"{what}: nested arrays are not supported")
            if sub == ValueType.STRING:
                # each string needs at least its 8-byte length: bound the count before looping
                self.need(count * 8, f"{what} ({count} strings)")
                return GGUFValue(vtype, [self.string(f"{what}[{i}]") for i in range(count)], sub)
            fmt, size = _SCALARS[sub]
            self.need(count * size, f"{what} ({count} items)")
            arr = np.frombuffer(self.buf, dtype=_NP[sub], count=count, offset=self.pos)
            self.pos += count * size
            items = arr.astype(bool).tolist() if sub == ValueType.BOOL else arr.tolist()
            return GGUFValue(vtype, items, sub)
        fmt, size = _SCALARS[vtype]
        v = self.scalar(fmt, size, what)
        return GGUFValue(vtype, bool(v) if vtype == ValueType.BOOL else v)


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse and validate a GGUF container (metadata and tensor table; data stays on disk)."""
    path = Path(path)
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            if size == 0:
                raise InputFileError("empty file, not GGUF", path)
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise InputFileError(f"cannot read: {e.strerror or e}", path) from e
    try:
        return _parse(memoryview(mm), path, size)
    finally:
        try:
            mm.close()
        except BufferError:
            pass


def _parse(buf: memoryview, path: Path, size: int) -> GGUFFile:
    c = _Cursor(buf, path)
    c.need(4, "magic")
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise InputFileError(f"not a GGUF file (magic {bytes(buf[:4])!r})", path)
    c.pos = 4
    version = c.u32("version")
    if version not in (2, 3):
        raise c.fail(f"unsupported GGUF version {version}")
    n_tensors = c.u64("tensor count")
    n_kv = c.u64("metadata count")
    # each KV needs >= 8 (key len) + 4 (type) + 1 bytes, each tensor info >= 8 + 4 + 8 + 4 + 8
    if n_kv * 13 > size - c.pos:
        raise c.fail(f"metadata count {n_kv} cannot fit in a {size}-byte file")
    if n_tensors * 32 > size - c.pos:
        raise c.fail(f"tensor count {n_tensors} cannot fit in a {size}-byte file")
    md: dict[str, GGUFValue] = {}
    for i in range(n_kv):
        key_raw = c.string(f"key #{i}")
        try:
            key = key_raw.decode("utf-8")
        except UnicodeDecodeError:
            raise c.fail(f"key #{i} is not UTF-8") from None
        if key in md:
            raise c.fail(f"duplicate metadata key {key!r}")
        md[key] = c.value(c.u32(f"type of {key}"), key)
    alignment = GGUF_DEFAULT_ALIGNMENT
    if "general.alignment" in md:
        a = md["general.alignment"]
        if a.vtype != ValueType.UINT32 or a.value <= 0 or a.value & (a.value - 1):
            raise InputFileError(f"general.alignment must be a power-of-two u32, got {a.value!r}", path)
        alignment = a.value
    infos = []
    names: set[str] = set()
    for i in range(n_tensors):
        raw_name = c.string(f"tensor #{i} name")
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            raise c.fail(f"tensor #{i} name is not UTF-8") from None
        if name in names:
            raise c.fail(f"duplicate tensor name {name!r}")
        names.add(name)
        n_dims = c.u32(f"{name} dimension count")
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        ne = tuple(c.u64(f"{name} dimension") for _ in range(n_dims))
        type_raw = c.u32(f"{name} type")
        offset = c.u64(f"{name} offset")
        infos.append((name, ne, type_raw, offset))
    data_offset = (c.pos + alignment - 1) // alignment * alignment
    if data_offset > size and n_tensors:
        raise InputFileError(f"truncated: tensor data would start at byte {data_offset}, file has {size}", path)
    tensors: list[GGUFTensor] = []
    for name, ne, type_raw, offset in infos:
        try:
            gtype = GGMLType(type_raw)
        except ValueError:
            raise InputFileError(f"tensor {name!r} has unknown ggml type {type_raw}", path) from None
        if gtype not in BLOCK_GEOMETRY:
            raise InputFileError(f"tensor {name!r} has unsupported ggml type {gtype.name}", path)
        n = 1
        for d in ne:
            if d <= 0:
                raise InputFileError(f"tensor {name!r} has a non-positive dimension in {list(ne)}", path)
            n *= d
            if n >= 1 << 62:
                raise InputFileError(f"tensor {name!r} element count overflows ({list(ne)})", path)
        block, bsize = BLOCK_GEOMETRY[gtype]
        if ne[0] % block:
            raise InputFileError(f"tensor {name!r}: ne[0]={ne[0]} is not a multiple of the {gtype.name} block size {block}", path)
        nbytes = n // block * bsize
        if offset % alignment:
            raise InputFileError(f"tensor {name!r} data offset {offset} is not aligned to {alignment}", path)
        start = data_offset + offset
        if start + nbytes > size:
            raise InputFileError(f"tensor {name!r} data [{start}, {start + nbytes}) runs past the end of the file ({size} bytes)", path)
        tensors.append(GGUFTensor(name, ne, gtype, start, nbytes))
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors)
    for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:], strict=False):
        if s1 < e0:
            raise InputFileError(f"tensor {n1!r} data overlaps tensor {n0!r}", path)
    return GGUFFile(path, version, md, tensors, alignment, data_offset, size)
