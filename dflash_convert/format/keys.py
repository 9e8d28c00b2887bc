"""GGUF metadata keys a DFlash drafter file carries, with the value type llama.cpp expects.

The loader type-checks scalars strictly (u32, f32, bool, string); integer arrays may be INT32 or
UINT32, and llama.cpp's own Python writer emits INT32 for a list of ints and BOOL for a list of
bools, so we do the same. ``{arch}`` is the architecture name, ``dflash``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum


class ValueType(IntEnum):
    """GGUF metadata value types (gguf.h)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


INT, FLOAT, BOOLEAN, TEXT, LIST = "int", "float", "bool", "string", "array"  # ValueTypeInfo.kind


@dataclass(frozen=True)
class ValueTypeInfo:
    """How one GGUF value type is stored: read by the GGUF reader, the writer, Metadata and migrate."""

    kind: str  # INT, FLOAT, BOOLEAN, TEXT or LIST
    fmt: str | None = None  # struct format of one value, little-endian (None: variable length)
    numpy: str | None = None  # numpy dtype of one array element
    lowest: int | None = None  # integer range
    highest: int | None = None

    @property
    def size(self) -> int:
        """Bytes of one scalar of this type (0 for strings and arrays)."""
        return struct.calcsize(self.fmt) if self.fmt else 0


def _int(fmt: str, np_dtype: str, bits: int, signed: bool) -> ValueTypeInfo:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return ValueTypeInfo(INT, fmt, np_dtype, lo, hi)


# gguf.h: every value type, its encoding and range
VALUE_TYPES: dict[ValueType, ValueTypeInfo] = {
    ValueType.UINT8: _int("<B", "<u1", 8, False), ValueType.INT8: _int("<b", "<i1", 8, True),
    ValueType.UINT16: _int("<H", "<u2", 16, False), ValueType.INT16: _int("<h", "<i2", 16, True),
    ValueType.UINT32: _int("<I", "<u4", 32, False), ValueType.INT32: _int("<i", "<i4", 32, True),
    ValueType.UINT64: _int("<Q", "<u8", 64, False), ValueType.INT64: _int("<q", "<i8", 64, True),
    ValueType.FLOAT32: ValueTypeInfo(FLOAT, "<f", "<f4"), ValueType.FLOAT64: ValueTypeInfo(FLOAT, "<d", "<f8"),
    ValueType.BOOL: ValueTypeInfo(BOOLEAN, "<B", "<u1", 0, 1),  # one byte, 0 or 1
    ValueType.STRING: ValueTypeInfo(TEXT), ValueType.ARRAY: ValueTypeInfo(LIST),
}
INT_TYPES: frozenset[ValueType] = frozenset(t for t, i in VALUE_TYPES.items() if i.kind == INT)
FLOAT_VALUE_TYPES: frozenset[ValueType] = frozenset(t for t, i in VALUE_TYPES.items() if i.kind == FLOAT)
U32_MAX = VALUE_TYPES[ValueType.UINT32].highest
I32_MAX = VALUE_TYPES[ValueType.INT32].highest

ARCH = "dflash"
ARCH_PREFIX = ARCH + "."  # every architecture key of a drafter: "{arch}.<suffix>"
TOKENIZER_PREFIX = "tokenizer."  # every key of the vocabulary a drafter borrows from its target
GENERAL_PREFIX = "general."  # names, the model card, our provenance; parity compares all but the provenance
SPLIT_PREFIX = "split."  # shard bookkeeping of split GGUFs; llama-quantize drops these keys
TOKENIZER_MODEL_BPE = "gpt2"  # tokenizer.ggml.model of byte-level BPE vocabularies (needs merges)

U32, I32, F32, BOOL, STR = ValueType.UINT32, ValueType.INT32, ValueType.FLOAT32, ValueType.BOOL, ValueType.STRING

