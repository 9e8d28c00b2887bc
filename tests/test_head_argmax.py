"""LazyMatrix.argmax: the greedy rows of x @ M.T a chunk of M at a time, as project(x).argmax(-1) picks them.

Kept (decoded) and streamed (read from a safetensors file the test writes, F32/F16/BF16) matrices over more
than one chunk; ties across chunks go to the first, a NaN wins as it does in argmax.
"""

from __future__ import annotations

import pytest
import torch

from dflash_convert.runtime import weights as ws
from dflash_convert.runtime.weights import LazyMatrix
from dflash_convert.sources.safetensors import read_header

ROWS, COLS = 1000, 48
TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _safetensors(path, values: torch.Tensor, dtype: str):
    """A one-tensor safetensors file holding ``values`` as ``dtype``; its TensorRef."""
    import json
    import struct

    torch_dtype = TORCH_DTYPES[dtype]
    raw = values.to(torch_dtype).view(torch.int16 if dtype != "F32" else torch.int32).numpy().tobytes()
    head = json.dumps({"m": {"dtype": dtype, "shape": list(values.shape), "data_offsets": [0, len(raw)]}}).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + raw)
    (ref,), _ = read_header(path)
    return ref, values.to(torch_dtype).float()


def _cases(monkeypatch, tmp_path, dtype):
    monkeypatch.setattr(ws, "HEAD_CHUNK_ROWS", 256)  # four chunks, the last one short
    g = torch.Generator().manual_seed(11)
    values = torch.randn(ROWS, COLS, generator=g)
    values[700] = values[100]  # equal rows in different chunks: the first wins
    values[300] = values[299]  # ... and in the same chunk
    ref, exact = _safetensors(tmp_path / "m.safetensors", values, dtype)
    streamed = LazyMatrix(ref, "cpu", torch.float32, "head", keep=False)
    kept = LazyMatrix.of(exact, "head", dtype)
    x = torch.randn(40, COLS, generator=g)
    x[0], x[1] = exact[100] * 3, exact[299] * 3  # rows whose best is a tie
    return streamed, kept, exact, x


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_argmax_is_the_projection_argmax(monkeypatch, tmp_path, dtype):
    streamed, kept, exact, x = _cases(monkeypatch, tmp_path, dtype)
    assert streamed.streams() and not kept.streams()
    want = (x @ exact.T).argmax(dim=-1)
    assert int(want[0]) == 100 and int(want[1]) == 299
    for m in (streamed, kept):
        assert torch.equal(m.project(x), x @ exact.T)
        assert torch.equal(m.argmax(x), want)


def test_a_nan_wins_as_in_argmax(monkeypatch, tmp_path):
    streamed, kept, exact, x = _cases(monkeypatch, tmp_path, "F32")
    x[5, 0] = float("nan")  # every logit of row 5 is NaN: argmax says 0
    exact2 = exact.clone()
    exact2[900, 0] = float("nan")  # one NaN logit per row, in the last chunk: argmax picks it
    for m, e in ((kept, exact), (LazyMatrix.of(exact2, "head"), exact2)):
        assert torch.equal(m.argmax(x), (x @ e.T).argmax(dim=-1))
