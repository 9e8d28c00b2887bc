"""ggml tensor bytes -> torch values, for running converted drafters in process (CPU or CUDA).

Bit-identical to gguf-py's numpy dequantizers, on whatever device the bytes are on. Refuses a
big-endian host and a type it has no kernel for. Specification: docs/runtime.md, "Dequantization".
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import lru_cache

import torch

from ..format.ggml import BLOCK_GEOMETRY, REMOVED_TYPES, GGMLType, tensor_nbytes
from ..format.iq2_grids import IQ1S_POINTS, IQ1S_VALUES, IQ2_VALUES, IQ2S_POINTS, IQ2XS_POINTS, IQ2XXS_POINTS
from ..format.iq3_grids import IQ3S_POINTS, IQ3S_VALUES, IQ3XXS_POINTS, IQ3XXS_VALUES

# Block structs (ggml-common.h): (field, bytes) in memory order; d, dmin and m are fp16.
BLOCK_FIELDS: dict[GGMLType, tuple[tuple[str, int], ...]] = {
    GGMLType.Q4_0: (("d", 2), ("qs", 16)),
    GGMLType.Q4_1: (("d", 2), ("m", 2), ("qs", 16)),
    GGMLType.Q5_0: (("d", 2), ("qh", 4), ("qs", 16)),
    GGMLType.Q5_1: (("d", 2), ("m", 2), ("qh", 4), ("qs", 16)),
    GGMLType.Q8_0: (("d", 2), ("qs", 32)),
    GGMLType.Q2_K: (("scales", 16), ("qs", 64), ("d", 2), ("dmin", 2)),
    GGMLType.Q3_K: (("hmask", 32), ("qs", 64), ("scales", 12), ("d", 2)),
    GGMLType.Q4_K: (("d", 2), ("dmin", 2), ("scales", 12), ("qs", 128)),
    GGMLType.Q5_K: (("d", 2), ("dmin", 2), ("scales", 12), ("qh", 32), ("qs", 128)),
    GGMLType.Q6_K: (("ql", 128), ("qh", 64), ("scales", 16), ("d", 2)),
    GGMLType.IQ4_NL: (("d", 2), ("qs", 16)),
    GGMLType.IQ4_XS: (("d", 2), ("scales_h", 2), ("scales_l", 4), ("qs", 128)),
    GGMLType.TQ1_0: (("qs", 48), ("qh", 4), ("d", 2)),
    GGMLType.TQ2_0: (("qs", 64), ("d", 2)),
    GGMLType.IQ3_XXS: (("d", 2), ("qs", 64), ("scales_signs", 32)),
    GGMLType.IQ3_S: (("d", 2), ("qs", 64), ("qh", 8), ("signs", 32), ("scales", 4)),
    GGMLType.Q1_0: (("d", 2), ("qs", 16)),
    GGMLType.Q2_0: (("d", 2), ("qs", 16)),
    GGMLType.IQ2_XXS: (("d", 2), ("qs", 64)),
    GGMLType.IQ2_XS: (("d", 2), ("qs", 64), ("scales", 8)),
    GGMLType.IQ2_S: (("d", 2), ("qs", 32), ("signs", 32), ("qh", 8), ("scales", 8)),
    GGMLType.IQ1_S: (("d", 2), ("qs", 32), ("qh", 16)),
    GGMLType.IQ1_M: (("qs", 32), ("qh", 16), ("scales", 8)),
}

FLOAT_ELEMENT_DTYPES: dict[GGMLType, torch.dtype] = {
    GGMLType.F32: torch.float32,
    GGMLType.F16: torch.float16,
    GGMLType.BF16: torch.bfloat16,
    GGMLType.F64: torch.float64,
}
# integer tensors (d2t) come back as int64 whatever dtype is asked for: they are indices
INT_ELEMENT_DTYPES: dict[GGMLType, torch.dtype] = {
    GGMLType.I8: torch.int8,
    GGMLType.I16: torch.int16,
    GGMLType.I32: torch.int32,
    GGMLType.I64: torch.int64,
}

# kvalues_iq4nl (ggml-common.h)
KVALUES_IQ4NL: tuple[int, ...] = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

_NIBBLE_SHIFTS = (0, 4)
_CRUMB_SHIFTS = (0, 2, 4, 6)
_BIT_SHIFTS = (0, 1, 2, 3, 4, 5, 6, 7)


def _check_fields() -> None:
    """The struct table must add up to ggml's block sizes, or every offset after a typo is wrong."""
    for t, fields in BLOCK_FIELDS.items():
        if sum(size for _, size in fields) != BLOCK_GEOMETRY[t][1]:
            raise AssertionError(f"BLOCK_FIELDS[{t.name}] does not add up to {BLOCK_GEOMETRY[t][1]} bytes")


