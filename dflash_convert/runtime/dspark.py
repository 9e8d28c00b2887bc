"""DSpark's heads: the Markov bias chained over a block and the confidence head, in torch.

Refuses what llama.cpp's loader refuses of the heads and a ``--spec-draft-p-min`` for a drafter
without a confidence head, naming the file. Specification: docs/runtime.md, "DSpark's heads".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ..drafter import Drafter
from ..errors import InputFileError
from ..format.family import (
    CONF_HF_PREFIXES,
    CONF_PROJ,
    CONF_PROJ_BIAS,
    MARKOV_W1,
    MARKOV_W1_HF,
    MARKOV_W2,
    MARKOV_W2_HF,
    MARKOV_W2_SCALE,
)
from .observe import observe

# (activations, weight type) -> the activations as the CPU backend rounds them before that matmul
RoundInput = Callable[[torch.Tensor, str], torch.Tensor]


@dataclass
class MarkovHead:
    """DSpark's head tensors from a GGUF, decoded; the confidence head is optional."""

    w1: torch.Tensor  # [V, R]: row t conditions the slot after target token t
    w2: torch.Tensor  # [Vd, R]: projects the rank-R row to a bias per (draft) vocabulary entry
    w2_scale: torch.Tensor | None  # [1] per-tensor scale of w2
    w2_type: str  # storage type of w2 (the CPU matmul rounds its input to match)
    conf_w: torch.Tensor | None  # [E + R]
    conf_b: torch.Tensor | None  # [1]
    conf_type: str
    sample_from_anchor: bool  # the driver's and the graph's reading of dflash.sample_from_anchor

    @property
    def first_slot(self) -> int:
        """The first block slot that drafts: 0 sampling from the anchor, else 1."""
        return 0 if self.sample_from_anchor else 1


def markov_head(d: Drafter, values: Mapping[str, torch.Tensor], types: Mapping[str, str]) -> MarkovHead | None:
    """The DSpark head of a GGUF drafter from its decoded tensors (by GGUF name), None for other members."""
    if MARKOV_W1 not in values:
        return None
    if MARKOV_W2 not in values:
        raise InputFileError(f"has {MARKOV_W1} but no {MARKOV_W2}: llama.cpp requires both", d.source)
    w1, w2 = values[MARKOV_W1], values[MARKOV_W2]
    if w1.dim() != 2 or w2.dim() != 2 or w1.shape[1] != w2.shape[1]:
        raise InputFileError(f"{MARKOV_W1} {list(w1.shape)} and {MARKOV_W2} {list(w2.shape)} do not share a rank", d.source)
    if w1.shape[0] != d.vocab_size:
        raise InputFileError(f"{MARKOV_W1} has {w1.shape[0]} rows, the vocabulary {d.vocab_size} tokens", d.source)
    conf_w = values.get(CONF_PROJ)
    if conf_w is not None:
        conf_w = conf_w.reshape(-1)  # {E+R, 1} as converted, {E+R} as llama-quantize writes it
        if conf_w.shape[0] != d.hidden_size + w1.shape[1]:
            raise InputFileError(f"{CONF_PROJ} has {conf_w.shape[0]} values, expected hidden {d.hidden_size} + rank "
                                 f"{w1.shape[1]}", d.source)
    conf_b = values.get(CONF_PROJ_BIAS)
    return MarkovHead(w1=w1, w2=w2, w2_scale=values.get(MARKOV_W2_SCALE), w2_type=types.get(MARKOV_W2, "F32"),
                      conf_w=conf_w, conf_b=None if conf_b is None else conf_b.reshape(-1),
                      conf_type=types.get(CONF_PROJ, "F32"), sample_from_anchor=d.sample_from_anchor is not False)


@dataclass
class MarkovDraft:
    """What the heads make of one block: the slots the driver reads, from the first drafted one."""

    logits: torch.Tensor  # [n_drafted, V] Markov-conditioned logits
    tokens: torch.Tensor  # [n_drafted] their argmax: the draft, before any p-min cut
    confidence: torch.Tensor | None  # [n_drafted] in (0, 1), None without a confidence head


