"""The one place that parses GGUF files: bounds-checked before anything is allocated.

Every count and length is checked against the bytes that remain before it is used, so a hostile
file cannot make us allocate more than its size or loop forever. Refused, as an ``InputFileError``
naming the field and offset: every file ``gguf_init_from_file`` refuses and a few it would mis-read
(one hand-made file per message in tests/test_gguf_reader.py). Specification: docs/validate.md,
"The GGUF reader".
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import NumArray, StrArray, known_at, remember
from ..errors import InputFileError
from ..files import FdCache, open_regular, pread_into
from ..format.ggml import (
    BLOCK_GEOMETRY,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_TYPE_COUNT,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_MAX_ARRAY_ELEMENTS,
    GGUF_MAX_STRING_LENGTH,
    GGUF_VERSION,
    REMOVED_TYPES,
    GGMLType,
)
from ..format.keys import BOOLEAN, VALUE_TYPES, ValueType, key

MAX_DIMS = GGML_MAX_DIMS
INT64_MAX = (1 << 63) - 1
ALIGNMENT_KEY = key("alignment")
# the most keys and tensors read: each costs far more as Python objects than in the file, and real
# files hold tens of keys and at most a few thousand tensors
MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
# smallest possible encodings, used to bound counts by the bytes that remain
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, 1-byte key, type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, 1-byte name, n_dims, one dim, type, offset


@dataclass
class GGUFValue:
    """One metadata value: its GGUF type, the value, and an array's element type."""
    vtype: ValueType
    value: Any  # python scalar; bytes for strings; NumArray for numeric arrays; StrArray for string arrays
    sub: ValueType | None = None

    def text(self) -> str:
        """A string value as text (invalid UTF-8 replaced)."""
        assert self.vtype == ValueType.STRING
        return self.value.decode("utf-8", "replace")


# ggml element types read as raw words (the same word types the safetensors reader uses); every
# other type is read as block bytes
_WORDS: dict[GGMLType, str] = {
    GGMLType.F32: "<f4", GGMLType.F16: "<f2", GGMLType.BF16: "<u2", GGMLType.F64: "<f8",
    GGMLType.I8: "i1", GGMLType.I16: "<i2", GGMLType.I32: "<i4", GGMLType.I64: "<i8",
}


