"""Copy every tokenizer.* key, verbatim, from an already converted target GGUF.

This is the exact vocabulary the runtime will pair the drafter with: no hash table, no tokenizer
library, no version drift. Strings are kept as raw bytes so the copy is byte-identical.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputFileError
from ..format.keys import ValueType
from ..metadata import Metadata


def _read_fields(path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(path, "r").fields
    except Exception as e:  # gguf's reader raises assorted errors on bad files
        raise InputFileError(f"cannot read target GGUF: {e}", path) from e


def copy_tokenizer_keys(target_gguf: Path, md: Metadata) -> dict[str, object]:
    """Copy the target's tokenizer keys into ``md``; returns a few facts used for checks."""
    target_gguf = Path(target_gguf)
    if not target_gguf.is_file():
        raise InputFileError("target GGUF not found", target_gguf)
    fields = _read_fields(target_gguf)
    facts: dict[str, object] = {}
    copied = 0
    for name, field in fields.items():
        if name == "general.architecture":
            facts["architecture"] = bytes(field.parts[-1]).decode("utf-8", "replace")
        elif name.endswith(".embedding_length") and not name.startswith("tokenizer."):
            facts["embedding_length"] = int(field.parts[-1][0])
        elif name.endswith(".block_count") and not name.startswith("tokenizer."):
            facts["block_count"] = int(field.parts[-1][0])
        if not name.startswith("tokenizer."):
            continue
        vtype = ValueType(int(field.types[0]))
        if vtype == ValueType.ARRAY:
            sub = ValueType(int(field.types[-1]))
            if sub == ValueType.STRING:
                value = [bytes(field.parts[i]) for i in field.data]
            else:
                value = [field.parts[i].tolist()[0] for i in field.data]
            md.set_raw(name, vtype, value, sub)
        elif vtype == ValueType.STRING:
            md.set_raw(name, vtype, bytes(field.parts[-1]))
        else:
            md.set_raw(name, vtype, field.parts[-1].tolist()[0])
        copied += 1
    if "tokenizer.ggml.model" not in md or "tokenizer.ggml.tokens" not in md:
        raise InputFileError("target GGUF has no tokenizer (tokenizer.ggml.model/tokens missing)", target_gguf)
    facts["n_tokens"] = len(md.get("tokenizer.ggml.tokens"))
    facts["n_keys"] = copied
    return facts
