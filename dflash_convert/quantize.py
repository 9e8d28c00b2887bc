"""quantize(): a dflash GGUF in, the same drafter in another type out, bit-identical to llama-quantize.

Types as llama-quantize decides them for arch ``dflash`` (plus ``--keep-type``), written through the
one streaming pipeline in llama-quantize's order. Specification: docs/quantize.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .drafter import Drafter
from .errors import DFlashError, InputFileError, OptionValueError
from .format.family import DSPARK, member_of
from .format.file_names import quantized_file_name
from .format.file_types import FILE_TYPES, QUANT_TYPES
from .format.ggml import GGMLType, tensor_nbytes
from .format.keys import CHOSEN_KEYS, CHOSEN_TENSOR_TYPE, key
from .format.quant_types import DEFAULT_SWEEP_TYPES, FTYPES, RAISE_LADDER, TypeOverrides, requires_imatrix
from .metadata import Metadata
from .outputs import TemporaryOutput, check_output_path
from .pipeline import ChunkPipeline
from .plan import (
    PlannedTensor,
    QuantizeOptions,
    apply_kv_overrides,
    load_importance,
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
from .runtime.counts import LoopCount
from .sources.features import open_measurement
from .sources.gguf import read_gguf
from .sources.gguf_drafter import drafter_from_gguf
from .terminal import human_size
from .validate.gate import ValidationGate, require_valid_input
from .write import write_gguf

log = logging.getLogger("dflash_convert")


@dataclass
class QuantizePlan:
    """Everything ``quantize`` will write, computed before writing: the keys, the per-tensor types, the options."""
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
    validated: bool = True  # False (--skip-validation): neither the input nor the output is validated

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data the output will hold."""
        return sum(t.nbytes for t in self.tensors)

    def dry_run_lines(self) -> list[str]:
        """quantize --dry-run: every tensor's shape, type before and after, and size; the notes; the total."""
        out = [f"{self.source} -> {self.output}: {self.ftype} ({key('file_type')} {self.file_type})"]
        by_name = {t.gguf_name: t for t in self.drafter.tensors}
        for p in self.tensors:
            why = f"  ({p.note})" if p.note and p.note.startswith(("fallback", "--")) else ""
            out.append(f"  {p.tensor.gguf_name:<32} {'x'.join(map(str, p.ne)):<14} {by_name[p.tensor.gguf_name].dtype:<5} "
                       f"-> {p.ggml_type.name:<6} {human_size(p.nbytes):>10}{why}")
        return [*out, *(f"  {note}" for note in self.notes), f"total {human_size(self.total_bytes)}; dry run: nothing written"]

    def written_lines(self) -> list[str]:
        """What quantize prints once the file is in place: its notes, then the file."""
        return [*(f"note: {note}" for note in self.notes),
                f"wrote {self.output} ({len(self.tensors)} tensors, {human_size(self.total_bytes)} of data, {self.ftype})"]


def quantize_options(*, keep_types: list[str] | None = None, allow_requantize: bool = False,
                     tensor_types: list[str] | None = None, tensor_type_file: str | os.PathLike | None = None,
                     output_tensor_type: str | None = None, token_embedding_type: str | None = None,
                     leave_output_tensor: bool = False, pure: bool = False, override_kv: list[str] | None = None,
                     prune_layers: str | None = None, file_position: int | None = None, imatrix: str | None = None,
                     include_weights: list[str] | None = None, exclude_weights: list[str] | None = None) -> QuantizeOptions:
    """llama-quantize's flags (and our --keep-type glob shorthand), parsed; one error line for a bad one.

    The --tensor-type-file items go after the first ``file_position`` --tensor-type items (command-line order)."""
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
    if (include_weights or exclude_weights) and imatrix is None:
        raise OptionValueError("--include-weights and --exclude-weights filter the --imatrix file; give one")
    matrix, imatrix_kv = load_importance(imatrix, include_weights, exclude_weights) if imatrix is not None else (None, ())
    return QuantizeOptions(types=types, keep_types=tuple(parse_keep_types(keep_types or [])),
                           kv_overrides=tuple(parse_kv_override(s) for s in (override_kv or [])) + imatrix_kv,
                           prune_layers=tuple(parse_prune_layers(prune_layers)) if prune_layers is not None else (),
                           allow_requantize=allow_requantize, imatrix=matrix)


