"""``check``'s inputs and outputs in torch: the draft both sides run, another GGUF run on it, the ``--save-io`` arrays.

Refuses a context below 1 and a target whose hidden size is not the drafter's. The ``--save-io``
schema: docs/check.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..drafter import Drafter
from ..errors import DFlashError, InputFileError
from ..outputs import TemporaryOutput, clear_stale_partials
from ..sources.features import FeaturesFile
from ..sources.gguf_drafter import read_drafter
from ..target import Target
from .capture import load_target_model, run_target
from .forward import ForwardResult, block_tokens, contiguous_positions, gather_features, run_gguf
from .reference import ReferenceModel, reference_features
from .weights import load_weights


def synthetic_inputs(d: Drafter, context: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target_hidden [ctx, T*E] float32, block_ids [block_size] int64, positions [ctx + block_size] int64), standard normal."""
    if context < 1:
        raise DFlashError(f"context must be at least 1, got {context}")
    g = torch.Generator().manual_seed(int(seed))
    feats = torch.randn(context, len(d.target_layers) * d.hidden_size, generator=g, dtype=torch.float32)
    anchor = int(torch.randint(0, d.vocab_size, (1,), generator=g))
    if anchor == d.mask_token_id:
        anchor = (anchor + 1) % d.vocab_size
    ids = block_tokens(d, anchor)
    return feats, ids, contiguous_positions(context, len(ids))


