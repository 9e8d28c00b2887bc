"""The drafter's forward pass as llama.cpp 0c1e57098 computes it, in torch (CPU or CUDA): the runner.

``run_gguf`` computes one draft as the speculative driver's draft context does, departures from the
trained model included. Refuses wrong shapes, out-of-vocabulary ids and missing taps (``DFlashError``).
Specification: docs/runtime.md, "The runner".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..drafter import Drafter
from ..errors import DFlashError
from ..format.rules import ROPE_SECTIONS
from .dflash2 import LayerConvs, Selection
from .dspark import markov_chain
from .observe import observe
from .weights import DrafterWeights, LayerWeights, matmul_values

DEFAULT_ROPE_BASE = 10000.0  # llama_model_base::load_hparams when rope.freq_base is absent
YARN_BETA_FAST = 32.0  # llama_hparams defaults (the dflash loader reads no yarn_* keys)
YARN_BETA_SLOW = 1.0
GELU_TABLE_LIMIT = 10.0  # ggml_vec_geglu_f32: below -limit -> 0, above +limit -> identity
GELU_COEF_A = 0.044715  # ggml-cpu/vec.h
GELU_SQRT_2_OVER_PI = 0.79788456080286535587989211986876


@dataclass
class ForwardResult:
    """One draft: the block's final-norm hidden states and the drafted slots' logits and tokens."""

    hidden: torch.Tensor  # [n_block, hidden] output of the final norm
    logits: torch.Tensor  # [n_drafted, vocab] for the predicted slots, target vocabulary ids
    tokens: torch.Tensor  # [n_drafted] int64 target ids as the driver drafts them (the argmax, or DFlash2's walk)
    confidence: torch.Tensor | None = None  # [n_drafted] DSpark's confidence head, when the file has one
    head_logits: torch.Tensor | None = None  # DSpark: [n_block, vocab] the output head's, before the Markov bias
    # [n_drafted, vocab] the scores the driver picks tokens by when not ``logits`` (DFlash2's walked rows)
    choice: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # a member's per-slot arrays (DFlash2: candidates, lattice)

    def choice_logits(self) -> torch.Tensor:
        """What the driver chose each drafted token from: its near-ties are the ones that matter."""
        return self.logits if self.choice is None else self.choice


@dataclass
class RopeSpec:
    """The rope parameters ggml_rope_ext / ggml_rope_multi get from the dflash graph."""

    n_rot: int
    freq_base: float
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = YARN_BETA_FAST
    beta_slow: float = YARN_BETA_SLOW
    n_ctx_orig: int = 0
    sections: tuple[int, ...] | None = None  # M-RoPE when set (some entry non-zero)
    freq_factors: torch.Tensor | None = None  # rope_freqs.weight (NeoX path only)


def rope_spec(d: Drafter, freq_factors: torch.Tensor | None = None) -> RopeSpec:
    """The rope llama.cpp builds for this drafter (llama_context cparams + the dflash graph)."""
    n_rot = d.n_rot or d.head_dim
    base = d.rope_theta if d.rope_theta else DEFAULT_ROPE_BASE
    sc = d.rope_scaling
    freq_scale = 1.0 / sc.factor if sc is not None and sc.factor else 1.0
    ext_factor, attn_factor = 0.0, 1.0
    if sc is not None and sc.kind == "yarn":
        ext_factor = 1.0
        factor = 1.0 / freq_scale
        mscale = 1.0 + 0.1 * math.log(factor) if factor > 1.0 else 1.0
        attn_factor = mscale / (1.0 + 0.1 * math.log(factor))
    n_ctx_orig = (sc.original_context_length if sc is not None and sc.original_context_length else d.context_length) or 0
    sections = tuple(d.rope_sections) if d.rope_sections and any(d.rope_sections) else None
    if sections is not None and len(sections) != ROPE_SECTIONS:
        sections = tuple((list(sections) + [0] * ROPE_SECTIONS)[:ROPE_SECTIONS])
    return RopeSpec(n_rot, float(base), freq_scale, ext_factor, attn_factor, n_ctx_orig=n_ctx_orig, sections=sections,
                    freq_factors=None if sections is not None else freq_factors)


def _f32(v: float) -> float:
    """A Python float rounded to float32, as the C code holds it."""
    return float(torch.tensor(v, dtype=torch.float32))


def _yarn_corr_dims(spec: RopeSpec) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the dims where YaRN's ramp starts and ends."""

    def corr(beta: float) -> float:
        return spec.n_rot * math.log(spec.n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(spec.freq_base))

    return max(0.0, math.floor(corr(spec.beta_fast))), min(spec.n_rot - 1.0, math.ceil(corr(spec.beta_slow)))


