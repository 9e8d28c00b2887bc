"""Choosing a drafter's quantization by acceptance: the smallest mix that keeps a given fraction of
the full-precision file's accepted tokens, measured without writing a file.

Specification (the groups, the calibration score, the cost bounds, the keys written):
docs/quantize.md, "Choosing by acceptance".
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from .drafter import Drafter
from .encoders import QUANTIZERS, encoder, takes_importance
from .errors import DFlashError
from .files import os_reason
from .format.file_types import FILE_TYPES
from .format.ggml import FLOAT_TYPE_NAMES, GGMLType, tensor_nbytes
from .format.quant_types import (
    GLOBAL_GROUPS,
    LAYER_GROUPS,
    RAISE_LADDER,
    TypeOverrides,
    not_quantized_reason,
    raise_ladder,
    raised_type,
)
from .format.rules import EMBEDDING_TENSOR, FC_TENSOR, OUTPUT_TENSOR
from .format.tensors import layer_name
from .pipeline import return_free_memory
from .plan import PlannedTensor, QuantizeOptions, parse_ftype, plan_tensor, quantize_planned
from .runtime.accept import (
    LoopCount,
    anchor_drafts,
    block_graph,
    block_layer,
    block_rows,
    context_input,
    context_kv,
    expected_lengths,
    live_loop,
    sequence_inputs,
)
from .runtime.dequant import dequantize
from .runtime.forward import rms_norm
from .runtime.weights import LAYER_ROLES, DrafterWeights, LayerWeights, LazyMatrix, load_weights, source_values
from .sources.features import FeaturesFile
from .sources.gguf_drafter import read_drafter
from .sources.imatrix import ImportanceMatrix
from .target import Target
from .tensor_source import n_rows

ANCHOR_STRIDE = 2  # every second anchor of the calibration half scores a mix (bounds the search's cost)
CALIBRATION_ANCHORS = 64  # and at most this many of them, evenly spaced: a step's cost whatever the capture's size
SOFT_BATCH = 32  # anchors per pass when scoring layer by layer (8 per pass where every slot's logits are held)
QUANT_ROLES = ("wq", "wk", "wv", "wo", "gate", "up", "down")  # per-layer matrices a mix assigns types to
Types = dict[str, GGMLType]  # GGUF tensor name -> ggml type, for the quantized tensors of a mix


# --- the mix llama-quantize would write, and the flags that reproduce a mix


def mix_plan(d: Drafter, ftype: str, tensor_types: tuple[tuple[str, GGMLType], ...] = (),
             imatrix: ImportanceMatrix | None = None) -> list[PlannedTensor]:
    """llama-quantize's plan for ``ftype`` with these --tensor-type items (and --imatrix: its mix rules)."""
    source = [plan_tensor(t, GGMLType[t.dtype], copy=True) for t in d.tensors]
    options = QuantizeOptions(types=TypeOverrides(tensor_types=tensor_types), imatrix=imatrix)
    planned, _ = quantize_planned(source, d, FILE_TYPES[parse_ftype(ftype)], where=Path(str(d.source)), options=options)
    return planned


def quantized_types(planned: list[PlannedTensor], d: Drafter) -> Types:
    """The tensors a mix quantizes, with their types (the others keep their type whatever the mix)."""
    return {p.tensor.gguf_name: p.ggml_type for p in planned if not_quantized_reason(p.tensor.gguf_name, p.ne) is None}


def total_bytes(planned: list[PlannedTensor]) -> int:
    """The summed size in bytes of the planned tensors."""
    return sum(p.nbytes for p in planned)


def recipe(d: Drafter, ftype: str, desired: Types, imatrix: ImportanceMatrix | None = None) -> list[tuple[str, GGMLType]]:
    """--tensor-type items under which llama-quantize's ``ftype`` mix gives every tensor its ``desired`` type (iterated: a pin moves the counters)."""
    pinned: Types = {}
    for _ in range(len(desired) + 1):
        items = _pin_items(pinned)
        got = {p.tensor.gguf_name: p.ggml_type for p in mix_plan(d, ftype, tuple(items), imatrix)}
        off = [n for n, t in desired.items() if got[n] != t]
        if not off:
            return items
        pinned.update({n: desired[n] for n in off})
    raise AssertionError("the recipe did not converge")  # each round pins more names: unreachable


