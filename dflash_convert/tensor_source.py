"""Where a drafter tensor's values come from: one interface, whatever the input format.

A ``TensorSource`` has a PyTorch-order shape, an element type (a safetensors dtype or a ggml type
name) and hands out whole rows (ggml's ne[0]) as raw little-endian words or block bytes. Readers
provide the concrete sources; this module holds those that need none: computed arrays and the value
transforms (NeoX rows, one replaced row), which wrap a source so every consumer reads the same values.
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

import numpy as np

from .files import FdCache


@runtime_checkable
class TensorSource(Protocol):
    """Shape, element type, and rows [a, b) as numpy."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape, outermost dimension first."""

    @property
    def dtype(self) -> str:
        """The tensor's element type name (``BF16``, ``F32``, ...)."""

    def rows(self, a: int, b: int, fds: FdCache | None = None) -> np.ndarray:
        """Rows [a, b) as one 1-D array: raw words for element types, block bytes for quantized ones."""
        ...


def n_rows(shape: tuple[int, ...]) -> int:
    """Rows of a tensor: every dimension but the last (a 1-D tensor is one row; a scalar too)."""
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


def row_length(shape: tuple[int, ...]) -> int:
    """Values per row of a tensor of this shape."""
    return shape[-1] if shape else 1


class ArraySource:
    """A small tensor whose final values were computed by a reader (d2t as absolute ids)."""

    def __init__(self, values: np.ndarray, dtype: str) -> None:
        self.values = np.ascontiguousarray(values)
        self._dtype = dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return tuple(self.values.shape)

    @property
    def dtype(self) -> str:
        """The element type the array stands for."""
        return self._dtype

    def rows(self, a: int, b: int, fds: FdCache | None = None) -> np.ndarray:
        """Rows [a, b) of the array."""
        r = row_length(self.shape)
        return self.values.reshape(-1)[a * r:b * r]

    def __repr__(self) -> str:
        return f"ArraySource({self._dtype}, {list(self.shape)})"


class NeoxPermuted:
    """Interleaved (GPT-J) rotary rows -> NeoX: within each head, even rows first, then odd."""

    def __init__(self, inner: TensorSource, head_dim: int) -> None:
        self.inner, self.head_dim = inner, head_dim

    @property
    def shape(self) -> tuple[int, ...]:
        """The wrapped tensor's shape."""
        return self.inner.shape

    @property
    def dtype(self) -> str:
        """The wrapped tensor's element type."""
        return self.inner.dtype

    @property
    def row_align(self) -> int:
        """Row chunks must start on a multiple of this (one head), so each head permutes whole."""
        return self.head_dim

    def rows(self, a: int, b: int, fds: FdCache | None = None) -> np.ndarray:
        """Rows [a, b) with each head's interleaved pairs moved to NeoX order."""
        h = self.head_dim
        if len(self.shape) == 1:  # a q/k norm: one row of head_dim values, permuted element-wise
            return _interleaved_to_neox(self.inner.rows(0, 1, fds), h, 1) if b > a else self.inner.rows(0, 0, fds)
        lo, hi = a // h * h, -(-b // h) * h
        r = row_length(self.shape)
        out = _interleaved_to_neox(self.inner.rows(lo, hi, fds), h, r)
        return out[(a - lo) * r:(b - lo) * r]

    def __repr__(self) -> str:
        return f"NeoxPermuted({self.inner!r}, head_dim={self.head_dim})"


class RowOverride:
    """One row replaced by given raw words (a mask embedding written over the target's row)."""

    def __init__(self, inner: TensorSource, row: int, words: np.ndarray) -> None:
        self.inner, self.row, self.words = inner, row, words

    @property
    def shape(self) -> tuple[int, ...]:
        """The wrapped tensor's shape."""
        return self.inner.shape

    @property
    def dtype(self) -> str:
        """The wrapped tensor's element type."""
        return self.inner.dtype

    def rows(self, a: int, b: int, fds: FdCache | None = None) -> np.ndarray:
        """Rows [a, b) with the overriding row written over its place."""
        raw = self.inner.rows(a, b, fds)
        if a <= self.row < b:
            r = row_length(self.shape)
            raw = raw.copy()
            raw[(self.row - a) * r:(self.row - a + 1) * r] = self.words
        return raw

    def __repr__(self) -> str:
        return f"RowOverride({self.inner!r}, row={self.row})"


def _interleaved_to_neox(words: np.ndarray, head_dim: int, row: int) -> np.ndarray:
    return np.ascontiguousarray(words.reshape(-1, head_dim // 2, 2, row).transpose(0, 2, 1, 3)).reshape(-1)


def unwrap(source: TensorSource) -> TensorSource:
    """The source under any transforms (where the bytes are read from)."""
    while isinstance(source, (NeoxPermuted, RowOverride)):
        source = source.inner
    return source


def source_path(source: TensorSource) -> os.PathLike | None:
    """The file a source reads from (for messages), None for computed arrays."""
    return getattr(unwrap(source), "path", None)
