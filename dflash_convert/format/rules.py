"""What llama.cpp 0c1e57098 demands of a DFlash drafter GGUF and of its target, as data tables.

validate reads these tables and never spells a key or a tensor name itself. Sources:
src/models/dflash.cpp, src/llama-model.cpp, src/llama-model-loader.cpp, common/speculative.cpp
(../shared/spec/dflash-gguf-format.md sections 1, 2 and 4).
"""

from __future__ import annotations

from .ggml import GGMLType
from .keys import ValueType
from .tensors import GLOBAL_TENSORS, generic_name

REQUIRED = "required"  # llama.cpp refuses to load the file without it
EFFECTIVE = "effectively required"  # the file loads, but shapes or decoding are wrong without it

# short key -> (requirement, what goes wrong without it)
DRAFTER_KEYS: dict[str, tuple[str, str]] = {
    "architecture": (REQUIRED, "selects llama.cpp's model class"),
    "context_length": (REQUIRED, "read unconditionally by llama_model_base::load_hparams"),
    "embedding_length": (REQUIRED, "read unconditionally by llama_model_base::load_hparams"),
    "block_count": (REQUIRED, "read unconditionally by llama_model_base::load_hparams"),
    "rms_eps": (REQUIRED, "read with required=true by src/models/dflash.cpp"),
    "target_layers": (REQUIRED, "\"DFlash model requires 'target_layers' in GGUF metadata\""),
    "feed_forward_length": (EFFECTIVE, "without it n_ff is 0 and every FFN tensor has the wrong shape"),
    "head_count": (EFFECTIVE, "without it there are 0 heads and every attention tensor has the wrong shape"),
    "tok_model": (REQUIRED, "the vocabulary loader needs it"),
    "tok_tokens": (REQUIRED, "the vocabulary; its length is every vocabulary-sized dimension"),
    "mask_token_id": (EFFECTIVE, "the draft block is filled with the mask token; without it drafting fails at run time"),
}

# Other key types llama.cpp accepts besides the one KEYS gives: integer arrays may be INT32 or
# UINT32, per-layer keys may be arrays of n_layer, sections may be a broadcast scalar.
_INT_ARRAYS = ((ValueType.ARRAY, ValueType.INT32), (ValueType.ARRAY, ValueType.UINT32))
ALSO_ACCEPTED: dict[str, tuple[tuple[ValueType, ValueType | None], ...]] = {
    "target_layers": _INT_ARRAYS,
    "sliding_window_pattern": _INT_ARRAYS,
    "rope_dimension_sections": (*_INT_ARRAYS, (ValueType.UINT32, None)),
    "feed_forward_length": _INT_ARRAYS,
    "head_count": _INT_ARRAYS,
    "head_count_kv": _INT_ARRAYS,
}

# per-layer keys that may be arrays (then of length block_count)
PER_LAYER_KEYS: tuple[str, ...] = ("feed_forward_length", "head_count", "head_count_kv")

# float keys the graph multiplies or divides by: they must be finite and > 0 (llama.cpp checks none)
POSITIVE_FLOAT_KEYS: tuple[str, ...] = (
    "rms_eps", "rope_freq_base", "rope_freq_base_swa", "rope_scaling_factor", "value_scale", "embedding_scale", "logit_scale",
    "final_logit_softcapping",
)

