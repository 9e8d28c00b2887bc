"""Is an upstream-dialect DFlash GGUF what llama.cpp 0c1e57098 will load, and what it claims to be?

Each check reads the format tables and one lenient reading of the file (``Reading``): values from the
Drafter (None where missing or mistyped), presence and types from the reader's findings, so every
check says something about a broken file. Nothing here spells a key or a tensor name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..drafter import Drafter, DrafterTensor
from ..format.family import draft_tokens_per_block, member_of
from ..format.keys import (
    ADD_SPECIAL_TOKEN_KEYS,
    ARCH,
    ARCH_PREFIX,
    I32_MAX,
    INT_TYPES,
    KEYS,
    SPECIAL_TOKEN_ID_KEYS,
    TOKENIZER_MODEL_BPE,
    TOKENIZER_PREFIX,
    U32_MAX,
    ValueType,
    key,
)
from ..format.rules import (
    ALSO_ACCEPTED,
    D2T_TENSOR,
    DEFAULT_BLOCK_SIZE,
    DRAFTER_KEYS,
    EMBEDDING_TENSOR,
    FC_TENSOR,
    FIXED,
    FIXED_TYPES,
    GGUF_ONLY_SHAPES,
    HEAD_GLOBAL,
    HEAD_PER_LAYER,
    HIDDEN_ACTIVATIONS,
    INT32_T,
    INTEGER_READERS,
    LOADER_OPTIONAL_PER_LAYER,
    MAX_LAYERS,
    OPTIONAL_GLOBAL,
    OPTIONAL_PER_LAYER,
    OUTPUT_TENSOR,
    PER_LAYER_KEYS,
    POSITIVE_FLOAT_KEYS,
    ROPE_SCALING_TYPES,
    ROPE_SECTIONS,
    VECTOR,
    VECTOR_TYPE,
    storage_class,
)
from ..format.tensors import EXPECTED_HF_SHAPES, REQUIRED_GLOBAL, REQUIRED_PER_LAYER, generic_name, layer_name, layer_of
from ..sources.gguf_drafter import MAX_INT_LIST, KeyFindings
from .family import check_family
from .report import FAIL, SKIP, WARN, Check, check_from, passed

_DIM_TOKEN = re.compile(r"([*/])")


def type_name(vtype: ValueType, sub: ValueType | None) -> str:
    """A value type as text, ``ARRAY[ELEMENT]`` for arrays."""
    return f"ARRAY[{sub.name}]" if vtype == ValueType.ARRAY and sub is not None else vtype.name


def expected_types(short: str) -> tuple[tuple[ValueType, ValueType | None], ...]:
    """The value types llama.cpp accepts for a key."""
    _, vtype, sub = KEYS[short]
    return ((vtype, sub), *ALSO_ACCEPTED.get(short, ()))


def known_keys() -> dict[str, tuple[tuple[ValueType, ValueType | None], ...]]:
    """Every key llama.cpp reads from a dflash drafter, with the value types it accepts."""
    out = {key(short): expected_types(short) for short in KEYS}
    out.update({k: ((ValueType.UINT32, None),) for k in SPECIAL_TOKEN_ID_KEYS.values()})
    out.update({k: ((ValueType.BOOL, None),) for k in ADD_SPECIAL_TOKEN_KEYS.values()})
    return out


def eval_dim(expr: str, dims: dict[str, int | None]) -> int | None:
    """Evaluate a shape expression such as 'T*E' or 'D/2' (exact division only); None if unknown."""
    parts = _DIM_TOKEN.split(expr)
    total: int | None = None
    op = "*"
    for tok in parts:
        if tok in ("*", "/"):
            op = tok
            continue
        v = int(tok) if tok.isdigit() else dims.get(tok)
        if v is None:
            return None
        if total is None:
            total = v
        elif op == "*":
            total *= v
        elif v == 0 or total % v:
            return None
        else:
            total //= v
    return total


def ne_of(t: DrafterTensor) -> tuple[int, ...]:
    """A tensor's ggml shape (ne, fastest first): its PyTorch shape reversed."""
    return tuple(reversed(t.shape))


