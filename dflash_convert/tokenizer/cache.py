"""A cache of the borrowed tokenizer keys, so a second conversion against one target skips the slow part.

Entries are keyed by a SHA-256 over everything the keys depend on. Nothing read is trusted (never
pickle): a faulty entry is ignored with one warning and rebuilt; an unwritable cache costs only speed.
Specification: docs/conversion.md, "The tokenizer cache".
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import logging
import os
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..arrays import StrArray
from ..errors import DFlashError
from ..files import parse_json
from ..format.keys import BOOLEAN, FLOAT, INT, VALUE_TYPES, ValueType, key
from ..metadata import Metadata
from .pre_hashes import KNOWN_PRE_NAMES, PRE_TOKENIZER_HASHES, PROBE_TEXT

log = logging.getLogger("dflash_convert")

FORMAT_VERSION = 2  # bump when an entry's layout or the meaning of its key changes (2: string arrays in GGUF form)
MAGIC = b"dflash-convert tokenizer cache\n"
MAX_ENTRY_BYTES = 256 << 20  # a 262k-token vocabulary with merges and scores is ~15 MB; more is not ours
MAX_ENTRIES = 32
ENTRY_SUFFIX = ".tokcache"
# modules whose code decides the tokenizer keys: a change to any of them is a different entry
_BUILDERS = ("tokenizer/borrow.py", "tokenizer/bpe.py", "tokenizer/gemma4.py", "tokenizer/probe.py",
             "tokenizer/special.py", "tokenizer/pre_hashes.py", "tokenizer/cache.py", "sources/config.py",
             "sources/checkpoint.py", "format/keys.py", "format/config_keys.py", "metadata.py", "files.py")
_PACKAGE = Path(__file__).resolve().parents[1]


def pre_table_version() -> str:
    """The pre-tokenizer table's version, as data: SHA-256 of the probe text, the hash table and the names."""
    table = {"probe": PROBE_TEXT, "hashes": sorted((h, name) for h, (name, _) in PRE_TOKENIZER_HASHES.items()),
             "names": sorted(KNOWN_PRE_NAMES)}
    return hashlib.sha256(json.dumps(table, ensure_ascii=True).encode()).hexdigest()


def _builders_fingerprint() -> str:
    h = hashlib.sha256()
    for rel in _BUILDERS:
        try:
            h.update(rel.encode() + b"\0" + (_PACKAGE / rel).read_bytes() + b"\0")
        except OSError:  # an install without sources: the package version alone stands for the code
            h.update(rel.encode() + b"\0?\0")
    return h.hexdigest()


def _tokenizers_version() -> str:
    """The probe's library decides the pre-tokenizer hash and the round trips: its installed version."""
    spec = importlib.util.find_spec("tokenizers")
    if spec is None or not spec.origin:
        return "absent"
    package = Path(spec.origin).parent
    infos = sorted(p.name for p in package.parent.glob("tokenizers-*.dist-info"))
    return ",".join(infos) or f"unversioned at {package}"


def tokenizer_inputs(target_dir: Path) -> list[Path]:
    """Every file the borrowed keys are read from, present or not (an absent one is part of the key too)."""
    names = ["tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja", "chat_template.json",
             "tokenizer.model"]
    files = [target_dir / n for n in names]
    extra = target_dir / "additional_chat_templates"
    if extra.is_dir():
        files += sorted(extra.glob("*.jinja"))
    return files


