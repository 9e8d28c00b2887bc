"""Readers for the rest of the dflash family -> Drafter: DFlash2, DSpark and Gemma-4 DSpark.

Each follows llama.cpp 0c1e57098's converter for the architecture, so the file is byte-identical to
upstream's, and adds the checks upstream leaves to load time. Refused, one line each: what
llama.cpp's loader would refuse, Markov heads other than ``vanilla``, Gemma-4 DSpark checkpoints
outside upstream's requirements, and the DeepSeek-V4 DSpark backbone. Specification: docs/family.md.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ..drafter import ConvPart, Drafter, DrafterTensor, MarkovPart, SelectorPart
from ..errors import ConfigError, InputFileError
from ..format.family import (
    CONF_PROJ,
    CONF_PROJ_BIAS,
    CONV_SELECTOR_KEYS,
    CONV_TENSORS,
    DFLASH2,
    DSPARK,
    DSV4_ROUTE,
    FAMILY_HF_SHAPES,
    GEMMA4_OVERRIDDEN_KEYS,
    MARKOV_HEAD_TYPES,
    MARKOV_TENSORS,
    MARKOV_W1,
    MARKOV_W2,
    ROPE_FREQS_UNROTATED,
    SELECTOR_HIDDEN,
    SELECTOR_NEXT,
    SELECTOR_PREV,
    SELECTOR_TENSORS,
)
from ..format.keys import I32_MAX
from ..format.rules import D2T_TENSOR, EMBEDDING_TENSOR, FC_TENSOR, GGUF_ONLY_SHAPES, LOADER_OPTIONAL_PER_LAYER, OUTPUT_TENSOR
from ..format.tensors import (
    EXPECTED_HF_SHAPES,
    FAMILY_GLOBAL_TENSORS,
    FAMILY_LAYER_TENSORS,
    GEMMA4_LAYER_TENSORS,
    GEMMA4_RENAMED_PREFIXES,
    GLOBAL_TENSORS,
    LAYER_TENSORS,
    REQUIRED_GLOBAL,
    REQUIRED_PER_LAYER,
    ROPE_FREQS_TENSOR,
    generic_name,
    gguf_to_hf,
    layer_name,
    strip_model_prefix,
)
from ..target import Target
from ..tensor_source import ArraySource
from .checkpoint import Checkpoint, merged_text_config
from .zlab import (
    LOCAL_ROPE_THETA_KEYS,
    PARTIAL_ROTARY_KEYS,
    ROPE_THETA_KEYS,
    ConfigView,
    as_f32,
    build_drafter,
    map_tensors,
)

_HF_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_GLOBAL = {**GLOBAL_TENSORS, **FAMILY_GLOBAL_TENSORS}
_LAYER = {**LAYER_TENSORS, **FAMILY_LAYER_TENSORS}
_GEMMA4_LAYER = {**_LAYER, **GEMMA4_LAYER_TENSORS}
# Gemma4TextConfig's RoPE when a config gives none (upstream's Gemma4DSparkModel uses the same)
GEMMA4_DEFAULT_ROPE: dict[str, Any] = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}
GEMMA4_ROPE_TYPES = ("default", "proportional")
GEMMA4_ACTIVATION = "gelu_pytorch_tanh"
GEMMA4_REQUIRED_PER_LAYER = tuple(s for s in REQUIRED_PER_LAYER if s not in LOADER_OPTIONAL_PER_LAYER)  # shared K/V: no v_proj
_LM_HEAD = gguf_to_hf(OUTPUT_TENSOR)


def _family_tensor(name: str) -> bool:
    m = _HF_LAYER.match(name)
    return (m.group(2) in FAMILY_LAYER_TENSORS) if m else name in FAMILY_GLOBAL_TENSORS


def carries_dflash2_parts(ckpt: Checkpoint) -> bool:
    """A z-lab ``DFlashDraftModel`` with DFlash2 keys or tensors, which upstream converts as DFlash2 (asked by the dispatcher)."""
    cfg = merged_text_config(ckpt.config)
    dflash = cfg.get("dflash_config")  # a mistyped dflash_config is refused by the reader this picks
    if isinstance(dflash, dict) and "conv_kernel_size" in dflash:
        return True
    return any(_family_tensor(strip_model_prefix(t.name)) for t in ckpt.tensors)


def refuse_dsv4(ckpt: Checkpoint, target: Target | None) -> Drafter:
    """Refuse a DeepSeek-V4 DSpark checkpoint, naming upstream's ``--dspark`` route."""
    raise ConfigError(DSV4_ROUTE, ckpt.config_path)


