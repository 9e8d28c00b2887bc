"""The one compiler of user patterns matched against tensor names, with a bound on the work a match takes.

``--tensor-type`` patterns are regular expressions searched in a name (llama-quantize's
``std::regex_search``); ``--keep-type`` globs match whole. ``compile_pattern`` refuses, before any
match and the same on any machine, a pattern whose backtracking could outgrow ``WORK_BOUND`` on a
``GGML_MAX_NAME``-long name, or a count above ``REPEAT_MAX`` (``OptionValueError``, exit 64).
Spec: docs/quantize.md (--tensor-type).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable

from ..errors import OptionValueError
from .ggml import GGML_MAX_NAME

try:  # Python's own parser of regular expressions: the tree re compiles
    from re import _constants as _sre
    from re import _parser as _sre_parse
except ImportError:  # Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

# the longest tensor name a GGUF holds (the C struct's NUL excluded): the subject of every match
NAME_MAX = GGML_MAX_NAME - 1
# glibc's RE_DUP_MAX: the largest count POSIX regular expressions allow in {m,n}
REPEAT_MAX = 0x7FFF
# backtracking paths per name, counted as ``_cost`` counts them (an upper bound): three unbounded
# quantifiers in a row reach it, the fourth passes it
WORK_BOUND = (NAME_MAX + 1) ** 4

_ONE_CHAR = frozenset({_sre.LITERAL, _sre.NOT_LITERAL, _sre.ANY, _sre.IN, _sre.CATEGORY, _sre.AT, _sre.GROUPREF})
_REPEATS = frozenset(op for op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", None)) if op)
# parts that commit to their first success: what follows never backtracks into them
_ATOMIC = frozenset(op for op in (_sre.ASSERT, _sre.ASSERT_NOT, getattr(_sre, "ATOMIC_GROUP", None),
                                  getattr(_sre, "POSSESSIVE_REPEAT", None)) if op)


def _cap(n: int) -> int:
    return min(n, WORK_BOUND + 1)  # saturating: the numbers stay small however large the pattern


def _count_error(item: str, count: int | None = None) -> OptionValueError:
    what = "a repetition count" if count is None else f"the repetition count {count}"
    return OptionValueError(f"{item}: {what} is too large (at most {REPEAT_MAX})" if item else
                         f"{what} is too large (at most {REPEAT_MAX})")


def _width(items: list, state: object) -> tuple[int, int]:
    return _sre_parse.SubPattern(state, items).getwidth()


def _cost(items: list, item: str, state: object) -> int:
    """An upper bound of the backtracking paths a match of ``items`` explores from one position of a NAME_MAX-long name."""
    total = 1
    for i, (op, av) in enumerate(items):
        if op in _ATOMIC:
            if op in (_sre.ASSERT, _sre.ASSERT_NOT):
                body = av[1]
            elif op == getattr(_sre, "POSSESSIVE_REPEAT", None):
                body = [(_sre.MAX_REPEAT, av)]
            else:
                body = av
            return _cap(total * (_cost(list(body), item, state) + _cost(items[i + 1:], item, state)))
        if op in _ONE_CHAR:
            continue
        if op == _sre.SUBPATTERN:
            total = _cap(total * _cost(list(av[-1]), item, state))
        elif op == _sre.BRANCH:
            total = _cap(total * _cap(sum(_cost(list(alt), item, state) for alt in av[1])))
        elif op == _sre.GROUPREF_EXISTS:
            total = _cap(total * _cap(_cost(list(av[1]), item, state) + (_cost(list(av[2]), item, state) if av[2] else 1)))
        elif op in _REPEATS:
            lo, hi, body = av
            for n in (lo, hi):
                if n != _sre.MAXREPEAT and n > REPEAT_MAX:
                    raise _count_error(item, n)
            body = list(body)
            inner = _cost(body, item, state)
            lo_w, hi_w = _width(body, state)
            top = min(hi, NAME_MAX // lo_w if lo_w else NAME_MAX + 1)  # more iterations cannot fit in a name
            counts = top - min(lo, top) + 1  # how many times it may repeat
            if inner == 1 and lo_w == hi_w:
                total = _cap(total * counts)  # only the count is chosen
            else:  # every iteration chooses again: inner ** iterations, for each count of iterations
                total = _cap(total * _cap(counts * _cap(max(inner, 2) ** min(top, 64))))
        else:
            total = _cap(total * 2)  # an operator this count does not know: a choice, conservatively
    return total


def work_bound(pattern: str, item: str = "") -> int:
    """The backtracking paths ``pattern`` may explore searching one tensor name (saturates above WORK_BOUND)."""
    try:
        tree = _sre_parse.parse(pattern)
    except OverflowError:  # a count Python's parser cannot even hold
        raise _count_error(item) from None
    return _cap((NAME_MAX + 1) * _cost(list(tree), item, tree.state))


def shown(text: str, limit: int = 80) -> str:
    """``text`` quoted for a message, its middle cut when longer than ``limit`` (a pattern may be a MiB long)."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit // 2]) + f" ... ({len(text)} characters) ... " + repr(text[-limit // 4:])


@functools.lru_cache(maxsize=1 << 16)  # a whole --tensor-type-file: parsed, then planned, compiled once
def _compiled(pattern: str) -> re.Pattern[str] | str:
    """``pattern`` compiled, or why it is refused (cached by the pattern alone: mix searches plan many times)."""
    try:
        compiled = re.compile(pattern)
        bound = work_bound(pattern, "")
    except OverflowError:
        return f"a repetition count is too large (at most {REPEAT_MAX})"
    except OptionValueError as e:
        return e.message
    except re.error as e:
        return f"the pattern is not a regular expression: {e}"
    except RecursionError:
        return "the pattern nests too deeply"
    if bound > WORK_BOUND:
        return ("matching this pattern may take exponential time (nested or repeated quantifiers over a part that can "
                "match in several ways, or more than three unbounded quantifiers); write it without them, e.g. '.*' once, "
                "or 'blk\\.[0-3]\\.' for a range")
    return compiled


def compile_pattern(pattern: str, item: str | None = None) -> re.Pattern[str]:
    """``pattern`` compiled, once its work on a tensor name is bounded; OptionValueError naming ``item`` otherwise."""
    compiled = _compiled(pattern)
    if isinstance(compiled, str):
        raise OptionValueError(f"{item if item is not None else shown(pattern)}: {compiled}")
    return compiled


def tensor_glob(pattern: str, item: str | None = None) -> Callable[[str], bool]:
    """A --keep-type glob as a test of a tensor name: the whole name, case-sensitive (fnmatch.fnmatchcase)."""
    match = compile_pattern(fnmatch.translate(pattern), item if item is not None else shown(pattern)).match
    return lambda name: match(name) is not None


__all__ = ["NAME_MAX", "REPEAT_MAX", "WORK_BOUND", "compile_pattern", "shown", "tensor_glob", "work_bound"]
