"""The command-line parser (cli/command_line.py) in-process: every form a user types, every usage error in
its own words, and the help page the CI recipe check reads options from."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_convert.cli import COMMANDS
from dflash_convert.cli.command_line import (
    Command,
    HelpRequested,
    UsageError,
    argument,
    flag,
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
