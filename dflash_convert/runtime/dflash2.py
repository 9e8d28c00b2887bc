"""DFlash2's parts of the dflash graph, as llama.cpp 0c1e57098 computes them (the GGUF side).

Convolutions, output transforms and the candidate selector; ``runtime.forward`` calls in at its hooks.
Refuses what llama.cpp's loader refuses (missing keys or tensors, bad group size, shapes or top-k).
Specification: docs/runtime.md, "DFlash2, the GGUF side".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

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
from ..format.tensors import layer_name

CONV_SIDES = 2  # side 0 convolves the sublayer's input, side 1 its output
# names of the extra per-slot arrays a DFlash2 draft carries (ForwardResult.extras, check --save-io)
CANDIDATES, LATTICE, CHOSEN = "candidates", "lattice", "chosen"

# (x, weight, storage type) -> x @ weight.T, rounded as the caller's backend rounds a matmul input
MatMul = Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]


@dataclass
class ConvWeights:
    """One dynamic convolution path of one layer."""

    base: torch.Tensor  # [2, K, E] static kernel (F32 in every file)
    proj: torch.Tensor  # [2 * K * E/G, E] kernel projection
    proj_type: str


@dataclass
class Dflash2Weights:
    """Everything DFlash2 adds to the classic graph, decoded."""

    kernel_size: int
    group_size: int
    top_k: int
    attn: list[ConvWeights]
    ffn: list[ConvWeights]
    prev: torch.Tensor  # [V, r] predecessor codebook
    next: torch.Tensor  # [V, r] successor codebook
    hidden: torch.Tensor  # [r, E] selector hidden projection
    hidden_type: str
    logit_scale: float | None = None
    softcap: float | None = None

    def layer(self, il: int, block_len: int, mm: MatMul) -> LayerConvs:
        """Layer ``il``'s two convolutions over rows that are whole blocks of ``block_len`` tokens."""
        return LayerConvs(self, il, block_len, mm)

    def output_transforms(self, logits: torch.Tensor) -> torch.Tensor:
        """ggml_scale by logit_scale, then cap * tanh(x / cap) (before the d2t scatter, as the graph)."""
        if self.logit_scale:
            logits = logits * self.logit_scale
        if self.softcap and self.softcap > 0:
            logits = torch.tanh(logits * (1.0 / self.softcap)) * self.softcap
        return logits

    def select(self, hidden: torch.Tensor, logits: torch.Tensor, anchors: torch.Tensor, mm: MatMul) -> Selection:
        """The lattice and the driver's walk over it for blocks of slots 1..n."""
        A, n, V = logits.shape
        k = self.top_k
        if k > V:
            raise InputFileError(f"selector_top_k {k} exceeds the {V} logits of a slot")
        # ggml_top_k (CPU): std::partial_sort descending, then the first two entries swapped
        cand = top_k_descending(logits, k)
        if k > 1:
            cand[..., [0, 1]] = cand[..., [1, 0]]
        unary = logits.gather(-1, cand)  # [A, n, k]
        gate = mm(hidden.reshape(A * n, -1), self.hidden, self.hidden_type).reshape(A, n, -1)  # [A, n, r]
        succ = self.next[cand]  # [A, n, k, r]
        pred_ids = torch.cat([anchors.reshape(A, 1, 1).expand(A, 1, k), cand[:, :-1]], dim=1)  # [A, n, k]
        cond = self.prev[pred_ids] * gate[:, :, None, :]  # [A, n, k(pred), r]
        lattice = torch.einsum("apjr,apir->apji", cond, succ) + unary[:, :, None, :]  # [A, n, pred j, succ i]
        return walk(cand, lattice)


