"""Which ggml type ``llama-quantize`` gives each tensor of a ``dflash`` GGUF: data tables and their rule.

Mirrors llama.cpp 0c1e57098's ``src/llama-quant.cpp`` for a dense model, with or without an imatrix.
Reads no file; refuses only an unknown type name. Specification: docs/quantizers.md, "Which type each tensor gets".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from .file_types import FILE_TYPES, FTYPE_ALIASES
from .ggml import BLOCK_GEOMETRY, FLOAT_TYPES, GGMLType
from .rules import QUANTIZE_FALLBACK as FALLBACK
from .rules import QUANTIZE_LAST_RESORT as LAST_RESORT_TYPE
from .tensor_patterns import compile_pattern

# --- file types

# name -> (general.file_type, default ggml type)
FTYPES: dict[str, tuple[int, GGMLType]] = {name: (ft.value, ft.matrix_type) for name, ft in FILE_TYPES.items()}

# --- which tensors are quantized (tensor_allows_quantization)

# a name containing any of these is never quantized (llama.cpp's list, every architecture's)
NOT_QUANTIZED_SUBSTRINGS: tuple[str, ...] = (
    "_norm.weight",
    "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight",
    "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight",
    "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger",
    "a.rvq.codebook", "mm.a.code_embd",
)
NOT_QUANTIZED_NAMES: frozenset[str] = frozenset({"position_embd.weight", "token_types.weight"})
# the suffix a quantizable name must end with (note: "weight", not ".weight")
QUANTIZED_SUFFIX = "weight"

# --- tensor categories (tensor_get_category)

OUTPUT_NAMES: frozenset[str] = frozenset({"output.weight"})
PER_LAYER_TOKEN_EMBD = "per_layer_token_embd.weight"  # follows --token-embedding-type unless a --tensor-type names it
TOKEN_EMBD_NAMES: frozenset[str] = frozenset({"token_embd.weight", "per_layer_token_embd.weight"})
# (substring, category), tried in this order after the exact names above; first hit wins
CATEGORY_SUBSTRINGS: tuple[tuple[str, str], ...] = (
    ("attn_qkv.weight", "attn_qkv"),
    ("attn_kv_b.weight", "attn_kv_b"),
    ("attn_v.weight", "attn_v"),
    ("attn_k.weight", "attn_k"),
    ("attn_q.weight", "attn_q"),
    ("attn_output.weight", "attn_output"),
    ("ffn_up", "ffn_up"),
    ("ffn_gate", "ffn_gate"),
    ("ffn_down", "ffn_down"),
)
# categories that share the attn_v counter and rules (category_is_attn_v)
ATTN_V_LIKE: frozenset[str] = frozenset({"attn_v", "attn_qkv", "attn_kv_b"})

# --- mix rules (llama_tensor_get_type_impl): ftype -> rule group -> ((condition, type), ...), first
# that holds wins, else the default type. llama.cpp's attn_qkv rules are unreachable (attn_v-like first).
MIX_RULES: dict[str, dict[str, tuple[tuple[str, GGMLType], ...]]] = {
    "Q2_K": {
        "attn_v": (("gqa>=4", GGMLType.Q4_K), ("always", GGMLType.Q3_K)),
        "ffn_down": (("always", GGMLType.Q3_K),),
        "attn_output": (("always", GGMLType.Q3_K),),
    },
    "Q3_K_M": {
        "attn_v": (("i<2", GGMLType.Q5_K), ("always", GGMLType.Q4_K)),
        "ffn_down": (("i<n/16", GGMLType.Q5_K), ("always", GGMLType.Q4_K)),
        "attn_output": (("always", GGMLType.Q4_K),),
    },
    "Q3_K_L": {
        "attn_v": (("always", GGMLType.Q5_K),),
        "ffn_down": (("always", GGMLType.Q5_K),),
        "attn_output": (("always", GGMLType.Q5_K),),
    },
    "Q4_K_S": {
        "attn_v": (("i<4", GGMLType.Q5_K),),
        "ffn_down": (("i<n/8", GGMLType.Q5_K),),
    },
    "Q4_K_M": {
        "attn_v": (("more_bits", GGMLType.Q6_K),),
        "ffn_down": (("more_bits", GGMLType.Q6_K),),
    },
    "Q5_K_M": {
        "attn_v": (("more_bits", GGMLType.Q6_K),),
        "ffn_down": (("more_bits", GGMLType.Q6_K),),
    },
    # the ffn_down rule is the no-imatrix one ("i<n/8" only applies without an imatrix)
    "IQ4_NL": {
        "attn_v": (("gqa>=4", GGMLType.Q5_K),),
        "ffn_down": (("i<n/8", GGMLType.Q5_K),),
    },
    "IQ4_XS": {
        "attn_v": (("gqa>=4", GGMLType.Q5_K),),
        "ffn_down": (("i<n/8", GGMLType.Q5_K),),
    },
    "TQ1_0": {"token_embd": (("always", GGMLType.Q4_K),)},
    "TQ2_0": {"token_embd": (("always", GGMLType.Q4_K),)},
    "Q2_0": {"token_embd": (("always", GGMLType.Q4_K),)},
    "Q2_K_S": {
        "attn_v": (("gqa>=4", GGMLType.Q4_K),),
        "ffn_down": (("i<n/8", GGMLType.Q4_K),),
    },
    "IQ3_XXS": {
        "token_embd": (("always", GGMLType.IQ3_S),),
        "attn_v": (("gqa>=4", GGMLType.Q4_K), ("no_imatrix", GGMLType.IQ3_S)),
        "attn_k": (("always", GGMLType.IQ2_S),),
        "attn_q": (("always", GGMLType.IQ2_S),),
        "ffn_down": (("no_imatrix&i<n/8", GGMLType.Q4_K), ("no_imatrix", GGMLType.Q3_K)),
        "attn_output": (("always", GGMLType.IQ3_S),),
    },
    "IQ3_XS": {
        "attn_v": (("gqa>=4", GGMLType.Q4_K),),
        "attn_k": (("always", GGMLType.IQ3_XXS),),
        "attn_q": (("always", GGMLType.IQ3_XXS),),
        "ffn_gate": (("n/8<=i<7n/8", GGMLType.IQ3_XXS),),
        "ffn_up": (("n/8<=i<7n/8", GGMLType.IQ3_XXS),),
    },
    "IQ3_S": {
        "attn_v": (("gqa>=4", GGMLType.Q4_K),),
    },
    "IQ3_M": {
        "attn_v": (("always", GGMLType.Q4_K),),
        "ffn_down": (("i<n/8", GGMLType.Q4_K),),
        "attn_output": (("always", GGMLType.Q4_K),),
    },
    # the IQ2/IQ1 branch: one rule set, Q2_K or (IQ2_S, IQ2_M) IQ3_S where the others get more bits
    "IQ2_XXS": {
        "token_embd": (("always", GGMLType.Q2_K),),
        "attn_v": (("gqa>=4", GGMLType.Q4_K), ("always", GGMLType.Q2_K)),
        "ffn_down": (("i<n/8", GGMLType.Q2_K),),
    },
    "IQ2_XS": {
        "token_embd": (("always", GGMLType.Q2_K),),
        "attn_v": (("gqa>=4", GGMLType.Q4_K), ("always", GGMLType.Q2_K)),
        "ffn_down": (("i<n/8", GGMLType.Q2_K),),
    },
    "IQ2_S": {
        "token_embd": (("always", GGMLType.IQ3_S),),
        "attn_v": (("gqa>=4", GGMLType.Q4_K), ("always", GGMLType.IQ3_S)),
        "ffn_down": (("i<n/8", GGMLType.IQ3_S),),
        "attn_output": (("always", GGMLType.IQ3_S),),
    },
    "IQ2_M": {
        "token_embd": (("always", GGMLType.IQ3_S),),
        "attn_v": (("gqa>=4", GGMLType.Q4_K), ("always", GGMLType.IQ3_S)),
        "ffn_down": (("i<n/8", GGMLType.IQ3_S),),
        "attn_output": (("always", GGMLType.IQ3_S),),
    },
    "IQ1_S": {
        "token_embd": (("always", GGMLType.Q2_K),),
        "attn_v": (("gqa>=4", GGMLType.Q4_K), ("always", GGMLType.Q2_K)),
        "ffn_down": (("i<n/8", GGMLType.Q2_K),),
        "attn_output": (("always", GGMLType.IQ2_XXS),),
    },
    "IQ1_M": {
        "token_embd": (("always", GGMLType.Q2_K),),
        "attn_v": (("gqa>=4", GGMLType.Q4_K), ("always", GGMLType.Q2_K)),
        "ffn_down": (("i<n/8", GGMLType.Q2_K),),
        "attn_output": (("always", GGMLType.IQ2_XXS),),
    },
}

# file types whose output head (and a tied token_embd) gets another type than OUTPUT_TYPE
OUTPUT_TYPE_BY_FTYPE: dict[str, GGMLType] = {
    "IQ3_XXS": GGMLType.Q5_K,
    "IQ2_XXS": GGMLType.Q5_K, "IQ2_XS": GGMLType.Q5_K, "IQ2_S": GGMLType.Q5_K, "IQ2_M": GGMLType.Q5_K,
    "IQ1_S": GGMLType.Q5_K, "IQ1_M": GGMLType.Q5_K,
}

# tensor_requires_imatrix: type -> the file types it needs an imatrix in (None: any)
IMATRIX_REQUIRED: dict[GGMLType, frozenset[str] | None] = {
    GGMLType.IQ3_XXS: None, GGMLType.IQ2_XXS: None, GGMLType.IQ2_XS: None, GGMLType.IQ2_S: None,
    GGMLType.IQ1_M: None, GGMLType.IQ1_S: None,
    GGMLType.Q2_K: frozenset({"Q2_K_S"}),
}
IMATRIX_EXEMPT_NAMES: frozenset[str] = frozenset({"token_embd.weight", "per_layer_token_embd.weight", "output.weight"})

# the output tensor (and a tied token_embd): Q8_0 when ne[0] misfits the default's blocks, else Q6_K
OUTPUT_UNALIGNED_TYPE = GGMLType.Q8_0
OUTPUT_TYPE = GGMLType.Q6_K
OUTPUT_KEEPS_DEFAULT: frozenset[GGMLType] = frozenset({GGMLType.Q8_0})

# FALLBACK and LAST_RESORT_TYPE (tensor_type_fallback) live in rules.py

# note prefixes a caller counts or filters by
NOTE_KEPT = "kept"
NOTE_FALLBACK = "fallback"
# the type reported for a tensor llama-quantize leaves alone when the caller gave no input types
KEEP = "keep"

# loader order: llama_model_loader::weight_name_comparer reads the layer with sscanf("blk.%d.")
_LAYER = re.compile(r"blk\.\s*([+-]?\d+)")



def _use_more_bits(i: int, n: int) -> bool:
    """The Q4_K_M/Q5_K_M layer pattern: the first and last eighth, and every third layer between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@dataclass(frozen=True)
