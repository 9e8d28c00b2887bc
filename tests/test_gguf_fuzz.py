"""Fuzz the GGUF reader (and the validator behind it) with 10,000 mutated files (2,000 in the fast tier).

Two small valid files, one written by our writer with the shape of a DFlash drafter and one
made by hand with every value type, are mutated with Hypothesis: bit flips, bytes, "interesting"
u32/u64 values (0, 2**31, 2**63, 2**64-1, ...) written over header fields, truncation, deletion,
insertion and duplication. For every mutant: reading either succeeds or raises InputFileError
(nothing else), takes less than a second (a SIGALRM timer catches a hang), and the memory traced
while reading stays below 8x the file plus 256 KiB: no allocation follows a size the file claims
without having the bytes. Mutants that still parse go through ``validate(deep=True)``, which
must return a report, never raise.
"""

from __future__ import annotations

import signal
import struct
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from gguf_bytes import BOOL, F32, F64, I64, STRING, T_F16, T_F32, T_Q8_0, U8, U32, GGUFBytes, kv, kv_arr, kv_str, kv_u32, s, tinfo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_convert.errors import InputFileError
from dflash_convert.format.ggml import GGMLType
from dflash_convert.metadata import Metadata
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.validate import validate
from dflash_convert.write import OutTensor, write_gguf
from fixtures.upstream import examples

