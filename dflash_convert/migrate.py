"""migrate(): rewrite another fork's DFlash GGUF into upstream llama.cpp's ``dflash`` dialect.

Keys and tensor names renamed from format/dialects.py, tensor data streamed byte for byte through
the atomic writer, the output validated before it is renamed into place. The tapped layer ids are
offset where the dialect documents its convention; where the file cannot tell, migrate stops and
asks for ``--target-layers-offset``. It never guesses and never writes over its input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .drafter import DrafterTensor
from .errors import DFlashError
from .format.dialects import DROP, UPSTREAM_ARCH, Dialect
from .format.keys import GENERAL_PREFIX, I32_MAX, INT_TYPES, KEYS, TOKENIZER_PREFIX, U32_MAX, VALUE_TYPES, ValueType, key
from .format.rules import FC_TENSOR, MAX_LAYERS
from .format.tensors import LAYER_TEMPLATE, generic_name, gguf_to_hf, layer_of
from .metadata import Metadata
from .outputs import check_output_path
from .pipeline import ChunkPipeline
from .plan import plan_tensor
from .sources.gguf import ALIGNMENT_KEY, GGUFFile, GGUFTensor, GGUFValue, read_gguf
from .sources.target import read_target_gguf
from .terminal import human_size
from .tokenizer.from_gguf import copy_tokenizer_keys
from .validate.dialects import detect, layer_ids_key
from .validate.gate import ValidationGate
from .validate.report import Report, render_text
from .validate.semantics import required_tensor_names, tensor_role
from .write import write_gguf

_INTS = INT_TYPES
# the integer types upstream writes for a key (UINT32 scalars, INT32 arrays): a value converts losslessly when it fits
_INT_RANGE = {t: (VALUE_TYPES[t].lowest, VALUE_TYPES[t].highest) for t in (ValueType.UINT32, ValueType.INT32)}
# "{arch}.<suffix>" templates of KEYS, by suffix: generic hyper-parameters keep their suffix
_ARCH_SUFFIXES = {t[len("{arch}."):]: short for short, (t, _, _) in KEYS.items() if t.startswith("{arch}.")}


@dataclass
class MigrationPlan:
    """Everything ``migrate`` will write: the dialect found, the rewritten keys and the renamed tensors."""
    source: Path
    dialect: Dialect
    metadata: Metadata
    tensors: list[tuple[GGUFTensor, str]]  # input tensor, output name
    target_layers: list[int]
    notes: list[str] = field(default_factory=list)
    target_gguf: Path | None = None  # read for its tokenizer keys: never an output


@dataclass
class MigrationResult:
    """What ``migrate`` wrote: the plan, the output and its validate report."""
    plan: MigrationPlan
    output: Path
    report: Report

    def lines(self) -> list[str]:
        """The file written, its notes, and validate's verdict on it (every finding when it fails)."""
        plan = self.plan
        out = [f"wrote {self.output}: {plan.dialect.name} -> dflash, {len(plan.tensors)} tensors "
               f"({human_size(sum(t.nbytes for t, _ in plan.tensors))}) copied byte for byte",
               *(f"  {note}" for note in plan.notes)]
        if self.report.exit_code:
            return [*out, *render_text(self.report).splitlines()]
        n = self.report.counts()
        return [*out, f"validate: PASS ({n['warn']} warn, {n['pass']} pass)"]


def _refuse(msg: str, path: Path) -> DFlashError:
    return DFlashError(msg, path)


def _coerce(short: str, v: GGUFValue, name: str, notes: list[str]) -> tuple[ValueType, object, ValueType | None]:
    """The value with the type upstream writes, when the conversion is lossless; else unchanged."""
    _, vtype, sub = KEYS[short]
    if (v.vtype, v.sub) == (vtype, sub):
        return v.vtype, v.value, v.sub
    if vtype in _INT_RANGE and v.vtype in _INTS and _INT_RANGE[vtype][0] <= v.value <= _INT_RANGE[vtype][1]:
        notes.append(f"{name}: {v.vtype.name} -> {vtype.name}")
        return vtype, v.value, None
    if vtype == ValueType.FLOAT32 and v.vtype == ValueType.FLOAT64:
        notes.append(f"{name}: FLOAT64 -> FLOAT32")
        return vtype, float(v.value), None
    return v.vtype, v.value, v.sub


def _rename_tensor(name: str, d: Dialect) -> str:
    if name in d.tensor_map:
        return d.tensor_map[name]
    bid = layer_of(name)
    if bid is not None:
        pattern = LAYER_TEMPLATE + generic_name(name)
        if pattern in d.tensor_map:
            return d.tensor_map[pattern].format(bid=bid)
    return name


