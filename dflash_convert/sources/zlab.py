"""Reader for z-lab format DFlash drafters (architectures: ["DFlashDraftModel"]) -> Drafter.

Every value llama.cpp needs is taken from the config or the tensors, or the conversion stops with
a message naming the key; nothing is guessed (no default target layers, no implied SWA pattern).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from ..drafter import Drafter, DrafterTensor, Origin, RopeScaling
from ..encoders.floats import FLOAT_WORDS
from ..errors import InputFileError
from ..format.family import ZLAB_ARCHITECTURES
from ..format.ggml import GGUF_MAX_ARRAY_ELEMENTS
from ..format.keys import I32_MAX
from ..format.rules import D2T_TENSOR, EMBEDDING_TENSOR, FC_TENSOR, MAX_LAYERS
from ..format.tensors import (
    CHECKED_NOT_WRITTEN,
    EXPECTED_HF_SHAPES,
    REQUIRED_GLOBAL,
    REQUIRED_PER_LAYER,
    ROPE_PERMUTED,
    SKIPPED_SUFFIXES,
    generic_name,
    gguf_to_hf,
    hf_to_gguf,
    layer_name,
    layer_of,
    strip_model_prefix,
)
from ..target import Target
from ..tensor_source import NeoxPermuted
from .checkpoint import Checkpoint, merged_text_config
from .config import ConfigView, as_f32

__all__ = ["ConfigView", "as_f32", "build_drafter", "is_zlab", "map_tensors", "read_zlab"]

log = logging.getLogger("dflash_convert")

CONTEXT_KEYS = ("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length", "model_max_length")
ROPE_THETA_KEYS = ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base")
LOCAL_ROPE_THETA_KEYS = ("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq")
PARTIAL_ROTARY_KEYS = ("partial_rotary_factor", "rope_pct", "rope_percent")
SUPPORTED_ACTIVATIONS = {"silu": None, "swish": None, "gelu": "gelu", "gelu_pytorch_tanh": "gelu_pytorch_tanh"}


# a vocabulary is a GGUF array: llama.cpp reads at most this many elements
MAX_VOCAB = GGUF_MAX_ARRAY_ELEMENTS


def rope_view(cv: ConfigView) -> ConfigView:
    """rope_parameters, else rope_scaling (an empty object counts as none), as a typed view."""
    return cv.sub("rope_parameters" if cv.get("rope_parameters") else "rope_scaling")


def _rope(cv: ConfigView) -> tuple[float | None, float | None, RopeScaling | None, list[int] | None, float | None]:
    params = rope_view(cv)
    full = params.sub("full_attention") if params.has("full_attention") else params
    theta = cv.float_("rope_theta", full.get("rope_theta", cv.first(ROPE_THETA_KEYS)))
    swa = params.sub("sliding_attention") if params.has("sliding_attention") else None
    theta_swa = cv.float_("local rope_theta", swa.get("rope_theta") if swa is not None else cv.first(LOCAL_ROPE_THETA_KEYS))
    kind = full.get("rope_type", full.get("type"))
    scaling = None
    factor = full.get("factor")
    if kind == "linear" and factor is not None:
        scaling = RopeScaling("linear", cv.float_("rope factor", factor))
    elif kind == "yarn" and factor is not None:
        orig = full.get("original_max_position_embeddings", cv.get("original_max_position_embeddings"))
        if orig is None:
            raise cv.error("yarn rope scaling needs original_max_position_embeddings")
        scaling = RopeScaling("yarn", cv.float_("rope factor", factor),
                              cv.int_("original_max_position_embeddings", orig),
                              cv.float_("extrapolation_factor", full.get("extrapolation_factor")),
                              cv.float_("attention_factor", full.get("attention_factor", full.get("attn_factor"))),
                              cv.float_("beta_fast", full.get("beta_fast")), cv.float_("beta_slow", full.get("beta_slow")))
    elif kind not in (None, "default", "linear", "yarn"):
        # llama.cpp's DFlash converter writes nothing for other rope types (llama3, dynamic, ...);
        # we write the same, and say so.
        log.warning("%s: rope_type %r is not carried into the GGUF (llama.cpp's dflash has no key for it)", cv.path, kind)
    sections = None
    sec = params.get("mrope_section")
    if sec is not None:
        if len(sec) > 4 or any(s < 0 for s in sec):
            raise cv.error(f"{params.scope}mrope_section must be a list of at most 4 non-negative integers, got {sec!r} "
                           "(llama.cpp reads 4 int sections)")
        sections = (list(sec) + [0, 0, 0, 0])[:4]
    prf = params.get("partial_rotary_factor", cv.first(PARTIAL_ROTARY_KEYS))
    # not rounded to float32: upstream computes int(head_dim * factor) in double precision
    if prf is not None and not 0 < prf <= 1:
        raise cv.error(f"partial_rotary_factor must be in (0, 1], got {prf}")
    return theta, theta_swa, scaling, sections, prf


def _swa(cv: ConfigView, dflash: ConfigView, n_layers: int) -> tuple[int | None, list[bool] | None]:
    use_swa_all = dflash.flag("use_swa")
    use = cv.flag("use_sliding_window") or use_swa_all
    window = dflash.get("swa_window_size") or cv.get("sliding_window")
    layer_types = cv.get("layer_types")
    if layer_types is not None and len(layer_types) != n_layers:
        raise cv.error(f"layer_types has {len(layer_types)} entries but num_hidden_layers is {n_layers}")
    if not use:
        if layer_types and "sliding_attention" in layer_types:
            log.warning("%s: layer_types lists sliding_attention but use_sliding_window is false: "
                        "no sliding window is written (as llama.cpp's converter does)", cv.path)
        return None, None
    if not window:
        raise cv.error("use_sliding_window is true but no sliding_window size is given")
    window = cv.int_("sliding_window", window, maximum=I32_MAX,
                     written_as="UINT32, then compared as (int32_t) n_swa in src/llama-hparams.h is_masked_swa")
    if use_swa_all:
        return window, [True] * n_layers
    if layer_types is None:
        raise cv.error("use_sliding_window is true but layer_types is missing: which layers slide is not guessed")
    return window, [t == "sliding_attention" for t in layer_types]


def is_zlab(cfg: dict[str, Any]) -> bool:
    """Whether a config names a z-lab DFlash architecture."""
    archs = cfg.get("architectures")
    return isinstance(archs, list) and any(a in ZLAB_ARCHITECTURES for a in archs)


def read_zlab(ckpt: Checkpoint, target: Target | None) -> Drafter:
    """A z-lab ``DFlashDraftModel`` checkpoint as a Drafter; refuses any other architecture."""
    cv = ConfigView(merged_text_config(ckpt.config), ckpt.config_path)
    if not is_zlab(cv.cfg):
        raise cv.error(f"not a DFlash drafter: architectures is {cv.cfg.get('architectures')!r}, expected "
                       "['DFlashDraftModel'] (z-lab) or speculators_model_type 'dflash'")
    return build_drafter(ckpt, cv, cv.sub("dflash_config"), target, dialect="z-lab")


def build_drafter(ckpt: Checkpoint, cv: ConfigView, dflash: ConfigView, target: Target | None, *,
                  dialect: str, draft_vocab_size: int | None = None, tensors: bool = True) -> Drafter:
    """The Drafter for a flat (z-lab shaped) config: HF target_layer_ids in ``dflash``."""
    n_layers = cv.int_("num_hidden_layers", cv.first(("num_hidden_layers", "n_layers", "n_layer", "num_layers")),
                       maximum=MAX_LAYERS, written_as=f"block_count (llama.cpp loads at most {MAX_LAYERS} layers)")
    hidden = cv.int_("hidden_size", cv.first(("hidden_size", "n_embd", "dim")))
    ffn = cv.int_("intermediate_size", cv.first(("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner", "hidden_dim")))
    n_head = cv.int_("num_attention_heads", cv.first(("num_attention_heads", "n_head", "n_heads")))
    n_head_kv = cv.int_("num_key_value_heads", cv.first(("num_key_value_heads", "n_kv_heads")))
    head_dim = cv.int_("head_dim", required=False) or hidden // n_head
    if head_dim < 1:
        raise cv.error(f"num_attention_heads {n_head} exceeds hidden_size {hidden}: no head_dim is left")
    if n_head % n_head_kv:
        raise cv.error(f"num_attention_heads {n_head} is not a multiple of num_key_value_heads {n_head_kv}")
    ctx = cv.int_("max_position_embeddings", cv.first(CONTEXT_KEYS))
    eps = cv.float_("rms_norm_eps", cv.first(("rms_norm_eps", "norm_eps")), required=True)
    vocab = cv.int_("vocab_size", maximum=MAX_VOCAB, written_as="the length of a GGUF token array (llama.cpp's limit)")

    # target layers: never computed, never defaulted
    ids = dflash.get("target_layer_ids", cv.get("target_layer_ids"))
    if not ids:
        raise cv.error("dflash_config.target_layer_ids is missing: the tapped target layers are not guessed "
                       "(add the list the drafter was trained with)")
    if any(i + 1 > I32_MAX for i in ids):
        raise cv.error(f"target_layer_ids {ids} do not fit: written + 1 as INT32, at most {I32_MAX - 1}")
    if target is not None and target.n_layers is not None:
        bad = [i for i in ids if not 0 <= i < target.n_layers]
        if bad:
            raise cv.error(f"target_layer_ids {bad} are outside the target's {target.n_layers} layers "
                           f"({target.source}); wrong target?")
        if max(ids) == target.n_layers - 1:
            log.warning("%s: target_layer_ids include the target's last layer (%d): llama.cpp publishes that layer's "
                        "output only for deepseek4, nemotron-h and mimo2 targets; other targets abort at run time",
                        cv.path, max(ids))
    elif any(i < 0 for i in ids):
        raise cv.error(f"target_layer_ids must be >= 0, got {ids}")
    if len(set(ids)) == 1 and len(ids) > 1:
        raise cv.error(f"target_layer_ids are all equal ({ids}): a drafter taps distinct layers")
    target_layers = [i + 1 for i in ids]

    if target is not None and target.hidden_size is not None and target.hidden_size != hidden:
        raise cv.error(f"draft hidden_size {hidden} differs from the target's {target.hidden_size} "
                       f"({target.source}); llama.cpp feeds target hidden states of that width")

    mask = dflash.get("mask_token_id", cv.get("mask_token_id"))
    if mask is None:
        raise cv.error("dflash_config.mask_token_id is missing: the drafter fills its block with this token")
    mask = cv.int_("mask_token_id", mask, minimum=0)
    if mask >= vocab:
        raise cv.error(f"mask_token_id {mask} is not below vocab_size {vocab}")

    # common/speculative.cpp reads the block size with atoi into an int32_t (n_draft_max = block_size - 1)
    block = cv.int_("block_size", dflash.get("block_size", cv.get("block_size", 16)), minimum=2, maximum=I32_MAX,
                    written_as="UINT32 and read by common/speculative.cpp into an int32_t (std::atoi)")

    theta, theta_swa, scaling, sections, prf = _rope(cv)
    window, pattern = _swa(cv, dflash, n_layers)
    act = cv.get("hidden_act", cv.get("hidden_activation", "silu"))
    if act not in SUPPORTED_ACTIVATIONS:
        raise cv.error(f"hidden_act {act!r} is not supported by llama.cpp's dflash (silu, gelu, gelu_pytorch_tanh)")

    is_causal = cv.get("is_causal")
    causal = is_causal if is_causal is not None else dflash.get("causal")
    n_rot = None if prf is None else int(head_dim * prf)
    if n_rot is not None and (n_rot < 2 or n_rot % 2):
        raise cv.error(f"partial_rotary_factor {prf} with head_dim {head_dim} gives {n_rot} rotary dimensions: llama.cpp "
                       "needs a positive even count (ggml/src/ggml-cpu/ops.cpp GGML_ASSERT(n_dims % 2 == 0); 0 it does not "
                       "check, and its rope op never finishes: theta_scale = powf(freq_base, -2.0f/n_dims))")
    if sections is not None and sum(sections) > head_dim:
        raise cv.error(f"mrope_section {sections} sums to {sum(sections)}, more than head_dim {head_dim}: llama.cpp "
                       "aborts (ggml/src/ggml-cpu/ops.cpp GGML_ASSERT(sect_dims <= ne0))")
    if target is not None and target.uses_mrope:
        # the runtime hands an M-RoPE target's 4-row positions to the draft: degenerate sections
        # [head_dim/2, 0, 0, 0] make its rope equal NeoX on the temporal row
        final_sections = [head_dim // 2, 0, 0, 0]
    else:
        final_sections = sections
    softcap = cv.float_("final_logit_softcapping", dflash.get("final_logit_softcapping", cv.get("final_logit_softcapping")))
    rope_is_neox = cv.flag("rope_is_neox_style", True)
    d = Drafter(
        origin=Origin(ckpt.dir, ckpt.config_path, list(ckpt.files), dialect),
        n_layers=n_layers, hidden_size=hidden,
        intermediate_size=ffn, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, context_length=ctx,
        rms_eps=eps, vocab_size=vocab, mask_token_id=mask, target_layers=target_layers, block_size=block,
        rope_theta=theta, rope_theta_swa=theta_swa, rope_scaling=scaling,
        rope_sections=final_sections, rope_sections_early=sections is not None,
        n_rot=n_rot, sliding_window=window, swa_pattern=pattern,
        causal=causal, causal_early=is_causal is False,
        value_scale=cv.float_("attention_value_scale", dflash.get("attention_value_scale")),
        embedding_scale=cv.float_("input_embedding_scale", dflash.get("input_embedding_scale", cv.get("input_embedding_scale"))),
        logit_scale=cv.float_("output_multiplier", dflash.get("output_multiplier", cv.get("output_multiplier"))),
        final_logit_softcapping=softcap if softcap is not None and softcap > 0 else None,
        hidden_act=SUPPORTED_ACTIVATIONS[act] or "silu",
        draft_vocab_size=draft_vocab_size,
    )
    if not rope_is_neox and not cv.has("head_dim"):
        raise cv.error("rope_is_neox_style is false but head_dim is missing: the interleaved-to-NeoX row "
                       "permutation works per head and needs it")
    if tensors:
        d.tensors = _map_tensors(ckpt, cv, d, permute_rope=not rope_is_neox)
    return d


def map_tensors(ckpt: Checkpoint, cv: ConfigView, d: Drafter, *, permute_rope: bool,
                gguf_name_of: Callable[[str], str | None], kind: str, twice_hint: str,
                rename: Callable[[str], str] | None = None) -> list[DrafterTensor]:
    """Checkpoint tensors -> DrafterTensors in the checkpoint's (= upstream's) order, each checked."""
    out: list[DrafterTensor] = []
    seen: set[str] = set()
    for ref in ckpt.tensors:
        name = strip_model_prefix(ref.name)
        if name.endswith(SKIPPED_SUFFIXES) or name in CHECKED_NOT_WRITTEN:
            continue
        if rename is not None:
            name = rename(name)
        gguf_name = gguf_name_of(name)
        if gguf_name is None:
            raise InputFileError(f"unknown tensor {ref.name!r}: not part of a {kind} drafter", ref.path)
        if gguf_name == EMBEDDING_TENSOR and cv.get("has_embed_tokens") is False:
            continue
        if gguf_name in seen:
            raise InputFileError(f"tensor {ref.name!r} appears twice ({twice_hint})", ref.path)
        bid = layer_of(gguf_name)
        if bid is not None and bid >= d.n_layers:
            raise InputFileError(f"tensor {ref.name!r} is for layer {bid}, but num_hidden_layers is {d.n_layers}", ref.path)
        if ref.dtype not in FLOAT_WORDS and gguf_name != D2T_TENSOR:
            raise InputFileError(f"tensor {ref.name!r} has dtype {ref.dtype}; only F32, F16, BF16 and F64 convert", ref.path)
        seen.add(gguf_name)
        source = NeoxPermuted(ref, d.head_dim) if permute_rope and generic_name(gguf_name) in ROPE_PERMUTED else ref
        out.append(DrafterTensor(gguf_name, name, source))
    return out


def _map_tensors(ckpt: Checkpoint, cv: ConfigView, d: Drafter, *, permute_rope: bool) -> list[DrafterTensor]:
    out = map_tensors(ckpt, cv, d, permute_rope=permute_rope, gguf_name_of=hf_to_gguf, kind="z-lab DFlash",
                      twice_hint="with and without the model. prefix?")
    _check_tensors(out, d)
    return out


def _check_tensors(tensors: list[DrafterTensor], d: Drafter) -> None:
    names = {t.gguf_name for t in tensors}
    missing = [n for n in REQUIRED_GLOBAL if n not in names]
    missing += [layer_name(i, s) for i in range(d.n_layers) for s in REQUIRED_PER_LAYER if layer_name(i, s) not in names]
    if missing:
        missing = [f"{gguf_to_hf(n) or n} ({n})" for n in missing]  # the checkpoint's names, which the user can look for
        raise InputFileError(f"checkpoint lacks required tensors: {', '.join(missing[:6])}"
                             + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""), d.source)
    dims = {"E": d.hidden_size, "F": d.intermediate_size, "H": d.n_head, "KV": d.n_head_kv, "D": d.head_dim,
            "T": len(d.target_layers), "V": d.vocab_size, "VD": d.draft_vocab_size or d.vocab_size}
    for t in tensors:
        spec = EXPECTED_HF_SHAPES.get(generic_name(t.gguf_name))
        if spec is None:
            continue
        want = tuple(math.prod(dims[f] for f in dim.split("*")) for dim in spec)
        if tuple(t.shape) != want:
            what = f"{t.hf_name!r} has shape {list(t.shape)}, expected {list(want)}"
            if t.gguf_name == FC_TENSOR and len(t.shape) == 2 and t.shape[0] == d.hidden_size:
                what = (f"{t.hf_name} input width {t.shape[1]} != len(target_layer_ids) * hidden_size = "
                        f"{len(d.target_layers)} * {d.hidden_size}")
            raise InputFileError(what, d.config_path)