class _Where:
    i: int  # tensors of this rule group typed so far
    n: int  # their total (n_attention_wv, or block_count for ffn_down, ffn_gate, ffn_up)
    n_gqa: int  # head_count // head_count_kv (layer 0)
    has_imatrix: bool = False  # quantizing with an importance matrix (qs.has_imatrix)


CONDITIONS: dict[str, Callable[[_Where], bool]] = {
    "always": lambda w: True,
    "gqa>=4": lambda w: w.n_gqa >= 4,
    "i<2": lambda w: w.i < 2,
    "i<4": lambda w: w.i < 4,
    "i<n/8": lambda w: w.i < w.n // 8,
    "i<n/16": lambda w: w.i < w.n // 16,
    "more_bits": lambda w: _use_more_bits(w.i, w.n),
    "n/8<=i<7n/8": lambda w: w.n // 8 <= w.i < 7 * w.n // 8,
    "no_imatrix": lambda w: not w.has_imatrix,
    "no_imatrix&i<n/8": lambda w: not w.has_imatrix and w.i < w.n // 8,
}


def requires_imatrix(name: str, t: GGMLType, ftype: str) -> bool:
    """tensor_requires_imatrix: does llama-quantize refuse to write tensor ``name`` as ``t`` in ``ftype`` without an imatrix?"""
    if name in IMATRIX_EXEMPT_NAMES or t not in IMATRIX_REQUIRED:
        return False
    only_in = IMATRIX_REQUIRED[t]
    return only_in is None or ftype in only_in


