"""A drafter's tensors as torch values on one device, laid out the way the dflash graph uses them.

The runner's only way to weights, from a GGUF or a checkpoint alike; embedding and head fall back to
the target as llama.cpp's do. Refuses missing tensors, tensors of other graphs and a target of the
wrong width. Spec: docs/runtime.md, "The weights".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from ..drafter import Drafter
from ..errors import DFlashError, InputFileError
from ..format.family import DFLASH2, MARKOV_TENSORS, member_of
from ..format.ggml import GGMLType
from ..format.rules import (
    D2T_TENSOR,
    EMBEDDING_TENSOR,
    FC_TENSOR,
    HEAD_GLOBAL,
    HEAD_PER_LAYER,
    OPTIONAL_GLOBAL,
    OPTIONAL_PER_LAYER,
    OUTPUT_TENSOR,
    WEIGHT_SUFFIX,
)
from ..format.tensors import GLOBAL_TENSORS, HIDDEN_NORM_HF, LAYER_ROLES_HF, LAYER_TENSORS, OUTPUT_NORM_HF, SINK_HF, generic_name, layer_name
from ..sources.target import target_tensors
from ..target import Target
from ..tensor_source import TensorSource, n_rows
from .dequant import dequantize
from .dflash2 import Dflash2Weights, dflash2_tensor_names, load_dflash2
from .dspark import MarkovHead, markov_head

SCALE_SUFFIX = ".scale"  # per-tensor scale of a matrix (llama.cpp's generic "<name>.scale" pass)
HEAD_CACHE_BYTES = 2 << 30  # dequantize a head once when its values fit in this many bytes
HEAD_CHUNK_ROWS = 16384  # rows per chunk when a head is streamed


def _named(table: tuple[str, ...], stem: str) -> str:
    """The entry of a format table whose name is ``stem`` + ``.``something: the table spells it."""
    hits = [n for n in table if n.split(".", 1)[0] == stem]
    if len(hits) != 1:
        raise AssertionError(f"format table has {len(hits)} entries for {stem!r}")
    return hits[0]


def scale_name(weight_name: str) -> str:
    """The name of the optional per-tensor scale of a ``.weight`` matrix (``fc.scale`` for fc)."""
    return weight_name[: -len(WEIGHT_SUFFIX)] + SCALE_SUFFIX


ENC_NORM_TENSOR = GLOBAL_TENSORS[HIDDEN_NORM_HF]
OUTPUT_NORM_TENSOR = GLOBAL_TENSORS[OUTPUT_NORM_HF]
ROPE_FREQS_TENSOR = _named(OPTIONAL_GLOBAL, "rope_freqs")

# role -> per-layer GGUF suffix, spelled by the format tables (HF suffixes on the left)
LAYER_ROLES: dict[str, str] = {
    **{role: LAYER_TENSORS[hf] for role, hf in LAYER_ROLES_HF.items()},
    "sinks": LAYER_TENSORS[SINK_HF[0]],
    "post_attn_norm": _named(OPTIONAL_PER_LAYER, "post_attention_norm"),
    "post_ffw_norm": _named(OPTIONAL_PER_LAYER, "post_ffw_norm"),
    "out_scale": _named(OPTIONAL_PER_LAYER, "layer_output_scale"),
}
REQUIRED_ROLES = ("attn_norm", "wq", "wk", "wo", "q_norm", "k_norm", "ffn_norm", "gate", "up", "down")
# matrices llama.cpp multiplies by an optional per-tensor scale (build_lora_mm's w_s)
SCALED_ROLES = ("wq", "wk", "wv", "wo", "gate", "up", "down")


def source_values(source: TensorSource, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                  rows: tuple[int, int] | None = None) -> torch.Tensor:
    """A GGUF or safetensors tensor source's values (all rows, or rows [a, b)) decoded on ``device``; integers as int64."""
    a, b = rows if rows is not None else (0, n_rows(tuple(source.shape)))
    try:
        gtype = GGMLType[source.dtype]
    except KeyError:
        raise InputFileError(f"cannot run a tensor of type {source.dtype}") from None
    raw = np.ascontiguousarray(source.rows(a, b)).view(np.uint8)
    shape = tuple(source.shape)
    if rows is not None and len(shape) > 1:  # a 3-D tensor (DFlash2's conv base) is read whole
        shape = (b - a, *shape[1:])
    out = dequantize(torch.from_numpy(_writable(raw)).to(device), int(gtype), shape, dtype=dtype)
    return out if out.dtype == torch.int64 else out.to(dtype)