@dataclass
class Selection:
    """What the driver reads of one or more DFlash2 drafts: [A, n] slots each."""

    candidates: torch.Tensor  # [A, n, k] target ids, in ggml_top_k's order
    lattice: torch.Tensor  # [A, n, k, k] score of (predecessor j, successor i); at slot 1 every j is the anchor
    chosen: torch.Tensor  # [A, n] index of the drafted candidate
    tokens: torch.Tensor  # [A, n] the drafted tokens
    choice: torch.Tensor | None = None  # [A, n, V]: the walked row at the candidates, -inf elsewhere

    def choice_rows(self, vocab_size: int) -> torch.Tensor:
        """Per slot, the scores the driver picked its token by, as a vocabulary row (-inf off the candidates)."""
        if self.choice is None:
            A, n, k = self.candidates.shape
            prev = torch.cat([torch.zeros(A, 1, dtype=torch.int64, device=self.chosen.device), self.chosen[:, :-1]], dim=1)
            rows = self.lattice.gather(2, prev[:, :, None, None].expand(A, n, 1, k))[:, :, 0]  # [A, n, k]
            full = torch.full((A, n, vocab_size), float("-inf"), dtype=rows.dtype, device=rows.device)
            self.choice = full.scatter(-1, self.candidates, rows)
        return self.choice

    def arrays(self, block: int = 0) -> dict[str, torch.Tensor]:
        """Block ``block``'s arrays under their ``ForwardResult.extras`` names."""
        return {CANDIDATES: self.candidates[block], LATTICE: self.lattice[block], CHOSEN: self.chosen[block]}


