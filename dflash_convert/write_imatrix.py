"""Write an importance matrix as ``llama-imatrix`` does: its GGUF form (default) or its legacy ``.dat``.

GGUF: ``general.type`` ``imatrix``, the ``imatrix.*`` keys, and per weight ``<name>.in_sum2`` (F32
``{n_in, 1}``) and ``<name>.counts`` (F32 ``{1, 1}``), names sorted (imatrix.cpp save_imatrix).
``.dat``: per weight the mean square times ``ncall`` (save_imatrix_legacy). Both are written to a
temporary file renamed into place (``outputs.TemporaryOutput``); an entry with no rows is refused.
Specification: docs/quantize.md, "Importance matrix".
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import DFlashError
from .format import imatrix as fmt
from .format.ggml import GGMLType
from .format.keys import ValueType
from .metadata import Metadata
from .outputs import TemporaryOutput, clear_stale_partials
from .write import OutTensor, write_gguf

FORMATS = ("gguf", "dat")  # --output-format
log = logging.getLogger("dflash_convert")


@dataclass
class ImatrixFile:
    """What an imatrix file holds: per weight name the Σx² per input column and the rows seen."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)  # float32 [n_in]
    counts: dict[str, int] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 1

    def check(self) -> None:
        """Refuse what llama-quantize could not use: no entry, or an entry with no rows."""
        if not self.sums:
            raise DFlashError("no weight saw enough rows for an importance matrix (every decode had fewer than "
                              f"{fmt.MIN_ROWS} rows)")
        empty = [n for n in sorted(self.sums) if self.counts.get(n, 0) <= 0]
        if empty:
            raise DFlashError(f"internal error: {empty[0]} has no rows")


def _f32(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v, dtype="<f4")


def write_gguf_imatrix(out: Path, data: ImatrixFile, *, replace: bool = False) -> int:
    """The GGUF imatrix at ``out`` (atomic); its size in bytes."""
    data.check()
    md = Metadata()
    md.set("type", fmt.GENERAL_TYPE)
    md.set_raw(fmt.DATASETS, ValueType.ARRAY, data.datasets, ValueType.STRING)
    md.set_raw(fmt.CHUNK_COUNT, ValueType.UINT32, data.chunk_count)
    md.set_raw(fmt.CHUNK_SIZE, ValueType.UINT32, data.chunk_size)
    tensors = []
    for name in sorted(data.sums):
        sums, count = _f32(data.sums[name]), _f32(np.array([data.counts[name]]))
        tensors.append(OutTensor(name + fmt.IN_SUM2_SUFFIX, (sums.shape[0], 1), GGMLType.F32, sums.nbytes,
                                 lambda v=sums: (v,)))
        tensors.append(OutTensor(name + fmt.COUNTS_SUFFIX, (1, 1), GGMLType.F32, count.nbytes, lambda v=count: (v,)))
    return write_gguf(out, md, tensors, progress=False, replace=replace)


def legacy_bytes(data: ImatrixFile) -> bytes:
    """The ``.dat`` bytes: sorted entries of (name, ncall, mean x² * ncall), the chunk count and the dataset."""
    data.check()
    parts = [struct.pack("<i", len(data.sums))]
    for name in sorted(data.sums):
        raw = name.encode()
        count = data.counts[name]
        ncall = (count + data.chunk_size - 1) // data.chunk_size  # ceiling, as llama-imatrix: never 0
        values = (_f32(data.sums[name]) / np.float32(count)) * np.float32(ncall)  # float32 arithmetic, as the C++
        parts += [struct.pack("<i", len(raw)), raw, struct.pack("<ii", ncall, values.shape[0]), _f32(values).tobytes()]
    dataset = (data.datasets[-1] if data.datasets else "").encode()
    parts += [struct.pack("<i", data.chunk_count), struct.pack("<i", len(dataset)), dataset]
    return b"".join(parts)


def write_dat_imatrix(out: Path, data: ImatrixFile, *, replace: bool = False) -> int:
    """The legacy ``.dat`` imatrix at ``out`` (atomic); its size in bytes."""
    blob = legacy_bytes(data)
    for note in clear_stale_partials(out, force=replace):
        log.warning("%s", note)
    tmp = TemporaryOutput(out)
    try:
        view = memoryview(blob)
        while view:
            view = view[os.write(tmp.fd, view):]
        tmp.commit(replace=replace)
    except OSError as e:
        raise DFlashError(f"cannot write the output: {e.strerror or e}", out) from e
    finally:
        tmp.discard()
    return len(blob)


def write_imatrix(out: Path, data: ImatrixFile, output_format: str = "gguf", *, replace: bool = False) -> int:
    """``data`` at ``out`` in ``output_format`` (gguf or dat); the size in bytes."""
    if output_format not in FORMATS:
        raise DFlashError(f"--output-format must be one of {', '.join(FORMATS)}, got {output_format!r}")
    writer = write_gguf_imatrix if output_format == "gguf" else write_dat_imatrix
    return writer(Path(out), data, replace=replace)


__all__ = ["FORMATS", "ImatrixFile", "legacy_bytes", "write_imatrix"]