_check_fields()


@lru_cache(maxsize=16)
def _iq3_grid(points: tuple[int, ...], values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """An IQ3 grid as float32 [points, 4] on one device: point k's value i is values[level i of point k]."""
    return torch.tensor([[float(values[(p >> 3 * i) & 7]) for i in range(4)] for p in points], dtype=torch.float32, device=device)


@lru_cache(maxsize=16)
def _iq4nl_table(device: torch.device) -> torch.Tensor:
    """The codebook as float32 on one device, made once so CUDA calls do not re-upload it."""
    return torch.tensor([float(v) for v in KVALUES_IQ4NL], dtype=torch.float32, device=device)


def _fields(blocks: torch.Tensor, t: GGMLType) -> dict[str, torch.Tensor]:
    """(n_blocks, type_size) uint8 -> one strided column slice per struct field (no copies)."""
    out: dict[str, torch.Tensor] = {}
    start = 0
    for name, size in BLOCK_FIELDS[t]:
        out[name] = blocks[:, start : start + size]
        start += size
    return out


def _half(field: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 fp16 field -> (n, 1) float32 (exact). The copy makes it contiguous and aligned for view()."""
    return field.contiguous().view(torch.float16).float()


def _u8(like: torch.Tensor, *shape: int) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.uint8, device=like.device)


def _spread(q: torch.Tensor, shifts: tuple[int, ...], mask: int, out: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """Split packed fields: ``out.select(dim, k) = (q >> shifts[k]) & mask``."""
    for k, s in enumerate(shifts):
        torch.bitwise_right_shift(q, s, out=out.select(dim, k))
    return out.bitwise_and_(mask)


def _k4_scales_mins(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins (get_scale_min_k4)."""
    a, b, c = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((a & 0x3F, (c & 0x0F) | ((a >> 6) << 4)), dim=1)
    mn = torch.cat((b & 0x3F, (c >> 4) | ((b >> 6) << 4)), dim=1)
    return sc, mn


# Kernels: uint8 blocks [n, type_size] -> float32 ``out`` [n, block_elements], scaled in place.


def _q4_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    f, n = _fields(blocks, GGMLType.Q4_0), blocks.shape[0]
    q = _spread(f["qs"], _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 2, 16)).view(torch.int8).sub_(8)
    out.copy_(q.view(n, 32)).mul_(_half(f["d"]))


def _q4_1(blocks: torch.Tensor, out: torch.Tensor) -> None:
    f, n = _fields(blocks, GGMLType.Q4_1), blocks.shape[0]
    q = _spread(f["qs"], _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 2, 16))
    out.copy_(q.view(n, 32)).mul_(_half(f["d"])).add_(_half(f["m"]))


def _q5_codes(blocks: torch.Tensor, f: dict[str, torch.Tensor]) -> torch.Tensor:
    """Q5_0/Q5_1 5-bit codes: nibbles of qs, plus bit j of the little-endian 32-bit qh for element j."""
    n = blocks.shape[0]
    q = _spread(f["qs"], _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 2, 16)).view(n, 32)
    high = _spread(f["qh"], _BIT_SHIFTS, 0x01, _u8(blocks, n, 4, 8), dim=-1)  # [byte, bit]: element 8*byte + bit
    return q.bitwise_or_(high.view(n, 32).bitwise_left_shift_(4))