@dataclass
class Reading:
    """What the lenient reader made of one file: the Drafter (None where a key is missing or mistyped) and its findings."""

    d: Drafter
    f: KeyFindings

    @property
    def n_layer(self) -> int | None:
        """The file's layer count."""
        return self.d.n_layers

    @property
    def target_layers(self) -> list[int] | None:
        """The file's ``target_layers``."""
        return self.d.target_layers

    @property
    def names(self) -> set[str]:
        """Every tensor name of the file."""
        return {t.gguf_name for t in self.d.tensors}

    def tensor(self, name: str) -> DrafterTensor | None:
        """The tensor with this GGUF name, or None."""
        return self.d.tensor(name)

    @property
    def dims(self) -> dict[str, int | None]:
        """The file's dimensions by symbol (E, F, H, KV, D, T, V, VD), None where unknown."""
        d = self.d
        V = d.vocab_size
        return {"E": d.hidden_size, "F": d.intermediate_size, "H": d.n_head, "KV": d.n_head_kv, "D": d.head_dim,
                "T": len(d.target_layers) if d.target_layers is not None else None, "V": V,
                "VD": d.draft_vocab_size if d.draft_vocab_size is not None else V}

    def layer_dims(self, i: int) -> dict[str, int | None]:
        """The dimensions of layer ``i``: the file-wide ones with its per-layer values over them."""
        dims = dict(self.dims)
        for short, sym in (("feed_forward_length", "F"), ("head_count", "H"), ("head_count_kv", "KV")):
            arr = self.f.per_layer.get(short)
            if arr is not None:
                dims[sym] = arr[i] if i < len(arr) else None
        if "head_count_kv" not in self.f.per_layer and not self.f.has("head_count_kv"):
            dims["KV"] = dims["H"]
        return dims

    def expected_shape(self, t: DrafterTensor) -> tuple[int | None, ...] | None:
        """The ggml shape llama.cpp's loader demands for this tensor, None when it claims no shape here."""
        gen = generic_name(t.gguf_name)
        if gen in EXPECTED_HF_SHAPES:
            spec = tuple(reversed(EXPECTED_HF_SHAPES[gen]))
        elif gen in GGUF_ONLY_SHAPES:
            spec = GGUF_ONLY_SHAPES[gen]
        else:
            return None
        bid = layer_of(t.gguf_name)
        dims = self.layer_dims(bid) if bid is not None else self.dims
        return tuple(eval_dim(e, dims) for e in spec)


REQUIRED_TENSOR, OPTIONAL_TENSOR, HEAD_TENSOR = "required", "optional", "head"


def tensor_role(name: str, n_layer: int) -> str | None:
    """How the dflash loader treats a tensor of a drafter with n_layer layers; None: it never claims it."""
    bid = layer_of(name)
    if bid is None:
        return (REQUIRED_TENSOR if name in REQUIRED_GLOBAL else OPTIONAL_TENSOR if name in OPTIONAL_GLOBAL
                else HEAD_TENSOR if name in HEAD_GLOBAL else None)
    if bid >= n_layer or name != layer_name(bid, generic_name(name)):
        return None
    gen = generic_name(name)
    if gen in LOADER_OPTIONAL_PER_LAYER or gen in OPTIONAL_PER_LAYER:
        return OPTIONAL_TENSOR
    return REQUIRED_TENSOR if gen in REQUIRED_PER_LAYER else HEAD_TENSOR if gen in HEAD_PER_LAYER else None


def required_tensor_names(n_layer: int) -> list[str]:
    """Every tensor the loader requires, in file order (layers capped at llama.cpp's maximum)."""
    per = range(min(n_layer, MAX_LAYERS))
    return [*REQUIRED_GLOBAL, *(layer_name(i, s) for i in per for s in REQUIRED_PER_LAYER if s not in LOADER_OPTIONAL_PER_LAYER)]


# --- keys

def _type(r: Reading, short: str) -> str:
    t = r.f.type_of(short)
    return type_name(*t) if t is not None else "missing"


def check_architecture(r: Reading) -> Check:
    """The ``architecture`` check: ``general.architecture`` is the string ``dflash``."""
    t = r.f.type_of("architecture")
    if t is None or t[0] != ValueType.STRING:
        return Check("architecture", FAIL, f"{key('architecture')} is missing or not a string")
    if r.f.architecture != ARCH:
        return Check("architecture", FAIL, f"{key('architecture')} is {r.f.architecture!r}, llama.cpp's DFlash drafters are {ARCH!r}")
    return passed("architecture", f"{key('architecture')} = {ARCH}")


