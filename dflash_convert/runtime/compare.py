"""``check``'s comparisons: the metrics of one draft against another, and the DSpark and DFlash2 alignments.

Everything here measures; ``check`` judges the numbers against ``format.check_limits``.
The metrics' definitions: docs/check.md, "Thresholds".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..drafter import Drafter
from ..errors import InputFileError
from ..format.check_limits import ACCEPT_ALLOWANCE, TIE_MARGIN, Thresholds
from ..format.family import draft_tokens_per_block, member_of
from ..sources.features import FeaturesFile
from .accept import gguf_drafts, measure, reference_drafts
from .dflash2 import CANDIDATES, LATTICE
from .dspark import markov_chain
from .forward import ForwardResult
from .reference import ReferenceModel
from .weights import DrafterWeights


def hidden_errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max abs error, max abs error / max |want|) of two hidden-state tensors, in float64."""
    a, b = got.detach().to("cpu", torch.float64), want.detach().to("cpu", torch.float64)
    err = float((a - b).abs().max())
    return err, err / max(float(b.abs().max()), 1e-30)


def top1_agreement(got: torch.Tensor, want: torch.Tensor) -> tuple[int, int]:
    """(matching slots, slots) of two greedy token rows."""
    return int((got.cpu() == want.cpu()).sum()), int(want.numel())


def kl_mean(want_logits: torch.Tensor, got_logits: torch.Tensor) -> float:
    """Mean over slots of KL(softmax(want) || softmax(got)) in nats (docs/check.md, "Thresholds")."""
    lw = torch.log_softmax(want_logits.detach().to("cpu", torch.float64), dim=-1)
    lg = torch.log_softmax(got_logits.detach().to("cpu", torch.float64), dim=-1)
    live = torch.isfinite(lw)
    terms = torch.where(live, lw.exp() * (lw - lg), torch.zeros_like(lw))
    return float(terms.sum(-1).mean())


def near_ties(want_logits: torch.Tensor, got_tokens: torch.Tensor, margin: float = TIE_MARGIN, sd: float = 0.0) -> torch.Tensor:
    """Per slot: does ``want`` rate ``got``'s token within ``margin`` nats, or within ``sd`` standard
    deviations of that slot's finite logits, of its own top-1? (-inf: never)."""
    lw = want_logits.detach().to("cpu", torch.float64)
    own = lw.gather(-1, got_tokens.detach().to("cpu", torch.int64)[:, None])[:, 0]
    gap = lw.max(-1).values - own
    if sd <= 0:
        return gap <= margin
    finite = torch.isfinite(lw)
    n = finite.sum(-1).clamp(min=2)
    mean = torch.where(finite, lw, torch.zeros_like(lw)).sum(-1) / n
    var = torch.where(finite, (lw - mean[:, None]) ** 2, torch.zeros_like(lw)).sum(-1) / (n - 1)
    return (gap <= margin) | (gap <= sd * var.sqrt())


def compare(got: ForwardResult, want: ForwardResult, tie_margin: float = TIE_MARGIN, tie_sd: float = 0.0) -> dict[str, Any]:
    """The check's metrics of ``got`` against ``want``."""
    abs_err, rel_err = hidden_errors(got.hidden, want.hidden)
    match, n = top1_agreement(got.tokens, want.tokens)
    # a near-tie is judged on what the driver chose the token from (DFlash2: the walked lattice row)
    ties = near_ties(want.choice_logits(), got.tokens, tie_margin, tie_sd)
    tie_aware = int(((got.tokens.cpu() == want.tokens.cpu()) | ties).sum())
    return {"hidden_max_abs_err": abs_err, "hidden_max_rel_err": rel_err, "top1_agreement": match / n if n else 1.0,
            "top1_matches": match, "slots": n, "top1_agreement_tie_aware": tie_aware / n if n else 1.0,
            "kl_mean": kl_mean(want.logits, got.logits)}


def _sorted_lattice(candidates: torch.Tensor, lattice: torch.Tensor) -> torch.Tensor:
    """[n, k, k] lattice with both axes in ascending candidate-id order (predecessors: the previous slot's
    candidates; the first slot's rows are all the anchor's and stay as they are)."""
    n, k = candidates.shape
    perm = candidates.argsort(-1)
    prev = torch.cat([torch.arange(k)[None], perm[:-1]]) if n else perm
    out = lattice.gather(-1, perm[:, None, :].expand(n, k, k))
    return out.gather(1, prev[:, :, None].expand(n, k, k))


def selector_agreement(got: ForwardResult, want: ForwardResult) -> dict[str, Any] | None:
    """DFlash2: the share of slots whose candidate sets are equal, and the largest lattice difference where they are; None without a selector."""
    if CANDIDATES not in got.extras or CANDIDATES not in want.extras:
        return None
    gc, wc = got.extras[CANDIDATES].cpu(), want.extras[CANDIDATES].cpu()
    if gc.shape != wc.shape:
        return {"candidate_sets_equal": 0.0, "lattice_max_abs_err": None, "top_k": [gc.shape[-1], wc.shape[-1]]}
    same = (gc.sort(-1).values == wc.sort(-1).values).all(-1)
    comparable = same & torch.cat([torch.ones(1, dtype=torch.bool), same[:-1]])
    diff = (_sorted_lattice(gc, got.extras[LATTICE].detach().cpu().double())
            - _sorted_lattice(wc, want.extras[LATTICE].detach().cpu().double()))[comparable]
    return {"candidate_sets_equal": float(same.double().mean()) if same.numel() else 1.0,
            "lattice_max_abs_err": float(diff.abs().max()) if diff.numel() else None, "top_k": [gc.shape[-1]] * 2}