# --- DFlash2

def _conv_selector(cv: ConfigView, dflash: ConfigView, d: Drafter) -> None:
    """The four DFlash2 keys: upstream writes them when dflash_config has conv_kernel_size (and needs all four)."""
    present = [k for k in CONV_SELECTOR_KEYS if k in dflash.cfg]
    if not present:
        return
    if "conv_kernel_size" not in dflash.cfg:
        raise cv.error(f"dflash_config has {', '.join(present)} but no conv_kernel_size: the DFlash2 conv/selector keys "
                       f"come together ({', '.join(CONV_SELECTOR_KEYS)})")
    # src/models/dflash.cpp reads them into uint32_t, then compares them as int64_t with n_embd and the
    # block size; values past INT32_MAX only ever come from a broken config
    v = {k: dflash.int_(f"dflash_config.{k}", dflash.get(k), maximum=I32_MAX) for k in CONV_SELECTOR_KEYS}
    d.conv = ConvPart(v["conv_kernel_size"], v["conv_group_size"])  # type: ignore[arg-type]
    d.selector = SelectorPart(v["selector_rank"], v["selector_top_k"])  # type: ignore[arg-type]


def read_dflash2(ckpt: Checkpoint, target: Target | None) -> Drafter:
    """A DFlash2 checkpoint as a Drafter: the z-lab reader plus its conv and selector keys and tensors."""
    cv = ConfigView(merged_text_config(ckpt.config), ckpt.config_path)
    dflash = cv.sub("dflash_config")
    d = build_drafter(ckpt, cv, dflash, target, dialect="z-lab", tensors=False)
    _conv_selector(cv, dflash, d)
    d.tensors = _map_tensors(ckpt, cv, d, member=DFLASH2)
    _finish(d, cv)
    return d


# --- DSpark

def read_dspark(ckpt: Checkpoint, target: Target | None) -> Drafter:
    """A DSpark checkpoint (DFlash-lineage or speculators export) as a Drafter, with its Markov and confidence heads."""
    top = ConfigView(merged_text_config(ckpt.config), ckpt.config_path)
    speculators_shaped = "transformer_layer_config" in top.cfg or "aux_hidden_state_layer_ids" in top.cfg
    # upstream: the config's value, else true for DFlash-lineage exports, false for EAGLE-3-style ones
    sample_from_anchor = top.flag("sample_from_anchor", not speculators_shaped)
    cfg = top.cfg
    layer = top.get("transformer_layer_config")
    if layer is not None:
        cfg = {**cfg, **layer}  # the layer config wins, as in upstream's DSparkModel
    cv = ConfigView(cfg, ckpt.config_path)

    if cv.has("dflash_config"):
        dflash = cv.sub("dflash_config")
    elif cv.has("aux_hidden_state_layer_ids"):
        aux = cv.get("aux_hidden_state_layer_ids")
        if not aux:
            raise cv.error(f"aux_hidden_state_layer_ids must be a non-empty list of integers, got {aux!r}")
        if min(aux) < 1:
            raise cv.error(f"aux_hidden_state_layer_ids {aux} include {min(aux)}: 0 is the token embeddings, not a "
                           "decoder layer")
        # speculators' aux ids are llama.cpp's layer inputs already: target_layers = aux (the builder adds 1)
        dflash = ConfigView({"mask_token_id": cv.get("mask_token_id"), "target_layer_ids": [i - 1 for i in aux]},
                            ckpt.config_path)
    else:
        dflash = ConfigView({k: cfg[k] for k in ("target_layer_ids", "mask_token_id") if k in cfg}, ckpt.config_path)
    _markov_head_type(cv, cv.get("markov_head_type"), dflash.get("markov_head_type"))

    vocab = cv.int_("vocab_size")
    n_draft = cv.int_("draft_vocab_size", cv.get("draft_vocab_size") or vocab)
    if n_draft > vocab:  # type: ignore[operator]
        raise cv.error(f"draft_vocab_size {n_draft} exceeds vocab_size {vocab}")
    target_hidden = cv.get("target_hidden_size")
    if target_hidden is not None and target_hidden != cv.get("hidden_size"):
        raise cv.error(f"target_hidden_size {target_hidden} differs from the draft hidden_size {cv.get('hidden_size')}: "
                       "llama.cpp's dflash has no projection for that")
    d = build_drafter(ckpt, cv, dflash, target, dialect="speculators" if speculators_shaped else "z-lab",
                      draft_vocab_size=n_draft if n_draft < vocab else None, tensors=False)  # type: ignore[operator]
    _conv_selector(cv, dflash, d)
    d.sample_from_anchor = sample_from_anchor
    d.tensors = _map_tensors(ckpt, cv, d, member=DSPARK)
    names = {t.gguf_name for t in d.tensors}
    if d.draft_vocab_size is None and OUTPUT_TENSOR in names and EMBEDDING_TENSOR not in names:
        # full vocabulary: the target's head is shared (upstream drops lm_head). With the drafter's own
        # embeddings kept, upstream's file would tie the head to them; we keep the drafter's head instead.
        d.tensors = [t for t in d.tensors if t.gguf_name != OUTPUT_TENSOR]
    d2t = [t for t in d.tensors if t.gguf_name == D2T_TENSOR]
    d.tensors = [t for t in d.tensors if t.gguf_name != D2T_TENSOR] + d2t  # upstream writes d2t last
    _finish(d, cv)
    d.has_confidence_head = CONF_PROJ in {t.gguf_name for t in d.tensors}
    return d