def check_required_keys(r: Reading) -> Check:
    """The ``keys.required`` check: every key llama.cpp needs is present."""
    problems = []
    for short, (need, why) in DRAFTER_KEYS.items():
        if not r.f.has(short):
            problems.append(f"{key(short)} is missing ({need}: {why})")
    return check_from("keys.required", problems, [], f"all {len(DRAFTER_KEYS)} required keys present",
                      f"{len(problems)} required key(s) missing", "")


def _too_long(short: str, n: int) -> str:
    return f"{key(short)} has {n} entries; llama.cpp reads at most {MAX_LAYERS} (\"array length ... exceeds max\")"


def check_key_types(r: Reading) -> Check:
    """The ``keys.types`` check: every key llama.cpp reads has a value type it accepts; unknown arch keys warn."""
    known = known_keys()
    problems, warnings = [], []
    for name, (vtype, sub) in r.f.types.items():
        accepted = known.get(name)
        if accepted is None:
            if name.startswith(ARCH_PREFIX):
                warnings.append(f"{name} is not a key llama.cpp reads (a typo, or another dialect's key?)")
            continue
        if (vtype, sub) not in accepted:
            want = " or ".join(type_name(*t) for t in accepted)
            problems.append(f"{name} is {type_name(vtype, sub)}, llama.cpp expects {want} "
                            "(\"key ... has wrong type\")")
    for short, n in r.f.lengths.items():  # arrays too long to read at all (never expanded, see MAX_INT_LIST)
        if n > MAX_INT_LIST and not key(short).startswith(TOKENIZER_PREFIX) and r.f.types[key(short)][1] in INT_TYPES | {ValueType.BOOL}:
            problems.append(_too_long(short, n))
    return check_from("keys.types", problems, warnings, "every key llama.cpp reads has the type it expects",
                      f"{len(problems)} key(s) with the wrong type", "unknown dflash.* keys")


# the float keys the graph multiplies or divides by, and where the Drafter keeps each; the RoPE
# scaling factor is read as the file says it (the Drafter keeps it only for a scaling type it runs)
_FLOAT_FIELDS: dict[str, str] = {
    "rms_eps": "rms_eps", "rope_freq_base": "rope_theta", "rope_freq_base_swa": "rope_theta_swa",
    "value_scale": "value_scale", "embedding_scale": "embedding_scale", "logit_scale": "logit_scale",
    "final_logit_softcapping": "final_logit_softcapping",
}
assert set(_FLOAT_FIELDS) | {"rope_scaling_factor"} == set(POSITIVE_FLOAT_KEYS)


def _float_value(r: Reading, short: str) -> float | None:
    if short in _FLOAT_FIELDS:
        return getattr(r.d, _FLOAT_FIELDS[short])
    v = r.f.value(short)
    return float(v) if isinstance(v, float) else None


