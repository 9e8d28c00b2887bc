"""The drafter's forward pass from its Hugging Face checkpoint, independent of the GGUF path.

Shares only the config parsing with conversion and ``runtime.forward``; z-lab's model code under the
``"llama.cpp"`` or ``"reference"`` semantics. Refuses a member it does not compute, a missing embedding
or head with no target, and a malformed ``mask_embedding.pt``. Spec: docs/runtime.md, "The reference".
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open  # safetensors' own reader, so the reference shares no reading code with convert

from ..drafter import Drafter
from ..errors import DFlashError, InputFileError
from ..format.family import DFLASH, DFLASH2, DSPARK, GEMMA4_DSPARK_ARCHITECTURES, member_of
from ..format.rules import D2T_TENSOR, EMBEDDING_TENSOR, FC_TENSOR, OUTPUT_TENSOR
from ..format.tensors import GEMMA4_ROLES_HF, HIDDEN_NORM_HF, LAYER_ROLES_HF, OUTPUT_NORM_HF, SINK_HF, gguf_to_hf, strip_model_prefix
from ..sources.checkpoint import Checkpoint, merged_text_config
from ..sources.config import ConfigView
from ..sources.dispatch import checkpoint_reader
from ..sources.vocabulary import MASK_EMBEDDING_FILE
from ..target import Target
from .dflash2_reference import CheckpointDflash2, load_checkpoint_dflash2
from .dspark import checkpoint_markov_chain
from .forward import ForwardResult
from .weights import LazyMatrix, target_weights

SEMANTICS = ("llama.cpp", "reference")
# Gemma4TextConfig's full-attention RoPE when a config gives none
GEMMA4_DEFAULT_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.25}
SLIDING = "sliding_attention"
SPECULATORS_LAYOUT = "speculators"  # Origin.format of a speculators export

FC_HF = gguf_to_hf(FC_TENSOR)
EMBED_HF = gguf_to_hf(EMBEDDING_TENSOR)
HEAD_HF = gguf_to_hf(OUTPUT_TENSOR)
D2T_HF = gguf_to_hf(D2T_TENSOR)


@dataclass
class ReferenceModel:
    """A checkpoint's weights under their HF names, and the config that says how to run them."""

    drafter: Drafter  # hyper-parameters as the converter reads them (tensors unused here)
    config: dict[str, Any]  # the flat config (text_config merged, speculators' layer config merged)
    dialect: str  # "z-lab" or "speculators"
    tensors: CheckpointTensors  # HF name without "model." -> values in ``dtype``
    embed: LazyMatrix
    head: LazyMatrix
    d2t_ids: torch.Tensor | None  # absolute target ids (i + offset)
    mask_row: torch.Tensor | None  # mask_embedding.pt's row, replaces embed[mask_token_id]
    device: torch.device
    dtype: torch.dtype
    notes: list[str] = field(default_factory=list)
    member: str = DFLASH  # DFlash or DSpark (format.family.member_of)
    gemma4: bool = False  # Gemma-4 DSpark: shared K/V, sandwich norms, layer scalar, proportional RoPE
    dflash2: CheckpointDflash2 | None = None  # a DFlash2 checkpoint's convolutions and selector

    def layer(self, i: int, role: str) -> torch.Tensor:
        """Layer ``i``'s weight of ``role`` by its Hugging Face name."""
        return self.tensors[f"layers.{i}.{GEMMA4_ROLES_HF[role] if self.gemma4 and role in GEMMA4_ROLES_HF else LAYER_ROLES_HF[role]}"]

    def optional_layer(self, i: int, role: str) -> torch.Tensor | None:
        """A layer part only some checkpoints have (v_proj is absent with shared K/V, Gemma's norms)."""
        if role in GEMMA4_ROLES_HF and role != "ffn_norm" and not self.gemma4:
            return None
        name = f"layers.{i}.{GEMMA4_ROLES_HF[role] if self.gemma4 and role in GEMMA4_ROLES_HF else LAYER_ROLES_HF[role]}"
        return self.tensors.get(name)

    def sinks(self, i: int) -> torch.Tensor | None:
        """Layer ``i``'s attention sinks, or None."""
        return next((self.tensors[f"layers.{i}.{s}"] for s in SINK_HF if f"layers.{i}.{s}" in self.tensors), None)

    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of ``ids``, the mask token's row from ``mask_embedding.pt`` where the checkpoint has one."""
        x = self.embed.rows(ids)
        if self.mask_row is not None:
            x = torch.where((ids == self.drafter.mask_token_id)[:, None].to(x.device), self.mask_row, x)
        return x


