"""The per-tensor plan convert and quantize share: each tensor's ggml type, GGUF shape, size and encoder.

Types come from format/'s tables (the converter's storage table with upstream's Q8_0 -> F16 fallback,
llama-quantize's choices); ``--outtype`` is resolved once, by ``resolve_outtype``; a quantization plan
(``quantize_planned``) extends a float plan's encoders, so conversion and quantization are one pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from .drafter import Drafter, DrafterTensor
from .encoders import COPY, IMPORTANCE_REQUIRED, QUANTIZERS, Encoder, encoder, takes_importance
from .errors import DFlashError, InputFileError, OptionValueError
from .files import read_regular_bytes
from .format import imatrix as imatrix_keys
from .format.file_types import FILE_TYPES, FTYPE_ALIASES, OUTTYPES, QUANT_TYPES, FileType
from .format.ggml import BLOCK_GEOMETRY, FLOAT_TYPE_NAMES, QUANTIZATION_VERSION, GGMLType, tensor_nbytes
from .format.keys import SPLIT_PREFIX, VALUE_TYPES, ValueType, key
from .format.quant_types import (
    KEEP,
    NO_OVERRIDES,
    NOTE_FALLBACK,
    NOTE_KEPT,
    NoFallback,
    TypeOverrides,
    choose_quant_types,
    loader_order,
    n_dims,
    requires_imatrix,
    resolve_ftype,
)
from .format.rules import CONVERT_FALLBACK, FIXED, VECTOR, storage_class, storage_type
from .format.tensor_patterns import compile_pattern, shown, tensor_glob
from .format.tensors import LAYER_PREFIX, layer_name, layer_of
from .metadata import Metadata
from .sources.imatrix import ImportanceMatrix, c_string, read_imatrix

log = logging.getLogger("dflash_convert")

BLOCK_OF: dict[str, int] = {t.name: geometry[0] for t, geometry in BLOCK_GEOMETRY.items()}
AUTO = "auto"


@dataclass
class PlannedTensor:
    """One output tensor of a plan: its source, its ggml type and shape, and how its bytes are made."""

    tensor: DrafterTensor
    ggml_type: GGMLType
    ne: tuple[int, ...]
    nbytes: int
    encode: Encoder
    note: str = ""


# --- type names


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
    """``--outtype`` resolved once: the file's type, the float type converted to, and whether llama-quantize follows."""

    file_type: FileType
    convert_to: FileType  # the converter's own type (f32/f16/bf16/q8_0): matrices are converted to it first
    quantize: bool = False  # llama-quantize's pass to ``file_type`` follows in the same stream

    @property
    def name(self) -> str:
        """The file type's name."""
        return self.file_type.name


def resolve_outtype(outtype: str, first_matrix_dtype: str | None) -> OutType:
    """convert's --outtype: the converter's own types, auto (bf16 for a bf16 checkpoint, else f16), or any quantize TYPE."""
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
    return OutType(FILE_TYPES[quant], auto, quantize=True)


def writable_types() -> list[str]:
    """ggml types a tensor can be written as here: the plain floats and every quantizer's type."""
    return [*FLOAT_TYPE_NAMES, *(t.name for t in QUANTIZERS)]


def parse_ggml_type(name: str, flag: str) -> GGMLType:
    """A ggml type name as llama-quantize's parse_ggml_type takes it (case-insensitive), among those we write."""
    t = name.strip().upper()
    if t not in writable_types():
        raise OptionValueError(f"{flag} {name!r}: unknown or unsupported tensor type (choose from {', '.join(writable_types())})")
    return GGMLType[t]


def parse_tensor_types(specs: list[str], where: str = "--tensor-type") -> list[tuple[str, GGMLType]]:
    """--tensor-type PATTERN=TYPE items (parse_tensor_type): patterns lower-cased regexes, order kept (first match wins)."""
    out = []
    for spec in specs:
        pattern, sep, type_name = spec.partition("=")
        if not sep or not pattern or not type_name:
            raise OptionValueError(f"{where} {shown(spec)}: expected PATTERN=TYPE, for example 'attn_v=q8_0'")
        compile_pattern(pattern.lower(), f"{where} {shown(spec)}")  # refused here, before any file is read
        out.append((pattern.lower(), parse_ggml_type(type_name, where)))
    return out