# Integer keys by the C type llama.cpp reads them into, and where: outside its range a value wraps
# (a UINT32 past INT32_MAX read as int32_t is negative), so validate's keys.ranges checks them.
INT32_T, UINT32_T = "int32_t", "uint32_t"
INTEGER_READERS: dict[str, tuple[str, str]] = {
    "context_length": (INT32_T, "src/llama-model.cpp: int32_t llama_model_n_ctx_train()"),
    "embedding_length": (INT32_T, "src/llama-model.cpp: int32_t llama_model_n_embd(), common/speculative.cpp n_embd_dec"),
    "block_count": (INT32_T, "src/llama-model.cpp: int32_t llama_model_n_layer()"),
    "head_count": (INT32_T, "src/llama-model.cpp: int32_t llama_model_n_head()"),
    "head_count_kv": (INT32_T, "src/llama-model.cpp: int32_t llama_model_n_head_kv()"),
    "feed_forward_length": (UINT32_T, "src/llama-hparams.h: std::array<uint32_t, LLAMA_MAX_LAYERS> n_ff_arr"),
    "key_length": (UINT32_T, "src/llama-hparams.h: uint32_t n_embd_head_k_full"),
    "value_length": (UINT32_T, "src/llama-hparams.h: uint32_t n_embd_head_v_full"),
    "rope_dimension_count": (INT32_T, "src/models/dflash.cpp passes n_rot to ggml_rope_ext/ggml_rope_multi(int n_dims)"),
    "rope_dimension_sections": (INT32_T, "src/llama-hparams.h: std::array<int, 4> rope_sections"),
    "rope_scaling_orig_ctx": (INT32_T, "ggml/src/ggml-cpu/ops.cpp: const int n_ctx_orig = op_params[4]"),
    "block_size": (INT32_T, "common/speculative.cpp: int32_t block_size = std::atoi(buf)"),
    "target_layers": (INT32_T, "src/models/dflash.cpp: std::vector<int32_t> target_layer_ids"),
    "sliding_window": (INT32_T, "src/llama-hparams.h is_masked_swa: p1 - p0 >= (int32_t) n_swa"),
    "conv_kernel_size": (UINT32_T, "src/llama-hparams.h: uint32_t dflash_conv_kernel_size"),
    "conv_group_size": (UINT32_T, "src/llama-hparams.h: uint32_t dflash_conv_group_size"),
    "selector_rank": (UINT32_T, "src/llama-hparams.h: uint32_t dflash_selector_rank"),
    "selector_top_k": (INT32_T, "src/llama-model.cpp: int32_t llama_model_dflash_selector_top_k()"),
    "mask_token_id": (INT32_T, "src/llama-vocab.cpp: llama_token (int32_t) special_mask_id"),
}

# accepted string values (anything else aborts loading)
HIDDEN_ACTIVATIONS: tuple[str, ...] = ("silu", "gelu", "gelu_pytorch_tanh")
ROPE_SCALING_TYPES: tuple[str, ...] = ("none", "linear", "yarn", "longrope")

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: block_count and the SWA pattern length are capped by it
ROPE_SECTIONS = 4  # rope.dimension_sections must have exactly this many entries
DEFAULT_BLOCK_SIZE = 16  # common/speculative.cpp when dflash.block_size is absent

# Tensors the dflash loader claims besides format.tensors.REQUIRED_GLOBAL / REQUIRED_PER_LAYER,
# with ggml shapes (ne0 first) where format.tensors.EXPECTED_HF_SHAPES has none.
OPTIONAL_GLOBAL: tuple[str, ...] = ("token_embd.weight", "output.weight", "d2t", "fc.scale", "rope_freqs.weight")
OPTIONAL_PER_LAYER: tuple[str, ...] = (
    "attn_sinks.weight", "post_attention_norm.weight", "post_ffw_norm.weight", "layer_output_scale.weight",
)
# required by format.tensors for a Qwen-style drafter, but optional to the loader (shared-KV variant)
LOADER_OPTIONAL_PER_LAYER: tuple[str, ...] = ("attn_v.weight",)
GGUF_ONLY_SHAPES: dict[str, tuple[str, ...]] = {
    "fc.scale": ("1",),
    "rope_freqs.weight": ("D/2",),
    "post_attention_norm.weight": ("E",),
    "post_ffw_norm.weight": ("E",),
    "layer_output_scale.weight": ("1",),
}

# Tensors of the other members of the dflash architecture (DSpark Markov/confidence heads, DFlash2
# convolutions and selector); claimed by the loader, their shapes are not checked here.
HEAD_GLOBAL: tuple[str, ...] = (
    "markov_w1.weight", "markov_w2.weight", "markov_w2.scale", "conf_proj.weight", "conf_proj.bias",
    "selector_predecessor.weight", "selector_successor.weight", "selector_hidden.weight",
)
HEAD_PER_LAYER: tuple[str, ...] = ("attn_conv_base", "attn_conv_proj.weight", "ffn_conv_base", "ffn_conv_proj.weight")

# GGUF names of the tensors single checks look at (spelled once, in format.tensors)
FC_TENSOR = GLOBAL_TENSORS["fc.weight"]
EMBEDDING_TENSOR = GLOBAL_TENSORS["embed_tokens.weight"]
OUTPUT_TENSOR = GLOBAL_TENSORS["lm_head.weight"]
D2T_TENSOR = GLOBAL_TENSORS["d2t"]

