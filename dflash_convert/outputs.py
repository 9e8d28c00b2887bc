"""Where a command may write, and how: never over an input, never over an existing file without --force.

Refuses, even with ``--force``, an output that is a file the command reads (path or inode), a name an
input directory's reader picks up, or anything in the Hugging Face cache. Files are written beside
their destination and renamed into place; a killed run's leftovers are removed by the next writer.
Specification: docs/conversion.md, "How every output is written".
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import fnmatch
import functools
import logging
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DFlashError
from .files import hub_cache_dir, inside_hub_cache, kind_of

# names a model-directory reader picks up: an output there would change the next read
DIRECTORY_INPUT_NAMES: tuple[str, ...] = (
    "config.json", "model*.safetensors", "*.safetensors.index.json", "tokenizer*", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "chat_template*", "generation_config.json", "mask_embedding.pt",
    "*.bin", "*.pt",
)


@dataclass
class Inputs:
    """Every file and directory one command reads, to keep its output off all of them."""

    files: list[Path] = field(default_factory=list)
    directories: list[Path] = field(default_factory=list)

    def add_file(self, path: str | os.PathLike | None) -> None:
        """Record one file the command reads (None is skipped)."""
        if path is not None:
            self.files.append(Path(path))

    def add_files(self, paths: Iterable[str | os.PathLike]) -> None:
        """Record files the command reads."""
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


def _identity(p: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def resolved_path(p: Path) -> Path:
    """The path with every link resolved as far as it resolves; a loop (Path.resolve raises) stays as it is."""
    return Path(os.path.realpath(p))


def _read_only_filesystem(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_output_path(out: str | os.PathLike, inputs: Inputs | Iterable[str | os.PathLike], *, force: bool) -> Path:
    """Refuse an output that is (or would replace) an input, or an existing file without --force."""
    if not isinstance(inputs, Inputs):
        files = Inputs()
        files.add_files(inputs)
        inputs = files
    text = os.fspath(out)
    if not text.strip():
        raise DFlashError("the output path is empty")
    if text.endswith(os.sep):
        if os.path.isdir(text):
            raise DFlashError("output is a directory; give a file name", text)
        raise DFlashError("output folder does not exist (a path ending in / names a folder)", text)
    out = Path(text)
    resolved = resolved_path(out)
    if inside_hub_cache(resolved):  # snapshots are links into blobs
        raise DFlashError(f"output is inside the Hugging Face cache ({hub_cache_dir()}); choose another path", out)
    ident = _identity(out)
    for p in inputs.files:
        if resolved_path(p) == resolved or (ident is not None and _identity(p) == ident):
            raise DFlashError(f"output would overwrite an input file ({p}); choose another output path", out)
    for d in inputs.directories:
        if resolved.parent == resolved_path(d) and any(fnmatch.fnmatch(out.name, pat) for pat in DIRECTORY_INPUT_NAMES):
            raise DFlashError(f"output {out.name!r} inside the input directory {d} has a name its reader picks up; "
                              "choose another name or folder", out)
    try:
        os.stat(out)
    except OSError as e:
        if e.errno == errno.ELOOP:
            try:
                os.lstat(out)
            except OSError:  # the loop is on the way to it
                raise DFlashError("output folder is a symbolic link loop", out.parent) from None
            raise DFlashError("output is a symbolic link loop; remove it or choose another path", out) from None
        if e.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise DFlashError(f"cannot write the output: {e.strerror or e}", out) from None
    if out.is_symlink() and not out.exists():
        raise DFlashError("output is a dangling symbolic link; remove it or choose another path", out)
    if out.exists():
        if out.is_dir():
            raise DFlashError("output is a directory", out)
        st = os.stat(out)
        if not stat.S_ISREG(st.st_mode):  # said first: --force would not help, so it is not offered
            raise DFlashError(f"output is {kind_of(st.st_mode)}; only a regular file is replaced", out)
        if not force:
            raise DFlashError("output exists; pass --force to replace it", out)
    parent = out.parent if str(out.parent) else Path(".")
    try:
        os.stat(parent)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DFlashError("output folder is a symbolic link loop", parent) from None
    if not parent.is_dir():
        raise DFlashError("output folder does not exist", parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        if _read_only_filesystem(parent):
            raise DFlashError("output folder is on a read-only file system", out)
        raise DFlashError("output folder is not writable", out)
    return out


# --- temporary outputs: unaimable, written through their descriptor, committed without clobbering

NAME_MAX = 255  # bytes of one path component on Linux filesystems
PARTIAL_SUFFIX = ".dflash-partial"
_LEGACY_PARTIAL = ".partial-"  # what earlier versions left behind: .<name>.partial-<pid>
_RENAME_NOREPLACE = 1  # linux/fs.h
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def temporary_name(out: Path, pid: int, token: str) -> str:
    """``.<output name>.<pid>-<random>.dflash-partial``, the name cut so the whole stays a legal file name."""
    tail = f".{pid}-{token}{PARTIAL_SUFFIX}"
    budget = NAME_MAX - 1 - len(tail.encode())
    stem = out.name.encode(errors="surrogateescape")[:budget].decode(errors="ignore")
    return f".{stem}{tail}"


# the lines of removed partials: -q (the root logger's level) does not silence them
_REMOVED = logging.getLogger("dflash_convert.removed_partials")
_REMOVED.setLevel(logging.WARNING)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_LOCKED_PARTIAL = re.compile(r"\.(?P<stem>.+)\.(?P<pid>[0-9]+)-(?P<boot>[0-9a-f]{8})-[0-9a-f]{16}" + re.escape(PARTIAL_SUFFIX))


@functools.lru_cache(maxsize=1)
def boot_tag() -> str | None:
    """The first 8 hex digits of this boot's id (Linux), None where there is none; a partial's lock and pid mean something only there."""
    try:
        text = BOOT_ID.read_text().strip().replace("-", "")
    except OSError:
        return None
    return text[:8] if re.fullmatch(r"[0-9a-f]{32}", text) else None


def lock_for_life(fd: int) -> None:
    """An exclusive flock on a temporary file until its descriptor closes: tells a later run the writer is gone."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass


