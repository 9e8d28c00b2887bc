"""Choose the vocabulary route by the target's architecture, as llama.cpp's converter does.

A drafter carries its target's tokenizer. The route (which tokenizer.ggml.model, whether a
pre-tokenizer hash is involved) depends on the target family, so we dispatch on the target's
``architectures[0]``, never on the drafter's.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputFileError
from ..format.keys import TOKENIZER_MODEL_BPE, key
from ..metadata import Metadata
from ..target import Target
from .bpe import read_bpe_vocab
from .cache import TokenizerCache, copy_keys, entry_key
from .from_gguf import copy_tokenizer_keys
from .gemma4 import write_gemma4_vocab
from .probe import Probe
from .special import check_tokenizer_config, load_tokenizer_file, read_special_tokens

BPE, GEMMA4 = TOKENIZER_MODEL_BPE, "gemma4"  # the two routes: byte-level BPE (tokenizer.json), Gemma-4's own
# target architecture -> vocabulary route
ROUTES: dict[str, str] = {
    "Qwen2ForCausalLM": BPE,
    "Qwen3ForCausalLM": BPE,
    "Qwen3MoeForCausalLM": BPE,
    "Qwen3NextForCausalLM": BPE,
    "Qwen3_5ForCausalLM": BPE,
    "Qwen3_5ForConditionalGeneration": BPE,
    "Qwen3_5MoeForCausalLM": BPE,
    "Qwen3_5MoeForConditionalGeneration": BPE,
    "LlamaForCausalLM": BPE,  # Llama-3.x: byte-level BPE in tokenizer.json
    "GptOssForCausalLM": BPE,
    "Gemma4ForCausalLM": GEMMA4,
    "Gemma4ForConditionalGeneration": GEMMA4,
}


def borrow_from_dir(md: Metadata, target_dir: Path, architecture: str | None, vocab_size: int | None,
                    tokenizer_pre: str | None = None, cache: TokenizerCache | None = None) -> int:
    """Write the tokenizer keys llama.cpp would write for this target; returns the token count."""
    route = ROUTES.get(architecture or "")
    if route is None:
        raise InputFileError(
            f"no tokenizer route for target architecture {architecture!r}; convert the target with "
            "llama.cpp and pass --target-gguf TARGET.gguf to copy its tokenizer", target_dir / "config.json")
    if route == BPE:
        if (target_dir / "tokenizer.model").is_file() and architecture.startswith(("Qwen", "Llama")):  # type: ignore[union-attr]
            raise InputFileError(
                "target ships a SentencePiece tokenizer.model, which llama.cpp would convert as an SPM "
                "vocabulary; pass --target-gguf with the converted target instead", target_dir)
        if not (target_dir / "tokenizer.json").exists():  # a FIFO or device there is refused by the probe, by name
            raise InputFileError("target has no tokenizer.json (pass --target-gguf with the converted target instead)", target_dir)
    if cache is None or cache.directory is None:
        return _build(md, target_dir, route, vocab_size, tokenizer_pre)
    cache_key = entry_key(target_dir, route, architecture, vocab_size, tokenizer_pre)
    cached = cache.lookup(cache_key) if cache_key is not None else None
    if cached is not None:
        copy_keys(cached, md)
        return len(cached.get(key("tok_tokens")))
    built = Metadata()
    n_tokens = _build(built, target_dir, route, vocab_size, tokenizer_pre)
    # stored only if the files are still those the key was made of (not rewritten while we read them)
    if cache_key is None or entry_key(target_dir, route, architecture, vocab_size, tokenizer_pre) != cache_key:
        cache.outcome = "uncacheable"
    else:
        cache.store(cache_key, built)
    copy_keys(built, md)
    return n_tokens


def _build(md: Metadata, target_dir: Path, route: str, vocab_size: int | None, tokenizer_pre: str | None) -> int:
    """The slow path: probe the tokenizer in a child, parse its files, derive every key."""
    if route == BPE:
        # tokenizer_config.json read and its fields typed first: a mistyped one is refused before seconds of work
        tc = load_tokenizer_file(target_dir, "tokenizer_config.json")
        if tc is not None:
            check_tokenizer_config(tc, target_dir / "tokenizer_config.json")
        # probe first, parse after: the tokenizer library's memory is gone before ours grows
        result = Probe(target_dir / "tokenizer.json").result()
        tj = load_tokenizer_file(target_dir, "tokenizer.json")
        assert tj is not None
        vocab = read_bpe_vocab(target_dir, tj, tc or {}, vocab_size, result, tokenizer_pre)
        md.set("tok_model", TOKENIZER_MODEL_BPE)
        md.set("tok_pre", vocab.pre)
        md.set("tok_tokens", vocab.tokens)
        md.set("tok_token_type", vocab.token_types)
        read_special_tokens(target_dir, tj, tc).write(md)
        return len(vocab.tokens)
    return write_gemma4_vocab(md, target_dir)


def borrow_from_gguf(md: Metadata, target: Target) -> int:
    """Every tokenizer key of a GGUF target, verbatim; returns the token count."""
    return copy_tokenizer_keys(target, md)
