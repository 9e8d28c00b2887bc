"""The tokenizer cache: a warm conversion reads the borrowed keys back, byte for byte the same output.

Most cases use the synthetic Gemma-4 target (a 916-token vocabulary: cheap to rebuild); the cold
and warm pair of the real 151k-token Qwen3 vocabulary, with its probe child, is run once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import cli_server
import pytest

from dflash_convert import convert
from dflash_convert.arrays import StrArray
from dflash_convert.metadata import Metadata
from dflash_convert.tokenizer import borrow
from dflash_convert.tokenizer.cache import (
    ENTRY_SUFFIX,
    MAGIC,
    MAX_ENTRY_BYTES,
    TokenizerCache,
    decode_entry,
    default_directory,
    encode_entry,
)
from fixtures.drafters import make_zlab_drafter
from fixtures.targets import make_target_dir

TOKENS = "tokenizer.ggml.tokens"


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tokcache")
    return (make_zlab_drafter(root / "draft", vocab_size=916, mask_token_id=4),
            make_target_dir(root / "gemma4-target", "gemma4"))


@pytest.fixture(scope="module")
def gemma4_reference(gemma4, tmp_path_factory) -> bytes:
    """The output with no cache at all: what every cached conversion must equal."""
    src, target = gemma4
    out = tmp_path_factory.mktemp("reference") / "ref.gguf"
    assert convert(src, target, outfile=out, outtype="bf16", cache=False).tokenizer_cache == "off"
    return out.read_bytes()


def _convert(src: Path, target: Path, out: Path, cache) -> tuple[str, bytes]:
    plan = convert(src, target, outfile=out, outtype="bf16", cache=cache)
    return plan.tokenizer_cache, out.read_bytes()


def _entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob(f"*{ENTRY_SUFFIX}"))


def _no_slow_path(monkeypatch) -> None:
    """A tripwire: the probe and the parsing of the tokenizer files must not run."""
    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer keys were built, not read from the cache")
    monkeypatch.setattr(borrow, "_build", refuse)
    monkeypatch.setattr(borrow, "Probe", refuse)


def test_cold_then_warm_is_byte_identical_and_skips_the_probe(tmp_path, qwen3_target, monkeypatch):
    """The real Qwen3 vocabulary: cold (probe child, parse, store), warm (read back), no cache: one file."""
    src = make_zlab_drafter(tmp_path / "draft", target_layer_ids=[0, 2])
    cache_dir = tmp_path / "cache"
    cold, cold_bytes = _convert(src, qwen3_target, tmp_path / "cold.gguf", cache_dir)
    assert cold == "miss" and len(_entries(cache_dir)) == 1
    off, off_bytes = _convert(src, qwen3_target, tmp_path / "off.gguf", False)
    assert off == "off" and off_bytes == cold_bytes
    _no_slow_path(monkeypatch)
    warm, warm_bytes = _convert(src, qwen3_target, tmp_path / "warm.gguf", cache_dir)
    assert warm == "hit" and warm_bytes == cold_bytes


def test_an_entry_holds_exactly_the_keys_built(gemma4, tmp_path):
    """Every key, value type, element type and value comes back as built (ints, floats, bools, strings)."""
    _, target = gemma4
    built = Metadata()
    n = borrow.borrow_from_dir(built, target, "Gemma4ForCausalLM", 916, cache=TokenizerCache(tmp_path))
    (entry,) = _entries(tmp_path)
    read = decode_entry(entry.read_bytes(), entry.name.removesuffix(ENTRY_SUFFIX))

    def plain(value):  # a string array comes back compact, in GGUF form (StrArray): its items as text
        return value.texts() if isinstance(value, StrArray) else value

    assert [(kv.key, kv.vtype, kv.sub, plain(kv.value)) for kv in read] == [(kv.key, kv.vtype, kv.sub, kv.value) for kv in built]
    assert n == len(read.get(TOKENS)) == 916 and isinstance(read.get(TOKENS), StrArray)
    assert {type(v) for kv in read for v in (plain(kv.value) if isinstance(kv.value, (list, StrArray)) else [kv.value])} == \
        {str, int, float, bool}


def _truncate(entry: Path) -> None:
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])


def _flip_a_byte(entry: Path) -> None:
    """One byte of one token's text: the payload is still valid JSON of the right shape; only its hash tells."""
    data = bytearray(entry.read_bytes())
    data[data.index(b"<0x41>") + 3] = ord("Z")
    entry.write_bytes(bytes(data))


