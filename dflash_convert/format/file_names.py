"""File names llama.cpp's ``-hf`` discovers: the drafter prefixes as data, our default names, the warning.

llama.cpp offers as a draft only ``.gguf`` files whose path holds ``dflash-`` / ``dspark-`` (case
sensitive), so our names are ``dflash-<Name>-<TYPE>.gguf`` and ``dspark-...`` for a DSpark drafter.
The rules of common/download.cpp these tables follow: docs/conversion.md.
"""

from __future__ import annotations

import re

from .file_types import FILE_TYPES

DFLASH_PREFIX = "dflash-"
DSPARK_PREFIX = "dspark-"
GGUF_SUFFIX = ".gguf"
# gguf_filename_is_model: a base name holding any of these is never taken as a main model
NOT_A_MODEL_MARKERS: tuple[str, ...] = ("mmproj", "imatrix", "mtp-", "eagle3-", DFLASH_PREFIX, DSPARK_PREFIX)
# find_best_mmproj / _mtp / _eagle3 / _dflash / _dspark: the keyword each sidecar search looks for
SIDECAR_KEYWORDS: dict[str, str] = {"mmproj": "mmproj", "mtp": "mtp-", "eagle3": "eagle3-",
                                    "dflash": DFLASH_PREFIX, "dspark": DSPARK_PREFIX}
FALLBACK_NAME = "drafter"  # when nothing of the name is left after sanitising

_SPLIT_SUFFIX = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
# characters no file name should carry: path separators, NUL and the other control characters
_UNSAFE = re.compile(r"[/\\\x00-\x1f\x7f]+")


def drafter_prefix(*, dspark: bool) -> str:
    """The file-name prefix llama.cpp's ``-hf`` looks for: ``dspark-`` or ``dflash-``."""
    return DSPARK_PREFIX if dspark else DFLASH_PREFIX


def safe_name(name: str) -> str:
    """``name`` as one file-name component: separators, controls and blanks -> ``-``, no leading dot or dash."""
    text = _UNSAFE.sub("-", name.strip())
    text = re.sub(r"\s+", "-", text)
    text = re.sub(r"-{2,}", "-", text).lstrip(".-").rstrip("-")
    return text or FALLBACK_NAME


def drafter_file_name(name: str, type_name: str, *, dspark: bool) -> str:
    """``dflash-<Name>-<TYPE>.gguf`` (``dspark-`` for DSpark), TYPE upper case as llama.cpp's tags are."""
    prefix = drafter_prefix(dspark=dspark)
    base = safe_name(name)
    if base.startswith(prefix):
        base = safe_name(base[len(prefix):])
    return f"{prefix}{base}-{type_name.upper()}{GGUF_SUFFIX}"


def file_tag(filename: str) -> str:
    """The tag llama.cpp reads from a file name (get_gguf_split_info), upper case; "" when none."""
    if not filename.endswith(GGUF_SUFFIX):
        return ""
    stem = filename[:-len(GGUF_SUFFIX)]
    if m := _SPLIT_SUFFIX.match(stem):
        stem = m.group(1)
    m = _TAG.search(stem)
    return m.group(1).upper() if m else ""


def quantized_file_name(input_name: str, type_name: str, *, dspark: bool) -> str:
    """quantize's output name: the input's with its type tag replaced (the whole stem kept when it has none), the member's prefix."""
    stem = input_name[:-len(GGUF_SUFFIX)] if input_name.endswith(GGUF_SUFFIX) else input_name
    tag = file_tag(stem + GGUF_SUFFIX)
    if tag in FILE_TYPES and len(stem) > len(tag) + 1:
        stem = stem[:-len(tag) - 1]
    for prefix in (DFLASH_PREFIX, DSPARK_PREFIX):
        if stem.startswith(prefix):
            stem = stem[len(prefix):]
            break
    return drafter_file_name(stem, type_name, dspark=dspark)


def discovery_problem(filename: str, *, dspark: bool, type_name: str | None = None) -> str | None:
    """Why llama.cpp's ``-hf`` would not offer this file as a draft (or would offer it as something else); None when it would."""
    prefix = drafter_prefix(dspark=dspark)
    other = drafter_prefix(dspark=not dspark)
    kind = "DSpark" if dspark else "DFlash"
    hint = f"name it {prefix}<Name>-<TYPE>{GGUF_SUFFIX}"
    if not filename.endswith(GGUF_SUFFIX):
        return (f"file name {filename!r} does not end in {GGUF_SUFFIX!r} (lower case): llama.cpp's -hf never "
                f"looks at it (common/download.cpp); {hint}")
    problems: list[str] = []
    if prefix not in filename:
        searcher = f"find_best_{'dspark' if dspark else 'dflash'}"
        if not any(m in filename for m in NOT_A_MODEL_MARKERS):
            problems.append(f"holds no {prefix!r} (lower case): llama.cpp's -hf offers it as a main model "
                            f"(gguf_filename_is_model) and never as the {kind} draft ({searcher})")
        else:
            problems.append(f"holds no {prefix!r} (lower case): llama.cpp's -hf never offers it as the {kind} draft "
                            f"({searcher} in common/download.cpp)")
    others = [kw for kw in SIDECAR_KEYWORDS.values() if kw not in (prefix, other) and kw in filename]
    if other in filename:
        others.insert(0, other)
    if others:
        problems.append(f"also holds {', '.join(repr(k) for k in others)}: -hf may offer it as that kind of sidecar too")
    if type_name is not None and f"-{type_name.upper()}." not in filename.upper():
        problems.append(f"has the tag {file_tag(filename) or 'none'!r}, not {type_name.upper()!r}: -hf REPO:"
                        f"{type_name.upper()} does not pick it by its type (find_best_sibling's '-TAG.' match)")
    if not problems:
        return None
    return f"file name {filename!r} " + "; ".join(problems) + f"; {hint}"