SKIP_VALIDATION_FLAG = "--skip-validation"


def plan_quantize(src: str | os.PathLike, out: str | os.PathLike, qtype: str, *, keep_types: list[str] | None = None,
                  allow_requantize: bool = False, options: QuantizeOptions | None = None,
                  validate: bool = True) -> QuantizePlan:
    """Read and decide everything; writes nothing (``options`` replaces ``keep_types`` / ``allow_requantize``)."""
    path = Path(src)
    into_folder = os.path.isdir(out)  # OUT a folder: -hf's file name in it
    inputs = [path] + ([options.imatrix.path] if options is not None and options.imatrix is not None else [])
    if not into_folder:
        check_output_path(out, inputs, force=True)  # never an input, checked before anything is read
    ftype = FILE_TYPES[parse_ftype(qtype)]  # the one row: its name, its general.file_type
    if options is None:
        options = quantize_options(keep_types=keep_types, allow_requantize=allow_requantize)
    g = read_gguf(path)
    d = drafter_from_gguf(g, strict=True)
    if into_folder:
        dspark = member_of({t.gguf_name for t in d.tensors}) == DSPARK
        out = Path(out) / quantized_file_name(path.name, ftype.name, dspark=dspark)
        check_output_path(out, inputs, force=True)
    if validate:
        require_valid_input(path, SKIP_VALIDATION_FLAG, parsed=g)  # the file read above, not parsed again
    else:
        log.warning("%s: %s: the input is not validated and %s is written without validation; llama.cpp may refuse "
                    "or mis-run it", path, SKIP_VALIDATION_FLAG, out)
    for t in d.tensors:
        if t.dtype not in GGMLType.__members__:
            raise InputFileError(f"tensor {t.gguf_name} has unknown type {t.dtype}", path)
    missing = [i for i in options.prune_layers if i >= d.n_layers]
    if missing:  # llama-quantize ignores such a number; a typo would then prune nothing, silently
        raise OptionValueError(f"--prune-layers {','.join(map(str, options.prune_layers))}: the drafter has {d.n_layers} "
                            f"layer(s), 0..{d.n_layers - 1}; there is no layer {', '.join(map(str, missing))}", path)
    if options.prune_layers and set(range(d.n_layers)) <= set(options.prune_layers):
        raise DFlashError(f"--prune-layers {','.join(map(str, options.prune_layers))} removes every layer of the drafter's "
                          f"{d.n_layers}", path)
    source_plan = [plan_tensor(t, GGMLType[t.dtype], copy=True) for t in d.tensors]
    try:
        planned, fallbacks = quantize_planned(source_plan, d, ftype, keep_types=list(options.keep_types),
                                              allow_requantize=options.allow_requantize, where=path, options=options)
    except ValueError as e:  # a type given for a tensor that its rows do not fit
        raise DFlashError(str(e), path) from None
    md = Metadata()
    for name, v in g.metadata.items():
        md.set_raw(name, v.vtype, v.value, v.sub)
    md = apply_kv_overrides(quantized_metadata(md, ftype.value), options, d.n_layers)
    plan = QuantizePlan(path, Path(out), ftype.name, ftype.value, md, planned, d, fallbacks, options=options, validated=validate)
    if fallbacks:
        plan.notes.append(f"{fallbacks} of {len(planned)} tensor(s) required fallback quantization")
    return plan


def write_quantize(plan: QuantizePlan, *, force: bool = False, progress: bool = True, threads: int | None = None) -> Path:
    """Write the planned file, validated before the rename (unless --skip-validation)."""
    imatrix = plan.options.imatrix
    check_output_path(plan.output, [plan.source] + ([imatrix.path] if imatrix is not None else []), force=force)
    with ChunkPipeline(workers=threads) as pipeline:
        write_gguf(plan.output, plan.metadata, pipeline.out_tensors(plan.tensors), progress=progress, replace=force,
                   verify=ValidationGate(plan.output) if plan.validated else None)
    return plan.output