def _sha256_input(path: Path) -> str | None:
    """SHA-256 of a regular file, "absent" if there is none; None for anything else (no caching then)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return "absent"
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a FIFO or device: the slow path names it in its own error
        h = hashlib.sha256()
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


def entry_key(target_dir: Path, route: str, architecture: str | None, vocab_size: int | None,
              tokenizer_pre: str | None) -> str | None:
    """The cache key of one borrow, or None when an input cannot be hashed (then nothing is cached)."""
    parts: list[Any] = [FORMAT_VERSION, pre_table_version(), __version__, _builders_fingerprint(),
                        _tokenizers_version(), route, architecture, vocab_size, tokenizer_pre]
    for path in tokenizer_inputs(target_dir):
        digest = _sha256_input(path)
        if digest is None:
            return None
        parts.append([path.relative_to(target_dir).as_posix(), digest])
    return hashlib.sha256(json.dumps(parts, ensure_ascii=True).encode()).hexdigest()


def default_directory() -> Path:
    """The tokenizer cache's directory: ``$DFLASH_CONVERT_CACHE``, else ``$XDG_CACHE_HOME``, else ``~/.cache``."""
    root = os.environ.get("DFLASH_CONVERT_CACHE")
    if root:
        return Path(root) / "tokenizer"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative value is to be ignored
        return Path(xdg) / "dflash-convert" / "tokenizer"
    return Path.home() / ".cache" / "dflash-convert" / "tokenizer"


# --- the entry's payload (layout: docs/conversion.md, "The tokenizer cache")

def _encodable(kv_value: Any, vtype: ValueType, sub: ValueType | None) -> bool:
    """Can the entry carry this value back exactly? (Raw bytes, from a GGUF, cannot; the dir routes make none.)"""
    values = kv_value if vtype == ValueType.ARRAY else [kv_value]
    kind = VALUE_TYPES[sub if vtype == ValueType.ARRAY else vtype]  # type: ignore[index]
    if vtype == ValueType.ARRAY and sub == ValueType.STRING and isinstance(kv_value, StrArray):
        return True
    if vtype == ValueType.ARRAY and sub == ValueType.STRING or vtype == ValueType.STRING:
        return all(type(v) is str for v in values)
    if kind.kind == BOOLEAN:
        return all(type(v) is bool for v in values)
    if kind.kind == INT:
        return all(type(v) is int for v in values)
    return all(type(v) is float for v in values)