def resolve_ftype(ftype: str) -> str:
    """The canonical file-type name for what a user typed (case-insensitive, aliases resolved)."""
    name = ftype.upper()
    name = FTYPE_ALIASES.get(name, name)
    if name not in FTYPES:
        raise ValueError(f"unknown quantization type {ftype!r}; choose one of {', '.join([*FTYPES, *FTYPE_ALIASES])}")
    return name


def n_dims(ne: Sequence[int]) -> int:
    """ggml_n_dims: trailing dimensions of size 1 do not count; at least 1."""
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return max(n, 1)


def not_quantized_reason(name: str, ne: Sequence[int]) -> str | None:
    """Why tensor_allows_quantization (default options) says no, or None when it says yes."""
    if n_dims(ne) < 2:
        return "1-D"
    # llama.cpp's rfind("weight") == size() - 6 is size_t: a 5-character name wraps to npos and passes
    if not (name.endswith(QUANTIZED_SUFFIX) or (len(name) == 5 and QUANTIZED_SUFFIX not in name)):
        return f"name does not end in {QUANTIZED_SUFFIX!r}"
    if name in NOT_QUANTIZED_NAMES:
        return "never quantized"
    hit = next((s for s in NOT_QUANTIZED_SUBSTRINGS if s in name), None)
    return None if hit is None else f"name contains {hit!r}"