def quantize(src: str | os.PathLike, out: str | os.PathLike, qtype: str, *, keep_types: list[str] | None = None,
             allow_requantize: bool = False, force: bool = False, dry_run: bool = False, threads: int | None = None,
             progress: bool = False, options: QuantizeOptions | None = None, validate: bool = True) -> QuantizePlan:
    """Quantize a dflash GGUF to ``qtype`` (a llama-quantize type name). Returns the plan."""
    plan = plan_quantize(src, out, qtype, keep_types=keep_types, allow_requantize=allow_requantize, options=options,
                         validate=validate)
    if not dry_run:
        write_quantize(plan, force=force, progress=progress, threads=threads)
    return plan


# --- choosing by acceptance: the sweep, and the smallest mix that keeps a fraction of it

RAISE_TOP = RAISE_LADDER[-1].name


@dataclass
class SweepRow:
    """One type of a sweep: its sizes and its acceptance."""
    file_type: str
    file_bytes: int
    tensor_bytes: int
    bits_per_weight: float  # 8 * tensor bytes / tensor elements
    loop: LoopCount | None  # the live loop's count on every captured sequence; None: the type needs an imatrix
    pareto: bool = False  # no other row is as small and accepts as much, one of them strictly
    baseline: bool = False  # the input file itself
    with_imatrix: SweepRow | None = None  # sweep --imatrix: the same type quantized with the imatrix

    def as_dict(self) -> dict[str, Any]:
        """The row's sizes and counts as ``sweep --json`` prints them (counts null where the type needs an imatrix)."""
        lp = self.loop
        return {"type": self.file_type, "file_bytes": self.file_bytes, "tensor_bytes": self.tensor_bytes,
                "bits_per_weight": self.bits_per_weight, "n_drafted": lp and lp.n_drafted, "n_accept": lp and lp.n_accept,
                "accept": lp and lp.accept, "steps": lp and lp.steps, "mean_accepted_per_step": lp and lp.mean_accepted, "pareto": self.pareto,
                "input": self.baseline, "needs_imatrix": lp is None}


@dataclass
class SweepReport:
    """``sweep``'s result: one row per type, with the Pareto front, rendered as text or JSON."""
    source: Path
    features: str
    n_max: int
    new_tokens: int
    sequences: int
    numerics: str
    rows: list[SweepRow] = field(default_factory=list)
    imatrix: str | None = None  # sweep --imatrix: the file, as given

    def to_json(self) -> str:
        """The sweep as ``sweep --json`` prints it."""
        return json.dumps(self.to_dict(), indent=2)

    def to_dict(self) -> dict[str, Any]:
        """The sweep as the JSON object of ``sweep --json``."""
        rows = [r.as_dict() | ({"imatrix": r.with_imatrix and r.with_imatrix.as_dict()} if self.imatrix else {})
                for r in self.rows]
        return {"schema": SWEEP_SCHEMA, "source": str(self.source), "features": self.features, "n_max": self.n_max,
                "new_tokens": self.new_tokens, "sequences": self.sequences, "numerics": self.numerics,
                "imatrix": self.imatrix, "rows": rows}

    def render_text(self) -> str:
        """The sweep as a text table, the Pareto front marked with ``*``."""
        head = f"  {'type':<8} {'file bytes':>12} {'tensor bytes':>13} {'bpw':>6} {'accept':>14} {'per step':>9}  pareto"
        lines = [f"sweep: {self.source} on {self.sequences} sequences of {self.features}, llama-speculative-simple's "
                 f"greedy loop with --spec-draft-n-max {self.n_max} -n {self.new_tokens} ({self.numerics} numerics)"
                 + (f"; with imatrix {self.imatrix}" if self.imatrix else ""),
                 head + (f"  | imatrix: {'tensor bytes':>13} {'accept':>8} {'per step':>9}  pareto" if self.imatrix else "")]
        for r in self.rows:
            lp = r.loop
            got = f"{lp.accept * 100:>13.2f}% {lp.mean_accepted:>9.2f}" if lp else f"{'needs imatrix':>14} {'':>9}"
            line = (f"  {r.file_type + (' (in)' if r.baseline else ''):<8} {r.file_bytes:>12} {r.tensor_bytes:>13} "
                    f"{r.bits_per_weight:>6.2f} {got}  {'*' if r.pareto else '':<6}")
            w = r.with_imatrix
            if w is not None and w.loop is not None:
                line += (f"  | {'':>8} {w.tensor_bytes:>13} {w.loop.accept * 100:>7.2f}% {w.loop.mean_accepted:>9.2f}  "
                         f"{'*' if w.pareto else ''}")
            lines.append(line.rstrip())
        lines.append("  accept = n_accept / n_drafted; per step = drafted tokens accepted per verification; "
                     "* = on the Pareto front (nothing smaller accepts as much)"
                     + ("; each column's front among its own files and the input" if self.imatrix else ""))
        return "\n".join(lines)


