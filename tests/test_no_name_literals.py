"""Key and tensor names are spelled only in dflash_convert/format/: a scan of the package source.

Every string literal outside format/ (plain strings and the literal parts of f-strings) is
checked against the format tables: a full GGUF key ("dflash.target_layers", "tokenizer.ggml.tokens",
"general.architecture", ...), a dotted GGUF tensor name ("token_embd.weight", "blk.0.attn_q.weight")
or a dotted Hugging Face tensor name ("self_attn.q_proj.weight", "model.embed_tokens.weight") may
not appear anywhere in it, and a bare tensor name ("d2t"), the architecture name ("dflash"), the BPE
tokenizer model ("gpt2") or a key prefix ("dflash.", "split.") may not be the whole literal. Code
asks the tables (``key("target_layers")``, ``format.rules.OUTPUT_TENSOR``) instead.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from dflash_convert.format.keys import (
    ADD_SPECIAL_TOKEN_KEYS,
    ARCH,
    ARCH_PREFIX,
    KEYS,
    SPECIAL_TOKEN_ID_KEYS,
    SPLIT_PREFIX,
    TOKENIZER_MODEL_BPE,
    key,
)
from dflash_convert.format.rules import HEAD_GLOBAL, HEAD_PER_LAYER, OPTIONAL_GLOBAL, OPTIONAL_PER_LAYER
from dflash_convert.format.tensors import (
    FAMILY_GLOBAL_TENSORS,
    FAMILY_LAYER_TENSORS,
    GEMMA4_LAYER_TENSORS,
    GLOBAL_TENSORS,
    LAYER_TENSORS,
    REQUIRED_GLOBAL,
    REQUIRED_PER_LAYER,
    TARGET_WEIGHT_NAMES,
)

PACKAGE = Path(__file__).resolve().parent.parent / "dflash_convert"
FORMAT = PACKAGE / "format"

FULL_KEYS = {key(short) for short in KEYS} | set(SPECIAL_TOKEN_ID_KEYS.values()) | set(ADD_SPECIAL_TOKEN_KEYS.values())
GGUF_TENSORS = (set(GLOBAL_TENSORS.values()) | set(REQUIRED_GLOBAL) | set(OPTIONAL_GLOBAL) | set(HEAD_GLOBAL)
                | set(LAYER_TENSORS.values()) | set(REQUIRED_PER_LAYER) | set(OPTIONAL_PER_LAYER) | set(HEAD_PER_LAYER))
DOTTED = {n for n in GGUF_TENSORS if "." in n}
BARE = GGUF_TENSORS - DOTTED
HF_TENSORS = (set(GLOBAL_TENSORS) | set(LAYER_TENSORS) | set(FAMILY_GLOBAL_TENSORS) | set(FAMILY_LAYER_TENSORS)
              | set(GEMMA4_LAYER_TENSORS) | {n for names in TARGET_WEIGHT_NAMES.values() for n in names})
DOTTED_HF = {n for n in HF_TENSORS if "." in n} - DOTTED  # the GGUF spelling of fc.weight is the HF one
WHOLE = {ARCH, ARCH_PREFIX, TOKENIZER_MODEL_BPE, SPLIT_PREFIX}  # literals that are a fact of the format by themselves
# a key written out by hand: "<arch or tokenizer or general>.<something>"
KEY_SHAPE = re.compile(rf"(?<![\w.])(?:{ARCH}|tokenizer|general)\.[a-z_]+(?:\.[a-z_]+)*\b")
LAYER_NAME = re.compile(r"\bblk\.(?:\d+|\{[^}]*\})\.")


def _literals(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    """Docstrings explain the format in prose and may name keys; they are not code."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def offending(text: str) -> str | None:
    for k in FULL_KEYS:
        if k in text:
            return k
    m = KEY_SHAPE.search(text)
    if m and not m.group(0).endswith((".json", ".model", ".safetensors", ".py")):
        return m.group(0)
    for n in DOTTED:
        if re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", text):
            return n
    if LAYER_NAME.search(text):
        return LAYER_NAME.search(text).group(0)
    if text.startswith("blk.") or text == "blk":  # the literal head of an f-string f"blk.{i}.{suffix}"
        return "blk."
    for n in DOTTED_HF:  # HF names follow a prefix ("layers.3.", "model."), so a dot may precede them
        if re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text):
            return n
    if text in BARE or text in WHOLE:
        return text
    return None


def scan() -> list[str]:
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if FORMAT in path.parents:
            continue
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                bad = offending(node.value)
                if bad:
                    hits.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {bad!r} in {node.value[:70]!r}")
    return hits


def test_no_key_or_tensor_name_literals_outside_format():
    hits = scan()
    assert hits == [], "spell these through dflash_convert/format/:\n" + "\n".join(hits)


def test_the_scan_finds_literals():
    assert offending("dflash.target_layers is missing") == "dflash.target_layers"
    assert offending("tokenizer.ggml.tokens") is not None
    assert offending("x token_embd.weight y") == "token_embd.weight"
    assert offending("blk.3.attn_q.weight") is not None
    assert offending("blk.") is not None
    assert offending("d2t") == "d2t"
    assert offending("d2t has shape [3]") is None  # prose about the HF d2t tensor
    assert offending("tokenizer.json") is None and offending("config.json") is None
    assert offending("dflash") == "dflash" and offending("gpt2") == "gpt2" and offending("split.") == "split."
    assert offending("dflash-convert") is None  # the tool's name is not the architecture
    assert offending("layers.0.self_attn.q_proj.weight") == "self_attn.q_proj.weight"
    assert offending("model.embed_tokens.weight") is not None