# short name -> (key template, value type, array element type or None)
KEYS: dict[str, tuple[str, ValueType, ValueType | None]] = {
    # general
    "architecture": ("general.architecture", STR, None),
    "type": ("general.type", STR, None),
    "name": ("general.name", STR, None),
    "file_type": ("general.file_type", U32, None),
    "quantization_version": ("general.quantization_version", U32, None),
    "alignment": ("general.alignment", U32, None),
    # what upstream's converter writes from the model card (README.md front matter), generation_config.json,
    # the directory name and the parameter count (gguf-py's Metadata), in the order it writes them
    "sampling_sequence": ("general.sampling.sequence", STR, None),
    "sampling_top_k": ("general.sampling.top_k", I32, None),
    "sampling_top_p": ("general.sampling.top_p", F32, None),
    "sampling_min_p": ("general.sampling.min_p", F32, None),
    "sampling_xtc_probability": ("general.sampling.xtc_probability", F32, None),
    "sampling_xtc_threshold": ("general.sampling.xtc_threshold", F32, None),
    "sampling_temp": ("general.sampling.temp", F32, None),
    "sampling_penalty_last_n": ("general.sampling.penalty_last_n", I32, None),
    "sampling_penalty_repeat": ("general.sampling.penalty_repeat", F32, None),
    "sampling_mirostat": ("general.sampling.mirostat", I32, None),
    "sampling_mirostat_tau": ("general.sampling.mirostat_tau", F32, None),
    "sampling_mirostat_eta": ("general.sampling.mirostat_eta", F32, None),
    "author": ("general.author", STR, None),
    "version": ("general.version", STR, None),
    "organization": ("general.organization", STR, None),
    "finetune": ("general.finetune", STR, None),
    "basename": ("general.basename", STR, None),
    "description": ("general.description", STR, None),
    "quantized_by": ("general.quantized_by", STR, None),
    "size_label": ("general.size_label", STR, None),
    "license": ("general.license", STR, None),
    "license_name": ("general.license.name", STR, None),
    "license_link": ("general.license.link", STR, None),
    "url": ("general.url", STR, None),
    "doi": ("general.doi", STR, None),
    "uuid": ("general.uuid", STR, None),
    "repo_url": ("general.repo_url", STR, None),
    "source_url": ("general.source.url", STR, None),
    "source_doi": ("general.source.doi", STR, None),
    "source_uuid": ("general.source.uuid", STR, None),
    "source_repo_url": ("general.source.repo_url", STR, None),
    "base_model_count": ("general.base_model.count", U32, None),
    "dataset_count": ("general.dataset.count", U32, None),
    "tags": ("general.tags", ValueType.ARRAY, STR),
    "languages": ("general.languages", ValueType.ARRAY, STR),
    # our provenance (general.* is free for the writer to fill)
    "converter": ("general.converter.name", STR, None),
    "converter_version": ("general.converter.version", STR, None),
    "source_config_sha256": ("general.source.config_sha256", STR, None),
    "source_files": ("general.source.files", ValueType.ARRAY, STR),
    "source_files_sha256": ("general.source.files_sha256", ValueType.ARRAY, STR),
    # the Hugging Face repos a conversion read, when given as repo ids: id and resolved commit SHA
    "source_hf_repo": ("general.source.hf_repo", STR, None),
    "source_hf_commit": ("general.source.hf_commit", STR, None),
    "target_hf_repo": ("general.target.hf_repo", STR, None),
    "target_hf_commit": ("general.target.hf_commit", STR, None),
    # architecture hyper-parameters
    "block_count": ("{arch}.block_count", U32, None),
    "context_length": ("{arch}.context_length", U32, None),
    "embedding_length": ("{arch}.embedding_length", U32, None),
    "feed_forward_length": ("{arch}.feed_forward_length", U32, None),
    "head_count": ("{arch}.attention.head_count", U32, None),
    "head_count_kv": ("{arch}.attention.head_count_kv", U32, None),
    "causal": ("{arch}.attention.causal", BOOL, None),
    "rope_scaling_type": ("{arch}.rope.scaling.type", STR, None),
    "rope_scaling_factor": ("{arch}.rope.scaling.factor", F32, None),
    "rope_scaling_orig_ctx": ("{arch}.rope.scaling.original_context_length", U32, None),
    "rope_yarn_ext_factor": ("{arch}.rope.scaling.yarn_ext_factor", F32, None),
    "rope_yarn_attn_factor": ("{arch}.rope.scaling.yarn_attn_factor", F32, None),
    "rope_yarn_beta_fast": ("{arch}.rope.scaling.yarn_beta_fast", F32, None),
    "rope_yarn_beta_slow": ("{arch}.rope.scaling.yarn_beta_slow", F32, None),
    "rope_dimension_sections": ("{arch}.rope.dimension_sections", ValueType.ARRAY, I32),
    "rope_freq_base": ("{arch}.rope.freq_base", F32, None),
    "rope_freq_base_swa": ("{arch}.rope.freq_base_swa", F32, None),
    "rms_eps": ("{arch}.attention.layer_norm_rms_epsilon", F32, None),
    "key_length": ("{arch}.attention.key_length", U32, None),
    "value_length": ("{arch}.attention.value_length", U32, None),
    "rope_dimension_count": ("{arch}.rope.dimension_count", U32, None),
    "value_scale": ("{arch}.attention.value_scale", F32, None),
    "block_size": ("{arch}.block_size", U32, None),
    "logit_scale": ("{arch}.logit_scale", F32, None),
    "final_logit_softcapping": ("{arch}.final_logit_softcapping", F32, None),
    "embedding_scale": ("{arch}.embedding_scale", F32, None),
    "target_layers": ("{arch}.target_layers", ValueType.ARRAY, I32),
    "sliding_window": ("{arch}.attention.sliding_window", U32, None),
    "sliding_window_pattern": ("{arch}.attention.sliding_window_pattern", ValueType.ARRAY, BOOL),
    "hidden_activation": ("{arch}.hidden_activation", STR, None),
    # read by llama.cpp for other members of the dflash arch (DSpark, DFlash2, DeepSeek-V4) or
    # for targets; the validator type-checks them, the converter never writes them
    "attention_scale": ("{arch}.attention.scale", F32, None),
    "sample_from_anchor": ("{arch}.sample_from_anchor", BOOL, None),
    "has_confidence_head": ("{arch}.has_confidence_head", BOOL, None),
    "conv_kernel_size": ("{arch}.conv_kernel_size", U32, None),
    "conv_group_size": ("{arch}.conv_group_size", U32, None),
    "selector_rank": ("{arch}.selector_rank", U32, None),
    "selector_top_k": ("{arch}.selector_top_k", U32, None),
    "hyper_connection_count": ("{arch}.hyper_connection.count", U32, None),
    "nextn_predict_layers": ("{arch}.nextn_predict_layers", U32, None),
    # tokenizer
    "tok_model": ("tokenizer.ggml.model", STR, None),
    "tok_pre": ("tokenizer.ggml.pre", STR, None),
    "tok_tokens": ("tokenizer.ggml.tokens", ValueType.ARRAY, STR),
    "tok_token_type": ("tokenizer.ggml.token_type", ValueType.ARRAY, I32),
    "tok_scores": ("tokenizer.ggml.scores", ValueType.ARRAY, F32),
    "tok_merges": ("tokenizer.ggml.merges", ValueType.ARRAY, STR),
    "tok_add_space_prefix": ("tokenizer.ggml.add_space_prefix", BOOL, None),
    "tok_chat_template": ("tokenizer.chat_template", STR, None),
    "tok_chat_templates": ("tokenizer.chat_templates", ValueType.ARRAY, STR),
    "tok_normalizer_lowercase": ("tokenizer.ggml.normalizer_lowercase", BOOL, None),
    "tok_normalizer_strip_accents": ("tokenizer.ggml.normalizer_strip_accents", BOOL, None),
    "mask_token_id": ("tokenizer.ggml.mask_token_id", U32, None),
}

