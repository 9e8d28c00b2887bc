"""The imatrix reader (sources/imatrix.py) on hand-made files: llama-quantize's normalisation, and hostile input.

Each hostile file is refused as one InputFileError naming the file, before anything is allocated from
its counts; the command line turns it into one error line, exit 2, nothing written. No llama.cpp build
needed (test_quantize_imatrix.py compares with llama-quantize itself).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from dflash_convert import convert
from dflash_convert.errors import InputFileError
from dflash_convert.sources.imatrix import c_string, lround_counts, read_imatrix
from fixtures.drafters import make_zlab_drafter
from fixtures.imatrix_files import write_gguf_imatrix, write_legacy_imatrix

F = np.float32
NAME = "blk.0.attn_q.weight"


def gguf(tmp_path: Path, **kw) -> Path:
    sums = kw.pop("sums", {NAME: np.arange(1, 9, dtype=F)[None, :] * 10})
    counts = kw.pop("counts", {NAME: np.array([10.0])})
    return write_gguf_imatrix(tmp_path / "m.gguf", sums, counts, **kw)


def refused(path: Path, match: str) -> None:
    with pytest.raises(InputFileError, match=match) as e:
        read_imatrix(path)
    assert str(path) in str(e.value)


# --- what llama-quantize hands its quantizer

def test_gguf_sums_divided_by_rounded_counts(tmp_path):
    sums = {NAME: np.arange(1, 9, dtype=F)[None, :] * 10, "b": np.stack([np.full(4, 6, F), np.full(4, 7, F)]),
            "c": np.full((1, 3), 5, F), "d": np.full((1, 2), 9, F)}
    counts = {NAME: np.array([10.0]), "b": np.array([2.5, 0.49]), "c": np.array([np.nan]), "d": np.array([-4.0])}
    m = read_imatrix(gguf(tmp_path, sums=sums, counts=counts, datasets=["a.txt", "b.txt"], chunk_count=7))
    assert not m.legacy and m.datasets == (b"a.txt", b"b.txt") and m.chunk_count == 7 and m.entries_count == 4
    np.testing.assert_array_equal(m.values[NAME], np.arange(1, 9, dtype=F))
    # per matrix: lround(2.5) = 3 divides the first slice, lround(0.49) = 0 makes the second 1.0
    np.testing.assert_array_equal(m.values["b"], np.array([2, 2, 2, 2, 1, 1, 1, 1], F))
    np.testing.assert_array_equal(m.values["c"], np.ones(3, F))  # a NaN count: lround gives INT64_MIN, not positive
    np.testing.assert_array_equal(m.values["d"], np.ones(2, F))


def test_lround_is_half_away_from_zero():
    got = lround_counts(np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, np.inf, 1e30], F))
    assert got.tolist() == [1, 2, 3, -1, -3, 0, -(1 << 63), -(1 << 63)]


def test_legacy_values_divided_by_ncall(tmp_path):
    p = write_legacy_imatrix(tmp_path / "m.dat", {NAME: np.full(4, 6, F), "x": np.full(2, 3, F)}, ncall=3, chunk_count=12,
                             dataset="wiki.train.raw")
    m = read_imatrix(p)
    assert m.legacy and m.chunk_count == 12 and m.datasets == (b"wiki.train.raw",)
    np.testing.assert_array_equal(m.values[NAME], np.full(4, 2, F))
    for ncall in (0, -5):  # not positive: the values as stored
        np.testing.assert_array_equal(read_imatrix(write_legacy_imatrix(tmp_path / "z.dat", {"x": np.full(2, 3, F)},
                                                                        ncall=ncall)).values["x"], np.full(2, 3, F))


def test_legacy_trailer_and_names_as_c_strings(tmp_path):
    p = tmp_path / "m.dat"
    body = struct.pack("<i", 2)
    for name in (b"a\0hidden", b"a"):  # both are "a" to C++: the later entry wins
        body += struct.pack("<i", len(name)) + name + struct.pack("<ii", 1, 1) + struct.pack("<f", len(name))
    p.write_bytes(body + b"\x05\x00")  # a two-byte chunk count: istream::read leaves the rest of the int zero
    m = read_imatrix(p)
    assert list(m.values) == ["a"] and m.values["a"].tolist() == [1.0] and m.chunk_count == 5 and m.datasets == ()
    p.write_bytes(body + struct.pack("<ii", 3, 1 << 30) + b"x")  # a dataset length past the end: no dataset
    assert read_imatrix(p).datasets == () and read_imatrix(p).chunk_count == 3


def test_filters_finite_check_and_lengths(tmp_path):
    m = read_imatrix(gguf(tmp_path, sums={NAME: np.ones((1, 4)), "blk.0.ffn_up.weight": np.ones((1, 8)),
                                          "token_embd.weight": np.ones((1, 3))},
                          counts={NAME: [1.0], "blk.0.ffn_up.weight": [1.0], "token_embd.weight": [1.0]}))
    assert set(m.filtered(include=["attn"]).values) == {NAME}
    assert set(m.filtered(exclude=["attn", "token"]).values) == {"blk.0.ffn_up.weight"}
    assert m.for_tensor(NAME, (4, 16)).tolist() == [1, 1, 1, 1] and m.for_tensor("other", (4, 4)) is None
    assert m.for_tensor("token_embd.weight", (4, 100)) is None  # llama-quantize ignores a token_embd mismatch
    with pytest.raises(InputFileError, match="has 8 values; the tensor needs 16"):
        m.for_tensor("blk.0.ffn_up.weight", (16, 4))
    m.values[NAME][2] = np.nan
    with pytest.raises(InputFileError, match="non-finite value"):
        m.check_finite()


def test_recorded_names_are_cut_as_strncpy_cuts_them():
    assert c_string("x" * 200) == b"x" * 127 and c_string(b"ab\0cd") == b"ab" and c_string("é" * 64)[-1:] == b"\xc3"


# --- hostile files

@pytest.mark.parametrize("field", ["imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"])
def test_gguf_without_metadata(tmp_path, field):
    kw = {{"imatrix.datasets": "datasets", "imatrix.chunk_count": "chunk_count", "imatrix.chunk_size": "chunk_size"}[field]: None}
    refused(gguf(tmp_path, **kw), f"missing imatrix metadata \\({field}\\)")


def test_gguf_refusals(tmp_path):
    refused(gguf(tmp_path, counts={}), "mismatched sums and counts")
    refused(gguf(tmp_path, sums={}, counts={NAME: np.array([1.0])}), "mismatched sums and counts")
    refused(gguf(tmp_path, sums={}, counts={}), "no tensors")
    refused(gguf(tmp_path, sums={}, counts={NAME: np.array([1.0])}, extra=[(f"{NAME}.in_sum2", 1, np.ones((1, 8)))]),
            "must be F32, got F16 and F32")
    p = gguf(tmp_path)
    raw = p.read_bytes()
    p.write_bytes(raw.replace(b"imatrix.chunk_count\x04\x00\x00\x00", b"imatrix.chunk_count\x05\x00\x00\x00"))  # I32
    refused(p, "imatrix.chunk_count must be UINT32, got INT32")
    p.write_bytes(raw[:-36])  # a tensor's data cut short
    with pytest.raises(InputFileError) as e:
        read_imatrix(p)
    assert str(p) in str(e.value) and "runs past the end of the file" in str(e.value), e.value


@pytest.mark.parametrize("body,match", [
    (b"", "truncated at byte 0"),
    (struct.pack("<i", 0), "no data"),
    (struct.pack("<i", -3), "no data"),
    (struct.pack("<i", 0x7FFFFFFF), "entries cannot fit"),
    (struct.pack("<ii", 1, -1) + b"\0" * 20, "name length -1"),
    (struct.pack("<ii", 1, 1 << 30) + b"\0" * 20, "name length 1073741824"),
    (struct.pack("<ii", 1, 1) + b"a" + struct.pack("<ii", 1, 0) + b"\0" * 8, "has 0 values"),
    (struct.pack("<ii", 1, 1) + b"a" + struct.pack("<ii", 1, -7) + b"\0" * 8, "has -7 values"),
    (struct.pack("<ii", 1, 1) + b"a" + struct.pack("<ii", 1, 0x7FFFFFFF) + b"\0" * 8, "do not fit"),
    (struct.pack("<ii", 2, 1) + b"a" + struct.pack("<ii", 1, 1) + b"\0" * 4 + struct.pack("<i", 1) + b"b"
     + struct.pack("<i", 1), "truncated at byte 30"),
])
def test_legacy_refusals(tmp_path, body, match):
    p = tmp_path / "bad.dat"
    p.write_bytes(body)
    refused(p, match)


# --- the command line: one error line, exit 2, nothing written, no input overwritten

@pytest.fixture(scope="module")
def f16(tmp_path_factory, qwen3_target) -> Path:
    root = tmp_path_factory.mktemp("imatrix-cli")
    src = make_zlab_drafter(root / "d", dtype="f16", layers=2, hidden=64, ffn=96, heads=2, kv_heads=1, head_dim=32,
                            target_layer_ids=[0, 1])
    return convert(src, qwen3_target, outfile=root / "d-f16.gguf", outtype="f16").output


def test_cli_refuses_a_hostile_imatrix(f16, tmp_path):
    bad = tmp_path / "bad.dat"
    bad.write_bytes(struct.pack("<ii", 1, -1))
    out = tmp_path / "o.gguf"
    r = run_cli("quantize", "--imatrix", bad, f16, out, "Q4_0")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"dflash-convert: error: {bad}:"), r.stderr
    assert not out.exists()


def test_cli_never_overwrites_the_imatrix_and_refuses_a_fifo(f16, tmp_path):
    m = write_legacy_imatrix(tmp_path / "m.dat", {"blk.0.attn_q.weight": np.ones(64, F)})
    before = m.read_bytes()
    r = run_cli("quantize", "--imatrix", m, f16, m, "Q4_0", "--force")
    assert r.returncode != 0 and m.read_bytes() == before and len(r.stderr.strip().splitlines()) == 1
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run_cli("quantize", "--imatrix", fifo, f16, tmp_path / "o.gguf", "Q4_0")
    assert r.returncode == 2 and "FIFO" in r.stderr and not (tmp_path / "o.gguf").exists()


def test_cli_weights_filters_need_an_imatrix(f16, tmp_path):
    r = run_cli("quantize", "--include-weights", "attn", f16, tmp_path / "o.gguf", "Q4_0")
    assert r.returncode == 64 and "filter the --imatrix file" in r.stderr
