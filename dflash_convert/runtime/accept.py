"""Drafts from many anchors of one captured sequence at once, and llama.cpp's acceptance count over them.

A captured sequence is all a DFlash draft reads, so every draft the live loop would make is
computed here without the target, batched over anchors. Inputs are checked by the features reader,
not here.

Specification (the live loop, every-anchor statistics): docs/acceptance.md, "accept".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..drafter import Drafter
from ..errors import DFlashError
from ..sources.features import FeaturesFile
from .counts import LoopCount
from .dspark import markov_chain
from .forward import (
    RopeSpec,
    _kv,
    _layer_mm,
    _mm,
    apply_rope_neox,
    block_tokens,
    contiguous_positions,
    cpu_matmul_input,
    layer_tail,
    matmul,
    position_rows,
    rms_norm,
    rope_cos_sin,
    rope_spec,
    scatter_d2t,
)
from .head import head_argmax, project_kept, screen_pays
from .observe import observe
from .reference import ReferenceModel, reference_forward_blocks
from .weights import DrafterWeights, LayerWeights

DEFAULT_BATCH = 16  # anchors per pass: bounds the logits of a large vocabulary (batch * (B-1) rows)
# accept's anchors per pass: its greedy tokens never hold a pass's logits whole (LazyMatrix.argmax), so it can
# spread each read and widening of a streamed head over twice the rows
ACCEPT_BATCH = 32


def context_input(d: Drafter, w: DrafterWeights, features: torch.Tensor, cpu_matmul: bool = False) -> torch.Tensor:
    """The context rows every layer's K and V are projected from: ``g = enc_norm(fc(features))``."""
    return rms_norm(_mm(features.to(w.device, w.dtype), w.fc, w.fc_scale, w.fc_type if cpu_matmul else None), d.rms_eps,
                    w.enc_norm)


@torch.no_grad()
def context_kv(d: Drafter, w: DrafterWeights, features: torch.Tensor, *, cpu_matmul: bool = False,
               layers: list[int] | None = None, g: torch.Tensor | None = None,
               layer_weights: dict[int, LayerWeights] | None = None) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """Each layer's K (roped at 0..L-1) and V of the context ``g`` (computed when not given); only ``layers``, others None.

    ``layer_weights``: the weights of these layers, in place of ``w.layers``'."""
    dev, dt = w.device, w.dtype
    L = features.shape[0]
    spec = rope_spec(d, w.rope_freqs)
    if g is None:
        g = context_input(d, w, features, cpu_matmul)
    ctx_pos = torch.arange(L, device=dev)
    cos_c, sin_c = rope_cos_sin(spec, position_rows(torch.cat([ctx_pos, ctx_pos[:1]]), L, spec.sections is not None), dt)
    cos_c, sin_c = cos_c[:L], sin_c[:L]
    out: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    for il, lw in enumerate(w.layers):
        if layers is not None and il not in layers:
            out.append(None)
            continue
        k, v = _kv((layer_weights or {}).get(il, lw), g, d.head_dim, d.rms_eps, cpu_matmul)
        out.append((apply_rope_neox(k, cos_c, sin_c), v))
    return out


