"""The bounds-checked GGUF reader: a catalogue of hand-made corrupt files, each rejected with its own
message (modelled on llama.cpp's tests/test-gguf.cpp), legitimate edge cases, memory bounds, and
agreement with gguf-py's reader on a real file."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf_bytes import (
    BOOL,
    F32,
    I32,
    STRING,
    T_F32,
    T_Q8_0,
    U8,
    U32,
    GGUFBytes,
    kv,
    kv_arr,
    kv_str,
    kv_u32,
    s,
    tinfo,
)

from dflash_convert.arrays import NumArray
from dflash_convert.errors import InputFileError
from dflash_convert.format.keys import ValueType
from dflash_convert.metadata import Metadata
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.validate import validate
from dflash_convert.write import OutTensor, write_gguf

ARCH = kv_str("general.architecture", "dflash")


def _with(**kw) -> bytes:
    return bytes(GGUFBytes(**kw))


def _tensors(*infos: bytes, data: bytes) -> bytes:
    return _with(infos=list(infos), data=data)


# name -> (file bytes, the specific message it must produce)
CASES: dict[str, tuple[bytes, str]] = {
    # header
    "empty": (b"", "empty file, not GGUF"),
    "short_magic": (b"GG", "truncated: magic needs 4 bytes"),
    "bad_magic": (b"GGML" + bytes(20), "not a GGUF file (magic b'GGML')"),
    "version_0": (_with(version=0), "bad GGUF version 0"),
    "version_1": (_with(version=1), "GGUF version 1 is no longer supported"),
    "version_future": (_with(version=4), "GGUF version 4 is newer than 3"),
    "big_endian": (_with(version=0x03000000), "looks byte-swapped: a big-endian file?"),
    "truncated_header": (b"GGUF" + struct.pack("<I", 3), "truncated: tensor count needs 8 bytes"),
    "tensor_count_negative": (_with(n_tensors=(1 << 64) - 1), "tensor count 18446744073709551615 is negative"),
    "kv_count_negative": (_with(n_kv=1 << 63), "metadata count 9223372036854775808 is negative"),
    "tensor_count_too_big": (_with(n_tensors=1 << 40), "tensor count 1099511627776 cannot fit"),
    "kv_count_too_big": (_with(n_kv=1 << 20), "metadata count 1048576 cannot fit"),
    # key/value section
    "key_length_absurd": (_with(kvs=[struct.pack("<Q", 1 << 40) + b"k" * 16]), "key #0 length 1099511627776 exceeds llama.cpp's limit"),
    "key_past_end": (_with(kvs=[struct.pack("<Q", 100) + b"k" * 10]), "truncated: key #0 needs 100 bytes"),
    "key_empty": (_with(kvs=[kv(b"", U32, struct.pack("<I", 1))]), "key #0 is empty"),
    "key_not_utf8": (_with(kvs=[kv(b"\xff\xfe", U32, struct.pack("<I", 1))]), "key #0 is not UTF-8"),
    "key_duplicate": (_with(kvs=[ARCH, ARCH]), "duplicate metadata key 'general.architecture'"),
    "value_type_unknown": (_with(kvs=[kv("k", 13, b"\0" * 8)]), "k: unknown value type 13"),
    "bool_not_0_or_1": (_with(kvs=[kv("k", BOOL, b"\x02")]), "k: bool value 2 is neither 0 nor 1"),
    "string_value_past_end": (_with(kvs=[kv("k", STRING, struct.pack("<Q", 64) + b"abc")]), "truncated: k needs 64 bytes"),
    "array_type_unknown": (_with(kvs=[kv_arr("k", 77, 1, b"\0")]), "k: unknown array element type 77"),
    "array_nested": (_with(kvs=[kv_arr("k", 9, 1, b"\0" * 12)]), "k: nested arrays are not supported"),
    "array_count_absurd": (_with(kvs=[kv_arr("k", U8, (1 << 30) + 1, b"")]), "k: array of 1073741825 elements exceeds llama.cpp's limit"),
    "array_past_end": (_with(kvs=[kv_arr("k", U32, 1000, b"\0" * 16)]), "truncated: k (1000 items) needs 4000 bytes"),
    "string_array_past_end": (_with(kvs=[kv_arr("k", STRING, 1000, s("a"))]), "truncated: k (1000 strings) needs 8000 bytes"),
    "string_in_array_past_end": (_with(kvs=[kv_arr("k", STRING, 1, struct.pack("<Q", 500) + b"x")]), "truncated: k[0] needs 500 bytes"),
    "string_length_in_array_past_end": (_with(kvs=[kv_arr("k", STRING, 2, s("abcdefgh") + b"\0" * 4)]),
                                        "truncated: k[1] length needs 8 bytes, 4 remain"),
    "string_in_array_too_long": (_with(kvs=[kv_arr("k", STRING, 1, struct.pack("<Q", (1 << 30) + 1) + b"x" * 8)]),
                                 "k[0] length 1073741825 exceeds llama.cpp's limit"),
    "bool_array_bad_value": (_with(kvs=[kv_arr("k", BOOL, 3, b"\x01\x07\x00")]), "k[1]: bool value 7 is neither 0 nor 1"),
    "alignment_wrong_type": (_with(kvs=[kv("general.alignment", I32, struct.pack("<i", 32))]), "general.alignment must be UINT32, got INT32"),
    "alignment_not_power_of_two": (_with(kvs=[kv_u32("general.alignment", 48)]), "general.alignment 48 is not a power of two"),
    "alignment_zero": (_with(kvs=[kv_u32("general.alignment", 0)]), "general.alignment 0 is not a power of two"),
    # tensor infos
    "tensor_name_empty": (_tensors(tinfo("", [4], T_F32, 0), data=bytes(16)), "tensor #0 has an empty name"),
    "tensor_name_too_long": (_tensors(tinfo("n" * 64, [4], T_F32, 0), data=bytes(16)), "tensor #0 name is 64 bytes; llama.cpp allows at most 63"),
    "tensor_name_not_utf8": (_tensors(tinfo(b"\xc3(", [4], T_F32, 0), data=bytes(16)), "tensor #0 name is not UTF-8"),
    "tensor_name_duplicate": (_tensors(tinfo("x", [4], T_F32, 0), tinfo("x", [4], T_F32, 32), data=bytes(48)), "duplicate tensor name 'x'"),
    "too_many_dims": (_tensors(tinfo("x", [1, 1, 1, 1, 4], T_F32, 0), data=bytes(16)), "tensor 'x' has 5 dimensions (1 to 4 allowed)"),
    "zero_dims": (_tensors(tinfo("x", [], T_F32, 0), data=bytes(16)), "tensor 'x' has 0 dimensions"),
    "tensor_info_truncated": (_with(infos=[s("x") + struct.pack("<I", 2) + struct.pack("<Q", 4)]), "truncated: x dimension needs 8 bytes"),
    "negative_dimension": (_tensors(tinfo("x", [(1 << 64) - 4], T_F32, 0), data=bytes(16)), "tensor 'x' has a negative dimension"),
    "zero_dimension": (_tensors(tinfo("x", [4, 0], T_F32, 0), data=bytes(16)), "tensor 'x' has a zero-size dimension"),
    "element_count_overflow": (_tensors(tinfo("x", [1 << 32, 1 << 32], T_F32, 0), data=bytes(16)),
                               "tensor 'x' element count overflows a signed 64-bit integer"),
    "type_unknown": (_tensors(tinfo("x", [4], 99, 0), data=bytes(16)), "tensor 'x' has unknown ggml type 99"),
    "type_removed": (_tensors(tinfo("x", [4], 31, 0), data=bytes(16)), "ggml type 31 (Q4_0_4_4), which was removed"),
    "row_not_whole_blocks": (_tensors(tinfo("x", [16], T_Q8_0, 0), data=bytes(34)), "ne[0]=16 is not a multiple of the Q8_0 block size 32"),
    "offset_misaligned": (_tensors(tinfo("x", [4], T_F32, 4), data=bytes(32)), "tensor 'x' data offset 4 is not aligned to 32"),
    "data_truncated": (_tensors(tinfo("x", [4], T_F32, 0), data=bytes(15)), "runs past the end of the file"),
    "data_overlap": (_tensors(tinfo("a", [16], T_F32, 0), tinfo("b", [4], T_F32, 32), data=bytes(64)), "tensor 'b' data overlaps tensor 'a'"),
    "data_gap": (_tensors(tinfo("a", [4], T_F32, 0), tinfo("b", [4], T_F32, 64), data=bytes(80)),
                 "tensor 'b' data offset 64 is not 32: llama.cpp requires tensor data packed in table order"),
    "data_out_of_order": (_tensors(tinfo("a", [4], T_F32, 32), tinfo("b", [4], T_F32, 0), data=bytes(64)),
                          "tensor 'a' data offset 32 is not 0"),
    "data_section_missing": (GGUFBytes(infos=[tinfo("x", [4], T_F32, 0)]).header(), "truncated: tensor data would start at byte"),
}


def test_catalogue_is_large_and_messages_are_distinct():
    assert len(CASES) >= 25
    needles = [n for _, n in CASES.values()]
    assert len(set(needles)) == len(needles)


@pytest.mark.parametrize("case", sorted(CASES))
def test_corrupt_file_rejected_with_its_own_message(tmp_path, case):
    data, needle = CASES[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(data)
    with pytest.raises(InputFileError) as e:
        read_gguf(path)
    assert needle in str(e.value)
    assert str(path) in str(e.value)  # the message names the file
    # only the container message, once: no other check runs on an unreadable file
    report = validate(path)
    assert report.exit_code == 2 and report.result == "error"
    assert needle in report.error_line()


@pytest.mark.parametrize("case", ["bad_magic", "data_overlap", "array_count_absurd"])
def test_cli_one_error_line_and_exit_2(tmp_path, case):
    from conftest import run_cli

    path = tmp_path / "bad.gguf"
    path.write_bytes(CASES[case][0])
    r = run_cli("validate", path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dflash-convert: error: ") and CASES[case][1] in lines[0]
    assert r.stdout == ""
    r = run_cli("inspect", path)
    assert r.returncode == 2 and CASES[case][1] in r.stderr


def test_missing_and_directory_inputs(tmp_path):
    with pytest.raises(InputFileError, match="does not exist"):
        read_gguf(tmp_path / "nope.gguf")
    with pytest.raises(InputFileError, match="is a directory, not a regular file"):
        read_gguf(tmp_path)


# --- legitimate edge cases -------------------------------------------------------------------

def test_legitimate_edge_cases_read(tmp_path):
    kvs = [ARCH, kv_arr("empty", U32, 0, b""), kv_arr("flags", BOOL, 3, b"\x01\x00\x01"),
           kv_arr("words", STRING, 2, s("a") + s("")), kv_u32("general.alignment", 64), kv("f", F32, struct.pack("<f", 1.5))]
    infos = [tinfo("a", [4], T_F32, 0), tinfo("b", [32, 2], T_Q8_0, 64)]
    path = tmp_path / "ok.gguf"
    path.write_bytes(bytes(GGUFBytes(kvs=kvs, infos=infos, data=bytes(64) + bytes(68), alignment=64, version=2)))
    g = read_gguf(path)
    assert g.version == 2 and g.alignment == 64
    assert g.get("empty") == [] and g.get("flags") == [True, False, True] and g.get("words") == ["a", ""]
    assert g.get("f") == 1.5
    assert [(t.name, t.ne, t.nbytes) for t in g.tensors] == [("a", (4,), 16), ("b", (32, 2), 68)]
    assert g.tensors[1].offset == g.data_offset + 64


def test_string_arrays_across_release_points(tmp_path):
    """The string walk checks lengths only where an item ends past the next release point (every
    4 MiB): items exact across many of them, one item longer than a step, and the failures after
    a step (a length over llama.cpp's limit, an item past the end) still found and named."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 9, 1_000_000)
    lengths[500_000] = 5 << 20  # one item longer than a release step
    starts = np.concatenate([[0], np.cumsum(8 + lengths)])
    raw = rng.integers(97, 123, int(starts[-1]), dtype=np.uint8)  # every byte a letter, then the prefixes over them
    raw[(starts[:-1, None] + np.arange(8)).ravel()] = lengths.astype("<u8").view(np.uint8)
    body = raw.tobytes()
    path = tmp_path / "many.gguf"
    path.write_bytes(_with(kvs=[ARCH, kv_arr("k", STRING, len(lengths), body)]))
    got = read_gguf(path).metadata["k"].value
    assert len(got) == len(lengths) and got.gguf_items_bytes() == body
    for i in (0, 1, 499_999, 500_000, 500_001, 777_777, len(lengths) - 1):
        assert got[i] == body[starts[i] + 8:starts[i + 1]] and len(got[i]) == lengths[i]
    items = len(lengths)
    for tail, needle in ((struct.pack("<Q", (1 << 30) + 7) + b"x" * 16, f"k[{items}] length 1073741831 exceeds"),
                         (struct.pack("<Q", 64) + b"x" * 16, f"truncated: k[{items}] needs 64 bytes, 16 remain")):
        path.write_bytes(_with(kvs=[ARCH, kv_arr("k", STRING, items + 1, body + tail)]))
        with pytest.raises(InputFileError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            read_gguf(path)


def test_an_array_read_before_parses_the_same_without_a_walk(tmp_path, monkeypatch):
    """A region equal to a string array this process wrote or read is that array (one comparison, no
    walk over its items); other bytes with the same count, even one byte off, are walked and checked."""
    from dflash_convert.sources import gguf as reader

    items = [f"tok{i}".encode() for i in range(5000)]

    def write(name: str, parts: list[bytes]) -> Path:
        path = tmp_path / name
        path.write_bytes(_with(kvs=[ARCH, kv_arr("k", STRING, len(items), b"".join(parts))]))
        return path

    prefixed = [struct.pack("<Q", len(x)) + x for x in items]
    found: list[bool] = []
    original = reader.known_at
    monkeypatch.setattr(reader, "known_at", lambda *a: found.append((r := original(*a)) is not None) or r)
    assert read_gguf(write("a.gguf", prefixed)).metadata["k"].value == items and found == [False]  # walked
    again = read_gguf(write("b.gguf", prefixed)).metadata["k"].value
    assert again == items and found == [False, True]  # the same bytes elsewhere: no walk
    changed = list(prefixed)
    changed[4321] = changed[4321].replace(b"tok", b"toc")
    assert read_gguf(write("c.gguf", changed)).metadata["k"].value[4321] == b"toc4321" and found[-1] is False
    changed[17] = struct.pack("<Q", 1 << 40) + items[17]
    with pytest.raises(InputFileError, match=r"k\[17\] length 1099511627776 exceeds"):
        read_gguf(write("d.gguf", changed))


def test_numeric_arrays_are_compact_and_compare_like_lists(tmp_path):
    path = tmp_path / "arr.gguf"
    path.write_bytes(_with(kvs=[ARCH, kv_arr("ids", I32, 3, struct.pack("<3i", 2, -1, 7))]))
    v = read_gguf(path).metadata["ids"]
    assert isinstance(v.value, NumArray) and v.value.data.dtype == np.dtype("<i4")
    assert v.value == [2, -1, 7] and [2, -1, 7] == v.value and list(v.value) == [2, -1, 7]
    assert v.value[1] == -1 and v.value[1:] == [-1, 7] and len(v.value) == 3
    assert v.vtype == ValueType.ARRAY and v.sub == ValueType.INT32


def _peak_while_reading(path: Path) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            read_gguf(path)
        except InputFileError:
            pass
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_large_numeric_array_allocates_no_more_than_the_file(tmp_path):
    n = 4 << 20
    path = tmp_path / "big.gguf"
    path.write_bytes(_with(kvs=[ARCH, kv_arr("pattern", BOOL, n, b"\x01" * n), kv_arr("ids", U8, n, b"\x05" * n)]))
    peak = _peak_while_reading(path)
    assert peak <= path.stat().st_size + (64 << 10), peak  # one compact copy per array, never a list


@pytest.mark.parametrize("case", ["array_count_absurd", "tensor_count_too_big", "key_length_absurd", "string_array_past_end",
                                  "element_count_overflow"])
def test_claimed_sizes_are_never_allocated(tmp_path, case):
    path = tmp_path / "claim.gguf"
    path.write_bytes(CASES[case][0])
    assert _peak_while_reading(path) < 64 << 10


def test_agrees_with_gguf_py_on_a_written_file(tmp_path):
    from gguf import GGUFReader

    md = Metadata()
    md.set("architecture", "dflash")
    md.set("block_count", 2)
    md.set("target_layers", [2, 4])
    md.set("sliding_window_pattern", [True, False])
    md.set("rms_eps", 1e-6)
    md.set("tok_tokens", ["a", "b", "<mask>"])
    rng = np.random.default_rng(0)
    arrays = {"fc.weight": rng.standard_normal((8, 16), dtype=np.float32), "n.weight": np.ones(8, np.float32)}
    tensors = [OutTensor(n, tuple(reversed(a.shape)), 0, a.nbytes, chunks=lambda a=a: [a]) for n, a in arrays.items()]
    path = tmp_path / "w.gguf"
    write_gguf(path, md, tensors, progress=False, replace=True)  # test fixtures rewrite their files
    ours, theirs = read_gguf(path), GGUFReader(path)
    assert list(ours.metadata) == [f.name for f in theirs.fields.values() if not f.name.startswith("GGUF.")]
    assert ours.get("dflash.target_layers") == [int(x) for x in theirs.fields["dflash.target_layers"].contents()]
    assert ours.get("tokenizer.ggml.tokens") == theirs.fields["tokenizer.ggml.tokens"].contents()
    for t, r in zip(ours.tensors, theirs.tensors, strict=True):
        assert t.name == r.name and list(t.ne) == [int(x) for x in r.shape] and t.offset == r.data_offset
        assert ours.tensor_bytes(t).tobytes() == np.asarray(r.data).tobytes()


def test_reads_what_gguf_py_writes(tmp_path):
    """gguf-py's GGUFWriter (the writer behind llama.cpp's converter) lays tensors out as llama.cpp wants."""
    from gguf import GGUFWriter

    path = tmp_path / "gguf-py.gguf"
    w = GGUFWriter(str(path), "dflash")
    w.add_uint32("dflash.block_count", 2)
    w.add_array("dflash.target_layers", [2, 4])
    w.add_array("dflash.attention.sliding_window_pattern", [True, False])
    w.add_float32("dflash.attention.layer_norm_rms_epsilon", 1e-6)
    arrays = {"a": np.arange(5, dtype=np.float32), "b": np.ones((3, 7), dtype=np.float16), "d2t": np.arange(3, dtype=np.int64)}
    for name, a in arrays.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = read_gguf(path)
    assert g.get("dflash.target_layers") == [2, 4] and g.get("dflash.attention.sliding_window_pattern") == [True, False]
    assert [t.name for t in g.tensors] == list(arrays)
    for t in g.tensors:
        assert g.tensor_bytes(t).tobytes() == arrays[t.name].tobytes()
        assert list(t.ne) == list(reversed(arrays[t.name].shape))