@dataclass
class GGUFTensor:
    """A tensor of a parsed GGUF file; also a TensorSource (rows are read on demand, never mapped)."""

    name: str
    ne: tuple[int, ...]
    ggml_type: GGMLType
    offset: int  # absolute file offset
    nbytes: int
    path: Path | None = field(default=None, repr=False)

    @property
    def n_elements(self) -> int:
        """The number of elements of the tensor."""
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def shape(self) -> tuple[int, ...]:
        """PyTorch order: ne reversed."""
        return tuple(reversed(self.ne))

    @property
    def dtype(self) -> str:
        """The ggml type's name."""
        return self.ggml_type.name

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row of the tensor."""
        block, size = BLOCK_GEOMETRY[self.ggml_type]
        return self.ne[0] // block * size

    def rows(self, a: int, b: int, fds: FdCache | None = None) -> np.ndarray:
        """Rows [a, b) as raw words (float and integer types) or block bytes (quantized types)."""
        assert self.path is not None
        n_rows = self.n_elements // self.ne[0]
        if not 0 <= a <= b <= n_rows:
            raise ValueError(f"read of {self.name}: rows [{a}, {b}) out of range")
        want = (b - a) * self.row_nbytes
        out = np.empty(want, dtype=np.uint8)
        got = pread_into(self.path, fds, memoryview(out), self.offset + a * self.row_nbytes)
        if got != want:
            raise InputFileError(f"tensor {self.name!r} is truncated (the file shrank after it was read)", self.path)
        words = _WORDS.get(self.ggml_type)
        return out.view(words) if words else out


@dataclass
class GGUFFile:
    """A parsed GGUF file: its version, key/value metadata, tensor table and where the tensor data starts."""
    path: Path
    version: int
    metadata: dict[str, GGUFValue]
    tensors: list[GGUFTensor]
    alignment: int
    data_offset: int
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        """A value as plain Python: str for strings, list for arrays (strings decoded)."""
        v = self.metadata.get(key)
        if v is None:
            return default
        if v.vtype == ValueType.STRING:
            return v.text()
        if v.vtype == ValueType.ARRAY:
            if v.sub == ValueType.STRING:
                return v.value.texts()
            return v.value.tolist()
        return v.value

    @property
    def architecture(self) -> str | None:
        """``general.architecture``, or None when absent or not a string."""
        arch = self.metadata.get(key("architecture"))
        return arch.text() if arch is not None and arch.vtype == ValueType.STRING else None

    def tensor(self, name: str) -> GGUFTensor | None:
        """The tensor with this name, or None."""
        return next((t for t in self.tensors if t.name == name), None)

    def tensor_bytes(self, t: GGUFTensor) -> np.ndarray:
        """The tensor's raw bytes, read into memory (for small tensors; stream big ones with t.rows)."""
        return t.rows(0, t.n_elements // t.ne[0]).view(np.uint8)

    def close(self) -> None:
        """Nothing stays open: tensor data is read by position on demand."""


_PAGE = mmap.PAGESIZE
_RELEASE_EVERY = 4 << 20  # hand mapped pages back in steps of this many bytes
assert _RELEASE_EVERY <= GGUF_MAX_STRING_LENGTH  # strings() relies on it to see an over-long length


class _Cursor:
    def __init__(self, buf: memoryview, path: Path, mm: mmap.mmap | None = None) -> None:
        self.buf, self.pos, self.path = buf, 0, path
        self.mm, self.released = mm, 0  # pages before ``released`` are handed back to the kernel

    def release(self) -> None:
        """Hand back the mapped pages the parser has passed (their values are copied out); a no-op without madvise."""
        end = self.pos // _PAGE * _PAGE
        if self.mm is None or end - self.released < _RELEASE_EVERY or not hasattr(self.mm, "madvise"):
            return
        try:
            self.mm.madvise(mmap.MADV_DONTNEED, self.released, end - self.released)
        except (OSError, ValueError, AttributeError):  # not supported here: memory is still bounded, by 2x
            self.mm = None
            return
        self.released = end

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
        if n > GGUF_MAX_STRING_LENGTH:
            raise self.fail(f"{what} length {n} exceeds llama.cpp's limit of {GGUF_MAX_STRING_LENGTH} bytes")
        self.need(n, what)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s

    def value(self, vtype_raw: int, what: str) -> GGUFValue:
        try:
            vtype = ValueType(vtype_raw)
        except ValueError:
            raise self.fail(f"{what}: unknown value type {vtype_raw}") from None
        if vtype == ValueType.STRING:
            return GGUFValue(vtype, self.string(what))
        if vtype == ValueType.ARRAY:
            return self.array(what)
        info = VALUE_TYPES[vtype]
        v = self.scalar(info.fmt, info.size, what)
        if info.kind == BOOLEAN:
            if v > 1:
                raise self.fail(f"{what}: bool value {v} is neither 0 nor 1")
            v = bool(v)
        return GGUFValue(vtype, v)

    def array(self, what: str) -> GGUFValue:
        sub_raw = self.u32(f"{what} element type")
        try:
            sub = ValueType(sub_raw)
        except ValueError:
            raise self.fail(f"{what}: unknown array element type {sub_raw}") from None
        if sub == ValueType.ARRAY:
            raise self.fail(f"{what}: nested arrays are not supported")
        count = self.u64(f"{what} element count")
        if count > GGUF_MAX_ARRAY_ELEMENTS:
            raise self.fail(f"{what}: array of {count} elements exceeds llama.cpp's limit of {GGUF_MAX_ARRAY_ELEMENTS}")
        if sub == ValueType.STRING:
            # each string needs at least its 8-byte length: bound the count before looping
            self.need(count * 8, f"{what} ({count} strings)")
            return GGUFValue(ValueType.ARRAY, self.strings(what, count), sub)
        info = VALUE_TYPES[sub]
        size = info.size
        self.need(count * size, f"{what} ({count} items)")
        data = np.empty(count, dtype=bool if info.kind == BOOLEAN else info.numpy)
        start, step = self.pos, max(1, _RELEASE_EVERY // size)
        for a in range(0, count, step):  # copied a few MiB at a time, the pages behind handed back as it goes
            n = min(step, count - a)
            view = np.frombuffer(self.buf, dtype=info.numpy, count=n, offset=start + a * size)
            if info.kind == BOOLEAN and int(view.max()) > 1:
                i = int(np.argmax(view > 1))
                self.pos = start
                raise self.fail(f"{what}[{a + i}]: bool value {int(view[i])} is neither 0 nor 1")
            data[a:a + n] = view
            del view
            self.pos = start + (a + n) * size
            self.release()
        data.flags.writeable = False
        self.pos = start + count * size
        return GGUFValue(ValueType.ARRAY, NumArray(data), sub)

    def strings(self, what: str, count: int) -> StrArray:
        """``count`` strings (already bounded by the bytes that remain): one walk over the length
        prefixes, then the region copied as it is, with the mapped pages behind handed back.

        The rare checks run only when an item ends past ``mark``, the next release point. That
        catches every item that ends past the buffer, and every length over llama.cpp's limit,
        since a mark is never more than _RELEASE_EVERY (<= the limit) ahead."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        known = known_at(buf, pos, count)
        if known is not None:
            self.pos = pos + int(known.offsets[-1])
            self.release()
            return known
        start = copied = pos
        # offsets never need more than the length prefixes they point at; uint32 when the rest of the file is < 4 GiB
        offsets = np.zeros(count + 1, dtype=np.uint32 if end - pos < 1 << 32 else np.int64)  # calloc: pages on first write
        put = memoryview(offsets).cast("B").cast(offsets.dtype.char)
        data = bytearray()
        unpack = struct.Struct("<Q").unpack_from
        mark = min(end, pos + _RELEASE_EVERY)
        first = i = n = 0
        while True:
            try:
                for i in range(first, count):
                    n = unpack(buf, pos)[0]
                    put[i] = pos - start
                    pos += 8 + n
                    if pos > mark:
                        break
                else:
                    break
            except struct.error:  # fewer than 8 bytes left for item i's length
                self.pos = pos
                raise self.fail(f"truncated: {what}[{i}] length needs 8 bytes, {end - pos} remain") from None
            if n > GGUF_MAX_STRING_LENGTH:
                self.pos = pos - n
                raise self.fail(f"{what}[{i}] length {n} exceeds llama.cpp's limit of {GGUF_MAX_STRING_LENGTH} bytes")
            if pos > end:
                self.pos = pos - n
                raise self.fail(f"truncated: {what}[{i}] needs {n} bytes, {end - self.pos} remain")
            data += buf[copied:pos]
            self.pos = copied = pos
            self.release()
            mark = min(end, pos + _RELEASE_EVERY)
            first = i + 1
        put[count] = pos - start
        data += buf[copied:pos]
        self.pos = pos
        self.release()
        out = StrArray(data, offsets)
        remember(out)
        return out


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse and validate a GGUF container (metadata and tensor table; data stays on disk)."""

    path = Path(path)
    fd = open_regular(path, "GGUF file")  # a FIFO or a device is refused, never read
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise InputFileError("empty file, not GGUF", path)
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise InputFileError(f"cannot read: {e.strerror or e}", path) from e
    finally:
        os.close(fd)
    try:
        buf = memoryview(mm)
        try:
            return _parse(buf, path, size, mm)
        finally:
            try:
                buf.release()
            except BufferError:  # a view is still referenced by an exception being raised
                pass
    finally:
        try:
            mm.close()
        except BufferError:
            pass


def _check_version(c: _Cursor, version: int) -> None:
    if version == 0:
        raise c.fail("bad GGUF version 0")
    if version & 0xFFFF == 0:
        raise c.fail(f"GGUF version {version:#010x} looks byte-swapped: a big-endian file? llama.cpp reads little-endian files only")
    if version == 1:
        raise c.fail("GGUF version 1 is no longer supported by llama.cpp; convert the model again")
    if version > GGUF_VERSION:
        raise c.fail(f"GGUF version {version} is newer than {GGUF_VERSION}, the newest llama.cpp 0c1e57098 reads")


def _parse(buf: memoryview, path: Path, size: int, mm: mmap.mmap | None = None) -> GGUFFile:
    c = _Cursor(buf, path, mm)
    c.need(4, "magic")
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise InputFileError(f"not a GGUF file (magic {bytes(buf[:4])!r})", path)
    c.pos = 4
    version = c.u32("version")
    _check_version(c, version)
    tensors_at = c.pos
    n_tensors = c.u64("tensor count")
    kv_at = c.pos
    n_kv = c.u64("metadata count")
    body = c.pos

    def bad_count(at: int, msg: str) -> InputFileError:  # reported where the count is, not where reading stopped
        c.pos = at
        return c.fail(msg)

    if n_tensors > INT64_MAX:
        raise bad_count(tensors_at, f"tensor count {n_tensors} is negative as a signed 64-bit count")
    if n_kv > INT64_MAX:
        raise bad_count(kv_at, f"metadata count {n_kv} is negative as a signed 64-bit count")
    if n_kv * _MIN_KV_BYTES > size - body:
        raise bad_count(kv_at, f"metadata count {n_kv} cannot fit in a {size}-byte file")
    if n_tensors * _MIN_TENSOR_INFO_BYTES > size - body:
        raise bad_count(tensors_at, f"tensor count {n_tensors} cannot fit in a {size}-byte file")
    if n_kv > MAX_KEYS:
        raise bad_count(kv_at, f"metadata count {n_kv} is more than the {MAX_KEYS} keys dflash-convert reads "
                               "(a drafter holds about 40): refused, so that reading stays bounded by the file's size")
    if n_tensors > MAX_TENSORS:
        raise bad_count(tensors_at, f"tensor count {n_tensors} is more than the {MAX_TENSORS} tensors dflash-convert "
                                    "reads (the biggest models hold a few thousand): refused, so that reading stays "
                                    "bounded by the file's size")

    md: dict[str, GGUFValue] = {}
    for i in range(n_kv):
        key_raw = c.string(f"key #{i}")
        if not key_raw:
            raise c.fail(f"key #{i} is empty")
        try:
            key = key_raw.decode("utf-8")
        except UnicodeDecodeError:
            raise c.fail(f"key #{i} is not UTF-8") from None
        if key in md:
            raise c.fail(f"duplicate metadata key {key!r}")
        md[key] = c.value(c.u32(f"type of {key}"), key)
        c.release()

    alignment = GGUF_DEFAULT_ALIGNMENT
    if ALIGNMENT_KEY in md:
        a = md[ALIGNMENT_KEY]
        if a.vtype != ValueType.UINT32:
            raise InputFileError(f"{ALIGNMENT_KEY} must be UINT32, got {a.vtype.name}", path)
        if a.value == 0 or a.value & (a.value - 1):
            raise InputFileError(f"{ALIGNMENT_KEY} {a.value} is not a power of two", path)
        alignment = a.value

    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    names: set[str] = set()
    for i in range(n_tensors):
        raw_name = c.string(f"tensor #{i} name")
        if not raw_name:
            raise c.fail(f"tensor #{i} has an empty name")
        if len(raw_name) >= GGML_MAX_NAME:
            raise c.fail(f"tensor #{i} name is {len(raw_name)} bytes; llama.cpp allows at most {GGML_MAX_NAME - 1}")
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

    tensors = [_tensor(path, alignment, data_offset, size, *info) for info in infos]
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors)
    for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:], strict=False):
        if s1 < e0:
            raise InputFileError(f"tensor {n1!r} data overlaps tensor {n0!r}", path)
    expected = 0
    for t in tensors:  # llama.cpp's gguf reader wants each tensor right after the previous one, padded
        if t.offset - data_offset != expected:
            raise InputFileError(f"tensor {t.name!r} data offset {t.offset - data_offset} is not {expected}: llama.cpp requires "
                                 "tensor data packed in table order with alignment padding only", path)
        expected += (t.nbytes + alignment - 1) // alignment * alignment
    return GGUFFile(path, version, md, tensors, alignment, data_offset, size)