def top_k_descending(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the ``k`` largest entries of each row, largest first, ties by ascending index:
    the first ``k`` of a stable descending sort of the row, without sorting the whole vocabulary.

    ``torch.topk`` picks the same set unless the k-th value is tied beyond the k (or is NaN), where
    it may keep any of the tied; those rows, rare, take the full stable sort.
    """
    top = torch.topk(logits, k, dim=-1)
    kth = top.values[..., -1:]
    exact = ((logits >= kth).sum(dim=-1) == k) & ~kth[..., 0].isnan()
    # within the exact set, order by value descending and then index ascending, as the stable sort does
    by_index = top.indices.sort(dim=-1).values
    order = logits.gather(-1, by_index).sort(dim=-1, descending=True, stable=True).indices
    cand = by_index.gather(-1, order)
    if not bool(exact.all()):
        full = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]
        cand = torch.where(exact[..., None], cand, full)
    return cand.clone()


def walk(candidates: torch.Tensor, lattice: torch.Tensor) -> Selection:
    """common/speculative.cpp's walk: predecessor 0 at the first slot, then the first maximum of its row."""
    A, n, k = candidates.shape
    pred = torch.zeros(A, dtype=torch.int64, device=candidates.device)
    chosen = []
    for p in range(n):
        row = lattice[torch.arange(A, device=candidates.device), p, pred]  # [A, k]
        pred = row.argmax(dim=-1)  # torch.argmax returns the first maximal index, like std::max_element
        chosen.append(pred)
    idx = torch.stack(chosen, dim=1) if chosen else torch.empty(A, 0, dtype=torch.int64, device=candidates.device)
    return Selection(candidates, lattice, idx, candidates.gather(-1, idx[..., None])[..., 0])


def dynamic_conv(x: torch.Tensor, coeffs: torch.Tensor, base: torch.Tensor, side: int, block_len: int,
                 group_size: int) -> torch.Tensor:
    """build_dflash2_conv: x [rows, E] (whole blocks of ``block_len``), coeffs [rows, 2*K*E/G], base [2, K, E]."""
    rows, E = x.shape
    K = base.shape[1]
    blocks = x.reshape(rows // block_len, block_len, E)
    c = coeffs.reshape(rows, CONV_SIDES, K, E // group_size)[:, side]  # [rows, K, groups]
    weight = (c.repeat_interleave(group_size, dim=-1) + base[side][None]).reshape(rows // block_len, block_len, K, E)
    out = None
    for tap in range(min(K, block_len)):  # taps at or past the block length only read padding
        shifted = blocks if tap == 0 else torch.cat([torch.zeros_like(blocks[:, :tap]), blocks[:, :block_len - tap]], dim=1)
        term = weight[:, :, tap] * shifted
        out = term if out is None else out + term
    assert out is not None
    return out.reshape(rows, E)


class LayerConvs:
    """One layer's convolutions for one batch of blocks (coefficients projected once, reused for the output)."""

    def __init__(self, parts: Dflash2Weights, il: int, block_len: int, mm: MatMul) -> None:
        self.parts, self.il, self.block_len, self.mm = parts, il, block_len, mm
        self._coeffs: dict[str, torch.Tensor] = {}

    def _conv(self, path: str, x: torch.Tensor, side: int) -> torch.Tensor:
        cw = (self.parts.attn if path == "attn" else self.parts.ffn)[self.il]
        if side == 0:
            self._coeffs[path] = self.mm(x, cw.proj, cw.proj_type)
        return dynamic_conv(x, self._coeffs[path], cw.base, side, self.block_len, self.parts.group_size)

    def attn_in(self, h: torch.Tensor) -> torch.Tensor:
        """Convolve the attention sublayer's input (side 0)."""
        return self._conv("attn", h, 0)

    def attn_out(self, o: torch.Tensor) -> torch.Tensor:
        """Convolve the attention sublayer's output (side 1)."""
        return self._conv("attn", o, 1)

    def ffn_in(self, h: torch.Tensor) -> torch.Tensor:
        """Convolve the FFN's input (side 0)."""
        return self._conv("ffn", h, 0)

    def ffn_out(self, y: torch.Tensor) -> torch.Tensor:
        """Convolve the FFN's output (side 1)."""
        return self._conv("ffn", y, 1)


def dflash2_tensor_names(n_layers: int) -> list[str]:
    """Every GGUF tensor DFlash2 adds."""
    per_layer = [layer_name(i, s) for i in range(n_layers) for s in (ATTN_CONV_BASE, ATTN_CONV_PROJ, FFN_CONV_BASE, FFN_CONV_PROJ)]
    return [*per_layer, SELECTOR_PREV, SELECTOR_NEXT, SELECTOR_HIDDEN]


def load_dflash2(d: Drafter, get: Callable[[str], torch.Tensor | None], type_of: Callable[[str], str]) -> Dflash2Weights:
    """DFlash2's tensors of ``d`` through the loader's ``get``, with the shapes llama.cpp's loader demands."""
    if d.conv is None or d.selector is None or not d.conv.kernel_size or not d.conv.group_size or not d.selector.top_k:
        raise InputFileError("a DFlash2 drafter without its conv/selector keys (llama.cpp refuses it: missing conv/selector "
                             "metadata)", d.source)
    K, G, E = d.conv.kernel_size, d.conv.group_size, d.hidden_size
    if E % G:
        raise InputFileError(f"conv_group_size {G} does not divide the hidden size {E}", d.source)

    def need(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        v = get(name)
        if v is None:
            raise InputFileError(f"tensor {name} is missing", d.source)
        if tuple(v.shape) != shape:
            raise InputFileError(f"tensor {name} has shape {list(v.shape)[::-1]} (ggml order), llama.cpp expects "
                                 f"{list(shape)[::-1]}", d.source)
        return v

    def path(i: int, base: str, proj: str) -> ConvWeights:
        return ConvWeights(need(layer_name(i, base), (CONV_SIDES, K, E)),
                           need(layer_name(i, proj), (CONV_SIDES * K * (E // G), E)), type_of(layer_name(i, proj)))

    r = d.selector.rank
    V = d.vocab_size
    return Dflash2Weights(
        kernel_size=K, group_size=G, top_k=d.selector.top_k,
        attn=[path(i, ATTN_CONV_BASE, ATTN_CONV_PROJ) for i in range(d.n_layers)],
        ffn=[path(i, FFN_CONV_BASE, FFN_CONV_PROJ) for i in range(d.n_layers)],
        prev=need(SELECTOR_PREV, (V, r)), next=need(SELECTOR_NEXT, (V, r)), hidden=need(SELECTOR_HIDDEN, (r, E)),
        hidden_type=type_of(SELECTOR_HIDDEN), logit_scale=d.logit_scale or None,
        softcap=d.final_logit_softcapping or None)


__all__ = ["CANDIDATES", "CHOSEN", "LATTICE", "ConvWeights", "Dflash2Weights", "LayerConvs", "Selection",
           "dflash2_tensor_names", "dynamic_conv", "load_dflash2", "top_k_descending", "walk"]