def _q5_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    f = _fields(blocks, GGMLType.Q5_0)
    out.copy_(_q5_codes(blocks, f).view(torch.int8).sub_(16)).mul_(_half(f["d"]))


def _q5_1(blocks: torch.Tensor, out: torch.Tensor) -> None:
    f = _fields(blocks, GGMLType.Q5_1)
    out.copy_(_q5_codes(blocks, f)).mul_(_half(f["d"])).add_(_half(f["m"]))


def _q8_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    f = _fields(blocks, GGMLType.Q8_0)
    out.copy_(f["qs"].view(torch.int8)).mul_(_half(f["d"]))


def _q2_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """Q2_K: 16 sub-blocks of 16, 4-bit scale (low) and min (high) each, 2-bit quants."""
    f, n = _fields(blocks, GGMLType.Q2_K), blocks.shape[0]
    sc = f["scales"]
    dl = _half(f["d"]) * (sc & 0x0F).float()
    ml = _half(f["dmin"]) * (sc >> 4).float()
    q = _spread(f["qs"].reshape(n, 2, 32), _CRUMB_SHIFTS, 0x03, _u8(blocks, n, 2, 4, 32))
    out.copy_(q.view(n, 256))
    out.view(n, 16, 16).mul_(dl.unsqueeze(-1)).sub_(ml.unsqueeze(-1))


def _q3_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """Q3_K: 16 sub-blocks of 16, signed 6-bit scales, 2 low bits in qs and an inverted high bit in hmask."""
    f, n = _fields(blocks, GGMLType.Q3_K), blocks.shape[0]
    sc = f["scales"]
    lo = _spread(sc[:, 0:8], _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 2, 8)).view(n, 16)
    hi = _spread(sc[:, 8:12], _CRUMB_SHIFTS, 0x03, _u8(blocks, n, 4, 4)).view(n, 16)
    dl = _half(f["d"]) * (lo | (hi << 4)).view(torch.int8).sub_(32).float()
    q = _spread(f["qs"].reshape(n, 2, 32), _CRUMB_SHIFTS, 0x03, _u8(blocks, n, 2, 4, 32)).view(n, 256)
    high = _spread(f["hmask"], _BIT_SHIFTS, 0x01, _u8(blocks, n, 8, 32)).view(n, 256)
    q = q.bitwise_or_(high.bitwise_left_shift_(2)).view(torch.int8).sub_(4)
    out.copy_(q)
    out.view(n, 16, 16).mul_(dl.unsqueeze(-1))


def _q4_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """8 sub-blocks of 32 with 6-bit scales and mins; element 64*j + 32*h + l is nibble h of qs[32*j + l]."""
    f, n = _fields(blocks, GGMLType.Q4_K), blocks.shape[0]
    sc, mn = _k4_scales_mins(f["scales"])
    d1 = _half(f["d"]) * sc.float()
    m1 = _half(f["dmin"]) * mn.float()
    q = _spread(f["qs"].reshape(n, 4, 32), _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 4, 2, 32))
    out.copy_(q.view(n, 256))
    out.view(n, 8, 32).mul_(d1.unsqueeze(-1)).sub_(m1.unsqueeze(-1))


def _q5_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """Q4_K plus a fifth bit: sub-block s takes bit s of qh[l] for its element l."""
    f, n = _fields(blocks, GGMLType.Q5_K), blocks.shape[0]
    sc, mn = _k4_scales_mins(f["scales"])
    d1 = _half(f["d"]) * sc.float()
    m1 = _half(f["dmin"]) * mn.float()
    q = _spread(f["qs"].reshape(n, 4, 32), _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 4, 2, 32)).view(n, 256)
    high = _spread(f["qh"], _BIT_SHIFTS, 0x01, _u8(blocks, n, 8, 32)).view(n, 256)
    out.copy_(q.bitwise_or_(high.bitwise_left_shift_(4)))
    out.view(n, 8, 32).mul_(d1.unsqueeze(-1)).sub_(m1.unsqueeze(-1))