def rope_cos_sin(spec: RopeSpec, pos_rows: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of every rotated pair of ``pos_rows`` ([4, N] or [1, N]): [N, n_rot/2], ggml's float32 recurrence."""
    f32 = torch.float32
    half = spec.n_rot // 2
    dev = pos_rows.device
    theta_scale = torch.tensor(spec.freq_base, dtype=f32) ** torch.tensor(-2.0 / spec.n_rot, dtype=f32)
    theta_scale = theta_scale.to(dev)
    cur = pos_rows.to(f32)  # [R, N]
    steps = []
    for _ in range(half):
        steps.append(cur)
        cur = cur * theta_scale
    theta_rows = torch.stack(steps, dim=-1)  # [R, N, half]
    if spec.sections is not None:
        s = spec.sections
        sector = torch.arange(half, device=dev) % sum(s)
        row = torch.full_like(sector, 3)
        row[sector < s[0] + s[1] + s[2]] = 2
        row[sector < s[0] + s[1]] = 1
        row[sector < s[0]] = 0
        theta_extrap = theta_rows.gather(0, row[None, None, :].expand(1, theta_rows.shape[1], half))[0]
    else:
        theta_extrap = theta_rows[0]
    if spec.freq_factors is not None:
        theta_extrap = theta_extrap / spec.freq_factors[:half].to(dev, f32)
    theta = _f32(spec.freq_scale) * theta_extrap
    mscale = _f32(spec.attn_factor)
    if spec.ext_factor != 0.0:
        low, high = _yarn_corr_dims(spec)
        j = torch.arange(half, dtype=f32, device=dev)
        ramp_mix = (1 - torch.clamp((j - low) / max(0.001, high - low), 0.0, 1.0)) * _f32(spec.ext_factor)
        theta = theta * (1 - ramp_mix) + theta_extrap * ramp_mix
        mscale = _f32(mscale * _f32(1.0 + 0.1 * math.log(1.0 / spec.freq_scale)))
    return (torch.cos(theta) * mscale).to(dtype), (torch.sin(theta) * mscale).to(dtype)


def apply_rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, D]: pairs (j, j + n_rot/2) rotate, dims >= n_rot pass through (partial rotary)."""
    half = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    x0, x1, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c, rest], dim=-1)


def rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """ggml_rms_norm (x / sqrt(mean(x^2) + eps)) over the last dim, then the optional weight."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def position_rows(positions: torch.Tensor, n_ctx: int, mrope: bool) -> torch.Tensor:
    """Position rows for the rope, [4, N] for M-RoPE or [1, N]; a 1-D ``positions`` expanded as llama.cpp does."""
    if positions.dim() == 2:
        if mrope and positions.shape[0] != ROPE_SECTIONS:
            raise DFlashError(f"M-RoPE positions need {ROPE_SECTIONS} rows, got {positions.shape[0]}")
        return positions if mrope else positions[:1]
    if not mrope:
        return positions[None]
    rows = positions[None].repeat(ROPE_SECTIONS, 1)
    rows[ROPE_SECTIONS - 1, :n_ctx] = 0
    return rows


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, *, causal: bool, window: int | None) -> torch.Tensor:
    """llama.cpp's KQ mask (llama_kv_cache::set_input_kq_mask): True where a query sees a cell."""
    visible = torch.ones(q_pos.shape[0], k_pos.shape[0], dtype=torch.bool, device=q_pos.device)
    if causal:
        visible &= k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= (q_pos[:, None] - k_pos[None, :]) < window
    return visible


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float,
           sinks: torch.Tensor | None, cache_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Softmax attention with GQA and optional sinks: q [n, H, D], k/v [K, Hkv, D] -> [n, H*D]; ``cache_dtype``: an F16/BF16 KV cache."""
    n, H, D = q.shape
    if cache_dtype is not None:
        q, k, v = (t.to(cache_dtype).to(q.dtype) for t in (q, k, v))
    group = H // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,khd->hnk", q, k) * scale
    scores = scores.masked_fill(~visible[None], float("-inf"))
    if sinks is not None:
        col = sinks.to(scores.dtype)[:, None, None].expand(H, n, 1)
        probs = torch.softmax(torch.cat([scores, col], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    if cache_dtype is not None:
        probs = probs.to(cache_dtype).to(q.dtype)
    return torch.einsum("hnk,khd->nhd", probs, v).reshape(n, H * D)


# ggml-cpu type_traits_cpu[type].vec_dot_type: the type a matmul's activations are converted to
VEC_DOT_TYPE: dict[str, str] = {
    "F32": "F32", "F16": "F16", "BF16": "BF16",
    "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "IQ4_NL": "Q8_0",
    "Q4_1": "Q8_1", "Q5_1": "Q8_1",
    "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K", "IQ4_XS": "Q8_K",
    "TQ1_0": "Q8_K", "TQ2_0": "Q8_K", "IQ3_XXS": "Q8_K", "IQ3_S": "Q8_K", "Q1_0": "Q8_0", "Q2_0": "Q8_0",
    "IQ2_XXS": "Q8_K", "IQ2_XS": "Q8_K", "IQ2_S": "Q8_K", "IQ1_S": "Q8_K", "IQ1_M": "Q8_K",
}
Q8_BLOCK, Q8_K_BLOCK = 32, 256


def _q8_0_round(x: torch.Tensor) -> torch.Tensor:
    """x through quantize_row_q8_0 (x86 AVX path, round half to even) and back; Q8_1's sum term is not modelled."""
    b = x.reshape(*x.shape[:-1], -1, Q8_BLOCK).to(torch.float32)
    amax = b.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(b * inv)
    d = (amax / 127.0).to(torch.float16).to(torch.float32)
    return (q * d).reshape(x.shape).to(x.dtype)


