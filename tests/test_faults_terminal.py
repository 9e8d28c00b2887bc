"""Faults of the terminal: no escape sequence from a file or a name reaches it, no key name can forge a
line of a report, and names that are not UTF-8 print escaped, never a crash.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import faults
from faults import TIMEOUT, cli, one_error_line

from dflash_convert.validate import validate

drafter = faults.drafter  # the shared fixture


FORGED = "\n  pass  everything         fine\nresult: PASS (0 fail, 0 warn, 20 pass, 0 skipped)"


HOSTILE_TEXT = "\x1b[2J\x1b]0;owned\x07\x9b31m\x7f\rover\u202eevil\x00"  # ESC/CSI/OSC, BEL, C1 CSI, DEL, CR, RLO, NUL


def _hostile_drafter(path: Path) -> Path:
    """A drafter that fails validate (no mask token id) and quotes hostile text in a key name, a
    string value and a tensor name, one of which tries to forge validate's last line."""
    from drafter_gguf import KV, drafter_parts, drop_keys, full_key, tensor, write_parts

    from dflash_convert.format.keys import ValueType

    keys, tensors = drop_keys(drafter_parts(), full_key("mask_token_id"))
    keys += [KV("dflash.x" + FORGED + HOSTILE_TEXT, ValueType.UINT32, 1),
             KV("general.description", ValueType.STRING, "text" + HOSTILE_TEXT + FORGED)]
    tensors.append(tensor("blk.9." + HOSTILE_TEXT[:12] + ".weight", (32,)))
    return write_parts(path, (keys, tensors))


