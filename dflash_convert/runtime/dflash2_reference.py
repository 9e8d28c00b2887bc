"""DFlash2's parts from the checkpoint (HF names, safetensors values), for ``runtime.reference``.

Shares no code with ``runtime.dflash2`` (``check`` compares the two): the convolution is a causal
depthwise convolution over the zero-padded block, the lattice one matrix product per slot, the walk
a plain loop. It refuses a checkpoint without the DFlash2 keys of ``dflash_config`` or one of its
tensors. Specification: docs/runtime.md, "DFlash2, the checkpoint side".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..drafter import Drafter
from ..errors import InputFileError
from ..format.family import (
    ATTN_CONV_BASE,
    ATTN_CONV_PROJ,
    FFN_CONV_BASE,
    FFN_CONV_PROJ,
    SELECTOR_HIDDEN,
    SELECTOR_NEXT,
    SELECTOR_PREV,
)
from ..format.tensors import gguf_to_hf, layer_name

LLAMA_CPP = "llama.cpp"  # the semantics name of runtime.reference whose candidate order is ggml's


def _hf(gguf_name: str) -> str:
    hf = gguf_to_hf(gguf_name)
    if hf is None:
        raise AssertionError(f"format table has no HF name for {gguf_name}")
    return hf


@dataclass
class CheckpointDflash2:
    """A checkpoint's DFlash2 tensors and keys."""

    kernel_size: int
    group_size: int
    top_k: int
    convs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, "attn"/"ffn") -> (base, projection)
    predecessor: torch.Tensor  # [V, r]
    successor: torch.Tensor  # [V, r]
    hidden_projection: torch.Tensor  # [r, E]
    logit_scale: float | None = None
    softcap: float | None = None

    def layer(self, i: int) -> CheckpointLayerConvs:
        """Layer ``i``'s convolutions."""
        return CheckpointLayerConvs(self, i)

    def transform(self, logits: torch.Tensor) -> torch.Tensor:
        """The output multiplier, then the final softcap."""
        if self.logit_scale:
            logits = logits * self.logit_scale
        if self.softcap:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits

    def select(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: int, semantics: str) -> dict[str, torch.Tensor]:
        """One block's candidates [n, k], lattice [n, k, k] (predecessor, successor), walk and tokens [n]."""
        k = self.top_k
        cand = torch.topk(logits, k, dim=-1).indices
        if semantics == LLAMA_CPP and k > 1:  # ggml_top_k's CPU order: sorted, then the first two exchanged
            cand = torch.cat([cand[:, 1:2], cand[:, :1], cand[:, 2:]], dim=-1)
        gate = hidden @ self.hidden_projection.T  # [n, r]
        rows = []
        for p in range(cand.shape[0]):
            preds = torch.tensor([anchor], device=cand.device) if p == 0 else cand[p - 1]
            conditioned = self.predecessor[preds] * gate[p]  # [n_pred, r]
            score = conditioned @ self.successor[cand[p]].T + logits[p, cand[p]]  # [n_pred, k]
            rows.append(score.expand(k, k))
        lattice = torch.stack(rows) if rows else torch.empty(0, k, k, dtype=logits.dtype, device=logits.device)
        chosen, walked, at = [], [], 0
        for p in range(cand.shape[0]):
            row = lattice[p, at]
            at = int(torch.argmax(row))  # first maximum, as std::max_element
            chosen.append(at)
            walked.append(row)
        idx = torch.tensor(chosen, dtype=torch.int64, device=cand.device)
        tokens = cand[torch.arange(cand.shape[0], device=cand.device), idx]
        choice = torch.full_like(logits, float("-inf"))
        if walked:
            choice.scatter_(-1, cand, torch.stack(walked))
        return {"candidates": cand, "lattice": lattice, "chosen": idx, "tokens": tokens, "choice": choice}


class CheckpointLayerConvs:
    """One layer's two dynamic convolutions over one block; each path's coefficients come from its input."""

    def __init__(self, parts: CheckpointDflash2, i: int) -> None:
        self.parts, self.i = parts, i
        self.coefficients: dict[str, torch.Tensor] = {}

    def apply(self, path: str, x: torch.Tensor, side: int) -> torch.Tensor:
        """x [n, E]; side 0 also projects the coefficients [n, 2, K, E/G] the path's side 1 reuses."""
        base, projection = self.parts.convs[(self.i, path)]
        n, E = x.shape
        K, G = self.parts.kernel_size, self.parts.group_size
        if side == 0:
            self.coefficients[path] = (x @ projection.T).view(n, 2, K, E // G)
        kernel = base[side][None] + self.coefficients[path][:, side].repeat_interleave(G, dim=-1)  # [n, K, E]
        padded = F.pad(x.T, (K - 1, 0))  # [E, n + K - 1]: K - 1 zeros before the block
        windows = padded.unfold(-1, K, 1).flip(-1)  # [E, n, K]: windows[e, t, tap] = x[t - tap, e]
        return torch.einsum("etk,tke->te", windows, kernel)


def load_checkpoint_dflash2(tensors: dict[str, torch.Tensor], d: Drafter, where: object) -> CheckpointDflash2:
    """The DFlash2 tensors of a checkpoint read by ``runtime.reference`` (HF names without ``model.``)."""
    if d.conv is None or d.selector is None:
        raise InputFileError("a DFlash2 checkpoint without conv_kernel_size / selector_top_k in its dflash_config", where)

    def need(gguf_name: str) -> torch.Tensor:
        name = _hf(gguf_name)
        if name not in tensors:
            raise InputFileError(f"tensor {name} is missing", where)
        return tensors[name]

    convs = {}
    for i in range(d.n_layers):
        convs[(i, "attn")] = (need(layer_name(i, ATTN_CONV_BASE)), need(layer_name(i, ATTN_CONV_PROJ)))
        convs[(i, "ffn")] = (need(layer_name(i, FFN_CONV_BASE)), need(layer_name(i, FFN_CONV_PROJ)))
    return CheckpointDflash2(d.conv.kernel_size, d.conv.group_size, d.selector.top_k, convs, need(SELECTOR_PREV),
                             need(SELECTOR_NEXT), need(SELECTOR_HIDDEN), d.logit_scale or None,
                             d.final_logit_softcapping or None)


__all__ = ["CheckpointDflash2", "CheckpointLayerConvs", "load_checkpoint_dflash2"]
