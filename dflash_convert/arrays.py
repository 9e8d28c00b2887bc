"""GGUF's array values as the reader makes them and the writer writes them: compact, never a list.

``NumArray`` is one numpy copy of a numeric array's bytes, ``StrArray`` one buffer of a string
array in GGUF's own form; both read like the list they stand for and make Python objects only
when an item is asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np


class NumArray(Sequence):
    """A numeric GGUF array held as one compact numpy copy of its bytes."""

    __slots__ = ("data",)

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    def __len__(self) -> int:
        return int(self.data.shape[0])

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return self.data[i].tolist()
        return self.data[i].item()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.data.tolist())

    def tolist(self) -> list[Any]:
        """The values as a Python list."""
        return self.data.tolist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NumArray):
            return len(self) == len(other) and bool(np.array_equal(self.data, other.data))
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(map(repr, self.data[:8].tolist()))
        return f"[{head}{', ...' if len(self) > 8 else ''}]"


def _prefix_layout(offsets: np.ndarray, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(byte positions of the u64 length prefixes, mask of the items' text bytes) of a GGUF-form string buffer."""
    prefix = (offsets[:-1, None].astype(np.int64) + np.arange(8)).ravel()
    is_text = np.ones(nbytes, dtype=bool)
    is_text[prefix] = False
    return prefix, is_text


class StrArray(Sequence):
    """A string GGUF array held as GGUF stores it (u64 length, bytes) in one buffer, with the ``len + 1`` item offsets."""

    __slots__ = ("data", "offsets")

    def __init__(self, data: bytes | bytearray, offsets: np.ndarray) -> None:
        self.data = data  # never changed after parsing
        self.offsets = offsets

    @classmethod
    def of(cls, items: Sequence[bytes | str]) -> StrArray:
        """A StrArray of a list of items (str encoded as UTF-8), built in whole-array numpy steps; a StrArray as it is."""
        if isinstance(items, StrArray):
            return items
        encoded = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in items]
        n = len(encoded)
        offsets = np.zeros(n + 1, dtype=np.int64)
        if n == 0:
            return cls(b"", offsets)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
        np.cumsum(lengths + 8, out=offsets[1:])
        raw = np.empty(int(offsets[-1]), dtype=np.uint8)
        prefix, is_text = _prefix_layout(offsets, raw.shape[0])
        raw[prefix] = lengths.astype("<u8").view(np.uint8)
        raw[is_text] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        return cls(raw.tobytes(), offsets)

    @classmethod
    def checked(cls, data: bytes, offsets: np.ndarray) -> StrArray | None:
        """A StrArray of GGUF-form ``data`` and ``offsets`` from a store we wrote, or None when they do not agree or an item is not UTF-8."""
        if offsets.ndim != 1 or offsets.shape[0] < 1 or int(offsets[0]) != 0 or int(offsets[-1]) != len(data):
            return None
        steps = np.diff(offsets.astype(np.int64))
        if steps.size and int(steps.min()) < 8:
            return None
        raw = np.frombuffer(data, dtype=np.uint8)
        prefix, is_text = _prefix_layout(offsets, raw.shape[0])
        if not np.array_equal(raw[prefix].view("<u8"), steps - 8):
            return None
        try:
            raw[is_text].tobytes().decode("utf-8")
        except UnicodeDecodeError:
            return None
        return cls(data, offsets)

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("StrArray index out of range")
        return bytes(self.data[int(self.offsets[i]) + 8:int(self.offsets[i + 1])])

    def __iter__(self) -> Iterator[bytes]:
        data, offsets = self.data, self.offsets
        chunk = 1 << 16  # offsets as Python ints a chunk at a time: iterating stays lazy
        for a in range(0, len(self), chunk):
            o = offsets[a:a + chunk + 1].tolist()
            for j in range(len(o) - 1):
                yield bytes(data[o[j] + 8:o[j + 1]])

    def tolist(self) -> list[bytes]:
        """The items as a list of bytes."""
        return list(self)

    def gguf_items_bytes(self) -> bytes:
        """The items as a GGUF array holds them (the buffer itself), remembered so a read-back of this write skips the walk."""
        out = bytes(self.data[int(self.offsets[0]):int(self.offsets[-1])])
        remember(self)
        return out

    def texts(self) -> list[str]:
        """Every item decoded (invalid UTF-8 replaced)."""
        return [b.decode("utf-8", "replace") for b in self]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StrArray):
            return (len(self) == len(other) and bool(np.array_equal(self.offsets - self.offsets[0], other.offsets - other.offsets[0]))
                    and self.data[int(self.offsets[0]):int(self.offsets[-1])] == other.data[int(other.offsets[0]):int(other.offsets[-1])])
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(map(repr, self[:8]))
        return f"[{head}{', ...' if len(self) > 8 else ''}]"


# The string arrays this process wrote or read last. A file written from one (the validate gate reading
# back the file just written, quantize's output beside its input) holds the same bytes, and a region
# equal to an array's bytes parses to that array: one comparison instead of a walk over 300k items.
_RECENT: list[StrArray] = []
_RECENT_MAX = 8
_RECENT_BYTES = 64 << 20  # a larger array (only a hostile file holds one) is not kept alive for this


def remember(a: StrArray) -> None:
    """Keep ``a`` among the recent arrays (unless it is too large to keep alive for this)."""
    if any(r is a for r in _RECENT) or int(a.offsets[-1]) - int(a.offsets[0]) > _RECENT_BYTES:
        return
    _RECENT.append(a)
    del _RECENT[:-_RECENT_MAX]


def known_at(buf: memoryview, pos: int, count: int) -> StrArray | None:
    """A remembered array of ``count`` items whose bytes are those at ``pos``, as a new StrArray."""
    for a in reversed(_RECENT):
        start, stop = int(a.offsets[0]), int(a.offsets[-1])
        n = stop - start
        if len(a) != count or pos + n > len(buf):
            continue
        here = bytes(buf[pos:pos + n])
        if here == a.data[start:stop]:
            return StrArray(here, a.offsets - a.offsets[0])
    return None
