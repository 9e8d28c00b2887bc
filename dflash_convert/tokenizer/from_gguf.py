"""Copy every tokenizer.* key, verbatim, from an already converted target GGUF.

This is the exact vocabulary the runtime will pair the drafter with: no hash table, no tokenizer
library, no version drift. Strings stay raw bytes so the copy is byte-identical.
"""

from __future__ import annotations

from ..errors import InputFileError
from ..format.keys import key
from ..metadata import Metadata
from ..target import Target


def copy_tokenizer_keys(target: Target, md: Metadata) -> int:
    """Copy a GGUF target's tokenizer keys into ``md``; returns its token count."""
    assert target.tokenizer is not None, "copy_tokenizer_keys needs a GGUF target"
    for kv in target.tokenizer:
        md.set_raw(kv.key, kv.vtype, kv.value, kv.sub)
    if key("tok_model") not in md or key("tok_tokens") not in md:
        raise InputFileError(f"target GGUF has no tokenizer ({key('tok_model')}/{key('tok_tokens')} missing)", target.source)
    return len(md.get(key("tok_tokens")))