def encode_entry(cache_key: str, md: Metadata) -> bytes | None:
    """The bytes of an entry for ``md``, or None if a value could not come back exactly."""
    items: list[list[Any]] = []
    sections: list[list[int]] = []
    body: list[bytes] = []
    try:
        for kv in md:
            if kv.vtype == ValueType.ARRAY and (kv.sub is None or kv.sub == ValueType.ARRAY):
                return None
            if not _encodable(kv.value, kv.vtype, kv.sub):
                return None
            value = kv.value
            if kv.vtype == ValueType.ARRAY and kv.sub == ValueType.STRING:
                strings = StrArray.of(value)
                offsets = np.asarray(strings.offsets, dtype="<u8") - np.uint64(strings.offsets[0])
                raw = strings.gguf_items_bytes()
                value = {"section": len(sections)}
                sections.append([len(strings), offsets.nbytes, len(raw)])
                body += [offsets.tobytes(), raw]
            items.append([kv.key, int(kv.vtype), None if kv.sub is None else int(kv.sub), value])
        # NaN and infinities stay floats (Python's JSON writes and reads them); newlines in strings are escaped
        head = json.dumps({"key": cache_key, "kv": items, "sections": sections}, ensure_ascii=False,
                          separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: the writer would refuse the string anyway
        return None
    payload = b"".join([head, b"\n", *body])
    return MAGIC + f"{hashlib.sha256(payload).hexdigest()} {len(payload)}\n".encode() + payload


class CorruptEntry(Exception):
    """An entry that is not what this version writes; it is ignored and rebuilt."""


def _type_of(vtype: int | None, where: str) -> ValueType:
    if type(vtype) is not int or vtype not in ValueType._value2member_map_:
        raise CorruptEntry(f"{where}: value type {vtype!r}")
    return ValueType(vtype)


def _check_values(values: Any, t: ValueType, where: str) -> None:
    kind = VALUE_TYPES[t].kind
    if t == ValueType.STRING:
        ok = all(type(v) is str for v in values)
    elif kind == BOOLEAN:
        ok = all(type(v) is bool for v in values)
    elif kind == INT:
        ok = all(type(v) is int for v in values)
    elif kind == FLOAT:
        # JSON writes 1.0 as 1.0, but a float that was an exact integer still reads back as float
        ok = all(type(v) is float or (type(v) is int and not isinstance(v, bool)) for v in values)
    else:
        ok = False
    if not ok:
        raise CorruptEntry(f"{where}: a value is not of type {t.name}")


def _is_count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _read_sections(sections: Any, body: memoryview) -> list[StrArray]:
    """Every string array, from the sections that follow the JSON line, each checked (StrArray.checked)."""
    if not isinstance(sections, list):
        raise CorruptEntry("no section list")
    out: list[StrArray] = []
    at = 0
    for sec in sections:
        if not isinstance(sec, list) or len(sec) != 3 or not all(map(_is_count, sec)):
            raise CorruptEntry("malformed section")
        n, offsets_bytes, raw_bytes = sec
        if offsets_bytes != 8 * (n + 1) or at + offsets_bytes + raw_bytes > len(body):
            raise CorruptEntry("a section's sizes do not fit the entry")
        offsets = np.frombuffer(body[at:at + offsets_bytes], dtype="<u8").astype(np.int64)
        items = StrArray.checked(bytes(body[at + offsets_bytes:at + offsets_bytes + raw_bytes]), offsets)
        if items is None:
            raise CorruptEntry("a section's items do not match their offsets, or are not UTF-8")
        at += offsets_bytes + raw_bytes
        out.append(items)
    if at != len(body):
        raise CorruptEntry("bytes after the last section")
    return out


def decode_entry(data: bytes, cache_key: str) -> Metadata:
    """The Metadata an entry holds; CorruptEntry for any fault (truncation, a flipped byte, a foreign key)."""
    if not data.startswith(MAGIC):
        raise CorruptEntry("not a tokenizer cache entry")
    head_end = data.find(b"\n", len(MAGIC))
    if head_end < 0:
        raise CorruptEntry("no header line")
    head = data[len(MAGIC):head_end].split(b" ")
    payload = memoryview(data)[head_end + 1:]
    if len(head) != 2 or not head[1].isdigit() or int(head[1]) != len(payload):
        raise CorruptEntry(f"payload is {len(payload)} bytes, not as the header says")
    if hashlib.sha256(payload).hexdigest().encode() != head[0]:
        raise CorruptEntry("payload SHA-256 does not match")
    json_end = data.find(b"\n", head_end + 1)
    if json_end < 0:
        raise CorruptEntry("no key line")
    try:
        doc = parse_json(data[head_end + 1:json_end], "tokenizer cache entry")
    except DFlashError as e:
        raise CorruptEntry(e.message) from None
    if not isinstance(doc, dict) or doc.get("key") != cache_key or not isinstance(doc.get("kv"), list):
        raise CorruptEntry("entry is for another key, or has no key list")
    strings = _read_sections(doc.get("sections"), memoryview(data)[json_end + 1:])
    md = Metadata()
    for item in doc["kv"]:
        if not isinstance(item, list) or len(item) != 4 or type(item[0]) is not str or item[0] in md:
            raise CorruptEntry("malformed key entry")
        name, vtype, sub, value = item[0], _type_of(item[1], item[0]), item[2], item[3]
        if vtype == ValueType.ARRAY:
            sub_t = _type_of(sub, name)
            if isinstance(value, dict):
                ref = value.get("section")
                if sub_t != ValueType.STRING or len(value) != 1 or not _is_count(ref) or ref >= len(strings):
                    raise CorruptEntry(f"{name}: malformed section reference")
                value = strings[ref]
            elif sub_t == ValueType.ARRAY or not isinstance(value, list):
                raise CorruptEntry(f"{name}: not a flat array")
            else:
                _check_values(value, sub_t, name)
            if not value:
                raise CorruptEntry(f"{name}: an empty array")
        else:
            if sub is not None:
                raise CorruptEntry(f"{name}: element type on a scalar")
            sub_t = None
            _check_values([value], vtype, name)
        try:
            md.set_raw(name, vtype, value, sub_t)  # the integer ranges are checked here
        except (DFlashError, ValueError, TypeError) as e:
            raise CorruptEntry(f"{name}: {e}") from None
    tokens = md.get(key("tok_tokens"))
    if key("tok_model") not in md or not isinstance(tokens, StrArray) or not len(tokens):
        raise CorruptEntry("entry has no token list")
    return md


# --- reading and writing entries

def _read_bounded(path: Path) -> bytes | None:
    """An entry's bytes: only a regular file, never through a symbolic link, at most MAX_ENTRY_BYTES."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):  # no entry, or no cache directory
            return None
        if e.errno == errno.ELOOP:
            raise CorruptEntry("entry is a symbolic link") from None
        raise CorruptEntry(f"cannot open the entry: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptEntry("entry is not a regular file")
        if st.st_size > MAX_ENTRY_BYTES:
            raise CorruptEntry(f"entry is {st.st_size} bytes, over the {MAX_ENTRY_BYTES}-byte limit")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= st.st_size:  # one byte more than fstat said means the file grows under us
            chunk = os.read(fd, st.st_size + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total != st.st_size:
            raise CorruptEntry("entry changed while being read")
        return b"".join(chunks)
    except OSError as e:
        raise CorruptEntry(f"cannot read the entry: {e.strerror or e}") from None
    finally:
        os.close(fd)


@dataclass
class TokenizerCache:
    """Where entries live (None: no cache) and the last lookup's ``outcome``: off, hit, miss, miss-unstored, uncacheable."""

    directory: Path | None
    outcome: str = "off"
    ignored: list[str] = field(default_factory=list)

    def path_for(self, cache_key: str) -> Path:
        """The entry file for ``cache_key``."""
        assert self.directory is not None
        return self.directory / f"{cache_key}{ENTRY_SUFFIX}"

    def lookup(self, cache_key: str) -> Metadata | None:
        """The cached keys for ``cache_key``, or None when absent or ignored (a faulty entry is logged and rebuilt)."""
        if self.directory is None:
            return None
        path = self.path_for(cache_key)
        try:
            data = _read_bounded(path)
            if data is None:
                return None
            md = decode_entry(data, cache_key)
        except CorruptEntry as e:
            self.ignored.append(str(e))
            log.warning("%s: ignoring the tokenizer cache entry (%s); rebuilding it", path, e)
            return None
        self.outcome = "hit"
        return md

    def store(self, cache_key: str, md: Metadata) -> None:
        """Store the keys under ``cache_key``; a cache that cannot be written only records the outcome."""
        if self.directory is None:
            return
        data = encode_entry(cache_key, md)
        if data is None:
            self.outcome = "uncacheable"
            return
        try:
            self._write(self.path_for(cache_key), data)
        except OSError as e:  # the conversion goes on without the cache
            self.outcome = "miss-unstored"
            log.info("tokenizer cache not written in %s: %s", self.directory, e.strerror or e)
            return
        self.outcome = "miss"
        self._prune()

    def _write(self, path: Path, data: bytes) -> None:
        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=ENTRY_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # atomic: a reader sees the old entry, no entry, or this one whole
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _prune(self) -> None:
        """Keep the MAX_ENTRIES most recently written entries (one per target and draft vocab size)."""
        assert self.directory is not None
        try:
            entries = [(p.stat().st_mtime, p) for p in self.directory.glob(f"*{ENTRY_SUFFIX}") if not p.name.startswith(".")]
            for _, p in sorted(entries, reverse=True)[MAX_ENTRIES:]:
                p.unlink()
        except OSError:
            pass  # another process pruned first, or the directory went away: nothing to keep tidy


def open_cache(cache: bool | str | os.PathLike | TokenizerCache | None) -> TokenizerCache:
    """``True``: the default directory; ``False``/``None``: no cache; a path: that directory."""
    if isinstance(cache, TokenizerCache):
        return cache
    if cache is True:
        return TokenizerCache(default_directory())
    if cache is False or cache is None:
        return TokenizerCache(None)
    return TokenizerCache(Path(cache))


def copy_keys(source: Iterable[Any], md: Metadata) -> None:
    """Every key of ``source`` into ``md``, in order, values as they are (already checked)."""
    for kv in source:
        md.set_as_read(kv.key, kv.vtype, kv.value, kv.sub)


__all__ = ["TokenizerCache", "decode_entry", "encode_entry", "entry_key", "open_cache"]
