"""Hand-made GGUF bytes for hostile-input tests: every field spelled out, nothing validated.

``GGUFBytes`` assembles a file from raw parts so a test can put any value in any field (a count
of 2**63, a dimension of 0, an offset past the end) and know exactly which byte it changed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

STRING, ARRAY = 8, 9
U8, I8, U16, I16, U32, I32, F32, BOOL, U64, I64, F64 = 0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12
T_F32, T_F16, T_Q8_0, T_I64 = 0, 1, 8, 27


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, v: int) -> bytes:
    return kv(key, U32, struct.pack("<I", v))


def kv_str(key: str, v: str | bytes) -> bytes:
    return kv(key, STRING, s(v))


def kv_arr(key: str, sub: int, count: int, items: bytes) -> bytes:
    return kv(key, ARRAY, struct.pack("<IQ", sub, count) + items)


def tinfo(name: str | bytes, ne: list[int], gtype: int, offset: int, n_dims: int | None = None) -> bytes:
    dims = len(ne) if n_dims is None else n_dims
    return s(name) + struct.pack("<I", dims) + b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", gtype, offset)


@dataclass
class GGUFBytes:
    """A GGUF file as parts; ``bytes()`` joins them, padding the tensor infos to ``alignment``."""

    kvs: list[bytes] = field(default_factory=lambda: [kv_str("general.architecture", "dflash")])
    infos: list[bytes] = field(default_factory=list)
    data: bytes = b""
    magic: bytes = b"GGUF"
    version: int = 3
    n_tensors: int | None = None
    n_kv: int | None = None
    alignment: int = 32

    def header(self) -> bytes:
        n_t = len(self.infos) if self.n_tensors is None else self.n_tensors
        n_kv = len(self.kvs) if self.n_kv is None else self.n_kv
        return self.magic + struct.pack("<IQQ", self.version, n_t, n_kv) + b"".join(self.kvs) + b"".join(self.infos)

    def __bytes__(self) -> bytes:
        h = self.header()
        pad = (-len(h)) % self.alignment if self.infos else 0
        return h + b"\0" * pad + self.data


def one_tensor(ne: list[int] | None = None, gtype: int = T_F32, data: bytes | None = None, **kw) -> GGUFBytes:
    """A valid file with one F32 tensor ``x`` of shape ``ne`` (default {4})."""
    ne = [4] if ne is None else ne
    n = 1
    for d in ne:
        n *= d
    return GGUFBytes(infos=[tinfo("x", ne, gtype, 0)], data=b"\0" * (4 * n) if data is None else data, **kw)
