"""Bit-exactness of our chunk kernels against gguf-py's reference quantizers and numpy casts."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from dflash_convert.encoders import encoder
from dflash_convert.encoders.floats import bf16_to_f16, widen_to_f32
from dflash_convert.encoders.q8_0 import quantize_q8_0
from dflash_convert.format.ggml import GGMLType
from dflash_convert.write import _OutputFile

ALL_BF16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def _weights(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.uniform(1e-4, 30, n)).astype(np.float32)
    x[:32] = 0  # an all-zero block: scale 0
    x[32:64] = 0.5  # ties
    x[64:96] = -np.arange(32, dtype=np.float32) - 0.5
    return x


def test_q8_0_equals_reference():
    x = _weights(32 * 40_000)
    ref = quants.quantize(x.reshape(1, -1), GGMLQuantizationType.Q8_0).reshape(-1)
    assert np.array_equal(quantize_q8_0(x), ref)


def test_q8_0_rounding_ties_and_near_ties():
    """Values whose x/d lands exactly on or one ulp below .5 (the classic roundf trap)."""
    k = np.arange(-126, 127, dtype=np.float32)
    blocks = []
    for base in (k + np.float32(0.5), np.nextafter(k + np.float32(0.5), np.float32(0))):
        for i in range(0, len(base), 31):
            b = np.zeros(32, np.float32)
            b[0] = 127  # d = 1 exactly, so x/d == x
            b[1:1 + len(base[i:i + 31])] = base[i:i + 31]
            blocks.append(b)
    x = np.concatenate(blocks)
    ref = quants.quantize(x.reshape(1, -1), GGMLQuantizationType.Q8_0).reshape(-1)
    assert np.array_equal(quantize_q8_0(x), ref)


def test_bf16_output_equals_reference_for_every_bf16_and_random_f32():
    f32 = widen_to_f32(ALL_BF16, "BF16")
    ref = quants.quantize(f32.reshape(1, -1), GGMLQuantizationType.BF16).view(np.uint16).reshape(-1)
    assert np.array_equal(encoder("F32", GGMLType.BF16)(f32.copy()).view(np.uint16), ref)
    assert np.array_equal(encoder("BF16", GGMLType.BF16)(ALL_BF16).view(np.uint16), ref)  # NaNs quieted too
    x = _weights(1 << 16, seed=3)
    assert np.array_equal(encoder("F32", GGMLType.BF16)(x).view(np.uint16),
                          quants.quantize(x.reshape(1, -1), GGMLQuantizationType.BF16).view(np.uint16).reshape(-1))


def test_bf16_to_f16_exhaustive():
    """All 65536 bf16 values: the integer fast path equals widening and numpy's f16 cast."""
    with np.errstate(over="ignore"):
        ref = widen_to_f32(ALL_BF16, "BF16").astype(np.float16).view(np.uint16)
    assert np.array_equal(bf16_to_f16(ALL_BF16), ref)


