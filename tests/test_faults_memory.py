"""Faults of memory: inspecting and validating a hostile GGUF (millions of tiny strings, integers, keys
or tensors) costs memory bounded by the file, and arrays too long to read fail by their length up front.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from faults import cli, one_error_line

from dflash_convert.validate import validate

_PEAK = ("import resource, subprocess, sys\n"
         "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
         "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n")


def _peak_rss(*args: object) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of ``dflash-convert ARGS``."""
    r = subprocess.run([sys.executable, "-c", _PEAK, sys.executable, "-m", "dflash_convert.cli", *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    code, peak = r.stdout.split()
    return int(code), int(peak)


def _spliced(path: Path, short: str, sub: int, count: int, items: bytes) -> Path:
    """A complete small drafter with one more key, ``short``, an array of ``count`` items given as
    their bytes; the key is padded to the alignment so the tensor data moves as a whole."""
    import struct

    from drafter_gguf import drafter_parts, drop_keys, full_key, write_parts

    raw = write_parts(path.with_name("small.gguf"), drop_keys(drafter_parts(), full_key(short))).read_bytes()
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", raw, 4)
    name = full_key(short).encode()
    head = struct.pack("<Q", len(name)) + name + struct.pack("<IIQ", 9, sub, count)
    assert (len(head) + len(items)) % 32 == 0
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv + 1) + head + items + raw[24:])
    return path


def string_heavy_gguf(path: Path, size: int = 40 << 20, length: int = 3) -> Path:
    """A drafter whose tokenizer.ggml.tokens holds ``size`` bytes of ``length``-byte strings (millions of them)."""
    import struct

    import numpy as np

    n = size // (8 + length)
    items = np.zeros(n, dtype=[("n", "<u8"), ("s", f"S{length}")])
    items["n"] = length
    items["s"] = np.random.default_rng(0).integers(97, 123, (n, length), dtype=np.uint8).view(f"S{length}")[:, 0]
    body = items.tobytes()
    name_len = len("tokenizer.ggml.tokens")
    pad = (-(8 + name_len + 16 + len(body) + 8)) % 32  # a last string of pad bytes aligns the key
    return _spliced(path, "tok_tokens", 8, n + 1, body + struct.pack("<Q", pad) + b"z" * pad)


def int_heavy_gguf(path: Path, size: int = 40 << 20) -> Path:
    """A drafter whose tokenizer.ggml.token_type is an INT8 array of ``size`` entries none of them a cached small int."""
    import numpy as np

    name_len = len("tokenizer.ggml.token_type")
    n = size + (-(8 + name_len + 16 + size)) % 32
    return _spliced(path, "tok_token_type", 1, n, np.random.default_rng(0).integers(-128, -6, n, dtype="i1").tobytes())


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss units and madvise as on Linux")
@pytest.mark.parametrize("build", [string_heavy_gguf, int_heavy_gguf], ids=["strings", "ints"])
def test_inspect_and_validate_memory_is_bounded_by_the_file(tmp_path, build):
    """Peak memory of inspect and validate on a ~40 MB file of millions of short array items stays
    under twice the file's size over the same command on a small file (it was ~6x for strings,
    ~50x for integers that Python does not cache)."""
    big = build(tmp_path / "big.gguf")
    small = tmp_path / "small.gguf"
    size = big.stat().st_size
    assert size > 30 << 20
    for args, want in ((["inspect"], 0), (["validate"], 1), (["validate", "--json"], 1)):
        base_code, base = _peak_rss(*args, small)
        code, peak = _peak_rss(*args, big)
        assert base_code in (0, 1) and code == want, (args, code)
        extra = peak - base
        assert extra < 2 * size + (16 << 20), f"{args}: {extra / 2**20:.0f} MiB over the baseline for a {size / 2**20:.0f} MiB file"