SWEEP_SCHEMA = "dflash-convert/sweep/v1"


def pareto_rows(rows: list[SweepRow]) -> list[SweepRow]:
    """The measured rows no other row dominates (as small or smaller and accepting as much or more, one strictly)."""
    rows = [r for r in rows if r.loop is not None]
    return [r for r in rows if not any(o is not r and o.tensor_bytes <= r.tensor_bytes and o.loop.accept >= r.loop.accept
                                       and (o.tensor_bytes < r.tensor_bytes or o.loop.accept > r.loop.accept) for o in rows)]


def mark_pareto(rows: list[SweepRow]) -> None:
    """Mark the rows on the Pareto front."""
    front = pareto_rows(rows)
    for r in rows:
        r.pareto = any(r is f for f in front)


def imatrix_curve(report: SweepReport) -> list[SweepRow]:
    """sweep --imatrix's second column with the input: the files quantized with the imatrix."""
    return [r for r in report.rows if r.baseline] + [r.with_imatrix for r in report.rows if r.with_imatrix is not None]


def mark_pareto_both(report: SweepReport) -> None:
    """Each column's front: the plain files with the input, the imatrix files with the input (the input marked by the first)."""
    mark_pareto(report.rows)
    front = pareto_rows(imatrix_curve(report))
    for r in report.rows:
        if r.with_imatrix is not None:
            r.with_imatrix.pareto = any(r.with_imatrix is f for f in front)


def needs_imatrix(plan: QuantizePlan) -> bool:
    """Whether llama-quantize refuses this plan's file without an imatrix (a tensor of a type that requires one)."""
    return any(requires_imatrix(p.tensor.gguf_name, p.ggml_type, plan.ftype) for p in plan.tensors)