def _abandoned(path: Path) -> bool:
    """Whether ``path`` is our temporary file (this boot's, regular, one link) whose writer's lock is free."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink != 1:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != (st.st_dev, st.st_ino):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: the writer is alive (or the file system cannot tell)
            return False
        # the lock stays ours until the name is gone: no writer can be mid-claim on this file
        current = os.lstat(path)
        if (current.st_dev, current.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_abandoned_partials(folder: Path) -> list[str]:
    """Remove every temporary file of ours in ``folder`` whose writer is provably gone; returns one line per removal."""
    tag = boot_tag()
    if tag is None:
        return []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    lines = []
    for name in names:
        m = _LOCKED_PARTIAL.fullmatch(name)
        if m is None or m["boot"] != tag:
            continue
        try:
            size = os.lstat(folder / name).st_size
        except OSError:
            continue
        if _abandoned(folder / name):
            line = f"removed {folder / name} ({size} bytes), left by a run (pid {m['pid']}) that was killed before it finished"
            _REMOVED.warning("%s", line)
            lines.append(line)
    return lines


def pid_alive(pid: int) -> bool:
    """Whether a process of that id exists (one we may not signal counts: it is alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_partials(out: Path) -> list[Path]:
    """Temporary files of ours for ``out`` whose writing process is gone (killed, or the machine went down)."""
    folder = out.parent if str(out.parent) else Path(".")
    stem = temporary_name(out, 0, "")[: -len(f".0-{PARTIAL_SUFFIX}")]
    found = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        pid_text = None
        if name.startswith(stem + ".") and name.endswith(PARTIAL_SUFFIX):
            pid_text = name[len(stem) + 1:-len(PARTIAL_SUFFIX)].split("-", 1)[0]
        elif name.startswith(f".{out.name}{_LEGACY_PARTIAL}"):
            pid_text = name[len(f".{out.name}{_LEGACY_PARTIAL}"):]
        if pid_text is not None and pid_text.isdigit() and not pid_alive(int(pid_text)):
            found.append(folder / name)
    return sorted(found)


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """renameat2(2) with ``flags``; False where the platform or the file system has no such call or flag."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # no such call, or a filesystem without the flag
        return False
    raise OSError(err, os.strerror(err), os.fspath(dst))


def _renameat2_no_replace(src: Path, dst: Path) -> bool:
    """rename(2) that fails with EEXIST when ``dst`` exists; False where the platform has no renameat2."""
    return _renameat2(src, dst, _RENAME_NOREPLACE)


def exchange_paths(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (renameat2 RENAME_EXCHANGE); False, nothing moved, where unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def rename_no_replace(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst`` only if nothing is there (RENAME_NOREPLACE, else link + unlink)."""
    if _renameat2_no_replace(src, dst):
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # a filesystem with neither (some FUSE mounts): the best left is to look, then rename
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst)) from None
        os.rename(src, dst)
        return
    os.unlink(src)