def _on_a_terminal(*args: object, env: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Run the command with stdout and stderr on a pseudo-terminal (click strips ANSI codes only
    when the output is not a terminal, so a pipe would hide the fault); (exit code, bytes shown)."""
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "dflash_convert.cli", *map(str, args)], stdin=subprocess.DEVNULL,
                         stdout=slave, stderr=slave, env=dict(os.environ, **(env or {})))
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed its side
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return p.wait(timeout=TIMEOUT), out.replace(b"\r\n", b"\n")  # the terminal's own newline translation


def _nothing_raw(shown: bytes) -> None:
    for raw in (b"\x1b", b"\x07", b"\x7f", b"\r", b"\x00", "\x9b".encode(), "\u202e".encode()):
        assert raw not in shown, (raw, shown[:2000])


def test_visible_escapes_every_control_and_keeps_printable_text():
    from dflash_convert.terminal import json_safe, visible

    assert visible("plain ascii, ünïcödé, 中文 / path.gguf") == "plain ascii, ünïcödé, 中文 / path.gguf"
    assert visible("a\nb\rc\td\x1b[31me\x7f\x9b\u202e\U000e0041") == "a\\nb\\rc\\td\\x1b[31me\\x7f\\x9b\\u202e\\U000e0041"
    assert visible(os.fsdecode(b"/tmp/\xff\xfe.gguf")) == "/tmp/\\xff\\xfe.gguf"  # surrogateescape: the bytes
    assert visible(Path("x\ny")) == "x\\ny"
    doc = json.dumps({"k": "a\x7f\x9b\u202e\udcff\U000e0041é\n"}, ensure_ascii=False, indent=2)
    safe = json_safe(doc)
    assert json.loads(safe) == json.loads(doc) and safe.isascii() is False and "é" in safe
    assert all(line.isprintable() for line in safe.split("\n"))
    # warnings quote files too: the command line's log format escapes them the same way
    import logging

    from dflash_convert.cli import _VisibleFormatter

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "tensor %s skipped", ("a\nb\x1b[2K",), None)
    assert _VisibleFormatter("w: %(message)s").format(record) == "w: tensor a\\nb\\x1b[2K skipped"


def test_a_key_name_cannot_forge_a_validate_line(tmp_path):
    path = _hostile_drafter(tmp_path / "forged.gguf")
    r = cli("validate", path)
    assert r.returncode == 1, r.stderr
    results = [ln for ln in r.stdout.splitlines() if ln.startswith("result:")]
    assert results == [r.stdout.splitlines()[-1]] and results[0].startswith("result: FAIL"), r.stdout
    assert not any(ln.lstrip().startswith("pass  everything") for ln in r.stdout.splitlines())
    assert "dflash.x\\n  pass  everything" in r.stdout and "\\nresult: PASS" in r.stdout  # shown, escaped
    # every line is one of ours: the header, a check, a detail, the result
    for ln in r.stdout.splitlines()[1:-1]:
        assert ln.startswith("  ") and ln[2:6].strip() in ("pass", "warn", "fail", "skip", ""), ln
    # --json keeps the exact key name
    doc = json.loads(cli("validate", "--json", path).stdout)
    details = [d for c in doc["checks"] for d in c["details"]]
    assert any(d.startswith("dflash.x" + FORGED + HOSTILE_TEXT) for d in details), details


def test_no_escape_sequence_from_a_file_reaches_the_terminal(tmp_path):
    path = _hostile_drafter(tmp_path / "hostile.gguf")
    code, shown = _on_a_terminal("inspect", path)
    assert code == 0, shown
    _nothing_raw(shown)
    text = shown.decode()
    assert "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\x7f\\rover\\u202eevil\\x00" in text  # the key name, visibly
    assert "blk.9.\\x1b[2J\\x1b]0;ow" in text  # the tensor name
    assert not any(ln.startswith("result:") for ln in text.splitlines())
    code, shown = _on_a_terminal("validate", path)
    assert code == 1
    _nothing_raw(shown)
    assert [ln for ln in shown.decode().splitlines() if ln.startswith("result:")][0].startswith("result: FAIL")
    code, shown = _on_a_terminal("validate", "--json", path)
    assert code == 1
    _nothing_raw(shown)
    doc = json.loads(shown.decode())
    assert any(HOSTILE_TEXT in d for c in doc["checks"] for d in c["details"])  # the real values, exact


def test_error_lines_escape_what_they_quote(tmp_path):
    # a path with a newline and an escape sequence: still one error line, shown escaped
    r = cli("inspect", tmp_path / "a\nresult: PASS\x1b[2K.gguf")
    line = one_error_line(r)
    assert r.returncode == 2 and "a\\nresult: PASS\\x1b[2K.gguf" in line
    # a file whose magic is an escape sequence: the reader's message quotes it, escaped
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\x1b[2J" + b"\0" * 64)
    code, shown = _on_a_terminal("validate", bad)
    assert code == 2
    _nothing_raw(shown)
    assert b"not a GGUF file" in shown
    # an input error quoting a hostile duplicate key
    import struct

    from gguf_bytes import kv_u32

    dup = tmp_path / "dup.gguf"
    k = "dup\n\x1b[2Kkey"
    dup.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv_u32(k, 1) + kv_u32(k, 2))
    code, shown = _on_a_terminal("inspect", dup)
    assert code == 2
    _nothing_raw(shown)
    lines = [ln for ln in shown.decode().splitlines() if ln.strip()]
    assert len(lines) == 1 and "duplicate metadata key" in lines[0] and "dup\\n\\x1b[2Kkey" in lines[0], lines


def test_names_that_are_not_utf8_are_escaped_never_a_crash(tmp_path, drafter, qwen3_target):
    root = os.fsencode(tmp_path)
    src, out = root + b"/d\xff", root + b"/o\xfe.gguf"
    shutil.copytree(drafter, os.fsdecode(src))
    r = cli("convert", os.fsdecode(src), "--target-model-dir", qwen3_target, "-o", os.fsdecode(out))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    from dflash_convert.sources.gguf import read_gguf

    g = read_gguf(os.fsdecode(out))
    # valid UTF-8, the byte written as an escape; title-cased, as upstream names a file after its directory
    assert g.metadata["general.name"].value in ("D\\xff", b"D\\xff")
    assert validate(os.fsdecode(out)).exit_code == 0
    r = cli("validate", os.fsdecode(out), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["file"] == os.fsdecode(out)
    r = cli("inspect", os.fsdecode(root + b"/missing\xfe.gguf"))
    assert r.returncode == 2 and "missing\\xfe.gguf: GGUF file does not exist" in one_error_line(r)


def test_non_utf8_path_names_print_escaped_and_never_crash(tmp_path, drafter, qwen3_target):
    good = _hostile_drafter(tmp_path / "good.gguf")
    folder = os.fsencode(tmp_path)
    name = folder + b"/\xff\xfe\x1b[31m.gguf"
    os.link(good, name)
    strict = {"PYTHONIOENCODING": "utf-8:strict"}  # a UTF-8 terminal: a lone surrogate printed raw would crash
    for args, want in ((["inspect"], 0), (["validate"], 1), (["validate", "--json"], 1)):
        r = subprocess.run([sys.executable, "-m", "dflash_convert.cli", *args, name], capture_output=True, timeout=TIMEOUT,
                           env=dict(os.environ, **strict))
        assert r.returncode == want and b"Traceback" not in r.stderr, r.stderr
        assert b"\x1b" not in r.stdout and b"\xff" not in r.stdout
        if "--json" in args:
            assert os.fsencode(json.loads(r.stdout)["file"]) == name  # the exact bytes, as JSON escapes
        else:
            assert b"\\xff\\xfe\\x1b[31m.gguf" in r.stdout
    r = subprocess.run([sys.executable, "-m", "dflash_convert.cli", "inspect", folder + b"/missing-\xff.gguf"],
                       capture_output=True, timeout=TIMEOUT, env=dict(os.environ, **strict))
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "missing-\\xff.gguf" in lines[0] and "Traceback" not in lines[0]
    out = tmp_path / "o\n\x1b[2K.gguf"
    r = cli("convert", drafter, "--target-model-dir", qwen3_target, "-o", out)
    assert r.returncode == 0 and r.stdout.count("\n") == 1 and "o\\n\\x1b[2K.gguf" in r.stdout, r.stdout
