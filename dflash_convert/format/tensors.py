"""Tensor names: Hugging Face DFlash checkpoint <-> llama.cpp ``dflash`` GGUF, both directions.

HF names are given without the optional ``model.`` prefix; ``{bid}`` is the layer index. The one
place that spells a tensor name.
"""

from __future__ import annotations

import re

# HF name (no "model." prefix) -> GGUF name, for tensors outside the layers
GLOBAL_TENSORS: dict[str, str] = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens.weight": "token_embd.weight",
    "lm_head.weight": "output.weight",
    "d2t": "d2t",  # draft -> target id table; stored as absolute ids, I64 (speculators stores offsets)
}

# HF tensors read and checked, never written (llama.cpp rejects unclaimed tensors; t2d is d2t's inverse)
CHECKED_NOT_WRITTEN: tuple[str, ...] = ("t2d",)

# HF per-layer suffix (after "layers.{bid}.") -> GGUF per-layer suffix (after "blk.{bid}.")
# Note the trap: post_attention_layernorm is the *pre-FFN* norm of a Qwen3 layer, ffn_norm here.
LAYER_TENSORS: dict[str, str] = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # attention sinks (gpt-oss drafters): one learned logit per head
    "self_attn.sinks": "attn_sinks.weight",
    "self_attn.attention_sink_bias": "attn_sinks.weight",
    "self_attn.learnable_sink_param": "attn_sinks.weight",
}

# The rest of the dflash family (docs/family.md). Upstream appends ".weight" to the selector
# codebooks and writes the conv base kernels without a suffix; so do we.
FAMILY_GLOBAL_TENSORS: dict[str, str] = {
    "markov_head.markov_w1.weight": "markov_w1.weight",
    "markov_head.markov_w2.weight": "markov_w2.weight",
    "confidence_head.proj.weight": "conf_proj.weight",
    "confidence_head.proj.bias": "conf_proj.bias",
    "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
    "candidate_selector.successor_codebook": "selector_successor.weight",
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
}
FAMILY_LAYER_TENSORS: dict[str, str] = {
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}
# Gemma-4 DSpark layers override LAYER_TENSORS: its post_attention_layernorm is a real
# post-attention norm (Qwen's is the pre-FFN norm)
GEMMA4_LAYER_TENSORS: dict[str, str] = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "layer_scalar": "layer_output_scale.weight",
}
# the same parts by the roles of LAYER_ROLES_HF
GEMMA4_ROLES_HF: dict[str, str] = {"ffn_norm": "pre_feedforward_layernorm.weight",
                                   "post_attn_norm": "post_attention_layernorm.weight",
                                   "post_ffw_norm": "post_feedforward_layernorm.weight", "out_scale": "layer_scalar"}
# Gemma-4 DSpark checkpoints spell the confidence head this way; upstream renames it first
GEMMA4_RENAMED_PREFIXES: dict[str, str] = {"confidence_proj.": "confidence_head.proj."}
# the parts of a classic DFlash layer by the role the runner and the reference give them -> HF
# per-layer suffix (its GGUF suffix is LAYER_TENSORS[suffix]); the sinks are found by SINK_HF
LAYER_ROLES_HF: dict[str, str] = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight",
    "down": "mlp.down_proj.weight",
}
SINK_HF: tuple[str, ...] = tuple(hf for hf, gg in LAYER_TENSORS.items() if gg == LAYER_TENSORS["self_attn.sinks"])
HIDDEN_NORM_HF = "hidden_norm.weight"  # the norm after fc (GGUF enc.output_norm)
OUTPUT_NORM_HF = "norm.weight"  # the final norm (GGUF output_norm)
assert all(v in LAYER_TENSORS for v in LAYER_ROLES_HF.values()) and {HIDDEN_NORM_HF, OUTPUT_NORM_HF} <= set(GLOBAL_TENSORS)

# where a target checkpoint keeps its token embedding and output head (first found wins)
TARGET_WEIGHT_NAMES: dict[str, tuple[str, ...]] = {
    "embed": ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight",
              "language_model.model.embed_tokens.weight"),
    "head": ("lm_head.weight", "model.lm_head.weight", "language_model.lm_head.weight"),
}

ROPE_FREQS_TENSOR = "rope_freqs.weight"

# per-layer tensors whose rows are permuted from interleaved (GPT-J) to NeoX rotary layout
ROPE_PERMUTED: tuple[str, ...] = ("attn_q.weight", "attn_k.weight", "attn_q_norm.weight", "attn_k_norm.weight")

