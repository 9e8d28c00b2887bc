"""The Gemma-4 route (tokenizer.ggml.model = "gemma4"): SPM-style byte-fallback BPE from tokenizer.json.

Gemma-4 ships no tokenizer.model; llama.cpp reads the BPE from tokenizer.json (no pre-tokenizer
hash is involved, which is why routing a Gemma-4 target through the Qwen path fails with "BPE
pre-tokenizer was not recognized"). Token list = base vocabulary in id order, then added tokens
beyond it; every score is -1000; byte tokens <0xNN> are BYTE, the named/extra special tokens are
CONTROL, a few chat-syntax tokens are forced USER_DEFINED so they render.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import InputFileError
from ..format.keys import ADD_SPECIAL_TOKEN_KEYS, TOKEN_TYPE_BYTE, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED, ValueType
from ..metadata import Metadata
from ..sources.config import ConfigView
from .bpe import added_tokens, full_vocab
from .special import load_tokenizer_files, read_special_tokens

SCORE = -1000.0
NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Chat-syntax tokens llama.cpp types USER_DEFINED for Gemma-4, so its chat parser can read them.
VISIBLE_TOKENS = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                            "<tool_response|>", '<|"|>'})
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _content(entry: Any, tcv: ConfigView, attr: str) -> str | None:
    if isinstance(entry, dict):
        entry = ConfigView(entry, tcv.path, f"{attr}.").get("content")
    return entry if isinstance(entry, str) else None


def special_token_texts(tc: dict[str, Any], where: Path | None = None) -> list[str]:
    """Named special tokens, then extra/additional ones, as a transformers tokenizer lists them."""
    tcv = ConfigView(tc, where or Path("tokenizer_config.json"))
    out: list[str] = []
    for attr in NAMED_SPECIALS:
        t = _content(tcv.get(attr), tcv, attr)
        if t is not None and t not in out:
            out.append(t)
    extra = tcv.get("extra_special_tokens", tcv.get("additional_special_tokens")) or []
    items = extra.values() if isinstance(extra, dict) else extra
    for e in items:
        t = _content(e, tcv, "extra_special_tokens")
        if t is not None and t not in out:
            out.append(t)
    return out


def write_gemma4_vocab(md: Metadata, target_dir: Path) -> int:
    """Write a Gemma-4 target's byte-fallback BPE vocabulary into ``md``; returns the token count."""
    tj_path = target_dir / "tokenizer.json"
    tj, tc = load_tokenizer_files(target_dir)
    if tj is None:
        raise InputFileError("Gemma-4 target has no tokenizer.json", target_dir)
    model = tj.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE" or not model.get("byte_fallback", False) \
            or (tj.get("decoder") or {}).get("type") != "Sequence":
        raise InputFileError("not a Gemma-4 style tokenizer (needs a byte-fallback BPE with a Sequence decoder)", tj_path)
    vocab = full_vocab(tj, tj_path)
    base = len(model["vocab"])
    special_ids = {vocab[t] for t in special_token_texts(tc or {}, target_dir / "tokenizer_config.json") if t in vocab}
    added = sorted((i, a.content) for i, a in added_tokens(tj, tj_path).items() if i >= base)
    reverse = {i: t for t, i in vocab.items()}

    tokens: list[str] = []
    types: list[int] = []
    for i in range(base):
        text = reverse.get(i)
        if text is None:
            raise InputFileError(f"tokenizer.json has no token with id {i} below its vocabulary size {base}", tj_path)
        tokens.append(text)
        types.append(TOKEN_TYPE_BYTE if _BYTE_TOKEN.fullmatch(text) else TOKEN_TYPE_CONTROL if i in special_ids else TOKEN_TYPE_NORMAL)
    for i, text in added:
        tokens.append(text)
        types.append(TOKEN_TYPE_CONTROL if i in special_ids else TOKEN_TYPE_USER_DEFINED)
    types = [TOKEN_TYPE_USER_DEFINED if t in VISIBLE_TOKENS else ty for t, ty in zip(tokens, types, strict=True)]

    md.set("tok_model", "gemma4")
    md.set("tok_tokens", tokens)
    md.set("tok_scores", [SCORE] * len(tokens))
    md.set("tok_token_type", types)
    read_special_tokens(target_dir, tj, tc).write(md)
    md.set("tok_add_space_prefix", False)
    md.set_raw(ADD_SPECIAL_TOKEN_KEYS["bos"], ValueType.BOOL, True)
    return len(tokens)
