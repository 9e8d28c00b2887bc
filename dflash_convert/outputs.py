"""Where a command may write: never over an input, never over an existing file without --force.

An output may never be a file the command reads (compared by resolved path *and* by device and
inode, so hard links and symlinks count), nor a file inside a directory the command reads whose
name that directory's reader would pick up (``config.json``, ``model*.safetensors``, tokenizer
files, ...). Neither ``--force`` nor anything else lifts this.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DFlashError
from .files import kind_of

# names a model-directory reader picks up (checkpoint and target directories): an output there
# with one of these names would change what the next read sees
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
