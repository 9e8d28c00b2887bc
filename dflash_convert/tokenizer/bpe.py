"""The byte-level BPE route (tokenizer.ggml.model = "gpt2"): Qwen3, Qwen3.5/3.6, Llama-3, gpt-oss.

The token list, token types and pre-tokenizer name are what llama.cpp's converter derives from the
same tokenizer.json; the pre-tokenizer is identified by the probe-text hash (pre_hashes.py).
Vocabulary and added tokens are read from tokenizer.json as data; only the hash and the round
trip of non-normalized added tokens need a real tokenizer (probe.py, in a child process).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputFileError
from ..format.keys import TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED, TOKEN_TYPE_USER_DEFINED
from ..sources.config import ConfigView
from .pre_hashes import KNOWN_PRE_NAMES, PRE_TOKENIZER_HASHES
from .probe import ProbeResult

# Added tokens that look special are typed CONTROL even when not flagged special (llama.cpp rule).
_SPECIAL_LOOKING = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
# transformers' clean_up_tokenization: applied on decode when tokenizer_config asks for it
_CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def looks_special(text: str) -> bool:
    """Whether a token's text looks like a control token (``<|...|>``, ``<unused..>``, ...)."""
    return (text in _SPECIAL_LOOKING
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


@dataclass(frozen=True)
class AddedToken:
    """One added token of a tokenizer.json."""
    id: int
    content: str
    special: bool
    normalized: bool


def added_tokens(tj: dict[str, Any], where: Path) -> dict[int, AddedToken]:
    """The added tokens of a tokenizer.json by id, each entry checked."""
    out: dict[int, AddedToken] = {}
    for a in tj.get("added_tokens") or []:
        if not isinstance(a, dict) or not isinstance(a.get("id"), int) or not isinstance(a.get("content"), str):
            raise InputFileError(f"malformed added_tokens entry {str(a)[:80]}", where)
        out[a["id"]] = AddedToken(a["id"], a["content"], bool(a.get("special", False)), bool(a.get("normalized", True)))
    return out


def full_vocab(tj: dict[str, Any], where: Path) -> dict[str, int]:
    """Token text -> id, base vocabulary plus added tokens (what the tokenizer reports)."""
    model = tj.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict):
        raise InputFileError("tokenizer.json has no model.vocab object", where)
    out = dict(vocab)
    for a in added_tokens(tj, where).values():
        out[a.content] = a.id
    if not all(isinstance(i, int) and i >= 0 for i in out.values()):
        raise InputFileError("tokenizer.json vocabulary has a non-integer or negative id", where)
    return out


def pre_tokenizer_name(probe_hash: str, where: Path) -> str:
    """llama.cpp's pre-tokenizer name for a probe hash; refuses an unknown hash, naming ``--tokenizer-pre``."""
    if probe_hash not in PRE_TOKENIZER_HASHES:
        raise InputFileError(
            f"BPE pre-tokenizer not recognized (probe hash {probe_hash}); if you know which llama.cpp "
            "pre-tokenizer it is, pass --tokenizer-pre NAME (e.g. qwen2, qwen35, llama-bpe, gpt-4o), "
            "or pass --target-gguf with the converted target", where)
    return PRE_TOKENIZER_HASHES[probe_hash][0]


@dataclass
class BpeVocab:
    """A BPE vocabulary as GGUF stores it: tokens, token types and the pre-tokenizer name."""
    tokens: list[str]
    token_types: list[int]
    pre: str


def read_bpe_vocab(target_dir: Path, tj: dict[str, Any], tc: dict[str, Any], vocab_size: int | None,
                   result: ProbeResult, tokenizer_pre: str | None = None) -> BpeVocab:
    """Token list padded to ``vocab_size``, token types and pre-tokenizer name (``result``: the probe of the same tokenizer.json)."""
    where = target_dir / "tokenizer.json"
    added = added_tokens(tj, where)
    vocab = full_vocab(tj, where)
    n = vocab_size if vocab_size is not None else len(vocab)
    top = max(vocab.values())
    if top >= n:
        raise InputFileError(f"tokenizer has token id {top}, not below the draft's vocab_size {n}", where)
    cleanup = ConfigView(tc, target_dir / "tokenizer_config.json").flag("clean_up_tokenization_spaces")
    reverse = {i: t for t, i in vocab.items()}
    del vocab
    if tokenizer_pre is not None and tokenizer_pre not in KNOWN_PRE_NAMES:
        raise ConfigError(f"--tokenizer-pre {tokenizer_pre!r} is not a pre-tokenizer llama.cpp 0c1e57098 knows "
                          f"(it would refuse to load the file); choose from: {', '.join(sorted(KNOWN_PRE_NAMES))}")
    pre = tokenizer_pre or pre_tokenizer_name(result.probe_hash, where)
    added_contents = {a.content for a in added.values()}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        text = reverse.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_TYPE_UNUSED)
            continue
        info = added.get(i)
        if info is not None and text in added_contents:
            if not info.normalized:
                # llama.cpp expects CONTROL/USER_DEFINED tokens pre-normalized: round-trip them
                text = result.roundtrip.get(text, text)
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