def check_hparams(r: Reading) -> Check:
    """The ``hparams`` check: layer count, sizes, per-layer arrays, head sizes, RoPE, activation and norm values llama.cpp can run."""
    d, f = r.d, r.f
    problems, warnings = [], []
    n, dims = r.n_layer, r.dims
    if n is not None and not 1 <= n <= MAX_LAYERS:
        problems.append(f"block_count {n} is outside 1..{MAX_LAYERS}")
    for short, v in (("embedding_length", dims.get("E")), ("context_length", d.context_length)):
        if v is not None and v <= 0:
            problems.append(f"{key(short)} is {v}")
    scalar = {"feed_forward_length": d.intermediate_size, "head_count": d.n_head,
              "head_count_kv": d.n_head_kv if f.has("head_count_kv") else None}
    for short in PER_LAYER_KEYS:
        arr = f.per_layer.get(short)
        if arr is not None and n is not None and len(arr) != n:
            problems.append(f"{key(short)} has {len(arr)} entries for {n} layers (\"wrong array length\")")
        values = arr if arr is not None else [scalar[short]]
        if any(x is not None and x <= 0 for x in values) and short != "head_count_kv":
            problems.append(f"{key(short)} must be positive, got {values if arr is not None else values[0]}")
    H, KV = dims.get("H"), dims.get("KV")
    if H and KV is not None and (KV <= 0 or H % KV):
        problems.append(f"head_count {H} is not a multiple of head_count_kv {KV}")
    kl = d.head_dim if f.has("key_length") else None
    vl = f.int_value("value_length")
    if kl is not None and vl is not None and kl != vl:
        problems.append(f"key_length {kl} != value_length {vl} (the dflash graph asserts they are equal)")
    E = dims.get("E")
    if kl is None and E and H and E % H:
        problems.append(f"no key_length and embedding_length {E} is not a multiple of head_count {H}")
    # every float the graph multiplies or divides by: NaN, infinite or non-positive values give
    # NaN drafts or a division by zero, silently (llama.cpp checks none of them)
    for short in POSITIVE_FLOAT_KEYS:
        v = _float_value(r, short)
        if v is not None and not (math.isfinite(v) and v > 0):
            problems.append(f"{key(short)} is {v}: it must be a finite positive number")
    rot = d.n_rot
    D = dims.get("D")
    if rot is not None and rot <= 0:
        problems.append(f"{key('rope_dimension_count')} is {rot}: no dimension rotates; llama.cpp checks nothing "
                        "(src/llama-model.cpp reads it with no lower bound) and its rope op then never finishes "
                        "(ggml/src/ggml-cpu/ops.cpp theta_scale = powf(freq_base, -2.0f/n_dims) with n_dims 0)")
    elif rot is not None and D and rot > D:
        problems.append(f"{key('rope_dimension_count')} {rot} exceeds the head size {D}: llama.cpp aborts "
                        "(ggml/src/ggml-cpu/ops.cpp GGML_ASSERT(n_dims <= ne0))")
    elif rot is not None and rot % 2:
        problems.append(f"{key('rope_dimension_count')} {rot} is odd: llama.cpp aborts "
                        "(ggml/src/ggml-cpu/ops.cpp GGML_ASSERT(n_dims % 2 == 0))")
    problems += _section_problems(f.value("rope_dimension_sections"), D, rot if rot is not None else D, warnings)
    act_type = f.type_of("hidden_activation")
    if act_type is not None and act_type[0] == ValueType.STRING and d.hidden_act not in HIDDEN_ACTIVATIONS:
        problems.append(f"hidden_activation {d.hidden_act!r} is not one of {', '.join(HIDDEN_ACTIVATIONS)} "
                        "(\"unsupported DFlash hidden activation\")")
    rs = f.value("rope_scaling_type")
    if isinstance(rs, str) and rs not in ROPE_SCALING_TYPES:
        problems.append(f"rope.scaling.type {rs!r} is not one of {', '.join(ROPE_SCALING_TYPES)}")
    n_sections = f.lengths.get("rope_dimension_sections")
    if n_sections is not None and n_sections != ROPE_SECTIONS:
        problems.append(f"rope.dimension_sections has {n_sections} entries, llama.cpp wants {ROPE_SECTIONS}")
    hc = f.int_value("hyper_connection_count")
    if hc:
        warnings.append("hyper_connection.count > 0: the DeepSeek-V4 DSpark backbone, whose keys are not checked here")
    summary = f"{n} layers, hidden {E}, {H}/{KV} heads of {D}, FFN {dims.get('F')}"
    return check_from("hparams", problems, warnings, summary, "hyper-parameters llama.cpp rejects or mis-reads", summary)


def _section_problems(value: object, D: int | None, n_rot: int | None, warnings: list[str]) -> list[str]:
    """rope.dimension_sections as llama.cpp's M-RoPE runs them (a scalar is broadcast to all 4)."""
    sections = [value] * ROPE_SECTIONS if type(value) is int else value
    if not isinstance(sections, list) or len(sections) != ROPE_SECTIONS or not any(sections):
        return []  # absent, mistyped or miscounted (other checks say so), or all zero: NeoX rope, sections unused
    name = key("rope_dimension_sections")
    if any(s < 0 for s in sections):
        return [f"{name} {sections} has a negative entry: the M-RoPE sections are dimension counts "
                "(ggml/src/ggml-cpu/ops.cpp ggml_mrope_cache_init sums them into sect_dims)"]
    out = []
    if not (sections[0] > 0 or sections[1] > 0 or sections[2] > 0):
        out.append(f"{name} {sections} uses only the fourth section: llama.cpp aborts "
                   "(ggml/src/ggml-cpu/ops.cpp GGML_ASSERT(sections[0] > 0 || sections[1] > 0 || sections[2] > 0))")
    total = sum(sections)
    if D and total > D:
        out.append(f"{name} {sections} sums to {total}, more than the {D} dimensions of a head the rope op "
                   "rotates: llama.cpp aborts (ggml/src/ggml-cpu/ops.cpp GGML_ASSERT(sect_dims <= ne0))")
    elif n_rot and 2 * (total - sections[0]) > 0 and 2 * total > n_rot:
        warnings.append(f"{name} {sections} covers {total} rotary pairs but rope.dimension_count {n_rot} has "
                        f"{n_rot // 2}: the sections past it never rotate")
    return out