class TemporaryOutput:
    """A new file beside ``out``, created O_EXCL | O_NOFOLLOW under a random name (no planted link), renamed into place when complete."""

    kind = "file"
    fd = -1

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        folder = self.out.parent if str(self.out.parent) else Path(".")
        tag = boot_tag()
        for _ in range(16):
            token = secrets.token_hex(8)
            self.path = folder / temporary_name(self.out, os.getpid(), token if tag is None else f"{tag}-{token}")
            try:
                self._ident = self._create()
            except FileExistsError:
                continue
            except OSError as e:
                raise DFlashError(f"cannot write the output: {e.strerror or e}", self.out) from e
            if self.fd >= 0:  # a file (a directory has no descriptor to lock)
                lock_for_life(self.fd)
            break
        else:
            raise DFlashError(f"cannot create a temporary {self.kind} beside the output (every random name was taken)", self.out)
        self.done = False

    def _create(self) -> tuple[int, int]:
        """Make the new file at ``self.path``; its (device, inode)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        self.fd = os.open(self.path, flags, 0o666)
        st = os.fstat(self.fd)
        return st.st_dev, st.st_ino

    def _ours(self) -> bool:
        """Whether the temporary name still holds what this run made there."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._ident

    @property
    def verify_path(self) -> Path:
        """A path that reads this very file (its descriptor's /proc entry where there is one)."""
        proc = Path(f"/proc/self/fd/{self.fd}")
        return proc if proc.exists() else self.path

    def commit(self, *, replace: bool = False) -> Path:
        """Rename into place (over an existing ``out`` only with ``replace``), once checked to be still ours."""
        if not self._ours():
            raise DFlashError(f"the temporary {self.kind} {self.path.name} was moved or replaced while it was written; "
                              "nothing was written", self.out)
        try:
            if replace:
                self._replace()
            else:
                rename_no_replace(self.path, self.out)
        except FileExistsError:
            raise DFlashError("output appeared while this run was writing it (another run?); it was not replaced: "
                              "pass --force to replace it", self.out) from None
        except OSError as e:
            raise DFlashError(f"cannot write the output: {e.strerror or e}", self.out) from e
        self.done = True
        self.close()
        return self.out

    def _replace(self) -> None:
        """Put this file over the regular file at ``out`` (--force): an exchange, then unlink the old one.

        A rename over a file makes ext4 flush the new data first (auto_da_alloc); a plain rename is
        the fallback (a symbolic link is replaced, not followed)."""
        try:
            regular = stat.S_ISREG(os.lstat(self.out).st_mode)
        except OSError:
            regular = False
        if not (regular and exchange_paths(self.path, self.out)):
            os.replace(self.path, self.out)
            return
        self.done = True  # the temporary name now holds the old output: never discard it as ours
        try:
            os.unlink(self.path)
        except OSError:  # left for clear_stale_partials, as a killed run's file would be
            pass

    def _remove(self) -> None:
        os.unlink(self.path)

    def close(self) -> None:
        """Close the descriptor (the file stays)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def discard(self) -> None:
        """Remove what this run made, unless it was committed or the name no longer holds it."""
        if not self.done and self._ours():
            try:
                self._remove()
            except OSError:
                pass
        self.close()

    def __enter__(self) -> TemporaryOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.done:
            self.discard()


class TemporaryDirectory(TemporaryOutput):
    """A new directory beside ``out`` (mkdir follows nothing), renamed into place; ``replace`` swaps an old one out atomically."""

    kind = "directory"

    def _create(self) -> tuple[int, int]:
        os.mkdir(self.path, 0o777)
        st = os.lstat(self.path)
        return st.st_dev, st.st_ino

    def _ours(self) -> bool:
        return super()._ours() and os.path.isdir(self.path) and not os.path.islink(self.path)

    def _replace(self) -> None:
        if not os.path.lexists(self.out):
            rename_no_replace(self.path, self.out)
            return
        if exchange_paths(self.path, self.out):  # the old directory is now at the temporary name
            self.done = True
            shutil.rmtree(self.path, ignore_errors=True)
            return
        aside = self.out.parent / temporary_name(self.out, os.getpid(), secrets.token_hex(8) + "-old")
        os.rename(self.out, aside)
        try:
            rename_no_replace(self.path, self.out)
        except BaseException:
            os.rename(aside, self.out)
            raise
        self.done = True
        shutil.rmtree(aside, ignore_errors=True)

    def _remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def clear_stale_partials(out: Path, *, force: bool) -> list[str]:
    """Remove the folder's abandoned temporary files; report (with ``force`` remove) others a dead run left beside ``out``."""
    remove_abandoned_partials(out.parent if str(out.parent) else Path("."))
    notes = []
    for p in stale_partials(out):
        if force:
            try:
                p.unlink()
                notes.append(f"removed {p.name}, left in {p.parent} by a run that did not finish")
            except OSError as e:
                notes.append(f"cannot remove {p}, left by a run that did not finish: {e.strerror or e}")
        else:
            notes.append(f"{p} was left by a run that did not finish; remove it, or pass --force to have it removed")
    return notes
