"""How every input file is opened: only a regular file (or a directory, where one is expected).

A FIFO, a socket or a device gets one clear line instead of a read that blocks forever or never
ends. The check is made on the opened descriptor (``open_regular``), so a path swapped between
check and open cannot slip through. Tensor data is read by position through ``pread_into``, with
one descriptor per file for a whole pass (``FdCache``). Where outputs may go is ``outputs.py``.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from .errors import InputFileError


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def _stat_input(path: str | os.PathLike, what: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise InputFileError(f"{what} does not exist", path) from None
    except OSError as e:
        raise InputFileError(f"cannot read {what}: {e.strerror or e}", path) from e


def check_regular_file(path: str | os.PathLike, what: str = "input") -> os.stat_result:
    """stat() a path that must be an existing regular file (symlinks followed)."""
    st = _stat_input(path, what)
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} is {kind_of(st.st_mode)}, not a regular file", path)
    return st


def check_directory(path: str | os.PathLike, what: str = "directory") -> None:
    st = _stat_input(path, what)
    if not stat.S_ISDIR(st.st_mode):
        raise InputFileError(f"{what} is {kind_of(st.st_mode)}, not a directory", path)


def open_regular(path: str | os.PathLike, what: str = "input") -> int:
    """A read-only descriptor of a regular file; refuses FIFOs and devices without blocking on them.

    O_NONBLOCK makes opening a FIFO return at once; the type is then checked on the descriptor.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputFileError(f"{what} does not exist", p) from None
    except OSError as e:
        raise InputFileError(f"cannot read {what}: {e.strerror or e}", p) from e
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputFileError(f"{what} is {kind_of(st.st_mode)}, not a regular file", p)
    os.set_blocking(fd, True)
    return fd


def read_regular_bytes(path: str | os.PathLike, what: str = "input", limit: int | None = None) -> bytes:
    fd = open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise InputFileError(f"{what} is {size} bytes, larger than the {limit}-byte limit", path)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


class FdCache:
    """One read-only descriptor per source file for a whole pass over a drafter."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()  # chunks of one file are read from several encoder threads

    def get(self, path: os.PathLike | str) -> int:
        key = os.fspath(path)
        fd = self._fds.get(key)
        if fd is None:
            with self._lock:
                fd = self._fds.get(key)
                if fd is None:
                    fd = self._fds[key] = open_regular(key)  # a file swapped for a FIFO since it was indexed is refused
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> FdCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pread_into(path: os.PathLike | str, fds: FdCache | None, buf: memoryview, offset: int) -> int:
    """Fill ``buf`` from ``path`` at ``offset`` by positional reads; returns the bytes read (short at EOF).

    Both tensor readers (safetensors, GGUF) read their rows through here: one descriptor from
    ``fds`` when given, else a regular-file descriptor opened and closed for this read.
    """
    if fds is not None:
        fd, own = fds.get(path), False
    else:
        fd, own = open_regular(path), True
    try:
        got = 0
        while got < buf.nbytes:
            r = os.preadv(fd, [buf[got:]], offset + got)
            if r <= 0:
                break
            got += r
        return got
    finally:
        if own:
            os.close(fd)
