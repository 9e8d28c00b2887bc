"""The one description of a target model, from its Hugging Face directory or from its GGUF.

Convert, validate and the runner all ask the same questions of a target: its architecture,
hidden size, how many decoder layers publish their inputs, its vocabulary size, whether it uses
M-RoPE, and where its embedding and output head are. Only config and tokenizer files are read
from a target directory; its weights only when a caller asks for the embedding or the head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, InputFileError
from .format.keys import key
from .format.rules import DRAFTER_ARCHS
from .sources.checkpoint import _weight_files, merged_text_config, read_config
from .sources.gguf import GGUFFile, read_gguf
from .sources.safetensors import TensorRef, read_header

# where a target checkpoint keeps its token embedding and output head (first found wins)
TARGET_WEIGHT_NAMES: dict[str, tuple[str, ...]] = {
    "embed": ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight",
              "language_model.model.embed_tokens.weight"),
    "head": ("lm_head.weight", "model.lm_head.weight", "language_model.lm_head.weight"),
}


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
    source: Path
    kind: str  # "dir" or "gguf"
    architecture: str | None  # Hugging Face class (directory) or llama.cpp architecture (GGUF)
    hidden_size: int | None
    n_layers: int | None  # see decoder_layers
    vocab_size: int | None  # config vocab_size (directory) or token count (GGUF)
    uses_mrope: bool
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    gguf: GGUFFile | None = field(default=None, repr=False)
    _weights: dict[str, Any] | None = field(default=None, repr=False)

    def text_config(self) -> dict[str, Any]:
        return merged_text_config(self.config)

    def weights(self) -> dict[str, Any] | None:
        """The target's embedding and head as TensorSources (data read on demand), or None."""
        if self._weights is None:
            self._weights = {}
            if self.kind == "gguf" and self.gguf is not None:
                from .format.rules import EMBEDDING_TENSOR, OUTPUT_TENSOR

                for role, name in (("embed", EMBEDDING_TENSOR), ("head", OUTPUT_TENSOR)):
                    t = self.gguf.tensor(name)
                    if t is not None:
                        self._weights[role] = t
            elif self.source.is_dir() and (any(self.source.glob("model*.safetensors"))
                                           or (self.source / "model.safetensors.index.json").is_file()):
                found: dict[str, TensorRef] = {}
                for path in _weight_files(self.source)[0]:
                    refs, _ = read_header(path)
                    found.update({r.name: r for r in refs})
                for role, names in TARGET_WEIGHT_NAMES.items():
                    ref = next((found[n] for n in names if n in found), None)
                    if ref is not None:
                        self._weights[role] = ref
        return self._weights or None


def read_target_dir(target_dir: str | Path) -> Target:
    target_dir = Path(target_dir)
    cfg, path = read_config(target_dir, "target model")
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    text = merged_text_config(cfg)
    inner = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    rope = inner.get("rope_parameters") or inner.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ConfigError("rope_parameters/rope_scaling must be an object", path)

    def as_int(k: str) -> int | None:
        v = text.get(k)
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"target {k} must be a positive integer, got {v!r}", path)
        return v

    return Target(
        source=target_dir,
        kind="dir",
        architecture=arch,
        hidden_size=as_int("hidden_size"),
        n_layers=decoder_layers(as_int("num_hidden_layers"), 0),
        vocab_size=as_int("vocab_size"),
        uses_mrope="mrope_section" in rope,
        config=cfg,
    )


def target_from_gguf(g: GGUFFile) -> Target:
    """A Target from a parsed GGUF (the caller decides whether a drafter architecture is an error)."""
    arch = g.architecture
    hidden = blocks = nextn = None
    if arch:
        hidden, blocks, nextn = (g.get(key(s, arch)) for s in ("embedding_length", "block_count", "nextn_predict_layers"))
    tokens = g.get(key("tok_tokens"))

    def as_int(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    return Target(
        source=g.path,
        kind="gguf",
        architecture=arch,
        hidden_size=as_int(hidden),
        n_layers=decoder_layers(as_int(blocks), as_int(nextn)),
        vocab_size=len(tokens) if isinstance(tokens, list) else None,
        uses_mrope=False,  # as the converter always did for --target-gguf: the degenerate sections equal NeoX
        gguf=g,
    )


def read_target_gguf(path: str | Path) -> Target:
    """A converted target model's GGUF; refuses drafters and files without an architecture."""
    from .files import check_regular_file

    path = Path(path)
    check_regular_file(path, "target GGUF")
    g = read_gguf(path)
    if g.architecture is None:
        raise InputFileError(f"target GGUF has no {key('architecture')}", path)
    if g.architecture in DRAFTER_ARCHS:
        raise InputFileError(f"this is a {g.architecture} drafter, not a target model; pass the target's GGUF", path)
    return target_from_gguf(g)


def read_target(path: str | Path) -> Target:
    """A target directory or a target GGUF, whichever ``path`` is."""
    path = Path(path)
    return read_target_dir(path) if path.is_dir() else read_target_gguf(path)
