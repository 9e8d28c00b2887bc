"""The command-line parser (cli/command_line.py) in-process: every form a user types, every usage error in
its own words, and the help page the CI recipe check reads options from."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

from dflash_convert.cli import COMMANDS
from dflash_convert.cli.command_line import (
    Command,
    HelpRequested,
    UsageError,
    argument,
    find_command,
    flag,
    int_list,
    multi,
    option,
    parse,
    render_help,
    render_program_help,
)

DEMO = Command("demo", lambda **kw: 0, "A demo.\n\nSecond paragraph.", (
    argument("src", "Input.", metavar="SRC"),
    argument("out", "Output.", type=str, metavar="OUT"),
    option("outtype", "--outtype", default="auto", help="Type."),
    option("outfile", "-o", "--outfile", metavar="PATH", help="Where."),
    option("threads", "--threads", type=int, minimum=1, help="Threads."),
    option("ratio", "--ratio", type=float, help="Ratio."),
    option("features", "--features", type=Path, required=True, help="Features."),
    flag("quiet", "-q", "--quiet", help="Quiet."),
    multi("tensor_type", "--tensor-type", metavar="PATTERN=TYPE", help="Repeatable."),
))


def test_every_form_of_a_value():
    got = parse(DEMO, ["a", "--outtype=q8_0", "-ox.gguf", "--threads", "3", "--ratio=-0.5", "b", "--features", "f",
                       "--tensor-type", "a=Q8_0", "-q", "--tensor-type=b=Q4_0"])
    assert got == {"src": Path("a"), "out": "b", "outtype": "q8_0", "outfile": "x.gguf", "threads": 3, "ratio": -0.5,
                   "features": Path("f"), "quiet": True, "tensor_type": ["a=Q8_0", "b=Q4_0"]}
    defaults = parse(DEMO, ["a", "b", "--features", "f"])
    assert defaults["outtype"] == "auto" and defaults["threads"] is None and defaults["quiet"] is False
    assert defaults["tensor_type"] == []
    # a value that looks like an option is still the value; after -- everything is positional
    assert parse(DEMO, ["--outfile", "--weird", "--features", "f", "--", "-a", "-b"])["src"] == Path("-a")


@pytest.mark.parametrize("args,message", [
    (["a"], "Missing argument 'OUT'."),
    (["a", "b"], "Missing option '--features'."),
    (["a", "b", "--features", "f", "--nope"], "No such option: --nope"),
    (["a", "b", "--features"], "Option '--features' requires an argument."),
    (["a", "b", "--features", "f", "--threads", "x"], "Invalid value for '--threads': 'x' is not a valid integer."),
    (["a", "b", "--features", "f", "--threads", "0"], "Invalid value for '--threads': 0 is not in the range x>=1."),
    (["a", "b", "--features", "f", "--ratio", "r"], "Invalid value for '--ratio': 'r' is not a valid float."),
    (["a", "b", "c", "d", "--features", "f"], "Got unexpected extra arguments (c d)"),
    (["a", "b", "--features", "f", "--quiet=yes"], "Option '--quiet' does not take a value."),
])
def test_usage_errors_in_their_own_words(args, message):
    with pytest.raises(UsageError) as e:
        parse(DEMO, args)
    assert str(e.value) == message and e.value.command == "demo"


def test_help_anywhere_wins_and_names_the_command():
    for args in (["-h"], ["a", "--help"], ["a", "b", "--features", "f", "-h"]):
        with pytest.raises(HelpRequested) as e:
            parse(DEMO, args)
        assert e.value.command == "demo"


def test_variadic_argument_takes_the_rest():
    cmd = Command("many", lambda **kw: 0, "Many.", (argument("drafts", "Files.", variadic=True, metavar="DRAFT"),
                                                     option("n", "--n", type=int, help="N.")))
    assert parse(cmd, ["a", "--n", "2", "b", "c"]) == {"drafts": [Path("a"), Path("b"), Path("c")], "n": 2}
    with pytest.raises(UsageError, match="Missing argument 'DRAFT'"):
        parse(cmd, ["--n", "2"])


def test_help_pages_declare_every_option_as_the_recipe_check_reads_them():
    from test_ci_recipe import declared_options

    page = render_help("dflash-convert", DEMO)
    assert page.startswith("Usage: dflash-convert demo [OPTIONS] SRC OUT\n\n  A demo.\n\n  Second paragraph.\n")
    assert declared_options(page) == {"--outtype", "-o", "--outfile", "--threads", "--ratio", "--features", "-q", "--quiet",
                                      "--tensor-type", "-h", "--help"}
    assert "[default: auto]" in page and "[x>=1]" in page and "[required]" in page
    for command in COMMANDS:  # the real commands: every flag of theirs is declared on their page
        flags = {f for p in command.params for f in p.flags} | {"-h", "--help"}
        assert declared_options(render_help("dflash-convert", command)) == flags, command.name
    program = render_program_help("dflash-convert", "Summary.", COMMANDS)
    assert all(f"  {c.name}  " in program for c in COMMANDS)


# --- what the parser refuses itself: a wrong command line is exit 64, one line, before anything is read ---

RANGED = Command("ranged", lambda **kw: 0, "Ranged.", (
    option("share", "--share", type=float, minimum=0, min_open=True, maximum=1, help="A share."),
    option("ratio", "--ratio", type=float, help="Any finite number."),
    option("mode", "--mode", default="cpu", choices=("cpu", "exact"), help="Mode."),
    option("offset", "--offset", type=int, minimum=0, maximum=1, help="0 or 1."),
    option("layers", "--layers", type=int_list, help="Layers."),
    option("features", "--features", help="Features.", needs=("share",)),
    option("target", "--target", help="Target.", unless=("gguf",)),
    option("gguf", "--gguf", help="GGUF."),
    flag("pure", "--pure", help="Pure."),
))


@pytest.mark.parametrize("args,message", [
    (["--share", "0"], "Invalid value for '--share': 0.0 is not in the range 0<x<=1."),
    (["--share", "1.5"], "Invalid value for '--share': 1.5 is not in the range 0<x<=1."),
    (["--share", "nan"], "Invalid value for '--share': nan is not in the range 0<x<=1."),
    (["--share", "-1"], "Invalid value for '--share': -1.0 is not in the range 0<x<=1."),
    (["--share", "inf"], "Invalid value for '--share': inf is not in the range 0<x<=1."),
    (["--ratio", "nan"], "Invalid value for '--ratio': nan is not a finite number."),
    (["--ratio", "-inf"], "Invalid value for '--ratio': -inf is not a finite number."),
    (["--mode", "fast"], "Invalid value for '--mode': 'fast' is not one of 'cpu', 'exact'."),
    (["--offset", "2"], "Invalid value for '--offset': 2 is not in the range 0<=x<=1."),
    (["--layers", "1,x"], "Invalid value for '--layers': '1,x' is not a valid comma-separated list of integers."),
    (["--features", "f"], "--features needs --share"),
    ([], "Missing option '--target' (or '--gguf')."),
])
def test_values_out_of_range_and_missing_options_are_usage_errors(args, message):
    with pytest.raises(UsageError) as e:
        parse(RANGED, ["--target", "t", *args] if args else args)
    assert str(e.value) == message and e.value.command == "ranged"


def test_values_inside_the_range_pass():
    got = parse(RANGED, ["--gguf", "g", "--share", "1", "--offset", "0", "--layers", "3,1", "--mode", "exact",
                         "--features", "f", "--ratio", "-2.5"])
    assert (got["share"], got["offset"], got["layers"], got["mode"], got["ratio"]) == (1.0, 0, [3, 1], "exact", -2.5)
    assert "[0<x<=1]" in render_help("p", RANGED) and "[default: cpu; cpu|exact]" in render_help("p", RANGED)


def test_a_mistyped_option_or_command_gets_the_nearest_names():
    with pytest.raises(UsageError) as e:
        parse(DEMO, ["a", "b", "--featurs", "f"])
    assert str(e.value) == "No such option: --featurs Did you mean --features?"
    with pytest.raises(UsageError) as e:
        parse(DEMO, ["a", "b", "--features", "f", "--outfle", "x"])
    assert str(e.value) == "No such option: --outfle (Possible options: --outfile, --outtype)"
    with pytest.raises(UsageError) as e:
        find_command(COMMANDS, "convrt")
    assert str(e.value) == "No such command 'convrt'. Did you mean 'convert'?"
    with pytest.raises(UsageError) as e:
        find_command(COMMANDS, "frobnicate")
    assert str(e.value) == "No such command 'frobnicate'."
    assert find_command(COMMANDS, "inspect").name == "inspect"


def test_tensor_type_items_reach_quantize_in_command_line_order():
    quantize = find_command(COMMANDS, "quantize")
    got = parse(quantize, ["s", "o", "Q4_K_M", "--tensor-type", "a=q8_0", "--tensor-type-file", "t.txt",
                           "--tensor-type", "b=q4_0"])
    assert got["tensor_type_order"] == [("tensor_types", "a=q8_0"), ("tensor_type_file", Path("t.txt")),
                                        ("tensor_types", "b=q4_0")]
    assert got["tensor_types"] == ["a=q8_0", "b=q4_0"] and got["tensor_type_file"] == Path("t.txt")
    assert parse(quantize, ["s", "o", "Q4_K_M"])["tensor_type_order"] == []


def test_quantize_min_acceptance_options_travel_together():
    quantize = find_command(COMMANDS, "quantize")
    got = parse(quantize, ["s", "o", "Q4_K_M", "--features", "f", "--min-acceptance", "0.98", "--device", "cpu"])
    assert got["min_acceptance"] == 0.98 and got["search"] == {"target_model_dir": None, "target_gguf": None, "device": "cpu",
                                                               "allow_other_target": False, "max_steps": None}
    got = parse(quantize, ["s", "o", "Q4_K_M", "--features", "f", "--min-acceptance", "0.98", "--allow-other-target",
                           "--max-steps", "2"])
    assert got["search"]["allow_other_target"] is True and got["search"]["max_steps"] == 2


def _usage_line(r, command: str) -> str:
    lines = r.stderr.splitlines()
    assert r.returncode == 64 and len(lines) == 1 and r.stdout == "", (r.returncode, r.stderr)
    assert lines[0].startswith("dflash-convert: error: ") and lines[0].endswith(f"(see '{' '.join(['dflash-convert', command]).strip()} -h')")
    return lines[0]


@pytest.mark.parametrize("value", ["0", "1.5", "nan", "-1", "inf"])
def test_min_acceptance_out_of_range_is_a_usage_error(tmp_path, value):
    r = run_cli("quantize", tmp_path / "in.gguf", tmp_path / "o.gguf", "Q4_K_M", "--features", tmp_path / "f",
                "--min-acceptance", value)
    assert "Invalid value for '--min-acceptance'" in _usage_line(r, "quantize") and "0<x<=1" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,says", [
    (["--min-acceptance", "0.9"], "--min-acceptance and --features go together (each needs the other)"),
    (["--features", "f.safetensors"], "--features and --min-acceptance go together (each needs the other)"),
    (["--features", "f", "--min-acceptance", "0.9", "--tensor-type", "attn=q8_0"],
     "--min-acceptance does not go with --tensor-type (it chooses the per-tensor types itself)"),
    (["--max-steps", "2"], "--max-steps needs --min-acceptance"),
    (["--features", "f", "--min-acceptance", "0.9", "--max-steps", "0"], "'--max-steps': 0 is not in the range x>=1"),
])
def test_min_acceptance_without_features_or_with_per_tensor_flags_is_a_usage_error(tmp_path, args, says):
    r = run_cli("quantize", tmp_path / "in.gguf", tmp_path / "o.gguf", "Q4_K_M", *args)
    assert says in _usage_line(r, "quantize")


@pytest.mark.parametrize("args,says", [
    (["convrt"], "No such command 'convrt'. Did you mean 'convert'?"),
    (["validate", "x.gguf", "--targt", "t"], "No such option: --targt Did you mean --target?"),
    (["quantize", "in.gguf", "o.gguf", "Q9_9"], "Invalid value for 'TYPE': 'Q9_9' is not a quantization type"),
    (["quantize", "in.gguf", "o.gguf", "Q4_0", "--prune-layers", "x"], "'x' is not a comma-separated list of layer numbers"),
    (["convert", "ckpt", "--target-model-dir", "t", "--outtype", "q9"], "'q9' is not an output type"),
    (["convert", "ckpt"], "Missing option '--target-model-dir' (or '--target-gguf')."),
    (["migrate", "in.gguf", "o.gguf", "--target-layers", "a,b"], "is not a valid comma-separated list of integers"),
    (["migrate", "in.gguf", "o.gguf", "--target-layers-offset", "2"], "2 is not in the range 0<=x<=1."),
    (["migrate", "in.gguf", "o.gguf", "--mask-token-id", "-1"], "-1 is not in the range 0<=x<=4294967295."),
    (["sweep", "in.gguf", "--features", "f", "--numerics", "fast"], "'fast' is not one of 'cpu', 'exact'."),
    (["sweep", "in.gguf", "--features", "f", "--types", "Q8_0,Q9"], "'Q9' is not a quantization type"),
    (["accept", "in.gguf", "--features", "f", "--numerics", "fast"], "'fast' is not one of 'cpu', 'exact'."),
    (["capture", "--target-model-dir", "t", "--prompts", "p", "-o", "o", "--dtype", "f64"], "'f64' is not one of"),
    (["capture", "--target-model-dir", "t", "--prompts", "p", "-o", "o", "--layers", "x"], "'x' is neither all nor"),
    (["sweep", "in.gguf", "--features", "f", "--types", "F32"], "'F32' is not a quantization type"),
    (["publish", "ckpt", "--target-model-dir", "t", "-o", "rel", "--types", "Q9"], "'Q9' is not a quantization type"),
    (["publish", "ckpt", "--target-model-dir", "t", "-o", "rel", "--types", "Q4_K,q4_k_m"], "names Q4_K_M twice"),
    (["publish", "ckpt", "--target-model-dir", "t", "-o", "rel", "--types", ","], "',' names no type"),
])
def test_every_wrong_value_is_one_usage_line_exit_64(tmp_path, args, says):
    r = run_cli(*args)
    assert says in _usage_line(r, "" if args[0] == "convrt" else args[0])


def test_upload_timeout_is_a_positive_number_that_needs_upload():
    publish = find_command(COMMANDS, "publish")
    base = ["SRC", "--target-model-dir", "T", "-o", "R"]
    assert parse(publish, [*base, "--upload", "me/x", "--upload-timeout", "2.5"])["upload_timeout"] == 2.5
    assert parse(publish, base)["upload_timeout"] == 120.0
    for bad in (["--upload", "me/x", "--upload-timeout", "0"], ["--upload", "me/x", "--upload-timeout", "nan"],
                ["--upload-timeout", "5"]):
        with pytest.raises(UsageError):
            parse(publish, [*base, *bad])
