"""Reads the importance-matrix files ``llama-quantize --imatrix`` reads: GGUF, else legacy ``.dat``.

The values are what ``load_imatrix`` (tools/quantize/quantize.cpp) hands the quantizer. Refused, as
one ``InputFileError`` naming the file: what ``common_imatrix_load`` refuses and a GGUF without the
three ``imatrix.*`` keys, lengths checked before anything is allocated; a non-finite value or a
misfit length when it is used. Specification: docs/quantize.md, "Importance matrix".
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import InputFileError
from ..files import open_regular
from ..format import imatrix as keys
from ..format.ggml import GGUF_MAGIC, GGMLType
from ..format.keys import ValueType
from .gguf import read_gguf

__all__ = ["ImportanceMatrix", "c_string", "read_imatrix"]

INT64_MIN = -(1 << 63)


@dataclass(frozen=True)
class ImportanceMatrix:
    """An imatrix as llama-quantize uses it: per weight name float32 [n_mat * n_per_row], datasets, chunk count."""

    path: Path
    values: dict[str, np.ndarray]
    datasets: tuple[bytes, ...] = ()  # C strings (to the first NUL), earliest first
    chunk_count: int = 0  # int32 as loaded; llama-quantize records it only when > 0
    legacy: bool = False

    @property
    def entries_count(self) -> int:
        """Entries kept (after --include-weights / --exclude-weights): quantize.imatrix.entries_count."""
        return len(self.values)

    def filtered(self, include: list[str] | tuple[str, ...] = (), exclude: list[str] | tuple[str, ...] = ()) -> ImportanceMatrix:
        """prepare_imatrix's filters: names containing an --exclude-weights string dropped, else only those containing an --include-weights one."""
        kept = {n: v for n, v in self.values.items() if not any(s in n for s in exclude)}
        if include:
            kept = {n: v for n, v in kept.items() if any(s in n for s in include)}
        return replace(self, values=kept)

    def check_finite(self) -> None:
        """llama-quantize's "imatrix contains non-finite value" refusal (over the entries kept)."""
        for name, v in self.values.items():
            bad = np.flatnonzero(~np.isfinite(v))
            if bad.size:
                raise InputFileError(f"imatrix entry {name!r} holds a non-finite value ({v[bad[0]]} at {bad[0]}); "
                                     "llama-quantize refuses it", self.path)

    def for_tensor(self, name: str, ne: tuple[int, ...]) -> np.ndarray | None:
        """The importance for tensor ``name`` (ggml ``ne``), None without an entry; a length that does not fit it is refused."""
        v = self.values.get(name)
        if v is None:
            return None
        want = ne[0] * (ne[2] if len(ne) > 2 else 1)
        if v.size != want:
            if name in keys.LENGTH_MISMATCH_IGNORED:  # llama-quantize quantizes it without an imatrix then
                return None
            raise InputFileError(f"imatrix entry {name!r} has {v.size} values; the tensor needs {want} (ne0 {ne[0]}"
                                 f"{f' x {ne[2]} experts' if want != ne[0] else ''}): an imatrix of another model?", self.path)
        return v


def read_imatrix(path: str | os.PathLike) -> ImportanceMatrix:
    """Read an imatrix file (GGUF, else legacy ``.dat``) as ``load_imatrix`` normalises it."""
    p = Path(path)
    fd = open_regular(p, "imatrix file")
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            magic = f.read(4)
    finally:
        os.close(fd)
    if magic == GGUF_MAGIC:
        return _read_gguf(p)
    return _read_legacy(p)


def lround_counts(counts: np.ndarray) -> np.ndarray:
    """C's ``std::lround`` of float32 counts as int64: half away from zero; NaN, inf and overflow give INT64_MIN (x86)."""
    c = counts.astype(np.float64)
    out = np.full(c.shape, INT64_MIN, np.int64)
    ok = np.isfinite(c) & (np.abs(c) < 2.0**63)
    out[ok] = (np.sign(c[ok]) * np.floor(np.abs(c[ok]) + 0.5)).astype(np.int64)
    return out