# storage types a replaced embedding row can be rounded to exactly
ROW_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}



class CheckpointTensors(Mapping[str, torch.Tensor]):
    """A checkpoint's tensors by HF name (``model.`` stripped): floats in ``dtype``, integers int64.

    Not ``resident``: only vectors are kept, a matrix is read again at each use (check's memory bound)."""

    def __init__(self, files: list[Path], device: torch.device, dtype: torch.dtype, resident: bool) -> None:
        self.device, self.dtype = device, dtype
        self.where: dict[str, tuple[str, str]] = {}  # name -> (file, name in the file)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.stored: dict[str, str] = {}  # name -> safetensors dtype name (BF16, F32, ...)
        self.kept: dict[str, torch.Tensor] = {}
        for path in files:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    key, part = strip_model_prefix(name), f.get_slice(name)
                    self.where[key], self.shapes[key], self.stored[key] = (str(path), name), tuple(part.get_shape()), part.get_dtype()
                    if resident or len(self.shapes[key]) < 2:
                        self.kept[key] = self._convert(f.get_tensor(name))
                    else:
                        self.kept.pop(key, None)

    def _convert(self, t: torch.Tensor) -> torch.Tensor:
        return (t.to(self.dtype) if t.is_floating_point() else t.to(torch.int64)).to(self.device)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.kept:
            return self.kept[key]
        path, name = self.where[key]
        with safe_open(path, framework="pt", device="cpu") as f:
            return self._convert(f.get_tensor(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)

    def renamed(self, rename: Callable[[str], str]) -> CheckpointTensors:
        """The same tensors under ``rename``d names."""
        out = copy.copy(self)
        out.where, out.shapes, out.stored, out.kept = ({rename(k): v for k, v in m.items()}
                                                      for m in (self.where, self.shapes, self.stored, self.kept))
        return out

    def matrix(self, key: str, what: str) -> LazyMatrix:
        """An embedding or head: kept values, or rows read through safetensors as they are used."""
        if key in self.kept or self.stored[key] not in ROW_DTYPES:
            return LazyMatrix.of(self[key], what)
        return LazyMatrix(_SafetensorsRows(*self.where[key], self.shapes[key], self.stored[key]), self.device, self.dtype, what,
                          keep=False)


class _SafetensorsRows:
    """Rows of one checkpoint matrix as raw words, through safetensors' reader: a lazy embedding's or head's source."""

    def __init__(self, path: str, name: str, shape: tuple[int, ...], dtype: str) -> None:
        self.path, self.name, self.shape, self.dtype = path, name, shape, dtype

    def rows(self, a: int, b: int, fds: object = None) -> np.ndarray:
        with safe_open(self.path, framework="pt", device="cpu") as f:
            return f.get_slice(self.name)[a:b].contiguous().reshape(-1).view(torch.uint8).numpy()



def _mask_row(ckpt_dir: Path, d: Drafter, table_dtype: torch.dtype | None, device: torch.device,
              dtype: torch.dtype) -> torch.Tensor | None:
    """mask_embedding.pt's vector, rounded to the embedding table's dtype as both converters cast it."""
    path = ckpt_dir / MASK_EMBEDDING_FILE
    if not path.is_file():
        return None
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(obj, dict) or "embedding" not in obj or tuple(obj["embedding"].shape) != (d.hidden_size,):
        raise InputFileError(f"must hold {{'mask_token_id', 'embedding' [{d.hidden_size}]}}", path)
    row = obj["embedding"].to(torch.float32)
    if table_dtype is not None:
        row = row.to(table_dtype)
    return row.to(device, dtype)


def load_reference(ckpt: Checkpoint, target: Target | None = None, *, drafter: Drafter | None = None,
                   device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64, resident: bool = True) -> ReferenceModel:
    """A read checkpoint's weights, by their HF names, for the reference forward (``resident``: see CheckpointTensors)."""
    device = torch.device(device)
    tgt = target
    d = drafter if drafter is not None else checkpoint_reader(ckpt).read(ckpt, target)
    member = member_of({t.gguf_name for t in d.tensors})
    if member not in (DFLASH, DSPARK, DFLASH2):
        raise DFlashError(f"a {member} drafter: the reference forward computes classic DFlash, DSpark and DFlash2 drafters only "
                          f"(the {member} parts are not implemented here)", ckpt.config_path)
    speculators = d.origin.format == SPECULATORS_LAYOUT
    if speculators:
        layer_cfg = ConfigView(ckpt.config, ckpt.config_path).get("transformer_layer_config", {})
        cfg = {**layer_cfg, **{k: v for k, v in ckpt.config.items() if k != "transformer_layer_config"}}
    else:
        cfg = merged_text_config(ckpt.config)
    tensors = CheckpointTensors(ckpt.files, device, dtype, resident)

    notes: list[str] = []
    tgt_w: tuple[LazyMatrix, LazyMatrix] | None = None

    def from_target(what: str) -> tuple[LazyMatrix, LazyMatrix]:
        nonlocal tgt_w
        if tgt_w is None:
            if tgt is None:
                raise DFlashError(f"the checkpoint has no {what}: pass the target (directory with safetensors, or GGUF)",
                                  ckpt.dir)
            tgt_w = target_weights(tgt, device, dtype, keep=resident)
        return tgt_w


    has_embed = EMBED_HF in tensors and ConfigView(cfg, ckpt.config_path).get("has_embed_tokens") is not False
    embed = tensors.matrix(EMBED_HF, "checkpoint embed_tokens") if has_embed else from_target("embed_tokens")[0]
    table_dtype = ROW_DTYPES.get(tensors.stored[EMBED_HF] if has_embed else embed.source.dtype)
    if HEAD_HF in tensors and member == DSPARK and not has_embed and tensors.shapes[HEAD_HF][0] == d.vocab_size:
        # a full-vocabulary DSpark lm_head is the target's (upstream's converter drops it and shares the target's)
        head = from_target("lm_head")[1]
        notes.append("the DSpark checkpoint's full-vocabulary lm_head is not used: llama.cpp shares the target's head")
    elif HEAD_HF in tensors:
        head = tensors.matrix(HEAD_HF, "checkpoint lm_head")
    else:
        head = from_target("lm_head")[1]
        if has_embed:
            notes.append("embed_tokens without lm_head: the target's head is used (llama.cpp would tie the head to "
                         "embed_tokens; the converter writes the target's head to prevent that)")
    d2t_ids = None
    if D2T_HF in tensors and head.shape[0] < d.vocab_size:
        off = tensors[D2T_HF].to(torch.int64)
        d2t_ids = off + torch.arange(off.shape[0], device=off.device)
    mask_row = _mask_row(ckpt.dir, d, table_dtype, device, dtype)
    if mask_row is not None and table_dtype is None:
        notes.append(f"the mask row is not rounded to the target embedding's {embed.source.dtype} blocks")
    gemma4 = any(a in GEMMA4_DSPARK_ARCHITECTURES for a in ConfigView(ckpt.config, ckpt.config_path).get("architectures", []))
    if gemma4:  # the confidence head's Gemma-4 spelling is the same tensor
        tensors = tensors.renamed(lambda k: k.replace("confidence_proj.", "confidence_head.proj.", 1)
                                  if k.startswith("confidence_proj.") else k)
    dflash2 = load_checkpoint_dflash2(tensors, d, ckpt.dir) if member == DFLASH2 else None
    return ReferenceModel(d, cfg, SPECULATORS_LAYOUT if speculators else d.origin.format, tensors, embed, head, d2t_ids,
                          mask_row, device, dtype, notes, member=member, gemma4=gemma4, dflash2=dflash2)


def _view(model: ReferenceModel) -> ConfigView:
    """The model's flat config, read typed (the reader already refused a mistyped one)."""
    return ConfigView(model.config, model.drafter.config_path)


def reference_features(model: ReferenceModel, hidden_states: torch.Tensor) -> torch.Tensor:
    """[ctx, T*E] context features the way the checkpoint's own code takes them from the target."""
    cv = _view(model)
    if model.dialect == SPECULATORS_LAYOUT:
        ids = list(cv.get("aux_hidden_state_layer_ids"))
    else:
        ids = [i + 1 for i in cv.sub("dflash_config").get("target_layer_ids", cv.get("target_layer_ids"))]
    return torch.cat([hidden_states[i] for i in ids], dim=-1)


# --- the forward


def _rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else w * y


def _inv_freq(model: ReferenceModel, semantics: str) -> tuple[torch.Tensor, float, int]:
    """HF rope init (default / linear / yarn): inverse frequencies, cos/sin scale, rotary dims.

    YaRN under "llama.cpp" takes llama.cpp's fixed values (docs/runtime.md): the loader reads no yarn_* key."""
    d = model.drafter
    rot = d.n_rot or d.head_dim
    base = d.rope_theta or 10000.0
    inv = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    sc, attention = d.rope_scaling, 1.0
    if sc is not None and sc.kind == "linear":
        inv = inv / sc.factor
    elif sc is not None and sc.kind == "yarn":
        orig = sc.original_context_length or d.context_length
        own = semantics == "reference"
        fast = (sc.yarn_beta_fast if own else None) or 32.0
        slow = (sc.yarn_beta_slow if own else None) or 1.0

        def corr_dim(n_rotations: float) -> float:
            return (rot * math.log(orig / (n_rotations * 2 * math.pi))) / (2 * math.log(base))

        low = max(math.floor(corr_dim(fast)), 0)
        high = min(math.ceil(corr_dim(slow)), rot - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(rot // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        inv = (inv / sc.factor) * (1 - extrapolation) + inv * extrapolation
        attention = (sc.yarn_attn_factor if own else None) or (0.1 * math.log(sc.factor) + 1.0 if sc.factor > 1 else 1.0)
    if model.gemma4:
        inv = _gemma4_proportional(model, inv, rot)
    return inv, attention, rot


def _gemma4_proportional(model: ReferenceModel, inv: torch.Tensor, rot: int) -> torch.Tensor:
    """Gemma-4's proportional RoPE: the first ``partial_rotary_factor * head_dim / 2`` pairs at base^(-2j/head_dim)."""
    rope = _view(model).get("rope_parameters") or {"full_attention": GEMMA4_DEFAULT_ROPE}
    full = rope.get("full_attention", rope)
    if full.get("rope_type", "default") != "proportional":
        return inv
    angles = int(full.get("partial_rotary_factor", GEMMA4_DEFAULT_ROPE["partial_rotary_factor"]) * rot // 2)
    out = inv.clone()
    out[angles:] = 0.0
    return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, interleaved: bool) -> torch.Tensor:
    """Apply RoPE to the first ``rot`` dims of x [N, heads, D] (cos/sin [N, rot], HF layout)."""
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    c, s = cos[:, None, :], sin[:, None, :]
    if interleaved:  # GPT-J pairs (2j, 2j+1); cos/sin repeat_interleave'd
        c = c[..., : rot // 2].repeat_interleave(2, dim=-1)
        s = s[..., : rot // 2].repeat_interleave(2, dim=-1)
        pairs = x_rot.reshape(*x_rot.shape[:-1], rot // 2, 2)
        rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).reshape(x_rot.shape)
    else:  # rotate_half
        rotated = torch.cat([-x_rot[..., rot // 2:], x_rot[..., : rot // 2]], dim=-1)
    return torch.cat([x_rot * c + rotated * s, x_pass], dim=-1)


def layer_attention(model: ReferenceModel, semantics: str) -> list[tuple[bool, int | None, bool]]:
    """Per layer: (causal, window or None, window also hides future cells) under ``semantics``."""
    d = model.drafter
    L = d.n_layers
    pattern = d.swa_pattern if d.sliding_window else None
    windows = [d.sliding_window if pattern and i < len(pattern) and pattern[i] else None for i in range(L)]
    if semantics == "llama.cpp":
        return [(d.causal is True, windows[i], False) for i in range(L)]
    cv = _view(model)
    types = cv.get("layer_types") or ["full_attention"] * L
    if model.dialect == SPECULATORS_LAYOUT:
        non_causal = cv.flag("sliding_window_non_causal")
        return [(types[i] == SLIDING and not non_causal, windows[i], True) for i in range(L)]
    is_causal = cv.get("is_causal")
    if is_causal is None:
        is_causal = cv.sub("dflash_config").get("causal")
    return [((types[i] == SLIDING) if is_causal is None else bool(is_causal), windows[i], True) for i in range(L)]


def _act(model: ReferenceModel, semantics: str, x: torch.Tensor) -> torch.Tensor:
    act = model.drafter.hidden_act
    if act == "silu":
        return F.silu(x)
    if semantics == "reference" and _view(model).first(("hidden_act", "hidden_activation")) == "gelu":
        return F.gelu(x)  # transformers' ACT2FN["gelu"]: the exact erf GELU
    return F.gelu(x, approximate="tanh")


def semantics_differ(model: ReferenceModel) -> bool:
    """Would the trained semantics compute anything the llama.cpp ones do not (masks, GELU, YaRN, logit scale)?"""
    d = model.drafter

    def masks(semantics: str) -> list[tuple[bool, int | None, bool]]:  # the third flag matters only for a non-causal window
        return [(c, w, s and w is not None and not c) for c, w, s in layer_attention(model, semantics)]

    if masks("llama.cpp") != masks("reference"):
        return True
    if d.hidden_act != "silu" and _view(model).first(("hidden_act", "hidden_activation")) == "gelu":
        return True
    if (d.logit_scale or d.final_logit_softcapping) and model.dflash2 is None:  # DFlash2: llama.cpp applies them too
        return True
    sc = d.rope_scaling
    return sc is not None and sc.kind == "yarn" and any(
        v is not None for v in (sc.yarn_beta_fast, sc.yarn_beta_slow, sc.yarn_attn_factor))


@torch.no_grad()
def reference_forward(model: ReferenceModel, target_hidden: torch.Tensor, block_ids: torch.Tensor,
                      positions: torch.Tensor, *, semantics: str = "llama.cpp") -> ForwardResult:
    """One draft from the checkpoint: same inputs and outputs as ``runtime.forward.run_gguf``."""
    return reference_forwards(model, target_hidden, block_ids, positions, (semantics,))[semantics]


@torch.no_grad()
def reference_forwards(model: ReferenceModel, target_hidden: torch.Tensor, block_ids: torch.Tensor,
                       positions: torch.Tensor, semantics: tuple[str, ...]) -> dict[str, ForwardResult]:
    """The same draft under several semantics: the layers once per semantics, the output head once for all."""
    return reference_forward_blocks(model, [(target_hidden, block_ids, positions)], semantics)[0]


Block = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (target hidden [T, L*E], block ids, positions)


@torch.no_grad()
def reference_forward_blocks(model: ReferenceModel, blocks: list[Block],
                             semantics: tuple[str, ...]) -> list[dict[str, ForwardResult]]:
    """Several drafts (each under every semantics), their rows through the output head in one pass.

    check streams a head from its file at each pass (its memory bound), so the anchors of a sequence share
    the reads; each row's logits are the product of that row alone."""
    for s in semantics:
        if s not in SEMANTICS:
            raise ValueError(f"semantics must be one of {SEMANTICS}, got {s!r}")
    hiddens = [{s: _trunk(model, th, ids, pos, s) for s in semantics} for th, ids, pos in blocks]
    first = 0 if model.member == DSPARK else 1  # DSpark's heads read every slot, slot 0 included
    pieces = [h[first:] for hs in hiddens for h in hs.values()]
    logits_all = torch.split(model.head.project(torch.cat(pieces)), [p.shape[0] for p in pieces])
    out, k = [], 0
    for (_, ids, _), hs in zip(blocks, hiddens, strict=True):
        out.append({s: _draft_result(model, s, h, logits_all[k + j], ids) for j, (s, h) in enumerate(hs.items())})
        k += len(hs)
    return out


def _draft_result(model: ReferenceModel, s: str, h: torch.Tensor, logits: torch.Tensor,
                  block_ids: torch.Tensor) -> ForwardResult:
    """One draft's result from its hidden states and head logits under semantics ``s``."""
    if model.member == DSPARK:  # the Markov chain in the head's own vocabulary, then the scatter
        m = checkpoint_markov_chain(model.tensors, _transform_logits(model, logits, s), h, int(block_ids[0]),
                                    model.drafter.sample_from_anchor is not False, model.d2t_ids,
                                    model.drafter.vocab_size)
        return ForwardResult(hidden=h, logits=m.logits, tokens=m.tokens, confidence=m.confidence)
    logits = _finish_logits(model, logits, s)
    if model.dflash2 is None:
        return ForwardResult(hidden=h, logits=logits, tokens=logits.argmax(dim=-1))
    sel = model.dflash2.select(h[1:], logits, int(block_ids[0]), s)  # the driver walks the lattice
    return ForwardResult(hidden=h, logits=logits, tokens=sel.pop("tokens"), choice=sel.pop("choice"), extras=sel)


def _trunk(model: ReferenceModel, target_hidden: torch.Tensor, block_ids: torch.Tensor, positions: torch.Tensor,
           semantics: str) -> torch.Tensor:
    """The final-norm hidden states of every block slot under ``semantics``."""
    d, dev, dt = model.drafter, model.device, model.dtype
    eps, H, KV, D = d.rms_eps, d.n_head, d.n_head_kv, d.head_dim
    pos = (positions[0] if positions.dim() == 2 else positions).to(dev)
    n_ctx = target_hidden.shape[0]
    ids = block_ids.to(dev)

    ctx = _rms(target_hidden.to(dev, dt) @ model.tensors[FC_HF].T, model.tensors[HIDDEN_NORM_HF], eps)
    x = model.embed_rows(ids) * float(d.embedding_scale or 1.0)

    inv, attn_scale, rot = _inv_freq(model, semantics)
    freqs = pos.to(torch.float64)[:, None] * inv.to(dev)[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = (emb.cos() * attn_scale).to(dt), (emb.sin() * attn_scale).to(dt)
    interleaved = not _view(model).flag("rope_is_neox_style", True)
    q_pos, k_pos = pos[n_ctx:, None], pos[None, :]

    for i, (causal, window, symmetric) in enumerate(layer_attention(model, semantics)):
        residual = x
        h = _rms(x, model.layer(i, "attn_norm"), eps)
        convs = model.dflash2.layer(i) if model.dflash2 is not None else None
        if convs is not None:
            h = convs.apply("attn", h, 0)
        n = h.shape[0]
        q = _rms((h @ model.layer(i, "wq").T).view(n, H, D), model.layer(i, "q_norm"), eps)
        kv_in = torch.cat([ctx, h])
        k_proj = (kv_in @ model.layer(i, "wk").T).view(n_ctx + n, KV, D)
        k = _rms(k_proj, model.layer(i, "k_norm"), eps)
        wv = model.optional_layer(i, "wv")
        # shared K/V (Gemma-4's attention_k_eq_v): V is the K projection through a weightless RMSNorm
        v = _rms(k_proj, None, eps) if wv is None else (kv_in @ wv.T).view(n_ctx + n, KV, D)
        q = _rotate(q, cos[n_ctx:], sin[n_ctx:], rot, interleaved)
        k = _rotate(k, cos, sin, rot, interleaved)
        # repeat_kv, then [heads, n, K] scores
        k = k.repeat_interleave(H // KV, dim=1).transpose(0, 1)
        v = v.repeat_interleave(H // KV, dim=1).transpose(0, 1)
        scores = (q.transpose(0, 1) @ k.transpose(1, 2)) * (d.attention_scale or D**-0.5)
        visible = torch.ones(n, n_ctx + n, dtype=torch.bool, device=dev)
        if causal:
            visible &= k_pos <= q_pos
        if window is not None:
            visible &= q_pos - k_pos < window
            if symmetric and not causal:
                visible &= k_pos - q_pos < window
        scores = scores.masked_fill(~visible, float("-inf"))
        sinks = model.sinks(i)
        if sinks is not None:
            scores = torch.cat([scores, sinks.to(dt)[:, None, None].expand(H, n, 1)], dim=-1)
        probs = torch.softmax(scores, dim=-1)[..., : n_ctx + n]
        attn = (probs @ v).transpose(0, 1).reshape(n, H * D) @ model.layer(i, "wo").T
        if d.value_scale:
            attn = attn * d.value_scale
        if convs is not None:
            attn = convs.apply("attn", attn, 1)
        if (post := model.optional_layer(i, "post_attn_norm")) is not None:
            attn = _rms(attn, post, eps)
        x = residual + attn
        h2 = _rms(x, model.layer(i, "ffn_norm"), eps)
        if convs is not None:
            h2 = convs.apply("ffn", h2, 0)
        mlp = _act(model, semantics, h2 @ model.layer(i, "gate").T) * (h2 @ model.layer(i, "up").T)
        mlp = mlp @ model.layer(i, "down").T
        if convs is not None:
            mlp = convs.apply("ffn", mlp, 1)
        if (post := model.optional_layer(i, "post_ffw_norm")) is not None:
            mlp = _rms(mlp, post, eps)
        x = x + mlp
        if (scalar := model.optional_layer(i, "out_scale")) is not None:
            x = x * scalar

    return _rms(x, model.tensors[OUTPUT_NORM_HF], eps)


def _transform_logits(model: ReferenceModel, logits: torch.Tensor, semantics: str) -> torch.Tensor:
    """The trained model's logit scale and softcap (llama.cpp applies neither, except to DFlash2's logits)."""
    d = model.drafter
    if model.dflash2 is not None:  # part of DFlash2's logits under both semantics (llama.cpp applies them)
        return model.dflash2.transform(logits)
    if semantics == "reference":
        if d.logit_scale:
            logits = logits * d.logit_scale
        if d.final_logit_softcapping:
            logits = torch.tanh(logits / d.final_logit_softcapping) * d.final_logit_softcapping
    return logits


def _finish_logits(model: ReferenceModel, logits: torch.Tensor, semantics: str) -> torch.Tensor:
    """The trained model's logit scale and softcap, and the d2t scatter."""
    d, dev = model.drafter, model.device
    logits = _transform_logits(model, logits, semantics)
    if model.d2t_ids is not None:
        full = torch.full((logits.shape[0], d.vocab_size), float("-inf"), dtype=logits.dtype, device=dev)
        full[:, model.d2t_ids] = logits
        logits = full
    return logits


__all__ = ["SEMANTICS", "CheckpointTensors", "ReferenceModel", "layer_attention", "load_reference", "reference_features", "reference_forward",
           "reference_forward_blocks", "reference_forwards", "semantics_differ"]
