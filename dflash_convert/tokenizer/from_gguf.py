"""Copy every tokenizer.* key, verbatim, from an already converted target GGUF.

This is the exact vocabulary the runtime will pair the drafter with: no hash table, no tokenizer
library, no version drift. Strings stay raw bytes so the copy is byte-identical.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputFileError
from ..metadata import Metadata
from ..sources.gguf import read_gguf


def copy_tokenizer_keys(target_gguf: Path, md: Metadata) -> dict[str, object]:
    """Copy the target's tokenizer keys into ``md``; returns facts about the target for checks."""
    target_gguf = Path(target_gguf)
    if not target_gguf.is_file():
        raise InputFileError("target GGUF not found", target_gguf)
    g = read_gguf(target_gguf)
    arch = g.architecture
    if arch is None:
        raise InputFileError("target GGUF has no general.architecture", target_gguf)
    if arch in ("dflash", "eagle3"):
        raise InputFileError(f"this is a {arch} drafter, not a target model; pass the target's GGUF", target_gguf)
    for name, v in g.metadata.items():
        if name.startswith("tokenizer."):
            md.set_raw(name, v.vtype, v.value, v.sub)
    if "tokenizer.ggml.model" not in md or "tokenizer.ggml.tokens" not in md:
        raise InputFileError("target GGUF has no tokenizer (tokenizer.ggml.model/tokens missing)", target_gguf)
    return {
        "architecture": arch,
        "embedding_length": g.get(f"{arch}.embedding_length"),
        "block_count": g.get(f"{arch}.block_count"),
        "n_tokens": len(md.get("tokenizer.ggml.tokens")),
    }
