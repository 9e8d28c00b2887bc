"""Will the drafter pair with its target? Against a target GGUF or a Hugging Face target directory.

llama.cpp checks none of this at load time (spec section 6.10): a wrong hidden size, a different
vocabulary or a tap past the target's last layer surfaces as a run-time assertion or, worse, as
silently useless drafts. From a directory the tokenizer keys are derived exactly as ``convert``
derives them, so a file converted from that directory compares equal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import NumArray, StrArray
from ..errors import DFlashError
from ..format.keys import SPECIAL_TOKEN_ID_KEYS, TOKENIZER_PREFIX, ValueType, key
from ..format.rules import D2T_TENSOR, DRAFTER_ARCHS, FIXED_TYPES, LAST_LAYER_OUTPUT_ARCHS, LAYER_INPUT_TARGET_ARCHS, TOKENIZER_IDENTITY_KEYS
from ..metadata import Metadata
from ..sources.gguf import read_gguf
from ..sources.target import read_target_dir, target_from_gguf
from ..target import GGUF, Target
from ..tokenizer.borrow import borrow_from_dir
from ..tokenizer.cache import TokenizerCache, open_cache
from .report import FAIL, SKIP, WARN, Check, check_from, passed
from .semantics import Reading, ne_of, tensor_ids

Comparable = dict[str, tuple[ValueType, Any, ValueType | None]]  # full key -> (type, plain value, element type)


def _plain(vtype: ValueType, value: Any) -> Any:
    """A comparable form: strings as bytes, arrays as lists (of bytes for strings)."""
    if vtype == ValueType.STRING:
        return value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if vtype == ValueType.ARRAY:
        if isinstance(value, NumArray):
            return value.tolist()
        if isinstance(value, StrArray):
            return value  # compares equal to a list of the same bytes; held compact, never expanded
        return [v.encode("utf-8") if isinstance(v, str) else v for v in value]
    return value


def comparable(md: Metadata | None) -> Comparable:
    """Tokenizer keys in the form two vocabularies are compared in."""
    return {} if md is None else {kv.key: (kv.vtype, _plain(kv.vtype, kv.value), kv.sub) for kv in md
                                  if kv.key.startswith(TOKENIZER_PREFIX)}


@dataclass
class PairingTarget:
    """A target as validate compares a drafter with it: read once, usable for any number of files."""

    path: Path
    target: Target
    tokenizer: Comparable  # its tokenizer keys in comparable form
    error: str | None = None  # why the tokenizer keys could not be had


def pairing_target(path: str | os.PathLike, draft_vocab: int | None = None,
                   cache: bool | TokenizerCache = True, *, read: Target | None = None) -> PairingTarget:
    """Read the target (a GGUF or a Hugging Face directory) for comparing drafters with it."""
    path = Path(path)
    if path.is_dir():
        t = read if read is not None else read_target_dir(path)
        md = Metadata()
        try:
            borrow_from_dir(md, path, t.architecture, t.vocab_size or draft_vocab, cache=open_cache(cache))
        except DFlashError as e:
            return PairingTarget(path, t, {}, f"cannot derive the target's tokenizer keys: {e.message}")
        return PairingTarget(path, t, comparable(md))
    if not path.exists():
        if path.is_symlink():  # a dangling link or a loop: read_gguf names which
            read_gguf(path)
        raise DFlashError("target not found (pass a target GGUF or a Hugging Face model directory)", path)
    t = target_from_gguf(read_gguf(path))
    error = f"the target GGUF has no {key('tok_tokens')}" if t.vocab_size is None else None
    return PairingTarget(path, t, comparable(t.tokenizer), error)


def target_checks(r: Reading, target: Path | PairingTarget) -> list[Check]:
    """The pairing checks of one drafter against ``target`` (a path, or a target read once)."""
    target_path = target.path if isinstance(target, PairingTarget) else target
    try:
        paired = target if isinstance(target, PairingTarget) else pairing_target(target, r.dims.get("V"))
    except DFlashError as e:
        return [Check("target.read", FAIL, f"cannot read the target: {e}", fatal=True)]
    t, tokenizer, error = paired.target, paired.tokenizer, paired.error
    arch = t.architecture
    if t.kind == GGUF and (arch in DRAFTER_ARCHS or arch is None or error and t.hidden_size is None):
        what = "a drafter" if arch in DRAFTER_ARCHS else f"not a target model (architecture {arch!r})"
        return [Check("target.read", FAIL, f"{target_path} is {what}; pass the target model's GGUF or directory")]
    desc = (f"{'GGUF' if t.kind == GGUF else 'directory'} {arch}, {t.n_layers} layers, hidden {t.hidden_size}, "
            f"{t.vocab_size} tokens")
    return [passed("target.read", desc), _hidden(r, t), _layers(r, t), _tokenizer(r, tokenizer, error), _vocab(r, t)]


def _hidden(r: Reading, t: Target) -> Check:
    E = r.dims.get("E")
    if E is None or t.hidden_size is None:
        return Check("target.hidden_size", SKIP, f"hidden size unknown (drafter {E}, target {t.hidden_size})")
    if E != t.hidden_size:
        return Check("target.hidden_size", FAIL, f"drafter hidden size {E} != target hidden size {t.hidden_size}: the drafter's "
                     "fc expects target features of its own width (llama.cpp asserts at run time)")
    return passed("target.hidden_size", f"{E} on both sides")


def _layers(r: Reading, t: Target) -> Check:
    ids = r.target_layers
    if not ids or t.n_layers is None:
        return Check("target.layers", SKIP, "target layer ids or the target's layer count unknown")
    problems, warnings = [], []
    n = t.n_layers
    arch = t.architecture
    if t.kind == GGUF and arch not in LAYER_INPUT_TARGET_ARCHS:
        problems.append(f"llama.cpp's {arch} graph publishes no layer inputs: no DFlash drafter can pair with this target")
    for i in ids:
        if i > n or i < 0:
            problems.append(f"layer {i} does not exist: the target has {n} layers (inputs 0..{n - 1}, output {n}); "
                            "llama.cpp asserts lid <= n_layer")
        elif i == n:
            if t.kind == GGUF and arch in LAST_LAYER_OUTPUT_ARCHS:
                continue
            msg = (f"layer {i} is the target's last-layer output, which only the {', '.join(LAST_LAYER_OUTPUT_ARCHS)} "
                   "graphs publish")
            (problems if t.kind == GGUF else warnings).append(msg + ("" if t.kind == GGUF else
                                                                     f"; check that llama.cpp's graph for {arch} does"))
    return check_from("target.layers", problems, warnings, f"{ids} all below the target's {n} layers",
                      "target_layers outside what the target publishes", "target_layers at the edge of the target")


def _tokenizer(r: Reading, theirs: Comparable, error: str | None) -> Check:
    if error:
        return Check("target.tokenizer", WARN, error)
    mine = comparable(r.d.tokenizer)
    problems = []
    for short in TOKENIZER_IDENTITY_KEYS:
        k = key(short)
        a, b = mine.get(k), theirs.get(k)
        if (a and a[1]) != (b and b[1]):
            problems.append(f"{k}: drafter {_show(a)} vs target {_show(b)}")
    k = key("tok_tokens")
    a_tok, b_tok = (mine.get(k) or (None, None, None))[1], (theirs.get(k) or (None, None, None))[1]
    if a_tok != b_tok:
        if a_tok is None or b_tok is None:
            problems.append(f"{k}: missing on the {'drafter' if a_tok is None else 'target'} side")
        elif len(a_tok) != len(b_tok):
            problems.append(f"{k}: drafter has {len(a_tok)} tokens, target {len(b_tok)}")
        else:
            i = next(i for i, (x, y) in enumerate(zip(a_tok, b_tok, strict=True)) if x != y)
            n_diff = sum(x != y for x, y in zip(a_tok, b_tok, strict=True))
            problems.append(f"{k}: {n_diff} tokens differ, first at id {i}: drafter {a_tok[i]!r} vs target {b_tok[i]!r}")
    for kind, name in SPECIAL_TOKEN_ID_KEYS.items():
        if kind == "mask":
            continue  # the mask token is the drafter's own; targets define none
        a, b = mine.get(name), theirs.get(name)
        if (a and a[1]) != (b and b[1]):
            problems.append(f"{name}: drafter {_show(a)} vs target {_show(b)}")
    return check_from("target.tokenizer", problems, [], "model, pre-tokenizer, token list and special ids identical",
                      "the drafter's tokenizer is not the target's", "")


def _show(v: tuple[ValueType, Any, ValueType | None] | None) -> str:
    if v is None:
        return "absent"
    value = v[1]
    if isinstance(value, bytes):
        return repr(value.decode("utf-8", "replace"))
    return repr(value)


def _vocab(r: Reading, t: Target) -> Check:
    V, Vt = r.dims.get("V"), t.vocab_size
    if V is None or Vt is None:
        return Check("target.vocab", SKIP, f"vocabulary sizes unknown (drafter {V}, target {Vt})")
    problems = []
    if V != Vt:
        problems.append(f"drafter vocabulary {V} != target vocabulary {Vt}: token ids would index the wrong embedding rows")
    d2t = r.tensor(D2T_TENSOR)
    if d2t is not None and d2t.dtype == FIXED_TYPES[D2T_TENSOR]:
        if ne_of(d2t)[0] >= Vt:
            problems.append(f"d2t maps {ne_of(d2t)[0]} draft ids but the target has {Vt} tokens: not a reduced vocabulary")
        ids = tensor_ids(d2t)
        if len(ids) and int(ids.max(initial=0)) >= Vt or int(np.count_nonzero(ids < 0)):
            problems.append(f"d2t holds ids outside the target vocabulary [0, {Vt})")
    what = f"{V} tokens on both sides" + (f"; d2t maps {ne_of(d2t)[0]} draft ids into them" if d2t is not None else "")
    return check_from("target.vocab", problems, [], what, "vocabulary sizes inconsistent", "")
