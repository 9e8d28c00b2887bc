"""Readers of a target model: its Hugging Face directory (config and tokenizer files; the weights
only when a caller asks for the embedding or the head) or its converted GGUF.

Before a target runs, ``read_target_weights`` checks its safetensors with the hardened reader and its
config's sizes against them (repeated-module counts bounded, layers and width the weights hold), so
no model is built from a config the weights cannot fill. Specification: docs/acceptance.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputFileError
from ..files import check_regular_file
from ..format.keys import TOKENIZER_PREFIX, ValueType, key
from ..format.rules import DRAFTER_ARCHS, EMBEDDING_TENSOR, OUTPUT_TENSOR
from ..format.tensors import TARGET_WEIGHT_NAMES
from ..metadata import Metadata
from ..target import DIRECTORY, GGUF, Target, decoder_layers
from ..tensor_source import TensorSource
from .checkpoint import INDEX_NAME, merged_text_config, read_config, read_weights, weight_files
from .config import ConfigView
from .gguf import GGUFFile, read_gguf
from .gguf_drafter import as_int
from .safetensors import TensorRef, read_header
from .zlab import rope_view


def read_target_dir(target_dir: str | Path) -> Target:
    """A target model directory's config.json as a Target (architecture, sizes, M-RoPE, tied embeddings)."""
    target_dir = Path(target_dir)
    cfg, path = read_config(target_dir, "target model")
    top = ConfigView(cfg, path)
    archs = top.get("architectures")
    arch = archs[0] if archs else None
    text = ConfigView(merged_text_config(cfg), path)
    inner = top.sub("text_config") if top.has("text_config") else top
    rope = rope_view(inner)

    def positive(k: str) -> int | None:
        v = text.get(k)
        if v is not None and v <= 0:
            raise ConfigError(f"target {k} must be a positive integer, got {v!r}", path)
        return v

    return Target(
        source=target_dir,
        kind=DIRECTORY,
        architecture=arch,
        hidden_size=positive("hidden_size"),
        n_layers=decoder_layers(positive("num_hidden_layers"), 0),
        vocab_size=positive("vocab_size"),
        uses_mrope=rope.has("mrope_section"),
        config=cfg,
        text_config=text.cfg,
        tie_word_embeddings=text.flag("tie_word_embeddings"),
    )


# config keys that count repeated modules (decoder layers, vision blocks, experts): a model is built
# with one module per count before any weight is read, so each is bounded (the largest today: 126
# layers, 384 experts)
_REPEAT_KEY = re.compile(r"(layers|depth|experts)$")
MAX_REPEATS = 1024
_INDEX_PART = re.compile(r"(?:^|\.)(\d+)\.")  # model.layers.3.mlp -> 3


def read_target_weights(target: Target) -> list[TensorRef]:
    """Every tensor of a target directory's safetensors, checked, and the config's sizes checked against them."""
    where = target.source / "config.json"
    _check_repeats(target.config, where, "")
    _, tensors = read_weights(target.source)
    if target.n_layers is not None:
        top = max((int(m) for t in tensors for m in _INDEX_PART.findall(t.name)), default=-1)
        if target.n_layers > top + 1:
            held = f"no tensor has an index past {top}" if top >= 0 else "no tensor belongs to a numbered layer"
            raise InputFileError(f"num_hidden_layers is {target.n_layers}, but the target's safetensors hold at most "
                                 f"{top + 1} layers ({held})", where)
    by_name = {t.name: t for t in tensors}
    embed = next((by_name[n] for n in TARGET_WEIGHT_NAMES["embed"] if n in by_name), None)
    if embed is not None and target.hidden_size is not None and (len(embed.shape) != 2
                                                                  or embed.shape[1] != target.hidden_size):
        raise InputFileError(f"hidden_size is {target.hidden_size}, but the embedding {embed.name} has shape "
                             f"{list(embed.shape)}", where)
    return tensors


def _check_repeats(cfg: Any, where: Path, at: str) -> None:
    """Refuse a count of repeated modules (``*layers``, ``*depth``, ``*experts``) past MAX_REPEATS, at any depth."""
    if isinstance(cfg, dict):
        for k, v in cfg.items():
            name = f"{at}.{k}" if at else str(k)
            if (isinstance(v, int) and not isinstance(v, bool) and _REPEAT_KEY.search(str(k))
                    and not 0 <= v <= MAX_REPEATS):
                raise InputFileError(f"{name} is {v}, outside 0..{MAX_REPEATS}: no model is built with that many "
                                     "repeated modules", where)
            _check_repeats(v, where, name)
    elif isinstance(cfg, list):
        for i, v in enumerate(cfg):
            _check_repeats(v, where, f"{at}[{i}]")


def target_from_gguf(g: GGUFFile) -> Target:
    """A Target from a parsed GGUF (the caller decides whether a drafter architecture is an error)."""
    arch = g.architecture
    hidden = blocks = nextn = None
    if arch:
        hidden, blocks, nextn = (as_int(g.metadata.get(key(s, arch)))
                                 for s in ("embedding_length", "block_count", "nextn_predict_layers"))
    tokens = g.metadata.get(key("tok_tokens"))  # counted, never decoded

    tokenizer = Metadata()
    for name, v in g.metadata.items():
        if name.startswith(TOKENIZER_PREFIX):
            tokenizer.set_as_read(name, v.vtype, v.value, v.sub)
    weights: dict[str, TensorSource] = {}
    for role, name in (("embed", EMBEDDING_TENSOR), ("head", OUTPUT_TENSOR)):
        t = g.tensor(name)
        if t is not None:
            weights[role] = t
    return Target(
        source=g.path,
        kind=GGUF,
        architecture=arch,
        hidden_size=hidden,
        n_layers=decoder_layers(blocks, nextn),
        vocab_size=len(tokens.value) if tokens is not None and tokens.vtype == ValueType.ARRAY else None,
        uses_mrope=False,  # as the converter always did for --target-gguf: the degenerate sections equal NeoX
        tokenizer=tokenizer,
        weights=weights,
    )


def read_target_gguf(path: str | Path) -> Target:
    """A converted target model's GGUF; refuses drafters and files without an architecture."""
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


def target_tensors(t: Target) -> dict[str, TensorSource] | None:
    """The target's embedding and head as tensor sources (data read on demand), or None."""
    if t.weights is None:
        t.weights = {}
        if t.kind == DIRECTORY and (any(t.source.glob("model*.safetensors"))
                                    or (t.source / INDEX_NAME).is_file()):
            found: dict[str, TensorRef] = {}
            for path in weight_files(t.source)[0]:
                refs, _ = read_header(path)
                found.update({r.name: r for r in refs})
            for role, names in TARGET_WEIGHT_NAMES.items():
                ref = next((found[n] for n in names if n in found), None)
                if ref is not None:
                    t.weights[role] = ref
    return t.weights or None
