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

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from .drafter import Drafter
from .errors import InputFileError
from .format.file_types import QUANT_TYPES
from .format.ggml import GGMLType
from .format.quant_types import FTYPES
from .metadata import Metadata
from .outputs import check_output_path
from .pipeline import ChunkPipeline, PlannedTensor
from .plan import parse_ftype, parse_keep_types, plan_tensor, quantize_planned, quantized_metadata
from .sources.gguf import read_gguf
from .sources.gguf_drafter import drafter_from_gguf
from .validate.gate import ValidationGate, require_valid_input
from .write import write_gguf

log = logging.getLogger("dflash_convert")


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
    validated: bool = True  # False (--skip-validation): neither the input nor the output is validated

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


SKIP_VALIDATION_FLAG = "--skip-validation"


def plan_quantize(src: str | os.PathLike, out: str | os.PathLike, qtype: str, *, keep_types: list[str] | None = None,
                  allow_requantize: bool = False, validate: bool = True) -> QuantizePlan:
    """Read and decide everything; writes nothing.

    ``validate`` (the default): an input that fails validate is refused; ``validate=False``
    (--skip-validation) goes ahead, and the plan's output is then written unvalidated too, with a warning.
    """
    path = Path(src)
    check_output_path(out, [path], force=True)  # never the input, checked before anything is read
    ftype = parse_ftype(qtype)
    keep = parse_keep_types(keep_types or [])
    g = read_gguf(path)
    d = drafter_from_gguf(g, strict=True)
    if validate:
        require_valid_input(path, SKIP_VALIDATION_FLAG)
    else:
        log.warning("%s: %s: the input is not validated and %s is written without validation; llama.cpp may refuse "
                    "or mis-run it", path, SKIP_VALIDATION_FLAG, out)
    for t in d.tensors:
        if t.dtype not in GGMLType.__members__:
            raise InputFileError(f"tensor {t.gguf_name} has unknown type {t.dtype}", path)
    source_plan = [plan_tensor(t, GGMLType[t.dtype], copy=True) for t in d.tensors]
    file_type, planned, fallbacks = quantize_planned(source_plan, d, ftype, keep_types=keep,
                                                     allow_requantize=allow_requantize, where=path)
    md = Metadata()
    for name, v in g.metadata.items():
        md.set_raw(name, v.vtype, v.value, v.sub)
    plan = QuantizePlan(path, Path(out), ftype, file_type, quantized_metadata(md, file_type), planned, d, fallbacks,
                        validated=validate)
    if fallbacks:
        plan.notes.append(f"{fallbacks} of {len(planned)} tensor(s) required fallback quantization")
    return plan


def write_quantize(plan: QuantizePlan, *, force: bool = False, progress: bool = True, threads: int | None = None) -> Path:
    check_output_path(plan.output, [plan.source], force=force)
    with ChunkPipeline(workers=threads) as pipeline:
        write_gguf(plan.output, plan.metadata, pipeline.out_tensors(plan.tensors), progress=progress, replace=force,
                   verify=ValidationGate(plan.output) if plan.validated else None)
    return plan.output


def quantize(src: str | os.PathLike, out: str | os.PathLike, qtype: str, *, keep_types: list[str] | None = None,
             allow_requantize: bool = False, force: bool = False, dry_run: bool = False, threads: int | None = None,
             progress: bool = False, validate: bool = True) -> QuantizePlan:
    """Quantize a dflash GGUF to ``qtype`` (a llama-quantize type name). Returns the plan.

    An input that fails validate is refused, and so is an output that would (``validate=False`` skips both)."""
    plan = plan_quantize(src, out, qtype, keep_types=keep_types, allow_requantize=allow_requantize, validate=validate)
    if not dry_run:
        write_quantize(plan, force=force, progress=progress, threads=threads)
    return plan


__all__ = ["FTYPES", "QUANT_TYPES", "QuantizePlan", "plan_quantize", "quantize", "write_quantize"]