def _pin_items(pinned: Types) -> list[tuple[str, GGMLType]]:
    """Exact-name patterns for ``pinned``, a layer's tensors of one type in one alternation, in layer order."""
    out: list[tuple[str, GGMLType]] = []
    layered: dict[tuple[int, str], list[str]] = {}
    for name in sorted(pinned):
        m = _LAYER_WEIGHT.fullmatch(name)
        if m is None:
            out.append((re.escape(name), pinned[name]))
        else:
            layered.setdefault((int(m.group(1)), pinned[name].name), []).append(m.group(2))
    for (layer, type_name), stems in sorted(layered.items()):
        body = re.escape(stems[0]) if len(stems) == 1 else "(" + "|".join(re.escape(s) for s in stems) + ")"
        out.append((rf"blk\.{layer}\.{body}\.weight", GGMLType[type_name]))
    return out


_LAYER_WEIGHT = re.compile(r"blk\.(\d+)\.(.+)\.weight")


def recipe_args(items: list[tuple[str, GGMLType]]) -> list[str]:
    """The items as llama-quantize arguments: ``--tensor-type PATTERN=type`` each."""
    out: list[str] = []
    for pattern, t in items:
        out += ["--tensor-type", f"{pattern}={t.name.lower()}"]
    return out


# --- measuring a mix


class SpilledBytes:
    """Byte arrays kept in an unnamed temporary file (gone with the process), read back on each ``get``.

    The search keeps every (tensor, type) it quantized, about 1.5 GB on a full-size drafter after two
    steps; in a file they take no memory while a mix is held decoded (its peak).
    """

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="dflash-convert-search-")
        self._spans: dict[object, tuple[int, int]] = {}
        self._end = 0

    def put(self, key: object, data: np.ndarray) -> None:
        """Append ``data``'s bytes under ``key``."""
        view = memoryview(np.ascontiguousarray(data).view(np.uint8).reshape(-1))
        fd, at = self._file.fileno(), self._end
        try:
            while view:
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n
        except OSError as e:  # a full $TMPDIR is not the output's fault: say where the bytes were going
            raise DFlashError(f"the search's temporary file: {os_reason(e)} (it holds every quantized candidate, "
                              "about 1.5 GB for a full-size drafter; set TMPDIR to a disk with room)",
                              tempfile.gettempdir()) from None
        self._spans[key], self._end = (self._end, at - self._end), at

    def get(self, key: object) -> np.ndarray | None:
        """A fresh uint8 array of ``key``'s bytes; None when none were put."""
        span = self._spans.get(key)
        if span is None:
            return None
        out = np.empty(span[1], dtype=np.uint8)
        view, at = memoryview(out), span[0]
        while view:
            n = os.preadv(self._file.fileno(), [view], at)
            if n <= 0:
                raise OSError(f"the search's temporary file ended at byte {at}")
            view, at = view[n:], at + n
        return out