def _writable(raw: np.ndarray) -> np.ndarray:
    """``raw`` itself where torch may wrap it (the readers' own fresh buffers), else a copy."""
    return raw if raw.flags.writeable else raw.copy()


class _Decoded:
    """The TensorSource face of values that are already in memory: shape only, never read."""

    def __init__(self, shape: tuple[int, ...], dtype: str = "F32") -> None:
        self.shape = shape
        self.dtype = dtype  # the storage type the values came from (the CPU matmul rounds by it)

    def rows(self, a: int, b: int, fds: object = None) -> np.ndarray:
        raise AssertionError("decoded values are never read back as raw words")


# storage types a weight matrix keeps as a torch dtype under ``load_weights(stored=True)``
STORED_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class FileMatrix:
    """A quantized weight matrix left in its file: decoded at each matmul, never kept (``load_weights(stored=True)``)."""

    def __init__(self, source: TensorSource, device: torch.device) -> None:
        self.source, self.device = source, device

    @property
    def shape(self) -> torch.Size:
        """The matrix's shape."""
        return torch.Size(self.source.shape)

    def values(self, dtype: torch.dtype) -> torch.Tensor:
        """Every value, decoded now in ``dtype``."""
        return source_values(self.source, self.device, dtype)


def matmul_values(w: torch.Tensor | FileMatrix, dtype: torch.dtype) -> torch.Tensor:
    """A weight as a matmul in ``dtype`` reads it: stored-precision values widened (exactly), a FileMatrix decoded."""
    if isinstance(w, FileMatrix):
        return w.values(dtype)
    return w if w.dtype == dtype else w.to(dtype)


