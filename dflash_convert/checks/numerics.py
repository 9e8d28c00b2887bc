"""--deep: every tensor scanned for NaN and Inf, chunk by chunk (memory stays flat on large files).

Float tensors are checked on their raw bit patterns (an all-ones exponent is NaN or Inf), so no
copy is made; quantized tensors are dequantized a few rows at a time with gguf-py, which agrees
with ggml bit for bit. Integer tensors (d2t) cannot hold NaN and are skipped.
"""

from __future__ import annotations

import numpy as np

from ..format.ggml import BLOCK_GEOMETRY, GGMLType
from ..sources.gguf import GGUFFile, GGUFTensor
from .report import Check, check_from

CHUNK_BYTES = 16 << 20
# type -> (raw word dtype, exponent mask): an exponent of all ones means NaN or Inf
_FLOAT_BITS: dict[GGMLType, tuple[str, int]] = {
    GGMLType.F32: ("<u4", 0x7F800000),
    GGMLType.F16: ("<u2", 0x7C00),
    GGMLType.BF16: ("<u2", 0x7F80),
    GGMLType.F64: ("<u8", 0x7FF0000000000000),
}
_INTEGER = frozenset({GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64})


def _bad_float(raw: np.ndarray, t: GGUFTensor) -> int:
    dtype, mask = _FLOAT_BITS[t.ggml_type]
    words = raw.view(dtype)
    step = CHUNK_BYTES // words.itemsize
    m = np.array(mask, dtype=dtype)
    return sum(int(np.count_nonzero((words[i:i + step] & m) == m)) for i in range(0, len(words), step))


def _bad_quantized(raw: np.ndarray, t: GGUFTensor) -> int | None:
    try:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        qtype = GGMLQuantizationType(int(t.ggml_type))
    except (ImportError, ValueError):
        return None
    block, bsize = BLOCK_GEOMETRY[t.ggml_type]
    row_bytes = t.ne[0] // block * bsize
    rows = raw.reshape(-1, row_bytes)
    step = max(1, CHUNK_BYTES // row_bytes)
    bad = 0
    for i in range(0, len(rows), step):
        try:
            with np.errstate(all="ignore"):  # an Inf scale times a zero quant is NaN: counted, not warned
                values = dequantize(rows[i:i + step], qtype)
        except NotImplementedError:
            return None
        bad += int(np.count_nonzero(~np.isfinite(values)))
    return bad


def scan(g: GGUFFile) -> Check:
    problems, warnings = [], []
    scanned = 0
    for t in g.tensors:
        if t.ggml_type in _INTEGER:
            continue
        raw = g.tensor_bytes(t)
        bad = _bad_float(raw, t) if t.ggml_type in _FLOAT_BITS else _bad_quantized(raw, t)
        del raw
        if bad is None:
            warnings.append(f"{t.name}: {t.ggml_type.name} cannot be dequantized here, not scanned")
            continue
        scanned += 1
        if bad:
            problems.append(f"{t.name}: {bad} of {t.n_elements} values are NaN or Inf")
    return check_from("numerics", problems, warnings, f"{scanned} tensors scanned, no NaN or Inf",
                      f"{len(problems)} tensor(s) hold NaN or Inf", "some tensors could not be scanned")
