"""Copy every tokenizer.* key, verbatim, from an already converted target GGUF.

This is the exact vocabulary the runtime will pair the drafter with: no hash table, no tokenizer
library, no version drift. Strings stay raw bytes so the copy is byte-identical.
"""

from __future__ import annotations

from ..errors import InputFileError
from ..format.keys import TOKENIZER_PREFIX, key
from ..metadata import Metadata
from ..target import Target


def copy_tokenizer_keys(target: Target, md: Metadata) -> int:
    """Copy a GGUF target's tokenizer keys into ``md``; returns its token count."""
    g = target.gguf
    assert g is not None, "copy_tokenizer_keys needs a GGUF target"
    for name, v in g.metadata.items():
        if name.startswith(TOKENIZER_PREFIX):
            md.set_raw(name, v.vtype, v.value, v.sub)
    if key("tok_model") not in md or key("tok_tokens") not in md:
        raise InputFileError(f"target GGUF has no tokenizer ({key('tok_model')}/{key('tok_tokens')} missing)", g.path)
    return len(md.get(key("tok_tokens")))