def _layer_ids(g: GGUFFile, d: Dialect, offset: int | None, explicit: list[int] | None, path: Path,
               notes: list[str]) -> list[int]:
    where = layer_ids_key(g, d)
    if where is None:
        if explicit is None:
            raise _refuse(f"the file ({d.title}) holds no target layer ids; pass --target-layers L1,L2,... with the "
                          "llama.cpp layer inputs the drafter taps (the checkpoint's dflash_config.target_layer_ids + 1)", path)
        notes.append(f"target_layers {explicit}: from --target-layers (the file holds none)")
        return explicit
    if explicit is not None:
        raise _refuse(f"the file holds layer ids ({where}); use --target-layers-offset, not --target-layers", path)
    v = g.metadata[where]
    if v.vtype != ValueType.ARRAY or v.sub not in _INTS or not len(v.value):
        raise _refuse(f"{where} is not a non-empty integer array", path)
    ids = [int(x) for x in v.value]
    if d.layer_offset is not None:
        if offset is not None and offset != d.layer_offset:
            raise _refuse(f"--target-layers-offset {offset} contradicts the {d.name} dialect, whose ids are upstream's minus "
                          f"{d.layer_offset} ({d.offset_evidence})", path)
        offset = d.layer_offset
        why = d.offset_evidence
    elif offset is None:
        raise _refuse(f"{where} = {ids}, but a {d.title} file cannot tell whether these index layer outputs (the "
                      "checkpoint's target_layer_ids, needing +1) or layer inputs (llama.cpp's convention, +0): "
                      f"{d.offset_evidence}. Pass --target-layers-offset 1 or 0; compare with the checkpoint's "
                      "config.json (dflash_config.target_layer_ids)", path)
    else:
        why = "from --target-layers-offset"
    out = [i + offset for i in ids]
    if any(i < 0 for i in out):
        raise _refuse(f"{where} = {ids} with offset {offset} gives negative layer ids", path)
    notes.append(f"target_layers {out} = {where} {ids} + {offset} ({why})")
    return out


def plan_migration(src: str | os.PathLike, *, target_layers_offset: int | None = None,
                   target_layers: list[int] | None = None, target_gguf: str | os.PathLike | None = None,
                   mask_token_id: int | None = None) -> MigrationPlan:
    """Read a foreign-dialect file and decide every output key and tensor name; writes nothing."""
    path = Path(src)
    if mask_token_id is not None and not 0 <= mask_token_id <= U32_MAX:
        raise DFlashError(f"--mask-token-id {mask_token_id} does not fit UINT32 (0 to {U32_MAX})")
    if target_layers is not None and not all(0 <= i <= I32_MAX for i in target_layers):
        raise DFlashError(f"--target-layers {target_layers}: each id must be in 0..{I32_MAX} (written as INT32)")
    if target_layers_offset is not None and target_layers_offset not in (0, 1):
        raise DFlashError(f"--target-layers-offset must be 0 or 1, got {target_layers_offset}")
    g = read_gguf(path)
    match = detect(g)
    if match.upstream:
        raise _refuse("already in llama.cpp's upstream dflash dialect; nothing to migrate (run dflash-convert validate)", path)
    d = match.dialect
    if d is None:
        raise _refuse(f"not a DFlash dialect migrate knows: {match.message}", path)
    if not d.migratable:
        raise _refuse(f"{d.title} files cannot be migrated: {d.not_migratable_because}; {d.fix}", path)
    notes: list[str] = [f"dialect: {d.title}"]
    prefix = f"{g.architecture}."
    ids = _layer_ids(g, d, target_layers_offset, target_layers, path, notes)

    general, hparams, tokenizer = Metadata(), Metadata(), Metadata()
    masks: dict[str, int] = {}
    dropped: list[str] = []
    for name, v in g.metadata.items():
        if v.vtype == ValueType.ARRAY and not len(v.value):
            dropped.append(f"{name} (an empty array)")
        elif name == key("architecture"):
            general.set_raw(name, ValueType.STRING, UPSTREAM_ARCH)
        elif name == ALIGNMENT_KEY:
            dropped.append(f"{name} (the output uses the default alignment)")
        elif name.startswith(GENERAL_PREFIX):
            general.set_raw(name, v.vtype, v.value, v.sub)
        elif name.startswith(TOKENIZER_PREFIX):
            if name == key("mask_token_id") and v.vtype in _INTS:
                masks[name] = v.value
            else:
                tokenizer.set_raw(name, v.vtype, v.value, v.sub)
        elif name.startswith(prefix):
            suffix = name[len(prefix):]
            short = d.key_map.get(suffix, _ARCH_SUFFIXES.get(suffix))
            if short == "target_layers":
                continue  # written below, from _layer_ids
            if short == "mask_token_id":
                if v.vtype not in _INTS:
                    raise _refuse(f"{name} is {v.vtype.name}, not an integer", path)
                masks[name] = v.value
            elif short is None or short == DROP:
                dropped.append(name)
            else:
                hparams.set_raw(key(short), *_coerce(short, v, name, notes))
        else:
            dropped.append(name)
    hparams.set("target_layers", ids)
    if mask_token_id is not None:
        masks["--mask-token-id"] = mask_token_id
    if len(set(masks.values())) > 1:
        raise _refuse(f"conflicting mask token ids: {masks}", path)
    if not masks:
        raise _refuse("the file holds no mask token id; pass --mask-token-id N (the checkpoint's "
                      "dflash_config.mask_token_id)", path)
    mask = next(iter(masks.values()))
    if target_gguf is not None:
        tokenizer = Metadata()
        copy_tokenizer_keys(read_target_gguf(target_gguf), tokenizer)
        tokenizer.remove(key("mask_token_id"))
        notes.append(f"tokenizer: every tokenizer.* key copied from {target_gguf}")
    elif key("tok_tokens") not in tokenizer:
        raise _refuse(f"the file carries no vocabulary ({key('tok_tokens')}); pass --target-gguf TARGET.gguf to copy "
                      "the target's tokenizer", path)
    tokenizer.set("mask_token_id", mask)
    if dropped:
        notes.append(f"dropped keys upstream does not read: {', '.join(dropped)}")

    md = Metadata()
    for part in (general, hparams, tokenizer):
        for kv in part:
            md.set_raw(kv.key, kv.vtype, kv.value, kv.sub)

    n_layer = hparams.get(key("block_count"))
    if not isinstance(n_layer, int) or not 0 < n_layer <= MAX_LAYERS:
        raise _refuse(f"{prefix}block_count is missing or not in 1..{MAX_LAYERS}", path)
    tensors: list[tuple[GGUFTensor, str]] = []
    seen: dict[str, str] = {}
    renamed = []
    for t in g.tensors:
        new = _rename_tensor(t.name, d)
        if new in seen:
            raise _refuse(f"tensors {seen[new]!r} and {t.name!r} would both become {new!r}; which one llama.cpp should "
                          "use is ambiguous", path)
        seen[new] = t.name
        if new != t.name:
            renamed.append(f"{t.name} -> {new}")
        tensors.append((t, new))
    stray = [old for new, old in seen.items() if tensor_role(new, n_layer) is None]
    if stray:
        raise _refuse(f"tensors upstream dflash does not load and migrate cannot map: {', '.join(stray[:8])}", path)
    missing = [n for n in required_tensor_names(n_layer) if n not in seen]
    if missing:
        raise _refuse(f"required tensors missing: {', '.join(missing[:8])}", path)
    _check_fc(g, d, hparams, ids, seen, path)
    if renamed:
        notes.append(f"renamed tensors: {_summarise(renamed)}")
    return MigrationPlan(path, d, md, tensors, ids, notes, Path(target_gguf) if target_gguf is not None else None)


