"""The byte-level BPE route (tokenizer.ggml.model = "gpt2"): Qwen3, Qwen3.5/3.6, Llama-3, gpt-oss.

The token list, token types and pre-tokenizer name are what llama.cpp's converter derives from the
same tokenizer.json; the pre-tokenizer is identified by the probe-text hash (pre_hashes.py).
tokenizer.json is loaded with the `tokenizers` library, which parses data and runs no code.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputFileError
from ..format.keys import TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED, TOKEN_TYPE_USER_DEFINED
from ..sources.checkpoint import read_json
from .pre_hashes import PRE_TOKENIZER_HASHES, PROBE_TEXT

# Added tokens that look special are typed CONTROL even when not flagged special (llama.cpp rule).
_SPECIAL_LOOKING = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
# transformers' clean_up_tokenization: applied on decode when tokenizer_config asks for it
_CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def looks_special(text: str) -> bool:
    return (text in _SPECIAL_LOOKING
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


def load_tokenizer(target_dir: Path):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer

    path = target_dir / "tokenizer.json"
    if not path.is_file():
        raise InputFileError("target has no tokenizer.json (pass --target-gguf with the converted target instead)", target_dir)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises plain Exceptions on bad files
        raise InputFileError(f"cannot load tokenizer.json: {str(e).splitlines()[0]}", path) from e


def probe_hash(tokenizer) -> str:
    """sha256 of str(token ids of the probe text), the fingerprint llama.cpp hashes."""
    ids = tokenizer.encode(PROBE_TEXT).ids
    return hashlib.sha256(str(ids).encode()).hexdigest()


def identify_pre_tokenizer(tokenizer, target_dir: Path, override: str | None = None) -> str:
    if override:
        return override
    h = probe_hash(tokenizer)
    if h not in PRE_TOKENIZER_HASHES:
        raise InputFileError(
            f"BPE pre-tokenizer not recognized (probe hash {h}); if you know which llama.cpp "
            "pre-tokenizer it is, pass --tokenizer-pre NAME (e.g. qwen2, qwen35, llama-bpe, gpt-4o), "
            "or pass --target-gguf with the converted target", target_dir / "tokenizer.json")
    return PRE_TOKENIZER_HASHES[h][0]


@dataclass
class BpeVocab:
    tokens: list[str]
    token_types: list[int]
    pre: str


def read_bpe_vocab(target_dir: Path, vocab_size: int | None, tokenizer_pre: str | None = None) -> BpeVocab:
    """Token list padded to ``vocab_size`` (the draft's), token types, and the pre-tokenizer name."""
    tok = load_tokenizer(target_dir)
    vocab = tok.get_vocab(with_added_tokens=True)
    n = vocab_size if vocab_size is not None else len(vocab)
    top = max(vocab.values())
    if top >= n:
        raise InputFileError(f"tokenizer has token id {top}, not below the draft's vocab_size {n}", target_dir / "tokenizer.json")
    pre = identify_pre_tokenizer(tok, target_dir, tokenizer_pre)
    added = tok.get_added_tokens_decoder()  # id -> AddedToken
    added_contents = {a.content for a in added.values()}
    tc_path = target_dir / "tokenizer_config.json"
    tc = read_json(tc_path, "tokenizer_config.json") if tc_path.is_file() else {}
    cleanup = bool(isinstance(tc, dict) and tc.get("clean_up_tokenization_spaces", False))

    reverse = {i: t for t, i in vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        text = reverse.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_TYPE_UNUSED)
            continue
        if text in added_contents and i in added:
            info = added[i]
            if not info.normalized:
                # llama.cpp expects CONTROL/USER_DEFINED tokens pre-normalized: round-trip them
                text = tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)
                if cleanup:
                    for a, b in _CLEANUPS:
                        text = text.replace(a, b)
            if info.special or looks_special(text):
                types.append(TOKEN_TYPE_CONTROL)
            else:
                text = text.replace("\u2581", " ")
                types.append(TOKEN_TYPE_USER_DEFINED)
        else:
            types.append(TOKEN_TYPE_NORMAL)
        tokens.append(text)
    return BpeVocab(tokens, types, pre)