class MixEvaluator:
    """Acceptance of any type assignment of one unquantized drafter file, without writing files."""

    def __init__(self, d: Drafter, target: Target | None, feats: FeaturesFile, n_max: int, *,
                 device: torch.device | str = "cpu", like_cpu: bool = True, imatrix: ImportanceMatrix | None = None,
                 calibration_anchors: int = CALIBRATION_ANCHORS) -> None:
        for t in d.tensors:
            if not_quantized_reason(t.gguf_name, tuple(reversed(t.shape))) is None and t.dtype not in FLOAT_TYPE_NAMES:
                raise DFlashError(f"tensor {t.gguf_name} is {t.dtype}: the search starts from an F32, F16 or BF16 file",
                                  d.source)
        self.slots = feats.check_drafter(d, d.source, n_max)
        self.d, self.feats, self.n_max, self.like_cpu, self.imatrix = d, feats, n_max, like_cpu, imatrix
        self.calibration_anchors = calibration_anchors
        # stored: the quantizable matrices stay in their file (never decoded here); each evaluation decodes its own
        base = load_weights(d, target, device=device, stored=True)
        base.decoded.clear()
        self.by = {t.gguf_name: t for t in d.tensors}
        empty = torch.empty(0)
        base.layers = [replace(lw, **{r: empty for r in QUANT_ROLES if getattr(lw, r) is not None}) for lw in base.layers]
        self.base = replace(base, fc=empty)
        for m in (base.embed, base.head):
            m.keep = True  # the embedding and head as an unstored load keeps them (decoded once where they fit)
        self._tied = base.head is base.embed
        self._encoded = SpilledBytes()  # (tensor name, type) -> its quantized bytes, off the heap
        self._inputs: dict[tuple[int, GGMLType | None], torch.Tensor] = {}  # (sequence, fc's type) -> context rows
        self._ctx: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._prefix: dict[tuple, tuple[Types, list]] = {}  # a scored mix's layer inputs, to start candidates from
        self._results: dict[tuple, LoopCount | float] = {}
        self.evaluations = 0
        self.quantized = 0

    def source_types(self, names: list[str]) -> Types:
        """The file's own types: the full-precision baseline."""
        return {n: GGMLType[self.by[n].dtype] for n in names}

    def values(self, name: str, t: GGMLType) -> torch.Tensor:
        """The values llama.cpp computes with when ``name`` is stored as ``t``: quantized once (bytes kept), decoded now."""
        src = self.by[name]
        dev, dt = self.base.device, self.base.dtype
        if t.name == src.dtype:
            return source_values(src.source, dev, dt)
        key = (name, t)
        enc = self._encoded.get(key)
        if enc is None:
            enc = self._encode(name, t)
            self._encoded.put(key, enc)
            self.quantized += 1
        return dequantize(torch.from_numpy(enc).to(dev), int(t), tuple(src.shape), dtype=dt).to(dt)

    def _encode(self, name: str, t: GGMLType) -> np.ndarray:
        """``name`` quantized to ``t`` as its block bytes: row ranges on torch's threads (the encoders drop the GIL)."""
        src, enc = self.by[name], self._encoder(name, t)
        rows, align = n_rows(tuple(src.shape)), getattr(src.source, "row_align", 1)
        step = -(-rows // max(1, torch.get_num_threads()))
        step = -(-step // align) * align
        spans = [(a, min(rows, a + step)) for a in range(0, rows, step)] or [(0, 0)]

        def part(span: tuple[int, int]) -> np.ndarray:
            return np.ascontiguousarray(enc(src.source.rows(*span))).view(np.uint8).reshape(-1)

        if len(spans) == 1:
            return part(spans[0])
        with ThreadPoolExecutor(max_workers=len(spans), thread_name_prefix="encode") as pool:
            return np.concatenate(list(pool.map(part, spans)))

    def _encoder(self, name: str, t: GGMLType) -> Callable[[np.ndarray], np.ndarray]:
        """``name``'s encoder to ``t``, with its importance as quantize --imatrix passes it (plan.quantize_planned)."""
        ne = tuple(reversed(self.by[name].shape))
        importance = None if self.imatrix is None or not takes_importance(t) else self.imatrix.for_tensor(name, ne)
        return encoder(self.by[name].dtype, t, row_length=ne[0], importance=importance)

    def ladder(self, name: str) -> tuple[GGMLType, ...]:
        """The types ``name`` is raised through: with an imatrix entry for it, the imatrix-only types too."""
        if self.imatrix is None or self.imatrix.for_tensor(name, tuple(reversed(self.by[name].shape))) is None:
            return RAISE_LADDER
        return raise_ladder(QUANTIZERS)

    def retain(self, *states: Types) -> None:
        """Forget the contexts and scored layer inputs no state in ``states`` uses (the quantized bytes stay)."""
        keys = {self._ctx_key(s, -1, il)[1:] for s in states for il in range(self.d.n_layers)}
        self._ctx = {k: v for k, v in self._ctx.items() if k[1:] in keys}
        fcs = {s.get(FC_TENSOR) for s in states}
        self._inputs = {k: v for k, v in self._inputs.items() if k[1] in fcs}
        kept = [_types_key(s) for s in states]
        self._prefix = {k: v for k, v in self._prefix.items() if k[0] in kept}
        return_free_memory()

    def _ctx_key(self, types: Types, seq: int, il: int) -> tuple:
        return (seq, il, types.get(FC_TENSOR), types.get(layer_name(il, LAYER_ROLES["wk"])),
                types.get(layer_name(il, LAYER_ROLES["wv"])))

    def _layer(self, types: Types, il: int) -> LayerWeights:
        """Layer ``il``'s weights with each of its tensors in ``types`` as that type stores it."""
        lw = self.base.layers[il]
        changes: dict[str, torch.Tensor] = {}
        stored = dict(lw.types)
        for role in QUANT_ROLES:
            name = layer_name(il, LAYER_ROLES[role])
            if name in types:
                changes[role], stored[role] = self.values(name, types[name]), types[name].name
            elif getattr(lw, role) is not None and name in self.by:
                changes[role] = source_values(self.by[name].source, self.base.device, self.base.dtype)
        return replace(lw, **changes, types=stored)

    def weights(self, types: Types, layers: bool = True) -> DrafterWeights:
        """The drafter's weights with each tensor of ``types`` as that type stores it (``layers``: False leaves them empty)."""
        out = replace(self.base, layers=[self._layer(types, il) for il in range(self.d.n_layers)] if layers
                      else list(self.base.layers))
        if layers:  # without the layers, fc is decoded only where a context is missing (_context)
            out.fc, out.fc_type = self._fc(types)
        if EMBEDDING_TENSOR in types and out.embed_from == "drafter":
            t = types[EMBEDDING_TENSOR]
            out.embed = LazyMatrix.of(self.values(EMBEDDING_TENSOR, t), "drafter token embedding", t.name)
            if self._tied:
                out.head = out.embed
        if OUTPUT_TENSOR in types:
            t = types[OUTPUT_TENSOR]
            out.head = LazyMatrix.of(self.values(OUTPUT_TENSOR, t), "drafter output head", t.name)
        return out

    def _fc(self, types: Types) -> tuple[torch.Tensor, str]:
        """fc's values and storage type in ``types`` (the file's own where ``types`` leaves it out)."""
        if FC_TENSOR in types:
            return self.values(FC_TENSOR, types[FC_TENSOR]), types[FC_TENSOR].name
        return source_values(self.by[FC_TENSOR].source, self.base.device, self.base.dtype), self.base.fc_type

    def _context(self, types: Types, w: DrafterWeights, seq: int, features: torch.Tensor, il: int,
                 lw: LayerWeights) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence ``seq``'s context K/V at layer ``il``: kept per types of fc and that layer's K and V projections."""
        key = self._ctx_key(types, seq, il)
        got = self._ctx.get(key)
        if got is None:
            ik = (seq, types.get(FC_TENSOR))
            g = self._inputs.get(ik)
            if g is None:
                if not w.fc.numel():
                    fc, fc_type = self._fc(types)
                    w = replace(w, fc=fc, fc_type=fc_type)
                g = self._inputs[ik] = context_input(self.d, w, features, self.like_cpu)
            got = self._ctx[key] = context_kv(self.d, w, features, cpu_matmul=self.like_cpu, layers=[il], g=g,
                                              layer_weights={il: lw})[il]  # type: ignore[assignment]
        return got

    def _context_of(self, types: Types, w: DrafterWeights) -> Callable[[int, torch.Tensor], list]:
        def context_of(seq: int, features: torch.Tensor) -> list:
            return [self._context(types, w, seq, features, il, lw) for il, lw in enumerate(w.layers)]

        return context_of

    def accept(self, types: Types, indices: list[int]) -> LoopCount:
        """The live loop's count over sequences ``indices`` with the tensors stored as ``types``."""
        memo = ("loop", _types_key(types), tuple(indices))
        if memo in self._results:
            return self._results[memo]  # type: ignore[return-value]
        w = self.weights(types)
        self.evaluations += 1
        count = live_loop(self.d, w, self.feats, self.slots, self.n_max, like_cpu=self.like_cpu, indices=indices,
                          context_of=self._context_of(types, w))
        self._results[memo] = count
        return count

    @torch.no_grad()
    def expected_length(self, types: Types, indices: list[int], stride: int = ANCHOR_STRIDE) -> float:
        """The search's calibration score: the expected accepted length over every ``stride``-th anchor
        (docs/quantize.md, "Choosing by acceptance")."""
        memo = ("soft", _types_key(types), tuple(indices), stride)
        if memo in self._results:
            return self._results[memo]  # type: ignore[return-value]
        if self.base.markov is not None or self.base.dflash2 is not None:
            score = self._soft_by_blocks(types, indices, stride)
        else:
            score = self._soft_by_layers(types, indices, stride)
        self.evaluations += 1
        self._results[memo] = score
        return score

    def scored_anchors(self, indices: list[int], stride: int = ANCHOR_STRIDE) -> list[list[int]]:
        """Each sequence of ``indices``'s anchors the score drafts: every ``stride``-th one with ``n_max`` tokens
        after it, and of those at most ``calibration_anchors``, evenly spaced through them all."""
        seqs = [self.feats.sequences[i] for i in indices]
        out = [list(range(s.prompt_length - 1, s.length - 1 - self.n_max, stride)) for s in seqs]
        pairs = [(j, c) for j, anchors in enumerate(out) for c in anchors]
        if len(pairs) <= self.calibration_anchors:
            return out
        kept = {pairs[k * len(pairs) // self.calibration_anchors] for k in range(self.calibration_anchors)}
        return [[c for c in anchors if (j, c) in kept] for j, anchors in enumerate(out)]

    def _soft_anchors(self, indices: list[int], stride: int) -> list[tuple[int, torch.Tensor, torch.Tensor, list[int]]]:
        """(sequence, its features, its token ids, its scored anchors) for each sequence of ``indices``."""
        out = []
        for i, anchors in zip(indices, self.scored_anchors(indices, stride), strict=True):
            features, tokens, _ = sequence_inputs(self.feats, i, self.slots)
            out.append((i, features, torch.tensor(tokens), anchors))
        return out

    def _soft_by_layers(self, types: Types, indices: list[int], stride: int) -> float:
        """The score layer by layer over every scored anchor at once, from the deepest layer input a scored mix shares."""
        d, dev = self.d, self.base.device
        seqs = self._soft_anchors(indices, stride)
        pairs = [(j, c) for j, (_, _, _, anchors) in enumerate(seqs) for c in anchors]
        if not pairs:
            return 0.0
        w = self.weights(types, layers=False)
        g = block_graph(d, w, self.n_max)
        cache_dtype = torch.float16 if self.like_cpu else None
        chunks = []  # (its (sequence, anchor) pairs, its rows' positions, its segments by sequence)
        for at in range(0, len(pairs), SOFT_BATCH):
            part = pairs[at:at + SOFT_BATCH]
            anchors = torch.tensor([c for _, c in part], device=dev)
            ids = torch.stack([seqs[j][2][c] for j, c in part]).to(dev)
            x0, rows = block_rows(d, w, g, anchors, ids)
            bounds = [k for k in range(len(part)) if k == 0 or part[k][0] != part[k - 1][0]] + [len(part)]
            chunks.append((part, x0, rows, [(a, e, part[a][0]) for a, e in zip(bounds, bounds[1:], strict=False)]))
        start, shared = self._nearest_prefix(types, indices, stride)
        xs: list = shared[:start + 1] if start > 0 else [None]
        x = shared[start] if start > 0 else [x0 for _, x0, _, _ in chunks]
        for il in range(start, d.n_layers):
            lw = self._layer(types, il)
            ctx = {j: {il: self._context(types, w, seqs[j][0], seqs[j][1], il, lw)} for j in range(len(seqs))}
            x = [block_layer(d, w, g, il, lw, xc, rows, [(a, e, ctx[j]) for a, e, j in segs], self.like_cpu, cache_dtype)
                 for xc, (_, _, rows, segs) in zip(x, chunks, strict=True)]
            xs.append(x)
            del lw
        self._prefix[(_types_key(types), tuple(indices), stride)] = (dict(types), xs)
        B = d.block_size
        normed = torch.cat([rms_norm(xc, d.rms_eps, w.output_norm).reshape(-1, B, d.hidden_size)[:, 1:self.n_max + 1]
                            for xc in x])
        want = torch.stack([seqs[j][2][c + 1:c + 1 + self.n_max] for j, c in pairs])
        return float(expected_lengths(w, normed, want, self.like_cpu, d.vocab_size).sum()) / len(pairs)

    def _nearest_prefix(self, types: Types, indices: list[int], stride: int) -> tuple[int, list]:
        """(the first layer ``types`` must compute, a scored mix's layer inputs up to it): the mix sharing the most layers."""
        best: tuple[int, list] = (0, [])
        for (_, idx, st), (other, xs) in self._prefix.items():
            if idx == tuple(indices) and st == stride:
                k = min(self._first_changed_layer(other, types), len(xs) - 1)
                if k > best[0]:
                    best = (k, xs)
        return best

    def _first_changed_layer(self, a: Types, b: Types) -> int:
        """The first layer whose input differs between mixes ``a`` and ``b`` (n_layers: only the head's)."""
        first = self.d.n_layers
        for name in set(a) | set(b):
            if a.get(name) == b.get(name):
                continue
            m = _LAYER_WEIGHT.fullmatch(name)
            if m is not None:
                first = min(first, int(m.group(1)))
            elif name != OUTPUT_TENSOR or self._tied:
                return 0  # fc, the token embedding: every layer's input
        return first

    def _soft_by_blocks(self, types: Types, indices: list[int], stride: int) -> float:
        """The score block by block, every slot through the head: DSpark's chain and DFlash2's selector need them all."""
        w = self.weights(types)
        context_of = self._context_of(types, w)
        total, count = 0.0, 0
        for i, features, ids, anchors in self._soft_anchors(indices, stride):
            ctx = context_of(i, features)
            for at in range(0, len(anchors), SOFT_BATCH):
                part = anchors[at:at + SOFT_BATCH]
                _, logits = anchor_drafts(self.d, w, features, ids, part, self.n_max, batch=SOFT_BATCH, keep_logits=True,
                                          cpu_matmul=self.like_cpu, ctx_kv=ctx,
                                          kv_cache_dtype=torch.float16 if self.like_cpu else None)  # type: ignore[misc]
                want = torch.stack([ids[c + 1:c + 1 + self.n_max] for c in part])
                p = torch.log_softmax(logits.double(), dim=-1).gather(-1, want[..., None])[..., 0].exp()
                total += float(torch.cumprod(p, dim=-1).sum())
                count += len(part)
        return total / count if count else 0.0


def _types_key(types: Types) -> tuple:
    return tuple(sorted((n, t.name) for n, t in types.items()))


def file_acceptance(path: str | Path, target: Target | None, feats: FeaturesFile, n_max: int, *,
                    device: torch.device | str = "cpu", like_cpu: bool = True,
                    indices: list[int] | None = None) -> LoopCount:
    """A written drafter file's live-loop count (what ``accept`` prints as n_drafted, n_accept, accept)."""
    d = read_drafter(path)
    slots = feats.check_drafter(d, path, n_max)
    w = load_weights(d, target, device=device)
    return live_loop(d, w, feats, slots, n_max, like_cpu=like_cpu, indices=indices)


# --- the search


def split(n: int) -> tuple[list[int], list[int]]:
    """(calibration, held-out) sequence indices: alternate sequences, so both halves see every kind."""
    if n < 2:
        raise DFlashError(f"the features file has {n} sequence(s): the search needs at least 2 (a calibration "
                          "and a held-out half); capture more prompts")
    return list(range(0, n, 2)), list(range(1, n, 2))


def tensor_groups(d: Drafter, names: set[str]) -> list[tuple[str, list[str]]]:
    """(label, tensor names) of each group the search raises together, in file order of layers."""
    out = []
    for label, members in GLOBAL_GROUPS[:1]:  # fc first, the output head last
        got = [m for m in members if m in names]
        if got:
            out.append((label, got))
    for il in range(d.n_layers):
        for label, suffixes in LAYER_GROUPS:
            got = [layer_name(il, s) for s in suffixes if layer_name(il, s) in names]
            if got:
                out.append((layer_name(il, label), got))
    for label, members in GLOBAL_GROUPS[1:]:
        got = [m for m in members if m in names]
        if got:
            out.append((label, got))
    return out


def raise_group(state: Types, names: list[str], ncols: dict[str, int],
                ladders: dict[str, tuple[GGMLType, ...]] | None = None) -> Types | None:
    """``state`` with each tensor of the group at its next candidate type (on its ladder); None when all are at the top."""
    new, changed = dict(state), False
    for n in names:
        up = raised_type(state[n], ncols[n], (ladders or {}).get(n, RAISE_LADDER))
        if up is not None:
            new[n], changed = up, True
    return new if changed else None


@dataclass
class SearchStep:
    """One raise of the search: the group, the mix's size and both halves' scores after it."""

    group: str
    tensor_bytes: int
    calibration: float  # expected accepted length on the calibration half after the step
    held_out: float  # and on the held-out half


@dataclass
class SearchResult:
    """What ``search_mix`` chose, and the held-out counts it is judged by."""

    ftype: str

    min_acceptance: float
    baseline: LoopCount  # the unquantized file, held-out half
    plain: LoopCount  # llama-quantize's mix, held-out half
    result: LoopCount  # the chosen mix, held-out half
    plain_bytes: int
    result_bytes: int
    baseline_bytes: int
    types: Types
    recipe: list[tuple[str, GGMLType]]
    reached: bool
    calibration: list[int]
    held_out: list[int]
    steps: list[SearchStep] = field(default_factory=list)
    evaluations: int = 0
    quantized: int = 0
    seconds: float = 0.0
    n_max: int = 0

    @property
    def relative(self) -> float:
        """The chosen mix's held-out acceptance as a fraction of the unquantized file's."""
        return self.result.accept / self.baseline.accept if self.baseline.accept else 1.0


def search_mix(ev: MixEvaluator, ftype: str, min_acceptance: float, *, max_steps: int | None = None,
               log: Callable[[str], None] | None = None) -> SearchResult:
    """Raise tensor groups from ``ftype``'s mix until held-out acceptance reaches ``min_acceptance`` of the unquantized file's."""
    if not 0.0 < min_acceptance <= 1.0:
        raise DFlashError(f"--min-acceptance {min_acceptance}: expected a fraction in (0, 1], e.g. 0.98")
    started = time.perf_counter()
    say = log or (lambda line: None)
    d = ev.d
    cal, held = split(len(ev.feats.sequences))
    planned = mix_plan(d, ftype, imatrix=ev.imatrix)
    state = quantized_types(planned, d)
    ladders = {n: ev.ladder(n) for n in state}
    ne = {p.tensor.gguf_name: p.ne for p in planned}
    ncols = {n: ne[n][0] for n in state}
    fixed_bytes = sum(p.nbytes for p in planned if p.tensor.gguf_name not in state)
    nbytes_of: Callable[[Types], int] = lambda s: fixed_bytes + sum(tensor_nbytes(t, ne[n]) for n, t in s.items())  # noqa: E731
    base_types = ev.source_types(list(state))
    baseline = ev.accept(base_types, held)
    if baseline.n_accept == 0:
        raise DFlashError(f"--min-acceptance {min_acceptance:g}: the input accepts no drafted token on the held-out "
                          f"sequences ({baseline.n_drafted} drafted): nothing can be chosen by acceptance when the "
                          "reference accepts nothing", d.source)
    goal = min_acceptance * baseline.accept
    say(f"  unquantized: held-out accept {baseline.accept:.4f}; goal {min_acceptance:g} x = {goal:.4f}; calibration "
        f"expected length {ev.expected_length(base_types, cal):.3f} ({sum(map(len, ev.scored_anchors(cal)))} anchors)")
    ev.retain(state)  # the input's layer inputs start no candidate
    plain = current = ev.accept(state, held)
    say(f"  {ftype} (llama-quantize's mix): {nbytes_of(state)} tensor bytes, held-out accept {plain.accept:.4f}")
    groups = tensor_groups(d, set(state))
    steps: list[SearchStep] = []
    reached = current.accept >= goal
    while not reached and (max_steps is None or len(steps) < max_steps):
        here = ev.expected_length(state, cal)
        options = [(label, s) for label, names in groups if (s := raise_group(state, names, ncols, ladders)) is not None]
        if not options:
            break
        best: tuple | None = None
        for label, s in options:
            gain = ev.expected_length(s, cal) - here
            cost = max(1, nbytes_of(s) - nbytes_of(state))
            rank = (gain > 0, gain / cost if gain > 0 else gain, -cost)
            if best is None or rank > best[0]:  # the first of equals, as max() takes
                best = (rank, label, s)
            ev.retain(state, best[2])  # a candidate's bytes stay (quantized once); only the best one's layer inputs
        _, label, state = best  # type: ignore[misc]
        ev.retain(state)
        current = ev.accept(state, held)
        steps.append(SearchStep(label, nbytes_of(state), ev.expected_length(state, cal), current.accept))
        say(f"  step {len(steps)}: raise {label}: {nbytes_of(state)} tensor bytes, calibration expected length "
            f"{steps[-1].calibration:.3f}, held-out accept {current.accept:.4f}")
        reached = current.accept >= goal
    items = recipe(d, ftype, state, ev.imatrix)
    return SearchResult(ftype, min_acceptance, baseline, plain, current, total_bytes(planned), nbytes_of(state),
                        fixed_bytes + sum(tensor_nbytes(t, ne[n]) for n, t in base_types.items()), state, items, reached,
                        cal, held, steps, ev.evaluations, ev.quantized, time.perf_counter() - started, ev.n_max)


__all__ = ["MixEvaluator", "SearchResult", "SearchStep", "SpilledBytes", "file_acceptance", "mix_plan", "quantized_types", "recipe",
           "recipe_args", "search_mix", "split", "tensor_groups"]