def check_key_ranges(r: Reading) -> Check:
    """Every integer key inside the range of the C type llama.cpp reads it into (format.rules.INTEGER_READERS)."""
    problems = []
    for short, (ctype, where) in INTEGER_READERS.items():
        v = r.f.value(short)
        values = v if isinstance(v, list) else [v] if type(v) is int else []
        hi = I32_MAX if ctype == INT32_T else U32_MAX
        bad = [x for x in values if not 0 <= x <= hi]
        if bad:
            how = "turns negative" if ctype == INT32_T and all(x > hi for x in bad) else "is out of range"
            problems.append(f"{key(short)} {v} is outside 0..{hi}: llama.cpp reads it into {ctype}, where it {how} "
                            f"({where})")
    return check_from("keys.ranges", problems, [], "every integer key fits the C type llama.cpp reads it into",
                      f"{len(problems)} integer key(s) llama.cpp would read as another value", "")


def check_target_layers(r: Reading) -> Check:
    """The ``target_layers`` check: present, INT32/UINT32, non-empty, non-negative, distinct, and as many as ``fc`` takes."""
    t = r.f.type_of("target_layers")
    if t is None:
        return Check("target_layers", FAIL, f"{key('target_layers')} is missing: \"DFlash model requires 'target_layers' in "
                     "GGUF metadata\"; convert the checkpoint again (its dflash_config.target_layer_ids + 1)")
    ids = r.target_layers
    if ids is None and r.f.lengths.get("target_layers", 0) > MAX_INT_LIST:
        return Check("target_layers", FAIL, _too_long("target_layers", r.f.lengths["target_layers"]))
    if ids is None or t[1] not in (ValueType.INT32, ValueType.UINT32):
        return Check("target_layers", FAIL, f"{key('target_layers')} is {type_name(*t)}, llama.cpp reads an "
                     "INT32 or UINT32 array")
    if not ids:
        return Check("target_layers", FAIL, f"{key('target_layers')} is empty")
    problems, warnings = [], []
    if any(i < 0 for i in ids):
        problems.append(f"negative layer ids {[i for i in ids if i < 0]} (llama.cpp reads them as huge unsigned ids and aborts)")
    if len(ids) > 1 and len(set(ids)) == 1:
        problems.append(f"all {len(ids)} ids are {ids[0]}: llama.cpp runs, but feeds the same target layer {len(ids)} times, "
                        "so the drafter silently computes something else")
    elif len(set(ids)) != len(ids):
        warnings.append(f"repeated ids in {ids}")
    if ids != sorted(ids):
        warnings.append(f"ids {ids} are not increasing (every published drafter lists them in increasing order)")
    if 0 in ids:
        warnings.append("id 0 taps the token embeddings; converted checkpoints start at 1 (target_layer_ids + 1), so a 0 "
                        "usually means the ids were written without the +1")
    fc = r.tensor(FC_TENSOR)
    E = r.dims.get("E")
    if fc is not None and E:
        width = ne_of(fc)[0]
        if width % E == 0 and width // E != len(ids):
            problems.append(f"{FC_TENSOR} takes {width // E} taps of {E} ({width} inputs) but target_layers lists {len(ids)}")
    return check_from("target_layers", problems, warnings, f"{ids} (llama.cpp layer inputs; checkpoint ids + 1)",
                      "target_layers are unusable", f"{ids}: suspicious")