# two bases: 10,000 mutated files in all (make test); the fast tier draws the first 1,000 of each
EXAMPLES_PER_BASE = examples(5000, 1000)
TIME_LIMIT_S = 1.0
MEMORY_FACTOR, MEMORY_SLACK = 8, 256 << 10
INTERESTING = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 31, 32, 33, 42, 43, 63, 64, 255, 256, (1 << 16) - 1, (1 << 30) + 1,
               (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def _drafter_like(path: Path) -> Path:
    """A tiny but complete upstream dflash drafter written by our writer."""
    E, F, H, KV, D, T, L = 32, 32, 2, 1, 16, 2, 1
    md = Metadata()
    for short, v in (("architecture", "dflash"), ("block_count", L), ("context_length", 128), ("embedding_length", E),
                     ("feed_forward_length", F), ("head_count", H), ("head_count_kv", KV), ("rms_eps", 1e-6),
                     ("key_length", D), ("value_length", D), ("block_size", 4), ("target_layers", [1, 2]),
                     ("sliding_window", 8), ("sliding_window_pattern", [True]), ("tok_model", "gpt2"), ("tok_pre", "qwen2"),
                     ("tok_tokens", ["a", "b", "c", "<m>"]), ("tok_token_type", [1, 1, 1, 3]), ("tok_merges", ["a b"]),
                     ("mask_token_id", 3)):
        md.set(short, v)
    rng = np.random.default_rng(1)
    shapes = {"fc.weight": ((T * E, E), GGMLType.F16), "enc.output_norm.weight": ((E,), GGMLType.F32),
              "output_norm.weight": ((E,), GGMLType.F32), "blk.0.attn_norm.weight": ((E,), GGMLType.F32),
              "blk.0.attn_q.weight": ((E, H * D), GGMLType.Q8_0), "blk.0.attn_k.weight": ((E, KV * D), GGMLType.F16),
              "blk.0.attn_v.weight": ((E, KV * D), GGMLType.F16), "blk.0.attn_output.weight": ((H * D, E), GGMLType.F16),
              "blk.0.attn_q_norm.weight": ((D,), GGMLType.F32), "blk.0.attn_k_norm.weight": ((D,), GGMLType.F32),
              "blk.0.ffn_norm.weight": ((E,), GGMLType.F32), "blk.0.ffn_gate.weight": ((E, F), GGMLType.F16),
              "blk.0.ffn_up.weight": ((E, F), GGMLType.F16), "blk.0.ffn_down.weight": ((F, E), GGMLType.F16)}
    tensors = []
    for name, (ne, gtype) in shapes.items():
        n = int(np.prod(ne))
        if gtype == GGMLType.Q8_0:
            blocks = np.zeros((n // 32, 34), np.uint8)
            blocks[:, 2:] = rng.integers(0, 255, (n // 32, 32))
            blocks[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
            raw = blocks.tobytes()
        else:
            raw = rng.standard_normal(n).astype(np.float32 if gtype == GGMLType.F32 else np.float16).tobytes()
        tensors.append(OutTensor(name, ne, gtype, len(raw), chunks=lambda raw=raw: [raw]))
    write_gguf(path, md, tensors, progress=False, replace=True)  # test fixtures rewrite their files
    assert validate(path).exit_code == 0
    return path


def _hand_made(path: Path) -> Path:
    """Every value type, string arrays, a 64-byte alignment and an I64 tensor, in GGUF v2."""
    kvs = [kv_str("general.architecture", "dflash"), kv_u32("general.alignment", 64), kv("u8", U8, b"\x07"),
           kv("f32", F32, struct.pack("<f", 0.5)), kv("f64", F64, struct.pack("<d", 2.5)), kv("b", BOOL, b"\x01"),
           kv("i64", I64, struct.pack("<q", -3)), kv_arr("words", STRING, 3, s("x") + s("") + s("yz")),
           kv_arr("flags", BOOL, 2, b"\x00\x01"), kv_arr("u32s", U32, 2, struct.pack("<2I", 1, 2)), kv("str", STRING, s("hi"))]
    infos = [tinfo("a", [4], T_F32, 0), tinfo("q", [32, 2], T_Q8_0, 64), tinfo("h", [2, 2], T_F16, 192),
             tinfo("d2t", [2], 27, 256)]
    data = bytes(64) + bytes(68) + bytes(60) + bytes(8) + bytes(56) + struct.pack("<2q", 0, 1)
    path.write_bytes(bytes(GGUFBytes(kvs=kvs, infos=infos, data=data, alignment=64, version=2)))
    read_gguf(path)
    return path


class Bases(dict):
    def __repr__(self) -> str:  # Hypothesis prints fixtures of a failing example: keep it short
        return f"<fuzz bases {sorted(self)}>"


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Bases:
    d = tmp_path_factory.mktemp("fuzz")
    out = Bases()
    for name, make in (("drafter", _drafter_like), ("handmade", _hand_made)):
        path = make(d / f"{name}.gguf")
        header_end = read_gguf(path).data_offset
        out[name] = (path.read_bytes(), header_end, d / f"{name}-mutant.gguf")
    return out


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def on_alarm(signum, frame):  # noqa: ARG001
        raise Hang(f"reading took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
    st.tuples(st.just("byte"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("u32"), st.integers(0, 1 << 20), st.sampled_from(INTERESTING)),
    st.tuples(st.just("u64"), st.integers(0, 1 << 20), st.sampled_from(INTERESTING)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20), st.just(0)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 24)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.integers(1, 24)),
    st.tuples(st.just("duplicate"), st.integers(0, 1 << 20), st.integers(1, 96)),
)


def mutate(data: bytes, header_end: int, ops: list[tuple[str, int, int]]) -> bytes:
    b = bytearray(data)
    for op, where, arg in ops:
        if not b:
            break
        # mostly the header (that is what the reader parses), sometimes anywhere
        span = header_end if where % 8 and header_end < len(b) else len(b)
        pos = where % span
        if op == "flip":
            b[pos] ^= 1 << arg
        elif op == "byte":
            b[pos] = arg
        elif op == "u32":
            b[pos:pos + 4] = struct.pack("<I", arg & 0xFFFFFFFF)
        elif op == "u64":
            b[pos:pos + 8] = struct.pack("<Q", arg)
        elif op == "truncate":
            del b[pos:]
        elif op == "delete":
            del b[pos:pos + arg]
        elif op == "insert":
            b[pos:pos] = bytes([where & 0xFF]) * arg
        elif op == "duplicate":
            b[pos:pos] = b[pos:pos + arg]
    return bytes(b)


def check_mutant(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    parsed = True
    tracemalloc.start()  # only around the read: tracing everything would slow Hypothesis itself
    try:
        before = tracemalloc.get_traced_memory()[0]
        with time_limit(TIME_LIMIT_S):
            try:
                g = read_gguf(path)
                g.close()
            except InputFileError as e:
                parsed = False
                assert str(path) in str(e)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak <= MEMORY_FACTOR * len(data) + MEMORY_SLACK, f"{peak} bytes traced reading a {len(data)}-byte file"
    if parsed:
        with time_limit(10 * TIME_LIMIT_S):
            report = validate(path, deep=True)
        assert report.exit_code in (0, 1) and report.checks[0].id == "container"


def _fuzz(bases, name: str, ops: list[tuple[str, int, int]]) -> None:
    data, header_end, path = bases[name]
    check_mutant(path, mutate(data, header_end, ops))


FUZZ = settings(max_examples=EXAMPLES_PER_BASE, deadline=None, database=None, derandomize=True, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@FUZZ
@given(ops=st.lists(MUTATION, min_size=1, max_size=4))
def test_fuzz_drafter_file(bases, ops):
    _fuzz(bases, "drafter", ops)


@FUZZ
@given(ops=st.lists(MUTATION, min_size=1, max_size=4))
def test_fuzz_hand_made_file(bases, ops):
    _fuzz(bases, "handmade", ops)


SAFETENSORS_EXAMPLES = examples(2000, 400)


@pytest.fixture(scope="module")
def safetensors_base(tmp_path_factory) -> tuple[bytes, int, Path]:
    import torch
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("fuzz-st")
    path = d / "base.safetensors"
    save_file({"fc.weight": torch.ones(4, 8, dtype=torch.bfloat16), "norm.weight": torch.ones(4), "d2t": torch.arange(3)},
              str(path), metadata={"format": "pt"})
    data = path.read_bytes()
    return data, 8 + struct.unpack("<Q", data[:8])[0], d / "mutant.safetensors"


@settings(max_examples=SAFETENSORS_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=st.lists(MUTATION, min_size=1, max_size=4))
def test_fuzz_safetensors_header(safetensors_base, ops):
    """The convert side's reader: the same guarantees for mutated safetensors checkpoints."""
    from dflash_convert.sources.safetensors import read_header

    data, header_end, path = safetensors_base
    mutant = mutate(data, header_end, ops)
    path.write_bytes(mutant)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with time_limit(TIME_LIMIT_S):
            try:
                for ref in read_header(path)[0]:
                    ref.read()
            except InputFileError as e:
                assert str(path) in str(e)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak <= MEMORY_FACTOR * len(mutant) + MEMORY_SLACK


def test_unmutated_bases_parse(bases):
    for data, _, path in bases.values():
        check_mutant(path, data)
