"""The per-tensor plan convert and quantize share: which ggml type each tensor gets, its GGUF shape
and size, and its encoder; how a type name is resolved; and the key rule of a quantized file.

Type rules come from the tables in format/: the converter's storage table (format/rules.py:
storage_class / storage_type, with its fallback: Q8_0 rows that are not whole blocks become F16,
with a warning, as upstream) and llama-quantize's choices (format/quant_types.py). ``--outtype``
is resolved once, by ``resolve_outtype``, into an ``OutType``; a quantization plan
(``quantize_planned``) extends a float plan's encoders, so a conversion and a quantization run in
one pass over the data.
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from .drafter import Drafter, DrafterTensor
from .encoders import COPY, QUANTIZERS, encoder
from .errors import DFlashError
from .format.file_types import FILE_TYPES, FTYPE_ALIASES, OUTTYPES, QUANT_TYPES, FileType
from .format.ggml import BLOCK_GEOMETRY, QUANTIZATION_VERSION, GGMLType, tensor_nbytes
from .format.keys import SPLIT_PREFIX, ValueType, key
from .format.quant_types import KEEP, NOTE_FALLBACK, NOTE_KEPT, choose_quant_types, loader_order, n_dims, resolve_ftype
from .format.rules import CONVERT_FALLBACK, FIXED, VECTOR, storage_class, storage_type
from .metadata import Metadata
from .pipeline import PlannedTensor

log = logging.getLogger("dflash_convert")

BLOCK_OF: dict[str, int] = {t.name: geometry[0] for t, geometry in BLOCK_GEOMETRY.items()}
AUTO = "auto"
# element types a tensor may be quantized from without --allow-requantize
FLOAT_INPUTS = ("F32", "F16", "BF16")


# --- type names ----------------------------------------------------------------------------------


def parse_ftype(name: str) -> str:
    """A quantize TYPE argument -> its canonical name; DFlashError listing the choices when unknown."""
    try:
        canon = resolve_ftype(name)
    except (KeyError, ValueError):
        canon = None
    if canon is None or canon not in QUANT_TYPES:
        raise DFlashError(f"unknown quantization type {name!r}; choose from {', '.join(QUANT_TYPES)}"
                          f" (aliases: {', '.join(f'{a}={b}' for a, b in FTYPE_ALIASES.items())})")
    return canon


@dataclass(frozen=True)
class OutType:
    """``--outtype`` resolved once: what the file is (its ``general.file_type`` and name tag), the float
    type tensors are converted to, and whether a llama-quantize pass follows in the same stream."""

    file_type: FileType  # written as general.file_type; the file is named after it
    convert_to: FileType  # the converter's own type (f32/f16/bf16/q8_0): matrices are converted to it first
    quantize: str | None = None  # a llama-quantize type name when the conversion also quantizes

    @property
    def name(self) -> str:
        return self.file_type.name


def resolve_outtype(outtype: str, first_matrix_dtype: str | None) -> OutType:
    """convert's --outtype: f32, f16, bf16, q8_0 (the converter's own), auto (bf16 for a bf16
    checkpoint, else f16, as upstream), or any quantize TYPE (converted as auto would, then quantized:
    the bytes of ``convert --outtype bf16`` + ``quantize``)."""
    auto = OUTTYPES["bf16" if first_matrix_dtype == "BF16" else "f16"]
    if outtype == AUTO:
        return OutType(auto, auto)
    if outtype in OUTTYPES:
        return OutType(OUTTYPES[outtype], OUTTYPES[outtype])
    try:
        quant = parse_ftype(outtype)
    except DFlashError:
        raise DFlashError(f"unknown --outtype {outtype!r} (choose from {AUTO}, {', '.join(OUTTYPES)}, "
                          f"or a quantization type: {', '.join(QUANT_TYPES)})") from None
    return OutType(FILE_TYPES[quant], auto, quant)


def parse_keep_types(specs: list[str]) -> list[tuple[str, GGMLType]]:
    """--keep-type PATTERN=TYPE items -> (glob, ggml type); a clear error for a malformed item or unknown type."""
    out = []
    writable = [t.name for t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)] + [t.name for t in QUANTIZERS]
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


# --- the float plan (convert) --------------------------------------------------------------------


def tensor_type(name: str, shape: tuple[int, ...], matrix_type: GGMLType,
                fallback: dict[str, str] = CONVERT_FALLBACK) -> tuple[GGMLType, str]:
    name_of_type, note = storage_type(name, shape, matrix_type.name, fallback, BLOCK_OF)
    return GGMLType[name_of_type], note


def plan_tensor(t: DrafterTensor, ggml_type: GGMLType, note: str = "", *, copy: bool = False) -> PlannedTensor:
    """A PlannedTensor for ``t`` written as ``ggml_type`` (``copy``: bytes unchanged)."""
    ne = tuple(reversed(t.shape)) or (1,)
    return PlannedTensor(t, ggml_type, ne, tensor_nbytes(ggml_type, ne), COPY if copy else encoder(t.dtype, ggml_type), note)


def plan_tensors(d: Drafter, matrix_type: GGMLType) -> list[PlannedTensor]:
    out = []
    for t in d.tensors:
        ggml_type, note = tensor_type(t.gguf_name, t.shape, matrix_type)
        if note:
            log.warning("%s: %s", t.gguf_name, note)
        out.append(plan_tensor(t, ggml_type, note))
    return out


# --- the quantized plan (quantize, convert --outtype TYPE) ----------------------------------------


def append_file_type(md: Metadata, file_type: int) -> None:
    """llama-quantize's place for the two keys: last, quantization version then file type, both UINT32."""
    md.set_raw(key("quantization_version"), ValueType.UINT32, QUANTIZATION_VERSION)
    md.set_raw(key("file_type"), ValueType.UINT32, file_type)


def quantized_metadata(source: Metadata, file_type: int) -> Metadata:
    """llama-quantize's key rule on an existing file's keys: every key copied in order, split.* dropped,
    the quantization version and the file type removed from where they were and appended."""
    md = Metadata()
    qv, ft = key("quantization_version"), key("file_type")
    for kv in source:
        if kv.key in (qv, ft) or kv.key.startswith(SPLIT_PREFIX):
            continue
        md.set_raw(kv.key, kv.vtype, kv.value, kv.sub)
    append_file_type(md, file_type)
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
