"""read_drafter(): a dflash GGUF file -> Drafter, the exact inverse of the hyper-parameter writer.

``read_drafter`` (quantize, the runner) refuses an incomplete file with one line that points to
validate; ``read_lenient`` (validate) reads a missing or mistyped value as None and returns
``KeyFindings`` for what no Drafter field holds. Files written by llama.cpp's converter read into
the same Drafter as ours. See docs/architecture.md and docs/validate.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..drafter import ConvPart, Drafter, DrafterTensor, MarkovPart, Origin, RopeScaling, SelectorPart
from ..errors import InputFileError
from ..format.family import CONF_PROJ, GEMMA4_OVERRIDDEN_KEYS, MARKOV_W1
from ..format.keys import ARCH, FLOAT_VALUE_TYPES, INT_TYPES, KEYS, TOKENIZER_PREFIX, ValueType, key
from ..format.rules import D2T_TENSOR, DEFAULT_BLOCK_SIZE, DRAFTER_KEYS, PER_LAYER_KEYS, REQUIRED
from ..format.tensors import gguf_to_hf
from ..metadata import Metadata
from .gguf import GGUFFile, GGUFValue, read_gguf


def as_int(v: GGUFValue | None) -> int | None:
    """An integer value, or None when absent or not an integer type."""
    return v.value if v is not None and v.vtype in INT_TYPES else None


def as_float(v: GGUFValue | None) -> float | None:
    """A float value, or None when absent or not a float type."""
    return float(v.value) if v is not None and v.vtype in FLOAT_VALUE_TYPES else None


# longer integer arrays are refused, never expanded: llama.cpp reads none past LLAMA_MAX_LAYERS (512)
MAX_INT_LIST = 1 << 16


def as_ints(v: GGUFValue | None) -> list[int] | None:
    """An integer or bool array as a list of ints; None otherwise or past MAX_INT_LIST."""
    if v is None:
        return None
    if v.vtype == ValueType.ARRAY and v.sub in INT_TYPES | {ValueType.BOOL} and len(v.value) <= MAX_INT_LIST:
        return [int(x) for x in v.value.tolist()]  # bools as 0/1
    return None


def as_text(v: GGUFValue | None) -> str | None:
    """A string value as text, or None when absent or not a string."""
    return v.text() if v is not None and v.vtype == ValueType.STRING else None


def per_layer_or_scalar(v: GGUFValue | None) -> int | None:
    """A per-layer key: a scalar, or an array whose entries are all equal (else None)."""
    scalar = as_int(v)
    if scalar is not None:
        return scalar
    arr = as_ints(v)
    return arr[0] if arr and len(set(arr)) == 1 else None


def _position(g: GGUFFile, full_key: str) -> int:
    keys = list(g.metadata)
    return keys.index(full_key) if full_key in g.metadata else -1


@dataclass
class KeyFindings:
    """What a lenient read found beside the Drafter: every key's presence and type, and values no Drafter field holds."""

    types: dict[str, tuple[ValueType, ValueType | None]] = field(default_factory=dict)  # full key -> (type, element type)
    values: dict[str, Any] = field(default_factory=dict)  # short name -> the typed value (None: mistyped); ints, floats,
    #                                                     #   text, int lists (bool arrays as 0/1)
    lengths: dict[str, int] = field(default_factory=dict)  # short name -> entries, for every array-valued key
    per_layer: dict[str, list[int]] = field(default_factory=dict)  # PER_LAYER_KEYS given as arrays
    architecture: str | None = None  # general.architecture as text (None: missing or not a string)

    def has(self, short: str) -> bool:
        """Whether the file has the arch key ``short``."""
        return key(short) in self.types

    def type_of(self, short: str) -> tuple[ValueType, ValueType | None] | None:
        """The value type (and element type) of the arch key ``short``, or None."""
        return self.types.get(key(short))

    def value(self, short: str) -> Any:
        """The value of the arch key ``short`` no Drafter field holds, or None."""
        return self.values.get(short)

    def int_value(self, short: str) -> int | None:
        """The key's value when the file stores it as an integer (a bool is not one), else None."""
        v = self.values.get(short)
        return v if type(v) is int else None


def _typed(v: GGUFValue) -> Any:
    """A key's value as validate compares it: int, float, text, or a list of ints; None for anything else."""
    if v.vtype == ValueType.ARRAY and v.sub not in INT_TYPES | {ValueType.BOOL}:
        return None  # string and float arrays: no check compares them as values (lengths are kept)
    for read in (as_int, as_float, as_text, as_ints):
        got = read(v)
        if got is not None:
            return got
    return v.value if v.vtype == ValueType.BOOL else None


