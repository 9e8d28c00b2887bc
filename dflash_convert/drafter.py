"""The normalised description of a DFlash drafter that every reader produces and every writer reads.

``target_layers`` holds llama.cpp's layer-input indices (0 = token embeddings); readers convert
to it once, nothing downstream adds or subtracts (docs/layer-ids.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .format.file_types import FILE_TYPE_NAMES
from .metadata import Metadata
from .tensor_source import TensorSource


@dataclass
class DrafterTensor:
    """One tensor of the drafter under its GGUF name, and where its values come from."""

    gguf_name: str
    hf_name: str
    source: TensorSource

    @property
    def shape(self) -> tuple[int, ...]:
        """PyTorch order ([out, in] for a linear layer); the GGUF ne is this reversed."""
        return tuple(self.source.shape)

    @property
    def dtype(self) -> str:
        """Element type of the source: a safetensors dtype name or a ggml type name."""
        return self.source.dtype


@dataclass
class RopeScaling:
    """RoPE scaling as llama.cpp reads it: linear or YaRN, its factor and YaRN's extra values."""
    kind: str  # "linear" | "yarn"
    factor: float
    original_context_length: int | None = None
    yarn_ext_factor: float | None = None
    yarn_attn_factor: float | None = None
    yarn_beta_fast: float | None = None
    yarn_beta_slow: float | None = None


@dataclass
class ConvPart:
    """DFlash2's dynamic convolutions (per layer, before attention and before the FFN)."""

    kernel_size: int  # dflash.conv_kernel_size: taps per convolution
    group_size: int  # dflash.conv_group_size: channels sharing one coefficient; divides hidden_size


@dataclass
class SelectorPart:
    """DFlash2's candidate selector: top-k candidates per block position, scored pairwise."""

    rank: int  # dflash.selector_rank: width of the two codebooks and of the hidden projection
    top_k: int  # dflash.selector_top_k: candidates per position; hidden_size >= top_k * (top_k + 1)


@dataclass
class MarkovPart:
    """DSpark's Markov head (a low-rank bias from the previous token) and its optional confidence head."""

    rank: int  # columns of markov_w1 / markov_w2 (no key holds it: the tensors do)
    confidence: bool  # conf_proj.weight is present


@dataclass
class Origin:
    """Where a Drafter was read from; not part of what the drafter is."""

    path: Path  # the checkpoint directory or the GGUF file
    config_path: Path  # config.json, or the GGUF file itself
    files: list[Path] = field(default_factory=list)  # every file whose bytes the tensors come from
    format: str = "z-lab"  # "z-lab", "speculators", "gguf"
    file_type: int | None = None  # general.file_type of a GGUF (LLAMA_FTYPE_*), as the file says

    @property
    def file_type_name(self) -> str | None:
        """general.file_type's name (F16, Q4_K_M, ...); None when the file has none or an unknown one."""
        return FILE_TYPE_NAMES.get(self.file_type)  # type: ignore[arg-type]


@dataclass
class Drafter:
    """Hyper-parameters and tensors of one drafter, as llama.cpp's dflash runtime sees them."""

    origin: Origin
    n_layers: int
    hidden_size: int
    intermediate_size: int
    n_head: int
    n_head_kv: int
    head_dim: int
    context_length: int
    rms_eps: float
    vocab_size: int  # the target vocabulary the drafter's token ids live in
    mask_token_id: int
    target_layers: list[int]  # llama.cpp convention (docs/layer-ids.md)
    block_size: int = 16
    rope_theta: float | None = None
    rope_theta_swa: float | None = None
    rope_scaling: RopeScaling | None = None
    # *_early / late_keys: where upstream writes the key (among the generic keys or late), to
    # reproduce its key order
    rope_sections: list[int] | None = None
    rope_sections_early: bool = False
    n_rot: int | None = None  # rotated dimensions per head (partial rotary); None: all of head_dim
    sliding_window: int | None = None
    swa_pattern: list[bool] | None = None
    causal: bool | None = None
    causal_early: bool = False
    value_scale: float | None = None
    embedding_scale: float | None = None
    logit_scale: float | None = None
    final_logit_softcapping: float | None = None  # > 0 when set
    hidden_act: str = "silu"
    draft_vocab_size: int | None = None  # own output vocabulary (d2t) when below vocab_size
    # --- the other members of the dflash architecture (format/family.py); None: absent
    conv: ConvPart | None = None  # DFlash2
    selector: SelectorPart | None = None  # DFlash2
    markov: MarkovPart | None = None  # DSpark
    sample_from_anchor: bool | None = None  # DSpark: dflash.sample_from_anchor (None: key not written)
    has_confidence_head: bool | None = None  # DSpark: dflash.has_confidence_head (None: key not written)
    attention_scale: float | None = None  # dflash.attention.scale (Gemma-4 DSpark writes 1.0)
    late_keys: tuple[str, ...] = ()  # Gemma-4 DSpark: generic keys upstream writes at the end
    tensors: list[DrafterTensor] = field(default_factory=list)
    tokenizer: Metadata | None = field(default=None, repr=False)  # the tokenizer.* keys

    @property
    def source(self) -> Path:
        """The checkpoint directory or file the drafter was read from."""
        return self.origin.path

    @property
    def config_path(self) -> Path:
        """The config.json the drafter was read from."""
        return self.origin.config_path

    @property
    def files(self) -> list[Path]:
        """Every source file of the drafter, for the provenance hashes."""
        return self.origin.files

    @property
    def type_name(self) -> str:
        """What the drafter is stored as: general.file_type's name, else the type of its first matrix."""
        return self.origin.file_type_name or next((t.dtype for t in self.tensors if len(t.shape) >= 2), "?")

    def tensor(self, gguf_name: str) -> DrafterTensor | None:
        """The tensor with this GGUF name, or None."""
        return next((t for t in self.tensors if t.gguf_name == gguf_name), None)

    def hparams(self) -> dict[str, Any]:
        """Every field but the origin, the tensors and the tokenizer keys: what two readings of one drafter share."""
        skip = ("origin", "tensors", "tokenizer")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
