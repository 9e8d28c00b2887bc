"""The normalised description of a DFlash drafter that every reader produces and every writer reads.

Layer-id convention, stated once: ``target_layers`` holds llama.cpp's indices, i.e. the index of
the target layer whose *input* residual stream is tapped (0 = token embeddings). A z-lab config's
``target_layer_ids`` index decoder-layer *outputs* (the reference code reads hidden_states[id+1]),
so target_layers = target_layer_ids + 1. A speculators config's ``aux_hidden_state_layer_ids``
index HF ``hidden_states`` (0 = embeddings), which *is* llama.cpp's convention: target_layers =
aux ids. Readers convert; nothing downstream adds or subtracts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .sources.safetensors import TensorRef


@dataclass
class DrafterTensor:
    """One output tensor and where its values come from.

    Normally a checkpoint tensor (``ref``), streamed; optionally with rows permuted from
    interleaved to NeoX rotary layout (``permute_head_dim``), or one row replaced
    (``row_override``: the mask-embedding case). Small derived tables (``computed``: d2t as
    absolute ids) carry their final values instead.
    """

    gguf_name: str
    hf_name: str
    ref: TensorRef
    permute_head_dim: int | None = None
    row_override: tuple[int, np.ndarray] | None = None
    computed: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.computed.shape) if self.computed is not None else self.ref.shape


@dataclass
class RopeScaling:
    kind: str  # "linear" | "yarn"
    factor: float
    original_context_length: int | None = None
    yarn_ext_factor: float | None = None
    yarn_attn_factor: float | None = None
    yarn_beta_fast: float | None = None
    yarn_beta_slow: float | None = None


@dataclass
class Drafter:
    source: Path
    config_path: Path
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
    target_layers: list[int]  # llama.cpp convention, see module docstring
    block_size: int = 16
    rope_theta: float | None = None
    rope_theta_swa: float | None = None
    rope_scaling: RopeScaling | None = None
    rope_sections: list[int] | None = None  # the draft's own mrope_section, padded to 4
    partial_rotary_factor: float | None = None
    sliding_window: int | None = None
    swa_pattern: list[bool] | None = None
    is_causal: bool | None = None  # top-level is_causal
    causal: bool | None = None  # is_causal, else dflash_config.causal
    value_scale: float | None = None
    embedding_scale: float | None = None
    logit_scale: float | None = None
    final_logit_softcapping: float | None = None
    hidden_act: str = "silu"
    rope_is_neox: bool = True
    draft_vocab_size: int | None = None  # own output vocabulary (d2t) when below vocab_size
    tensors: list[DrafterTensor] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    dialect: str = "z-lab"