# HF names that carry no weights the runtime needs; dropped silently (as llama.cpp does)
SKIPPED_SUFFIXES: tuple[str, ...] = (".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")

# Tensors every classic DFlash drafter must have (GGUF names; {bid} per layer)
REQUIRED_GLOBAL: tuple[str, ...] = ("fc.weight", "enc.output_norm.weight", "output_norm.weight")
REQUIRED_PER_LAYER: tuple[str, ...] = (
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "attn_q_norm.weight",
    "attn_k_norm.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
)

# PyTorch shapes ([out, in]) over E hidden, F intermediate, H heads, KV kv-heads, D head dim, T taps,
# V vocabulary, VD draft vocabulary
EXPECTED_HF_SHAPES: dict[str, tuple[str, ...]] = {
    "fc.weight": ("E", "T*E"),
    "enc.output_norm.weight": ("E",),
    "output_norm.weight": ("E",),
    "attn_norm.weight": ("E",),
    "attn_q.weight": ("H*D", "E"),
    "attn_k.weight": ("KV*D", "E"),
    "attn_v.weight": ("KV*D", "E"),
    "attn_output.weight": ("E", "H*D"),
    "attn_q_norm.weight": ("D",),
    "attn_k_norm.weight": ("D",),
    "ffn_norm.weight": ("E",),
    "ffn_gate.weight": ("F", "E"),
    "ffn_up.weight": ("F", "E"),
    "ffn_down.weight": ("E", "F"),
    "token_embd.weight": ("V", "E"),
    "output.weight": ("VD", "E"),  # VD: draft vocabulary (V unless the drafter has its own)
    "attn_sinks.weight": ("H",),
    "d2t": ("VD",),
}

_HF_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_GGUF_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
# reverse maps: where several HF spellings map to one GGUF name, the first listed is canonical
_GGUF_TO_HF_GLOBAL: dict[str, str] = {}
_GGUF_TO_HF_LAYER: dict[str, str] = {}
for _hf, _gg in (*GLOBAL_TENSORS.items(), *FAMILY_GLOBAL_TENSORS.items()):
    _GGUF_TO_HF_GLOBAL.setdefault(_gg, _hf)
for _hf, _gg in (*LAYER_TENSORS.items(), *FAMILY_LAYER_TENSORS.items(), *GEMMA4_LAYER_TENSORS.items()):
    _GGUF_TO_HF_LAYER.setdefault(_gg, _hf)


def strip_model_prefix(name: str) -> str:
    """HF names with or without ``model.`` are the same tensor."""
    return name[len("model."):] if name.startswith("model.") else name


def hf_to_gguf(hf_name: str) -> str | None:
    """GGUF name for an HF tensor name (prefix optional), or None when the table has no entry."""
    name = strip_model_prefix(hf_name)
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    m = _HF_LAYER.match(name)
    if m and m.group(2) in LAYER_TENSORS:
        return f"blk.{int(m.group(1))}.{LAYER_TENSORS[m.group(2)]}"
    return None


def gguf_to_hf(gguf_name: str) -> str | None:
    """HF name (without prefix) for a GGUF tensor name, or None when the table has no entry."""
    if gguf_name in _GGUF_TO_HF_GLOBAL:
        return _GGUF_TO_HF_GLOBAL[gguf_name]
    m = _GGUF_LAYER.match(gguf_name)
    if m and m.group(2) in _GGUF_TO_HF_LAYER:
        return f"layers.{int(m.group(1))}.{_GGUF_TO_HF_LAYER[m.group(2)]}"
    return None


LAYER_PREFIX = "blk."  # per-layer GGUF names are LAYER_PREFIX + "<bid>." + suffix
LAYER_TEMPLATE = LAYER_PREFIX + "{bid}."  # the same, as a pattern other tables (dialects) use


def layer_name(bid: int | str, suffix: str) -> str:
    """The GGUF name of per-layer tensor ``suffix`` in layer ``bid``."""
    return f"{LAYER_PREFIX}{bid}.{suffix}"


def layer_of(gguf_name: str) -> int | None:
    """Layer index of a per-layer GGUF name, None for global tensors."""
    m = _GGUF_LAYER.match(gguf_name)
    return int(m.group(1)) if m else None


def generic_name(gguf_name: str) -> str:
    """The table key of a GGUF name: the per-layer suffix, or the global name."""
    m = _GGUF_LAYER.match(gguf_name)
    return m.group(2) if m else gguf_name