def sweep(src: str | os.PathLike, features: str | os.PathLike, types: list[str] | tuple[str, ...] = DEFAULT_SWEEP_TYPES, *,
          target_model_dir: str | os.PathLike | None = None, target_gguf: str | os.PathLike | None = None,
          device: str = "auto", numerics: str = "cpu", threads: int | None = None,
          log: Callable[[str], None] | None = None, allow_other_target: bool = False,
          imatrix: str | None = None) -> SweepReport:
    """Quantize ``src`` to each type (temporary files), measure each file's and the input's acceptance; Pareto front marked."""
    ftypes = [parse_ftype(t) for t in types]
    if not ftypes:
        raise DFlashError("--types names no type")
    with_im = quantize_options(imatrix=imatrix) if imatrix is not None else None
    m = open_measurement(features, target_model_dir=target_model_dir, target_gguf=target_gguf, numerics=numerics,
                         allow_other_target=allow_other_target)
    feats, target, like_cpu = m.features, m.target, m.like_cpu
    tmp_out = Path(tempfile.gettempdir()) / "sweep.gguf"
    d = plan_quantize(src, tmp_out, ftypes[0], options=with_im).drafter  # reads and checks the input
    if with_im is not None:  # every type planned with it first: an entry that does not fit is refused before measuring
        for ftype in ftypes:
            plan_quantize(src, tmp_out, ftype, options=with_im)
    n_max = d.block_size - 1
    feats.check_drafter(d, src, n_max)
    # torch, only for the commands that run a drafter, once every input is read
    from .mix_search import file_acceptance
    from .runtime.device import resolve_device

    dev = resolve_device(device)
    say = log or (lambda line: None)
    report = SweepReport(Path(src), str(features), n_max, feats.new_tokens, len(feats.sequences), numerics,
                         imatrix=None if imatrix is None else str(imatrix))
    elements = sum(math.prod(t.shape) for t in d.tensors)
    loop = file_acceptance(src, target, feats, n_max, device=dev, like_cpu=like_cpu)
    in_bytes = sum(tensor_nbytes(GGMLType[t.dtype], tuple(reversed(t.shape)) or (1,)) for t in d.tensors)
    report.rows.append(SweepRow(d.type_name, Path(src).stat().st_size, in_bytes, 8 * in_bytes / elements,
                                loop, baseline=True))
    say(f"  {report.rows[-1].file_type} (input): accept {loop.accept:.4f}")
    with tempfile.TemporaryDirectory(prefix="dflash-convert-sweep-") as tmp:
        def measured(ftype: str, options: QuantizeOptions | None) -> SweepRow:
            out = Path(tmp) / f"{ftype}.gguf"
            plan = plan_quantize(src, out, ftype, options=options)
            write_quantize(plan, progress=False, threads=threads)
            loop = file_acceptance(out, target, feats, n_max, device=dev, like_cpu=like_cpu)
            row = SweepRow(ftype, out.stat().st_size, plan.total_bytes, 8 * plan.total_bytes / elements, loop)
            out.unlink()
            say(f"  {ftype}{' with imatrix' if options is not None else ''}: {plan.total_bytes} tensor bytes, "
                f"accept {loop.accept:.4f}")
            return row

        for ftype in ftypes:
            if with_im is None:
                report.rows.append(measured(ftype, None))
                continue
            w = measured(ftype, with_im)
            needy = needs_imatrix(plan_quantize(src, Path(tmp) / "plan.gguf", ftype, options=with_im))
            # llama-quantize refuses it without: the imatrix file's sizes, no count ("needs imatrix")
            row = replace(w, loop=None) if needy else measured(ftype, None)
            row.with_imatrix = w
            report.rows.append(row)
    mark_pareto_both(report) if with_im is not None else mark_pareto(report.rows)
    return report


def plot_sweep_ready() -> None:
    """One error line now, not after the measuring, when the optional plotting extra is missing."""
    try:
        import matplotlib  # noqa: F401  (optional: pip install 'dflash-convert[plot]')
    except ImportError:
        raise DFlashError("--plot needs matplotlib, which is not installed: pip install 'dflash-convert[plot]'") from None


