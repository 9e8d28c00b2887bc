"""Streaming, atomic GGUF writer.

The header is computed up front from shapes and types; tensor data is produced chunk by chunk, so
memory does not grow with the model. Everything goes to an ``outputs.TemporaryOutput`` renamed into
place only when complete and verified; late values (source hashes) are fixed-size strings patched
into the header at the end. Specification: docs/conversion.md, "How every output is written".
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import signal
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .arrays import StrArray
from .errors import FAULT_ENV, DFlashError
from .files import open_regular
from .format.ggml import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, GGMLType
from .format.keys import VALUE_TYPES, ValueType
from .metadata import Metadata
from .outputs import TemporaryOutput, clear_stale_partials
from .terminal import visible

log = logging.getLogger("dflash_convert")


@dataclass
class OutTensor:
    """One tensor of the output: its table entry and a producer of its bytes, in order."""

    name: str
    ne: tuple[int, ...]  # ggml order, ne[0] fastest
    ggml_type: GGMLType
    nbytes: int
    chunks: Callable[[], Iterable[np.ndarray | bytes]] = field(repr=False, default=lambda: ())
    # the tensor's bytes are these, unchanged, in a regular file: (path, offset), for copy_file_range;
    # the chunks stay the fallback and must give the same bytes
    file_span: tuple[Path, int] | None = field(repr=False, default=None)


def _pad(n: int, align: int = GGUF_DEFAULT_ALIGNMENT) -> int:
    return (n + align - 1) // align * align


def _string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _value(vtype: ValueType, value: object, sub: ValueType | None) -> bytes:
    if vtype == ValueType.STRING:
        return _string(value)  # type: ignore[arg-type]
    if vtype == ValueType.ARRAY:
        assert sub is not None
        if sub == ValueType.STRING:  # a compact array read from a file as it is, a list in whole-array steps
            strings = StrArray.of(value)  # type: ignore[arg-type]
            return struct.pack("<IQ", int(sub), len(strings)) + strings.gguf_items_bytes()
        items = list(value)  # type: ignore[call-overload]
        head = struct.pack("<IQ", int(sub), len(items))
        fmt = VALUE_TYPES[sub].fmt
        assert fmt is not None
        return head + struct.pack("<" + fmt[1] * len(items), *items)
    return struct.pack(VALUE_TYPES[vtype].fmt, value)  # type: ignore[arg-type]


def serialize_header(md: Metadata, tensors: list[OutTensor]) -> tuple[bytes, dict[str, int]]:
    """Header bytes (padded to alignment) and the file offset of each key's value."""
    out = bytearray(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(md)))
    value_at: dict[str, int] = {}
    for kv in md:
        out += _string(kv.key) + struct.pack("<I", int(kv.vtype))
        value_at[kv.key] = len(out)
        out += _value(kv.vtype, kv.value, kv.sub)
    cursor = 0
    for t in tensors:
        out += _string(t.name) + struct.pack("<I", len(t.ne)) + struct.pack(f"<{len(t.ne)}Q", *t.ne)
        out += struct.pack("<IQ", int(t.ggml_type), cursor)
        cursor += _pad(t.nbytes)
    out += b"\0" * (_pad(len(out)) - len(out))
    return bytes(out), value_at


def string_array_item_offset(value_offset: int, index: int, item_len: int) -> int:
    """File offset of the bytes of item ``index`` of a string array whose items all have item_len bytes."""
    return value_offset + 4 + 8 + index * (8 + item_len) + 8


DIRECT_IO_ENV = "DFLASH_CONVERT_DIRECT_IO"  # 1 or 0: always or never O_DIRECT (benchmarks, odd filesystems)