def captured_inputs(d: Drafter, target: Target, context: int, seed: int,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(layer inputs [n_layers + 1, ctx, E], block_ids, positions) from one pass of the target model."""
    if context < 1:
        raise DFlashError(f"context must be at least 1, got {context}")
    model, layers = load_target_model(target, device)
    n_vocab = int(model.get_input_embeddings().weight.shape[0])
    g = torch.Generator().manual_seed(int(seed))
    ctx_ids = torch.randint(0, min(d.vocab_size, n_vocab), (context,), generator=g, dtype=torch.int64)
    streams, logits = run_target(model, layers, ctx_ids)
    if streams.shape[-1] != d.hidden_size:
        raise InputFileError(f"the target's hidden size is {streams.shape[-1]}, the drafter's {d.hidden_size}", target.source)
    anchor = int(logits[-1, : d.vocab_size].argmax())
    ids = block_tokens(d, anchor)
    return streams, ids, contiguous_positions(context, len(ids))


def file_inputs(d: Drafter, model: ReferenceModel, captured: FeaturesFile,
                context: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward comparison's inputs from the first captured sequence, each side tapping its own layers."""
    seq = captured.sequences[0]
    tokens, _ = seq.read_tokens()
    n = max(1, min(context, len(tokens) - 1))
    stored = {layer: torch.from_numpy(seq.read_layer(i)[:n]) for i, layer in enumerate(captured.layers)}
    captured.slots_for(d.target_layers, "the file")
    captured.slots_for(model.drafter.target_layers, "the checkpoint")
    feats = torch.cat([stored[t] for t in d.target_layers], dim=-1)
    ids = block_tokens(d, int(tokens[n]))
    return feats, reference_features(model, stored), ids, contiguous_positions(n, len(ids))


def draft_inputs(d: Drafter, model: ReferenceModel, features: str, captured: FeaturesFile | None, target: Target | None,
                 context: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                          torch.Tensor, torch.Tensor | None]:
    """(the file's features, the checkpoint's features, block_ids, positions, the target's layer inputs or None)."""
    if captured is not None:
        feats, ref_feats, ids, pos = file_inputs(d, model, captured, context)
        return feats, ref_feats, ids, pos, None
    if features == "target":
        if target is None:
            raise DFlashError("features from the target need --target-model-dir (a directory with the target's weights)")
        streams, ids, pos = captured_inputs(d, target, context, seed, device)
        return gather_features(d, streams), reference_features(model, streams), ids, pos, streams
    feats, ids, pos = synthetic_inputs(d, context, seed)
    return feats, feats, ids, pos, None


def save_io_arrays(feats: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, gguf: ForwardResult,
                   ref: ForwardResult, draft_slots: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """The ``.npz`` arrays (docs/check.md, the ``--save-io`` schema): inputs, then each side's states, logits and drafts."""
    def f32(t: torch.Tensor) -> np.ndarray:
        return t.detach().to("cpu", torch.float32).numpy()

    def i64(t: torch.Tensor) -> np.ndarray:
        return t.detach().to("cpu", torch.int64).numpy()

    def typed(t: torch.Tensor) -> np.ndarray:
        return f32(t) if t.is_floating_point() else i64(t)

    out = {"target_hidden": f32(feats), "block_ids": i64(ids), "positions": i64(pos),
           "hidden_gguf": f32(gguf.hidden), "hidden_ref": f32(ref.hidden),
           "logits_gguf": f32(gguf.logits), "logits_ref": f32(ref.logits),
           "tokens_gguf": i64(gguf.tokens), "tokens_ref": i64(ref.tokens)}
    if draft_slots is not None:
        out["draft_slots"] = i64(draft_slots)
        if gguf.confidence is not None and ref.confidence is not None:
            out["confidence_gguf"], out["confidence_ref"] = f32(gguf.confidence), f32(ref.confidence)
    out.update({f"{name}_{side}": typed(v) for side, r in (("gguf", gguf), ("ref", ref)) for name, v in r.extras.items()})
    return out


def given_ref_arrays(given: ForwardResult) -> dict[str, np.ndarray]:
    """DSpark's ``--save-io`` extras: the file's logits (and confidences) conditioned on the checkpoint's draft."""
    out = {"logits_gguf_given_ref": given.logits.detach().to("cpu", torch.float32).numpy()}
    if given.confidence is not None:
        out["confidence_gguf_given_ref"] = given.confidence.detach().to("cpu", torch.float32).numpy()
    return out


def write_npz_atomic(out: Path, arrays: dict[str, np.ndarray]) -> list[str]:
    """Write through a temporary file beside ``out`` (``outputs.TemporaryOutput``), then rename; returns the notes."""
    notes = clear_stale_partials(out, force=False)
    with TemporaryOutput(out) as tmp:
        try:
            with os.fdopen(os.dup(tmp.fd), "wb") as f:
                np.savez(f, **arrays)  # a file object: numpy appends no suffix
        except OSError as e:
            raise DFlashError(f"cannot write: {e.strerror or e}", out) from e
        tmp.commit(replace=True)
    return notes


def run_other_gguf(path: str | Path, target: Target | None, device: torch.device, feats: torch.Tensor, ids: torch.Tensor,
                   pos: torch.Tensor, streams: torch.Tensor | None = None) -> tuple[Drafter, ForwardResult]:
    """Run another GGUF on the same draft (with captured streams, it taps its own layers)."""
    d = read_drafter(path)
    w = load_weights(d, target, device=device, stored=True)
    return d, run_gguf(d, w, feats if streams is None else gather_features(d, streams), ids, pos)


def write_save_io(out: Path, feats: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, gguf: ForwardResult,
                  ref: ForwardResult, *, dspark: bool, given: ForwardResult | None = None) -> list[str]:
    """Write ``--save-io``'s ``.npz``; returns the notes about temporary files a killed run left."""
    slots = torch.arange(len(ids) - gguf.tokens.shape[0], len(ids)) if dspark else None
    arrays = save_io_arrays(feats, ids, pos, gguf, ref, slots)
    if given is not None:
        arrays.update(given_ref_arrays(given))
    return write_npz_atomic(out, arrays)


__all__ = ["captured_inputs", "draft_inputs", "file_inputs", "run_other_gguf", "save_io_arrays", "synthetic_inputs", "write_save_io"]
