"""Text -> token ids with a target's own tokenizer.json, as llama.cpp tokenizes a prompt.

``capture`` needs the target's token ids of each prompt. The ``tokenizers`` library parses the
file (data only; nothing in it runs); no chat template is rendered and no special token is added
beyond what the tokenizer's own post-processor adds, which is what llama.cpp's
``common_tokenize(..., add_special=true)`` does for byte-level BPE vocabularies without a BOS.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import InputFileError
from ..files import check_regular_file


def load_text_tokenizer(target_dir: Path) -> Callable[[str], list[int]]:
    """A function that tokenizes text with the target's tokenizer.json (for ``capture``'s prompts)."""
    path = Path(target_dir) / "tokenizer.json"
    check_regular_file(path, "tokenizer.json")
    from tokenizers import Tokenizer  # heavy (~200 MB for a large BPE): only capture tokenizes text

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the library raises its own exception type on a bad file
        raise InputFileError(f"cannot load tokenizer.json: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                             path) from None
    return lambda text: tok.encode(text).ids