def _markov_head_type(cv: ConfigView, *values: Any) -> None:
    for v in values:
        if v is not None and v not in MARKOV_HEAD_TYPES:
            raise cv.error(f"unsupported markov_head_type {v!r}: llama.cpp 0c1e57098 runs only "
                           f"{', '.join(repr(t) for t in MARKOV_HEAD_TYPES)} Markov heads (its converter refuses the rest)")


# --- Gemma-4 DSpark

def _gemma4_rope(cv: ConfigView) -> dict[str, Any]:
    """The RoPE parameters upstream's Gemma4DSparkModel uses, as a plain object, every value read typed."""
    if not cv.get("rope_parameters"):
        return dict(GEMMA4_DEFAULT_ROPE)
    given = cv.sub("rope_parameters")
    if given.has("full_attention"):
        full = given.sub("full_attention")
        for name in ("rope_type", "type", "rope_theta", "partial_rotary_factor"):
            full.get(name)
        return dict(full.cfg)
    out = dict(given.cfg)
    if not given.has("sliding_attention"):
        local = cv.first(LOCAL_ROPE_THETA_KEYS)
        if local is not None:
            out["sliding_attention"] = {"rope_theta": local}
        theta = cv.first(ROPE_THETA_KEYS)
        if "rope_theta" not in out and theta is not None:
            out["rope_theta"] = theta
        if "rope_type" not in out and given.get("type") is not None:
            out["rope_type"] = given.get("type")
        prf = cv.first(PARTIAL_ROTARY_KEYS)
        if "partial_rotary_factor" not in out and prf is not None:
            out["partial_rotary_factor"] = prf
    for name in ("rope_type", "rope_theta", "partial_rotary_factor"):
        given.get(name)
    return out