def test_f16_widening_exhaustive(quantizer_backend):
    """All 65536 f16 words, in three orders and in shapes the callers pass: the numba kernel (32-bit
    integer IR) gives numpy's cast bit for bit, signalling NaN payloads, subnormals and -0.0 included."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    words = np.concatenate([every, every[::-1], np.random.default_rng(3).permutation(every)])
    ref = words.view(np.float16).astype(np.float32)
    got = widen_to_f32(words, "F16")
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    as_halves = widen_to_f32(words.view(np.float16).reshape(-1, 64)[::2], "F16")  # float16, 2-D, not contiguous
    assert as_halves.shape == (len(words) // 128, 64)
    assert np.array_equal(as_halves.view(np.uint32), ref.reshape(-1, 64)[::2].view(np.uint32))


@pytest.mark.parametrize("src", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("out", [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0])
def test_encode_matches_upstream_pipeline(src, out):
    """Upstream: widen non-F16/F32 to F32, then gguf.quants.quantize to the output type."""
    x = _weights(32 * 512, seed=7)
    raw = {"F32": x, "F16": x.astype(np.float16), "BF16": (x.view(np.uint32) >> 16).astype(np.uint16)}[src]
    up = raw if src in ("F32", "F16") else widen_to_f32(raw, "BF16")
    qtype = {GGMLType.F32: GGMLQuantizationType.F32, GGMLType.F16: GGMLQuantizationType.F16,
             GGMLType.BF16: GGMLQuantizationType.BF16, GGMLType.Q8_0: GGMLQuantizationType.Q8_0}[out]
    if out == GGMLType.Q8_0 or out == GGMLType.BF16:
        up = up.astype(np.float32)
    ref = quants.quantize(up.reshape(1, -1), qtype)
    assert encoder(src, out)(raw).tobytes() == ref.tobytes()


@pytest.mark.parametrize("where,direct", [("disk", True), ("disk", False), ("shm", True)])
def test_output_file_direct_and_buffered(tmp_path, where, direct):
    """Unaligned sizes through the direct-I/O stage (disk), buffered writes, and the buffered fallback (tmpfs)."""
    import os
    from pathlib import Path

    base = tmp_path if where == "disk" else Path("/dev/shm")
    if not base.is_dir():
        pytest.skip("no /dev/shm")
    path = base / f"dflash-test-{os.getpid()}.bin"
    rng = np.random.default_rng(1)
    parts = [rng.integers(0, 255, n, dtype=np.uint8).tobytes() for n in (1, 4095, 4097, _OutputFile.STAGE + 3, 17)]
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        f = _OutputFile(fd, direct=direct)
        if not direct:
            assert not f.direct
        for p in parts:
            f.write(memoryview(p))
        f.close()
        os.close(fd)
        assert path.read_bytes() == b"".join(parts)
    finally:
        path.unlink(missing_ok=True)


def test_direct_io_only_above_the_dirty_limit(monkeypatch):
    """O_DIRECT for an output the page cache could not hold dirty without throttling; the environment decides first."""
    from dflash_convert import write

    monkeypatch.delenv(write.DIRECT_IO_ENV, raising=False)
    limit = write.dirty_limit_bytes()
    assert limit is None or limit > 0
    if limit is not None:
        assert not write.prefer_direct_io(limit) and write.prefer_direct_io(limit + 1)
    monkeypatch.setattr(write, "dirty_limit_bytes", lambda: 1000)
    assert not write.prefer_direct_io(1000) and write.prefer_direct_io(1001)
    monkeypatch.setattr(write, "dirty_limit_bytes", lambda: None)  # not Linux: no O_DIRECT either
    assert not write.prefer_direct_io(1 << 40)
    monkeypatch.setenv(write.DIRECT_IO_ENV, "1")
    assert write.prefer_direct_io(1)
    monkeypatch.setenv(write.DIRECT_IO_ENV, "0")
    monkeypatch.setattr(write, "dirty_limit_bytes", lambda: 1000)
    assert not write.prefer_direct_io(1 << 40)


def test_output_file_copies_spans_inside_the_kernel(tmp_path, monkeypatch):
    """copy_span appends a file's bytes where the stream is; refuses (False, nothing appended) on direct
    writes or where the kernel cannot; a source shorter than the span is an error naming it."""
    import errno
    import os

    from dflash_convert.errors import DFlashError

    src = tmp_path / "src.bin"
    data = np.random.default_rng(2).integers(0, 255, 3 * 4096 + 5, dtype=np.uint8).tobytes()
    src.write_bytes(data)
    out = tmp_path / "out.bin"
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        f = _OutputFile(fd, direct=False)
        f.write(memoryview(b"abc"))
        assert f.copy_span(src, 7, 4096 + 3)
        f.write(memoryview(b"xyz"))
        real = os.copy_file_range

        def refuse(*a, **k):
            raise OSError(errno.EXDEV, "cross-device")

        monkeypatch.setattr(os, "copy_file_range", refuse)
        assert not f.copy_span(src, 0, 10)  # nothing appended: the caller writes the bytes itself
        monkeypatch.setattr(os, "copy_file_range", real)
        with pytest.raises(DFlashError, match="shorter"):
            f.copy_span(src, len(data) - 4, 100)
        f.close()
    finally:
        os.close(fd)
    got = out.read_bytes()
    assert got[:3 + 4096 + 3 + 3] == b"abc" + data[7:7 + 4096 + 3] + b"xyz"
    fd = os.open(tmp_path / "direct.bin", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        f = _OutputFile(fd, direct=True)
        assert not f.copy_span(src, 0, 10) or not f.direct
        f.close()
    finally:
        os.close(fd)