def read_tensor_type_file(path: str | Path) -> list[tuple[str, GGMLType]]:
    """--tensor-type-file: PATTERN=TYPE items separated by whitespace, as llama-quantize reads them."""
    raw = read_regular_bytes(path, "tensor type file", 1 << 20)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputFileError("tensor type file is not UTF-8 text", path) from None
    try:
        return parse_tensor_types(text.split(), f"--tensor-type-file {path}:")
    except OptionValueError as e:  # a pattern read from a file: the file is the input that is wrong (exit 2)
        raise InputFileError(e.message) from None


# string_parse_kv_override's value types, and the GGUF type llama-quantize writes each as
KV_OVERRIDE_TYPES: dict[str, ValueType] = {"int": ValueType.UINT32, "float": ValueType.FLOAT32, "bool": ValueType.BOOL,
                                           "str": ValueType.STRING}
KV_KEY_MAX = 127  # llama_model_kv_override.key is char[128]
KV_STR_MAX = 127


def parse_kv_override(spec: str) -> tuple[str, ValueType, object]:
    """--override-kv KEY=TYPE:VALUE -> (key, written type, value); an int is written as UINT32 of its absolute value, as llama-quantize does."""
    key_name, sep, rest = spec.partition("=")
    kind, colon, text = rest.partition(":")
    if not sep or not key_name or not colon or kind not in KV_OVERRIDE_TYPES:
        raise DFlashError(f"--override-kv {spec!r}: expected KEY=TYPE:VALUE with TYPE one of {', '.join(KV_OVERRIDE_TYPES)}")
    if len(key_name.encode()) > KV_KEY_MAX:
        raise DFlashError(f"--override-kv {spec[:40]!r}...: the key is longer than {KV_KEY_MAX} bytes")
    vtype = KV_OVERRIDE_TYPES[kind]
    try:
        if kind == "int":
            value: object = abs(int(text))
            if value > VALUE_TYPES[ValueType.UINT32].highest:  # type: ignore[operator]
                raise ValueError("out of range")
        elif kind == "float":
            value = float(text)
        elif kind == "bool":
            if text not in ("true", "false"):
                raise ValueError("not true or false")
            value = text == "true"
        else:
            if len(text.encode()) > KV_STR_MAX:
                raise ValueError(f"longer than {KV_STR_MAX} bytes")
            value = text
    except ValueError as e:
        raise DFlashError(f"--override-kv {spec!r}: {kind} value {text!r}: {e}") from None
    return key_name, vtype, value


def parse_prune_layers(spec: str) -> list[int]:
    """--prune-layers L0,L1,... (parse_layer_prune): non-negative layer ids, sorted, without repeats."""
    try:
        ids = [int(x) for x in spec.split(",")]
    except ValueError:
        ids = [-1]
    if not ids or any(i < 0 for i in ids):
        raise OptionValueError(f"--prune-layers {spec!r}: expected comma-separated layer numbers")
    return sorted(set(ids))


@dataclass(frozen=True)
class QuantizeOptions:
    """llama-quantize's options beyond the type, parsed (see ``format.quant_types.TypeOverrides``)."""

    types: TypeOverrides = NO_OVERRIDES
    keep_types: tuple[tuple[str, GGMLType], ...] = ()
    kv_overrides: tuple[tuple[str, ValueType, object], ...] = ()
    prune_layers: tuple[int, ...] = ()
    allow_requantize: bool = False
    imatrix: ImportanceMatrix | None = None  # --imatrix, filtered; None also when no entry is left (as llama-quantize)