@torch.no_grad()
def markov_chain(head: MarkovHead, logits: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor,
                 d2t: torch.Tensor | None, round_input: RoundInput | None = None,
                 forced: torch.Tensor | None = None) -> MarkovDraft:
    """llama.cpp's Markov head over blocks of ``logits`` [..., n_block, V] and ``hidden`` [..., n_block, E].

    ``anchor`` [...]: each block's token 0. ``round_input``: the CPU backend's activation rounding.
    ``forced`` [..., n_drafted - 1]: condition each slot after the first on these tokens instead of
    the chain's own argmax (``check`` conditions both sides alike, docs/check.md)."""
    lead, n, V = logits.shape[:-2], logits.shape[-2], logits.shape[-1]
    prev = anchor.reshape(-1).to(logits.device, torch.int64)
    base = logits.reshape(-1, n, V)
    z = hidden.reshape(-1, n, hidden.shape[-1])
    given = None if forced is None else forced.reshape(prev.shape[0], -1).to(logits.device, torch.int64)
    cols, confs = [], []
    for j, i in enumerate(range(head.first_slot, n)):
        if given is not None and j > 0:
            prev = given[:, j - 1]
        row = head.w1[prev]  # [A, R]
        observe(head.w2, row)
        r = row if round_input is None else round_input(row, head.w2_type)
        bias = r @ head.w2.T
        if head.w2_scale is not None:
            bias = bias * head.w2_scale
        if d2t is not None:  # the draft-vocabulary bias on its target rows, 0 elsewhere
            full = torch.zeros(bias.shape[0], V, dtype=bias.dtype, device=bias.device)
            full[:, d2t.to(bias.device)] = bias
            bias = full
        col = base[:, i] + bias
        cols.append(col)
        if head.conf_w is not None:
            feat = torch.cat([z[:, i], row], dim=-1)
            observe(head.conf_w, feat)
            if round_input is not None:
                feat = round_input(feat, head.conf_type)
            c = feat @ head.conf_w
            if head.conf_b is not None:
                c = c + head.conf_b
            confs.append(torch.sigmoid(c))
        prev = col.argmax(dim=-1)  # the graph's greedy chain (ggml_argmax)
    out = torch.stack(cols, dim=1)
    n_out = out.shape[1]
    conf = torch.stack(confs, dim=1).reshape(*lead, n_out) if confs else None
    out = out.reshape(*lead, n_out, V)
    return MarkovDraft(logits=out, tokens=out.argmax(dim=-1), confidence=conf)


def driver_draft(tokens: torch.Tensor, confidence: torch.Tensor | None, p_min: float = 0.0) -> torch.Tensor:
    """The tokens common/speculative.cpp proposes from one block's drafted slots (``p_min``: its confidence cut)."""
    if p_min <= 0.0:
        return tokens
    if confidence is None:
        raise InputFileError("DSpark draft has no confidence head: --spec-draft-p-min must be 0")
    low = (confidence < p_min).nonzero()
    return tokens[: int(low[0, 0])] if low.numel() else tokens


# --- the checkpoint's head (runtime.reference), on its HF tensors


@torch.no_grad()
def checkpoint_markov_chain(tensors: Mapping[str, torch.Tensor], draft_logits: torch.Tensor, hidden: torch.Tensor,
                            anchor: int, sample_from_anchor: bool, d2t_ids: torch.Tensor | None,
                            vocab_size: int) -> MarkovDraft:
    """The Markov and confidence heads from the checkpoint's own tensors, one block."""
    w1, w2 = tensors[MARKOV_W1_HF], tensors[MARKOV_W2_HF]
    prefix = next((p for p in CONF_HF_PREFIXES if f"{p}.weight" in tensors), None)
    proj_w = tensors[f"{prefix}.weight"] if prefix else None
    proj_b = tensors.get(f"{prefix}.bias") if prefix else None
    rows = draft_logits.shape[0]
    start = 0 if sample_from_anchor else 1
    prev = int(anchor)
    out_logits, out_conf = [], []
    for slot in range(start, rows):
        emb = torch.nn.functional.embedding(torch.tensor([prev], device=w1.device), w1)[0]  # markov_w1[prev]
        conditioned = draft_logits[slot] + torch.nn.functional.linear(emb, w2)
        if proj_w is not None:
            logit = torch.nn.functional.linear(torch.cat([hidden[slot], emb]), proj_w, proj_b)
            out_conf.append(torch.sigmoid(logit).reshape(()))
        full = conditioned
        if d2t_ids is not None:
            full = torch.full((vocab_size,), float("-inf"), dtype=conditioned.dtype, device=conditioned.device)
            full[d2t_ids] = conditioned
        out_logits.append(full)
        best = int(conditioned.argmax())
        prev = int(d2t_ids[best]) if d2t_ids is not None else best
    logits = torch.stack(out_logits)
    conf = torch.stack(out_conf) if out_conf else None
    return MarkovDraft(logits=logits, tokens=logits.argmax(dim=-1), confidence=conf)


__all__ = ["MarkovDraft", "MarkovHead", "checkpoint_markov_chain", "driver_draft", "markov_chain", "markov_head"]