# --- per-tensor storage types: the one table convert, validate and quantize read
#
# FIXED: the graph sets the type (d2t is I64); VECTOR: stays F32, as upstream's converter and
# llama-quantize keep it; MATRIX: the file's matrix type, or its fallback when ne[0] is not whole blocks.
NORM_SUFFIX = "_norm.weight"
WEIGHT_SUFFIX = ".weight"
FIXED, VECTOR, MATRIX = "fixed", "vector", "matrix"
FIXED_TYPES: dict[str, str] = {D2T_TENSOR: "I64"}
VECTOR_TYPE = "F32"
# the converter's fallback (convert_hf_to_gguf.py: Q8_0 needs ne[0] % 32 == 0, else F16)
CONVERT_FALLBACK: dict[str, str] = {"Q8_0": "F16"}
# llama-quantize's fallback (tensor_type_fallback) when ne[0] % 256 != 0, then the last resort
QUANTIZE_FALLBACK: dict[GGMLType, GGMLType] = {
    GGMLType.IQ1_S: GGMLType.IQ4_NL, GGMLType.IQ1_M: GGMLType.IQ4_NL,
    GGMLType.IQ2_XXS: GGMLType.IQ4_NL, GGMLType.IQ2_XS: GGMLType.IQ4_NL, GGMLType.IQ2_S: GGMLType.IQ4_NL,
    GGMLType.IQ3_XXS: GGMLType.IQ4_NL, GGMLType.IQ3_S: GGMLType.IQ4_NL, GGMLType.IQ4_XS: GGMLType.IQ4_NL,
    GGMLType.Q2_0: GGMLType.Q4_0, GGMLType.Q2_K: GGMLType.Q4_0, GGMLType.Q3_K: GGMLType.Q4_0,
    GGMLType.TQ1_0: GGMLType.Q4_0, GGMLType.TQ2_0: GGMLType.Q4_0,
    GGMLType.Q4_K: GGMLType.Q5_0,
    GGMLType.Q5_K: GGMLType.Q5_1,
    GGMLType.Q6_K: GGMLType.Q8_0,
}
QUANTIZE_LAST_RESORT = GGMLType.F16


def storage_class(name: str, shape: tuple[int, ...]) -> str:
    """FIXED, VECTOR or MATRIX for a GGUF tensor name and its shape (any order: only its rank counts)."""
    if generic_name(name) in FIXED_TYPES:
        return FIXED
    if len(shape) <= 1 or name.endswith(NORM_SUFFIX) or not name.endswith(WEIGHT_SUFFIX):
        return VECTOR
    return MATRIX


def storage_type(name: str, shape: tuple[int, ...], matrix_type: str, fallback: dict[str, str],
                 block_of: dict[str, int]) -> tuple[str, str]:
    """(ggml type name, note) for one tensor: ``shape`` in PyTorch order, so shape[-1] is ne[0]."""

    cls = storage_class(name, shape)
    if cls == FIXED:
        return FIXED_TYPES[generic_name(name)], ""
    if cls == VECTOR:
        return VECTOR_TYPE, ""
    chosen, row = matrix_type, shape[-1]
    while row % block_of[chosen]:
        nxt = fallback.get(chosen)
        if nxt is None:
            raise ValueError(f"{name}: ne0={row} fits no block of {chosen} and there is no fallback")
        chosen = nxt
    note = "" if chosen == matrix_type else f"ne0={row} not a multiple of {block_of[matrix_type]}, {chosen} instead of {matrix_type}"
    return chosen, note


# Target side (src/models/*.cpp): only these target architectures publish the layer inputs a
# DFlash drafter taps; of them only these also publish the last layer's output (index n_layer).
LAYER_INPUT_TARGET_ARCHS: tuple[str, ...] = (
    "bailingmoe3", "deepseek4", "gemma4", "hunyuan_vl", "lfm2", "llama", "mimo2", "minimax-01", "minimax-m2",
    "muse-glimmer", "nanbeige", "nemotron_h", "gpt-oss", "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3next",
    "qwen4exp",
)
LAST_LAYER_OUTPUT_ARCHS: tuple[str, ...] = ("deepseek4", "nemotron_h", "mimo2")
# drafter architectures that are not targets
DRAFTER_ARCHS: tuple[str, ...] = ("dflash", "eagle3")

# tokenizer keys that must be identical between drafter and target (beyond the token list)
TOKENIZER_IDENTITY_KEYS: tuple[str, ...] = ("tok_model", "tok_pre")
