"""The one description of a target model, whether read from its Hugging Face directory or its GGUF.

Plain data: what convert, validate and the runner ask of a target (architecture, sizes, published
layers, M-RoPE, tokenizer keys, where its embedding and head are). ``sources/target.py`` fills it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .metadata import Metadata
from .tensor_source import TensorSource

DIRECTORY, GGUF = "dir", "gguf"  # Target.kind


def decoder_layers(block_count: int | None, nextn_layers: int | None) -> int | None:
    """Decoder layers whose inputs a target can publish: multi-token-prediction (nextn) layers excluded.

    llama.cpp counts nextn layers in a GGUF's block_count; Hugging Face configs keep them out of
    num_hidden_layers (num_nextn_predict_layers is separate), so a directory passes nextn 0.
    """
    if block_count is None:
        return None
    return block_count - (nextn_layers or 0)


@dataclass
class Target:
    """What a drafter needs from its target, read from a model directory or a converted GGUF."""
    source: Path
    kind: str  # DIRECTORY or GGUF
    architecture: str | None  # Hugging Face class (directory) or llama.cpp architecture (GGUF)
    hidden_size: int | None
    n_layers: int | None  # see decoder_layers
    vocab_size: int | None  # config vocab_size (directory) or token count (GGUF)
    uses_mrope: bool
    config: dict[str, Any] = field(default_factory=dict, repr=False)  # config.json as read (directory)
    text_config: dict[str, Any] = field(default_factory=dict, repr=False)  # its text_config merged over the top level
    tie_word_embeddings: bool = False  # the config's flag, read typed (a directory; a GGUF has no output tensor instead)
    # a GGUF target's tokenizer.* keys as stored; a directory's are derived when asked (tokenizer/)
    tokenizer: Metadata | None = field(default=None, repr=False)
    # role ("embed", "head") -> tensor source, once sources.target.target_tensors resolved them
    weights: dict[str, TensorSource] | None = field(default=None, repr=False)

    @property
    def ties_embeddings(self) -> bool:
        """A target whose head is its embedding: a GGUF without ``output``, or ``tie_word_embeddings``."""
        return self.kind == GGUF or self.tie_word_embeddings
