"""Is an upstream-dialect DFlash GGUF what llama.cpp 0c1e57098 will load, and what it claims to be?

Each check reads the format tables (format.keys, format.tensors, format.rules) and the parsed
container; nothing here spells a key or a tensor name. ``DrafterView`` gathers the hyper-parameters
once, tolerating missing or mistyped keys (the key checks report those), so every later check can
still say something useful about a broken file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ..drafter import Drafter
from ..format.family import draft_tokens_per_block, member_of
from ..format.ggml import GGMLType
from ..format.keys import ADD_SPECIAL_TOKEN_KEYS, ARCH, KEYS, SPECIAL_TOKEN_ID_KEYS, ValueType, key
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
from ..sources.gguf import GGUFFile, GGUFTensor
from ..sources.gguf_drafter import as_float, as_int, as_ints, drafter_from_gguf
from .family import check_family
from .report import FAIL, SKIP, WARN, Check, check_from, passed

_DIM_TOKEN = re.compile(r"([*/])")


def type_name(vtype: ValueType, sub: ValueType | None) -> str:
    return f"ARRAY[{sub.name}]" if vtype == ValueType.ARRAY and sub is not None else vtype.name


def expected_types(short: str) -> tuple[tuple[ValueType, ValueType | None], ...]:
    _, vtype, sub = KEYS[short]
    return ((vtype, sub), *ALSO_ACCEPTED.get(short, ()))


def known_keys() -> dict[str, tuple[tuple[ValueType, ValueType | None], ...]]:
    """Every key llama.cpp reads from a dflash drafter, with the value types it accepts."""
    out = {key(short): expected_types(short) for short in KEYS}
    out.update({k: ((ValueType.UINT32, None),) for k in SPECIAL_TOKEN_ID_KEYS.values()})
    out.update({k: ((ValueType.BOOL, None),) for k in ADD_SPECIAL_TOKEN_KEYS.values()})
    return out


_int, _float, _ints = as_int, as_float, as_ints


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


@dataclass
class DrafterView:
    """The Drafter read leniently from the file (None where a key is missing or mistyped), next to
    the raw key view that type checks and per-layer arrays need."""

    d: Drafter
    g: GGUFFile
    per_layer: dict[str, list[int]] = field(default_factory=dict)
    tokens: list[bytes] | None = None

    @classmethod
    def of(cls, g: GGUFFile) -> DrafterView:
        f = cls(drafter_from_gguf(g, strict=False), g)
        for short in PER_LAYER_KEYS:
            arr = _ints(g.metadata.get(key(short)))
            if arr is not None:
                f.per_layer[short] = arr
        tok = g.metadata.get(key("tok_tokens"))
        if tok is not None and tok.vtype == ValueType.ARRAY and tok.sub == ValueType.STRING:
            f.tokens = tok.value
        return f

    @property
    def n_layer(self) -> int | None:
        return self.d.n_layers

    @property
    def target_layers(self) -> list[int] | None:
        return self.d.target_layers

    @property
    def dims(self) -> dict[str, int | None]:
        d = self.d
        V = d.vocab_size
        return {"E": d.hidden_size, "F": d.intermediate_size, "H": d.n_head, "KV": d.n_head_kv, "D": d.head_dim,
                "T": len(d.target_layers) if d.target_layers is not None else None, "V": V,
                "VD": d.draft_vocab_size if d.draft_vocab_size is not None else V}

    def layer_dims(self, i: int) -> dict[str, int | None]:
        dims = dict(self.dims)
        for short, sym in (("feed_forward_length", "F"), ("head_count", "H"), ("head_count_kv", "KV")):
            arr = self.per_layer.get(short)
            if arr is not None:
                dims[sym] = arr[i] if i < len(arr) else None
        if "head_count_kv" not in self.per_layer and key("head_count_kv") not in self.g.metadata:
            dims["KV"] = dims["H"]
        return dims

    def expected_shape(self, t: GGUFTensor) -> tuple[int | None, ...] | None:
        """The ggml shape llama.cpp's loader demands for this tensor, None when it claims no shape here."""
        gen = generic_name(t.name)
        if gen in EXPECTED_HF_SHAPES:
            spec = tuple(reversed(EXPECTED_HF_SHAPES[gen]))
        elif gen in GGUF_ONLY_SHAPES:
            spec = GGUF_ONLY_SHAPES[gen]
        else:
            return None
        bid = layer_of(t.name)
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


# --- keys -------------------------------------------------------------------------------------

