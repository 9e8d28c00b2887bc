"""The one place that parses safetensors files. Every check of that untrusted input lives here.

The header length is capped and must fit the file; the JSON must be an object of well-formed
entries with no duplicate names, each byte range prod(shape) * itemsize, the ranges tiling the data
exactly. Nothing is allocated from a size the file claims before it is checked; data is read later,
by offset. Specification: docs/validate.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputFileError
from ..files import FdCache, open_regular, parse_json, pread_into

# Header cap: the reference implementation refuses headers over 100 MB.
MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_DIMS = 8

# safetensors dtype -> (itemsize, numpy dtype used to read raw words; None when we cannot read it)
DTYPES: dict[str, tuple[int, np.dtype | None]] = {
    "F64": (8, np.dtype("<f8")),
    "F32": (4, np.dtype("<f4")),
    "F16": (2, np.dtype("<f2")),
    "BF16": (2, np.dtype("<u2")),
    "I64": (8, np.dtype("<i8")),
    "I32": (4, np.dtype("<i4")),
    "I16": (2, np.dtype("<i2")),
    "I8": (1, np.dtype("i1")),
    "U8": (1, np.dtype("u1")),
    "U16": (2, np.dtype("<u2")),
    "U32": (4, np.dtype("<u4")),
    "U64": (8, np.dtype("<u8")),
    "BOOL": (1, np.dtype("u1")),
    "F8_E4M3": (1, None),
    "F8_E5M2": (1, None),
}


@dataclass(frozen=True)
class TensorRef:
    """A tensor inside a safetensors file: where its bytes are, not the bytes themselves."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    offset: int  # absolute file offset of the first byte
    nbytes: int

    @property
    def n_elements(self) -> int:
        """The number of elements of the tensor."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    def rows(self, a: int, b: int, fds: FdCache | None = None) -> np.ndarray:
        """Rows [a, b) (the last dimension is a row) as raw words: the TensorSource interface."""
        r = self.shape[-1] if self.shape else 1
        return self.read(a * r, (b - a) * r, fds)

    def read(self, start: int = 0, count: int | None = None, fds: FdCache | None = None) -> np.ndarray:
        """Read ``count`` elements from element ``start`` as raw little-endian words (1-D)."""
        itemsize, np_dtype = DTYPES[self.dtype]
        if np_dtype is None:
            raise InputFileError(f"tensor {self.name!r} has dtype {self.dtype}, which cannot be converted", self.path)
        n = self.n_elements - start if count is None else count
        if start < 0 or n < 0 or start + n > self.n_elements:
            raise ValueError(f"read of {self.name}: elements [{start}, {start + n}) out of range")
        out = np.empty(n, dtype=np_dtype)
        want = n * itemsize
        got = pread_into(self.path, fds, memoryview(out).cast("B"), self.offset + start * itemsize)
        if got != want:
            raise InputFileError(f"tensor {self.name!r} is truncated (read {got} of {want} bytes)", self.path)
        return out


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def read_header(path: str | Path) -> tuple[list[TensorRef], dict[str, str]]:
    """Parse and validate a safetensors header. Returns tensors in data order and __metadata__."""

    path = Path(path)
    fd = open_regular(path, "safetensors file")  # a FIFO or a device is refused, never read
    try:
        size = os.fstat(fd).st_size
        with os.fdopen(fd, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise InputFileError(f"not a safetensors file: {size} bytes, too short for a header", path)
            n = int.from_bytes(raw_len, "little")
            if n > MAX_HEADER_BYTES:
                raise InputFileError(f"safetensors header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit", path)
            if 8 + n > size:
                raise InputFileError(f"truncated safetensors file: header claims {n} bytes, file has {size - 8} after the length", path)
            raw = f.read(n)
    except OSError as e:
        raise InputFileError(f"cannot read: {e.strerror or e}", path) from e
    if len(raw) != n:
        raise InputFileError("truncated safetensors header", path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"safetensors header is not UTF-8 (byte {e.start})", path) from e
    if not text.lstrip().startswith("{"):
        raise InputFileError("safetensors header is not a JSON object", path)
    header = parse_json(raw, "safetensors header", path, object_pairs_hook=_reject_duplicates)
    if not isinstance(header, dict):
        raise InputFileError("safetensors header is not a JSON object", path)

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise InputFileError("safetensors __metadata__ must map strings to strings", path)

    data_start = 8 + n
    data_size = size - data_start
    entries: list[tuple[int, int, str, str, tuple[int, ...]]] = []
    for name, meta in header.items():
        where = f"tensor {name!r}"
        if not name:
            raise InputFileError("tensor with an empty name", path)
        if not isinstance(meta, dict) or set(meta) - {"dtype", "shape", "data_offsets"} or len(meta) != 3:
            raise InputFileError(f"{where}: entry must have exactly dtype, shape and data_offsets", path)
        dtype, shape, offsets = meta["dtype"], meta["shape"], meta["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise InputFileError(f"{where}: unknown dtype {dtype!r}", path)
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise InputFileError(f"{where}: shape must be a list of at most {MAX_DIMS} non-negative integers, got {shape!r}", path)
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
            raise InputFileError(f"{where}: data_offsets must be two non-negative integers, got {offsets!r}", path)
        begin, end = offsets
        if end < begin:
            raise InputFileError(f"{where}: data_offsets end {end} is before begin {begin}", path)
        n_el = 1
        for d in shape:
            n_el *= d
        expected = n_el * DTYPES[dtype][0]
        if end - begin != expected:
            raise InputFileError(
                f"{where}: data_offsets span {end - begin} bytes but {dtype} shape {shape} needs {expected}", path)
        if end > data_size:
            raise InputFileError(
                f"{where}: data ends at byte {end} but the data section has {data_size} bytes (truncated file?)", path)
        entries.append((begin, end, name, dtype, tuple(shape)))

    entries.sort()
    cursor = 0
    for begin, end, name, _, _ in entries:
        if begin < cursor:
            raise InputFileError(f"tensor {name!r} overlaps the previous tensor (starts at {begin}, previous ends at {cursor})", path)
        if begin > cursor:
            raise InputFileError(f"tensor {name!r} starts at {begin}, leaving a hole after byte {cursor}", path)
        cursor = end
    if cursor != data_size:
        raise InputFileError(f"data section has {data_size} bytes but the tensors cover {cursor} (trailing bytes)", path)

    refs = [TensorRef(name, dtype, shape, path, data_start + begin, end - begin) for begin, end, name, dtype, shape in entries]
    return refs, metadata