# quantize --min-acceptance's keys (docs/quantize.md has what each holds), written as llama-quantize's
# --override-kv writes them, so its printed flags reproduce the same bytes
CHOSEN_PREFIX = "dflash_convert.quantize."
CHOSEN_KEYS: dict[str, tuple[str, str]] = {  # short name -> (key, --override-kv type)
    "base_type": (CHOSEN_PREFIX + "base_type", "str"),
    "min_acceptance": (CHOSEN_PREFIX + "min_acceptance", "float"),
    "acceptance": (CHOSEN_PREFIX + "acceptance", "float"),
    "baseline_acceptance": (CHOSEN_PREFIX + "baseline_acceptance", "float"),
    "held_out_sequences": (CHOSEN_PREFIX + "held_out_sequences", "int"),
    "n_max": (CHOSEN_PREFIX + "n_max", "int"),
    "tensor_type_count": (CHOSEN_PREFIX + "tensor_type_count", "int"),
}
CHOSEN_TENSOR_TYPE = CHOSEN_PREFIX + "tensor_type.{i}"  # str: recipe item i, from 0

# general.* keys only we write (provenance): parity with upstream compares every other general.* key.
# Upstream's own general.source.* keys (url, repo_url, doi, uuid) are not among them.
PROVENANCE_KEYS: frozenset[str] = frozenset(KEYS[k][0] for k in (
    "converter", "converter_version", "source_config_sha256", "source_files", "source_files_sha256",
    "source_hf_repo", "source_hf_commit", "target_hf_repo", "target_hf_commit"))
PROVENANCE_PREFIXES: tuple[str, ...] = (CHOSEN_PREFIX,)  # whole namespaces of ours (quantize's choice)


# general.base_model.{i}.<field> and general.dataset.{i}.<field>: one string per field an entry has,
# fields in this order (gguf-py's Metadata.set_gguf_meta_model)
CARD_ENTRY_FIELDS: tuple[str, ...] = ("name", "author", "version", "organization", "description", "url", "doi", "uuid",
                                      "repo_url")
BASE_MODEL_FIELD = "general.base_model.{i}.{field}"
DATASET_FIELD = "general.dataset.{i}.{field}"
# what upstream's --metadata FILE.json calls the whole list of base models / datasets (not GGUF keys)
OVERRIDE_BASE_MODELS = "general.base_models"
OVERRIDE_DATASETS = "general.datasets"


def is_provenance_key(name: str) -> bool:
    """Whether a key is one of our provenance keys."""
    return name in PROVENANCE_KEYS or name.startswith(PROVENANCE_PREFIXES)


# special token kinds -> id key, u32 ("seperator": llama.cpp's spelling); llama.cpp writes no "cls" key
SPECIAL_TOKEN_ID_KEYS: dict[str, str] = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
}

# special token kinds -> "add this token when encoding" flag key, bool (only these three exist)
ADD_SPECIAL_TOKEN_KEYS: dict[str, str] = {
    "bos": "tokenizer.ggml.add_bos_token",
    "eos": "tokenizer.ggml.add_eos_token",
    "sep": "tokenizer.ggml.add_sep_token",
}

# token types (llama.h llama_token_type)
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6


def key(short: str, arch: str = ARCH) -> str:
    """The full GGUF key for a short name from KEYS."""
    return KEYS[short][0].format(arch=arch)