def _summarise(items: list[str], limit: int = 4) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _check_fc(g: GGUFFile, d: Dialect, hparams: Metadata, ids: list[int], seen: dict[str, str], path: Path) -> None:
    E = hparams.get(key("embedding_length"))
    fc = g.tensor(seen.get(FC_TENSOR, ""))
    if fc is None or not isinstance(E, int) or E <= 0:
        return
    want = (len(ids) * E, E)
    if fc.ne != want:
        raise _refuse(f"{FC_TENSOR} has shape {list(fc.ne)} but {len(ids)} taps of hidden {E} need {list(want)}: the layer "
                      "ids and the weights disagree", path)
    for suffix in d.width_keys:
        v = g.metadata.get(f"{g.architecture}.{suffix}")
        if v is not None and v.vtype in _INTS and v.value != len(ids) * E:
            raise _refuse(f"{g.architecture}.{suffix} = {v.value} but {len(ids)} taps of hidden {E} give {len(ids) * E}", path)


def _write(plan: MigrationPlan, out: Path, *, force: bool) -> tuple[Path, Report]:
    # the one streaming pipeline, with GGUF tensors as sources and bytes copied unchanged
    planned = [plan_tensor(DrafterTensor(new, gguf_to_hf(new) or new, t), t.ggml_type, copy=True) for t, new in plan.tensors]
    gate = ValidationGate(out)
    with ChunkPipeline() as pipeline:
        write_gguf(out, plan.metadata, pipeline.out_tensors(planned), progress=False, verify=gate, replace=force)
    assert gate.report is not None
    return out, gate.report


def migrate(src: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, target_layers_offset: int | None = None,
            target_layers: list[int] | None = None, target_gguf: str | os.PathLike | None = None,
            mask_token_id: int | None = None) -> MigrationResult:
    """Rewrite ``src`` (another fork's dialect) as an upstream dflash GGUF at ``out``, validated before the rename."""
    inputs = [src, *([target_gguf] if target_gguf is not None else [])]
    out = check_output_path(out, inputs, force=force)  # before anything is read
    plan = plan_migration(src, target_layers_offset=target_layers_offset, target_layers=target_layers,
                          target_gguf=target_gguf, mask_token_id=mask_token_id)
    written, report = _write(plan, out, force=force)
    return MigrationResult(plan, written, report)