def check_swa(r: Reading) -> Check:
    """The ``swa`` check: a sliding window comes with a pattern of the right length, type and values."""
    f = r.f
    window = f.int_value("sliding_window")
    pattern_t = f.type_of("sliding_window_pattern")
    pattern = f.value("sliding_window_pattern") if isinstance(f.value("sliding_window_pattern"), list) else None
    if not window:
        if pattern_t is not None:
            return Check("swa", WARN, "sliding_window_pattern without a sliding window: llama.cpp ignores it")
        return passed("swa", "no sliding-window attention")
    if pattern_t is None:
        return Check("swa", FAIL, f"sliding_window {window} but no sliding_window_pattern (\"array key not found\")")
    if pattern is None and f.lengths.get("sliding_window_pattern", 0) > MAX_INT_LIST:
        return Check("swa", FAIL, _too_long("sliding_window_pattern", f.lengths["sliding_window_pattern"]))
    if pattern is None:
        return Check("swa", FAIL, f"sliding_window_pattern is {type_name(*pattern_t)}, not a BOOL/INT32/UINT32 array")
    problems, warnings = [], []
    if len(pattern) > MAX_LAYERS:
        problems.append(f"sliding_window_pattern has {len(pattern)} entries, llama.cpp allows at most {MAX_LAYERS}")
    if r.n_layer is not None and len(pattern) != r.n_layer:
        problems.append(f"sliding_window_pattern has {len(pattern)} entries for {r.n_layer} layers (llama.cpp silently "
                        "treats missing entries as full attention)")
    if not any(pattern):
        warnings.append("a sliding window is set but no layer uses it")
    n_swa = sum(bool(x) for x in pattern)
    return check_from("swa", problems, warnings, f"window {window} on {n_swa} of {len(pattern)} layers",
                      "the sliding-window pattern does not match the layers", "sliding window unused")


def check_block_size(r: Reading) -> Check:
    """The ``block_size`` check: present (else a warning), a number, and at least 2 so something is drafted."""
    if not r.f.has("block_size"):
        return Check("block_size", WARN, f"{key('block_size')} is missing: the runtime assumes {DEFAULT_BLOCK_SIZE}, which may "
                     "not be the block the drafter was trained with")
    bs = r.d.block_size
    if bs is None:
        return Check("block_size", FAIL, f"{key('block_size')} is {_type(r, 'block_size')}")
    if bs < 2:
        return Check("block_size", FAIL, f"{key('block_size')} is {bs}: the driver clamps --spec-draft-n-max to {max(bs - 1, 0)}, "
                     "nothing is drafted")
    sfa = r.d.sample_from_anchor  # DSpark sampling from the anchor drafts every slot of the block
    return passed("block_size", f"{bs} (pair with --spec-draft-n-max "
                  f"{draft_tokens_per_block(member_of(r.names), bs, sfa)})")


def _text(v: object) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


def check_tokenizer(r: Reading) -> Check:
    """The ``tokenizer`` check: the tokenizer model, token list, token types and special ids llama.cpp loads."""
    tok = r.d.tokenizer
    assert tok is not None  # a GGUF reading always keeps the tokenizer keys, even none
    problems, warnings = [], []
    model = tok.kv(key("tok_model"))
    model_text = _text(model.value) if model is not None and model.vtype == ValueType.STRING else None
    if model_text is None:
        problems.append(f"{key('tok_model')} is missing or not a string")
    tokens = tok.kv(key("tok_tokens"))
    token_list = tokens.value if tokens is not None and tokens.vtype == ValueType.ARRAY and tokens.sub == ValueType.STRING else None
    if token_list is None:
        problems.append(f"{key('tok_tokens')} is missing or not a string array")
    elif not len(token_list):
        problems.append(f"{key('tok_tokens')} is empty")
    V = r.dims.get("V")
    for short in ("tok_token_type", "tok_scores"):
        arr = tok.kv(key(short))
        if arr is not None and V is not None and arr.vtype == ValueType.ARRAY and len(arr.value) != V:
            problems.append(f"{key(short)} has {len(arr.value)} entries for {V} tokens")
    if model_text == TOKENIZER_MODEL_BPE and key("tok_merges") not in tok:
        problems.append(f"a BPE ({TOKENIZER_MODEL_BPE}) vocabulary without {key('tok_merges')}")
    for kind, name in SPECIAL_TOKEN_ID_KEYS.items():
        kv = tok.kv(name)
        tid = kv.value if kv is not None and kv.vtype in INT_TYPES else None
        if kind != "mask" and tid is not None and V is not None and tid >= V:
            warnings.append(f"{name} {tid} is not below the vocabulary size {V}")
    pre = tok.kv(key("tok_pre"))
    desc = f"{model_text if model_text is not None else '?'}"
    if pre is not None and pre.vtype == ValueType.STRING:
        desc += f"/{_text(pre.value)}"
    n = len(tokens.value) if tokens is not None and tokens.vtype == ValueType.ARRAY else 0
    return check_from("tokenizer", problems, warnings, f"{desc}, {n} tokens", "the vocabulary will not load",
                      "special token ids out of range")