def tokenizer_keys(g: GGUFFile) -> Metadata:
    """Every tokenizer.* key of the file, kept exactly as stored."""
    md = Metadata()
    for name, v in g.metadata.items():
        if name.startswith(TOKENIZER_PREFIX):
            md.set_as_read(name, v.vtype, v.value, v.sub)
    return md


def read_lenient(g: GGUFFile) -> tuple[Drafter, KeyFindings]:
    """The Drafter a parsed file describes, however broken, and what the reading found (see the module docstring)."""
    d = drafter_from_gguf(g, strict=False)
    f = KeyFindings(types={name: (v.vtype, v.sub) for name, v in g.metadata.items()}, architecture=g.architecture)
    for short in KEYS:
        v = g.metadata.get(key(short))
        if v is not None:
            # vocabulary-sized arrays (token types, scores, tokens) are only counted, never expanded
            f.values[short] = None if key(short).startswith(TOKENIZER_PREFIX) and v.vtype == ValueType.ARRAY else _typed(v)
            if v.vtype == ValueType.ARRAY:
                f.lengths[short] = len(v.value)
    for short in PER_LAYER_KEYS:
        arr = as_ints(g.metadata.get(key(short)))
        if arr is not None:
            f.per_layer[short] = arr
    return d, f


def drafter_from_gguf(g: GGUFFile, *, strict: bool = True) -> Drafter:
    """The Drafter a parsed dflash GGUF describes (see the module docstring for ``strict``)."""
    md = g.metadata
    if strict:
        if g.architecture != ARCH:
            raise InputFileError(f"{key('architecture')} is {g.architecture!r}, not {ARCH!r}: not a DFlash drafter "
                                 "(dflash-convert validate says more; migrate converts other forks' files)", g.path)
        missing = [key(s) for s, (need, _) in DRAFTER_KEYS.items() if need == REQUIRED and key(s) not in md]
        if missing:
            raise InputFileError(f"not a complete dflash drafter: {', '.join(missing)} missing (run dflash-convert validate)", g.path)

    def get(short: str) -> GGUFValue | None:
        return md.get(key(short))

    E = as_int(get("embedding_length"))
    H = per_layer_or_scalar(get("head_count"))
    KV = per_layer_or_scalar(get("head_count_kv")) if get("head_count_kv") is not None else H
    D = as_int(get("key_length"))
    if D is None and get("key_length") is None and E and H:
        D = E // H
    tokens = get("tok_tokens")
    V = len(tokens.value) if tokens is not None and tokens.vtype == ValueType.ARRAY and tokens.sub == ValueType.STRING else None
    d2t = g.tensor(D2T_TENSOR)

    scaling = None
    kind = as_text(get("rope_scaling_type"))
    if kind in ("linear", "yarn"):
        scaling = RopeScaling(kind, as_float(get("rope_scaling_factor")) or 0.0)
        if kind == "yarn":
            scaling.original_context_length = as_int(get("rope_scaling_orig_ctx"))
            scaling.yarn_ext_factor = as_float(get("rope_yarn_ext_factor"))
            scaling.yarn_attn_factor = as_float(get("rope_yarn_attn_factor"))
            scaling.yarn_beta_fast = as_float(get("rope_yarn_beta_fast"))
            scaling.yarn_beta_slow = as_float(get("rope_yarn_beta_slow"))

    # upstream's key order: these generic keys come before the epsilon, the dflash ones after it
    eps_at = _position(g, key("rms_eps"))
    sections = as_ints(get("rope_dimension_sections"))
    causal_v = get("causal")
    pattern = as_ints(get("sliding_window_pattern"))
    window = as_int(get("sliding_window"))
    block = get("block_size")
    act = as_text(get("hidden_activation"))
    ids = as_ints(get("target_layers"))
    d = Drafter(
        origin=Origin(Path(g.path), Path(g.path), [Path(g.path)], "gguf", file_type=as_int(md.get(key("file_type")))),
        n_layers=as_int(get("block_count")),  # type: ignore[arg-type]
        hidden_size=E,  # type: ignore[arg-type]
        intermediate_size=per_layer_or_scalar(get("feed_forward_length")),  # type: ignore[arg-type]
        n_head=H,  # type: ignore[arg-type]
        n_head_kv=KV,  # type: ignore[arg-type]
        head_dim=D,  # type: ignore[arg-type]
        context_length=as_int(get("context_length")),  # type: ignore[arg-type]
        rms_eps=as_float(get("rms_eps")),  # type: ignore[arg-type]
        vocab_size=V,  # type: ignore[arg-type]
        mask_token_id=as_int(get("mask_token_id")),  # type: ignore[arg-type]
        target_layers=ids,  # type: ignore[arg-type]
        block_size=DEFAULT_BLOCK_SIZE if block is None else as_int(block),  # type: ignore[arg-type]
        rope_theta=as_float(get("rope_freq_base")),
        rope_theta_swa=as_float(get("rope_freq_base_swa")),
        rope_scaling=scaling,
        rope_sections=sections,
        rope_sections_early=sections is not None and 0 <= _position(g, key("rope_dimension_sections")) < eps_at,
        n_rot=as_int(get("rope_dimension_count")),
        sliding_window=window if window and pattern is not None else None,
        swa_pattern=[bool(x) for x in pattern] if window and pattern is not None else None,
        causal=causal_v.value if causal_v is not None and causal_v.vtype == ValueType.BOOL else None,
        causal_early=causal_v is not None and 0 <= _position(g, key("causal")) < eps_at,
        value_scale=as_float(get("value_scale")),
        embedding_scale=as_float(get("embedding_scale")),
        logit_scale=as_float(get("logit_scale")),
        final_logit_softcapping=as_float(get("final_logit_softcapping")),
        hidden_act=act if act is not None else "silu",
        draft_vocab_size=d2t.ne[0] if d2t is not None else None,
        tensors=[DrafterTensor(t.name, gguf_to_hf(t.name) or t.name, t) for t in g.tensors],
        tokenizer=tokenizer_keys(g),
    )
    _read_family(d, g)
    if strict:
        _require(d, g)
    return d


