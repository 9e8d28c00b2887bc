"""quantize(): a dflash GGUF in, the same drafter in another type out, bit-identical to llama-quantize.

``read_drafter`` gives the Drafter and its GGUF tensor sources; ``format.quant_types`` decides each
tensor's type exactly as llama-quantize does for arch ``dflash`` (mixes, output rule, fallbacks),
``--keep-type`` overrides it for chosen tensors; the encoders of ``encoders/`` (numpy, bit-exact
with ggml's reference quantizers) run in the one streaming pipeline, and the atomic writer
writes the file. Keys are copied as llama-quantize copies them; tensors go out in its order.

The same plan applies on top of a conversion (``convert --outtype Q4_K_M``): see
``plan.quantize_planned``, which both use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .drafter import Drafter
from .errors import DFlashError, InputFileError
from .format.file_types import QUANT_TYPES
from .format.ggml import GGMLType
from .format.quant_types import FTYPES, TypeOverrides
from .metadata import Metadata
from .outputs import check_output_path
from .pipeline import ChunkPipeline, PlannedTensor
from .plan import (
    QuantizeOptions,
    apply_kv_overrides,
    parse_ftype,
    parse_ggml_type,
    parse_keep_types,
    parse_kv_override,
    parse_prune_layers,
    parse_tensor_types,
    plan_tensor,
    quantize_planned,
    quantized_metadata,
    read_tensor_type_file,
)
from .sources.gguf import read_gguf
from .sources.gguf_drafter import drafter_from_gguf
from .validate.gate import ValidationGate
from .write import write_gguf


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
    options: QuantizeOptions = field(default_factory=QuantizeOptions)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def quantize_options(*, keep_types: list[str] | None = None, allow_requantize: bool = False,
                     tensor_types: list[str] | None = None, tensor_type_file: str | os.PathLike | None = None,
                     output_tensor_type: str | None = None, token_embedding_type: str | None = None,
                     leave_output_tensor: bool = False, pure: bool = False, override_kv: list[str] | None = None,
                     prune_layers: str | None = None, file_position: int | None = None) -> QuantizeOptions:
    """llama-quantize's flags (and our --keep-type glob shorthand), parsed; one error line for a bad one.
    llama-quantize collects --tensor-type items and the file's in command-line order: the file's items
    go after the first ``file_position`` --tensor-type items (default: after all of them)."""
    patterns = parse_tensor_types(tensor_types or [])
    if tensor_type_file is not None:
        at = len(patterns) if file_position is None else max(0, min(file_position, len(patterns)))
        patterns[at:at] = read_tensor_type_file(tensor_type_file)
    types = TypeOverrides(
        tensor_types=tuple(patterns),
        output_tensor_type=None if output_tensor_type is None else parse_ggml_type(output_tensor_type, "--output-tensor-type"),
        token_embedding_type=None if token_embedding_type is None
        else parse_ggml_type(token_embedding_type, "--token-embedding-type"),
        leave_output_tensor=leave_output_tensor, pure=pure)
    return QuantizeOptions(types=types, keep_types=tuple(parse_keep_types(keep_types or [])),
                           kv_overrides=tuple(parse_kv_override(s) for s in (override_kv or [])),
                           prune_layers=tuple(parse_prune_layers(prune_layers)) if prune_layers is not None else (),
                           allow_requantize=allow_requantize)


def plan_quantize(src: str | os.PathLike, out: str | os.PathLike, qtype: str, *, keep_types: list[str] | None = None,
                  allow_requantize: bool = False, options: QuantizeOptions | None = None) -> QuantizePlan:
    """Read and decide everything; writes nothing. ``options`` (``quantize_options``) replaces
    ``keep_types`` / ``allow_requantize`` when given."""
    path = Path(src)
    check_output_path(out, [path], force=True)  # never the input, checked before anything is read
    ftype = parse_ftype(qtype)
    if options is None:
        options = quantize_options(keep_types=keep_types, allow_requantize=allow_requantize)
    g = read_gguf(path)
    d = drafter_from_gguf(g, strict=True)
    for t in d.tensors:
        if t.dtype not in GGMLType.__members__:
            raise InputFileError(f"tensor {t.gguf_name} has unknown type {t.dtype}", path)
    if options.prune_layers and set(range(d.n_layers)) <= set(options.prune_layers):
        raise DFlashError(f"--prune-layers {','.join(map(str, options.prune_layers))} removes every layer of the drafter's "
                          f"{d.n_layers}", path)
    source_plan = [plan_tensor(t, GGMLType[t.dtype], copy=True) for t in d.tensors]
    try:
        file_type, planned, fallbacks = quantize_planned(source_plan, d, ftype, keep_types=list(options.keep_types),
                                                         allow_requantize=options.allow_requantize, where=path, options=options)
    except ValueError as e:  # a type given for a tensor that its rows do not fit
        raise DFlashError(str(e), path) from None
    md = Metadata()
    for name, v in g.metadata.items():
        md.set_raw(name, v.vtype, v.value, v.sub)
    md = apply_kv_overrides(quantized_metadata(md, file_type), options, d.n_layers)
    plan = QuantizePlan(path, Path(out), ftype, file_type, md, planned, d, fallbacks, options=options)
    if fallbacks:
        plan.notes.append(f"{fallbacks} of {len(planned)} tensor(s) required fallback quantization")
    return plan


def write_quantize(plan: QuantizePlan, *, force: bool = False, progress: bool = True, threads: int | None = None) -> Path:
    """Write the planned file. With --override-kv or --prune-layers it is validated before it is renamed
    into place: a key or layer llama.cpp would refuse is refused here instead of written."""
    check_output_path(plan.output, [plan.source], force=force)
    verify = ValidationGate(plan.output) if plan.options.rewrites_file else None
    with ChunkPipeline(workers=threads) as pipeline:
        write_gguf(plan.output, plan.metadata, pipeline.out_tensors(plan.tensors), progress=progress, replace=force,
                   verify=verify)
    return plan.output


def quantize(src: str | os.PathLike, out: str | os.PathLike, qtype: str, *, keep_types: list[str] | None = None,
             allow_requantize: bool = False, force: bool = False, dry_run: bool = False, threads: int | None = None,
             progress: bool = False, options: QuantizeOptions | None = None) -> QuantizePlan:
    """Quantize a dflash GGUF to ``qtype`` (a llama-quantize type name). Returns the plan."""
    plan = plan_quantize(src, out, qtype, keep_types=keep_types, allow_requantize=allow_requantize, options=options)
    if not dry_run:
        write_quantize(plan, force=force, progress=progress, threads=threads)
    return plan


__all__ = ["FTYPES", "QUANT_TYPES", "QuantizePlan", "plan_quantize", "quantize", "quantize_options", "write_quantize"]