def check_mask_token(r: Reading) -> Check:
    """The ``mask_token`` check: the mask id is present and inside the vocabulary."""
    if not r.f.has("mask_token_id"):
        return Check("mask_token", FAIL, f"{key('mask_token_id')} is missing: the draft block is filled with the mask "
                     "token, so drafting fails (convert again; the id is dflash_config.mask_token_id)")
    mid = r.d.mask_token_id
    if mid is None:
        return Check("mask_token", FAIL, f"{key('mask_token_id')} is {_type(r, 'mask_token_id')}")
    V = r.dims.get("V")
    if V is not None and mid >= V:
        return Check("mask_token", FAIL, f"mask token id {mid} is not below the vocabulary size {V}: llama.cpp discards it")
    return passed("mask_token", f"mask token id {mid}" + (f" < {V}" if V is not None else ""))


# --- tensors

def check_inventory(r: Reading) -> Check:
    """The ``tensors.inventory`` check: every tensor llama.cpp requires is there, and none it would not claim."""
    names = [t.gguf_name for t in r.d.tensors]
    if r.n_layer is None:
        return Check("tensors.inventory", SKIP, "block_count unknown: cannot list the tensors llama.cpp claims")
    present = set(names)
    problems, warnings = [], []
    problems += [f"{n} is missing (required)" for n in required_tensor_names(r.n_layer) if n not in present]
    # Gemma-4 DSpark (the one writer of attention.scale) shares K and V by design: no warning for it
    shared_kv_design = r.f.has("attention_scale")
    for i in range(min(r.n_layer, MAX_LAYERS)):
        for s in LOADER_OPTIONAL_PER_LAYER:
            if layer_name(i, s) not in present and not shared_kv_design:
                warnings.append(f"{layer_name(i, s)} is missing: loads as the shared-KV variant (V = normed K), wrong for a "
                                "Qwen-style drafter")
    roles = {n: tensor_role(n, r.n_layer) for n in names}
    stray = [n for n in names if roles[n] is None]
    for n in stray:
        bid = layer_of(n)
        why = (f"layer {bid} but block_count is {r.n_layer}" if bid is not None and bid >= r.n_layer
               else "t2d is never written: the runtime only uses d2t" if n == "t2d"
               else "not a dflash tensor")
        problems.append(f"{n}: {why}")
    if stray:
        problems.insert(0, f"llama.cpp claims every tensor or stops with \"wrong number of tensors; expected "
                        f"{len(names)}, got {len(names) - len(stray)}\"")
    # DSpark/DFlash2 tensors (HEAD_TENSOR roles) are checked by validate/family.py
    return check_from("tensors.inventory", problems, warnings, f"{len(names)} tensors, all claimed, none missing",
                      "tensor set does not match what llama.cpp loads", "tensor set loads, with remarks")


def check_shapes(r: Reading) -> Check:
    """The ``tensors.shapes`` check: every tensor's shape is the one the hyper-parameters give."""
    problems = []
    checked = 0
    for t in r.d.tensors:
        want = r.expected_shape(t)
        if want is None:
            continue
        checked += 1
        if None in want:
            continue  # a dimension the file does not state; the key checks report it
        ne = ne_of(t)
        if ne != want:
            problems.append(f"{t.gguf_name} has shape {{{', '.join(map(str, ne))}}}, llama.cpp expects "
                            f"{{{', '.join(map(str, want))}}} (\"tensor has wrong shape\")")
    return check_from("tensors.shapes", problems, [], f"{checked} tensor shapes match the hyper-parameters",
                      f"{len(problems)} tensor(s) with the wrong shape", "")


