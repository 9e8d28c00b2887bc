"""``dflash-convert capture``: run the target once, keep what every drafter will read.

From a Hugging Face directory (transformers, safetensors only, no remote code) or a target GGUF
(llama.cpp's library). Refuses a sequence longer than the target's context and a layer the target
lacks. Specification: docs/acceptance.md, "capture".
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DFlashError, InputFileError, OptionValueError
from .files import read_regular_bytes
from .format.features import FEATURE_DTYPES, LOOKAHEAD, SCHEMA
from .format.file_types import FILE_TYPE_NAMES
from .outputs import Inputs, check_output_path
from .runtime.gguf_target import GGUFTarget, inspect_gguf_target
from .runtime.libllama import load_libllama
from .sources.config import ConfigView
from .sources.gguf_drafter import read_drafter
from .sources.prompts import MAX_PROMPTS_BYTES, read_prompts
from .sources.target import read_target_dir, read_target_weights
from .target import Target
from .tokenizer.text import load_text_tokenizer
from .write_features import FeatureWriter

ALL = "all"
# --new-tokens past any target's use (a continuation is decoded one token at a time); the target's own
# context (max_position_embeddings) bounds each sequence further
MAX_NEW_TOKENS = 1 << 16


@dataclass
class CaptureResult:
    """What a capture wrote: the file, its counts, the layers and notes."""

    output: Path
    sequences: int
    tokens: int
    layers: list[int]
    notes: list[str]


def parse_layers(spec: str | None, n_layers: int, for_draft: str | Path | None) -> list[int]:
    """--layers all | L1,L2,... (None: all) | (--for DRAFT.gguf: that drafter's target_layers); indices 0..n_layers."""
    if for_draft is not None and spec is not None:
        raise OptionValueError("--layers and --for both say which layers to store: give one of them")
    if for_draft is not None:
        layers = list(read_drafter(for_draft).target_layers)
    elif spec is None or spec == ALL:
        layers = list(range(n_layers + 1))
    else:
        try:
            layers = [int(x) for x in spec.split(",") if x.strip()]
        except ValueError:
            raise OptionValueError(f"--layers must be 'all' or comma-separated layer indices, got {spec!r}") from None
    bad = [x for x in layers if not 0 <= x <= n_layers]
    if not layers or bad:
        raise OptionValueError(f"--layers: layer input {bad[0] if bad else '?'} does not exist: the target has {n_layers} layers "
                          f"(inputs 0..{n_layers}, {n_layers} being the last layer's output)")
    return sorted(set(layers))


def capture(target_model_dir: str | Path | None, prompts_file: str | Path, out: str | Path, *, new_tokens: int = 64,
            layers: str | None = None, for_draft: str | Path | None = None, device: str = "auto", dtype: str = "f32",
            force: bool = False, progress: bool = False, target_gguf: str | Path | None = None,
            libllama: str | Path | None = None, threads: int | None = None, n_gpu_layers: int = -1,
            ctx_size: int | None = None) -> CaptureResult:
    """Capture the features of every prompt's greedy continuation into ``out``, from a target directory or GGUF."""
    if dtype not in FEATURE_DTYPES:
        raise OptionValueError(f"--dtype must be one of {', '.join(FEATURE_DTYPES)}, got {dtype!r}")
    if not 1 <= new_tokens <= MAX_NEW_TOKENS:
        raise OptionValueError(f"--new-tokens must be 1..{MAX_NEW_TOKENS}, got {new_tokens}")
    if (target_model_dir is None) == (target_gguf is None):
        raise OptionValueError("capture needs exactly one of --target-model-dir and --target-gguf")
    prompts_path = Path(prompts_file)
    inputs = Inputs()
    inputs.add_file(prompts_path)
    inputs.add_file(for_draft)
    if target_gguf is not None:
        inputs.add_file(target_gguf)
    else:
        inputs.add_directory(Path(target_model_dir))
    out = check_output_path(out, inputs, force=force)
    run = _capture_gguf if target_gguf is not None else _capture_dir
    return run(Path(target_gguf if target_gguf is not None else target_model_dir), prompts_path, out, new_tokens=new_tokens,
               layers=layers, for_draft=for_draft, device=device, dtype=dtype, force=force, progress=progress,
               libllama=libllama, threads=threads, n_gpu_layers=n_gpu_layers, ctx_size=ctx_size)


def _progress(progress: bool, total: int):
    if not progress:
        return None
    from tqdm import tqdm  # only a progress bar on a terminal needs it

    return tqdm(total=total, unit="prompt", desc="capture", disable=None, leave=False)


def _write(out: Path, sequences: list[list[int]], prompt_lengths: list[int], stored: list[int], hidden: int, dtype: str,
           meta: dict[str, str], force: bool, features_of, bar) -> tuple[Path, list[str]]:
    """Write every sequence's features (``features_of(i, tokens)`` -> [S, L, E]) sequence by sequence; commit."""
    writer = FeatureWriter(out, [len(s) for s in sequences], len(stored), hidden, FEATURE_DTYPES[dtype], meta,
                           replace=force)
    try:
        for i, (seq, n_prompt) in enumerate(zip(sequences, prompt_lengths, strict=True)):
            writer.write(i, np.asarray(seq, dtype=np.int64), n_prompt, features_of(i, seq))
            if bar is not None:
                bar.update(0.5)
        written = writer.commit()
    except BaseException:
        writer.discard()
        raise
    finally:
        if bar is not None:
            bar.close()
    return written, writer.notes


def _capture_dir(target_dir: Path, prompts_path: Path, out: Path, *, new_tokens: int, layers: str, for_draft, device: str,
                 dtype: str, force: bool, progress: bool, **_llama_only) -> CaptureResult:
    """The Hugging Face path: transformers runs the target in float32 (torch)."""
    # torch, and the runtime modules that import it: only this path runs them
    import torch

    from .runtime.capture import greedy_continuation, load_target_model, run_target
    from .runtime.device import resolve_device

    target = read_target_dir(target_dir)
    if target.n_layers is None:
        raise InputFileError("target config has no num_hidden_layers", target_dir / "config.json")
    tensors = read_target_weights(target)  # before anything is tokenized or built
    stored = parse_layers(layers, target.n_layers, for_draft)
    prompts = read_prompts(prompts_path)
    tokenizer = load_text_tokenizer(target_dir)
    encoded = [tokenizer(p) for p in prompts]
    if any(not e for e in encoded):
        raise InputFileError("a prompt encodes to no tokens", prompts_path)
    check_context(target, [len(e) for e in encoded], new_tokens, prompts_path)
    dev = resolve_device(device)
    model, decoder = load_target_model(target, dev, tensors=tensors)
    eos = eos_ids(target.config, target.source / "config.json")
    bar = _progress(progress, len(prompts))
    # the continuations first (their lengths fix the file's header), then one pass per sequence
    sequences = []
    for e in encoded:
        sequences.append(greedy_continuation(model, e, new_tokens + LOOKAHEAD, eos))
        if bar is not None:
            bar.update(0.5)
    # the target recorded absolute: accept run from another directory must not find another ./target
    meta = {"schema": SCHEMA, "target": str(target_dir.resolve()), "target_config_sha256": _sha256(target_dir / "config.json"),
            "target_architecture": target.architecture or "", "layers": json.dumps(stored), "dtype": FEATURE_DTYPES[dtype],
            "prompts_sha256": _sha256(prompts_path), "sequences": str(len(sequences)), "new_tokens": str(new_tokens),
            "eos_ids": json.dumps(sorted(eos))}
    hidden = int(target.hidden_size or 0)

    def features_of(_i: int, seq: list[int]) -> np.ndarray:
        streams, _ = run_target(model, decoder, torch.tensor(seq, dtype=torch.int64), keep=stored)
        if streams.shape[-1] != hidden:
            raise InputFileError(f"the target's hidden states are {streams.shape[-1]} wide, its config says {hidden}",
                                 target_dir)
        return streams.cpu().numpy()

    written, notes = _write(out, sequences, [len(e) for e in encoded], stored, hidden, dtype, meta, force, features_of, bar)
    return CaptureResult(written, len(sequences), sum(len(s) for s in sequences), stored, notes)


def _capture_gguf(target_path: Path, prompts_path: Path, out: Path, *, new_tokens: int, layers: str, for_draft,
                  dtype: str, force: bool, progress: bool, libllama, threads: int | None, n_gpu_layers: int,
                  ctx_size: int | None, **_torch_only) -> CaptureResult:
    """The GGUF path: llama.cpp's own library decodes the target as its tools do (no torch)."""
    info = inspect_gguf_target(target_path)
    # "all": every layer input llama.cpp records for the architecture (the last layer's output only where it does)
    stored = (list(info.layer_indices()) if layers in (None, ALL) and for_draft is None
              else parse_layers(layers, info.n_layers, for_draft))
    if stored[-1] not in info.layer_indices():
        raise DFlashError(f"--layers: llama.cpp records the inputs of layers 0..{info.layer_indices()[-1]} of a "
                          f"{info.architecture} model, not {stored[-1]}", target_path)
    prompts = read_prompts(prompts_path)
    lib = load_libllama(libllama)
    n_new = new_tokens + LOOKAHEAD
    # the vocabulary alone tokenizes the prompts, whose lengths size the context
    vocab = GGUFTarget(lib, info, vocab_only=True)
    try:
        encoded = [vocab.tokenize(p) for p in prompts]
    finally:
        vocab.close()
    if any(not e for e in encoded):
        raise InputFileError("a prompt encodes to no tokens", prompts_path)
    longest = max(range(len(encoded)), key=lambda i: len(encoded[i]))
    ctx = ctx_size or min(len(encoded[longest]) + n_new, info.context_length or len(encoded[longest]) + n_new)
    # llama-speculative-simple -n N decodes the prompt and N + 1 tokens; the lookahead past them may be cut short
    if len(encoded[longest]) + new_tokens + 1 > ctx:
        raise InputFileError(f"prompt {longest + 1} is {len(encoded[longest])} tokens: with --new-tokens {new_tokens} it "
                             f"does not fit a context of {ctx} tokens ({'--ctx-size' if ctx_size else 'the model context_length'})",
                             prompts_path)
    target = None
    try:
        target = GGUFTarget(lib, info, n_ctx=ctx, threads=threads or (os.cpu_count() or 1), n_gpu_layers=n_gpu_layers)
        bar = _progress(progress, len(prompts))
        sequences = []
        for e in encoded:
            sequences.append(target.greedy(e, min(n_new, ctx - len(e))))
            if bar is not None:
                bar.update(0.5)
        meta = {"schema": SCHEMA, "target": str(target_path.resolve()), "target_config_sha256": "",
                "target_gguf_sha256": _sha256_stream(target_path), "target_architecture": info.architecture,
                "target_file_type": FILE_TYPE_NAMES.get(info.file_type, str(info.file_type)) if info.file_type is not None
                else "", "layers": json.dumps(stored), "dtype": FEATURE_DTYPES[dtype],
                "prompts_sha256": _sha256(prompts_path), "sequences": str(len(sequences)), "new_tokens": str(new_tokens),
                "eos_ids": json.dumps(target.eog_ids())}
        written, notes = _write(out, sequences, [len(e) for e in encoded], stored, info.hidden_size, dtype, meta, force,
                                lambda _i, seq: target.layer_inputs(seq, stored), bar)
    finally:
        if target is not None:
            target.close()
    return CaptureResult(written, len(sequences), sum(len(s) for s in sequences), stored, notes)


def check_context(target: Target, prompt_lengths: list[int], new_tokens: int, prompts_path: Path) -> None:
    """Refuse a prompt whose tokens, ``new_tokens`` and the LOOKAHEAD exceed the target's context."""
    where = target.source / "config.json"
    context = ConfigView(target.text_config, where).int_("max_position_embeddings", required=False)
    if context is None:
        return
    if new_tokens + LOOKAHEAD + 1 > context:
        raise OptionValueError(f"--new-tokens {new_tokens}: with the {LOOKAHEAD}-token lookahead and a one-token prompt "
                               f"that is {new_tokens + LOOKAHEAD + 1} positions, the target's context "
                               f"(max_position_embeddings) is {context}: at most --new-tokens {context - LOOKAHEAD - 1}")
    longest = max(range(len(prompt_lengths)), key=prompt_lengths.__getitem__)
    need = prompt_lengths[longest] + new_tokens + LOOKAHEAD
    if need > context:
        raise InputFileError(f"prompt {longest + 1} is {prompt_lengths[longest]} tokens: with --new-tokens {new_tokens} "
                             f"and the {LOOKAHEAD}-token lookahead its sequence needs {need} positions, the target's "
                             f"context (max_position_embeddings) is {context}", prompts_path)


def eos_ids(config: dict, where: Path) -> set[int]:
    """The target's end-of-generation ids from its config (``eos_token_id``: an int or a list)."""
    cv = ConfigView(config, where)
    v = cv.get("eos_token_id", cv.sub("text_config").get("eos_token_id"))
    vals = v if isinstance(v, list) else [v]
    return {x for x in vals if type(x) is int and x >= 0}


def _sha256_stream(path: Path) -> str:
    """SHA-256 of a file of any size, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    return hashlib.sha256(read_regular_bytes(path, path.name, MAX_PROMPTS_BYTES << 4)).hexdigest() if os.path.exists(path) else ""
