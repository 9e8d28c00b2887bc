"""quantize(): a dflash GGUF in, the same drafter in another type out, bit-identical to llama-quantize.

``read_drafter`` gives the Drafter and its GGUF tensor sources; ``format.quant_types`` decides each
tensor's type exactly as llama-quantize does for arch ``dflash`` (mixes, output rule, fallbacks),
``--keep-type`` overrides it for chosen tensors; the encoders of ``codecs/`` (numpy, bit-exact
with ggml's reference quantizers) run in the one streaming pipeline, and the atomic writer
writes the file. Keys are copied as llama-quantize copies them; tensors go out in its order.

The same plan applies on top of a conversion (``convert --outtype Q4_K_M``): see
``quantize_planned``, which both use.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from .codecs import COPY, encoder
from .drafter import Drafter
from .errors import DFlashError, InputFileError
from .files import check_output_path
from .format.ggml import BLOCK_GEOMETRY, QUANTIZATION_VERSION, GGMLType, tensor_nbytes
from .format.keys import ValueType, key
from .format.quant_types import (
    FTYPE_ALIASES,
    FTYPES,
    KEEP,
    NOTE_FALLBACK,
    NOTE_KEPT,
    choose_quant_types,
    loader_order,
    n_dims,
    resolve_ftype,
)
from .format.rules import FIXED, VECTOR, storage_class
from .metadata import Metadata
from .pipeline import ChunkPipeline, PlannedTensor
from .plan import plan_tensor
from .sources.gguf import read_gguf
from .sources.gguf_drafter import drafter_from_gguf
from .write import write_gguf

# the types `quantize` writes (what users publish drafters as); llama-quantize knows more
QUANT_TYPES: tuple[str, ...] = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
                                "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS")
SPLIT_PREFIX = "split."  # llama-quantize drops shard bookkeeping keys
# element types a tensor may be quantized from without --allow-requantize
FLOAT_INPUTS = ("F32", "F16", "BF16")


@dataclass
class QuantizePlan:
    source: Path
    output: Path
    ftype: str
    file_type: int
    metadata: Metadata
    tensors: list[PlannedTensor]
    drafter: Drafter
    fallbacks: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def parse_ftype(name: str) -> str:
    """A TYPE argument -> its canonical name; DFlashError listing the choices when unknown."""
    try:
        canon = resolve_ftype(name)
    except (KeyError, ValueError):
        canon = None
    if canon is None or canon not in QUANT_TYPES:
        raise DFlashError(f"unknown quantization type {name!r}; choose from {', '.join(QUANT_TYPES)}"
                          f" (aliases: {', '.join(f'{a}={b}' for a, b in FTYPE_ALIASES.items())})")
    return canon


def parse_keep_types(specs: list[str]) -> list[tuple[str, GGMLType]]:
    """--keep-type PATTERN=TYPE items -> (glob, ggml type); a clear error for a malformed item or unknown type."""
    out = []
    writable = [t.name for t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)] + [t.name for t in _quantizers()]
    for spec in specs:
        pattern, sep, type_name = spec.partition("=")
        if not sep or not pattern or not type_name:
            raise DFlashError(f"--keep-type {spec!r}: expected PATTERN=TYPE, for example 'blk.[01].attn_*=Q8_0'")
        t = type_name.strip().upper()
        if t not in writable:
            raise DFlashError(f"--keep-type {spec!r}: unknown or unsupported tensor type {type_name!r} "
                              f"(choose from {', '.join(writable)})")
        out.append((pattern.strip(), GGMLType[t]))
    return out


def _quantizers() -> list[GGMLType]:
    from .codecs import QUANTIZERS

    return list(QUANTIZERS)


def quantized_metadata(source: Metadata, file_type: int) -> Metadata:
    """llama-quantize's key rule: every key copied in order, split.* dropped, then the quantization
    version and the file type removed from where they were and appended, both UINT32."""
    md = Metadata()
    qv, ft = key("quantization_version"), key("file_type")
    for kv in source:
        if kv.key in (qv, ft) or kv.key.startswith(SPLIT_PREFIX):
            continue
        md.set_raw(kv.key, kv.vtype, kv.value, kv.sub)
    md.set_raw(qv, ValueType.UINT32, QUANTIZATION_VERSION)
    md.set_raw(ft, ValueType.UINT32, file_type)
    return md


def quantize_planned(planned: list[PlannedTensor], d: Drafter, ftype: str, *, keep_types: list[tuple[str, GGMLType]] = (),
                     allow_requantize: bool = False, where: Path | None = None) -> tuple[int, list[PlannedTensor], int]:
    """Re-plan tensors (as an F32/F16/BF16 file would hold them) for ``ftype``: types, order, encoders.

    Each PlannedTensor's current ggml type is what llama-quantize would read; its encoder is
    extended to produce the new type from the same source (so a conversion and a quantization
    run in one pass). Returns (general.file_type, planned tensors in llama-quantize's order,
    number of fallbacks).
    """
    tensors = [(p.tensor.gguf_name, p.ne) for p in planned]
    in_types = [p.ggml_type.name for p in planned]
    requant = [n for (n, _), t in zip(tensors, in_types, strict=True) if t not in FLOAT_INPUTS and BLOCK_GEOMETRY[GGMLType[t]][0] > 1]
    try:
        file_type, choices = choose_quant_types(
            tensors, ftype, input_types=None if allow_requantize else in_types,
            n_layer=d.n_layers, n_head=d.n_head, n_head_kv=d.n_head_kv)
    except ValueError as e:
        raise DFlashError(f"{e}; the input is already quantized: quantize from the F16/BF16 file, or pass "
                          "--allow-requantize (quality suffers)", where) from None
    if requant and not allow_requantize:
        raise DFlashError(f"already quantized tensors ({', '.join(requant[:4])}{' ...' if len(requant) > 4 else ''}); "
                          "quantize from the F16/BF16 file, or pass --allow-requantize (quality suffers)", where)
    chosen = [GGMLType[t] if t != KEEP else GGMLType[src] for (t, _), src in zip(choices, in_types, strict=True)]
    # the one per-tensor table (format/rules.py): fixed-type and vector tensors keep their type
    for i, (name, ne) in enumerate(tensors):
        if storage_class(name, tuple(reversed(ne))) in (FIXED, VECTOR) and chosen[i].name != in_types[i]:
            raise DFlashError(f"{name}: llama-quantize's choice {chosen[i].name} contradicts the storage table "
                              f"(a {storage_class(name, tuple(reversed(ne)))} tensor keeps {in_types[i]})", where)
    notes = [n for _, n in choices]
    fallbacks = sum(n.startswith(NOTE_FALLBACK) for n in notes)

    # --keep-type: only tensors llama-quantize quantizes (matrices) can be kept at another type
    for pattern, t in keep_types:
        hits = [i for i, (name, _) in enumerate(tensors) if fnmatch.fnmatchcase(name, pattern) and not notes[i].startswith(NOTE_KEPT)]
        if not hits:
            raise DFlashError(f"--keep-type {pattern}={t.name}: the pattern matches no quantized tensor "
                              f"(tensor names look like {tensors[-1][0]!r})", where)
        for i in hits:
            ne0 = tensors[i][1][0]
            if ne0 % BLOCK_GEOMETRY[t][0]:
                raise DFlashError(f"--keep-type {pattern}={t.name}: {tensors[i][0]} has rows of {ne0} values, not a whole "
                                  f"number of {t.name} blocks ({BLOCK_GEOMETRY[t][0]})", where)
            chosen[i] = t
            notes[i] = f"--keep-type {pattern}"

    out: list[PlannedTensor] = []
    for i in loader_order([n for n, _ in tensors]):
        p, new = planned[i], chosen[i]
        # llama-quantize writes ggml_n_dims dimensions: trailing 1s dropped (DSpark's conf_proj {E+R, 1} -> {E+R})
        ne = p.ne[:n_dims(p.ne)]
        if new == p.ggml_type:
            out.append(p if ne == p.ne else replace(p, ne=ne))
            continue
        first = p.encode
        step = encoder(p.ggml_type.name, new, row_length=p.ne[0])
        enc = step if first is COPY else (lambda raw, first=first, step=step: step(first(raw)))
        out.append(PlannedTensor(p.tensor, new, ne, tensor_nbytes(new, ne), enc, notes[i]))
    return file_type, out, fallbacks


def plan_quantize(src: str | os.PathLike, out: str | os.PathLike, qtype: str, *, keep_types: list[str] | None = None,
                  allow_requantize: bool = False) -> QuantizePlan:
    """Read and decide everything; writes nothing."""
    path = Path(src)
    check_output_path(out, [path], force=True)  # never the input, checked before anything is read
    ftype = parse_ftype(qtype)
    keep = parse_keep_types(keep_types or [])
    g = read_gguf(path)
    d = drafter_from_gguf(g, strict=True)
    for t in d.tensors:
        if t.dtype not in GGMLType.__members__:
            raise InputFileError(f"tensor {t.gguf_name} has unknown type {t.dtype}", path)
    source_plan = [plan_tensor(t, GGMLType[t.dtype], copy=True) for t in d.tensors]
    file_type, planned, fallbacks = quantize_planned(source_plan, d, ftype, keep_types=keep,
                                                     allow_requantize=allow_requantize, where=path)
    md = Metadata()
    for name, v in g.metadata.items():
        md.set_raw(name, v.vtype, v.value, v.sub)
    plan = QuantizePlan(path, Path(out), ftype, file_type, quantized_metadata(md, file_type), planned, d, fallbacks)
    if fallbacks:
        plan.notes.append(f"{fallbacks} of {len(planned)} tensor(s) required fallback quantization")
    return plan


def write_quantize(plan: QuantizePlan, *, force: bool = False, progress: bool = True, threads: int | None = None) -> Path:
    check_output_path(plan.output, [plan.source], force=force)
    with ChunkPipeline(workers=threads) as pipeline:
        write_gguf(plan.output, plan.metadata, pipeline.out_tensors(plan.tensors), progress=progress)
    return plan.output


def quantize(src: str | os.PathLike, out: str | os.PathLike, qtype: str, *, keep_types: list[str] | None = None,
             allow_requantize: bool = False, force: bool = False, dry_run: bool = False, threads: int | None = None,
             progress: bool = False) -> QuantizePlan:
    """Quantize a dflash GGUF to ``qtype`` (a llama-quantize type name). Returns the plan."""
    plan = plan_quantize(src, out, qtype, keep_types=keep_types, allow_requantize=allow_requantize)
    if not dry_run:
        write_quantize(plan, force=force, progress=progress, threads=threads)
    return plan


__all__ = ["QUANT_TYPES", "FTYPES", "QuantizePlan", "plan_quantize", "quantize", "quantize_planned", "write_quantize"]