def plot_sweep(report: SweepReport, out: str | os.PathLike, *, force: bool = False) -> Path:
    """Acceptance against tensor bytes, one point per type, the Pareto front joined, as a PNG."""
    try:
        import matplotlib  # optional: pip install 'dflash-convert[plot]'
    except ImportError:
        raise DFlashError("--plot needs matplotlib, which is not installed: pip install 'dflash-convert[plot]'") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # the optional plotting extra, once the backend is set

    path = check_output_path(out, [report.source, Path(report.features)], force=force)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    # (label, colour, rows, line width, marker size, label offset): a type the imatrix leaves unchanged puts both
    # curves on the same points, so the first is drawn wider beneath the second and labelled above it, not hidden
    curves = [("Pareto front", "tab:red", [r for r in report.rows if r.loop is not None], 1, 16, (4, 4))]
    if report.imatrix:  # two curves: each column's front (the input on both)
        curves = [("without imatrix", "tab:red", curves[0][2], 3, 48, (4, 4)),
                  ("with imatrix", "tab:blue", imatrix_curve(report), 1, 12, (4, -10))]
    for label, color, rows, lw, size, offset in curves:
        front = pareto_rows(rows)
        ax.scatter([r.tensor_bytes / 2**20 for r in rows], [r.loop.accept * 100 for r in rows],
                   c=[color if any(r is f for f in front) else "tab:gray" for r in rows], zorder=3, s=size)
        for r in rows:
            ax.annotate(r.file_type + (" (in)" if r.baseline else ""), (r.tensor_bytes / 2**20, r.loop.accept * 100),
                        textcoords="offset points", xytext=offset, fontsize=7, color=color)
        front.sort(key=lambda r: r.tensor_bytes)
        if front:
            ax.plot([r.tensor_bytes / 2**20 for r in front], [r.loop.accept * 100 for r in front], color=color, lw=lw,
                    zorder=2, label=label)
    ax.set_xlabel("tensor MiB")
    ax.set_ylabel("accepted drafted tokens (%)")
    ax.set_title(f"{report.source.name}: acceptance against size ({report.sequences} sequences)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    with TemporaryOutput(path) as tmp:
        try:
            with os.fdopen(os.dup(tmp.fd), "wb") as f:
                fig.savefig(f, format="png")
        except OSError as e:
            raise DFlashError(f"cannot write: {e.strerror or e}", path) from e
        finally:
            plt.close(fig)
        tmp.commit(replace=force)
    return path


def chosen_overrides(res: Any) -> list[str]:
    """The --override-kv items recording how a file was chosen (CHOSEN_KEYS); floats printed to read back as the same float32."""
    def f32(x: float) -> str:
        return f"{float(struct.unpack('<f', struct.pack('<f', x))[0]):.9g}"

    values = {"base_type": res.ftype, "min_acceptance": f32(res.min_acceptance), "acceptance": f32(res.result.accept),
              "baseline_acceptance": f32(res.baseline.accept), "held_out_sequences": str(len(res.held_out)),
              "n_max": str(res.n_max), "tensor_type_count": str(len(res.recipe))}
    out = [f"{CHOSEN_KEYS[k][0]}={CHOSEN_KEYS[k][1]}:{v}" for k, v in values.items()]
    out += [f"{CHOSEN_TENSOR_TYPE.format(i=i)}=str:{p}={t.name.lower()}" for i, (p, t) in enumerate(res.recipe)]
    return out


@dataclass
class ChosenQuantize:
    """A file chosen by ``--min-acceptance``: its plan, the search, the recipe and the keys that record it."""
    plan: QuantizePlan
    search: Any  # mix_search.SearchResult
    tensor_types: list[str]  # the recipe, PATTERN=type each
    overrides: list[str]  # the --override-kv items recording it
    imatrix_args: list[str] = field(default_factory=list)  # --imatrix FILE and its weight filters, as given

    def llama_quantize_args(self) -> list[str]:
        """llama-quantize's arguments that write this very file."""
        args: list[str] = list(self.imatrix_args)
        for item in self.tensor_types:
            args += ["--tensor-type", item]
        for item in self.overrides:
            args += ["--override-kv", item]
        return [*args, str(self.plan.source), str(self.plan.output), self.plan.ftype]

    def lines(self) -> list[str]:
        """The chosen mix: its size and acceptance beside the plain mix's and the input's, the search, the recipe."""
        res, plan = self.search, self.plan
        recipe = " ".join(f"--tensor-type {shlex.quote(i)}" for i in self.tensor_types) or "(the plain mix)"
        return [f"chosen: {plan.ftype} mix raised in {len(res.steps)} step(s): {res.result_bytes} tensor bytes "
                f"(plain {plan.ftype} {res.plain_bytes}, input {res.baseline_bytes}); held-out accept "
                f"{res.result.accept:.4f} = {res.relative:.4f} of the input's {res.baseline.accept:.4f} "
                f"(plain {res.plain.accept:.4f})",
                f"search: {res.evaluations} measurements, {res.quantized} tensors quantized, {res.seconds:.1f} s",
                f"recipe: {recipe}",
                "llama-quantize writes the same file with: llama-quantize "
                + " ".join(shlex.quote(a) for a in self.llama_quantize_args())]

    def written(self) -> str:
        """The line quantize --min-acceptance prints once the file is in place."""
        return f"wrote {self.plan.output} ({len(self.plan.tensors)} tensors, {human_size(self.plan.total_bytes)} of data)"


def quantize_for_acceptance(src: str | os.PathLike, out: str | os.PathLike, qtype: str, features: str | os.PathLike,
                            min_acceptance: float, *, target_model_dir: str | os.PathLike | None = None,
                            target_gguf: str | os.PathLike | None = None, device: str = "auto", numerics: str = "cpu",
                            force: bool = False, dry_run: bool = False, progress: bool = False, threads: int | None = None,
                            max_steps: int | None = None, log: Callable[[str], None] | None = None,
                            allow_other_target: bool = False, imatrix: str | None = None,
                            include_weights: list[str] | None = None,
                            exclude_weights: list[str] | None = None) -> ChosenQuantize:
    """The smallest mix from ``qtype``'s up that keeps ``min_acceptance`` of the held-out acceptance; refused when none does."""
    if not 0.0 < min_acceptance <= 1.0:  # NaN fails this too
        raise DFlashError(f"--min-acceptance {min_acceptance}: expected a fraction in (0, 1], e.g. 0.98")
    weights = {"imatrix": imatrix, "include_weights": include_weights, "exclude_weights": exclude_weights}
    with_im = quantize_options(**weights)  # its refusals come first
    plain = plan_quantize(src, out, qtype, options=with_im)
    check_output_path(plain.output, [src, features], force=force)
    m = open_measurement(features, target_model_dir=target_model_dir, target_gguf=target_gguf, numerics=numerics,
                         allow_other_target=allow_other_target)
    d = plain.drafter
    m.features.check_drafter(d, src, d.block_size - 1)
    # torch, only for the commands that run a drafter, once every input is read
    from .mix_search import MixEvaluator, search_mix
    from .runtime.device import resolve_device

    ev = MixEvaluator(d, m.target, m.features, d.block_size - 1, device=resolve_device(device), like_cpu=m.like_cpu,
                      imatrix=with_im.imatrix)
    res = search_mix(ev, plain.ftype, min_acceptance, max_steps=max_steps, log=log)
    res.n_max = d.block_size - 1
    if not res.reached:
        limit = (f"within {max_steps} step(s)" if max_steps is not None and len(res.steps) >= max_steps
                 else f"up to {RAISE_TOP}")
        raise DFlashError(f"--min-acceptance {min_acceptance:g}: no mix from {plain.ftype} {limit} reaches it: "
                          f"the best held-out acceptance is {res.result.accept:.4f} of the input's {res.baseline.accept:.4f} "
                          f"({res.relative:.4f}); nothing written", src)
    items = [f"{p}={t.name.lower()}" for p, t in res.recipe]
    overrides = chosen_overrides(res)
    plan = plan_quantize(src, plain.output, qtype,
                         options=quantize_options(tensor_types=items, override_kv=overrides, **weights))
    got = {p.tensor.gguf_name: p.ggml_type for p in plan.tensors}
    if any(got[n] != t for n, t in res.types.items()):  # the recipe reproduces the search's types, or nothing is written
        raise AssertionError("the recipe does not reproduce the chosen types")
    if not dry_run:
        write_quantize(plan, force=force, progress=progress, threads=threads)
    im_args = [] if imatrix is None else ["--imatrix", str(imatrix)]
    im_args += [a for w in include_weights or () for a in ("--include-weights", w)]
    im_args += [a for w in exclude_weights or () for a in ("--exclude-weights", w)]
    return ChosenQuantize(plan, res, items, overrides, im_args)


__all__ = ["DEFAULT_SWEEP_TYPES", "FTYPES", "QUANT_TYPES", "ChosenQuantize", "QuantizePlan", "SweepReport", "SweepRow",
           "plan_quantize", "plot_sweep", "plot_sweep_ready", "quantize", "quantize_for_acceptance", "quantize_options", "sweep",
           "write_quantize"]