def read_gemma4_dspark(ckpt: Checkpoint, target: Target | None) -> Drafter:
    """A Gemma-4 DSpark checkpoint as a Drafter, refusing what upstream's converter requires otherwise."""
    cfg = merged_text_config(ckpt.config)
    cv = ConfigView(cfg, ckpt.config_path)
    dflash = cv.sub("dflash_config")
    n_layers = cv.int_("num_hidden_layers", cv.first(("num_hidden_layers", "n_layers", "n_layer", "num_layers")))
    # upstream's requirements, in its order
    if not cv.flag("attention_k_eq_v"):
        raise cv.error("Gemma-4 DSpark needs attention_k_eq_v: true (shared K/V, as upstream requires)")
    if cv.get("layer_types") != ["full_attention"] * n_layers:  # type: ignore[operator]
        raise cv.error(f"Gemma-4 DSpark needs layer_types of {n_layers} \"full_attention\" entries (uniform full "
                       f"attention, as upstream requires), got {cv.get('layer_types')!r}")
    act = cv.get("hidden_activation", GEMMA4_ACTIVATION)
    if act != GEMMA4_ACTIVATION:
        raise cv.error(f"Gemma-4 DSpark needs hidden_activation {GEMMA4_ACTIVATION!r}, got {act!r}")
    if cv.flag("attention_bias") or cv.flag("enable_moe_block"):
        raise cv.error("Gemma-4 DSpark with attention bias or an MoE block is not supported (llama.cpp has neither)")
    vocab = cv.int_("vocab_size")
    if (cv.get("draft_vocab_size") or vocab) != vocab:
        raise cv.error(f"Gemma-4 DSpark needs a full draft vocabulary: draft_vocab_size {cv.get('draft_vocab_size')} "
                       f"!= vocab_size {vocab}")
    if not any(strip_model_prefix(t.name) == _LM_HEAD for t in ckpt.tensors) and not cv.flag("tie_word_embeddings"):
        raise cv.error(f"Gemma-4 DSpark needs {_LM_HEAD} unless tie_word_embeddings is true")
    _markov_head_type(cv, dflash.get("markov_head_type", cv.get("markov_head_type")))
    full = _gemma4_rope(cv)
    rope_type = full.get("rope_type")
    if rope_type not in GEMMA4_ROPE_TYPES:
        raise cv.error(f"Gemma-4 DSpark needs rope_type default or proportional, got {rope_type!r}")
    mask = dflash.get("mask_token_id", cv.get("mask_token_id"))
    if mask is None:
        raise cv.error("Gemma-4 DSpark needs mask_token_id (dflash_config or top level)")
    if not dflash.get("target_layer_ids", cv.get("target_layer_ids")):
        raise cv.error("Gemma-4 DSpark needs target_layer_ids (dflash_config or top level): they are not guessed")
    if cv.get("final_logit_softcapping"):
        raise cv.error("Gemma-4 DSpark with final_logit_softcapping is not supported (upstream refuses it)")
    if dflash.flag("use_swa"):
        cv.int_("dflash_config.swa_window_size", dflash.get("swa_window_size"))
    head_dim = cv.int_("global_head_dim")
    n_kv = cv.int_("num_global_key_value_heads")

    # the Drafter from a config that says what the GGUF holds: the global head size and KV heads,
    # the full-attention RoPE (its proportional part is the rope_freqs table below), GELU
    view = {k: v for k, v in cfg.items() if not (k in LOCAL_ROPE_THETA_KEYS or k in PARTIAL_ROTARY_KEYS)}
    view.update(head_dim=head_dim, num_key_value_heads=n_kv, hidden_act=act, mask_token_id=mask,
                rope_parameters={k: v for k, v in full.items() if k != "rope_type"})
    view.pop("rope_scaling", None)
    d = build_drafter(ckpt, ConfigView(view, ckpt.config_path), dflash, target, dialect="z-lab", tensors=False)
    d.n_rot = head_dim
    d.embedding_scale = as_f32(d.hidden_size ** 0.5)
    d.attention_scale = 1.0
    d.hidden_act = GEMMA4_ACTIVATION
    d.sample_from_anchor = cv.flag("sample_from_anchor", True)
    # which of the keys Gemma-4 overrides the generic text-model code wrote first (then: in place)
    early = {
        "head_count_kv": cv.first(("num_key_value_heads", "n_kv_heads")) is not None,
        "key_length": cv.has("head_dim"),
        "value_length": cv.has("head_dim"),
        "rope_dimension_count": full.get("partial_rotary_factor") is not None,
        "embedding_scale": dflash.get("input_embedding_scale", cv.get("input_embedding_scale")) is not None,
    }
    d.late_keys = tuple(k for k in GEMMA4_OVERRIDDEN_KEYS if not early[k])
    d.tensors = _map_tensors(ckpt, cv, d, member=DSPARK, gemma4=True)
    if rope_type == "proportional":
        d.tensors.insert(0, DrafterTensor(ROPE_FREQS_TENSOR, "rope_freqs (generated: proportional RoPE)",
                                          ArraySource(_proportional_rope_freqs(cv, full, head_dim), "F32")))  # type: ignore[arg-type]
    _finish(d, cv, required_per_layer=GEMMA4_REQUIRED_PER_LAYER)
    d.has_confidence_head = CONF_PROJ in {t.gguf_name for t in d.tensors}
    return d