@torch.no_grad()
def anchor_drafts(d: Drafter, w: DrafterWeights, features: torch.Tensor, tokens: torch.Tensor, anchors: list[int],
                  n_max: int, *, batch: int = DEFAULT_BATCH, keep_logits: bool = False,
                  cpu_matmul: bool = False, kv_cache_dtype: torch.dtype | None = None,
                  ctx_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None, until_rejected: bool = False,
                  ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[len(anchors), n_max] greedy draft tokens (target ids) from each anchor; ``keep_logits``: the logits too.

    ``until_rejected``: each draft only up to and including its first slot that ``tokens`` after the anchor
    reject, -1 after it (a DFlash drafter's; DFlash2 and DSpark draft whole blocks): all that the loop's
    count and the anchors' accepted lengths read, through the head in rounds (HEAD_ROUND_ENDS)."""
    g = block_graph(d, w, n_max)
    dev = w.device
    L = features.shape[0]
    if any(not 0 <= c < L for c in anchors):
        raise DFlashError(f"anchors must lie in 0..{L - 1}")
    if until_rejected and keep_logits:
        raise ValueError("until_rejected drafts keep no logits")
    if ctx_kv is None:  # the context, once for all the anchors: a block attends to it, never changes it
        ctx_kv = context_kv(d, w, features, cpu_matmul=cpu_matmul)  # type: ignore[assignment]

    out, kept = [], []
    ids_all, tokens_cpu = tokens.to(dev), tokens.cpu()
    for at in range(0, len(anchors), batch):
        part = torch.tensor(anchors[at:at + batch], dtype=torch.int64, device=dev)
        want = _next_tokens(tokens_cpu, anchors[at:at + batch], n_max) if until_rejected else None
        logits, drafted = _blocks(d, w, g, part, ids_all[part], [(0, part.shape[0], ctx_kv)], n_max, cpu_matmul,
                                  kv_cache_dtype, keep_logits, target_next=want)
        out.append(drafted.cpu())
        if keep_logits:
            kept.append(logits.cpu())
    drafts = torch.cat(out) if out else torch.empty(0, n_max, dtype=torch.int64)
    if keep_logits:
        return drafts, (torch.cat(kept) if kept else torch.empty(0, n_max, d.vocab_size))
    return drafts


def _next_tokens(tokens: torch.Tensor, anchors: list[int], n_max: int) -> torch.Tensor:
    """[A, n_max] the tokens after each anchor, -1 past the sequence's end."""
    want = torch.full((len(anchors), n_max), -1, dtype=torch.int64)
    for j, c in enumerate(anchors):
        nxt = tokens[c + 1:c + 1 + n_max]
        want[j, :nxt.shape[0]] = nxt
    return want


Segment = tuple[int, int, list]  # (first, end) rows of a batch's anchors that share one sequence's context K/V


@dataclass(frozen=True)
class _Graph:
    """What a drafting pass reads from the drafter's hyperparameters, once."""

    causal: bool
    spec: RopeSpec
    mrope: bool
    kq_scale: float
    window_of: list[int | None]  # each layer's sliding window, None for full attention


def block_graph(d: Drafter, w: DrafterWeights, n_max: int) -> _Graph:
    """The pass settings of ``d``; an ``n_max`` outside 1..block size minus the anchor slot is an error."""
    B = d.block_size
    most = B if w.markov is not None and w.markov.sample_from_anchor else B - 1  # DSpark drafts from the anchor's slot
    if not 1 <= n_max <= most:
        raise DFlashError(f"n_max {n_max} must be in 1..{most} (block size {B}" + (")" if most == B else " minus the anchor slot)"))
    spec = rope_spec(d, w.rope_freqs)
    pattern = d.swa_pattern or []
    window_of = [d.sliding_window if d.sliding_window and i < len(pattern) and pattern[i] else None for i in range(d.n_layers)]
    return _Graph(bool(d.causal), spec, spec.sections is not None, w.attention_scale or 1.0 / math.sqrt(d.head_dim),
                  window_of)


@dataclass(frozen=True)
class BlockRows:
    """Where a pass's blocks sit: what each layer's attention reads besides the rows themselves."""

    anchors: torch.Tensor  # [A] each block's anchor position
    q_pos: torch.Tensor  # [A, B] the positions of its slots
    cos: torch.Tensor  # [A*B, n_rot/2] the slots' rotation
    sin: torch.Tensor
    diff: torch.Tensor  # [A, B, B] query minus key position within a block


def block_rows(d: Drafter, w: DrafterWeights, g: _Graph, anchors: torch.Tensor, anchor_ids: torch.Tensor
               ) -> tuple[torch.Tensor, BlockRows]:
    """(the first layer's input [A*B, E]: the anchor's token then mask tokens, embedded; their positions)."""
    dev, dt = w.device, w.dtype
    A, B = anchors.shape[0], d.block_size
    ids = torch.full((A, B), d.mask_token_id, dtype=torch.int64, device=dev)
    ids[:, 0] = anchor_ids
    q_pos = anchors[:, None] + torch.arange(B, device=dev)[None, :]  # [A, B]
    # a block token broadcasts its one position to every M-RoPE section (as llama.cpp's token batch does)
    rows = q_pos.reshape(1, -1).repeat(4 if g.mrope else 1, 1)
    cos_b, sin_b = rope_cos_sin(g.spec, rows, dt)  # [A*B, n_rot/2]
    x = w.embed.rows(ids.reshape(-1))
    if d.embedding_scale:
        x = x * d.embedding_scale
    return x, BlockRows(anchors, q_pos, cos_b, sin_b, q_pos[:, :, None] - q_pos[:, None, :])


def block_layer(d: Drafter, w: DrafterWeights, g: _Graph, il: int, lw: LayerWeights, x: torch.Tensor, at: BlockRows,
                segments: list[Segment], cpu_matmul: bool, cache_dtype: torch.dtype | None) -> torch.Tensor:
    """Layer ``il`` (weights ``lw``) over the blocks' rows ``x`` [A*B, E]; segment ``(a, e, ctx)``'s rows attend to ``ctx[il]``."""
    A, B = at.anchors.shape[0], d.block_size
    H, D, eps = d.n_head, d.head_dim, d.rms_eps
    win = g.window_of[il]
    vis_blk = torch.ones_like(at.diff, dtype=torch.bool)
    if g.causal:
        vis_blk &= at.diff >= 0
    if win is not None:
        vis_blk &= at.diff < win
    h = rms_norm(x, eps, lw.attn_norm)
    convs = None if w.dflash2 is None else w.dflash2.layer(il, B, matmul(cpu_matmul))  # rows are whole blocks
    if convs is not None:
        h = convs.attn_in(h)
    q = rms_norm(_layer_mm(lw, "wq", h, cpu_matmul).reshape(-1, H, D), eps, lw.q_norm)
    k_blk, v_blk = _kv(lw, h, D, eps, cpu_matmul)
    q = apply_rope_neox(q, at.cos, at.sin).reshape(A, B, H, D)
    k_blk = apply_rope_neox(k_blk, at.cos, at.sin).reshape(A, B, -1, D)
    v_blk = v_blk.reshape(A, B, -1, D)
    parts = [_attend(lw, q[a:e], k_blk[a:e], v_blk[a:e], *ctx[il], at.q_pos[a:e], at.anchors[a:e], vis_blk[a:e], win,
                     g.kq_scale, cache_dtype) for a, e, ctx in segments]
    attn = (parts[0] if len(parts) == 1 else torch.cat(parts)).reshape(A * B, H * D)
    return layer_tail(d, lw, x, attn, False, cpu_matmul, convs)


def _blocks(d: Drafter, w: DrafterWeights, g: _Graph, anchors: torch.Tensor, anchor_ids: torch.Tensor,
            segments: list[Segment], n_max: int, cpu_matmul: bool, cache_dtype: torch.dtype | None,
            need_logits: bool = True, target_next: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(scores [A, n_max, V] the tokens are chosen from, or None, drafted tokens [A, n_max]) of blocks from ``anchors``.

    Anchor ``a`` sits at position ``anchors[a]`` of its sequence, holds token ``anchor_ids[a]`` and attends to the
    context K/V of the segment it lies in. ``target_next`` [A, n_max] (the target's tokens after each anchor, -1
    past the end): only the slots up to each draft's first rejected one are projected (-1 after it).
    """
    A, B, eps = anchors.shape[0], d.block_size, d.rms_eps
    x, at = block_rows(d, w, g, anchors, anchor_ids)
    for il, lw in enumerate(w.layers):
        x = block_layer(d, w, g, il, lw, x, at, segments, cpu_matmul, cache_dtype)
    states = rms_norm(x, eps, w.output_norm)
    observe(w.head, states)  # the graph projects every slot of the block (the driver reads 1..n_max)
    if w.dflash2 is not None:
        observe(w.dflash2, states)  # the selector's hidden projection, over every slot as well
    if w.markov is not None:  # DSpark: every slot through the head, then the Markov chain (runtime.dspark)
        read = cpu_matmul_input(states, w.head.source.dtype) if cpu_matmul else states
        logits = scatter_d2t(w.head.project(read), w.d2t, d.vocab_size).reshape(A, B, -1)
        chain = markov_chain(w.markov, logits, states.reshape(A, B, -1), anchor_ids, w.d2t,
                             cpu_matmul_input if cpu_matmul else None)
        return chain.logits[:, :n_max], chain.tokens[:, :n_max]
    normed = states.reshape(A, B, -1)[:, 1:n_max + 1]
    if w.dflash2 is None and not need_logits:
        if target_next is not None:
            return None, _until_rejected(w, normed, target_next, cpu_matmul, d.vocab_size)
        return None, _head_tokens(w, normed.reshape(A * n_max, -1), cpu_matmul, d.vocab_size).reshape(A, n_max)
    hidden = normed.reshape(A * n_max, -1)
    if cpu_matmul:
        hidden = cpu_matmul_input(hidden, w.head.source.dtype)
    raw = w.head.project(hidden)
    if w.dflash2 is None:
        logits = scatter_d2t(raw, w.d2t, d.vocab_size).reshape(A, n_max, -1)
        return logits, logits.argmax(dim=-1)
    logits = scatter_d2t(w.dflash2.output_transforms(raw), w.d2t, d.vocab_size).reshape(A, n_max, -1)
    sel = w.dflash2.select(normed, logits, anchor_ids, matmul(cpu_matmul))
    return sel.choice_rows(d.vocab_size), sel.tokens


def _attend(lw, q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor,
            q_pos: torch.Tensor, anchors: torch.Tensor, vis_blk: torch.Tensor, win: int | None, kq_scale: float,
            cache_dtype: torch.dtype | None) -> torch.Tensor:
    """[A, B, H, D]: each block's attention over its context (cells before its anchor, in the window) and itself."""
    A, B, H, D = q.shape
    dt = q.dtype
    L = k_ctx.shape[0]
    k_pos = torch.arange(L, device=q.device)
    # which context cells each block query sees: only its own prefix (c < anchor), and the window
    vis_ctx = k_pos[None, None, :] < anchors[:, None, None]
    if win is not None:
        vis_ctx = vis_ctx & ((q_pos[:, :, None] - k_pos[None, None, :]) < win)
    if cache_dtype is not None:  # as runtime.forward.attend
        q, k_blk, v_blk, k_ctx, v_ctx = (t.to(cache_dtype).to(dt) for t in (q, k_blk, v_blk, k_ctx, v_ctx))
    group = H // k_ctx.shape[1]
    kc = k_ctx.repeat_interleave(group, dim=1)  # [L, H, D]
    vc = v_ctx.repeat_interleave(group, dim=1)
    kb = k_blk.repeat_interleave(group, dim=2)  # [A, B, H, D]
    vb = v_blk.repeat_interleave(group, dim=2)
    s_ctx = torch.einsum("abhd,lhd->ahbl", q, kc) * kq_scale
    s_blk = torch.einsum("abhd,akhd->ahbk", q, kb) * kq_scale
    s_ctx = s_ctx.masked_fill(~vis_ctx[:, None], float("-inf"))
    s_blk = s_blk.masked_fill(~vis_blk[:, None], float("-inf"))
    scores = torch.cat([s_ctx, s_blk], dim=-1)  # [A, H, B, L + B]
    if lw.sinks is not None:
        col = lw.sinks.to(scores.dtype)[None, :, None, None].expand(A, H, B, 1)
        probs = torch.softmax(torch.cat([scores, col], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    if cache_dtype is not None:
        probs = probs.to(cache_dtype).to(dt)
    return (torch.einsum("ahbl,lhd->abhd", probs[..., :L], vc)
            + torch.einsum("ahbk,akhd->abhd", probs[..., L:], vb))


HEAD_SCREEN = screen_pays()  # the bf16 screen only where this CPU's bf16 product is the faster one


def _head_tokens(w: DrafterWeights, hidden: torch.Tensor, cpu_matmul: bool, vocab_size: int) -> torch.Tensor:
    """[R] the head's greedy token (a target id) for each row of ``hidden`` [R, E]: the bf16 screen where it holds."""
    if cpu_matmul:
        hidden = cpu_matmul_input(hidden, w.head.source.dtype)
    best = head_argmax(w.head, hidden, w.d2t) if HEAD_SCREEN else None
    if best is not None:
        return best if w.d2t is None else w.d2t.to(best.device)[best]
    if w.d2t is None:
        return w.head.argmax(hidden)
    return scatter_d2t(w.head.project(hidden), w.d2t, vocab_size).argmax(dim=-1)


# the lazy head's rounds end after these slots: a draft the target rejects at slot 1 costs one row, and one it
# accepts whole costs four passes over the head (slots 1, 2-3, 4-7, 8-n_max)
HEAD_ROUND_ENDS = (1, 3, 7)


def _until_rejected(w: DrafterWeights, normed: torch.Tensor, target_next: torch.Tensor, cpu_matmul: bool,
                    vocab_size: int) -> torch.Tensor:
    """[A, n_max] drafted tokens up to and including each draft's first slot the target rejects, -1 after it."""
    A, n_max = normed.shape[:2]
    out = torch.full((A, n_max), -1, dtype=torch.int64)
    want = target_next.cpu()
    alive = torch.arange(A)
    lo = 0
    for hi in [e for e in HEAD_ROUND_ENDS if e < n_max] + [n_max]:
        rows = normed[alive.to(normed.device), lo:hi]
        got = _head_tokens(w, rows.reshape(-1, rows.shape[-1]), cpu_matmul, vocab_size).cpu().reshape(-1, hi - lo)
        out[alive, lo:hi] = got
        alive = alive[(got == want[alive, lo:hi]).all(dim=-1)]  # every slot of the round accepted: on to the next
        if alive.numel() == 0:
            break
        lo = hi
    return out


SOFT_FLOOR = 1e-15  # a slot's term is left out once the product of the probabilities before it is below this
SOFT_ROWS = 256  # head rows per projection when scoring: bounds the [rows, vocabulary] logits held at once


def expected_lengths(w: DrafterWeights, normed: torch.Tensor, want: torch.Tensor, cpu_matmul: bool,
                     vocab_size: int) -> torch.Tensor:
    """[A] float64: each anchor's expected accepted length, the sum over slots k of prod_{i<=k} p_i(target's token).

    Slots are projected through the head in HEAD_ROUND_ENDS rounds, and only while the product before a slot is
    at least SOFT_FLOOR: the terms left out sum to less than n_max x SOFT_FLOOR per anchor (docs/quantize.md)."""
    A, n_max, E = normed.shape
    total = torch.zeros(A, dtype=torch.float64)
    before = torch.ones(A, dtype=torch.float64)
    alive, lo = torch.arange(A), 0
    for hi in [e for e in HEAD_ROUND_ENDS if e < n_max] + [n_max]:
        rows = normed[alive.to(normed.device), lo:hi].reshape(-1, E)
        p = _token_probs(w, rows, want[alive, lo:hi].reshape(-1), cpu_matmul, vocab_size).reshape(-1, hi - lo)
        prods = before[alive, None] * torch.cumprod(p, dim=-1)
        prev = torch.cat([before[alive, None], prods[:, :-1]], dim=-1)
        total[alive] += torch.where(prev >= SOFT_FLOOR, prods, torch.zeros_like(prods)).sum(dim=-1)
        before[alive] = prods[:, -1]
        alive = alive[before[alive] >= SOFT_FLOOR]
        if alive.numel() == 0:
            break
        lo = hi
    return total


def _token_probs(w: DrafterWeights, hidden: torch.Tensor, tokens: torch.Tensor, cpu_matmul: bool,
                 vocab_size: int) -> torch.Tensor:
    """[R] float64: the head's softmax probability of ``tokens[r]`` (target ids) for each row of ``hidden`` [R, E]."""
    out = []
    for a in range(0, hidden.shape[0], SOFT_ROWS):
        h = hidden[a:a + SOFT_ROWS]
        if cpu_matmul:
            h = cpu_matmul_input(h, w.head.source.dtype)
        z = project_kept(w.head, h)  # the live loop's bf16 copy of a streamed BF16 head: the same values
        logits = scatter_d2t(w.head.project(h) if z is None else z, w.d2t, vocab_size).double()
        picked = logits.gather(-1, tokens[a:a + SOFT_ROWS, None].to(logits.device))[:, 0]
        out.append((picked - torch.logsumexp(logits, dim=-1)).exp().cpu())
    return torch.cat(out) if out else torch.empty(0, dtype=torch.float64)


# --- llama.cpp's count


class LoopWalk:
    """llama-speculative-simple's greedy loop along one captured sequence, one verification step at a time."""

    def __init__(self, tokens: list[int], prompt_length: int, n_predict: int, n_max: int, eos: set[int]) -> None:
        self.tokens, self.n_predict, self.n_max, self.eos = tokens, n_predict, n_max, eos
        self.count = LoopCount()
        self.c = prompt_length - 1  # the first anchor: the prompt's last token
        self.done = False

    def anchor(self) -> int:
        """The position the next draft starts from; a continuation too short for it is an error."""
        if self.c + 1 >= len(self.tokens):  # no continuation token left to verify a draft against
            raise DFlashError(f"the captured continuation ends at position {len(self.tokens)}, before the loop's last "
                              f"step (position {self.c + 1}); capture with --new-tokens >= {self.n_predict}")
        return self.c

    def step(self, draft: list[int]) -> None:
        """Verify ``draft`` (from ``anchor()``) against the target's tokens: count it and move to the next anchor."""
        c, tokens = self.anchor(), self.tokens
        budget = self.n_predict - self.count.n_predict - 1
        draft = draft[:self.n_max]
        if budget > 0:
            draft = draft[:budget]
        k = 0
        while k < len(draft) and c + 1 + k < len(tokens) and draft[k] == tokens[c + 1 + k]:
            k += 1
        if c + 1 + k >= len(tokens):
            raise DFlashError(f"the captured continuation ends at position {len(tokens)}, before the loop's last step "
                              f"(position {c + 1 + k}); capture with --new-tokens >= {self.n_predict}")
        ids = tokens[c + 1:c + 2 + k]
        count = self.count
        count.n_drafted += len(draft)
        count.n_accept += k
        count.n_predict += len(ids)
        count.steps += 1
        count.accepted_per_step.append(k)
        self.c = c + k + 1
        self.done = count.n_predict > self.n_predict or any(t in self.eos for t in ids)


def loop_anchors(tokens: list[int], prompt_length: int, n_predict: int, n_max: int, eos: set[int],
                 draft_at: Callable[[int], list[int]]) -> LoopCount:
    """Replay llama-speculative-simple's greedy loop along a captured sequence, ``draft_at(c)`` drafting from ``c``."""
    walk = LoopWalk(tokens, prompt_length, n_predict, n_max, eos)
    while not walk.done:
        walk.step(draft_at(walk.anchor()))
    return walk.count


@dataclass
class AnchorStats:
    """Acceptance from every anchor of the continuation: how long an accepted prefix each drafts."""

    lengths: list[int] = field(default_factory=list)  # accepted prefix per anchor
    n_max: int = 0

    @property
    def mean_length(self) -> float:
        """The mean accepted length over every anchor."""
        return sum(self.lengths) / len(self.lengths) if self.lengths else 0.0

    def slot_curve(self) -> list[float]:
        """P(slot k accepted | slots before it were), k = 1..n_max."""
        out = []
        for k in range(1, self.n_max + 1):
            reached = sum(1 for a in self.lengths if a >= k - 1)
            out.append(sum(1 for a in self.lengths if a >= k) / reached if reached else 0.0)
        return out

    def add(self, other: AnchorStats) -> None:
        """Add another sequence's statistics to these."""
        self.lengths += other.lengths
        self.n_max = max(self.n_max, other.n_max)


def anchor_lengths(tokens: list[int], anchors: list[int], drafts: dict[int, list[int]], n_max: int) -> AnchorStats:
    """Accepted prefix length from each anchor (anchors with fewer than n_max tokens after them are left out)."""
    stats = AnchorStats(n_max=n_max)
    for c in anchors:
        if c + n_max >= len(tokens):
            continue
        draft, k = drafts[c], 0
        while k < n_max and draft[k] == tokens[c + 1 + k]:
            k += 1
        stats.lengths.append(k)
    return stats


# --- over a features file

Drafts = Callable[[torch.Tensor, torch.Tensor, list[int]], torch.Tensor]  # (features, tokens, anchors) -> [A, n_max]


def sequence_inputs(feats: FeaturesFile, i: int, slots: list[int]) -> tuple[torch.Tensor, list[int], int]:
    """(features [L, T*E] of the stored layers at ``slots``, token ids, prompt length) of sequence ``i``."""
    seq = feats.sequences[i]
    tokens, prompt_length = seq.read_tokens()
    return torch.cat([torch.from_numpy(seq.read_layer(s)) for s in slots], dim=-1), tokens.tolist(), prompt_length


def measure(drafts_of: Drafts, feats: FeaturesFile, slots: list[int], n_max: int) -> tuple[LoopCount, AnchorStats]:
    """The live loop (``-n`` the file's ``new_tokens``) and every anchor's acceptance, over every sequence.

    Drafted together: the anchors ``anchor_lengths`` scores (n_max tokens after them). The loop reaches past
    them only where a continuation ends early (an end-of-generation token); the first time it does, the
    anchors from there to the end are drafted in one more call (one more pass over the context)."""
    n_predict = feats.new_tokens
    loop, stats = LoopCount(), AnchorStats(n_max=n_max)
    eos = set(feats.eos_ids)
    for i in range(len(feats.sequences)):
        features, tokens, prompt_length = sequence_inputs(feats, i, slots)
        ids = torch.tensor(tokens)
        anchors = list(range(prompt_length - 1, len(tokens) - n_max))
        by_anchor = dict(zip(anchors, drafts_of(features, ids, anchors).tolist(), strict=True)) if anchors else {}

        def draft_at(c: int, features=features, ids=ids, by_anchor=by_anchor) -> list[int]:
            if c not in by_anchor:
                tail = list(range(c, len(ids) - 1))
                by_anchor.update(zip(tail, drafts_of(features, ids, tail).tolist(), strict=True))
            return by_anchor[c]

        loop.add(loop_anchors(tokens, prompt_length, n_predict, n_max, eos, draft_at))
        stats.add(anchor_lengths(tokens, anchors, by_anchor, n_max))
    return loop, stats


ContextOf = Callable[[int, torch.Tensor], list]  # (sequence index, its features) -> context_kv for that sequence


ACTIVE_CONTEXT_ROWS = 1 << 15  # context rows of the sequences drafted together: bounds their K/V in memory


@torch.no_grad()
def live_loop(d: Drafter, w: DrafterWeights, feats: FeaturesFile, slots: list[int], n_max: int, *, like_cpu: bool = True,
              indices: list[int] | None = None, context_of: ContextOf | None = None,
              batch: int = DEFAULT_BATCH) -> LoopCount:
    """Only the live loop (``LoopWalk``) over sequences ``indices`` (default: all), drafting just where it anchors.

    Up to ``batch`` sequences walk together, one anchor each per pass, and each draft is projected through the
    head only up to its first rejected slot: the loop's counts read nothing else.
    """
    g = block_graph(d, w, n_max)
    dev = w.device
    cache_dtype = torch.float16 if like_cpu else None
    eos = set(feats.eos_ids)
    order = list(range(len(feats.sequences))) if indices is None else list(indices)
    waiting = iter(order)
    counts: dict[int, LoopCount] = {}
    walking: list[tuple[int, LoopWalk, torch.Tensor, list]] = []  # (sequence, its walk, its tokens, its context K/V)
    while True:
        while len(walking) < batch and (not walking or sum(len(t) for _, _, t, _ in walking) < ACTIVE_CONTEXT_ROWS):
            i = next(waiting, None)
            if i is None:
                break
            features, tokens, prompt_length = sequence_inputs(feats, i, slots)
            ctx = context_of(i, features) if context_of is not None else context_kv(d, w, features, cpu_matmul=like_cpu)
            walking.append((i, LoopWalk(tokens, prompt_length, feats.new_tokens, n_max, eos), torch.tensor(tokens), ctx))
        if not walking:
            break
        at = [walk.anchor() for _, walk, _, _ in walking]
        ids = torch.stack([t[c] for (_, _, t, _), c in zip(walking, at, strict=True)])
        want = torch.cat([_next_tokens(t, [c], n_max) for (_, _, t, _), c in zip(walking, at, strict=True)])
        _, drafted = _blocks(d, w, g, torch.tensor(at, device=dev), ids.to(dev),
                             [(j, j + 1, ctx) for j, (_, _, _, ctx) in enumerate(walking)], n_max, like_cpu, cache_dtype,
                             need_logits=False, target_next=want)
        for (i, walk, _, _), draft in zip(walking, drafted.tolist(), strict=True):
            walk.step(draft)
            if walk.done:
                counts[i] = walk.count
        walking = [s for s in walking if not s[1].done]
    total = LoopCount()
    for i in order:
        total.add(counts[i])
    return total


def gguf_drafts(d: Drafter, w: DrafterWeights, n_max: int, *, like_cpu: bool = True, batch: int = DEFAULT_BATCH,
                until_rejected: bool = False) -> Drafts:
    """A drafter file's drafts, batched; ``like_cpu`` rounds as llama.cpp's CPU backend; ``until_rejected``: see
    ``anchor_drafts`` (enough for ``measure``)."""
    return lambda f, t, a: anchor_drafts(d, w, f, t, a, n_max, batch=batch, cpu_matmul=like_cpu,
                                         kv_cache_dtype=torch.float16 if like_cpu else None,
                                         until_rejected=until_rejected)


REFERENCE_LOGIT_BYTES = 128 << 20  # the reference's head logits of the anchors drafted in one pass


def reference_drafts(model: ReferenceModel, n_max: int) -> Drafts:
    """The checkpoint's drafts (the reference forward, llama.cpp semantics), as many anchors per head pass as
    REFERENCE_LOGIT_BYTES of logits allow: check reads the head from its file at every pass."""
    d = model.drafter
    per_anchor = d.block_size * model.head.shape[0] * model.dtype.itemsize
    group = max(1, REFERENCE_LOGIT_BYTES // per_anchor)

    def drafts_of(features: torch.Tensor, tokens: torch.Tensor, anchors: list[int]) -> torch.Tensor:
        out = []
        for g in range(0, len(anchors), group):
            blocks = []
            for c in anchors[g:g + group]:
                ids = block_tokens(d, int(tokens[c]))
                blocks.append((features[:c].double(), ids, contiguous_positions(c, len(ids))))
            out += [r["llama.cpp"].tokens[:n_max].cpu() for r in reference_forward_blocks(model, blocks, ("llama.cpp",))]
        return torch.stack(out) if out else torch.empty(0, n_max, dtype=torch.int64)

    return drafts_of


__all__ = ["ACCEPT_BATCH", "AnchorStats", "BlockRows", "LoopCount", "LoopWalk", "anchor_drafts", "anchor_lengths", "block_graph",
           "block_layer", "block_rows", "context_input", "context_kv", "expected_lengths", "gguf_drafts", "live_loop", "loop_anchors",
           "measure", "reference_drafts", "sequence_inputs"]
