"""A small command-line parser: commands and their parameters as data, parsed into keyword arguments.

Refused as one ``UsageError`` line, in click's words: an unknown option or command (with the
nearest names), a missing, ill-typed, out-of-range, non-finite or non-choice value, and options
without the ones they need or with ones they exclude. Options sharing ``in_order`` reach the
handler in command-line order.
"""

from __future__ import annotations

import difflib
import math
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
    """One parameter: a positional ``ARGUMENT``, a ``VALUE`` option, a ``FLAG``, or a repeatable ``MULTI`` option."""

    dest: str
    kind: str
    flags: tuple[str, ...] = ()
    help: str = ""
    type: Callable[[str], Any] = str
    default: Any = None
    required: bool = False
    metavar: str | None = None
    minimum: float | None = None
    variadic: bool = False  # an ARGUMENT taking every remaining positional value (one at least)
    maximum: float | None = None
    min_open: bool = False  # the minimum itself is out of range (0<x<=1)
    choices: tuple[str, ...] = ()  # the only values accepted (empty: any value of the type)
    unless: tuple[str, ...] = ()  # required, unless one of these dests is given
    needs: tuple[str, ...] = ()  # dests that must be given with this one
    excludes: tuple[str, ...] = ()  # dests that must not be given with this one
    why: str = ""  # said when ``excludes`` is broken
    in_order: str | None = None  # also append (dest, value) to this list, in command-line order
    group: str | None = None  # the handler gets this value in a dict of that name, beside the group's others

    def range_text(self) -> str | None:
        """The accepted range in click's notation ('x>=1', '0<x<=1'), or None when unbounded."""
        low = None if self.minimum is None else f"{self.minimum}{'<' if self.min_open else '<='}"
        high = None if self.maximum is None else f"<={self.maximum}"
        if low is None and high is None:
            return None
        if high is None:
            return f"x{'>' if self.min_open else '>='}{self.minimum}"
        return f"{low or ''}x{high}"

    def in_range(self, value: Any) -> bool:
        """Inside the bounds (a NaN is inside none)."""
        if self.minimum is not None and not (value > self.minimum if self.min_open else value >= self.minimum):
            return False
        return self.maximum is None or value <= self.maximum

    @property
    def label(self) -> str:
        """How errors and help name it: '--threads', 'OUT'."""
        if self.flags:
            return max(self.flags, key=len)
        return self.metavar or self.dest.upper()

    def shown_metavar(self) -> str:
        """The metavar shown in help: the given one, else a name for the type."""
        if self.metavar is not None:
            return self.metavar
        return {int: "INTEGER", float: "FLOAT", Path: "PATH", int_list: "N1,N2,..."}.get(self.type, "TEXT")


def argument(dest: str, help: str, *, type: Callable[[str], Any] = Path, metavar: str | None = None,
             variadic: bool = False) -> Param:
    """A positional argument (required; ``variadic``: every remaining one)."""
    return Param(dest, ARGUMENT, help=help, type=type, required=True, metavar=metavar, variadic=variadic)


def option(dest: str, *flags: str, help: str, type: Callable[[str], Any] = str, default: Any = None,
           required: bool = False, metavar: str | None = None, minimum: float | None = None, **rules: Any) -> Param:
    """An option taking a value; ``rules``: maximum, min_open, choices, unless, needs, excludes, why, in_order, group."""
    return Param(dest, VALUE, flags, help, type, default, required, metavar, minimum, **rules)


def flag(dest: str, *flags: str, help: str, group: str | None = None) -> Param:
    """An option without a value: True when given (``group``: handed over in that dict, as ``option``'s)."""
    return Param(dest, FLAG, flags, help, bool, False, group=group)


