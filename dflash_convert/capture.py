"""``dflash-convert capture``: run the target once, keep what every drafter will read.

Why: acceptance needs the target's own greedy continuation and its hidden states at every position,
and a user's target (4B to 35B) is too big to run beside each drafter file. ``capture`` runs it once
(transformers' own class, safetensors only, remote code never executed, as ``check --features
target`` does): for each prompt (as given, one per line or JSONL; no chat template is rendered) the
greedy continuation of ``new_tokens`` + ``LOOKAHEAD`` (what llama-speculative-simple -n N verifies:
N + 1 tokens, and the full block its last step drafts), then one
pass over the finished sequence keeping the residual stream entering each stored layer. Everything
goes to one safetensors file (``format/features.py``), written sequence by sequence: memory holds
the target and one sequence's features.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import InputFileError, OptionValueError
from .files import read_regular_bytes
from .format.features import FEATURE_DTYPES, LOOKAHEAD, SCHEMA
from .outputs import Inputs, check_output_path
from .runtime.capture import greedy_continuation, load_target_model, run_target
from .runtime.device import resolve_device
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


def capture(target_model_dir: str | Path, prompts_file: str | Path, out: str | Path, *, new_tokens: int = 64,
            layers: str | None = None, for_draft: str | Path | None = None, device: str = "auto", dtype: str = "f32",
            force: bool = False, progress: bool = False) -> CaptureResult:
    """Capture the features of every prompt's greedy continuation into ``out``."""
    if dtype not in FEATURE_DTYPES:
        raise OptionValueError(f"--dtype must be one of {', '.join(FEATURE_DTYPES)}, got {dtype!r}")
    if not 1 <= new_tokens <= MAX_NEW_TOKENS:
        raise OptionValueError(f"--new-tokens must be 1..{MAX_NEW_TOKENS}, got {new_tokens}")
    prompts_path, target_dir = Path(prompts_file), Path(target_model_dir)
    inputs = Inputs()
    inputs.add_file(prompts_path)
    inputs.add_file(for_draft)
    inputs.add_directory(target_dir)
    out = check_output_path(out, inputs, force=force)
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
    bar = None
    if progress:
        from tqdm import tqdm  # only a progress bar on a terminal needs it

        bar = tqdm(total=len(prompts), unit="prompt", desc="capture", disable=None, leave=False)
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
    writer = FeatureWriter(out, [len(s) for s in sequences], len(stored), int(target.hidden_size or 0), FEATURE_DTYPES[dtype],
                           meta, replace=force)
    try:
        for i, (seq, e) in enumerate(zip(sequences, encoded, strict=True)):
            streams, _ = run_target(model, decoder, torch.tensor(seq, dtype=torch.int64), keep=stored)
            if streams.shape[-1] != writer.shape[1]:
                raise InputFileError(f"the target's hidden states are {streams.shape[-1]} wide, its config says "
                                     f"{writer.shape[1]}", target_dir)
            writer.write(i, np.asarray(seq, dtype=np.int64), len(e), streams.cpu().numpy())
            if bar is not None:
                bar.update(0.5)
        written = writer.commit()
    except BaseException:
        writer.discard()
        raise
    finally:
        if bar is not None:
            bar.close()
    return CaptureResult(written, len(sequences), sum(len(s) for s in sequences), stored, writer.notes)


def check_context(target: Target, prompt_lengths: list[int], new_tokens: int, prompts_path: Path) -> None:
    """Refuse sequences longer than the target's context (``max_position_embeddings``): each prompt, its
    ``new_tokens`` and the LOOKAHEAD are one sequence the target runs over."""
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


def _sha256(path: Path) -> str:
    return hashlib.sha256(read_regular_bytes(path, path.name, MAX_PROMPTS_BYTES << 4)).hexdigest() if os.path.exists(path) else ""