def _fifo(entry: Path) -> None:
    entry.unlink()
    os.mkfifo(entry)


def _symlink(entry: Path) -> None:
    """Even a link to a valid entry is not followed: a link can point anywhere."""
    elsewhere = entry.parent.parent / "elsewhere.tokcache"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)


def _huge(entry: Path) -> None:
    with open(entry, "r+b") as f:  # sparse: costs no disk
        f.truncate(MAX_ENTRY_BYTES + 1)


def _another_keys_entry(entry: Path) -> None:
    """A whole, valid entry, but made for other files: its payload names another key."""
    other = decode_entry(entry.read_bytes(), entry.name.removesuffix(ENTRY_SUFFIX))
    entry.write_bytes(encode_entry("0" * 64, other))  # type: ignore[arg-type]


def _wrong_shape(entry: Path) -> None:
    """A checksum that matches a payload of the wrong shape (a token type that is a string)."""
    cache_key = entry.name.removesuffix(ENTRY_SUFFIX)
    _, _, payload = entry.read_bytes().split(b"\n", 2)
    line, _, sections = payload.partition(b"\n")
    doc = json.loads(line)
    for item in doc["kv"]:
        if item[0] == "tokenizer.ggml.token_type":
            item[3][5] = "5"
    payload = json.dumps({**doc, "key": cache_key}).encode() + b"\n" + sections
    entry.write_bytes(MAGIC + f"{hashlib.sha256(payload).hexdigest()} {len(payload)}\n".encode() + payload)


def _resealed(entry: Path, edit) -> None:
    """The entry's sections edited by ``edit(bytearray, offsets_bytes)``, under a checksum that matches again."""
    _, _, payload = entry.read_bytes().split(b"\n", 2)
    line, _, sections = payload.partition(b"\n")
    sections = bytearray(sections)
    edit(sections, json.loads(line)["sections"][0][1])
    payload = line + b"\n" + bytes(sections)
    entry.write_bytes(MAGIC + f"{hashlib.sha256(payload).hexdigest()} {len(payload)}\n".encode() + payload)


def _lengths_off_by_one(entry: Path) -> None:
    """A checksum that matches a section whose first item's length prefix is one more than its bytes."""
    def edit(sections: bytearray, at: int) -> None:
        sections[at] += 1  # the first item's u64 length (little-endian), after the section's offsets
    _resealed(entry, edit)


def _not_utf8(entry: Path) -> None:
    """A checksum that matches a token whose bytes are not UTF-8 (lengths and offsets all agree)."""
    def edit(sections: bytearray, at: int) -> None:
        sections[sections.index(b"<0x41>") + 1] = 0xFF
    _resealed(entry, edit)


# spoiler -> (how, the reason the entry is ignored)
SPOILERS = {"truncated": (_truncate, "not as the header says"), "flipped_byte": (_flip_a_byte, "SHA-256 does not match"),
            "fifo": (_fifo, "not a regular file"), "symlink": (_symlink, "symbolic link"), "huge": (_huge, "byte limit"),
            "another_key": (_another_keys_entry, "another key"), "wrong_shape": (_wrong_shape, "not of type INT32"),
            "bad_lengths": (_lengths_off_by_one, "do not match their offsets"), "not_utf8": (_not_utf8, "not UTF-8")}