def check_architecture(g: GGUFFile) -> Check:
    v = g.metadata.get(key("architecture"))
    if v is None or v.vtype != ValueType.STRING:
        return Check("architecture", FAIL, f"{key('architecture')} is missing or not a string")
    if v.text() != ARCH:
        return Check("architecture", FAIL, f"{key('architecture')} is {v.text()!r}, llama.cpp's DFlash drafters are {ARCH!r}")
    return passed("architecture", f"{key('architecture')} = {ARCH}")


def check_required_keys(g: GGUFFile) -> Check:
    problems = []
    for short, (need, why) in DRAFTER_KEYS.items():
        if key(short) not in g.metadata:
            problems.append(f"{key(short)} is missing ({need}: {why})")
    return check_from("keys.required", problems, [], f"all {len(DRAFTER_KEYS)} required keys present",
                      f"{len(problems)} required key(s) missing", "")


def check_key_types(g: GGUFFile) -> Check:
    known = known_keys()
    problems, warnings = [], []
    for name, v in g.metadata.items():
        accepted = known.get(name)
        if accepted is None:
            if name.startswith("dflash."):
                warnings.append(f"{name} is not a key llama.cpp reads (a typo, or another dialect's key?)")
            continue
        if (v.vtype, v.sub) not in accepted:
            want = " or ".join(type_name(*t) for t in accepted)
            problems.append(f"{name} is {type_name(v.vtype, v.sub)}, llama.cpp expects {want} "
                            "(\"key ... has wrong type\")")
    return check_from("keys.types", problems, warnings, "every key llama.cpp reads has the type it expects",
                      f"{len(problems)} key(s) with the wrong type", "unknown dflash.* keys")


def check_hparams(f: DrafterView) -> Check:
    md = f.g.metadata
    problems, warnings = [], []
    n, dims = f.n_layer, f.dims
    if n is not None and not 1 <= n <= MAX_LAYERS:
        problems.append(f"block_count {n} is outside 1..{MAX_LAYERS}")
    for short, sym in (("embedding_length", "E"), ("context_length", None)):
        v = dims.get(sym) if sym else _int(md.get(key(short)))
        if v is not None and v <= 0:
            problems.append(f"{key(short)} is {v}")
    for short in PER_LAYER_KEYS:
        arr = f.per_layer.get(short)
        if arr is not None and n is not None and len(arr) != n:
            problems.append(f"{key(short)} has {len(arr)} entries for {n} layers (\"wrong array length\")")
        values = arr if arr is not None else [_int(md.get(key(short)))]
        if any(x is not None and x <= 0 for x in values) and short != "head_count_kv":
            problems.append(f"{key(short)} must be positive, got {values if arr is not None else values[0]}")
    H, KV = dims.get("H"), dims.get("KV")
    if H and KV is not None and (KV <= 0 or H % KV):
        problems.append(f"head_count {H} is not a multiple of head_count_kv {KV}")
    kl, vl = _int(md.get(key("key_length"))), _int(md.get(key("value_length")))
    if kl is not None and vl is not None and kl != vl:
        problems.append(f"key_length {kl} != value_length {vl} (the dflash graph asserts they are equal)")
    E = dims.get("E")
    if kl is None and E and H and E % H:
        problems.append(f"no key_length and embedding_length {E} is not a multiple of head_count {H}")
    # every float the graph multiplies or divides by: NaN, infinite or non-positive values give
    # NaN drafts or a division by zero, silently (llama.cpp checks none of them)
    for short in POSITIVE_FLOAT_KEYS:
        v = _float(md.get(key(short)))
        if v is not None and not (math.isfinite(v) and v > 0):
            problems.append(f"{key(short)} is {v}: it must be a finite positive number")
    rot = _int(md.get(key("rope_dimension_count")))
    D = dims.get("D")
    if rot is not None and D and (rot > D or rot % 2):
        problems.append(f"rope.dimension_count {rot} must be even and at most the head size {D}")
    act = md.get(key("hidden_activation"))
    if act is not None and act.vtype == ValueType.STRING and act.text() not in HIDDEN_ACTIVATIONS:
        problems.append(f"hidden_activation {act.text()!r} is not one of {', '.join(HIDDEN_ACTIVATIONS)} "
                        "(\"unsupported DFlash hidden activation\")")
    rs = md.get(key("rope_scaling_type"))
    if rs is not None and rs.vtype == ValueType.STRING and rs.text() not in ROPE_SCALING_TYPES:
        problems.append(f"rope.scaling.type {rs.text()!r} is not one of {', '.join(ROPE_SCALING_TYPES)}")
    sections = md.get(key("rope_dimension_sections"))
    if sections is not None and sections.vtype == ValueType.ARRAY and len(sections.value) != ROPE_SECTIONS:
        problems.append(f"rope.dimension_sections has {len(sections.value)} entries, llama.cpp wants {ROPE_SECTIONS}")
    hc = _int(md.get(key("hyper_connection_count")))
    if hc:
        warnings.append("hyper_connection.count > 0: the DeepSeek-V4 DSpark backbone, whose keys are not checked here")
    summary = f"{n} layers, hidden {E}, {H}/{KV} heads of {D}, FFN {dims.get('F')}"
    return check_from("hparams", problems, warnings, summary, "hyper-parameters llama.cpp rejects or mis-reads", summary)