def is_quantizable(name: str, ne: Sequence[int]) -> bool:
    """tensor_allows_quantization with default options."""
    return not_quantized_reason(name, ne) is None


def category(name: str) -> str:
    """tensor_get_category: "output", "token_embd", one of CATEGORY_SUBSTRINGS' names, or "other"."""
    if name in OUTPUT_NAMES:
        return "output"
    if name in TOKEN_EMBD_NAMES:
        return "token_embd"
    return next((cat for sub, cat in CATEGORY_SUBSTRINGS if sub in name), "other")


def loader_order(names: Sequence[str]) -> list[int]:
    """Indices of ``names`` in llama-quantize's order (and the order of the tensors it writes)."""

    def sort_key(i: int) -> tuple[int, bytes]:
        m = _LAYER.match(names[i])
        return (int(m.group(1)) if m else -1, names[i].encode())

    return sorted(range(len(names)), key=sort_key)


def _block(t: GGMLType) -> int:
    return BLOCK_GEOMETRY[t][0]


class NoFallback(ValueError):
    """A tensor's rows do not fill the type's blocks and tensor_type_fallback has no other type for it."""


def _fallback(ncols: int, t: GGMLType) -> tuple[GGMLType, str | None]:
    """tensor_type_fallback: (type, note) -- note is None when ne[0] fits the type's blocks."""
    if ncols % _block(t) == 0:
        return t, None
    if t in FALLBACK:
        new = FALLBACK[t]
    elif _block(t) <= 32:
        new = t
    else:
        raise NoFallback(f"ne[0]={ncols} is not a multiple of {_block(t)} ({t.name}), and llama-quantize defines no "
                         f"fallback for {t.name}: it refuses such a tensor too")
    if ncols % _block(new) != 0:
        new = LAST_RESORT_TYPE
    return new, f"{NOTE_FALLBACK}: ne[0]={ncols} is not a multiple of {_block(t)} ({t.name}) -> {new.name}"


def _infer_n_layer(names: Sequence[str]) -> int:
    layers = [int(m.group(1)) for n in names if (m := _LAYER.match(n))]
    return max(layers) + 1 if layers else 0


def _infer_n_gqa(tensors: Sequence[tuple[str, tuple[int, ...]]]) -> int:
    """head_count // head_count_kv from layer 0's attn_q / attn_k rows (both H*D and KV*D)."""
    shapes = {cat: ne for name, ne in tensors if (cat := category(name)) in ("attn_q", "attn_k") and name.startswith("blk.0.")}
    q, k = shapes.get("attn_q", ()), shapes.get("attn_k", ())
    if len(q) < 2 or len(k) < 2 or k[1] == 0:
        return 1
    return q[1] // k[1]