class LazyMatrix:
    """A [rows, cols] matrix (an embedding or an output head) decoded only as far as it is used."""

    def __init__(self, source: TensorSource, device: torch.device | str, dtype: torch.dtype, what: str,
                 keep: bool = True) -> None:
        if len(source.shape) != 2:
            raise InputFileError(f"{what} has shape {list(source.shape)}, expected 2 dimensions")
        self.source, self.device, self.dtype, self.what = source, torch.device(device), dtype, what
        self.keep = keep  # False: always streamed in row chunks
        self._full: torch.Tensor | None = None

    @classmethod
    def of(cls, values: torch.Tensor, what: str, storage_type: str = "F32") -> LazyMatrix:
        """A matrix whose values are already decoded, ``storage_type`` the ggml type they came from."""
        m = cls(_Decoded(tuple(values.shape), storage_type), values.device, values.dtype, what)
        m._full = values
        return m

    @property
    def shape(self) -> tuple[int, int]:
        """The matrix's shape."""
        return tuple(self.source.shape)  # type: ignore[return-value]

    def full(self) -> torch.Tensor:
        """Every row, decoded once and kept."""
        if self._full is None:
            self._full = source_values(self.source, self.device, self.dtype)
        return self._full

    def row_range(self, a: int, b: int) -> torch.Tensor:
        """Rows [a, b), from the kept values when there are, else decoded from the file."""
        if not self.streams():
            return self.full()[a:b]
        return source_values(self.source, self.device, self.dtype, rows=(a, b))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (any shape of int64), read from the file one distinct row at a time."""
        if self._full is not None:
            return self._full[ids.to(self.device)]
        flat = ids.reshape(-1).tolist()
        bad = [i for i in flat if not 0 <= i < self.shape[0]]
        if bad:
            raise DFlashError(f"token id {bad[0]} is outside the {self.what}'s {self.shape[0]} rows")
        got = {i: source_values(self.source, self.device, self.dtype, rows=(i, i + 1))[0] for i in dict.fromkeys(flat)}
        return torch.stack([got[i] for i in flat]).reshape(*ids.shape, self.shape[1])

    def streams(self) -> bool:
        """Whether ``project`` reads M from its file in HEAD_CHUNK_ROWS chunks (M not kept decoded)."""
        n, cols = self.shape
        return self._full is None and not (self.keep and n * cols * self.dtype.itemsize <= HEAD_CACHE_BYTES)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x @ M.T: all of M at once when it fits HEAD_CACHE_BYTES, else streamed in row chunks."""
        if not self.streams():
            return x @ self.full().T
        return torch.cat([part for _, part in self._products(x)], dim=-1)

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """[R] per row of ``x``, the row of M with the largest logit (the first of equals, NaN above all, as
        ``project(x).argmax(-1)``), a chunk of M at a time: never all R x rows logits at once."""
        best_v = best_i = None
        for a, part in self._products(x, always_chunked=True):
            v, i = part.max(dim=-1)
            if best_v is None:
                best_v, best_i = v, i
                continue
            later = (v > best_v) | (v.isnan() & ~best_v.isnan())  # an equal value later loses, as argmax's
            best_v, best_i = torch.where(later, v, best_v), torch.where(later, i + a, best_i)
        assert best_i is not None, "a matrix has rows"
        return best_i

    def _products(self, x: torch.Tensor, always_chunked: bool = False) -> Iterator[tuple[int, torch.Tensor]]:
        """(a, x @ M[a:a + HEAD_CHUNK_ROWS].T) over M's row chunks: the kept values' slices, or rows decoded now."""
        n, cols = self.shape
        if not self.streams():
            full = self.full()
            if not always_chunked:
                yield 0, x @ full.T
                return
            for a in range(0, n, HEAD_CHUNK_ROWS):
                yield a, x @ full[a:a + HEAD_CHUNK_ROWS].T
            return
        words = STORED_DTYPES.get(self.source.dtype)
        if words is None or self.device.type != "cpu":
            for a in range(0, n, HEAD_CHUNK_ROWS):
                yield a, x @ source_values(self.source, self.device, self.dtype, rows=(a, min(n, a + HEAD_CHUNK_ROWS))).T
            return
        # float rows are widened into one buffer for the whole pass: a fresh chunk per product costs a page
        # fault for every 4 KiB of the head, at each pass
        chunk = torch.empty(min(n, HEAD_CHUNK_ROWS), cols, dtype=self.dtype)
        for a in range(0, n, HEAD_CHUNK_ROWS):
            b = min(n, a + HEAD_CHUNK_ROWS)
            raw = torch.from_numpy(_writable(np.ascontiguousarray(self.source.rows(a, b))))
            chunk[:b - a].copy_(raw.view(words).reshape(b - a, cols))  # exact: a widening
            yield a, x @ chunk[:b - a].T


@dataclass
class LayerWeights:
    """One draft layer; None for the optional tensors the file does not have."""

    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor | None  # None: shared KV (V is the weightless-normed K projection)
    wo: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    ffn_norm: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    sinks: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None
    post_ffw_norm: torch.Tensor | None = None
    out_scale: torch.Tensor | None = None
    scales: dict[str, torch.Tensor] = field(default_factory=dict)  # role -> per-tensor scale {1}
    types: dict[str, str] = field(default_factory=dict)  # role -> storage type name (ggml or safetensors)