def dirty_limit_bytes() -> int | None:
    """Linux's dirty page-cache limit in bytes (vm.dirty_bytes, else vm.dirty_ratio of available memory); None off Linux."""
    try:
        vm = Path("/proc/sys/vm")
        limit = int((vm / "dirty_bytes").read_text())
        if limit:
            return limit
        ratio = int((vm / "dirty_ratio").read_text())
        meminfo = Path("/proc/meminfo").read_text()
        available_kb = int(meminfo.split("MemAvailable:", 1)[1].split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return available_kb * 1024 * ratio // 100


def prefer_direct_io(total_bytes: int) -> bool:
    """Write ``total_bytes`` with O_DIRECT? Only past the kernel's dirty limit (throttled anyway); DFLASH_CONVERT_DIRECT_IO overrides."""
    forced = os.environ.get(DIRECT_IO_ENV, "")
    if forced in ("0", "1"):
        return forced == "1"
    limit = dirty_limit_bytes()
    return limit is not None and total_bytes > limit


class _OutputFile:
    """Sequential writer, through the page cache or past it (O_DIRECT) where the filesystem allows."""

    STAGE = 8 << 20  # bytes per direct write; a multiple of any logical block size

    def __init__(self, fd: int, direct: bool = True) -> None:
        self.fd = fd  # owned by the caller (a TemporaryOutput): never reopened by name
        self.size = 0
        self.direct = _set_direct(fd, True) if direct else False
        self.stage = mmap.mmap(-1, self.STAGE) if self.direct else None
        self.fill = 0
        self.flushed = 0

    def write(self, data: memoryview) -> None:
        self.size += data.nbytes
        if not self.direct:
            self._write_all(data)
            return
        assert self.stage is not None
        while data.nbytes:
            n = min(data.nbytes, self.STAGE - self.fill)
            self.stage[self.fill:self.fill + n] = data[:n]
            self.fill += n
            data = data[n:]
            if self.fill == self.STAGE:
                self._flush_stage(self.STAGE)

    def _flush_stage(self, nbytes: int) -> None:
        """Write the stage (``nbytes`` >= fill, padded to a block) at the flushed position."""
        assert self.stage is not None
        try:
            self._write_all(memoryview(self.stage)[:nbytes])
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            # the filesystem took O_DIRECT but refuses the write: go on buffered, on the same descriptor
            self.direct = _set_direct(self.fd, False)
            os.lseek(self.fd, self.flushed, os.SEEK_SET)
            self._write_all(memoryview(self.stage)[:self.fill])
        self.flushed += self.fill
        self.fill = 0

    def copy_span(self, path: Path, offset: int, nbytes: int) -> bool:
        """Append ``nbytes`` of ``path`` from ``offset`` by copy_file_range (buffered writes only); False, nothing appended, where it cannot."""
        copy = getattr(os, "copy_file_range", None)
        if self.direct or copy is None or nbytes == 0:
            return False
        src = open_regular(path)
        try:
            done = 0
            while done < nbytes:
                try:
                    n = copy(src, self.fd, nbytes - done, offset + done)
                except OSError as e:
                    if done == 0 and e.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
                        return False
                    raise
                if n <= 0:
                    raise DFlashError(f"the input is shorter than its tensor table says (at byte {offset + done})", path)
                done += n
        finally:
            os.close(src)
        self.size += nbytes
        return True

    def _write_all(self, data: memoryview) -> None:
        while data.nbytes:
            n = os.write(self.fd, data)
            data = data[n:]

    def close(self) -> None:
        """Flush what is staged and cut the file to its true length; the descriptor stays open (buffered)."""
        try:
            if self.direct and self.fill:
                padded = (self.fill + 4095) // 4096 * 4096
                assert self.stage is not None
                self.stage[self.fill:padded] = bytes(padded - self.fill)
                self._flush_stage(padded)
            os.ftruncate(self.fd, self.size)
        finally:
            if self.direct:
                self.direct = _set_direct(self.fd, False)  # later patches are small, unaligned writes
            if self.stage is not None:
                try:
                    self.stage.close()
                except BufferError:  # a view of it is still referenced by an exception in flight
                    pass


def _set_direct(fd: int, on: bool) -> bool:
    """Switch O_DIRECT on or off for an open descriptor; whether it is on afterwards."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | flag) if on else (flags & ~flag))
    except OSError:
        return False
    return on


# Fault injection for the signal tests, so a test hits a phase exactly: DFLASH_CONVERT_FAULT="<phase>:<signal>".
# Phases, in order: open, header, data, finish, verify, renamed.
def fault_point(phase: str) -> None:
    """Send this process the signal ``DFLASH_CONVERT_FAULT`` names when the writer reaches ``phase`` (tests only)."""
    spec = os.environ.get(FAULT_ENV)
    if spec and spec.partition(":")[0] == phase:
        os.kill(os.getpid(), getattr(signal, spec.partition(":")[2] or "SIGINT"))


def write_gguf(out: Path, md: Metadata, tensors: list[OutTensor], *, progress: bool = True,
               finish: Callable[[dict[str, int]], list[tuple[int, bytes]]] | None = None,
               verify: Callable[[Path], None] | None = None, replace: bool = False) -> int:
    """Write a GGUF file atomically.

    ``finish`` returns header patches applied last; ``verify`` may raise to refuse the complete
    temporary file before the rename; ``replace`` is --force.
    """
    out = Path(out)
    header, value_at = serialize_header(md, tensors)
    for note in clear_stale_partials(out, force=replace):
        log.warning("%s", note)
    total = sum(t.nbytes for t in tensors)
    bar = None
    if progress:
        from tqdm import tqdm  # only a progress bar on a terminal needs it

        bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"writing {visible(out.name)}", disable=None, leave=False)
    try:
        tmp = TemporaryOutput(out)
        try:
            f = _OutputFile(tmp.fd, direct=prefer_direct_io(len(header) + sum(_pad(t.nbytes) for t in tensors)))
            try:
                fault_point("header")
                f.write(memoryview(header))
                fault_point("data")
                for t in tensors:
                    written = 0
                    if t.file_span is not None and f.copy_span(*t.file_span, t.nbytes):
                        written = t.nbytes
                        if bar is not None:
                            bar.update(t.nbytes)
                    for chunk in (t.chunks() if written == 0 else ()):
                        mv = memoryview(chunk).cast("B") if isinstance(chunk, np.ndarray) else memoryview(chunk)
                        f.write(mv)
                        written += mv.nbytes
                        if bar is not None:
                            bar.update(mv.nbytes)
                    if written != t.nbytes:
                        raise DFlashError(f"internal error: tensor {t.name} produced {written} bytes, expected {t.nbytes}")
                    f.write(memoryview(bytes(_pad(written) - written)))
            finally:
                f.close()
            fault_point("finish")
            if finish is not None:
                for offset, data in finish(value_at):
                    os.pwrite(tmp.fd, data, offset)
            fault_point("verify")
            if verify is not None:
                verify(tmp.verify_path)
            tmp.commit(replace=replace)
            fault_point("renamed")
        except OSError as e:
            raise DFlashError(f"cannot write the output: {e.strerror or e}", out) from e
        finally:
            tmp.discard()  # removes the temporary file unless it became the output
    finally:
        if bar is not None:
            bar.close()
    return len(header) + sum(_pad(t.nbytes) for t in tensors)