def _q6_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """Q6_K: 16 sub-blocks of 16 with int8 scales; 6-bit quants, low 4 bits in ql, high 2 in qh, offset 32."""
    f, n = _fields(blocks, GGMLType.Q6_K), blocks.shape[0]
    dsc = _half(f["d"]) * f["scales"].view(torch.int8).float()
    q = _spread(f["ql"].reshape(n, 2, 64), _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 2, 2, 64)).view(n, 256)
    high = _spread(f["qh"].reshape(n, 2, 32), _CRUMB_SHIFTS, 0x03, _u8(blocks, n, 2, 4, 32)).view(n, 256)
    out.copy_(q.bitwise_or_(high.bitwise_left_shift_(4)).view(torch.int8).sub_(32))
    out.view(n, 16, 16).mul_(dsc.unsqueeze(-1))


def _iq4_lookup(codes: torch.Tensor, out: torch.Tensor) -> None:
    """4-bit codes -> codebook values into out (same number of elements). int32 indices: half of int64's traffic."""
    torch.index_select(_iq4nl_table(codes.device), 0, codes.reshape(-1).to(torch.int32), out=out.view(-1))


def _iq4_nl(blocks: torch.Tensor, out: torch.Tensor) -> None:
    f, n = _fields(blocks, GGMLType.IQ4_NL), blocks.shape[0]
    _iq4_lookup(_spread(f["qs"], _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 2, 16)), out)
    out.mul_(_half(f["d"]))


def _iq4_xs(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """8 sub-blocks of 32 with 6-bit scales (low nibble in scales_l, 2 high bits in the 16-bit scales_h), IQ4_NL codes."""
    f, n = _fields(blocks, GGMLType.IQ4_XS), blocks.shape[0]
    lo = _spread(f["scales_l"], _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 4, 2), dim=-1)  # sub-block 2*byte + nibble
    hi = _spread(f["scales_h"], _CRUMB_SHIFTS, 0x03, _u8(blocks, n, 2, 4), dim=-1)  # sub-block 4*byte + field
    dl = _half(f["d"]) * (lo.view(n, 8) | (hi.view(n, 8) << 4)).view(torch.int8).sub_(32).float()
    _iq4_lookup(_spread(f["qs"].reshape(n, 8, 16), _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 8, 2, 16)), out)
    out.view(n, 8, 32).mul_(dl.unsqueeze(-1))


def _tq1_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """Five base-3 trits per byte: trit n of byte q is ``((q * 3**n) mod 256 * 3) >> 8`` (ggml's and gguf-py's decode)."""
    f, n = _fields(blocks, GGMLType.TQ1_0), blocks.shape[0]
    codes = []
    for field, per_byte in ((f["qs"][:, :32], 5), (f["qs"][:, 32:], 5), (f["qh"], 4)):
        pow3 = torch.tensor([3 ** k for k in range(per_byte)], dtype=torch.int32, device=blocks.device)
        q = (field.to(torch.int32).unsqueeze(1) * pow3.view(1, -1, 1)) & 0xFF  # [n, trit, byte]: value trit*bytes + byte
        codes.append(((q * 3) >> 8).reshape(n, -1))
    out.copy_(torch.cat(codes, dim=1).sub_(1)).mul_(_half(f["d"]))