def load_importance(path: str, include: list[str] | None = None, exclude: list[str] | None = None
                    ) -> tuple[ImportanceMatrix | None, tuple[tuple[str, ValueType, object], ...]]:
    """--imatrix FILE with --include-weights / --exclude-weights, as prepare_imatrix: (matrix or None, quantize.imatrix.* keys)."""
    if include and exclude:  # llama-quantize prints its usage for the pair
        raise OptionValueError("--include-weights and --exclude-weights cannot be used together")
    m = read_imatrix(path).filtered(include or (), exclude or ())
    if not m.values:
        return None, ()
    m.check_finite()
    kv: list[tuple[str, ValueType, object]] = [(imatrix_keys.QUANTIZE_FILE, ValueType.STRING, c_string(path))]
    if m.datasets:
        kv.append((imatrix_keys.QUANTIZE_DATASET, ValueType.STRING, c_string(m.datasets[0])))
    kv.append((imatrix_keys.QUANTIZE_ENTRIES, ValueType.UINT32, m.entries_count))
    if m.chunk_count > 0:
        kv.append((imatrix_keys.QUANTIZE_CHUNKS, ValueType.UINT32, m.chunk_count))
    return m, tuple(kv)


def remap_layers(names: list[str], prune: list[int]) -> dict[str, str | None]:
    """llama-quantize's remap_layer: a pruned layer's tensor maps to None, the rest renumbered in order (``names`` in loader order)."""
    out: dict[str, str | None] = {}
    mapped: dict[int, int | None] = {}
    next_id = 0
    for name in names:
        bid = layer_of(name)
        if bid is None or not prune:
            out[name] = name
            continue
        if bid not in mapped:
            if bid in prune:
                mapped[bid] = None
            elif bid < prune[0]:
                mapped[bid], next_id = bid, bid + 1
            else:
                mapped[bid], next_id = next_id, next_id + 1
        new = mapped[bid]
        out[name] = None if new is None else layer_name(new, name[len(f"{LAYER_PREFIX}{bid}."):])
    return out


def remaining_layers(n_layers: int, prune: list[int]) -> int:
    """block_count after --prune-layers (llama-quantize sets it to the next id its remap would give)."""
    kept = [i for i in range(n_layers) if i not in prune]
    return len(kept)


# per-layer arrays: --prune-layers drops their entries, unlike llama-quantize (docs/quantize.md)
PER_LAYER_ARRAYS: tuple[str, ...] = ("sliding_window_pattern", "feed_forward_length", "head_count", "head_count_kv")


def apply_kv_overrides(md: Metadata, options: QuantizeOptions, n_layers: int) -> Metadata:
    """The overridden keys, then a pruned block_count, each moved to the end as gguf_set_val does; per-layer arrays pruned too."""
    for k, vtype, value in options.kv_overrides:
        md.remove(k)
        md.set_raw(k, vtype, value)
    if options.prune_layers:
        prune = set(options.prune_layers)
        for short in PER_LAYER_ARRAYS:
            kv = md.kv(key(short))
            if kv is not None and kv.vtype == ValueType.ARRAY and len(kv.value) == n_layers:
                md.set_raw(kv.key, kv.vtype, [v for i, v in enumerate(kv.value) if i not in prune], kv.sub)
        md.remove(key("block_count"))
        md.set_raw(key("block_count"), ValueType.UINT32, remaining_layers(n_layers, list(options.prune_layers)))
    return md


def parse_keep_types(specs: list[str]) -> list[tuple[str, GGMLType]]:
    """--keep-type PATTERN=TYPE items -> (glob, ggml type); a clear error for a malformed item or unknown type."""
    out = []
    writable = writable_types()
    for spec in specs:
        pattern, sep, type_name = spec.partition("=")
        if not sep or not pattern or not type_name:
            raise OptionValueError(f"--keep-type {shown(spec)}: expected PATTERN=TYPE, for example 'blk.[01].attn_*=Q8_0'")
        t = type_name.strip().upper()
        if t not in writable:
            raise OptionValueError(f"--keep-type {shown(spec)}: unknown or unsupported tensor type {type_name!r} "
                              f"(choose from {', '.join(writable)})")
        tensor_glob(pattern.strip(), f"--keep-type {shown(spec)}")  # refused here, before any file is read
        out.append((pattern.strip(), GGMLType[t]))
    return out


# --- the float plan (convert)


def tensor_type(name: str, shape: tuple[int, ...], matrix_type: GGMLType,
                fallback: dict[str, str] = CONVERT_FALLBACK) -> tuple[GGMLType, str]:
    """The GGML type tensor ``name`` is stored as, with a note when it falls back."""
    name_of_type, note = storage_type(name, shape, matrix_type.name, fallback, BLOCK_OF)
    return GGMLType[name_of_type], note


