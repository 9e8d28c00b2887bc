"""What differs between a drafter GGUF and its checkpoint, named: the second half of ``check``.

Why: the forward comparison says *that* a file computes something else (hidden states, tokens);
a user fixing it needs to know *what*: a rope base, the tapped target layers, two swapped
matrices, a scaled norm. Two readings of the same drafter are compared:

* ``hparam_differences``: the hyper-parameters the forward uses, read back from the file
  (``read_drafter``) and read from the checkpoint's config (the converter's reader). Floats are
  compared as the float32 the GGUF stores. Any difference is a defect of the file.
* ``tensor_differences``: every tensor the two share by GGUF name (the checkpoint's side as
  convert writes it, ``as_converted``: d2t as absolute ids, a mask row in place), decoded to float32, as a
  relative RMS error ||file - checkpoint|| / ||checkpoint||, against what the file's storage type
  can cost (``WEIGHT_REL_RMS``). A tensor beyond that is named, and when it instead matches
  another checkpoint tensor of its shape, that one is named too (a swap). Runs in row chunks, one
  tensor at a time, so memory stays at one tensor's worth.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np
import torch

from ..drafter import Drafter, DrafterTensor
from ..target import Target, read_target
from .weights import source_values

# fields of Drafter that change what the forward computes (origin, context length, key positions
# and the family's parts are not among them: the runner refuses the other members)
FORWARD_FIELDS = ("n_layers", "hidden_size", "intermediate_size", "n_head", "n_head_kv", "head_dim", "rms_eps",
                  "vocab_size", "mask_token_id", "target_layers", "block_size", "rope_theta", "rope_scaling",
                  "rope_sections", "n_rot", "sliding_window", "swa_pattern", "causal", "value_scale",
                  "embedding_scale", "hidden_act", "draft_vocab_size", "attention_scale")

# relative RMS error a storage type may add to a weight (measured on normal-distributed rows with
# our quantizers, then doubled for headroom: F16 2.1e-4, BF16 1.6e-3, Q8_0 3.6e-3, Q6_K 8e-3,
# Q5 1.6e-2 to 3.3e-2, Q4 3e-2 to 6.8e-2, IQ4 4.5e-2, Q3_K 0.1, Q2_K 0.25). A swapped matrix is off by
# ~1.4, a norm scaled by 1.5 by 0.5: far beyond every row
WEIGHT_REL_RMS: dict[str, float] = {
    "F32": 1e-6, "F64": 1e-6, "I64": 0.0, "I32": 0.0, "F16": 5e-4, "BF16": 4e-3, "Q8_0": 1e-2,
    "Q6_K": 2e-2, "Q5_0": 7e-2, "Q5_1": 7e-2, "Q5_K": 7e-2, "Q4_0": 0.14, "Q4_1": 0.14, "Q4_K": 0.14,
    "IQ4_NL": 0.1, "IQ4_XS": 0.1, "Q3_K": 0.25, "Q2_K": 0.5,
}
CHUNK_ELEMENTS = 1 << 22


def _as_f32(v: Any) -> Any:
    """A value as the file holds it: floats rounded to float32, containers element-wise."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return float(np.float32(v))
    if isinstance(v, (list, tuple)):
        return [_as_f32(x) for x in v]
    if hasattr(v, "__dataclass_fields__"):
        return {k: _as_f32(getattr(v, k)) for k in v.__dataclass_fields__}
    return v


def hparam_differences(file: Drafter, checkpoint: Drafter) -> list[str]:
    """``name: file X, checkpoint Y`` for each forward field whose two readings differ."""
    out = []
    for name in FORWARD_FIELDS:
        a, b = _as_f32(getattr(file, name)), _as_f32(getattr(checkpoint, name))
        if a != b:
            out.append(f"{name}: file {a}, checkpoint {b}")
    return out


def as_converted(checkpoint: Drafter, checkpoint_dir: str | os.PathLike, target: Target | str | os.PathLike | None) -> Drafter:
    """The checkpoint's Drafter with its vocabulary part finalized as convert writes it (d2t offsets
    -> absolute ids, a mask-embedding row in place), on copies: ``checkpoint`` is left as it was."""
    from ..sources.checkpoint import read_checkpoint
    from ..sources.vocabulary import resolve_vocabulary

    d = dataclasses.replace(checkpoint, tensors=[dataclasses.replace(t) for t in checkpoint.tensors])
    tgt = target if target is None or isinstance(target, Target) else read_target(target)
    resolve_vocabulary(d, read_checkpoint(checkpoint_dir), tgt, keep_embeddings=True)
    return d


def _rows(t: DrafterTensor) -> int:
    return int(t.shape[0]) if t.shape else 1


def _sq_sums(x: DrafterTensor, y: DrafterTensor, device: torch.device) -> tuple[float, float]:
    """(sum (x - y)^2, sum y^2) over all elements, in float64, read in row chunks."""
    n = _rows(x)
    width = max(1, math.prod(x.shape[1:]))
    step = max(1, CHUNK_ELEMENTS // width)
    diff = ref = 0.0
    for a in range(0, n, step):
        b = min(n, a + step)
        span = (a, b) if len(x.shape) > 1 else None
        xv = source_values(x.source, device, torch.float32, rows=span).to(torch.float64)
        yv = source_values(y.source, device, torch.float32, rows=span).to(torch.float64)
        diff += float((xv - yv).pow(2).sum())
        ref += float(yv.pow(2).sum())
        if span is None:
            break
    return diff, ref


def _rel_rms(x: DrafterTensor, y: DrafterTensor, device: torch.device) -> float:
    diff, ref = _sq_sums(x, y, device)
    return math.sqrt(diff / ref) if ref > 0 else (0.0 if diff == 0 else math.inf)


def tensor_differences(file: Drafter, checkpoint: Drafter, device: torch.device | str = "cpu") -> list[str]:
    """One line per tensor of the file whose values are not the checkpoint's (beyond its type's rounding)."""
    device = torch.device(device)
    ours = {t.gguf_name: t for t in checkpoint.tensors}
    out = []
    for t in file.tensors:
        c = ours.get(t.gguf_name)
        if c is None:
            continue
        if tuple(t.shape) != tuple(c.shape):
            out.append(f"{t.gguf_name}: shape {list(t.shape)}, checkpoint's {c.hf_name} {list(c.shape)}")
            continue
        limit = WEIGHT_REL_RMS.get(t.dtype, 0.5)
        err = _rel_rms(t, c, device)
        if err <= limit:
            continue
        line = f"{t.gguf_name}: relative RMS error {err:.3g} against the checkpoint's {c.hf_name} (limit {limit:g} for {t.dtype})"
        twin = next((o for o in checkpoint.tensors if o is not c and tuple(o.shape) == tuple(t.shape)
                     and _rel_rms(t, o, device) <= limit), None)
        if twin is not None:
            line += f"; it holds the checkpoint's {twin.hf_name} (swapped?)"
        else:
            num = den = 0.0
            if len(t.shape) == 1:  # a scaled vector: report the factor
                xv = source_values(t.source, device, torch.float64)
                yv = source_values(c.source, device, torch.float64)
                num, den = float((xv * yv).sum()), float((yv * yv).sum())
            if den > 0 and abs(num / den - 1) > limit:
                line += f"; about {num / den:.3g} times the checkpoint's values"
        out.append(line)
    return out


__all__ = ["FORWARD_FIELDS", "WEIGHT_REL_RMS", "as_converted", "hparam_differences", "tensor_differences"]
