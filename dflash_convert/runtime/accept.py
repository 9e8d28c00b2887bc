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
from .head import head_argmax
from .observe import observe
from .reference import ReferenceModel, reference_forward
from .weights import DrafterWeights

DEFAULT_BATCH = 16  # anchors per pass: bounds the logits of a large vocabulary (batch * (B-1) rows)


@torch.no_grad()
def context_kv(d: Drafter, w: DrafterWeights, features: torch.Tensor, *, cpu_matmul: bool = False,
               layers: list[int] | None = None) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """Each layer's K (roped at 0..L-1) and V of the context ``g = enc_norm(fc(features))``; only ``layers``, others None."""
    dev, dt = w.device, w.dtype
    L = features.shape[0]
    spec = rope_spec(d, w.rope_freqs)
    g = rms_norm(_mm(features.to(dev, dt), w.fc, w.fc_scale, w.fc_type if cpu_matmul else None), d.rms_eps, w.enc_norm)
    ctx_pos = torch.arange(L, device=dev)
    cos_c, sin_c = rope_cos_sin(spec, position_rows(torch.cat([ctx_pos, ctx_pos[:1]]), L, spec.sections is not None), dt)
    cos_c, sin_c = cos_c[:L], sin_c[:L]
    out: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    for il, lw in enumerate(w.layers):
        if layers is not None and il not in layers:
            out.append(None)
            continue
        k, v = _kv(lw, g, d.head_dim, d.rms_eps, cpu_matmul)
        out.append((apply_rope_neox(k, cos_c, sin_c), v))
    return out