def _q8_k_round(x: torch.Tensor) -> torch.Tensor:
    """x through quantize_row_q8_K_ref and back (max keeps its sign; d = 1/iscale in float32)."""
    b = x.reshape(*x.shape[:-1], -1, Q8_K_BLOCK).to(torch.float32)
    idx = b.abs().argmax(-1, keepdim=True)  # first of equal magnitudes, like the reference loop
    mx = b.gather(-1, idx)
    iscale = torch.where(mx != 0, -127.0 / mx, torch.zeros_like(mx))
    q = torch.clamp(torch.round(b * iscale), max=127.0)
    d = torch.where(mx != 0, 1.0 / iscale, torch.zeros_like(mx))
    return (q * d).reshape(x.shape).to(x.dtype)


def cpu_matmul_input(x: torch.Tensor, weight_type: str) -> torch.Tensor:
    """The activations as ggml's CPU backend feeds them to a matmul with a ``weight_type`` matrix."""
    vt = VEC_DOT_TYPE.get(weight_type, "F32")
    if vt == "F16":
        return x.to(torch.float16).to(x.dtype)
    if vt == "BF16":
        return x.to(torch.bfloat16).to(x.dtype)
    if vt in ("Q8_0", "Q8_1") and x.shape[-1] % Q8_BLOCK == 0:
        return _q8_0_round(x)
    if vt == "Q8_K" and x.shape[-1] % Q8_K_BLOCK == 0:
        return _q8_k_round(x)
    return x