def dspark_common_slots(got: ForwardResult, want: ForwardResult, file: Drafter,
                        checkpoint: Drafter) -> tuple[ForwardResult, ForwardResult, str | None]:
    """Both DSpark drafts cut to the block slots both sides draft, and a failure line when those differ."""
    n = min(got.tokens.shape[0], want.tokens.shape[0])
    note = None
    if got.tokens.shape[0] != want.tokens.shape[0]:
        note = (f"drafted slots differ: the file drafts {got.tokens.shape[0]} slots per block, the checkpoint "
                f"{want.tokens.shape[0]} (sample_from_anchor: file {file.sample_from_anchor is not False}, checkpoint "
                f"{checkpoint.sample_from_anchor is not False})")

    def tail(r: ForwardResult) -> ForwardResult:
        conf = None if r.confidence is None else r.confidence[-n:]
        return ForwardResult(hidden=r.hidden, logits=r.logits[-n:], tokens=r.tokens[-n:], confidence=conf,
                             head_logits=r.head_logits)

    return tail(got), tail(want), note


def conditioned_like(weights: DrafterWeights, got: ForwardResult, want: ForwardResult, ids: torch.Tensor) -> ForwardResult:
    """The file's DSpark heads over its own states, each slot conditioned on the checkpoint's draft.

    One near-tie flipped by rounding would make every later slot of the chain differ."""
    m = markov_chain(weights.markov, got.head_logits, got.hidden, ids[0], weights.d2t, forced=want.tokens[:-1])
    return ForwardResult(hidden=got.hidden, logits=m.logits[-want.tokens.shape[0]:], tokens=m.tokens[-want.tokens.shape[0]:],
                         confidence=None if m.confidence is None else m.confidence[-want.tokens.shape[0]:],
                         head_logits=got.head_logits)


def confidence_failures(got: ForwardResult, want: ForwardResult, metrics: dict[str, Any], limits: Thresholds) -> list[str]:
    """DSpark's confidence head: ``confidence_max_abs_err`` into ``metrics``, a failure line past its limit."""
    if got.confidence is None and want.confidence is None:
        return []
    if got.confidence is None or want.confidence is None:
        side = "the file" if got.confidence is None else "the checkpoint"
        return [f"confidence head differs: {side} has none"]
    err = float((got.confidence.detach().cpu().double() - want.confidence.detach().cpu().double()).abs().max())
    metrics["confidence_max_abs_err"] = err
    if not err <= limits.hidden_max_rel:
        return [f"confidences differ: max abs error {err:.3g} > {limits.hidden_max_rel:g}"]
    return []


def compare_drafts(got: ForwardResult, want: ForwardResult, weights: DrafterWeights, file: Drafter, checkpoint: Drafter,
                   ids: torch.Tensor, limits: Thresholds,
                   source: Path) -> tuple[ForwardResult, ForwardResult, ForwardResult | None, dict[str, Any], list[str]]:
    """The metrics of the file's draft against the checkpoint's, and the failure lines only a draft's layout shows."""
    failures = []
    own_draft = None  # DSpark: the file's own greedy chain, when the gates compare slots conditioned like the checkpoint's
    if weights.markov is not None:  # DSpark: compare the block slots both draft (a flipped layout drafts one more)
        got, want, slot_note = dspark_common_slots(got, want, file, checkpoint)
        if slot_note:
            failures.append(slot_note)
        else:
            own_draft, got = got, conditioned_like(weights, got, want, ids)
    if want.logits.shape != got.logits.shape:
        raise InputFileError(f"the checkpoint drafts {list(want.logits.shape)} logits, the file {list(got.logits.shape)}: "
                             "different vocabulary or block size", source)
    metrics = compare(got, want, limits.tie_margin, limits.tie_sd)
    failures += confidence_failures(got, want, metrics, limits)
    if own_draft is not None:
        match, n = top1_agreement(own_draft.tokens, want.tokens)
        metrics["draft_top1_agreement"], metrics["draft_matches"] = match / n if n else 1.0, match
    selector = selector_agreement(got, want)  # DFlash2: reported, never gating
    if selector is not None:
        metrics["selector"] = selector
    return got, want, own_draft, metrics, failures


def compare_acceptance(d: Drafter, weights: DrafterWeights, model: ReferenceModel, captured: FeaturesFile, cls: str) -> dict[str, Any]:
    """The file's live-loop acceptance on the captured sequences next to its checkpoint's (reference forward)."""
    # the driver's most drafted tokens per block: block_size for a DSpark drafter sampling from the anchor
    n_max = draft_tokens_per_block(member_of({t.gguf_name for t in d.tensors}), d.block_size, d.sample_from_anchor)
    file_loop, file_anchors = measure(gguf_drafts(d, weights, n_max, until_rejected=True), captured,
                                      captured.slots_for(d.target_layers, "the file"),
                                      n_max)
    ck_loop, ck_anchors = measure(reference_drafts(model, n_max), captured,
                                  captured.slots_for(model.drafter.target_layers, "the checkpoint"), n_max)

    def side(loop, anchors) -> dict[str, Any]:
        return {"n_drafted": loop.n_drafted, "n_accept": loop.n_accept, "accept": loop.accept, "steps": loop.steps,
                "every_anchor_mean_length": anchors.mean_length}

    return {"file": side(file_loop, file_anchors), "checkpoint": side(ck_loop, ck_anchors),
            "lost": ck_loop.accept - file_loop.accept, "allowance": ACCEPT_ALLOWANCE[cls], "sequences": len(captured.sequences),
            "n_max": n_max, "new_tokens": captured.new_tokens}


__all__ = ["compare", "compare_acceptance", "compare_drafts", "conditioned_like", "confidence_failures", "dspark_common_slots", "hidden_errors",
           "kl_mean", "near_ties", "selector_agreement", "top1_agreement"]