@dataclass(frozen=True)
class TypeOverrides:
    """llama-quantize's per-tensor options (llama_model_quantize_params); docs/quantize.md says what each does."""

    tensor_types: tuple[tuple[str, GGMLType], ...] = ()
    output_tensor_type: GGMLType | None = None
    token_embedding_type: GGMLType | None = None
    leave_output_tensor: bool = False
    pure: bool = False


NO_OVERRIDES = TypeOverrides()
NOTE_MANUAL = "--tensor-type"


def choose_quant_types(tensors: list[tuple[str, tuple[int, ...]]], ftype: str, *, input_types: Sequence[str] | None = None,
                       n_layer: int | None = None, n_head: int | None = None, n_head_kv: int | None = None,
                       overrides: TypeOverrides = NO_OVERRIDES, has_imatrix: bool = False) -> tuple[int, list[tuple[str, str]]]:
    """The type llama-quantize gives each tensor for ``ftype``: (general.file_type, [(type name, note)]); docs/quantizers.md."""
    name_ft = resolve_ftype(ftype)
    file_type, default = FTYPES[name_ft]
    names = [n for n, _ in tensors]
    if input_types is not None and len(input_types) != len(tensors):
        raise ValueError("input_types must have one entry per tensor")
    nl = _infer_n_layer(names) if n_layer is None else n_layer
    if n_head is not None:
        kv = n_head if n_head_kv is None else n_head_kv  # llama.cpp: head_count_kv defaults to head_count
        gqa = 0 if kv == 0 else n_head // kv
    else:
        gqa = _infer_n_gqa(tensors)
    cats = [category(n) for n in names]
    n_attn_v = sum(c in ATTN_V_LIKE for c in cats)
    tied = not any(c == "output" for c in cats)  # no output.weight: token_embd doubles as the output
    rules = MIX_RULES.get(name_ft, {})
    seen = {"attn_v": 0, "ffn_down": 0, "ffn_gate": 0, "ffn_up": 0}
    totals = {"attn_v": n_attn_v, "ffn_down": nl, "ffn_gate": nl, "ffn_up": nl}

    patterns = [(compile_pattern(p.lower()), t) for p, t in overrides.tensor_types]  # bounded: user patterns
    out: list[tuple[str, str]] = [("", "")] * len(tensors)
    for idx in loader_order(names):
        name, ne = tensors[idx]
        src = input_types[idx] if input_types is not None else None
        reason = not_quantized_reason(name, ne)
        if reason is None and overrides.leave_output_tensor and name in OUTPUT_NAMES:
            reason = "--leave-output-tensor"
        if reason is not None:
            out[idx] = (src or KEEP, f"{NOTE_KEPT}: {reason}")
            continue
        cat = cats[idx]
        note = f"{name_ft} default"
        new = default
        manual = None
        given = None  # a type given for the tensor outright: llama_tensor_get_type returns it as is
        if overrides.token_embedding_type is not None and cat == "token_embd" and not (
                name == PER_LAYER_TOKEN_EMBD and any(p.search(name) for p, _ in patterns)):
            new = given = overrides.token_embedding_type
            note = "--token-embedding-type"
        elif overrides.output_tensor_type is not None and cat == "output":
            new = given = overrides.output_tensor_type
            note = "--output-tensor-type"
        elif default not in FLOAT_TYPES:  # a plain float file type: no mixes, no fallback
            manual = next(((p.pattern, t) for p, t in patterns if p.search(name)), None)
            if manual is not None:
                new, note = manual[1], f"{NOTE_MANUAL} {manual[0]}"
            elif overrides.pure:
                note = "--pure"
            elif cat == "output" or (tied and cat == "token_embd"):
                if overrides.output_tensor_type is not None:  # a tied token_embd doubles as the output
                    new, note = overrides.output_tensor_type, "--output-tensor-type (tied token_embd)"
                elif ne[0] % _block(default) != 0:
                    new, note = OUTPUT_UNALIGNED_TYPE, f"output: ne[0] does not fill {default.name} blocks"
                elif default not in OUTPUT_KEEPS_DEFAULT:
                    new = OUTPUT_TYPE_BY_FTYPE.get(name_ft, OUTPUT_TYPE)
                    note = "output" + (" (tied token_embd)" if cat == "token_embd" else "")
            else:
                group = "attn_v" if cat in ATTN_V_LIKE else cat
                for cond, t in rules.get(group, ()):
                    where = _Where(seen.get(group, 0), totals.get(group, 0), gqa, has_imatrix)
                    if CONDITIONS[cond](where):
                        new, note = t, f"{name_ft} mix: {group} {cond} (i={where.i}, n={where.n})"
                        break
                if group in seen:
                    seen[group] += 1
            try:
                new, fb = _fallback(ne[0], new)
            except NoFallback as e:
                raise NoFallback(f"{name}: {e}") from None
            note = fb or note
        if given is not None and ne[0] % _block(given) != 0:  # taken as is, with no fallback: it must fit
            raise ValueError(f"{name}: {note} {given.name} needs rows of whole {_block(given)}-value blocks, ne[0] is {ne[0]}")
        if src is not None and src != new.name:
            cur = GGMLType[src]
            # llama_tensor_dequantize_impl refuses anything but F32/F16/BF16 or a quantized type
            if cur not in FLOAT_TYPES and _block(cur) > 1:
                raise ValueError(f"{name}: llama-quantize refuses to requantize {src} to {new.name} (no --allow-requantize)")
            if cur not in FLOAT_TYPES:
                raise ValueError(f"{name}: llama-quantize cannot convert a {src} tensor to {new.name}")
        out[idx] = (new.name, note)
    return file_type, out