def multi(dest: str, *flags: str, help: str, metavar: str | None = None, in_order: str | None = None) -> Param:
    """A repeatable option: every value, in order."""
    return Param(dest, MULTI, flags, help, str, (), metavar=metavar, in_order=in_order)


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, handler, help text and parameters."""

    name: str
    run: Callable[..., int | None]
    doc: str  # first paragraph: the one-line summary of the program's help
    params: tuple[Param, ...] = field(default_factory=tuple)

    @property
    def summary(self) -> str:
        """The first paragraph of ``doc`` on one line."""
        return " ".join(self.doc.split("\n\n", 1)[0].split())


def int_list(text: str) -> list[int]:
    """A comma-separated list of integers: '1,2,3' -> [1, 2, 3]."""
    return [int(x) for x in text.split(",")]


_TYPE_WORDS = {int: "integer", float: "float", int_list: "comma-separated list of integers"}


def _convert(p: Param, text: str, command: str) -> Any:
    try:
        value = p.type(text)
    except (TypeError, ValueError) as e:
        word = _TYPE_WORDS.get(p.type)
        if word is None and str(e):  # a value type of the table's says what it takes
            raise UsageError(f"Invalid value for '{p.label}': {e}.", command) from None
        raise UsageError(f"Invalid value for '{p.label}': {text!r} is not a valid {word or 'value'}.", command) from None
    if p.choices and value not in p.choices:
        raise UsageError(f"Invalid value for '{p.label}': {text!r} is not one of {', '.join(map(repr, p.choices))}.", command)
    finite = not isinstance(value, float) or math.isfinite(value)
    if (bounds := p.range_text()) is not None and not (finite and p.in_range(value)):
        raise UsageError(f"Invalid value for '{p.label}': {value} is not in the range {bounds}.", command)
    if not finite:
        raise UsageError(f"Invalid value for '{p.label}': {value} is not a finite number.", command)
    return value


def _nearest(word: str, names: Sequence[str], kind: str = "options", show: Callable[[str], str] = str) -> str:
    """Click's hint for a mistyped name: ' Did you mean X?' for one close name, ' (Possible options: X, Y)' for several."""
    bare = {n.lstrip("-"): n for n in names}  # '--' alike in every option: not a likeness
    close = [show(bare[n]) for n in sorted(difflib.get_close_matches(word.lstrip("-"), bare))]
    if not close:
        return ""
    return f" Did you mean {close[0]}?" if len(close) == 1 else f" (Possible {kind}: {', '.join(close)})"


def find_command(commands: Sequence[Command], word: str) -> Command:
    """The command named ``word``; a UsageError naming the nearest commands otherwise."""
    for command in commands:
        if command.name == word:
            return command
    if word.startswith("-"):
        raise UsageError(f"No such option: {word}" + _nearest(word, ["--help", "--version"]))
    raise UsageError(f"No such command {word!r}." + _nearest(word, [c.name for c in commands], "commands", repr))


def _check_together(command: Command, given: set[str]) -> None:
    """Options missing where their alternatives are too, given without the ones they need, or with ones they exclude."""
    by_dest = {p.dest: p for p in command.params}
    for p in command.params:
        if p.unless and p.dest not in given and not given.intersection(p.unless):
            others = " or ".join(f"'{by_dest[d].label}'" for d in p.unless)
            raise UsageError(f"Missing option '{p.label}' (or {others}).", command.name)
        if p.dest not in given:
            continue
        for other in p.needs:
            if other not in given:
                mutual = p.dest in by_dest[other].needs
                raise UsageError(f"{p.label} and {by_dest[other].label} go together (each needs the other)" if mutual
                                 else f"{p.label} needs {by_dest[other].label}", command.name)
        for other in p.excludes:
            if other in given:
                raise UsageError(f"{p.label} does not go with {by_dest[other].label}" + (f" ({p.why})" if p.why else ""),
                                 command.name)


def parse(command: Command, args: Sequence[str]) -> dict[str, Any]:
    """``args`` (after the command's name) -> the keyword arguments of ``command.run``."""
    name = command.name
    by_flag = {f: p for p in command.params for f in p.flags}
    positionals = [p for p in command.params if p.kind == ARGUMENT]
    values: dict[str, Any] = {p.dest: (list(p.default) if p.kind == MULTI else p.default) for p in command.params}
    values.update({p.in_order: [] for p in command.params if p.in_order})
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
            raise UsageError(f"No such option: {word}" + _nearest(word, [f for f in by_flag if f.startswith("--")]), name)
        given.add(p.dest)
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
        if p.in_order:
            values[p.in_order].append((p.dest, value))
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
    _check_together(command, given)
    for p in command.params:
        if p.group:
            values.setdefault(p.group, {})[p.dest] = values.pop(p.dest)
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
        if p.choices:
            extra.append("|".join(p.choices))
        if (bounds := p.range_text()) is not None:
            extra.append(bounds)
        if p.required:
            extra.append("required")
        rows.append((name, p.help + (f"  [{'; '.join(extra)}]" if extra else "")))
    rows.append(("-h, --help", "Show this message and exit."))
    lines += ["", "Options:", *_rows(rows, width)]
    return "\n".join(lines) + "\n"


def render_program_help(prog: str, summary: str, commands: Sequence[Command]) -> str:
    """The program's help page: usage, summary, its own options, every command's summary."""
    width = _width()
    lines = [f"Usage: {prog} [OPTIONS] COMMAND [ARGS]...", *_paragraphs(summary, width), "", "Options:",
             *_rows([("--version", "Print the version and exit."), ("-h, --help", "Show this message and exit.")], width),
             "", "Commands:", *_rows([(c.name, c.summary) for c in commands], width)]
    return "\n".join(lines) + "\n"


__all__ = ["ARGUMENT", "FLAG", "MULTI", "VALUE", "Command", "HelpRequested", "Param", "UsageError", "argument",
           "find_command", "flag", "int_list", "multi", "option", "parse", "render_help", "render_program_help"]