@pytest.mark.parametrize("spoil", list(SPOILERS), ids=list(SPOILERS))
def test_a_spoiled_entry_is_ignored_and_rebuilt(spoil, gemma4, gemma4_reference, tmp_path, monkeypatch):
    src, target = gemma4
    cache_dir = tmp_path / "cache"
    assert _convert(src, target, tmp_path / "cold.gguf", cache_dir) == ("miss", gemma4_reference)
    (entry,) = _entries(cache_dir)
    how, reason = SPOILERS[spoil]
    how(entry)
    cache = TokenizerCache(cache_dir)
    assert _convert(src, target, tmp_path / "again.gguf", cache) == ("miss", gemma4_reference)
    assert len(cache.ignored) == 1 and reason in cache.ignored[0], cache.ignored
    assert entry.is_file() and not entry.is_symlink()  # rebuilt in place: a regular file again
    if spoil == "symlink":
        assert (tmp_path / "elsewhere.tokcache").is_file()  # the link was replaced, never written through
    _no_slow_path(monkeypatch)
    assert _convert(src, target, tmp_path / "warm.gguf", cache_dir) == ("hit", gemma4_reference)


def test_other_tokenizer_files_are_another_entry(gemma4, gemma4_reference, tmp_path):
    """One byte of tokenizer.json changed: a new key, built afresh, never the old entry's keys."""
    src, target = gemma4
    cache_dir = tmp_path / "cache"
    assert _convert(src, target, tmp_path / "a.gguf", cache_dir) == ("miss", gemma4_reference)
    changed = shutil.copytree(target, tmp_path / "changed")
    text = (changed / "tokenizer.json").read_bytes()
    at = text.index(b'"<0x41>"')  # a byte token, renamed by one byte: still valid, now a NORMAL token
    (changed / "tokenizer.json").write_bytes(text[:at + 4] + b"Z" + text[at + 5:])
    state, changed_bytes = _convert(src, changed, tmp_path / "b.gguf", cache_dir)
    assert state == "miss" and changed_bytes != gemma4_reference and len(_entries(cache_dir)) == 2
    assert _convert(src, changed, tmp_path / "c.gguf", False)[1] == changed_bytes


def test_an_unwritable_cache_costs_the_speed_not_the_conversion(gemma4, gemma4_reference, tmp_path):
    """The cache path is a regular file, or under one (root ignores a read-only mode, so not that)."""
    src, target = gemma4
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    for i, where in enumerate((blocker, blocker / "tokenizer")):
        cache = TokenizerCache(where)
        assert _convert(src, target, tmp_path / f"o{i}.gguf", cache) == ("miss-unstored", gemma4_reference)
        assert cache.ignored == []  # no cache directory is no entry, not a corrupt one
    assert blocker.read_text() == "not a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "o0.gguf", "o1.gguf"]


def _cli(*args, env: dict[str, str]) -> subprocess.CompletedProcess:
    return cli_server.run(*args, env=dict(os.environ, **env), timeout=300)


