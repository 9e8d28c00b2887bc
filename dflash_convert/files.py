"""How every input file is opened: only a regular file (or a directory, where one is expected).

A FIFO, a socket or a device is one error line, checked on the opened descriptor so a swapped path
cannot slip through. Tensor data is read by position (``pread_into``, ``FdCache``); every JSON input
goes through ``parse_json``, whose nesting is bounded (``MAX_JSON_DEPTH``). ``hub_cache_dir`` reads
the environment on every call. Where outputs may go is ``outputs.py``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import threading
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

from .errors import InputFileError


def kind_of(mode: int) -> str:
    """What a file is, as a message says it: "a FIFO", "a regular file", ..."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "a file of an unknown kind"


def os_reason(e: OSError) -> str:
    """An OSError's reason as a message says it; a symbolic link loop is named as one."""
    if e.errno == errno.ELOOP:
        return "a symbolic link loop (too many levels of symbolic links)"
    return e.strerror or str(e)


def _cannot_read(what: str, path: str | os.PathLike, e: OSError) -> InputFileError:
    if e.errno == errno.ELOOP:
        return InputFileError(f"{what} is a symbolic link loop (too many levels of symbolic links)", path)
    return InputFileError(f"cannot read {what}: {e.strerror or e}", path)


def _stat_input(path: str | os.PathLike, what: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise InputFileError(f"{what} does not exist", path) from None
    except OSError as e:
        raise _cannot_read(what, path, e) from e


def check_regular_file(path: str | os.PathLike, what: str = "input") -> os.stat_result:
    """stat() a path that must be an existing regular file (symlinks followed)."""
    st = _stat_input(path, what)
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} is {kind_of(st.st_mode)}, not a regular file", path)
    return st


def check_directory(path: str | os.PathLike, what: str = "directory") -> None:
    """Refuse ``path`` unless it is a directory (missing, a file, a FIFO: one error naming it)."""
    st = _stat_input(path, what)
    if not stat.S_ISDIR(st.st_mode):
        raise InputFileError(f"{what} is {kind_of(st.st_mode)}, not a directory", path)


def open_regular(path: str | os.PathLike, what: str = "input") -> int:
    """A read-only descriptor of a regular file; O_NONBLOCK, so a FIFO or device is refused without blocking."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputFileError(f"{what} does not exist", p) from None
    except OSError as e:
        raise _cannot_read(what, p, e) from e
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputFileError(f"{what} is {kind_of(st.st_mode)}, not a regular file", p)
    os.set_blocking(fd, True)
    return fd


def read_regular_bytes(path: str | os.PathLike, what: str = "input", limit: int | None = None) -> bytes:
    """The bytes of a regular file (no FIFO or device), refusing one larger than ``limit``."""
    fd = open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise InputFileError(f"{what} is {size} bytes, larger than the {limit}-byte limit", path)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as e:
        raise _cannot_read(what, path, e) from e
    finally:
        os.close(fd)


# --- JSON, parsed with bounded nesting

MAX_JSON_DEPTH = 100  # configs and tokenizer files nest a handful of levels; a parser's stack is the limit otherwise
_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))  # every byte but the four brackets, for bytes.translate
_STEP = [1 if b in b"[{" else -1 for b in range(256)]
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def _bracket_depth(brackets: bytes) -> int:
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def json_depth(data: bytes) -> int:
    """How deep a JSON text's arrays and objects nest: exact past MAX_JSON_DEPTH, possibly over within it."""
    upper = _bracket_depth(data.translate(None, _BRACKETS))  # strings counted too: a bound from above, fast
    if upper <= MAX_JSON_DEPTH:
        return upper
    return _bracket_depth(_JSON_STRING.sub(b"", data).translate(None, _BRACKETS))


def parse_json(data: bytes | str, what: str, path: str | os.PathLike | None = None, *,
               object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """Parse untrusted JSON: one InputFileError line for text that is not UTF-8, not JSON, or nested past MAX_JSON_DEPTH."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise InputFileError(f"{what} nests JSON {depth} levels deep, deeper than the {MAX_JSON_DEPTH} levels accepted", path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{what} is not UTF-8 text (byte {e.start})", path) from None
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except ValueError as e:
        raise InputFileError(f"{what} is not valid JSON: {e}", path) from None
    except RecursionError:  # below the bound, but the interpreter's stack was shorter still
        raise InputFileError(f"{what} nests JSON too deeply ({depth} levels)", path) from None


class FdCache:
    """One read-only descriptor per source file for a whole pass over a drafter."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()  # chunks of one file are read from several encoder threads

    def get(self, path: os.PathLike | str) -> int:
        """A read-only descriptor for ``path``, opened once and shared across threads."""
        key = os.fspath(path)
        fd = self._fds.get(key)
        if fd is None:
            with self._lock:
                fd = self._fds.get(key)
                if fd is None:
                    fd = self._fds[key] = open_regular(key)  # a file swapped for a FIFO since it was indexed is refused
        return fd

    def close(self) -> None:
        """Close every cached descriptor."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> FdCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pread_into(path: os.PathLike | str, fds: FdCache | None, buf: memoryview, offset: int) -> int:
    """Fill ``buf`` from ``path`` at ``offset`` by positional reads; returns the bytes read (short at EOF)."""
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


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of a regular file's bytes, read in 8 MiB steps into one buffer."""
    h = hashlib.sha256()
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    with os.fdopen(open_regular(path), "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def hub_cache_dir() -> Path:
    """The shared cache folder as the environment names it now (huggingface_hub's order)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(os.path.expanduser(explicit)))
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                     "huggingface")
    return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"


def inside_hub_cache(path: str | os.PathLike) -> bool:
    """Does ``path`` (resolved) lie in the Hugging Face cache? Nothing of ours is written there."""
    cache = Path(os.path.realpath(hub_cache_dir()))
    where = Path(os.path.realpath(path))
    return where == cache or cache in where.parents