def _read_family(d: Drafter, g: GGUFFile) -> None:
    """The DFlash2 and DSpark parts (format/family.py): keys into their fields, the Markov rank from its table."""
    md = g.metadata

    def get(short: str) -> GGUFValue | None:
        return md.get(key(short))

    def flag(short: str) -> bool | None:
        v = get(short)
        return bool(v.value) if v is not None and v.vtype == ValueType.BOOL else None

    if get("conv_kernel_size") is not None or get("conv_group_size") is not None:
        d.conv = ConvPart(as_int(get("conv_kernel_size")), as_int(get("conv_group_size")))  # type: ignore[arg-type]
    if get("selector_rank") is not None or get("selector_top_k") is not None:
        d.selector = SelectorPart(as_int(get("selector_rank")), as_int(get("selector_top_k")))  # type: ignore[arg-type]
    w1 = g.tensor(MARKOV_W1)
    if w1 is not None:
        d.markov = MarkovPart(rank=w1.ne[0], confidence=g.tensor(CONF_PROJ) is not None)
    d.sample_from_anchor = flag("sample_from_anchor")
    d.has_confidence_head = flag("has_confidence_head")
    d.attention_scale = as_float(get("attention_scale"))
    # Gemma-4 DSpark: overridden generic keys the config lacked sit after the DFlash keys (after target_layers)
    layers_at = _position(g, key("target_layers"))
    if layers_at >= 0:
        d.late_keys = tuple(s for s in GEMMA4_OVERRIDDEN_KEYS if _position(g, key(s)) > layers_at)


# fields a strict reader needs (the rest are optional in the format)
_REQUIRED_FIELDS: tuple[str, ...] = ("n_layers", "hidden_size", "intermediate_size", "n_head", "n_head_kv", "head_dim",
                                     "context_length", "rms_eps", "vocab_size", "mask_token_id", "target_layers", "block_size")


def _require(d: Drafter, g: GGUFFile) -> None:
    bad = [name for name in _REQUIRED_FIELDS if getattr(d, name) is None]
    if bad:
        raise InputFileError(f"cannot read the drafter's {', '.join(bad)} from its keys (missing, mistyped or "
                             "per-layer); run dflash-convert validate", g.path)


def read_drafter(path: str | Path) -> Drafter:
    """A dflash drafter GGUF as a Drafter (strict: raises InputFileError on an incomplete file)."""
    return drafter_from_gguf(read_gguf(path), strict=True)


def describe(d: Drafter) -> dict[str, Any]:
    """A Drafter as plain data: every hyper-parameter and the tensor table (name, shape, type)."""
    out = dict(d.hparams())
    for part in ("rope_scaling", "conv", "selector", "markov"):
        if out.get(part) is not None:
            out[part] = vars(out[part])
    out["late_keys"] = list(out["late_keys"])
    out["tensors"] = [(t.gguf_name, list(t.shape), t.dtype) for t in d.tensors]
    return out
