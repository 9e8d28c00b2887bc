"""--deep: every tensor scanned for NaN and Inf, row chunk by row chunk (memory stays flat on large files).

Rows are read by position into a small buffer, never mapped. Float tensors are checked on their bit
patterns, quantized ones dequantized a chunk at a time with gguf-py (bit-exact with ggml), Q1_0 and
Q2_0 (which gguf-py lacks) by their block scales; integer tensors are skipped.
"""

from __future__ import annotations

import numpy as np

from ..files import FdCache
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
# types gguf-py cannot decode whose every value is a small integer times the block's one fp16 scale at
# byte 0 (Q1_0: +-d, Q2_0: (q - 1)*d): a value is NaN or Inf exactly when that scale is
_SCALE_AT_0 = frozenset({GGMLType.Q1_0, GGMLType.Q2_0})


def _bad_float(words: np.ndarray, t: GGUFTensor) -> int:
    dtype, mask = _FLOAT_BITS[t.ggml_type]
    m = np.array(mask, dtype=dtype)
    return int(np.count_nonzero((words.view(dtype) & m) == m))


def _bad_quantized(raw: np.ndarray, t: GGUFTensor) -> int | None:
    if t.ggml_type in _SCALE_AT_0:
        block, size = BLOCK_GEOMETRY[t.ggml_type]
        d = raw.view(np.uint8).reshape(-1, size)[:, :2].copy().view("<u2")
        return block * int(np.count_nonzero((d & 0x7C00) == 0x7C00))
    try:
        # gguf-py's dequantizers: only --deep on a quantized file needs them
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        qtype = GGMLQuantizationType(int(t.ggml_type))
    except (ImportError, ValueError):
        return None
    try:
        with np.errstate(all="ignore"):  # an Inf scale times a zero quant is NaN: counted, not warned
            values = dequantize(raw.view(np.uint8).reshape(-1, t.row_nbytes), qtype)
    except NotImplementedError:
        return None
    return int(np.count_nonzero(~np.isfinite(values)))


def _scan_tensor(t: GGUFTensor, fds: FdCache) -> int | None:
    rows = t.n_elements // t.ne[0]
    step = max(1, CHUNK_BYTES // t.row_nbytes)
    bad = 0
    for a in range(0, rows, step):
        raw = t.rows(a, min(rows, a + step), fds)
        n = _bad_float(raw, t) if t.ggml_type in _FLOAT_BITS else _bad_quantized(raw, t)
        if n is None:
            return None
        bad += n
    return bad


def scan(g: GGUFFile) -> Check:
    """The ``numerics`` check of ``--deep``: every tensor scanned for NaN and Inf."""
    with FdCache() as fds:
        return _scan(g, fds)


def _scan(g: GGUFFile, fds: FdCache) -> Check:
    problems, warnings = [], []
    scanned = 0
    for t in g.tensors:
        if t.ggml_type in _INTEGER:
            continue
        bad = _scan_tensor(t, fds)
        if bad is None:
            warnings.append(f"{t.name}: {t.ggml_type.name} cannot be dequantized here, not scanned")
            continue
        scanned += 1
        if bad:
            problems.append(f"{t.name}: {bad} of {t.n_elements} values are NaN or Inf")
    return check_from("numerics", problems, warnings, f"{scanned} tensors scanned, no NaN or Inf",
                      f"{len(problems)} tensor(s) hold NaN or Inf", "some tensors could not be scanned")