def _tq2_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """2-bit codes minus 1: value 128*h + 32*k + m is bits 2k..2k+1 of qs[32*h + m]."""
    f, n = _fields(blocks, GGMLType.TQ2_0), blocks.shape[0]
    q = _spread(f["qs"].reshape(n, 2, 32), _CRUMB_SHIFTS, 0x03, _u8(blocks, n, 2, 4, 32))
    out.copy_(q.view(n, 256).view(torch.int8).sub_(1)).mul_(_half(f["d"]))


def _signed_grid(codes: torch.Tensor, grid: torch.Tensor, signs: torch.Tensor, db: torch.Tensor, out: torch.Tensor) -> None:
    """out[value] = (db[sub-block] * grid[codes][value]) * (1 or -1 by the sign bit): ggml's and gguf-py's order."""
    n = out.shape[0]
    torch.index_select(grid, 0, codes.reshape(-1).to(torch.int32), out=out.view(-1, 4))
    out.view(n, 8, 32).mul_(db.unsqueeze(-1))
    out.mul_(signs.reshape(n, 256).to(torch.float32).mul_(-2).add_(1))


def _iq3_xxs(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """8 sub-blocks of 32: a uint32 each (four 7-bit sign groups, the 8th sign the parity, a 4-bit scale), grid points in qs."""
    f, n = _fields(blocks, GGMLType.IQ3_XXS), blocks.shape[0]
    b = f["scales_signs"].reshape(n, 8, 4).to(torch.int64)
    aux = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    db = _half(f["d"]) * (0.5 + (aux >> 28).float()) * 0.5
    groups = torch.stack([(aux >> (7 * k)) & 127 for k in range(4)], dim=-1)  # [n, 8, 4]
    parity = groups.clone()
    for s in (4, 2, 1):
        parity ^= parity >> s
    sign_bytes = groups | ((parity & 1) << 7)
    signs = torch.stack([(sign_bytes >> j) & 1 for j in range(8)], dim=-1)  # [n, 8, 4, 8]: value 32*ib + 8*k + j
    _signed_grid(f["qs"], _iq3_grid(IQ3XXS_POINTS, IQ3XXS_VALUES, blocks.device), signs, db, out)


def _iq3_s(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """8 sub-blocks of 32 with odd 4-bit scales (1 + 2s); 9-bit grid points (qs plus a bit of qh), one sign bit per value."""
    f, n = _fields(blocks, GGMLType.IQ3_S), blocks.shape[0]
    sc = _spread(f["scales"], _NIBBLE_SHIFTS, 0x0F, _u8(blocks, n, 4, 2), dim=-1).view(n, 8)
    db = _half(f["d"]) * (1 + 2 * sc.to(torch.int32)).float()
    high = _spread(f["qh"], _BIT_SHIFTS, 0x01, _u8(blocks, n, 8, 8), dim=-1).view(n, 64)
    codes = f["qs"].to(torch.int32) | (high.to(torch.int32) << 8)
    signs = _spread(f["signs"], _BIT_SHIFTS, 0x01, _u8(blocks, n, 32, 8), dim=-1)
    _signed_grid(codes, _iq3_grid(IQ3S_POINTS, IQ3S_VALUES, blocks.device), signs, db, out)


def _q1_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """128 values: bit j of the 16 bytes set: +d, else -d (ggml's ``bit ? d : neg_d``; gguf-py has no Q1_0)."""
    f, n = _fields(blocks, GGMLType.Q1_0), blocks.shape[0]
    bits = _spread(f["qs"], _BIT_SHIFTS, 0x01, _u8(blocks, n, 16, 8), dim=-1).view(n, 128)
    d = _half(f["d"])
    torch.where(bits.bool(), d, d.neg(), out=out)


def _q2_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """64 values: ``(q - 1)*d``, q bits 2(j%4) of byte j/4 (ggml's ``((int)q - 1) * d``; gguf-py has no Q2_0)."""
    f, n = _fields(blocks, GGMLType.Q2_0), blocks.shape[0]
    q = _spread(f["qs"], _CRUMB_SHIFTS, 0x03, _u8(blocks, n, 16, 4), dim=-1).view(n, 64)
    out.copy_(q.view(torch.int8).sub_(1)).mul_(_half(f["d"]))


@lru_cache(maxsize=16)
def _grid8(points: tuple[int, ...], values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """An IQ2/IQ1 grid as float32 [points, 8] on one device: point k's value i is values[level i of point k]."""
    return torch.tensor([[float(values[(p >> 2 * i) & 3]) for i in range(8)] for p in points], dtype=torch.float32, device=device)


def _signed_grid8(codes: torch.Tensor, grid: torch.Tensor, signs: torch.Tensor, db: torch.Tensor, out: torch.Tensor) -> None:
    """out[value] = (db[sub-block] * grid[codes][value]) * (1 or -1 by the sign bit), for groups of 8 and db [n, 8 or 16]."""
    n = out.shape[0]
    torch.index_select(grid, 0, codes.reshape(-1).to(torch.int32), out=out.view(-1, 8))
    out.view(n, db.shape[1], -1).mul_(db.unsqueeze(-1))
    out.mul_(signs.reshape(n, 256).to(torch.float32).mul_(-2).add_(1))


def _parity_signs(groups: torch.Tensor) -> torch.Tensor:
    """7-bit sign groups -> their 8 sign bits (the 8th makes the count of negatives even: ggml's ksigns_iq2xs), [..., 8]."""
    parity = groups.clone()
    for s in (4, 2, 1):
        parity ^= parity >> s
    full = groups | ((parity & 1) << 7)
    return torch.stack([(full >> j) & 1 for j in range(8)], dim=-1)


def _nibble_scales(scales: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """IQ2_XS/IQ2_S: 4-bit scales (low nibble first) of the 16 sub-blocks of 16 -> ``d * (0.5 + s) * 0.25``."""
    n = scales.shape[0]
    sc = _spread(scales, _NIBBLE_SHIFTS, 0x0F, _u8(scales, n, 8, 2), dim=-1).view(n, 16)
    return d * (0.5 + sc.float()) * 0.25


def _iq2_xxs(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """8 sub-blocks of 32: four grid bytes, then a uint32 of four 7-bit sign groups and a 4-bit scale."""
    f, n = _fields(blocks, GGMLType.IQ2_XXS), blocks.shape[0]
    q = f["qs"].reshape(n, 8, 8)
    b = q[..., 4:].to(torch.int64)
    aux = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    db = _half(f["d"]) * (0.5 + (aux >> 28).float()) * 0.25
    signs = _parity_signs(torch.stack([(aux >> (7 * k)) & 127 for k in range(4)], dim=-1))
    _signed_grid8(q[..., :4], _grid8(IQ2XXS_POINTS, IQ2_VALUES, blocks.device), signs, db, out)


def _iq2_xs(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """32 uint16 words: a 9-bit grid point and a 7-bit sign group each; 16 4-bit scales."""
    f, n = _fields(blocks, GGMLType.IQ2_XS), blocks.shape[0]
    w = f["qs"].reshape(n, 32, 2).to(torch.int64)
    w = w[..., 0] | (w[..., 1] << 8)
    db = _nibble_scales(f["scales"], _half(f["d"]))
    _signed_grid8(w & 511, _grid8(IQ2XS_POINTS, IQ2_VALUES, blocks.device), _parity_signs(w >> 9), db, out)


def _iq2_s(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """32 grid points of 10 bits (a byte of qs, two bits of qh), a full sign byte each; 16 4-bit scales."""
    f, n = _fields(blocks, GGMLType.IQ2_S), blocks.shape[0]
    high = _spread(f["qh"], _CRUMB_SHIFTS, 0x03, _u8(blocks, n, 8, 4), dim=-1).view(n, 32)
    codes = f["qs"].to(torch.int32) | (high.to(torch.int32) << 8)
    signs = _spread(f["signs"], _BIT_SHIFTS, 0x01, _u8(blocks, n, 32, 8), dim=-1)
    db = _nibble_scales(f["scales"], _half(f["d"]))
    _signed_grid8(codes, _grid8(IQ2S_POINTS, IQ2_VALUES, blocks.device), signs, db, out)


def _iq1_values(codes: torch.Tensor, delta: torch.Tensor, dl: torch.Tensor, out: torch.Tensor) -> None:
    """out[value] = dl[sub-block] * (grid[codes][value] + delta[group]): ggml's order (the sum first)."""
    n = out.shape[0]
    grid = _grid8(IQ1S_POINTS, IQ1S_VALUES, out.device)
    torch.index_select(grid, 0, codes.reshape(-1).to(torch.int32), out=out.view(-1, 8))
    out.view(n, 32, 8).add_(delta.unsqueeze(-1))
    out.view(n, dl.shape[1], -1).mul_(dl.unsqueeze(-1))


def _iq1_s(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """8 sub-blocks of 32: four 11-bit grid points (qs bytes, 3 bits each of a uint16 qh), a 3-bit scale and the delta's sign."""
    f, n = _fields(blocks, GGMLType.IQ1_S), blocks.shape[0]
    h = f["qh"].reshape(n, 8, 2).to(torch.int64)
    h = h[..., 0] | (h[..., 1] << 8)
    codes = f["qs"].reshape(n, 8, 4).to(torch.int64) | (torch.stack([(h >> (3 * k)) & 7 for k in range(4)], dim=-1) << 8)
    dl = _half(f["d"]) * (2 * ((h >> 12) & 7) + 1).float()
    delta = torch.where((h & 0x8000) != 0, -0.125, 0.125).to(torch.float32).repeat_interleave(4, dim=1)
    _iq1_values(codes, delta, dl, out)


def _iq1_m(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """16 sub-blocks of 16: 3-bit scales in four uint16 words whose top nibbles hold the fp16 d; 11-bit grid points, a delta sign per 8."""
    f, n = _fields(blocks, GGMLType.IQ1_M), blocks.shape[0]
    w = f["scales"].reshape(n, 4, 2).to(torch.int64)
    sc = w[..., 0] | (w[..., 1] << 8)
    bits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0xF0) | ((sc[:, 2] >> 4) & 0xF00) | (sc[:, 3] & 0xF000)
    d = bits.to(torch.int16).view(torch.float16).float().unsqueeze(1)
    s3 = torch.stack([(sc >> (3 * k)) & 7 for k in range(4)], dim=-1).reshape(n, 16)
    dl = d * (2 * s3 + 1).float()
    qh = f["qh"].to(torch.int64)
    per = torch.stack([qh & 15, qh >> 4], dim=-1).reshape(n, 32)  # each group's 3 code bits and delta bit
    codes = f["qs"].to(torch.int64) | ((per & 7) << 8)
    delta = torch.where((per & 8) != 0, -0.125, 0.125).to(torch.float32)
    _iq1_values(codes, delta, dl, out)


_BLOCK_KERNELS: dict[GGMLType, Callable[[torch.Tensor, torch.Tensor], None]] = {
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8_0,
    GGMLType.Q2_K: _q2_k,
    GGMLType.Q3_K: _q3_k,
    GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k,
    GGMLType.Q6_K: _q6_k,
    GGMLType.IQ4_NL: _iq4_nl,
    GGMLType.IQ4_XS: _iq4_xs,
    GGMLType.TQ1_0: _tq1_0,
    GGMLType.TQ2_0: _tq2_0,
    GGMLType.IQ3_XXS: _iq3_xxs,
    GGMLType.IQ3_S: _iq3_s,
    GGMLType.Q1_0: _q1_0,
    GGMLType.Q2_0: _q2_0,
    GGMLType.IQ2_XXS: _iq2_xxs,
    GGMLType.IQ2_XS: _iq2_xs,
    GGMLType.IQ2_S: _iq2_s,
    GGMLType.IQ1_S: _iq1_s,
    GGMLType.IQ1_M: _iq1_m,
}

# Values per kernel call: CPU code buffers stay below glibc's mmap threshold (recycled, not page-faulted)
_CHUNK_VALUES_CPU = 1 << 24
_CHUNK_VALUES_OTHER = 1 << 26

SUPPORTED_TYPES: frozenset[int] = frozenset(int(t) for t in (*FLOAT_ELEMENT_DTYPES, *INT_ELEMENT_DTYPES, *_BLOCK_KERNELS))


def _type_name(ggml_type: int) -> str:
    try:
        return f"{GGMLType(ggml_type).name} ({int(ggml_type)})"
    except ValueError:
        removed = REMOVED_TYPES.get(int(ggml_type))
        return f"id {int(ggml_type)}" + (f" ({removed}, removed from ggml)" if removed else "")


def _reinterpret(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bytes -> elements of dtype; a slice at an odd storage offset is copied first (view() needs whole elements)."""
    raw = raw.contiguous()
    if raw.storage_offset() % dtype.itemsize:
        raw = raw.clone()
    return raw.view(dtype)


def dequantize(raw: torch.Tensor, ggml_type: int, shape: tuple[int, ...], *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode one ggml tensor's bytes (``shape``: ggml ``ne`` reversed) to values on ``raw``'s device."""
    if sys.byteorder != "little":
        raise RuntimeError("ggml dequantization reinterprets little-endian bytes in place; this host is big-endian")
    if int(ggml_type) not in SUPPORTED_TYPES:
        raise ValueError(f"cannot dequantize ggml type {_type_name(ggml_type)}; supported: {', '.join(GGMLType(t).name for t in sorted(SUPPORTED_TYPES))}")
    t = GGMLType(int(ggml_type))
    if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8 or raw.dim() != 1:
        what = f"{raw.dtype} tensor of {raw.dim()} dims" if isinstance(raw, torch.Tensor) else type(raw).__name__
        raise ValueError(f"{t.name}: raw must be a 1-D torch.uint8 tensor, got a {what}")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"{t.name}: negative dimension in shape {shape}")
    block, _ = BLOCK_GEOMETRY[t]
    if block > 1 and not shape:
        raise ValueError(f"{t.name}: a scalar cannot hold a {block}-element block")
    expected = tensor_nbytes(t, tuple(reversed(shape)))  # raises ValueError when the row is not whole blocks
    if raw.numel() != expected:
        raise ValueError(f"{t.name} tensor of shape {shape} needs {expected} bytes, got {raw.numel()}")

    if t in INT_ELEMENT_DTYPES:
        return _reinterpret(raw, INT_ELEMENT_DTYPES[t]).to(torch.int64).reshape(shape)
    if t in FLOAT_ELEMENT_DTYPES:
        return _reinterpret(raw, FLOAT_ELEMENT_DTYPES[t]).to(dtype).reshape(shape)
    block_bytes = BLOCK_GEOMETRY[t][1]
    n_blocks = expected // block_bytes
    blocks = raw.contiguous().view(n_blocks, block_bytes)
    kernel = _BLOCK_KERNELS[t]
    out = torch.empty((n_blocks, block), dtype=dtype, device=raw.device)
    step = max(1, (_CHUNK_VALUES_CPU if raw.device.type == "cpu" else _CHUNK_VALUES_OTHER) // block)
    # other dtypes: float32 scratch per chunk, rounded once into out
    scratch = None if dtype == torch.float32 else torch.empty((min(step, n_blocks), block), dtype=torch.float32, device=raw.device)
    for i in range(0, n_blocks, step):
        dst = out[i : i + step]
        if scratch is None:
            kernel(blocks[i : i + step], dst)
        else:
            tmp = scratch[: dst.shape[0]]
            kernel(blocks[i : i + step], tmp)
            dst.copy_(tmp)
    return out.reshape(shape)