def _proportional_rope_freqs(cv: ConfigView, full: dict[str, Any], head_dim: int) -> np.ndarray:
    """Gemma-4's proportional RoPE in llama.cpp: the first n_rot pairs rotate (factor 1), the rest barely
    move (factor 1e30 divides their angle); the same table upstream generates."""
    frac = full.get("partial_rotary_factor", GEMMA4_DEFAULT_ROPE["partial_rotary_factor"])
    if not isinstance(frac, (int, float)) or isinstance(frac, bool):
        raise cv.error(f"partial_rotary_factor must be a number, got {frac!r}")
    n_rot = int(head_dim * float(frac) / 2)
    if not 0 < frac <= 1 or head_dim * float(frac) != 2 * n_rot:
        raise cv.error(f"partial_rotary_factor {frac} with global_head_dim {head_dim} gives no positive, even number of "
                       "rotary dimensions")
    return np.array([1.0] * n_rot + [ROPE_FREQS_UNROTATED] * (head_dim // 2 - n_rot), dtype=np.float32)


# --- tensors

def _gguf_name(name: str, gemma4: bool) -> str | None:
    m = _HF_LAYER.match(name)
    if m:
        suffix = (_GEMMA4_LAYER if gemma4 else _LAYER).get(m.group(2))
        return layer_name(int(m.group(1)), suffix) if suffix else None
    return _GLOBAL.get(name)


def _gemma4_renamed(name: str) -> str:
    for old, new in GEMMA4_RENAMED_PREFIXES.items():
        if name.startswith(old):
            name = new + name[len(old):]
    return name


def _map_tensors(ckpt: Checkpoint, cv: ConfigView, d: Drafter, *, member: str, gemma4: bool = False) -> list[DrafterTensor]:
    """Checkpoint tensors -> GGUF names, in the checkpoint's (= upstream's) order; t2d and inert names dropped."""
    return map_tensors(ckpt, cv, d, permute_rope=not cv.flag("rope_is_neox_style", True),
                       gguf_name_of=lambda name: _gguf_name(name, gemma4), kind=member,
                       twice_hint="with and without the model. prefix, or in two spellings",
                       rename=_gemma4_renamed if gemma4 else None)


def _finish(d: Drafter, cv: ConfigView, *, required_per_layer: tuple[str, ...] = REQUIRED_PER_LAYER) -> None:
    """Parts from the tensors, and every rule llama.cpp's loader enforces for them, as one-line errors."""
    by = {t.gguf_name: t for t in d.tensors}
    E = d.hidden_size

    def lacks(names: list[str]) -> str:
        shown = [f"{gguf_to_hf(n) or n} ({n})" for n in names]
        return ", ".join(shown[:6]) + (f" and {len(shown) - 6} more" if len(shown) > 6 else "")

    missing = [n for n in REQUIRED_GLOBAL if n not in by]
    missing += [layer_name(i, s) for i in range(d.n_layers) for s in required_per_layer if layer_name(i, s) not in by]
    if missing:
        raise InputFileError(f"checkpoint lacks required tensors: {lacks(missing)}", d.source)

    # DFlash2: the loader claims conv and selector tensors only with selector_hidden, and then needs them all
    conv_names = [n for n in by if generic_name(n) in CONV_TENSORS]
    selector = [n for n in SELECTOR_TENSORS if n in by]
    if SELECTOR_HIDDEN in by:
        if d.conv is None or d.selector is None:
            raise cv.error(f"a DFlash2 selector ({lacks([SELECTOR_HIDDEN])}) needs dflash_config "
                           f"{', '.join(CONV_SELECTOR_KEYS)}: llama.cpp refuses the file without them "
                           "(\"DFlash2 model is missing conv/selector metadata\")")
        need = [n for n in (SELECTOR_PREV, SELECTOR_NEXT) if n not in by]
        need += [layer_name(i, s) for i in range(d.n_layers) for s in CONV_TENSORS if layer_name(i, s) not in by]
        if need:
            raise InputFileError(f"DFlash2 drafter lacks {lacks(need)}: llama.cpp requires them with the selector", d.source)
        if E % d.conv.group_size:
            raise cv.error(f"hidden_size {E} is not divisible by dflash_config.conv_group_size {d.conv.group_size}: "
                           "llama.cpp refuses the file (\"DFlash2 hidden size must be divisible by conv_group_size\")")
        k = d.selector.top_k
        if E < k * (k + 1):
            raise cv.error(f"hidden_size {E} < selector_top_k * (selector_top_k + 1) = {k * (k + 1)}: llama.cpp refuses "
                           "the file (\"DFlash2 hidden size is too small for the selector lattice\"); its selector "
                           "packs top_k candidates and top_k^2 scores into one hidden-size row")
    elif conv_names or selector:
        raise InputFileError(f"DFlash2 tensors ({lacks((selector + conv_names)[:3])}) without "
                             f"{lacks([SELECTOR_HIDDEN])}: llama.cpp claims them only with the selector", d.source)

    # DSpark: markov_w1 makes the loader take markov_w2 (required) and the optional confidence head
    markov = [n for n in MARKOV_TENSORS if n in by]
    if MARKOV_W1 in by:
        if MARKOV_W2 not in by:
            raise InputFileError(f"DSpark drafter lacks {lacks([MARKOV_W2])}: llama.cpp requires it with markov_w1", d.source)
        if CONF_PROJ_BIAS in by and CONF_PROJ not in by:
            raise InputFileError(f"{lacks([CONF_PROJ_BIAS])} without {lacks([CONF_PROJ])}: a confidence head needs "
                                 "its weight", d.source)
        d.markov = MarkovPart(rank=by[MARKOV_W1].shape[-1], confidence=CONF_PROJ in by)
    elif markov:
        raise InputFileError(f"DSpark tensors ({lacks(markov)}) without {lacks([MARKOV_W1])}: llama.cpp claims them only "
                             "with the Markov head's first table", d.source)

    _check_shapes(d, cv)


def _check_shapes(d: Drafter, cv: ConfigView) -> None:
    E = d.hidden_size
    R = d.markov.rank if d.markov is not None else None
    dims: dict[str, int | None] = {
        "E": E, "F": d.intermediate_size, "H": d.n_head, "KV": d.n_head_kv, "D": d.head_dim, "T": len(d.target_layers),
        "V": d.vocab_size, "VD": d.draft_vocab_size or d.vocab_size, "R": R, "ER": None if R is None else E + R,
        "SR": d.selector.rank if d.selector else None, "CK": d.conv.kernel_size if d.conv else None,
        "CP": 2 * d.conv.kernel_size * (E // d.conv.group_size) if d.conv else None,
    }
    for t in d.tensors:
        gen = generic_name(t.gguf_name)
        spec = EXPECTED_HF_SHAPES.get(gen) or FAMILY_HF_SHAPES.get(gen) or GGUF_ONLY_SHAPES.get(gen)
        if spec is None or t.gguf_name == ROPE_FREQS_TENSOR:
            continue
        want = []
        for dim in spec:
            parts = [int(p) if p.isdigit() else dims.get(p) for p in dim.split("*")]
            want.append(None if None in parts else math.prod(parts))  # type: ignore[arg-type]
        if None in want:
            continue
        if tuple(t.shape) != tuple(want):
            what = f"{t.hf_name!r} has shape {list(t.shape)}, expected {want}"
            if t.gguf_name == FC_TENSOR and len(t.shape) == 2 and t.shape[0] == E:
                what = (f"{t.hf_name} input width {t.shape[1]} != len(target_layer_ids) * hidden_size = "
                        f"{len(d.target_layers)} * {E}")
            elif gen in FAMILY_HF_SHAPES:
                what += f" (from the config: {', '.join(f'{s}={dims[s]}' for s in spec if s in dims)})"
            raise InputFileError(what, d.config_path)
