"""What differs between a drafter GGUF and its checkpoint, named: the second half of ``check``.

Hyper-parameters are compared as the float32 the GGUF stores; tensors against what the file's
storage type can cost (``WEIGHT_REL_RMS``). Any difference is a defect. Specification (what a
failure names): docs/check.md, "What differs".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..drafter import Drafter, DrafterTensor
from ..format.tensors import strip_model_prefix
from ..sources.safetensors import TensorRef
from ..tensor_source import NeoxPermuted, RowOverride, TensorSource
from .weights import source_values

# fields of Drafter that change what the forward computes (origin, context length and key positions
# are not among them; of the family's parts DSpark's are listed here, DFlash2's compared below: the
# runner runs both)
FORWARD_FIELDS = ("n_layers", "hidden_size", "intermediate_size", "n_head", "n_head_kv", "head_dim", "rms_eps",
                  "vocab_size", "mask_token_id", "target_layers", "block_size", "rope_theta", "rope_scaling",
                  "rope_sections", "n_rot", "sliding_window", "swa_pattern", "causal", "value_scale",
                  "embedding_scale", "hidden_act", "draft_vocab_size", "attention_scale",
                  # DSpark: the block layout and the heads the driver reads
                  "sample_from_anchor", "markov", "has_confidence_head")

# DFlash2's parts (Drafter.conv, Drafter.selector): field -> the key it is read from, for the message
PART_FIELDS: dict[str, dict[str, str]] = {
    "conv": {"kernel_size": "conv_kernel_size", "group_size": "conv_group_size"},
    "selector": {"rank": "selector_rank", "top_k": "selector_top_k"},
}
DFLASH2_FORWARD_FIELDS = ("logit_scale", "final_logit_softcapping")  # applied in-graph for DFlash2 only

# relative RMS error a storage type may add to a weight: measured on normal-distributed rows with our
# quantizers, doubled for headroom; a swapped matrix (~1.4) or a norm scaled by 1.5 (0.5) is far beyond
WEIGHT_REL_RMS: dict[str, float] = {
    "F32": 1e-6, "F64": 1e-6, "I64": 0.0, "I32": 0.0, "F16": 5e-4, "BF16": 4e-3, "Q8_0": 1e-2,
    "Q6_K": 2e-2, "Q5_0": 7e-2, "Q5_1": 7e-2, "Q5_K": 7e-2, "Q4_0": 0.14, "Q4_1": 0.14, "Q4_K": 0.14,
    "IQ4_NL": 0.1, "IQ4_XS": 0.1, "Q3_K": 0.25, "Q2_K": 0.5,
    "TQ1_0": 1.0, "TQ2_0": 1.0,  # ternary with d = max|x| rounds most of a normal row to 0 (measured 0.81)
    "IQ3_XXS": 0.45, "IQ3_S": 0.35, "Q1_0": 0.9, "Q2_0": 1.0,  # measured 0.60 and 0.71: a swapped matrix is ~1.4
    # measured with a flat importance 0.34, 0.30, 0.25, 0.49, 0.45; a skewed imatrix moves error to unimportant columns
    "IQ2_XXS": 0.8, "IQ2_XS": 0.7, "IQ2_S": 0.6, "IQ1_S": 1.0, "IQ1_M": 1.0,
}
CHUNK_ELEMENTS = 1 << 22

# a tensor's values already decoded by whoever ran it (the runner's weights, the reference's tensors),
# or None: then they are decoded here, in row chunks
Decoded = Callable[[DrafterTensor], "torch.Tensor | None"]


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
    dflash2 = file.selector is not None or checkpoint.selector is not None
    for name in FORWARD_FIELDS + (DFLASH2_FORWARD_FIELDS if dflash2 else ()):
        a, b = _as_f32(getattr(file, name)), _as_f32(getattr(checkpoint, name))
        if a != b:
            out.append(f"{name}: file {a}, checkpoint {b}")
    for part, fields in PART_FIELDS.items():
        pa, pb = getattr(file, part), getattr(checkpoint, part)
        if pa is None or pb is None:
            if (pa is None) != (pb is None):
                out.append(f"{part}: file {pa}, checkpoint {pb}")
            continue
        out += [f"{k}: file {getattr(pa, f)}, checkpoint {getattr(pb, f)}" for f, k in fields.items()
                if getattr(pa, f) != getattr(pb, f)]
    return out


def decoded_by_name(values: Mapping[str, torch.Tensor]) -> Decoded:
    """A file's tensors as the runner decoded them (``DrafterWeights.decoded``), by GGUF name."""
    return lambda t: values.get(t.gguf_name)