def _mm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, wtype: str | None = None) -> torch.Tensor:
    """build_lora_mm: x @ w.T, times the optional per-tensor scale; ``wtype`` set: round x as ggml's CPU does."""
    observe(w, x)  # the F32 input, before the CPU backend's rounding (what llama-imatrix reads)
    if wtype is not None:
        x = cpu_matmul_input(x, wtype)
    y = x @ matmul_values(w, x.dtype).T  # widened for this product only
    return y if scale is None else y * scale


def _ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    """ggml_gelu_f32, term by term in the input's dtype: 0.5x(1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))."""
    return 0.5 * x * (1.0 + torch.tanh(GELU_SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


def gelu_tanh(x: torch.Tensor, *, fp16_table: bool = False) -> torch.Tensor:
    """ggml's GELU (tanh approximation); ``fp16_table`` mimics the CPU backend's fp16 lookup table."""
    if not fp16_table:
        return _ggml_gelu(x)
    looked_up = _ggml_gelu(x.to(torch.float16).to(torch.float32)).to(torch.float16).to(x.dtype)
    return torch.where(x <= -GELU_TABLE_LIMIT, torch.zeros_like(x), torch.where(x >= GELU_TABLE_LIMIT, x, looked_up))


def _layer_mm(lw: LayerWeights, role: str, x: torch.Tensor, cpu_matmul: bool) -> torch.Tensor:
    return _mm(x, getattr(lw, role), lw.scales.get(role), lw.types.get(role) if cpu_matmul else None)


def _ffn(h: torch.Tensor, lw: LayerWeights, act: str, gelu_fp16_table: bool, cpu_matmul: bool) -> torch.Tensor:
    """build_ffn(..., LLM_FFN_PAR): down(act(gate(h)) * up(h)), SiLU or GELU."""
    up = _layer_mm(lw, "up", h, cpu_matmul)
    gate = _layer_mm(lw, "gate", h, cpu_matmul)
    a = gelu_tanh(gate, fp16_table=gelu_fp16_table) if act in ("gelu", "gelu_pytorch_tanh") else F.silu(gate)
    return _layer_mm(lw, "down", a * up, cpu_matmul)


def _kv(lw: LayerWeights, x: torch.Tensor, D: int, eps: float, cpu_matmul: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """K (normed, not yet roped) and V of ``x`` for one layer; shared KV when attn_v is absent."""
    k_raw = _layer_mm(lw, "wk", x, cpu_matmul).reshape(x.shape[0], lw.wk.shape[0] // D, D)  # no -1: an empty context is fine
    k = rms_norm(k_raw, eps, lw.k_norm)
    if lw.wv is None:
        return k, rms_norm(k_raw, eps)
    return k, _layer_mm(lw, "wv", x, cpu_matmul).reshape(x.shape[0], lw.wv.shape[0] // D, D)


def check_inputs(d: Drafter, target_hidden: torch.Tensor, block_ids: torch.Tensor, positions: torch.Tensor) -> int:
    """Shapes the driver guarantees; returns the context length."""
    width = len(d.target_layers) * d.hidden_size
    if target_hidden.dim() != 2 or target_hidden.shape[1] != width:
        raise DFlashError(f"target_hidden must be [ctx, {len(d.target_layers)} * {d.hidden_size}], got {list(target_hidden.shape)}")
    if block_ids.dim() != 1 or block_ids.shape[0] < 2:
        raise DFlashError(f"block_ids must be [n_block >= 2] (anchor then mask tokens), got {list(block_ids.shape)}")
    n = target_hidden.shape[0] + block_ids.shape[0]
    if positions.shape[-1] != n or positions.dim() not in (1, 2):
        raise DFlashError(f"positions must be [ctx + n_block] = [{n}] (or [4, {n}]), got {list(positions.shape)}")
    bad = block_ids[(block_ids < 0) | (block_ids >= d.vocab_size)]
    if bad.numel():
        raise DFlashError(f"block token id {int(bad[0])} is outside the vocabulary [0, {d.vocab_size})")
    return target_hidden.shape[0]


def gather_features(d: Drafter, layer_inputs: torch.Tensor) -> torch.Tensor:
    """The driver's feature rows [ctx, T*E] from ``layer_inputs`` [n_layers + 1, ctx, E] (output_hidden_states stacked)."""
    bad = [L for L in d.target_layers if not 0 <= L < layer_inputs.shape[0]]
    if bad:
        raise DFlashError(f"target layer {bad[0]} is not among the {layer_inputs.shape[0]} layer inputs given")
    return torch.cat([layer_inputs[L] for L in d.target_layers], dim=-1)


def block_tokens(d: Drafter, anchor: int, n_block: int | None = None) -> torch.Tensor:
    """The driver's noise block: [anchor] + (n_block - 1) mask tokens (default: block_size)."""
    n = d.block_size if n_block is None else n_block
    ids = torch.full((n,), d.mask_token_id, dtype=torch.int64)
    ids[0] = anchor
    return ids


def contiguous_positions(n_ctx: int, n_block: int, start: int = 0) -> torch.Tensor:
    """Positions of ``n_ctx`` committed tokens followed by the block: start .. start+n_ctx+n_block-1."""
    return torch.arange(start, start + n_ctx + n_block, dtype=torch.int64)


@torch.no_grad()
def layer_tail(d: Drafter, lw: LayerWeights, x: torch.Tensor, attn: torch.Tensor, gelu_fp16_table: bool,
               cpu_matmul: bool, convs: LayerConvs | None = None) -> torch.Tensor:
    """A layer after attention as the dflash graph computes it: output projection, norms, residuals, FFN, scales."""
    eps = d.rms_eps
    o = _layer_mm(lw, "wo", attn, cpu_matmul)
    if d.value_scale:
        o = o * d.value_scale
    if convs is not None:
        o = convs.attn_out(o)
    if lw.post_attn_norm is not None:
        o = rms_norm(o, eps, lw.post_attn_norm)
    x = x + o
    h = rms_norm(x, eps, lw.ffn_norm)
    y = _ffn(h if convs is None else convs.ffn_in(h), lw, d.hidden_act, gelu_fp16_table, cpu_matmul)
    if convs is not None:
        y = convs.ffn_out(y)
    if lw.post_ffw_norm is not None:
        y = rms_norm(y, eps, lw.post_ffw_norm)
    x = x + y
    if lw.out_scale is not None:
        x = x * lw.out_scale
    return x


def run_gguf(d: Drafter, weights: DrafterWeights, target_hidden: torch.Tensor, block_ids: torch.Tensor,
             positions: torch.Tensor, *, causal: bool | None = None, kv_cache_dtype: torch.dtype | None = None,
             gelu_fp16_table: bool = False, cpu_matmul: bool = False) -> ForwardResult:
    """One draft of a dflash drafter, computed as llama.cpp's draft context computes it."""
    dev, dt = weights.device, weights.dtype
    n_ctx = check_inputs(d, target_hidden, block_ids, positions)
    if weights.markov is not None and block_ids.shape[0] > d.block_size:
        # llama.cpp skips the Markov head for such a block; the driver never decodes one
        raise DFlashError(f"a DSpark block holds at most block_size = {d.block_size} tokens, got {block_ids.shape[0]}")
    feats, ids, pos = target_hidden.to(dev, dt), block_ids.to(dev), positions.to(dev)
    H, D, eps = d.n_head, d.head_dim, d.rms_eps
    causal = bool(d.causal) if causal is None else causal
    spec = rope_spec(d, weights.rope_freqs)
    rows = position_rows(pos, n_ctx, spec.sections is not None)
    cos, sin = rope_cos_sin(spec, rows, dt)
    t_pos = rows[0]  # the mask compares temporal positions
    q_pos, k_pos = t_pos[n_ctx:], t_pos
    kq_scale = weights.attention_scale or 1.0 / math.sqrt(D)
    pattern = d.swa_pattern or []
    window_of = [d.sliding_window if d.sliding_window and i < len(pattern) and pattern[i] else None for i in range(d.n_layers)]

    g = rms_norm(_mm(feats, weights.fc, weights.fc_scale, weights.fc_type if cpu_matmul else None), eps, weights.enc_norm)

    x = weights.embed.rows(ids)
    if d.embedding_scale:
        x = x * d.embedding_scale
    masks = {w: attention_mask(q_pos, k_pos, causal=causal, window=w) for w in set(window_of)}
    dflash2 = weights.dflash2
    for il, lw in enumerate(weights.layers):
        k_ctx, v_ctx = _kv(lw, g, D, eps, cpu_matmul)
        h = rms_norm(x, eps, lw.attn_norm)
        convs = None if dflash2 is None else dflash2.layer(il, ids.shape[0], matmul(cpu_matmul))
        if convs is not None:
            h = convs.attn_in(h)
        q = rms_norm(_layer_mm(lw, "wq", h, cpu_matmul).reshape(-1, H, D), eps, lw.q_norm)
        k_blk, v_blk = _kv(lw, h, D, eps, cpu_matmul)
        q = apply_rope_neox(q, cos[n_ctx:], sin[n_ctx:])
        k = apply_rope_neox(torch.cat([k_ctx, k_blk]), cos, sin)
        v = torch.cat([v_ctx, v_blk])
        attn = attend(q, k, v, masks[window_of[il]], kq_scale, lw.sinks, kv_cache_dtype)
        x = layer_tail(d, lw, x, attn, gelu_fp16_table, cpu_matmul, convs)
    hidden = rms_norm(x, eps, weights.output_norm)
    read = hidden if weights.markov is not None else hidden[1:]  # DSpark's heads read slot 0 too
    out = read if not cpu_matmul else cpu_matmul_input(read, weights.head.source.dtype)
    raw = weights.head.project(out)
    if dflash2 is not None:
        logits = scatter_d2t(dflash2.output_transforms(raw), weights.d2t, d.vocab_size)
        sel = dflash2.select(hidden[None, 1:], logits[None], ids[:1], matmul(cpu_matmul))
        return dflash2_result(hidden, logits, sel, d.vocab_size)
    logits = scatter_d2t(raw, weights.d2t, d.vocab_size)
    if weights.markov is not None:  # DSpark: each drafted slot conditioned on the token before it (runtime.dspark)
        m = markov_chain(weights.markov, logits, hidden, ids[0], weights.d2t, cpu_matmul_input if cpu_matmul else None)
        return ForwardResult(hidden=hidden, logits=m.logits, tokens=m.tokens, confidence=m.confidence, head_logits=logits)
    return ForwardResult(hidden=hidden, logits=logits, tokens=logits.argmax(dim=-1))


def matmul(cpu_matmul: bool) -> Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]:
    """x @ w.T for runtime.dflash2, with the CPU backend's input rounding when ``cpu_matmul``."""
    return lambda x, w, wtype: _mm(x, w, None, wtype if cpu_matmul else None)


def dflash2_result(hidden: torch.Tensor, logits: torch.Tensor, sel: Selection, vocab_size: int) -> ForwardResult:
    """One DFlash2 draft: the walked tokens, the walked rows as the choice, the lattice as extras."""
    return ForwardResult(hidden=hidden, logits=logits, tokens=sel.tokens[0], choice=sel.choice_rows(vocab_size)[0],
                         extras=sel.arrays(0))


def scatter_d2t(logits: torch.Tensor, d2t: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits -> target vocabulary: -inf except at the d2t ids (no-op without d2t)."""
    if d2t is None:
        return logits
    full = torch.full((logits.shape[0], vocab_size), float("-inf"), dtype=logits.dtype, device=logits.device)
    full[:, d2t.to(logits.device)] = logits
    return full


__all__ = ["ForwardResult", "RopeSpec", "block_tokens", "contiguous_positions", "gather_features", "rope_spec", "run_gguf",
           "scatter_d2t"]
