"""A prompts file (capture's input, sources/prompts.py): lines end at "\\n" only, JSONL is decided per file.

A U+2028, form feed or record separator inside a prompt stays in it (``str.splitlines`` once split
there and turned a JSONL file into plain text); "\\r\\n" endings are tolerated; in a JSONL file a line
that does not parse is one error naming the file and the line.
"""

from __future__ import annotations

import json

import pytest

from dflash_convert.errors import InputFileError
from dflash_convert.sources.prompts import read_prompts


def test_lines_end_at_newline_only(tmp_path):
    p = tmp_path / "prompts"
    p.write_bytes("one\u2028still one\r\ntwo\x0cstill two\n\nthree\x1estill three\x1c\x85\n".encode())
    assert read_prompts(p) == ["one\u2028still one", "two\x0cstill two", "three\x1estill three\x1c\x85"]


def test_jsonl_with_a_raw_line_separator_inside_a_string(tmp_path):
    p = tmp_path / "prompts"
    p.write_bytes(('{"prompt": "first\u2028half"}\r\n' + json.dumps("second", ensure_ascii=False) + "\n").encode())
    assert read_prompts(p) == ["first\u2028half", "second"]


@pytest.mark.parametrize("name,text,line", [
    ("prompts.jsonl", '{"prompt": "a"}\nnot json\n', 2),  # JSONL by its name
    ("prompts", '"a"\n\n{"prompt": "b"\n', 3),  # JSONL by its first line
    ("prompts", '{"prompt": "a"}\n{"text": 5}\n', 2),  # parses, but holds no prompt string
])
def test_a_bad_line_in_a_jsonl_file_names_the_line(tmp_path, name, text, line):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(InputFileError, match=f"line {line}") as e:
        read_prompts(p)
    assert e.value.path == str(p)


def test_a_text_file_keeps_lines_that_look_like_json(tmp_path):
    p = tmp_path / "prompts.txt"
    p.write_text('{"prompt": "a"}\n"quoted"\nplain\n')
    assert read_prompts(p) == ['{"prompt": "a"}', '"quoted"', "plain"]
    q = tmp_path / "prompts"
    q.write_text('plain first\n{"prompt": "a"}\n')
    assert read_prompts(q) == ["plain first", '{"prompt": "a"}']
