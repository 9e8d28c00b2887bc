"""Every rule about which files a command may read and which path it may write, in one place.

Inputs: a path is opened only after it is known to be a regular file (or a directory, where one
is expected); a FIFO, a socket or a device gets one clear line instead of a read that blocks
forever or never ends. The check is made on the opened descriptor (``open_regular``), so a path
swapped between check and open cannot slip through.

Outputs: an output may never be a file the command reads (compared by resolved path *and* by
device and inode, so hard links and symlinks count), nor a file inside a directory the command
reads whose name that directory's reader would pick up (``config.json``, ``model*.safetensors``,
tokenizer files, ...). Neither ``--force`` nor anything else lifts this.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DFlashError, InputFileError

# names a model-directory reader picks up (checkpoint and target directories): an output there
# with one of these names would change what the next read sees
DIRECTORY_INPUT_NAMES: tuple[str, ...] = (
    "config.json", "model*.safetensors", "*.safetensors.index.json", "tokenizer*", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "chat_template*", "generation_config.json", "mask_embedding.pt",
    "*.bin", "*.pt",
)


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


@dataclass
class Inputs:
    """Every file and directory one command reads, to keep its output off all of them."""

    files: list[Path] = field(default_factory=list)
    directories: list[Path] = field(default_factory=list)

    def add_file(self, path: str | os.PathLike | None) -> None:
        if path is not None:
            self.files.append(Path(path))

    def add_files(self, paths: Iterable[str | os.PathLike]) -> None:
        for p in paths:
            self.add_file(p)

    def add_directory(self, path: str | os.PathLike | None) -> None:
        """A model directory: every file in it its reader may pick up counts as an input."""
        if path is None:
            return
        d = Path(path)
        self.directories.append(d)
        try:
            self.files.extend(p for p in d.iterdir() if any(fnmatch.fnmatch(p.name, pat) for pat in DIRECTORY_INPUT_NAMES))
        except OSError:
            pass


def refuse_unless_valid(out: Path) -> Callable[[Path], None]:
    """A write_gguf ``verify`` hook: validate's drafter checks on the finished temporary file.

    convert and migrate never leave a file behind that their own validate would fail.
    """
    def verify(tmp: Path) -> None:
        from .checks import validate
        from .checks.report import FAIL

        report = validate(tmp)
        bad = [c for c in report.checks if c.status == FAIL]
        if bad:
            first = bad[0]
            detail = f": {first.details[0]}" if first.details else ""
            raise DFlashError(f"refusing to write a file that fails validate ({first.id}: {first.message}{detail}"
                              f"{f'; and {len(bad) - 1} more failing check(s)' if len(bad) > 1 else ''})", out)

    return verify


def _identity(p: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_output_path(out: str | os.PathLike, inputs: Inputs | Iterable[str | os.PathLike], *, force: bool) -> Path:
    """Refuse an output that is (or would replace) an input, or an existing file without --force.

    Returns the output path. Errors name the output as the user typed it.
    """
    if not isinstance(inputs, Inputs):
        files = Inputs()
        files.add_files(inputs)
        inputs = files
    text = os.fspath(out)
    if not text.strip():
        raise DFlashError("the output path is empty")
    out = Path(text)
    resolved = out.resolve()
    ident = _identity(out)
    for p in inputs.files:
        if p.resolve() == resolved or (ident is not None and _identity(p) == ident):
            raise DFlashError(f"output would overwrite an input file ({p}); choose another output path", out)
    for d in inputs.directories:
        if resolved.parent == d.resolve() and any(fnmatch.fnmatch(out.name, pat) for pat in DIRECTORY_INPUT_NAMES):
            raise DFlashError(f"output {out.name!r} inside the input directory {d} has a name its reader picks up; "
                              "choose another name or folder", out)
    if out.is_symlink() and not out.exists():
        raise DFlashError("output is a dangling symbolic link; remove it or choose another path", out)
    if out.exists():
        if out.is_dir():
            raise DFlashError("output is a directory", out)
        if not force:
            raise DFlashError("output exists; pass --force to replace it", out)
        st = os.stat(out)
        if not stat.S_ISREG(st.st_mode):
            raise DFlashError(f"output is {kind_of(st.st_mode)}; only a regular file is replaced", out)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise DFlashError("output folder does not exist", parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DFlashError("output folder is not writable", out)
    return out
