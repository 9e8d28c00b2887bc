"""A drafter's importance matrix: Σx² per input column of every matrix it multiplies, as llama-imatrix counts.

The drafter runs over a features file as llama.cpp drafts, with an observer on the runner's matmuls
(``runtime.observe``); a decode's rows count only from ``format.imatrix.MIN_ROWS`` (imatrix.cpp).
Refuses a non-finite sum. Specification: docs/quantize.md, "Importance matrix".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..drafter import Drafter
from ..errors import DFlashError
from ..format.family import CONF_PROJ, MARKOV_W2, SELECTOR_HIDDEN
from ..format.imatrix import MIN_ROWS
from ..format.rules import EMBEDDING_TENSOR, OUTPUT_TENSOR
from ..sources.features import FeaturesFile
from .accept import DEFAULT_BATCH, anchor_drafts, context_kv, loop_anchors, sequence_inputs
from .observe import observing
from .weights import DrafterWeights

# where the head comes from (DrafterWeights.head_from) -> the weight the graph multiplies; the target's is not the drafter's
HEAD_NAMES: dict[str, str] = {"drafter": OUTPUT_TENSOR, "drafter (tied to token_embd)": EMBEDDING_TENSOR}


@dataclass
class ImatrixStats:
    """The sums and row counts per weight name, and what was run to get them."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)  # name -> float32 [n_in]: Σx² per input column
    counts: dict[str, int] = field(default_factory=dict)  # name -> rows seen
    drafts: list[list[int]] = field(default_factory=list)  # per sequence: the anchors drafted from, in order
    lengths: list[int] = field(default_factory=list)  # per sequence: the positions injected


def draft_length(d: Drafter, w: DrafterWeights) -> int:
    """The --spec-draft-n-max whose block is the whole trained block: block_size (DSpark from the anchor) or block_size - 1."""
    return d.block_size if w.markov is not None and w.markov.sample_from_anchor else d.block_size - 1


def matmul_names(w: DrafterWeights) -> dict[int, str]:
    """The weight objects the runner multiplies by (by id) -> their GGUF names; the target's head has none."""
    names = {id(t): n for n, t in w.decoded.items() if n != SELECTOR_HIDDEN}  # the selector is observed over the whole block
    if w.head_from in HEAD_NAMES:
        names[id(w.head)] = HEAD_NAMES[w.head_from]
    if w.dflash2 is not None:
        names[id(w.dflash2)] = SELECTOR_HIDDEN
    if w.markov is not None and w.markov.conf_w is not None:  # a reshaped view of the decoded tensor
        names[id(w.markov.conf_w)] = CONF_PROJ
    return names


# DSpark's heads multiply one row per chained slot (one MUL_MAT per slot, never 16 rows): collected whatever
# the count, else they would never have an entry (and llama-quantize refuses IQ1/IQ2 for a weight without one)
CHAINED: tuple[str, ...] = (MARKOV_W2, CONF_PROJ)


class _Collector:
    """The observer: sums x² and rows per weight, keeping a decode's rows only when it has MIN_ROWS of them."""

    def __init__(self, names: dict[int, str], block_rows: int) -> None:
        self.names, self.block_rows = names, block_rows
        self.decode_rows: int | None = None  # set while a context is injected: its positions, one decode
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}

    def __call__(self, weight: object, x: torch.Tensor) -> None:
        name = self.names.get(id(weight))
        if name is None:
            return
        rows = self.decode_rows if self.decode_rows is not None else self.block_rows
        if rows < MIN_ROWS and name not in CHAINED:
            return
        x64 = x.to(torch.float64)
        s = (x64 * x64).sum(0)
        have = self.sums.get(name)
        if have is None:
            self.sums[name], self.counts[name] = s, x.shape[0]
            return
        if have.shape != s.shape:  # imatrix.cpp: "inconsistent size"
            raise DFlashError(f"internal error: {name} multiplied inputs of {s.shape[0]} and {have.shape[0]} columns")
        have += s
        self.counts[name] += x.shape[0]

    def result(self) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """(sums as float32, counts), refusing a non-finite sum as llama-imatrix does."""
        out = {}
        for name, s in sorted(self.sums.items()):
            v = s.cpu().numpy().astype(np.float32)
            if not np.isfinite(v).all():
                raise DFlashError(f"non-finite values in the inputs of {name}: the drafter or the features overflow")
            out[name] = v
        return out, dict(sorted(self.counts.items()))


@torch.no_grad()
def collect(d: Drafter, w: DrafterWeights, feats: FeaturesFile, slots: list[int], *, every_anchor: bool = False,
            like_cpu: bool = True, batch: int = DEFAULT_BATCH, indices: Iterable[int] | None = None,
            done: Callable[[int], None] | None = None) -> ImatrixStats:
    """Run the drafter over sequences ``indices`` (default: all) of ``feats``, ``done(i)`` after each; its importance matrix."""
    n_max = draft_length(d, w)
    collector = _Collector(matmul_names(w), d.block_size)  # one draft's decode multiplies the whole block
    cache = torch.float16 if like_cpu else None
    stats = ImatrixStats()
    eos = set(feats.eos_ids)
    with observing(collector):
        for i in range(len(feats.sequences)) if indices is None else indices:
            features, tokens, prompt_length = sequence_inputs(feats, i, slots)
            ids = torch.tensor(tokens)
            collector.decode_rows = features.shape[0]
            ctx = context_kv(d, w, features, cpu_matmul=like_cpu)
            collector.decode_rows = None
            anchors: list[int] = []

            def draft_at(c: int, features=features, ids=ids, ctx=ctx, anchors=anchors) -> list[int]:
                anchors.append(c)
                out = anchor_drafts(d, w, features, ids, [c], n_max, batch=1, cpu_matmul=like_cpu,
                                    kv_cache_dtype=cache, ctx_kv=ctx)
                return out[0].tolist()  # type: ignore[index]

            if every_anchor:
                anchors.extend(range(prompt_length - 1, len(tokens) - 1))
                anchor_drafts(d, w, features, ids, anchors, n_max, batch=batch, cpu_matmul=like_cpu,
                              kv_cache_dtype=cache, ctx_kv=ctx)
            else:
                loop_anchors(tokens, prompt_length, feats.new_tokens, n_max, eos, draft_at)
            stats.drafts.append(anchors)
            stats.lengths.append(features.shape[0])
            if done is not None:
                done(i)
    stats.sums, stats.counts = collector.result()
    return stats


__all__ = ["CHAINED", "HEAD_NAMES", "ImatrixStats", "collect", "draft_length", "matmul_names"]