@dataclass
class DrafterWeights:
    """Everything the dflash graph reads, on one device in one compute dtype."""

    device: torch.device
    dtype: torch.dtype
    fc: torch.Tensor | FileMatrix  # [E, T*E]
    fc_scale: torch.Tensor | None
    fc_type: str  # storage type of fc (the CPU matmul rounds its input to match)
    enc_norm: torch.Tensor
    output_norm: torch.Tensor
    layers: list[LayerWeights]
    embed: LazyMatrix  # [V, E]: the draft's token_embd or the target's
    head: LazyMatrix  # [Vd, E]: the draft's output, its token_embd (tied) or the target's head
    d2t: torch.Tensor | None  # [Vd] absolute target ids (int64)
    rope_freqs: torch.Tensor | None  # [D/2] frequency divisors (NeoX path only)
    attention_scale: float | None  # attention.scale; None/0 -> 1/sqrt(head_dim)
    markov: MarkovHead | None = None  # DSpark's Markov and confidence heads (runtime.dspark)
    dflash2: Dflash2Weights | None = None  # a DFlash2 drafter's convolutions and selector (runtime.dflash2)
    embed_from: str = "drafter"  # "drafter" or "target", for messages
    head_from: str = "drafter"  # "drafter", "drafter (tied to token_embd)" or "target"
    # every tensor decoded while loading, by GGUF name: check compares these with the checkpoint
    decoded: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)


def target_weights(t: Target, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                   keep: bool = True) -> tuple[LazyMatrix, LazyMatrix]:
    """(embedding, head) of a target GGUF or target directory; without a head of its own, the embedding twice."""
    w = target_tensors(t) or {}
    if "embed" not in w:
        raise InputFileError("has no token embedding to read (a target directory needs its safetensors)", t.source)
    embed = LazyMatrix(w["embed"], device, dtype, "target token embedding", keep)
    if "head" in w:
        return embed, LazyMatrix(w["head"], device, dtype, "target output head", keep)
    if not t.ties_embeddings:
        raise InputFileError("has no output head and does not tie it to the embedding", t.source)
    return embed, embed


def _reject_other_members(d: Drafter) -> None:
    """Refuse drafters whose tensors belong to another graph (DeepSeek-V4 shares the arch): never guess."""
    names = {t.gguf_name for t in d.tensors}
    if member_of(names) == DFLASH2:
        names -= set(dflash2_tensor_names(d.n_layers))
    other = sorted(n for n in names if (n in HEAD_GLOBAL and n not in MARKOV_TENSORS) or generic_name(n) in HEAD_PER_LAYER)
    if other:
        raise DFlashError(f"this drafter has {other[0]}: not a head this runner runs (classic DFlash, DSpark, DFlash2)",
                          d.source)
    known_layer = set(LAYER_ROLES.values()) | {scale_name(LAYER_ROLES[r]) for r in SCALED_ROLES}
    known_global = {FC_TENSOR, scale_name(FC_TENSOR), ENC_NORM_TENSOR, OUTPUT_NORM_TENSOR, EMBEDDING_TENSOR,
                    OUTPUT_TENSOR, D2T_TENSOR, ROPE_FREQS_TENSOR, *MARKOV_TENSORS}
    unknown = sorted(n for n in names if n not in known_global and generic_name(n) not in known_layer)
    if unknown:
        raise DFlashError(f"tensor {unknown[0]} is not part of the classic dflash graph; cannot run this drafter", d.source)