def plan_tensor(t: DrafterTensor, ggml_type: GGMLType, note: str = "", *, copy: bool = False) -> PlannedTensor:
    """A PlannedTensor for ``t`` written as ``ggml_type`` (``copy``: bytes unchanged)."""
    ne = tuple(reversed(t.shape)) or (1,)
    return PlannedTensor(t, ggml_type, ne, tensor_nbytes(ggml_type, ne), COPY if copy else encoder(t.dtype, ggml_type), note)


def plan_tensors(d: Drafter, matrix_type: GGMLType) -> list[PlannedTensor]:
    """A PlannedTensor per drafter tensor at ``matrix_type``, fallbacks logged."""
    out = []
    for t in d.tensors:
        ggml_type, note = tensor_type(t.gguf_name, t.shape, matrix_type)
        if note:
            log.warning("%s: %s", t.gguf_name, note)
        out.append(plan_tensor(t, ggml_type, note))
    return out


# --- the quantized plan (quantize, convert --outtype TYPE)


def append_file_type(md: Metadata, file_type: int) -> None:
    """llama-quantize's place for the two keys: last, quantization version then file type, both UINT32."""
    md.set_raw(key("quantization_version"), ValueType.UINT32, QUANTIZATION_VERSION)
    md.set_raw(key("file_type"), ValueType.UINT32, file_type)


def quantized_metadata(source: Metadata, file_type: int) -> Metadata:
    """llama-quantize's key rule: keys copied in order, split.* dropped, quantization version and file type moved to the end."""
    md = Metadata()
    qv, ft = key("quantization_version"), key("file_type")
    for kv in source:
        if kv.key in (qv, ft) or kv.key.startswith(SPLIT_PREFIX):
            continue
        md.set_raw(kv.key, kv.vtype, kv.value, kv.sub)
    append_file_type(md, file_type)
    return md


