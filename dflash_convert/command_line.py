"""A small command-line parser: commands and their parameters as data, parsed into keyword arguments.

The command layer (cli.py) declares each command as a ``Command`` (its function, summary and
``Param`` list); ``parse`` turns argv into the function's keyword arguments or raises ``UsageError``
with the one line the user sees; ``render_help`` writes the help page. Standard library only, and
nothing is imported or built for the commands that are not run: the parser typer provided (with
click and pydantic behind it) cost about a third of a second on every start, more than most
commands' own work on a small file.

What is accepted is what users of click-style tools expect: ``--name value``, ``--name=value``,
``-o value`` and ``-ovalue``, flags, repeatable options, ``--`` to end the options, ``-h``/``--help``
anywhere, and messages in click's words ("No such option: --x", "Missing argument 'OUT'.").
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARGUMENT, VALUE, FLAG, MULTI = "argument", "value", "flag", "multi"  # Param.kind


class UsageError(Exception):
    """The command line is wrong; the message is the user's line, without the program's prefix."""

    def __init__(self, message: str, command: str | None = None) -> None:
        super().__init__(message)
        self.command = command  # the command whose help explains it (None: the program's)


class HelpRequested(Exception):  # noqa: N818 - a signal to print help, not an error
    """-h or --help: print this command's help (None: the program's) and exit 0."""

    def __init__(self, command: str | None) -> None:
        super().__init__(command)
        self.command = command


@dataclass(frozen=True)
class Param:
    """One parameter: a positional ``ARGUMENT`` (``flags`` empty), an option taking a ``VALUE``, a
    ``FLAG`` (True when given), or a ``MULTI`` option that may repeat (a list, in order)."""

    dest: str
    kind: str
    flags: tuple[str, ...] = ()
    help: str = ""
    type: Callable[[str], Any] = str
    default: Any = None
    required: bool = False
    metavar: str | None = None
    minimum: int | None = None
    variadic: bool = False  # an ARGUMENT taking every remaining positional value (one at least)

    @property
    def label(self) -> str:
        """How errors and help name it: '--threads', 'OUT'."""
        if self.flags:
            return max(self.flags, key=len)
        return self.metavar or self.dest.upper()

    def shown_metavar(self) -> str:
        if self.metavar is not None:
            return self.metavar
        return {int: "INTEGER", float: "FLOAT", Path: "PATH"}.get(self.type, "TEXT")


def argument(dest: str, help: str, *, type: Callable[[str], Any] = Path, metavar: str | None = None,
             variadic: bool = False) -> Param:
    return Param(dest, ARGUMENT, help=help, type=type, required=True, metavar=metavar, variadic=variadic)


def option(dest: str, *flags: str, help: str, type: Callable[[str], Any] = str, default: Any = None,
           required: bool = False, metavar: str | None = None, minimum: int | None = None) -> Param:
    return Param(dest, VALUE, flags, help, type, default, required, metavar, minimum)


def flag(dest: str, *flags: str, help: str) -> Param:
    return Param(dest, FLAG, flags, help, bool, False)


def multi(dest: str, *flags: str, help: str, metavar: str | None = None) -> Param:
    return Param(dest, MULTI, flags, help, str, (), metavar=metavar)


@dataclass(frozen=True)
class Command:
    name: str
    run: Callable[..., int | None]
    doc: str  # first paragraph: the one-line summary of the program's help
    params: tuple[Param, ...] = field(default_factory=tuple)

    @property
    def summary(self) -> str:
        return " ".join(self.doc.split("\n\n", 1)[0].split())


_TYPE_WORDS = {int: "integer", float: "float"}


def _convert(p: Param, text: str, command: str) -> Any:
    try:
        value = p.type(text)
    except (TypeError, ValueError):
        word = _TYPE_WORDS.get(p.type, "value")
        raise UsageError(f"Invalid value for '{p.label}': {text!r} is not a valid {word}.", command) from None
    if p.minimum is not None and value < p.minimum:
        raise UsageError(f"Invalid value for '{p.label}': {value} is not in the range x>={p.minimum}.", command)
    return value


def parse(command: Command, args: Sequence[str]) -> dict[str, Any]:
    """``args`` (after the command's name) -> the keyword arguments of ``command.run``."""
    name = command.name
    by_flag = {f: p for p in command.params for f in p.flags}
    positionals = [p for p in command.params if p.kind == ARGUMENT]
    values: dict[str, Any] = {p.dest: (list(p.default) if p.kind == MULTI else p.default) for p in command.params}
    given: set[str] = set()
    loose: list[str] = []
    i, options_end = 0, False
    while i < len(args):
        word = args[i]
        i += 1
        if options_end or word == "-" or not word.startswith("-"):
            loose.append(word)
            continue
        if word == "--":
            options_end = True
            continue
        if word in ("-h", "--help"):
            raise HelpRequested(name)
        inline: str | None = None
        if word.startswith("--") and "=" in word:
            word, inline = word.split("=", 1)
        elif not word.startswith("--") and len(word) > 2 and word[:2] in by_flag:
            word, inline = word[:2], word[2:]
        p = by_flag.get(word)
        if p is None:
            raise UsageError(f"No such option: {word}", name)
        if p.kind == FLAG:
            if inline is not None:
                raise UsageError(f"Option '{word}' does not take a value.", name)
            values[p.dest] = True
            continue
        if inline is None:
            if i >= len(args):
                raise UsageError(f"Option '{word}' requires an argument.", name)
            inline = args[i]
            i += 1
        value = _convert(p, inline, name)
        if p.kind == MULTI:
            values[p.dest].append(value)
        else:
            values[p.dest] = value
        given.add(p.dest)
    for p in positionals:
        if not loose:
            raise UsageError(f"Missing argument '{p.label}'.", name)
        if p.variadic:
            values[p.dest] = [_convert(p, w, name) for w in loose]
            loose = []
        else:
            values[p.dest] = _convert(p, loose.pop(0), name)
    if loose:
        raise UsageError(f"Got unexpected extra argument{'s' if len(loose) > 1 else ''} ({' '.join(loose)})", name)
    for p in command.params:
        if p.required and p.kind != ARGUMENT and p.dest not in given:
            raise UsageError(f"Missing option '{p.label}'.", name)
    return values


def _width() -> int:
    return max(40, min(100, shutil.get_terminal_size((80, 24)).columns) - 2)


def _rows(pairs: list[tuple[str, str]], width: int) -> list[str]:
    """Two columns, click's layout: the name, two spaces, the text wrapped beside it."""
    if not pairs:
        return []
    left = min(max(len(a) for a, _ in pairs), 30)
    out = []
    for a, text in pairs:
        wrapped = textwrap.wrap(text, max(20, width - left - 4)) or [""]
        if len(a) > left:
            out.append(f"  {a}")
            out += [f"  {'':<{left}}  {w}" for w in wrapped]
        else:
            out.append(f"  {a:<{left}}  {wrapped[0]}")
            out += [f"  {'':<{left}}  {w}" for w in wrapped[1:]]
    return out


def _paragraphs(doc: str, width: int) -> list[str]:
    out: list[str] = []
    for para in doc.strip().split("\n\n"):
        out += ["", *("  " + w for w in textwrap.wrap(" ".join(para.split()), width - 2))]
    return out


def render_help(prog: str, command: Command) -> str:
    """The help page of one command: usage, description, arguments, options."""
    width = _width()
    args = [p for p in command.params if p.kind == ARGUMENT]
    usage = " ".join([f"Usage: {prog} {command.name} [OPTIONS]", *(p.label + ("..." if p.variadic else "") for p in args)])
    lines = [usage, *_paragraphs(command.doc, width)]
    if args:
        lines += ["", "Arguments:", *_rows([(p.label, p.help + "  [required]") for p in args], width)]
    rows = []
    for p in command.params:
        if p.kind == ARGUMENT:
            continue
        name = ", ".join(sorted(p.flags, key=len)) + ("" if p.kind == FLAG else f" {p.shown_metavar()}")
        extra = []
        if p.kind == VALUE and p.default not in (None, "", ()) and not p.required:
            extra.append(f"default: {p.default}")
        if p.minimum is not None:
            extra.append(f"x>={p.minimum}")
        if p.required:
            extra.append("required")
        rows.append((name, p.help + (f"  [{'; '.join(extra)}]" if extra else "")))
    rows.append(("-h, --help", "Show this message and exit."))
    lines += ["", "Options:", *_rows(rows, width)]
    return "\n".join(lines) + "\n"


def render_program_help(prog: str, summary: str, commands: Sequence[Command]) -> str:
    width = _width()
    lines = [f"Usage: {prog} [OPTIONS] COMMAND [ARGS]...", *_paragraphs(summary, width), "", "Options:",
             *_rows([("--version", "Print the version and exit."), ("-h, --help", "Show this message and exit.")], width),
             "", "Commands:", *_rows([(c.name, c.summary) for c in commands], width)]
    return "\n".join(lines) + "\n"


__all__ = ["ARGUMENT", "FLAG", "MULTI", "VALUE", "Command", "HelpRequested", "Param", "UsageError", "argument", "flag",
           "multi", "option", "parse", "render_help", "render_program_help"]