def load_weights(d: Drafter, target: Target | None = None, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, stored: bool = False) -> DrafterWeights:
    """Every tensor of ``d`` decoded on ``device``; the target supplies an embedding or head the drafter lacks.

    ``stored``: matrices stay as stored (quantized ones in the file) and are decoded at each matmul."""
    _reject_other_members(d)
    device = torch.device(device)
    by = {t.gguf_name: t for t in d.tensors}
    decoded: dict[str, torch.Tensor] = {}

    def get(name: str) -> torch.Tensor | None:
        t = by.get(name)
        if t is None:
            return None
        v = decoded[name] = source_values(t.source, device, dtype)
        return v

    def matrix(name: str) -> torch.Tensor | FileMatrix | None:
        t = by.get(name)
        if not stored or t is None or len(t.shape) < 2:
            return get(name)
        if t.dtype not in STORED_DTYPES:
            return FileMatrix(t.source, device)
        v = decoded[name] = source_values(t.source, device, STORED_DTYPES[t.dtype])
        return v

    def need(name: str) -> torch.Tensor:
        v = get(name)
        if v is None:
            raise InputFileError(f"tensor {name} is missing", d.source)
        return v

    layers = []
    for i in range(d.n_layers):
        vals = {role: (matrix if role in SCALED_ROLES else get)(layer_name(i, suffix)) for role, suffix in LAYER_ROLES.items()}
        missing = [layer_name(i, LAYER_ROLES[r]) for r in REQUIRED_ROLES if vals[r] is None]
        if missing:
            raise InputFileError(f"tensor {missing[0]} is missing", d.source)
        scales = {r: s for r in SCALED_ROLES if (s := get(scale_name(layer_name(i, LAYER_ROLES[r])))) is not None}
        types = {r: by[layer_name(i, LAYER_ROLES[r])].dtype for r in SCALED_ROLES if layer_name(i, LAYER_ROLES[r]) in by}
        layers.append(LayerWeights(**vals, scales=scales, types=types))  # type: ignore[arg-type]

    tgt: tuple[LazyMatrix, LazyMatrix] | None = None

    def from_target() -> tuple[LazyMatrix, LazyMatrix]:
        nonlocal tgt
        if tgt is None:
            if target is None:
                raise DFlashError("the drafter has no token embedding or no output head of its own: pass the target "
                                  "(its GGUF or its directory with safetensors) to run it", d.source)
            tgt = target_weights(target, device, dtype, keep=not stored)
        return tgt

    emb_t, out_t = by.get(EMBEDDING_TENSOR), by.get(OUTPUT_TENSOR)
    if emb_t is not None:
        embed, embed_from = LazyMatrix(emb_t.source, device, dtype, "drafter token embedding", not stored), "drafter"
    else:
        embed, embed_from = from_target()[0], "target"
    if out_t is not None:
        head, head_from = LazyMatrix(out_t.source, device, dtype, "drafter output head", not stored), "drafter"
    elif emb_t is not None:
        head, head_from = embed, "drafter (tied to token_embd)"
    else:
        head, head_from = from_target()[1], "target"

    if embed.shape[1] != d.hidden_size or head.shape[1] != d.hidden_size:
        raise InputFileError(f"embedding/head width {embed.shape[1]}/{head.shape[1]} differs from the hidden size "
                             f"{d.hidden_size}: wrong target?", d.source)
    d2t = get(D2T_TENSOR)
    if d2t is not None:
        d2t = d2t.to(torch.int64)
        if d2t.shape[0] != head.shape[0]:
            raise InputFileError(f"d2t has {d2t.shape[0]} entries but the output head has {head.shape[0]} rows", d.source)
    elif head.shape[0] != d.vocab_size:
        raise InputFileError(f"the output head has {head.shape[0]} rows but the vocabulary has {d.vocab_size} tokens "
                             "(and there is no d2t)", d.source)
    markov = markov_head(d, {n: v for n in MARKOV_TENSORS if (v := get(n)) is not None},
                         {n: by[n].dtype for n in MARKOV_TENSORS if n in by})
    dflash2 = None
    if member_of(set(by)) == DFLASH2:
        dflash2 = load_dflash2(d, get, lambda name: by[name].dtype)
    fc = matrix(FC_TENSOR) if FC_TENSOR in by else need(FC_TENSOR)
    return DrafterWeights(
        device=device, dtype=dtype, dflash2=dflash2, fc=fc, fc_scale=get(scale_name(FC_TENSOR)), fc_type=by[FC_TENSOR].dtype,
        enc_norm=need(ENC_NORM_TENSOR), output_norm=need(OUTPUT_NORM_TENSOR), layers=layers,
        embed=embed, head=head, d2t=d2t, rope_freqs=get(ROPE_FREQS_TENSOR),
        attention_scale=d.attention_scale if d.attention_scale else None,
        embed_from=embed_from, head_from=head_from, decoded=decoded, markov=markov,
    )


def describe_weights(w: DrafterWeights) -> dict[str, str]:
    """Where the embedding and head came from, for reports."""
    return {"embedding": w.embed_from, "head": w.head_from, "device": str(w.device), "dtype": str(w.dtype).split(".")[-1]}


__all__ = ["DrafterWeights", "FileMatrix", "LayerWeights", "LazyMatrix", "describe_weights", "load_weights", "matmul_values",
           "source_values", "target_weights"]
