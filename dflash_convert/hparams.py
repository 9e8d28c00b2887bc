"""Hyper-parameter keys of a drafter GGUF: one function per key family, and the order they go in.

``write_hparams`` calls the families in upstream's converter's order, so our key order matches.
Checks that need the config happened in the reader; here only what the target can tell.
"""

from __future__ import annotations

from .drafter import Drafter
from .errors import ConfigError
from .format.family import GEMMA4_OVERRIDDEN_KEYS
from .format.keys import key
from .metadata import Metadata


def write_base(md: Metadata, d: Drafter) -> None:
    """Geometry: layers, context, widths, heads."""
    md.set("block_count", d.n_layers)
    md.set("context_length", d.context_length)
    md.set("embedding_length", d.hidden_size)
    md.set("feed_forward_length", d.intermediate_size)
    md.set("head_count", d.n_head)
    md.set("head_count_kv", d.n_head_kv)


def write_rope_scaling(md: Metadata, d: Drafter) -> None:
    """Write the RoPE scaling keys (type, factor, original context, YaRN values) when the drafter has scaling."""
    s = d.rope_scaling
    if s is None:
        return
    md.set("rope_scaling_type", s.kind)
    md.set("rope_scaling_factor", s.factor)
    if s.kind == "yarn":
        md.set("rope_scaling_orig_ctx", s.original_context_length)
        for short, value in (("rope_yarn_ext_factor", s.yarn_ext_factor), ("rope_yarn_attn_factor", s.yarn_attn_factor),
                             ("rope_yarn_beta_fast", s.yarn_beta_fast), ("rope_yarn_beta_slow", s.yarn_beta_slow)):
            if value is not None:
                md.set(short, value)


def write_rope_base(md: Metadata, d: Drafter) -> None:
    """Write the RoPE base, and the sliding-window layers' base when the drafter has one."""
    if d.rope_theta is not None:
        md.set("rope_freq_base", d.rope_theta)
    if d.rope_theta_swa is not None:
        md.set("rope_freq_base_swa", d.rope_theta_swa)


def write_head_dims(md: Metadata, d: Drafter) -> None:
    """Write the key and value head sizes."""
    md.set("key_length", d.head_dim)
    md.set("value_length", d.head_dim)


def write_rope_dimension_count(md: Metadata, d: Drafter) -> None:
    """Partial rotary: only the first n_rot = int(head_dim * factor) dims of each head rotate."""
    if d.n_rot is not None:
        md.set("rope_dimension_count", d.n_rot)


def write_rope_dimension_sections(md: Metadata, d: Drafter, *, early: bool) -> None:
    """rope.dimension_sections, at the position upstream gives it (M-RoPE targets: docs/conversion.md)."""
    if d.rope_sections is not None and early == d.rope_sections_early:
        md.set("rope_dimension_sections", d.rope_sections)


def write_scales(md: Metadata, d: Drafter) -> None:
    """attention.value_scale (on the attention output), stored first like upstream."""
    if d.value_scale is not None:
        md.set("value_scale", d.value_scale)


def write_block_size(md: Metadata, d: Drafter) -> None:
    """Write the block size."""
    md.set("block_size", d.block_size)


def write_output_scales(md: Metadata, d: Drafter) -> None:
    """logit scale, soft-capping (> 0 only) and the noise-embedding scale."""
    if d.logit_scale is not None:
        md.set("logit_scale", d.logit_scale)
    if d.final_logit_softcapping is not None and d.final_logit_softcapping > 0:
        md.set("final_logit_softcapping", d.final_logit_softcapping)
    if d.embedding_scale is not None:
        md.set("embedding_scale", d.embedding_scale)


def write_target_layers(md: Metadata, d: Drafter) -> None:
    """llama.cpp layer-input indices (= z-lab target_layer_ids + 1, converted by the reader)."""
    md.set("target_layers", d.target_layers)


def write_sliding_window(md: Metadata, d: Drafter) -> None:
    """Write the sliding window and its per-layer pattern when the drafter has sliding layers."""
    if d.sliding_window and d.swa_pattern:
        md.set("sliding_window", d.sliding_window)
        md.set("sliding_window_pattern", d.swa_pattern)


def write_causal(md: Metadata, d: Drafter, *, early: bool) -> None:
    """attention.causal, at the position upstream gives it (see Drafter.causal_early)."""
    if d.causal is not None and early == d.causal_early:
        md.set("causal", d.causal)


def write_hidden_activation(md: Metadata, d: Drafter) -> None:
    """Written only for non-SiLU drafters (the runtime default is SiLU; upstream never writes it)."""
    if d.hidden_act != "silu":
        md.set("hidden_activation", d.hidden_act)


def write_conv_selector(md: Metadata, d: Drafter) -> None:
    """DFlash2: the four conv/selector keys, together, right after block_size (upstream writes all or none)."""
    if d.conv is not None and d.selector is not None:
        md.set("conv_kernel_size", d.conv.kernel_size)
        md.set("conv_group_size", d.conv.group_size)
        md.set("selector_rank", d.selector.rank)
        md.set("selector_top_k", d.selector.top_k)


def _move_to_end(md: Metadata, short: str, value: object) -> None:
    md.remove(key(short))
    md.set(short, value)


def write_family_tail(md: Metadata, d: Drafter) -> None:
    """What upstream's DSpark converters add after the DFlash keys."""
    if d.attention_scale is not None:
        late = {"head_count_kv": d.n_head_kv, "key_length": d.head_dim, "value_length": d.head_dim,
                "rope_dimension_count": d.n_rot, "embedding_scale": d.embedding_scale}
        for short in GEMMA4_OVERRIDDEN_KEYS:
            if short in d.late_keys:
                _move_to_end(md, short, late[short])
        md.set("attention_scale", d.attention_scale)
        _move_to_end(md, "hidden_activation", d.hidden_act)
    if d.sample_from_anchor is not None:
        md.set("sample_from_anchor", d.sample_from_anchor)
    if d.has_confidence_head is not None:
        md.set("has_confidence_head", d.has_confidence_head)


def write_hparams(md: Metadata, d: Drafter, file_type: int | None) -> None:
    """All hyper-parameter keys, in llama.cpp's converter order."""
    write_base(md, d)
    write_causal(md, d, early=True)  # a generic text-model key when the config's is_causal is false
    write_rope_scaling(md, d)
    write_rope_dimension_sections(md, d, early=True)
    write_rope_base(md, d)
    md.set("rms_eps", d.rms_eps)
    write_head_dims(md, d)
    if file_type is not None:  # None: the caller appends it last, as llama-quantize does (plan.append_file_type)
        md.set("file_type", file_type)
    write_rope_dimension_count(md, d)
    write_scales(md, d)
    write_block_size(md, d)
    write_conv_selector(md, d)
    write_output_scales(md, d)
    write_target_layers(md, d)
    write_sliding_window(md, d)
    write_causal(md, d, early=False)
    write_rope_dimension_sections(md, d, early=False)
    write_hidden_activation(md, d)
    write_family_tail(md, d)


def write_mask_token_id(md: Metadata, d: Drafter, n_tokens: int, where: str) -> None:
    """tokenizer.ggml.mask_token_id, after the vocabulary (it overrides any id the tokenizer had)."""
    if d.mask_token_id >= n_tokens:
        raise ConfigError(f"mask_token_id {d.mask_token_id} is not below the vocabulary size {n_tokens} of {where}",
                          d.config_path)
    md.set("mask_token_id", d.mask_token_id)
