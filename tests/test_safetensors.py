"""Hostile and broken safetensors files: each is rejected with its own clear message."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dflash_convert.errors import InputFileError
from dflash_convert.sources.safetensors import MAX_HEADER_BYTES, read_header


def raw_file(path: Path, header: dict | bytes, data: bytes = b"", *, length: int | None = None) -> Path:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body + data)
    return path


def good(path: Path) -> Path:
    save_file({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)},
              str(path), metadata={"format": "pt"})
    return path


def test_real_file_reads_back(tmp_path):
    refs, meta = read_header(good(tmp_path / "m.safetensors"))
    assert meta == {"format": "pt"}
    by = {r.name: r for r in refs}
    assert by["a"].shape == (2, 3) and by["a"].dtype == "F32"
    assert by["a"].read().tolist() == [0, 1, 2, 3, 4, 5]
    assert by["b"].read().tolist() == [0x3F80] * 4  # bf16 words of 1.0


E = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
CASES = {
    "too_short": (b"\x01\x02", None, "too short for a header"),
    "huge_header_length": (None, dict(header={}, length=MAX_HEADER_BYTES + 1), "exceeds"),
    "header_past_end": (None, dict(header={"a": E}, length=10_000), "truncated safetensors file"),
    "not_utf8": (None, dict(header=b"\xff\xfe{}"), "not UTF-8"),
    "not_json": (None, dict(header=b"{not json"), "not valid JSON"),
    "json_array": (None, dict(header=b"[1, 2]"), "not a JSON object"),
    "duplicate_key": (None, dict(header=b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                                      b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', data=b"\0" * 4),
                      "duplicate key"),
    "unknown_dtype": (None, dict(header={"a": {**E, "dtype": "Q9"}}, data=b"\0" * 8), "unknown dtype"),
    "negative_dim": (None, dict(header={"a": {**E, "shape": [-2]}}, data=b"\0" * 8), "shape must be"),
    "float_dim": (None, dict(header={"a": {**E, "shape": [2.0]}}, data=b"\0" * 8), "shape must be"),
    "too_many_dims": (None, dict(header={"a": {**E, "shape": [1] * 9, "data_offsets": [0, 4]}}, data=b"\0" * 4), "shape must be"),
    "offsets_reversed": (None, dict(header={"a": {**E, "data_offsets": [8, 0]}}, data=b"\0" * 8), "before begin"),
    "offsets_not_pair": (None, dict(header={"a": {**E, "data_offsets": [0]}}, data=b"\0" * 8), "two non-negative"),
    "size_mismatch": (None, dict(header={"a": {**E, "shape": [3]}}, data=b"\0" * 8), "needs 12"),
    "truncated_data": (None, dict(header={"a": E}, data=b"\0" * 5), "truncated file"),
    "overlap": (None, dict(header={"a": E, "b": {**E, "data_offsets": [4, 12]}}, data=b"\0" * 12), "overlaps"),
    "hole": (None, dict(header={"a": E, "b": {**E, "data_offsets": [12, 20]}}, data=b"\0" * 20), "hole"),
    "trailing_bytes": (None, dict(header={"a": E}, data=b"\0" * 16), "trailing bytes"),
    "extra_entry_field": (None, dict(header={"a": {**E, "evil": 1}}, data=b"\0" * 8), "exactly dtype, shape and data_offsets"),
    "bad_metadata": (None, dict(header={"__metadata__": {"x": 1}, "a": E}, data=b"\0" * 8), "__metadata__"),
    "deeply_nested": (None, dict(header=b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "nests JSON 100001 levels deep"),
    "huge_shape": (None, dict(header={"a": {**E, "shape": [1 << 32] * 3}}, data=b"\0" * 8), "needs 316912650057057350374175801344"),
    "huge_number": (None, dict(header=b'{"a": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 8]}}',
                               data=b"\0" * 8), "not valid JSON"),
    "float_offset": (None, dict(header=b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 1e400]}}', data=b"\0" * 8),
                     "two non-negative integers"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_corrupt_file_rejected_with_specific_message(tmp_path, case):
    raw, spec, needle = CASES[case]
    path = tmp_path / f"{case}.safetensors"
    if raw is not None:
        path.write_bytes(raw)
    else:
        raw_file(path, **spec)
    with pytest.raises(InputFileError) as e:
        read_header(path)
    assert needle in str(e.value)
    assert str(path) in str(e.value)  # the message names the file


def test_read_past_a_file_truncated_after_indexing(tmp_path):
    path = good(tmp_path / "m.safetensors")
    refs, _ = read_header(path)
    data = path.read_bytes()
    path.write_bytes(data[:-4])  # someone truncates the file between indexing and reading
    b = next(r for r in refs if r.name == "b")
    with pytest.raises(InputFileError, match="truncated"):
        b.read()
