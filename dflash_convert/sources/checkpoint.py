"""Read a Hugging Face checkpoint directory: config.json plus single-file or sharded safetensors.

Only files are read; no code from the directory is ever imported or executed.
Tensor order follows llama.cpp's converter, so our output orders tensors the same way:
shards in sorted file-name order, and within a shard tensors sorted by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputFileError
from ..files import check_directory, parse_json, read_regular_bytes
from .config import ConfigView
from .safetensors import TensorRef, _reject_duplicates, read_header

INDEX_NAME = "model.safetensors.index.json"
MAX_CONFIG_BYTES = 16 * 1024 * 1024
# tokenizer.json of large vocabularies is 10-35 MB; allow well beyond, refuse the absurd
MAX_TOKENIZER_BYTES = 512 * 1024 * 1024


def read_json(path: Path, what: str, limit: int | None = None) -> Any:
    """Read a JSON file with one-line errors, rejecting oversized files; configs also reject duplicate keys (a hidden setting)."""
    tokenizer_file = path.name.startswith("tokenizer")
    if limit is None:
        limit = MAX_TOKENIZER_BYTES if tokenizer_file else MAX_CONFIG_BYTES
    raw = read_regular_bytes(path, what, limit)
    return parse_json(raw, what, path, object_pairs_hook=None if tokenizer_file else _reject_duplicates)


def merged_text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config with its text_config (multimodal wrappers) merged over the top level, as a new dict."""
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) else dict(cfg)


def read_config(model_dir: Path, side: str = "drafter checkpoint") -> tuple[dict[str, Any], Path]:
    """config.json of a model directory as a dict; ``side`` names the directory in messages."""
    path = model_dir / "config.json"
    check_directory(model_dir, f"{side} directory")
    if not path.exists():
        raise InputFileError(f"no config.json in this {side} directory", model_dir)
    cfg = read_json(path, "config.json")
    if not isinstance(cfg, dict):
        raise ConfigError("config.json must hold a JSON object", path)
    ConfigView(cfg, path).get("text_config")  # merged over the top level by every reader: an object or nothing
    return cfg, path


@dataclass
class Checkpoint:
    """A checkpoint directory, indexed: its config and every tensor's location."""

    dir: Path
    config: dict[str, Any]
    config_path: Path
    files: list[Path] = field(default_factory=list)
    tensors: list[TensorRef] = field(default_factory=list)

    def by_name(self) -> dict[str, TensorRef]:
        """The checkpoint's tensors by name."""
        return {t.name: t for t in self.tensors}


def weight_files(model_dir: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files of a model directory and its index's weight map, checked (plain names, shards present)."""
    index_path = model_dir / INDEX_NAME
    if index_path.exists():
        index = read_json(index_path, INDEX_NAME)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputFileError("has no 'weight_map' object", index_path)
        for name, part in weight_map.items():
            if not isinstance(part, str) or not part or "/" in part or "\\" in part or part in (".", ".."):
                raise InputFileError(f"weight_map entry for {name!r} is not a plain file name: {part!r}", index_path)
            if not part.endswith(".safetensors"):  # a loader reading the index would unpickle a .bin or .pt
                raise InputFileError(f"weight_map entry for {name!r} names {part!r}, not a .safetensors file "
                                     "(pickle checkpoints are not read, for safety)", index_path)
        parts = sorted(set(weight_map.values()))
        for part in parts:
            if not (model_dir / part).exists():
                raise InputFileError(f"shard {part!r} listed in {INDEX_NAME} is missing", model_dir)
        return [model_dir / p for p in parts], weight_map
    parts = sorted(p.name for p in model_dir.iterdir() if p.name.startswith("model") and p.name.endswith(".safetensors"))
    if not parts:
        if any(model_dir.glob("*.bin")) or any(model_dir.glob("*.pt")):
            raise InputFileError("has no model*.safetensors file (pickle checkpoints are not read, for safety)", model_dir)
        raise InputFileError("has no model*.safetensors file", model_dir)
    return [model_dir / p for p in parts], None


def read_checkpoint(model_dir: str | Path) -> Checkpoint:
    """Index a checkpoint directory: validate every safetensors header and the shard index."""
    model_dir = Path(model_dir)
    config, config_path = read_config(model_dir, "drafter checkpoint")
    files, tensors = read_weights(model_dir)
    return Checkpoint(model_dir, config, config_path, files, tensors)


def read_weights(model_dir: Path) -> tuple[list[Path], list[TensorRef]]:
    """(weight files, every tensor in them) of a model directory: headers validated, no tensor twice, the index matching."""
    files, weight_map = weight_files(model_dir)
    tensors: list[TensorRef] = []
    seen: dict[str, Path] = {}
    for path in files:
        refs, _ = read_header(path)
        for ref in sorted(refs, key=lambda r: r.name):
            if ref.name in seen:
                raise InputFileError(f"tensor {ref.name!r} appears in both {seen[ref.name].name} and {path.name}", model_dir)
            seen[ref.name] = path
            tensors.append(ref)
    if weight_map is not None:
        missing = sorted(set(weight_map) - set(seen))
        extra = sorted(set(seen) - set(weight_map))
        if missing:
            raise InputFileError(f"{INDEX_NAME} lists tensors no shard holds: {missing[:5]}", model_dir)
        if extra:
            raise InputFileError(f"shards hold tensors {INDEX_NAME} does not list: {extra[:5]}", model_dir)
        wrong = [n for n, p in weight_map.items() if seen[n].name != p]
        if wrong:
            raise InputFileError(f"{INDEX_NAME} puts {wrong[0]!r} in {weight_map[wrong[0]]}, but it is in {seen[wrong[0]].name}", model_dir)
    return files, tensors