# --- raising a tensor's type (quantize --min-acceptance)

# the types a tensor group is raised through, lowest first, one per bits-per-weight step
RAISE_LADDER: tuple[GGMLType, ...] = (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                                      GGMLType.Q8_0)
# the tensor groups raised together: per layer (attention, FFN), fc, the drafter's own output head
LAYER_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attn", ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")),
    ("ffn", ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")),
)
GLOBAL_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (("fc", ("fc.weight",)), ("output", ("output.weight",)))


def bits_per_weight(t: GGMLType) -> float:
    """Bits per weight of a ggml type (block bytes x 8 / block values)."""
    block, size = BLOCK_GEOMETRY[t]
    return 8.0 * size / block


def fitting_type(ncols: int, t: GGMLType) -> GGMLType:
    """The type llama-quantize writes for a tensor of rows ``ncols`` given ``t`` (its block fallback)."""
    return _fallback(ncols, t)[0]


def raise_ladder(writable: Collection[GGMLType] = ()) -> tuple[GGMLType, ...]:
    """RAISE_LADDER with, by bits per weight, the ``writable`` types only an imatrix makes usable (IMATRIX_REQUIRED in any file type)."""
    extra = [t for t, only_in in IMATRIX_REQUIRED.items() if only_in is None and t in writable and t not in RAISE_LADDER]
    return tuple(sorted((*RAISE_LADDER, *extra), key=bits_per_weight))


def raised_type(current: GGMLType, ncols: int, ladder: Sequence[GGMLType] = RAISE_LADDER) -> GGMLType | None:
    """The first ``ladder`` type above ``current`` with more bits per weight after the block fallback; None at the top."""
    for t in ladder:
        fit = fitting_type(ncols, t)
        if bits_per_weight(fit) > bits_per_weight(current):
            return fit
    return None


def fallback_count(choices: Sequence[tuple[str, str]]) -> int:
    """How many choices took the block-size fallback (llama-quantize's printed count)."""
    return sum(note.startswith(NOTE_FALLBACK) for _, note in choices)


# `sweep`'s and `publish`'s default --types (data here so the command line need not import them)
DEFAULT_SWEEP_TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q4_0", "Q3_K_M", "Q2_K")
DEFAULT_RELEASE_TYPES = ("BF16", "Q8_0", "Q6_K", "Q4_K_M")
