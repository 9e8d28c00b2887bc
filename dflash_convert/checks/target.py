"""Will the drafter pair with its target? Against a target GGUF or a Hugging Face target directory.

llama.cpp checks none of this at load time (spec section 6.10): a wrong hidden size, a different
vocabulary or a tap past the target's last layer surfaces as a run-time assertion or, worse, as
silently useless drafts. From a directory the tokenizer keys are derived exactly as ``convert``
derives them, so a file converted from that directory compares equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DFlashError
from ..format.keys import SPECIAL_TOKEN_ID_KEYS, TOKENIZER_PREFIX, ValueType, key
from ..format.rules import D2T_TENSOR, DRAFTER_ARCHS, LAST_LAYER_OUTPUT_ARCHS, LAYER_INPUT_TARGET_ARCHS, TOKENIZER_IDENTITY_KEYS
from ..metadata import Metadata
from ..sources.gguf import GGUFFile, NumArray, read_gguf
from ..target import Target, read_target_dir, target_from_gguf
from .report import FAIL, SKIP, WARN, Check, check_from, passed
from .semantics import DrafterView


@dataclass
class TargetFacts:
    """The one Target description, plus the tokenizer keys the pairing is judged on."""

    target: Target
    tokenizer: dict[str, tuple[ValueType, Any, ValueType | None]] = field(default_factory=dict)
    tokenizer_error: str | None = None

    @property
    def kind(self) -> str:
        return self.target.kind

    @property
    def arch(self) -> str | None:
        return self.target.architecture

    @property
    def hidden(self) -> int | None:
        return self.target.hidden_size

    @property
    def n_layer(self) -> int | None:
        return self.target.n_layers

    @property
    def vocab_size(self) -> int | None:
        return self.target.vocab_size


def _plain(vtype: ValueType, value: Any) -> Any:
    """A comparable form: strings as bytes, arrays as lists (of bytes for strings)."""
    if vtype == ValueType.STRING:
        return value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if vtype == ValueType.ARRAY:
        if isinstance(value, NumArray):
            return value.tolist()
        return [v.encode("utf-8") if isinstance(v, str) else v for v in value]
    return value


def _from_gguf(path: Path, g: GGUFFile) -> TargetFacts:
    t = TargetFacts(target_from_gguf(g))
    t.tokenizer = {k: (v.vtype, _plain(v.vtype, v.value), v.sub) for k, v in g.metadata.items() if k.startswith(TOKENIZER_PREFIX)}
    if t.vocab_size is None:
        t.tokenizer_error = f"the target GGUF has no {key('tok_tokens')}"
    return t


def _from_dir(path: Path, draft_vocab: int | None) -> TargetFacts:
    from ..tokenizer import borrow_from_dir

    info = read_target_dir(path)
    t = TargetFacts(info)
    md = Metadata()
    try:
        borrow_from_dir(md, path, info.architecture, info.vocab_size or draft_vocab)
    except DFlashError as e:
        t.tokenizer_error = f"cannot derive the target's tokenizer keys: {e.message}"
        return t
    t.tokenizer = {kv.key: (kv.vtype, _plain(kv.vtype, kv.value), kv.sub) for kv in md}
    return t


def read_target(path: Path, draft_vocab: int | None) -> TargetFacts:
    """Target facts; raises DFlashError when the target cannot be read at all."""
    path = Path(path)
    if path.is_dir():
        return _from_dir(path, draft_vocab)
    if not path.exists():
        raise DFlashError("target not found (pass a target GGUF or a Hugging Face model directory)", path)
    return _from_gguf(path, read_gguf(path))


def target_checks(f: DrafterView, target_path: Path) -> list[Check]:
    V = f.dims.get("V")
    try:
        t = read_target(target_path, V)
    except DFlashError as e:
        return [Check("target.read", FAIL, f"cannot read the target: {e}", fatal=True)]
    if t.kind == "gguf" and (t.arch in DRAFTER_ARCHS or t.arch is None or t.tokenizer_error and t.hidden is None):
        what = "a drafter" if t.arch in DRAFTER_ARCHS else f"not a target model (architecture {t.arch!r})"
        return [Check("target.read", FAIL, f"{target_path} is {what}; pass the target model's GGUF or directory")]
    desc = (f"{'GGUF' if t.kind == 'gguf' else 'directory'} {t.arch}, {t.n_layer} layers, hidden {t.hidden}, "
            f"{t.vocab_size} tokens")
    return [passed("target.read", desc), _hidden(f, t), _layers(f, t), _tokenizer(f, t), _vocab(f, t)]


def _hidden(f: DrafterView, t: TargetFacts) -> Check:
    E = f.dims.get("E")
    if E is None or t.hidden is None:
        return Check("target.hidden_size", SKIP, f"hidden size unknown (drafter {E}, target {t.hidden})")
    if E != t.hidden:
        return Check("target.hidden_size", FAIL, f"drafter hidden size {E} != target hidden size {t.hidden}: the drafter's "
                     "fc expects target features of its own width (llama.cpp asserts at run time)")
    return passed("target.hidden_size", f"{E} on both sides")


def _layers(f: DrafterView, t: TargetFacts) -> Check:
    ids = f.target_layers
    if not ids or t.n_layer is None:
        return Check("target.layers", SKIP, "target layer ids or the target's layer count unknown")
    problems, warnings = [], []
    n = t.n_layer
    if t.kind == "gguf" and t.arch not in LAYER_INPUT_TARGET_ARCHS:
        problems.append(f"llama.cpp's {t.arch} graph publishes no layer inputs: no DFlash drafter can pair with this target")
    for i in ids:
        if i > n or i < 0:
            problems.append(f"layer {i} does not exist: the target has {n} layers (inputs 0..{n - 1}, output {n}); "
                            "llama.cpp asserts lid <= n_layer")
        elif i == n:
            if t.kind == "gguf" and t.arch in LAST_LAYER_OUTPUT_ARCHS:
                continue
            msg = (f"layer {i} is the target's last-layer output, which only the {', '.join(LAST_LAYER_OUTPUT_ARCHS)} "
                   "graphs publish")
            (problems if t.kind == "gguf" else warnings).append(msg + ("" if t.kind == "gguf" else
                                                                       f"; check that llama.cpp's graph for {t.arch} does"))
    return check_from("target.layers", problems, warnings, f"{ids} all below the target's {n} layers",
                      "target_layers outside what the target publishes", "target_layers at the edge of the target")


def _tokenizer(f: DrafterView, t: TargetFacts) -> Check:
    if t.tokenizer_error:
        return Check("target.tokenizer", WARN, t.tokenizer_error)
    md = f.g.metadata
    mine = {k: (v.vtype, _plain(v.vtype, v.value), v.sub) for k, v in md.items() if k.startswith(TOKENIZER_PREFIX)}
    problems = []
    for short in TOKENIZER_IDENTITY_KEYS:
        k = key(short)
        a, b = mine.get(k), t.tokenizer.get(k)
        if (a and a[1]) != (b and b[1]):
            problems.append(f"{k}: drafter {_show(a)} vs target {_show(b)}")
    k = key("tok_tokens")
    a_tok, b_tok = (mine.get(k) or (None, None, None))[1], (t.tokenizer.get(k) or (None, None, None))[1]
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
        a, b = mine.get(name), t.tokenizer.get(name)
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


def _vocab(f: DrafterView, t: TargetFacts) -> Check:
    V, Vt = f.dims.get("V"), t.vocab_size
    if V is None or Vt is None:
        return Check("target.vocab", SKIP, f"vocabulary sizes unknown (drafter {V}, target {Vt})")
    problems = []
    if V != Vt:
        problems.append(f"drafter vocabulary {V} != target vocabulary {Vt}: token ids would index the wrong embedding rows")
    d2t = f.g.tensor(D2T_TENSOR)
    if d2t is not None and d2t.ggml_type.name == "I64":
        if d2t.ne[0] >= Vt:
            problems.append(f"d2t maps {d2t.ne[0]} draft ids but the target has {Vt} tokens: not a reduced vocabulary")
        ids = f.g.tensor_bytes(d2t).view("<i8")
        if len(ids) and int(ids.max(initial=0)) >= Vt or int(np.count_nonzero(ids < 0)):
            problems.append(f"d2t holds ids outside the target vocabulary [0, {Vt})")
    what = f"{V} tokens on both sides" + (f"; d2t maps {d2t.ne[0]} draft ids into them" if d2t is not None else "")
    return check_from("target.vocab", problems, [], what, "vocabulary sizes inconsistent", "")
