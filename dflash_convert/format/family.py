"""The other members of llama.cpp's ``dflash`` architecture, as data: DFlash2 and DSpark.

The runtime tells the members apart by their tensors (``selector_hidden.weight``: DFlash2,
``markov_w1.weight``: DSpark, run as ``draft-dspark``). Shapes are PyTorch order over the drafter's
dimensions: E hidden, V vocabulary, VD draft vocabulary, R Markov rank, ER = E + R, SR selector
rank, CK conv kernel size, CP = 2 * CK * (E / conv_group_size). Specification: docs/family.md.
"""

from __future__ import annotations

from .tensors import FAMILY_GLOBAL_TENSORS, FAMILY_LAYER_TENSORS

# --- architecture names (config.json "architectures")

ZLAB_ARCHITECTURES: tuple[str, ...] = ("DFlashDraftModel",)  # classic DFlash, z-lab's layout
DFLASH2_ARCHITECTURES: tuple[str, ...] = ("DFlash2DraftModel",)
# DFlash lineage DSpark (and the speculators export, DSparkSpeculator): upstream's DSparkModel
DSPARK_ARCHITECTURES: tuple[str, ...] = (
    "Qwen3DSparkModel", "DSparkDraftModel", "DSparkSpeculator", "Lfm2DSparkDraftModel", "LingDSparkModel",
)
GEMMA4_DSPARK_ARCHITECTURES: tuple[str, ...] = ("Gemma4DSparkModel",)
# refused: a different backbone (hyper-connections, MLA attention, MoE stages) with its own route upstream
DSV4_DSPARK_ARCHITECTURES: tuple[str, ...] = ("DeepseekV4DSparkModel", "DeepseekV4ForCausalLM")
DSV4_ROUTE = ("the DeepSeek-V4 DSpark backbone (hyper-connections, MLA attention, MoE stages) is out of scope for "
              "dflash-convert: convert the DeepSeek-V4 checkpoint (DeepseekV4ForCausalLM) with llama.cpp's "
              "convert_hf_to_gguf.py --dspark, which exports only its DSpark draft tensors")
# speculators_model_type of a speculators DFlash and of a speculators DSpark export
SPECULATORS_DFLASH = "dflash"
SPECULATORS_DSPARK = "dspark"
# the only Markov head llama.cpp 0c1e57098 runs (speculators also trains "gated" and "rnn")
MARKOV_HEAD_TYPES: tuple[str, ...] = ("vanilla",)

# --- GGUF tensor names

_G = FAMILY_GLOBAL_TENSORS
_L = FAMILY_LAYER_TENSORS
# the HF names of the Markov heads (the reference reads them); the Gemma-4 spelling of the confidence
# head, ``confidence_proj.*``, is an alias of ``confidence_head.proj.*``
MARKOV_W1_HF = "markov_head.markov_w1.weight"
MARKOV_W2_HF = "markov_head.markov_w2.weight"
CONF_HF_PREFIXES: tuple[str, ...] = ("confidence_head.proj", "confidence_proj")
MARKOV_W1 = _G[MARKOV_W1_HF]
MARKOV_W2 = _G[MARKOV_W2_HF]
MARKOV_W2_SCALE = MARKOV_W2.removesuffix(".weight") + ".scale"  # optional per-tensor scale (no HF source)
CONF_PROJ = _G["confidence_head.proj.weight"]
CONF_PROJ_BIAS = _G["confidence_head.proj.bias"]
SELECTOR_PREV = _G["candidate_selector.predecessor_codebook"]
SELECTOR_NEXT = _G["candidate_selector.successor_codebook"]
SELECTOR_HIDDEN = _G["candidate_selector.hidden_projection.weight"]
ATTN_CONV_BASE = _L["attention_conv.base_kernel"]
ATTN_CONV_PROJ = _L["attention_conv.kernel_projection.weight"]
FFN_CONV_BASE = _L["mlp_conv.base_kernel"]
FFN_CONV_PROJ = _L["mlp_conv.kernel_projection.weight"]

MARKOV_TENSORS: tuple[str, ...] = (MARKOV_W1, MARKOV_W2, MARKOV_W2_SCALE, CONF_PROJ, CONF_PROJ_BIAS)
SELECTOR_TENSORS: tuple[str, ...] = (SELECTOR_PREV, SELECTOR_NEXT, SELECTOR_HIDDEN)
CONV_TENSORS: tuple[str, ...] = (ATTN_CONV_BASE, ATTN_CONV_PROJ, FFN_CONV_BASE, FFN_CONV_PROJ)  # per layer
CONV_BASES: tuple[str, ...] = (ATTN_CONV_BASE, FFN_CONV_BASE)
# tensors with one row per token of the (target) vocabulary: their row count must equal the token count
VOCAB_ROW_TENSORS: tuple[str, ...] = (MARKOV_W1, SELECTOR_PREV, SELECTOR_NEXT)

# PyTorch shapes (see the module docstring for the symbols); conv tensors are per layer
FAMILY_HF_SHAPES: dict[str, tuple[str, ...]] = {
    MARKOV_W1: ("V", "R"),
    MARKOV_W2: ("VD", "R"),
    MARKOV_W2_SCALE: ("1",),
    CONF_PROJ: ("1", "ER"),
    CONF_PROJ_BIAS: ("1",),
    SELECTOR_PREV: ("V", "SR"),
    SELECTOR_NEXT: ("V", "SR"),
    SELECTOR_HIDDEN: ("SR", "E"),
    ATTN_CONV_BASE: ("2", "CK", "E"),
    ATTN_CONV_PROJ: ("CP", "E"),
    FFN_CONV_BASE: ("2", "CK", "E"),
    FFN_CONV_PROJ: ("CP", "E"),
}
# the base kernels are read as F32 by the graph; upstream writes them F32 and llama-quantize keeps them
CONV_BASE_TYPE = "F32"

# --- keys

# DFlash2: upstream writes all four (when dflash_config has conv_kernel_size) or none; the loader
# needs all four (and dflash.block_size) > 0 once selector_hidden.weight exists
CONV_SELECTOR_KEYS: tuple[str, ...] = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# Gemma-4 DSpark: set after the generic keys, in this order; one the config lacked goes last (Drafter.late_keys)
GEMMA4_OVERRIDDEN_KEYS: tuple[str, ...] = ("head_count_kv", "key_length", "value_length", "rope_dimension_count",
                                           "embedding_scale")
# the generated RoPE factors of Gemma-4 DSpark's proportional RoPE: 1 for rotated pairs, this for the rest
ROPE_FREQS_UNROTATED = 1e30

# --- members and the speculative type llama.cpp uses

DFLASH, DFLASH2, DSPARK = "DFlash", "DFlash2", "DSpark"
SPEC_TYPES: dict[str, str] = {DFLASH: "draft-dflash", DFLASH2: "draft-dflash", DSPARK: "draft-dspark"}


def member_of(tensor_names: set[str] | frozenset[str]) -> str:
    """DSpark when the Markov head is there (the driver picks draft-dspark), DFlash2 with the selector."""
    if MARKOV_W1 in tensor_names:
        return DSPARK
    if SELECTOR_HIDDEN in tensor_names:
        return DFLASH2
    return DFLASH


def draft_tokens_per_block(member: str, block_size: int, sample_from_anchor: bool | None) -> int:
    """Most tokens one block drafts (--spec-draft-n-max): block_size - 1, or block_size for DSpark sampling from the anchor."""
    if member == DSPARK and sample_from_anchor is not False:
        return block_size
    return block_size - 1
