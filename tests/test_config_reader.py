"""The typed config reader (sources/config.py) and its table (format/config_keys.py), unit by unit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_convert.errors import ConfigError
from dflash_convert.format.config_keys import BOOL, CONFIG_KEYS, FLOAT, INT, LIST_ENTRY, LIST_INT, OBJECT, STRING, TYPE_NAMES
from dflash_convert.sources.config import ConfigView, describe, is_type, json_type

WHERE = Path("/models/draft/config.json")


def view(**cfg) -> ConfigView:
    return ConfigView(json.loads(json.dumps(cfg)), WHERE)  # through JSON, as a file would give it


def test_table_names_only_known_types():
    known = set(TYPE_NAMES)
    for name, want in CONFIG_KEYS.items():
        for w in want if isinstance(want, tuple) else (want,):
            assert w in known, (name, w)
    assert set(LIST_ENTRY) <= known


@pytest.mark.parametrize("value,want,ok", [
    (True, INT, False), (False, INT, False), (1, INT, True), (1.0, INT, False),
    (1, FLOAT, True), (1.5, FLOAT, True), (True, FLOAT, False), ("1.5", FLOAT, False),
    (True, BOOL, True), (0, BOOL, False), ("false", BOOL, False),
    ("x", STRING, True), ({}, OBJECT, True), ([], OBJECT, False),
    ([1, 2], LIST_INT, True), ([], LIST_INT, True), ([1, True], LIST_INT, False), ([1, 2.0], LIST_INT, False),
    ([1, None], LIST_INT, False),
])
def test_json_types(value, want, ok):
    assert is_type(value, want) is ok


def test_json_type_names_bool_before_int():
    assert json_type(True) == BOOL and json_type(1) == INT and json_type(1.0) == FLOAT


def test_get_checks_the_table_type_and_names_file_key_found_expected():
    with pytest.raises(ConfigError) as e:
        view(use_sliding_window="false").get("use_sliding_window")
    assert str(e.value) == f'{WHERE}: use_sliding_window is a string ("false"), expected a bool (true/false)'
    with pytest.raises(ConfigError, match=r"block_size is a bool \(true\), expected an integer"):
        view(block_size=True).get("block_size")
    assert view(rope_theta=1000000).get("rope_theta") == 1000000  # an int is a number


def test_null_is_absent():
    cv = view(head_dim=None, use_swa=None)
    assert cv.get("head_dim") is None and cv.get("head_dim", 7) == 7 and not cv.has("head_dim")
    assert cv.flag("use_swa") is False and cv.flag("use_swa", True) is True


def test_flag_never_reads_truthiness():
    assert view(use_swa=True).flag("use_swa") is True
    for v in ("false", "true", 1, 0, [], {}):
        with pytest.raises(ConfigError, match="expected a bool"):
            view(use_swa=v).flag("use_swa")


def test_sub_scopes_messages_and_first_checks_every_spelling_it_meets():
    cv = view(dflash_config={"block_size": "16"}, n_layers="2", num_hidden_layers=None)
    with pytest.raises(ConfigError, match=r"dflash_config\.block_size is a string"):
        cv.sub("dflash_config").get("block_size")
    assert cv.sub("rope_parameters").cfg == {}  # absent: an empty view
    with pytest.raises(ConfigError, match="n_layers is a string"):
        cv.first(("num_hidden_layers", "n_layers"))
    with pytest.raises(ConfigError, match="dflash_config is a list"):
        view(dflash_config=[1]).sub("dflash_config")


def test_a_key_outside_the_table_is_our_bug():
    with pytest.raises(AssertionError, match="not in format/config_keys.py"):
        view(foo=1).get("foo")


def test_int_and_float_ranges():
    cv = view(block_size=2**32, rope_theta=1e39)
    with pytest.raises(ConfigError, match="block_size 4294967296 does not fit: it is written as UINT32"):
        cv.int_("block_size")
    with pytest.raises(ConfigError, match="finite"):
        cv.float_("rope_theta")
    with pytest.raises(ConfigError, match=r"dflash_config.mask_token_id is a bool \(true\), expected an integer"):
        cv.int_("dflash_config.mask_token_id", True)
    assert cv.int_("head_dim", required=False) is None and cv.int_("x", None, required=False) is None


def test_describe_is_short():
    assert describe("x" * 100).endswith('...)') and len(describe("x" * 100)) < 60
    assert describe([1, "a"]).startswith("a list of mixed types")