def quantize_planned(planned: list[PlannedTensor], d: Drafter, ftype: FileType, *, keep_types: list[tuple[str, GGMLType]] = (),
                     allow_requantize: bool = False, where: Path | None = None,
                     options: QuantizeOptions | None = None) -> tuple[list[PlannedTensor], int]:
    """Re-plan tensors (as an F32/F16/BF16 file would hold them) for file type ``ftype``: types, order, encoders."""
    options = options or QuantizeOptions()
    imatrix = options.imatrix
    imatrix_names = [p.tensor.gguf_name for p in planned]  # remap_imatrix: a renumbered layer's entry is its old name
    if options.prune_layers:
        order = loader_order([p.tensor.gguf_name for p in planned])
        renamed = remap_layers([planned[i].tensor.gguf_name for i in order], list(options.prune_layers))
        imatrix_names = [p.tensor.gguf_name for p in planned if renamed[p.tensor.gguf_name] is not None]
        planned = [p if renamed[p.tensor.gguf_name] == p.tensor.gguf_name
                   else replace(p, tensor=replace(p.tensor, gguf_name=renamed[p.tensor.gguf_name]))
                   for p in planned if renamed[p.tensor.gguf_name] is not None]
    tensors = [(p.tensor.gguf_name, p.ne) for p in planned]
    in_types = [p.ggml_type.name for p in planned]
    requant = [n for (n, _), t in zip(tensors, in_types, strict=True) if t not in FLOAT_TYPE_NAMES and BLOCK_GEOMETRY[GGMLType[t]][0] > 1]
    try:
        _, choices = choose_quant_types(
            tensors, ftype.name, input_types=None if allow_requantize else in_types,
            n_layer=d.n_layers, n_head=d.n_head, n_head_kv=d.n_head_kv, overrides=options.types,
            has_imatrix=imatrix is not None)
    except NoFallback as e:
        raise DFlashError(f"{ftype.name}: {e}", where) from None
    except ValueError as e:
        raise DFlashError(f"{e}; the input is already quantized: quantize from the F16/BF16 file, or pass "
                          "--allow-requantize (quality suffers)", where) from None
    if requant and not allow_requantize:
        raise DFlashError(f"already quantized tensors ({', '.join(requant[:4])}{' ...' if len(requant) > 4 else ''}); "
                          "quantize from the F16/BF16 file, or pass --allow-requantize (quality suffers)", where)
    chosen = [GGMLType[t] if t != KEEP else GGMLType[src] for (t, _), src in zip(choices, in_types, strict=True)]
    needy = next(((n, t) for (n, _), t in zip(tensors, chosen, strict=True) if requires_imatrix(n, t, ftype.name)), None)
    if needy is not None and imatrix is None:  # llama-quantize's refusal, before anything is written
        raise DFlashError(f"{ftype.name} needs an importance matrix: {needy[0]} would be {needy[1].name}, which "
                          "llama-quantize refuses to write without --imatrix (the result would be garbage)", where)
    bare = next(((n, t) for i, ((n, ne), t) in enumerate(zip(tensors, chosen, strict=True)) if t.name in IMPORTANCE_REQUIRED
                 and (imatrix is None or imatrix.for_tensor(imatrix_names[i], ne) is None)), None)
    if bare is not None:  # exempt from that refusal, yet ggml asserts on them
        raise DFlashError(f"{bare[0]} would be {bare[1].name}, which ggml cannot quantize without an importance matrix "
                          "(llama-quantize aborts on it); choose another type for it", where)
    # the one per-tensor table (format/rules.py): fixed-type and vector tensors keep their type
    for i, (name, ne) in enumerate(tensors):
        if storage_class(name, tuple(reversed(ne))) in (FIXED, VECTOR) and chosen[i].name != in_types[i]:
            raise DFlashError(f"{name}: llama-quantize's choice {chosen[i].name} contradicts the storage table "
                              f"(a {storage_class(name, tuple(reversed(ne)))} tensor keeps {in_types[i]})", where)
    notes = [n for _, n in choices]
    fallbacks = sum(n.startswith(NOTE_FALLBACK) for n in notes)

    # --keep-type: only tensors llama-quantize quantizes (matrices) can be kept at another type
    for pattern, t in keep_types:
        matches = tensor_glob(pattern)
        hits = [i for i, (name, _) in enumerate(tensors) if matches(name) and not notes[i].startswith(NOTE_KEPT)]
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
    unported: list[tuple[str, GGMLType]] = []  # refused after every imatrix entry is checked
    for i in loader_order([n for n, _ in tensors]):
        p, new = planned[i], chosen[i]
        # llama-quantize writes ggml_n_dims dimensions: trailing 1s dropped (DSpark's conf_proj {E+R, 1} -> {E+R})
        ne = p.ne[:n_dims(p.ne)]
        if new == p.ggml_type:
            out.append(p if ne == p.ne else replace(p, ne=ne))
            continue
        first = p.encode
        importance = None if imatrix is None else imatrix.for_tensor(imatrix_names[i], p.ne)
        if importance is None and imatrix is not None and requires_imatrix(p.tensor.gguf_name, new, ftype.name):
            raise InputFileError(f"missing importance matrix for tensor {imatrix_names[i]} ({new.name}, a very low-bit "
                                 f"type): the file has no entry for it (llama-quantize refuses it too)", imatrix.path)
        if importance is not None and importance.size != p.ne[0]:  # per-expert slices: no 3-D drafter tensor has them
            raise DFlashError(f"{p.tensor.gguf_name}: an importance matrix per expert is not supported", where)
        if importance is not None and new in QUANTIZERS and not takes_importance(new):
            unported.append((p.tensor.gguf_name, new))
            continue
        step = encoder(p.ggml_type.name, new, row_length=p.ne[0], importance=importance)
        enc = step if first is COPY else (lambda raw, first=first, step=step: step(first(raw)))
        out.append(PlannedTensor(p.tensor, new, ne, tensor_nbytes(new, ne), enc, notes[i]))
    if unported:
        name, t = unported[0]
        raise DFlashError(f"{name}: the {t.name} quantizer has no importance-matrix path yet; quantize without --imatrix, "
                          "or exclude the tensor with --exclude-weights", where)
    return out, fallbacks