def test_the_command_line_caches_and_no_cache_neither_reads_nor_writes(gemma4, gemma4_reference, tmp_path):
    src, target = gemma4
    env = {"DFLASH_CONVERT_CACHE": str(tmp_path / "root")}
    cache_dir = tmp_path / "root" / "tokenizer"
    base = ("convert", src, "--target-model-dir", target, "--outtype", "bf16", "-q")
    r = _cli(*base, "-o", tmp_path / "n.gguf", "--no-cache", env=env)
    assert r.returncode == 0 and not (tmp_path / "root").exists()  # nothing written
    r = _cli(*base, "-o", tmp_path / "cold.gguf", env=env)
    assert r.returncode == 0 and len(_entries(cache_dir)) == 1
    # a whole, valid entry that lies (one token renamed): the cache is trusted to be intact, not truthful,
    # so the command uses it; --no-cache must not even read it
    (entry,) = _entries(cache_dir)
    cache_key = entry.name.removesuffix(ENTRY_SUFFIX)
    md = decode_entry(entry.read_bytes(), cache_key)
    tokens = md.get(TOKENS).texts()  # type: ignore[union-attr]
    tokens[100] = "<lie>"
    md.set_raw(TOKENS, md.kv(TOKENS).vtype, tokens, md.kv(TOKENS).sub)  # type: ignore[union-attr]
    entry.write_bytes(encode_entry(cache_key, md))  # type: ignore[arg-type]
    lie = entry.read_bytes()
    r = _cli(*base, "-o", tmp_path / "warm.gguf", env=env)
    assert r.returncode == 0 and b"<lie>" in (tmp_path / "warm.gguf").read_bytes()
    r = _cli(*base, "-o", tmp_path / "no-cache.gguf", "--no-cache", env=env)
    assert r.returncode == 0 and entry.read_bytes() == lie
    for name in ("n.gguf", "cold.gguf", "no-cache.gguf"):
        assert (tmp_path / name).read_bytes() == gemma4_reference, name


def test_a_corrupt_entry_is_one_warning_line(gemma4, gemma4_reference, tmp_path):
    src, target = gemma4
    env = {"DFLASH_CONVERT_CACHE": str(tmp_path / "root")}
    assert _convert(src, target, tmp_path / "cold.gguf", tmp_path / "root" / "tokenizer")[0] == "miss"
    (entry,) = _entries(tmp_path / "root" / "tokenizer")
    _flip_a_byte(entry)
    r = _cli("convert", src, "--target-model-dir", target, "--outtype", "bf16", "-o", tmp_path / "o.gguf", env=env)
    warnings = [ln for ln in r.stderr.splitlines() if "tokenizer cache" in ln]
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert len(warnings) == 1 and warnings[0].startswith("dflash-convert: warning: ") and entry.name in warnings[0]
    assert "SHA-256 does not match" in warnings[0] and (tmp_path / "o.gguf").read_bytes() == gemma4_reference


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CONVERT_CACHE", str(tmp_path / "root"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == tmp_path / "root" / "tokenizer"
    monkeypatch.delenv("DFLASH_CONVERT_CACHE")
    assert default_directory() == tmp_path / "xdg" / "dflash-convert" / "tokenizer"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # the XDG spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_directory() == tmp_path / "home" / ".cache" / "dflash-convert" / "tokenizer"


def test_the_oldest_entries_beyond_the_limit_are_removed(gemma4, tmp_path, monkeypatch):
    from dflash_convert.tokenizer import cache as cache_module

    src, target = gemma4
    monkeypatch.setattr(cache_module, "MAX_ENTRIES", 3)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    old = [cache_dir / f"{i:064x}{ENTRY_SUFFIX}" for i in range(4)]
    for age, path in enumerate(old):
        path.write_bytes(b"an older entry\n")
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    assert _convert(src, target, tmp_path / "o.gguf", cache_dir)[0] == "miss"
    kept = _entries(cache_dir)
    assert len(kept) == 3 and old[3] in kept and old[2] in kept and not old[0].exists() and not old[1].exists()


def test_files_rewritten_while_read_are_not_stored(gemma4, tmp_path, monkeypatch):
    """The key is made again after the build: an entry is stored only for the files the keys came from."""
    src, target = gemma4
    changing = shutil.copytree(target, tmp_path / "changing")
    build = borrow._build

    def build_then_rewrite(md, target_dir, *args):
        n = build(md, target_dir, *args)
        (target_dir / "chat_template.jinja").write_text((target_dir / "chat_template.jinja").read_text() + "\n")
        return n

    monkeypatch.setattr(borrow, "_build", build_then_rewrite)
    cache = TokenizerCache(tmp_path / "cache")
    assert _convert(src, changing, tmp_path / "o.gguf", cache)[0] == "uncacheable"
    assert _entries(tmp_path / "cache") == []