def test_string_arrays_are_held_compact_and_read_exactly(tmp_path):
    """The reader keeps a string array as one buffer and offsets, and still gives every item exactly."""
    from drafter_gguf import read_parts, write_parts

    from dflash_convert.sources.gguf import StrArray, read_gguf

    path = string_heavy_gguf(tmp_path / "big.gguf", size=1 << 20)
    g = read_gguf(path)
    tokens = g.metadata["tokenizer.ggml.tokens"].value
    assert isinstance(tokens, StrArray) and len(tokens) == (1 << 20) // 11 + 1
    # held as the file holds it: each item's u64 length then its bytes, and the offset of each length
    assert tokens.offsets.itemsize == 4 and len(tokens.data) == 11 * (len(tokens) - 1) + 8 + len(tokens[-1])
    raw = path.read_bytes()
    first = raw.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 4 + 4 + 8
    assert tokens[0] == raw[first + 8:first + 11] and tokens[-1] == b"z" * len(tokens[-1])
    assert tokens[1:3] == [raw[first + 19:first + 22], raw[first + 30:first + 33]]
    assert tokens == list(tokens) and tokens == StrArray.of(list(tokens)) and tokens != list(tokens)[:-1]
    assert g.get("tokenizer.ggml.tokens")[:2] == [t.decode() for t in tokens[:2]]
    # written back through the writer (as migrate and quantize copy keys), byte for byte
    assert write_parts(tmp_path / "again.gguf", read_parts(path)).read_bytes() == raw


def test_an_integer_array_too_long_to_read_fails_by_its_length(tmp_path):
    """target_layers and a per-layer key with 70,000 entries: never expanded into Python ints,
    failed by their length (llama.cpp reads at most 512 into either)."""
    from drafter_gguf import KV, drafter_parts, full_key, kv, set_key, write_parts

    from dflash_convert.format.keys import ValueType

    keys, tensors = set_key(drafter_parts(), kv("target_layers", [1] * 70_000))
    heads = full_key("head_count")
    keys = [KV(heads, ValueType.ARRAY, [2] * 70_000, ValueType.INT32) if k.key == heads else k for k in keys]
    report = validate(write_parts(tmp_path / "long.gguf", (keys, tensors)))
    assert report.exit_code == 1
    tl = report.check("target_layers")
    assert tl.status == "fail" and "dflash.target_layers has 70000 entries; llama.cpp reads at most 512" in tl.message
    types = report.check("keys.types")
    assert types.status == "fail" and any("dflash.attention.head_count has 70000 entries" in d for d in types.details)


def test_millions_of_tiny_keys_or_tensors_are_refused_up_front(tmp_path):
    """Each key or tensor costs a few hundred bytes of Python objects against ~20 in the file: past
    65,536 of either (real files hold tens of keys, a few thousand tensors at most) the file is
    refused before anything is read, with one line naming the count."""
    import struct

    from dflash_convert.sources.gguf import MAX_KEYS, MAX_TENSORS

    keys = tmp_path / "keys.gguf"
    items = b"".join(struct.pack("<Q", 7) + b"k%06d" % i + struct.pack("<IB", 0, 1) for i in range(MAX_KEYS + 1))
    keys.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, MAX_KEYS + 1) + items)
    tensors = tmp_path / "tensors.gguf"
    tensors.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, MAX_TENSORS + 1, 0) + bytes(40 * (MAX_TENSORS + 1)))
    for path, what in ((keys, f"metadata count {MAX_KEYS + 1} is more than the {MAX_KEYS} keys"),
                       (tensors, f"tensor count {MAX_TENSORS + 1} is more than the {MAX_TENSORS} tensors")):
        for command in ("inspect", "validate"):
            r = cli(command, path)
            assert r.returncode == 2 and what in one_error_line(r), r.stderr
    # at the limit a file still reads
    at_limit = tmp_path / "at-limit.gguf"
    at_limit.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, MAX_KEYS) + items[:len(items) - 20])
    r = cli("inspect", at_limit)
    assert r.returncode == 0 and f"keys ({MAX_KEYS})" in r.stdout, r.stderr