def _read_gguf(p: Path) -> ImportanceMatrix:
    g = read_gguf(p)
    if not g.tensors:
        raise InputFileError("imatrix holds no tensors (no data)", p)
    md = g.metadata
    datasets: tuple[bytes, ...] = ()
    ds = md.get(keys.DATASETS)
    if ds is not None and ds.vtype == ValueType.ARRAY and ds.sub == ValueType.STRING:
        datasets = tuple(b.split(b"\0", 1)[0] for b in ds.value)
    missing = [k for k in keys.REQUIRED_KEYS if k not in md]
    if missing:
        raise InputFileError(f"missing imatrix metadata ({', '.join(missing)}): llama-quantize refuses a GGUF imatrix "
                             "without it", p)
    counts_of = {}
    for k in (keys.CHUNK_COUNT, keys.CHUNK_SIZE):
        if md[k].vtype != ValueType.UINT32:  # gguf_get_val_u32 aborts on any other type
            raise InputFileError(f"{k} must be UINT32, got {md[k].vtype.name}", p)
        counts_of[k] = md[k].value
    pairs: dict[str, list] = {}
    for t in g.tensors:
        for suffix, slot in ((keys.IN_SUM2_SUFFIX, 0), (keys.COUNTS_SUFFIX, 1)):
            if t.name.endswith(suffix) and t.name != suffix:
                pairs.setdefault(t.name[:-len(suffix)], [None, None])[slot] = t
                break
    values: dict[str, np.ndarray] = {}
    for name, (sums_t, counts_t) in sorted(pairs.items()):
        if sums_t is None or counts_t is None:
            raise InputFileError(f"imatrix entry {name!r}: mismatched sums and counts (each needs "
                                 f"{name}{keys.IN_SUM2_SUFFIX} and {name}{keys.COUNTS_SUFFIX})", p)
        if sums_t.ggml_type != GGMLType.F32 or counts_t.ggml_type != GGMLType.F32:
            raise InputFileError(f"imatrix entry {name!r}: sums and counts must be F32, got "
                                 f"{sums_t.ggml_type.name} and {counts_t.ggml_type.name}", p)
        nval, ncounts = sums_t.n_elements, counts_t.n_elements
        if nval == 0 or ncounts == 0:  # llama-quantize divides by the count of counts
            raise InputFileError(f"imatrix entry {name!r} has {nval} sums and {ncounts} counts; both must be non-empty", p)
        sums = _f32(g, sums_t)
        counts = lround_counts(_f32(g, counts_t))
        ne0 = nval // ncounts
        e = np.zeros(nval, np.float32)  # a remainder past ncounts * ne0 stays 0, as the C++ leaves it
        for j, c in enumerate(counts):
            seg = slice(j * ne0, (j + 1) * ne0)
            e[seg] = sums[seg] / np.float32(c) if c > 0 else np.float32(1)
        values[name] = e
    chunk = counts_of[keys.CHUNK_COUNT]
    return ImportanceMatrix(p, values, datasets, chunk - (1 << 32) if chunk >= 1 << 31 else chunk, legacy=False)


def _f32(g, t) -> np.ndarray:
    return g.tensor_bytes(t).view("<f4").astype(np.float32)


def _read_legacy(p: Path) -> ImportanceMatrix:
    fd = open_regular(p, "imatrix file")
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InputFileError(f"cannot read: {e.strerror or e}", p) from e
    finally:
        os.close(fd)
    view = memoryview(raw)
    pos = 0

    def int32(what: str) -> int:
        nonlocal pos
        if pos + 4 > len(raw):
            raise InputFileError(f"not a GGUF imatrix, and as a legacy .dat it is truncated at byte {pos} ({what})", p)
        (v,) = struct.unpack_from("<i", raw, pos)
        pos += 4
        return v

    n_entries = int32("the entry count")
    if n_entries < 1:
        raise InputFileError(f"legacy imatrix: no data (entry count {n_entries})", p)
    # each entry takes at least 13 bytes: a bound on the count before any loop
    if n_entries > (len(raw) - 4) // 13:
        raise InputFileError(f"legacy imatrix: {n_entries} entries cannot fit in {len(raw)} bytes", p)
    values: dict[str, np.ndarray] = {}
    for i in range(n_entries):
        n = int32(f"entry {i + 1}'s name length")
        if n < 0 or n > len(raw) - pos:
            raise InputFileError(f"legacy imatrix: entry {i + 1}'s name length {n} does not fit the file", p)
        name = bytes(view[pos:pos + n]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")  # C string: to the first NUL
        pos += n
        ncall = int32(f"entry {i + 1}'s call count")
        nval = int32(f"entry {i + 1}'s value count")
        if nval < 1 or 4 * nval > len(raw) - pos:
            raise InputFileError(f"legacy imatrix: entry {i + 1} ({name!r}) has {nval} values, which "
                                 f"{'is not positive' if nval < 1 else f'do not fit the {len(raw) - pos} bytes left'}", p)
        sums = np.frombuffer(raw, "<f4", nval, pos).astype(np.float32)
        pos += 4 * nval
        # load_imatrix: (raw/count)*ncall stored, so divided by ncall; ncall <= 0 keeps the values
        values[name] = sums / np.float32(ncall) if ncall > 0 else sums
    chunk_count, datasets = 0, ()
    if pos < len(raw):  # the optional trailer: chunk count, then the dataset's name
        tail = raw[pos:pos + 4].ljust(4, b"\0")  # a short read leaves zeros in the int, as istream::read does
        (chunk_count,) = struct.unpack("<i", tail)
        pos += 4
        if pos + 4 <= len(raw):
            (n,) = struct.unpack_from("<i", raw, pos)
            pos += 4
            if 0 < n <= len(raw) - pos:
                datasets = (bytes(view[pos:pos + n]).split(b"\0", 1)[0],)
    return ImportanceMatrix(p, values, datasets, chunk_count, legacy=True)


def c_string(text: str | bytes, limit: int = keys.MAX_FILE_CHARS) -> bytes:
    """``strncpy(val_str, s, 127)``: the bytes of ``text`` up to its first NUL, at most ``limit`` of them."""
    raw = text if isinstance(text, bytes) else os.fsencode(text)
    return raw.split(b"\0", 1)[0][:limit]