def check_target_layers(f: DrafterView) -> Check:
    v = f.g.metadata.get(key("target_layers"))
    if v is None:
        return Check("target_layers", FAIL, f"{key('target_layers')} is missing: \"DFlash model requires 'target_layers' in "
                     "GGUF metadata\"; convert the checkpoint again (its dflash_config.target_layer_ids + 1)")
    ids = f.target_layers
    if ids is None or v.sub not in (ValueType.INT32, ValueType.UINT32):
        return Check("target_layers", FAIL, f"{key('target_layers')} is {type_name(v.vtype, v.sub)}, llama.cpp reads an "
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
    fc = f.g.tensor(FC_TENSOR)
    E = f.dims.get("E")
    if fc is not None and E and fc.ne[0] % E == 0 and fc.ne[0] // E != len(ids):
        problems.append(f"{FC_TENSOR} takes {fc.ne[0] // E} taps of {E} ({fc.ne[0]} inputs) but target_layers lists {len(ids)}")
    return check_from("target_layers", problems, warnings, f"{ids} (llama.cpp layer inputs; checkpoint ids + 1)",
                      "target_layers are unusable", f"{ids}: suspicious")


def check_swa(f: DrafterView) -> Check:
    md = f.g.metadata
    window = _int(md.get(key("sliding_window")))
    pattern_v = md.get(key("sliding_window_pattern"))
    pattern = _ints(pattern_v)
    if not window:
        if pattern_v is not None:
            return Check("swa", WARN, "sliding_window_pattern without a sliding window: llama.cpp ignores it")
        return passed("swa", "no sliding-window attention")
    if pattern_v is None:
        return Check("swa", FAIL, f"sliding_window {window} but no sliding_window_pattern (\"array key not found\")")
    if pattern is None:
        return Check("swa", FAIL, f"sliding_window_pattern is {type_name(pattern_v.vtype, pattern_v.sub)}, not a BOOL/INT32/UINT32 array")
    problems, warnings = [], []
    if len(pattern) > MAX_LAYERS:
        problems.append(f"sliding_window_pattern has {len(pattern)} entries, llama.cpp allows at most {MAX_LAYERS}")
    if f.n_layer is not None and len(pattern) != f.n_layer:
        problems.append(f"sliding_window_pattern has {len(pattern)} entries for {f.n_layer} layers (llama.cpp silently "
                        "treats missing entries as full attention)")
    if not any(pattern):
        warnings.append("a sliding window is set but no layer uses it")
    n_swa = sum(bool(x) for x in pattern)
    return check_from("swa", problems, warnings, f"window {window} on {n_swa} of {len(pattern)} layers",
                      "the sliding-window pattern does not match the layers", "sliding window unused")


def check_block_size(f: DrafterView) -> Check:
    v = f.g.metadata.get(key("block_size"))
    if v is None:
        return Check("block_size", WARN, f"{key('block_size')} is missing: the runtime assumes {DEFAULT_BLOCK_SIZE}, which may "
                     "not be the block the drafter was trained with")
    bs = _int(v)
    if bs is None:
        return Check("block_size", FAIL, f"{key('block_size')} is {type_name(v.vtype, v.sub)}")
    if bs < 2:
        return Check("block_size", FAIL, f"{key('block_size')} is {bs}: the driver clamps --spec-draft-n-max to {max(bs - 1, 0)}, "
                     "nothing is drafted")
    sfa = f.d.sample_from_anchor  # DSpark sampling from the anchor drafts every slot of the block
    return passed("block_size", f"{bs} (pair with --spec-draft-n-max "
                  f"{draft_tokens_per_block(member_of({t.name for t in f.g.tensors}), bs, sfa)})")


def check_tokenizer(f: DrafterView) -> Check:
    md = f.g.metadata
    problems, warnings = [], []
    model = md.get(key("tok_model"))
    if model is None or model.vtype != ValueType.STRING:
        problems.append(f"{key('tok_model')} is missing or not a string")
    tokens_v = md.get(key("tok_tokens"))
    if f.tokens is None:
        problems.append(f"{key('tok_tokens')} is missing or not a string array")
    elif not f.tokens:
        problems.append(f"{key('tok_tokens')} is empty")
    V = f.dims.get("V")
    for short in ("tok_token_type", "tok_scores"):
        arr = md.get(key(short))
        if arr is not None and V is not None and arr.vtype == ValueType.ARRAY and len(arr.value) != V:
            problems.append(f"{key(short)} has {len(arr.value)} entries for {V} tokens")
    if model is not None and model.vtype == ValueType.STRING and model.text() == "gpt2" and key("tok_merges") not in md:
        problems.append(f"a BPE (gpt2) vocabulary without {key('tok_merges')}")
    for kind, name in SPECIAL_TOKEN_ID_KEYS.items():
        tid = _int(md.get(name))
        if kind != "mask" and tid is not None and V is not None and tid >= V:
            warnings.append(f"{name} {tid} is not below the vocabulary size {V}")
    pre = md.get(key("tok_pre"))
    desc = f"{model.text() if model is not None and model.vtype == ValueType.STRING else '?'}"
    if pre is not None and pre.vtype == ValueType.STRING:
        desc += f"/{pre.text()}"
    n = len(tokens_v.value) if tokens_v is not None and tokens_v.vtype == ValueType.ARRAY else 0
    return check_from("tokenizer", problems, warnings, f"{desc}, {n} tokens", "the vocabulary will not load",
                      "special token ids out of range")


def check_mask_token(f: DrafterView) -> Check:
    v = f.g.metadata.get(key("mask_token_id"))
    if v is None:
        return Check("mask_token", FAIL, f"{key('mask_token_id')} is missing: the draft block is filled with the mask "
                     "token, so drafting fails (convert again; the id is dflash_config.mask_token_id)")
    mid = _int(v)
    if mid is None:
        return Check("mask_token", FAIL, f"{key('mask_token_id')} is {type_name(v.vtype, v.sub)}")
    V = f.dims.get("V")
    if V is not None and mid >= V:
        return Check("mask_token", FAIL, f"mask token id {mid} is not below the vocabulary size {V}: llama.cpp discards it")
    return passed("mask_token", f"mask token id {mid}" + (f" < {V}" if V is not None else ""))


# --- tensors ----------------------------------------------------------------------------------

def check_inventory(f: DrafterView) -> Check:
    names = [t.name for t in f.g.tensors]
    if f.n_layer is None:
        return Check("tensors.inventory", SKIP, "block_count unknown: cannot list the tensors llama.cpp claims")
    present = set(names)
    problems, warnings = [], []
    problems += [f"{n} is missing (required)" for n in required_tensor_names(f.n_layer) if n not in present]
    # Gemma-4 DSpark (the one writer of attention.scale) shares K and V by design: no warning for it
    shared_kv_design = key("attention_scale") in f.g.metadata
    for i in range(min(f.n_layer, MAX_LAYERS)):
        for s in LOADER_OPTIONAL_PER_LAYER:
            if layer_name(i, s) not in present and not shared_kv_design:
                warnings.append(f"{layer_name(i, s)} is missing: loads as the shared-KV variant (V = normed K), wrong for a "
                                "Qwen-style drafter")
    roles = {n: tensor_role(n, f.n_layer) for n in names}
    stray = [n for n in names if roles[n] is None]
    for n in stray:
        bid = layer_of(n)
        why = (f"layer {bid} but block_count is {f.n_layer}" if bid is not None and bid >= f.n_layer
               else "t2d is never written: the runtime only uses d2t" if n == "t2d"
               else "not a dflash tensor")
        problems.append(f"{n}: {why}")
    if stray:
        problems.insert(0, f"llama.cpp claims every tensor or stops with \"wrong number of tensors; expected "
                        f"{len(names)}, got {len(names) - len(stray)}\"")
    # DSpark/DFlash2 tensors (HEAD_TENSOR roles) are checked by checks/family.py
    return check_from("tensors.inventory", problems, warnings, f"{len(names)} tensors, all claimed, none missing",
                      "tensor set does not match what llama.cpp loads", "tensor set loads, with remarks")


def check_shapes(f: DrafterView) -> Check:
    problems = []
    checked = 0
    for t in f.g.tensors:
        want = f.expected_shape(t)
        if want is None:
            continue
        checked += 1
        if None in want:
            continue  # a dimension the file does not state; the key checks report it
        if t.ne != want:
            problems.append(f"{t.name} has shape {{{', '.join(map(str, t.ne))}}}, llama.cpp expects "
                            f"{{{', '.join(map(str, want))}}} (\"tensor has wrong shape\")")
    return check_from("tensors.shapes", problems, [], f"{checked} tensor shapes match the hyper-parameters",
                      f"{len(problems)} tensor(s) with the wrong shape", "")


def check_types(f: DrafterView) -> Check:
    problems = []
    for t in f.g.tensors:
        if tensor_role(t.name, f.n_layer or 0) == HEAD_TENSOR:
            continue
        cls = storage_class(t.name, t.ne)
        want = FIXED_TYPES[generic_name(t.name)] if cls == FIXED else VECTOR_TYPE if cls == VECTOR else None
        if want is not None and t.ggml_type.name != want:
            problems.append(f"{t.name} is {t.ggml_type.name}, must be {want}")
    types = sorted({t.ggml_type.name for t in f.g.tensors})
    return check_from("tensors.types", problems, [], f"norms and vectors F32; types used: {', '.join(types)}",
                      f"{len(problems)} tensor(s) stored in the wrong type", "")


def check_tied_head(f: DrafterView) -> Check:
    has_embd, has_out = f.g.tensor(EMBEDDING_TENSOR) is not None, f.g.tensor(OUTPUT_TENSOR) is not None
    if has_embd and not has_out:
        return Check("tied_head", FAIL, f"{EMBEDDING_TENSOR} without {OUTPUT_TENSOR}: llama.cpp then uses the embedding as "
                     f"the output head (tied), while DFlash drafters use the target's own head; add {OUTPUT_TENSOR} or drop "
                     f"{EMBEDDING_TENSOR}")
    if has_embd:
        return passed("tied_head", "own embedding and own output head (self-contained drafter)")
    if has_out:
        return passed("tied_head", "own output head, target's embedding")
    return passed("tied_head", "embedding and output head shared from the target at run time")


def check_d2t(f: DrafterView) -> Check:
    t = f.g.tensor(D2T_TENSOR)
    if t is None:
        return passed(D2T_TENSOR, "no d2t: the drafter predicts over the full target vocabulary")
    problems, warnings = [], []
    V, VD = f.dims.get("V"), t.ne[0]
    if len(t.ne) != 1:
        problems.append(f"d2t has {len(t.ne)} dimensions, must be 1")
    if t.ggml_type != GGMLType.I64:
        problems.append(f"d2t is {t.ggml_type.name}; the graph asserts I64")
    if f.g.tensor(OUTPUT_TENSOR) is None:
        problems.append(f"d2t without {OUTPUT_TENSOR}: a reduced vocabulary needs the drafter's own head {{E, Vd}}")
    if V is not None and VD > V:
        problems.append(f"d2t maps {VD} draft ids, more than the {V} tokens of the vocabulary")
    elif V is not None and VD == V:
        warnings.append(f"d2t maps all {V} tokens: a full vocabulary needs no d2t")
    if not problems:
        ids = f.g.tensor_bytes(t).view("<i8")
        bad = int(np.count_nonzero((ids < 0) | (ids >= (V if V is not None else np.iinfo(np.int64).max))))
        if bad:
            problems.append(f"{bad} d2t entries are outside [0, {V}) (d2t holds absolute target ids)")
        elif len(np.unique(ids)) != len(ids):
            problems.append("d2t maps two draft ids to the same target id")
    return check_from(D2T_TENSOR, problems, warnings, f"{VD} draft ids -> target ids, unique and in range",
                      "d2t is unusable", "d2t present but redundant")


def semantic_checks(g: GGUFFile) -> tuple[DrafterView, list[Check]]:
    f = DrafterView.of(g)
    checks = [
        check_architecture(g), check_required_keys(g), check_key_types(g), check_hparams(f), check_target_layers(f),
        check_swa(f), check_block_size(f), check_tokenizer(f), check_mask_token(f), check_inventory(f),
        check_shapes(f), check_types(f), check_tied_head(f), check_d2t(f), check_family(f),
    ]
    return f, checks


def skipped_semantics(reason: str) -> list[Check]:
    ids = ("architecture", "keys.required", "keys.types", "hparams", "target_layers", "swa", "block_size", "tokenizer",
           "mask_token", "tensors.inventory", "tensors.shapes", "tensors.types", "tied_head", D2T_TENSOR, "family")
    return [Check(i, SKIP, reason) for i in ids]

