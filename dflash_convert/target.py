"""What the converter needs to know about the target model: from its config.json or its GGUF.

Only config and tokenizer files are read from a target directory, never its weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, InputFileError
from .sources.checkpoint import _weight_files, merged_text_config, read_config
from .sources.safetensors import TensorRef, read_header

# where a target checkpoint keeps its token embedding and output head (first found wins)
TARGET_WEIGHT_NAMES: dict[str, tuple[str, ...]] = {
    "embed": ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight",
              "language_model.model.embed_tokens.weight"),
    "head": ("lm_head.weight", "model.lm_head.weight", "language_model.lm_head.weight"),
}


@dataclass
class TargetInfo:
    source: Path
    architecture: str | None
    hidden_size: int | None
    num_hidden_layers: int | None
    vocab_size: int | None
    uses_mrope: bool
    config: dict[str, Any]
    _weights: dict[str, TensorRef] | None = field(default=None, repr=False)

    def text_config(self) -> dict[str, Any]:
        return merged_text_config(self.config)

    def weights(self) -> dict[str, TensorRef] | None:
        """The target's embedding and head (headers only; data is read on demand), or None."""
        if self._weights is None:
            self._weights = {}
            if self.source.is_dir() and (any(self.source.glob("model*.safetensors"))
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


def read_target_dir(target_dir: str | Path) -> TargetInfo:
    target_dir = Path(target_dir)
    cfg, path = read_config(target_dir)
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    text = merged_text_config(cfg)
    inner = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    rope = inner.get("rope_parameters") or inner.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ConfigError("rope_parameters/rope_scaling must be an object", path)

    def as_int(key: str) -> int | None:
        v = text.get(key)
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"target {key} must be a positive integer, got {v!r}", path)
        return v

    return TargetInfo(
        source=target_dir,
        architecture=arch,
        hidden_size=as_int("hidden_size"),
        num_hidden_layers=as_int("num_hidden_layers"),
        vocab_size=as_int("vocab_size"),
        uses_mrope="mrope_section" in rope,
        config=cfg,
    )


def target_from_gguf_facts(path: Path, facts: dict[str, object]) -> TargetInfo:
    """TargetInfo from the facts copy_tokenizer_keys gathered while reading a target GGUF."""
    if "architecture" not in facts:
        raise InputFileError("target GGUF has no general.architecture", path)
    return TargetInfo(
        source=path,
        architecture=str(facts["architecture"]),
        hidden_size=facts.get("embedding_length"),  # type: ignore[arg-type]
        num_hidden_layers=facts.get("block_count"),  # type: ignore[arg-type]
        vocab_size=facts.get("n_tokens"),  # type: ignore[arg-type]
        uses_mrope=False,
        config={},
    )