def _tensor(path: Path, alignment: int, data_offset: int, size: int,
            name: str, ne: tuple[int, ...], type_raw: int, offset: int) -> GGUFTensor:
    if type_raw in REMOVED_TYPES:
        raise InputFileError(f"tensor {name!r} has ggml type {type_raw} ({REMOVED_TYPES[type_raw]}), which was removed "
                             "from GGUF files; quantize again from the F16/BF16 file", path)
    if type_raw >= GGML_TYPE_COUNT:
        raise InputFileError(f"tensor {name!r} has unknown ggml type {type_raw} (llama.cpp 0c1e57098 knows 0 to "
                             f"{GGML_TYPE_COUNT - 1}; a fork-private type?)", path)
    try:
        gtype = GGMLType(type_raw)
    except ValueError:
        raise InputFileError(f"tensor {name!r} has unknown ggml type {type_raw}", path) from None
    n = 1
    for d in ne:
        if d > INT64_MAX:
            raise InputFileError(f"tensor {name!r} has a negative dimension in {list(ne)}", path)
        if d == 0:
            raise InputFileError(f"tensor {name!r} has a zero-size dimension in {list(ne)}", path)
        n *= d
        if n > INT64_MAX:
            raise InputFileError(f"tensor {name!r} element count overflows a signed 64-bit integer ({list(ne)})", path)
    block, bsize = BLOCK_GEOMETRY[gtype]
    if ne[0] % block:
        raise InputFileError(f"tensor {name!r}: ne[0]={ne[0]} is not a multiple of the {gtype.name} block size {block}", path)
    nbytes = n // block * bsize
    if offset % alignment:
        raise InputFileError(f"tensor {name!r} data offset {offset} is not aligned to {alignment}", path)
    start = data_offset + offset
    if start + nbytes > size:
        raise InputFileError(f"tensor {name!r} data [{start}, {start + nbytes}) runs past the end of the file ({size} bytes)", path)
    return GGUFTensor(name, ne, gtype, start, nbytes, path)