@torch.no_grad()
def anchor_drafts(d: Drafter, w: DrafterWeights, features: torch.Tensor, tokens: torch.Tensor, anchors: list[int],
                  n_max: int, *, batch: int = DEFAULT_BATCH, keep_logits: bool = False,
                  cpu_matmul: bool = False, kv_cache_dtype: torch.dtype | None = None,
                  ctx_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                  ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[len(anchors), n_max] greedy draft tokens (target ids) from each anchor; ``keep_logits``: the logits too."""
    B = d.block_size
    most = B if w.markov is not None and w.markov.sample_from_anchor else B - 1  # DSpark drafts from the anchor's slot
    if not 1 <= n_max <= most:
        raise DFlashError(f"n_max {n_max} must be in 1..{most} (block size {B}" + (")" if most == B else " minus the anchor slot)"))
    dev = w.device
    L = features.shape[0]
    if any(not 0 <= c < L for c in anchors):
        raise DFlashError(f"anchors must lie in 0..{L - 1}")
    causal = bool(d.causal)
    spec = rope_spec(d, w.rope_freqs)
    mrope = spec.sections is not None
    kq_scale = w.attention_scale or 1.0 / math.sqrt(d.head_dim)
    pattern = d.swa_pattern or []
    window_of = [d.sliding_window if d.sliding_window and i < len(pattern) and pattern[i] else None for i in range(d.n_layers)]
    if ctx_kv is None:  # the context, once for all the anchors: a block attends to it, never changes it
        ctx_kv = context_kv(d, w, features, cpu_matmul=cpu_matmul)  # type: ignore[assignment]

    out, kept = [], []
    for at in range(0, len(anchors), batch):
        part = torch.tensor(anchors[at:at + batch], dtype=torch.int64, device=dev)
        logits, drafted = _blocks(d, w, part, tokens.to(dev), ctx_kv, window_of, causal, spec, mrope, kq_scale, n_max,
                                  cpu_matmul, kv_cache_dtype, keep_logits)
        out.append(drafted.cpu())
        if keep_logits:
            kept.append(logits.cpu())
    drafts = torch.cat(out) if out else torch.empty(0, n_max, dtype=torch.int64)
    if keep_logits:
        return drafts, (torch.cat(kept) if kept else torch.empty(0, n_max, d.vocab_size))
    return drafts


def _blocks(d: Drafter, w: DrafterWeights, anchors: torch.Tensor, tokens: torch.Tensor, ctx_kv: list, window_of: list,
            causal: bool, spec, mrope: bool, kq_scale: float, n_max: int, cpu_matmul: bool,
            cache_dtype: torch.dtype | None, need_logits: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(scores [A, n_max, V] the tokens are chosen from, or None, drafted tokens [A, n_max]) of blocks from ``anchors``."""
    dev, dt = w.device, w.dtype
    A, B = anchors.shape[0], d.block_size
    H, D, eps = d.n_head, d.head_dim, d.rms_eps
    L = ctx_kv[0][0].shape[0]
    ids = torch.full((A, B), d.mask_token_id, dtype=torch.int64, device=dev)
    ids[:, 0] = tokens[anchors]
    q_pos = anchors[:, None] + torch.arange(B, device=dev)[None, :]  # [A, B]
    # a block token broadcasts its one position to every M-RoPE section (as llama.cpp's token batch does)
    rows = q_pos.reshape(1, -1).repeat(4 if mrope else 1, 1)
    cos_b, sin_b = rope_cos_sin(spec, rows, dt)  # [A*B, n_rot/2]
    k_pos = torch.arange(L, device=dev)
    # which context cells each block query sees: only its own prefix (c < anchor), and the window
    diff_ctx = q_pos[:, :, None] - k_pos[None, None, :]  # [A, B, L]
    base_ctx = k_pos[None, None, :] < anchors[:, None, None]
    diff_blk = q_pos[:, :, None] - q_pos[:, None, :]  # [A, B, B]
    x = w.embed.rows(ids.reshape(-1))
    if d.embedding_scale:
        x = x * d.embedding_scale
    for il, lw in enumerate(w.layers):
        win = window_of[il]
        vis_ctx = base_ctx & ((diff_ctx < win) if win is not None else True)
        vis_blk = torch.ones_like(diff_blk, dtype=torch.bool)
        if causal:
            vis_blk &= diff_blk >= 0
        if win is not None:
            vis_blk &= diff_blk < win
        h = rms_norm(x, eps, lw.attn_norm)
        convs = None if w.dflash2 is None else w.dflash2.layer(il, B, matmul(cpu_matmul))  # rows are whole blocks
        if convs is not None:
            h = convs.attn_in(h)
        q = rms_norm(_layer_mm(lw, "wq", h, cpu_matmul).reshape(-1, H, D), eps, lw.q_norm)
        k_blk, v_blk = _kv(lw, h, D, eps, cpu_matmul)
        q = apply_rope_neox(q, cos_b, sin_b).reshape(A, B, H, D)
        k_blk = apply_rope_neox(k_blk, cos_b, sin_b).reshape(A, B, -1, D)
        v_blk = v_blk.reshape(A, B, -1, D)
        k_ctx, v_ctx = ctx_kv[il]
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
        attn = (torch.einsum("ahbl,lhd->abhd", probs[..., :L], vc)
                + torch.einsum("ahbk,akhd->abhd", probs[..., L:], vb)).reshape(A * B, H * D)
        x = layer_tail(d, lw, x, attn, False, cpu_matmul, convs)
    states = rms_norm(x, eps, w.output_norm)
    observe(w.head, states)  # the graph projects every slot of the block (the driver reads 1..n_max)
    if w.dflash2 is not None:
        observe(w.dflash2, states)  # the selector's hidden projection, over every slot as well
    if w.markov is not None:  # DSpark: every slot through the head, then the Markov chain (runtime.dspark)
        read = cpu_matmul_input(states, w.head.source.dtype) if cpu_matmul else states
        logits = scatter_d2t(w.head.project(read), w.d2t, d.vocab_size).reshape(A, B, -1)
        chain = markov_chain(w.markov, logits, states.reshape(A, B, -1), ids[:, 0], w.d2t,
                             cpu_matmul_input if cpu_matmul else None)
        return chain.logits[:, :n_max], chain.tokens[:, :n_max]
    normed = states.reshape(A, B, -1)[:, 1:n_max + 1]
    hidden = normed.reshape(A * n_max, -1)
    if cpu_matmul:
        hidden = cpu_matmul_input(hidden, w.head.source.dtype)
    if w.dflash2 is None and not need_logits:  # only the argmax: a bf16 screen, float32 where it decides
        best = head_argmax(w.head, hidden, w.d2t)
        if best is not None:
            return None, (best if w.d2t is None else w.d2t.to(best.device)[best]).reshape(A, n_max)
    raw = w.head.project(hidden)
    if w.dflash2 is None:
        logits = scatter_d2t(raw, w.d2t, d.vocab_size).reshape(A, n_max, -1)
        return logits, logits.argmax(dim=-1)
    logits = scatter_d2t(w.dflash2.output_transforms(raw), w.d2t, d.vocab_size).reshape(A, n_max, -1)
    sel = w.dflash2.select(normed, logits, ids[:, 0], matmul(cpu_matmul))
    return sel.choice_rows(d.vocab_size), sel.tokens


# --- llama.cpp's count


def loop_anchors(tokens: list[int], prompt_length: int, n_predict: int, n_max: int, eos: set[int],
                 draft_at: Callable[[int], list[int]]) -> LoopCount:
    """Replay llama-speculative-simple's greedy loop along a captured sequence, ``draft_at(c)`` drafting from ``c``."""
    count = LoopCount()
    c = prompt_length - 1
    while True:
        budget = n_predict - count.n_predict - 1
        if c + 1 >= len(tokens):  # no continuation token left to verify a draft against
            raise DFlashError(f"the captured continuation ends at position {len(tokens)}, before the loop's last step "
                              f"(position {c + 1}); capture with --new-tokens >= {n_predict}")
        draft = draft_at(c)[:n_max]
        if budget > 0:
            draft = draft[:budget]
        k = 0
        while k < len(draft) and c + 1 + k < len(tokens) and draft[k] == tokens[c + 1 + k]:
            k += 1
        if c + 1 + k >= len(tokens):
            raise DFlashError(f"the captured continuation ends at position {len(tokens)}, before the loop's last step "
                              f"(position {c + 1 + k}); capture with --new-tokens >= {n_predict}")
        ids = tokens[c + 1:c + 2 + k]
        count.n_drafted += len(draft)
        count.n_accept += k
        count.n_predict += len(ids)
        count.steps += 1
        count.accepted_per_step.append(k)
        c += k + 1
        if count.n_predict > n_predict or any(t in eos for t in ids):
            return count


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
    """The live loop (``-n`` the file's ``new_tokens``) and every anchor's acceptance, over every sequence."""
    n_predict = feats.new_tokens
    loop, stats = LoopCount(), AnchorStats(n_max=n_max)
    eos = set(feats.eos_ids)
    for i in range(len(feats.sequences)):
        features, tokens, prompt_length = sequence_inputs(feats, i, slots)
        anchors = list(range(prompt_length - 1, len(tokens) - 1))
        drafted = drafts_of(features, torch.tensor(tokens), anchors).tolist()
        by_anchor = dict(zip(anchors, drafted, strict=True))
        loop.add(loop_anchors(tokens, prompt_length, n_predict, n_max, eos, by_anchor.__getitem__))
        stats.add(anchor_lengths(tokens, anchors, by_anchor, n_max))
    return loop, stats


ContextOf = Callable[[int, torch.Tensor], list]  # (sequence index, its features) -> context_kv for that sequence


def live_loop(d: Drafter, w: DrafterWeights, feats: FeaturesFile, slots: list[int], n_max: int, *, like_cpu: bool = True,
              indices: list[int] | None = None, context_of: ContextOf | None = None) -> LoopCount:
    """Only the live loop (``loop_anchors``) over sequences ``indices`` (default: all), drafting just where it anchors."""
    n_predict = feats.new_tokens
    eos = set(feats.eos_ids)
    cache_dtype = torch.float16 if like_cpu else None
    total = LoopCount()
    for i in range(len(feats.sequences)) if indices is None else indices:
        features, tokens, prompt_length = sequence_inputs(feats, i, slots)
        ids = torch.tensor(tokens)
        ctx = context_of(i, features) if context_of is not None else context_kv(d, w, features, cpu_matmul=like_cpu)

        def draft_at(c: int, features=features, ids=ids, ctx=ctx) -> list[int]:
            out = anchor_drafts(d, w, features, ids, [c], n_max, batch=1, cpu_matmul=like_cpu, kv_cache_dtype=cache_dtype,
                                ctx_kv=ctx)
            return out[0].tolist()  # type: ignore[index]

        total.add(loop_anchors(tokens, prompt_length, n_predict, n_max, eos, draft_at))
    return total


def gguf_drafts(d: Drafter, w: DrafterWeights, n_max: int, *, like_cpu: bool = True, batch: int = DEFAULT_BATCH) -> Drafts:
    """A drafter file's drafts, batched; ``like_cpu`` rounds as llama.cpp's CPU backend."""
    return lambda f, t, a: anchor_drafts(d, w, f, t, a, n_max, batch=batch, cpu_matmul=like_cpu,
                                         kv_cache_dtype=torch.float16 if like_cpu else None)


def reference_drafts(model: ReferenceModel, n_max: int) -> Drafts:
    """The checkpoint's drafts (the reference forward, llama.cpp semantics), one anchor at a time."""
    d = model.drafter

    def drafts_of(features: torch.Tensor, tokens: torch.Tensor, anchors: list[int]) -> torch.Tensor:
        out = []
        for c in anchors:
            ids = block_tokens(d, int(tokens[c]))
            r = reference_forward(model, features[:c].double(), ids, contiguous_positions(c, len(ids)))
            out.append(r.tokens[:n_max].cpu())
        return torch.stack(out) if out else torch.empty(0, n_max, dtype=torch.int64)

    return drafts_of


__all__ = ["AnchorStats", "LoopCount", "anchor_drafts", "context_kv", "anchor_lengths", "gguf_drafts", "live_loop", "loop_anchors", "measure",
           "reference_drafts", "sequence_inputs"]
