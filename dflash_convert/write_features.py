"""Write a features file (format/features.py) as a stream: the header first, then one sequence at a time.

``capture`` knows every sequence's length before it computes any feature (the greedy continuations
come first), so the safetensors header is written up front and each sequence's arrays follow as
they are made: memory holds one sequence. The file goes through ``outputs.TemporaryOutput`` (an
exclusive, unpredictable name, renamed into place at the end).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .errors import DFlashError
from .format.features import LAYER_INPUTS, PROMPT_LENGTH, SEQUENCE, TOKENS
from .outputs import TemporaryOutput, clear_stale_partials

ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8}
HEADER_ALIGN = 8


class FeatureWriter:
    """``write(i, tokens, prompt_length, layer_inputs)`` for each sequence in order, then ``commit()``."""

    def __init__(self, out: Path, lengths: list[int], n_layers: int, hidden: int, dtype: str, metadata: dict[str, str],
                 *, replace: bool = True) -> None:
        self.out, self.lengths, self.shape, self.dtype, self.replace = Path(out), lengths, (n_layers, hidden), dtype, replace
        self.notes = clear_stale_partials(self.out, force=False)
        header: dict[str, object] = {"__metadata__": metadata}
        offset = 0
        self.expected: list[list[tuple[str, int]]] = []
        for i, L in enumerate(lengths):
            entries = []
            for name, dt, shape in ((TOKENS, "I64", [L]), (PROMPT_LENGTH, "I64", [1]), (LAYER_INPUTS, dtype, [n_layers, L, hidden])):
                n = int(np.prod(shape)) * ITEMSIZE[dt]
                header[SEQUENCE.format(i=i) + name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + n]}
                entries.append((name, n))
                offset += n
            self.expected.append(entries)
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-(len(text) + 8) % HEADER_ALIGN)
        self.tmp = TemporaryOutput(self.out)
        self._fd_file = os.fdopen(os.dup(self.tmp.fd), "wb")
        self._put(len(text).to_bytes(8, "little") + text)
        self.next = 0

    def _put(self, data: bytes | memoryview) -> None:
        try:
            self._fd_file.write(data)
        except OSError as e:
            raise DFlashError(f"cannot write: {e.strerror or e}", self.out) from e

    def write(self, i: int, tokens: np.ndarray, prompt_length: int, layer_inputs: np.ndarray) -> None:
        """Sequence ``i``: tokens [L] int, layer_inputs [S, L, E] float32 (converted to the file's dtype)."""
        assert i == self.next, "sequences are written in order"
        L = self.lengths[i]
        if tokens.shape != (L,) or layer_inputs.shape != (self.shape[0], L, self.shape[1]):
            raise DFlashError(f"internal error: sequence {i} has shapes {tokens.shape}, {layer_inputs.shape}")
        self._put(np.ascontiguousarray(tokens, dtype="<i8").tobytes())
        self._put(np.array([prompt_length], dtype="<i8").tobytes())
        x = np.ascontiguousarray(layer_inputs, dtype=np.float32)
        if self.dtype == "F16":
            x = x.astype("<f2")
        elif self.dtype == "BF16":  # round to nearest even, as torch does
            bits = x.view(np.uint32)
            x = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
        self._put(memoryview(x).cast("B"))
        self.next += 1

    def commit(self) -> Path:
        """Rename the finished features file into place; refuses a file with sequences missing."""
        if self.next != len(self.lengths):
            raise DFlashError(f"internal error: {self.next} of {len(self.lengths)} sequences written")
        try:
            self._fd_file.close()
        except OSError as e:
            raise DFlashError(f"cannot write: {e.strerror or e}", self.out) from e
        return self.tmp.commit(replace=self.replace)

    def discard(self) -> None:
        """Close and remove the unfinished features file."""
        try:
            self._fd_file.close()
        except OSError:
            pass
        self.tmp.discard()