def decoded_from_checkpoint(tensors: Mapping[str, torch.Tensor], files: list[Path]) -> Decoded:
    """A checkpoint tensor as the reference read it, with the converter's transforms applied; None for anything else."""
    own = {Path(p).resolve() for p in files}

    def values(t: DrafterTensor) -> torch.Tensor | None:
        src: TensorSource = t.source
        permute: list[int] = []
        while isinstance(src, (NeoxPermuted, RowOverride)):
            if isinstance(src, RowOverride):
                return None
            permute.append(src.head_dim)
            src = src.inner
        if not isinstance(src, TensorRef) or src.path is None or Path(src.path).resolve() not in own:
            return None
        v = tensors.get(strip_model_prefix(src.name))
        if v is None or tuple(v.shape) != tuple(t.shape):
            return None
        for head_dim in permute:
            v = _neox_rows(v, head_dim)
        return v

    return values


def _neox_rows(v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """tensor_source.NeoxPermuted on decoded values: within each head, even rows first, then odd."""
    row = v.shape[-1] if v.dim() > 1 else 1
    return v.reshape(-1, head_dim // 2, 2, row).transpose(1, 2).reshape(v.shape)


def _squeezed(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """A shape without its leading 1s (llama-quantize drops trailing ggml dimensions of 1)."""
    dims = tuple(int(n) for n in shape)
    while len(dims) > 1 and dims[0] == 1:
        dims = dims[1:]
    return dims


def _rows(t: DrafterTensor) -> int:
    return int(t.shape[0]) if t.shape else 1


def _chunks(t: DrafterTensor, full: torch.Tensor | None, device: torch.device, step: int) -> Iterator[torch.Tensor]:
    """The tensor's values as flat float32 row chunks: from the decoded tensor when there is one, else read."""
    n = _rows(t)
    if len(t.shape) <= 1:
        v = full if full is not None else source_values(t.source, device, torch.float32)
        yield v.to(device, torch.float32).reshape(-1)
        return
    for a in range(0, n, step):
        b = min(n, a + step)
        part = full[a:b] if full is not None else source_values(t.source, device, torch.float32, rows=(a, b))
        yield part.to(device, torch.float32).reshape(-1)


def _sq_sums(x: DrafterTensor, y: DrafterTensor, device: torch.device, xv: torch.Tensor | None,
             yv: torch.Tensor | None) -> tuple[float, float]:
    """(sum (x - y)^2, sum y^2) over all elements, in row chunks; each chunk's sums in float32 dot
    products, accumulated in float64."""
    width = max(1, math.prod(x.shape[1:]))
    step = max(1, CHUNK_ELEMENTS // width)
    diff = ref = 0.0
    for a, b in zip(_chunks(x, xv, device, step), _chunks(y, yv, device, step), strict=True):
        d = a - b
        diff += float(torch.dot(d, d))
        ref += float(torch.dot(b, b))
    return diff, ref


def tensor_differences(file: Drafter, checkpoint: Drafter, device: torch.device | str = "cpu", *,
                       file_values: Decoded | None = None, checkpoint_values: Decoded | None = None) -> list[str]:
    """One line per tensor of the file whose values are not the checkpoint's (beyond its type's rounding)."""
    device = torch.device(device)
    fv = file_values or (lambda t: None)
    cv = checkpoint_values or (lambda t: None)

    def rel_rms(x: DrafterTensor, y: DrafterTensor) -> float:
        diff, ref = _sq_sums(x, y, device, fv(x), cv(y))
        return math.sqrt(diff / ref) if ref > 0 else (0.0 if diff == 0 else math.inf)

    ours = {t.gguf_name: t for t in checkpoint.tensors}
    out = []
    for t in file.tensors:
        c = ours.get(t.gguf_name)
        if c is None:
            continue
        if _squeezed(t.shape) != _squeezed(c.shape):
            out.append(f"{t.gguf_name}: shape {list(t.shape)}, checkpoint's {c.hf_name} {list(c.shape)}")
            continue
        limit = WEIGHT_REL_RMS.get(t.dtype, 0.5)
        err = rel_rms(t, c)
        if err <= limit:
            continue
        line = f"{t.gguf_name}: relative RMS error {err:.3g} against the checkpoint's {c.hf_name} (limit {limit:g} for {t.dtype})"
        twin = next((o for o in checkpoint.tensors if o is not c and tuple(o.shape) == tuple(t.shape)
                     and rel_rms(t, o) <= limit), None)
        if twin is not None:
            line += f"; it holds the checkpoint's {twin.hf_name} (swapped?)"
        else:
            num = den = 0.0
            if len(t.shape) == 1:  # a scaled vector: report the factor
                xv = next(_chunks(t, fv(t), device, 1)).double()
                yv = next(_chunks(c, cv(c), device, 1)).double()
                num, den = float((xv * yv).sum()), float((yv * yv).sum())
            if den > 0 and abs(num / den - 1) > limit:
                line += f"; about {num / den:.3g} times the checkpoint's values"
        out.append(line)
    return out


__all__ = ["FORWARD_FIELDS", "WEIGHT_REL_RMS", "decoded_by_name", "decoded_from_checkpoint", "hparam_differences",
           "tensor_differences"]