def check_types(r: Reading) -> Check:
    """The ``tensors.types`` check: every tensor is stored in a type llama.cpp's graph accepts for it."""
    problems = []
    for t in r.d.tensors:
        if tensor_role(t.gguf_name, r.n_layer or 0) == HEAD_TENSOR:
            continue
        cls = storage_class(t.gguf_name, t.shape)
        want = FIXED_TYPES[generic_name(t.gguf_name)] if cls == FIXED else VECTOR_TYPE if cls == VECTOR else None
        if want is not None and t.dtype != want:
            problems.append(f"{t.gguf_name} is {t.dtype}, must be {want}")
    types = sorted({t.dtype for t in r.d.tensors})
    return check_from("tensors.types", problems, [], f"norms and vectors F32; types used: {', '.join(types)}",
                      f"{len(problems)} tensor(s) stored in the wrong type", "")


def check_tied_head(r: Reading) -> Check:
    """The ``tied_head`` check: an embedding without an output head would be used as a tied head."""
    has_embd, has_out = r.tensor(EMBEDDING_TENSOR) is not None, r.tensor(OUTPUT_TENSOR) is not None
    if has_embd and not has_out:
        return Check("tied_head", FAIL, f"{EMBEDDING_TENSOR} without {OUTPUT_TENSOR}: llama.cpp then uses the embedding as "
                     f"the output head (tied), while DFlash drafters use the target's own head; add {OUTPUT_TENSOR} or drop "
                     f"{EMBEDDING_TENSOR}")
    if has_embd:
        return passed("tied_head", "own embedding and own output head (self-contained drafter)")
    if has_out:
        return passed("tied_head", "own output head, target's embedding")
    return passed("tied_head", "embedding and output head shared from the target at run time")


def tensor_ids(t: DrafterTensor) -> np.ndarray:
    """A small integer table's values (d2t), read whole."""
    return np.ascontiguousarray(t.source.rows(0, 1 if len(t.shape) <= 1 else t.shape[0])).view(np.uint8).view("<i8")


def check_d2t(r: Reading) -> Check:
    """The ``d2t`` check: a reduced vocabulary's map is 1-D I64, in range, one-to-one, with the drafter's own head."""
    t = r.tensor(D2T_TENSOR)
    if t is None:
        return passed(D2T_TENSOR, "no d2t: the drafter predicts over the full target vocabulary")
    problems, warnings = [], []
    ne = ne_of(t)
    V, VD = r.dims.get("V"), ne[0]
    if len(ne) != 1:
        problems.append(f"d2t has {len(ne)} dimensions, must be 1")
    if t.dtype != FIXED_TYPES[D2T_TENSOR]:
        problems.append(f"d2t is {t.dtype}; the graph asserts I64")
    if r.tensor(OUTPUT_TENSOR) is None:
        problems.append(f"d2t without {OUTPUT_TENSOR}: a reduced vocabulary needs the drafter's own head {{E, Vd}}")
    if V is not None and VD > V:
        problems.append(f"d2t maps {VD} draft ids, more than the {V} tokens of the vocabulary")
    elif V is not None and VD == V:
        warnings.append(f"d2t maps all {V} tokens: a full vocabulary needs no d2t")
    if not problems:
        ids = tensor_ids(t)
        bad = int(np.count_nonzero((ids < 0) | (ids >= (V if V is not None else np.iinfo(np.int64).max))))
        if bad:
            problems.append(f"{bad} d2t entries are outside [0, {V}) (d2t holds absolute target ids)")
        elif len(np.unique(ids)) != len(ids):
            problems.append("d2t maps two draft ids to the same target id")
    return check_from(D2T_TENSOR, problems, warnings, f"{VD} draft ids -> target ids, unique and in range",
                      "d2t is unusable", "d2t present but redundant")


def semantic_checks(reading: Reading) -> list[Check]:
    """Every semantic check of validate, in report order."""
    r = reading
    return [
        check_architecture(r), check_required_keys(r), check_key_types(r), check_key_ranges(r), check_hparams(r),
        check_target_layers(r),
        check_swa(r), check_block_size(r), check_tokenizer(r), check_mask_token(r), check_inventory(r),
        check_shapes(r), check_types(r), check_tied_head(r), check_d2t(r), check_family(r),
    ]


def skipped_semantics(reason: str) -> list[Check]:
    """Every semantic check, skipped for ``reason``."""
    ids = ("architecture", "keys.required", "keys.types", "keys.ranges", "hparams", "target_layers", "swa", "block_size", "tokenizer",
           "mask_token", "tensors.inventory", "tensors.shapes", "tensors.types", "tied_head", D2T_TENSOR, "family")
    return [Check(i, SKIP, reason) for i in ids]
