"""``dflash-convert check``: does a drafter GGUF compute what its checkpoint computes?

Runs one draft of the GGUF as llama.cpp does and the same draft from the checkpoint on identical
inputs, compares outputs, hyper-parameters and tensors, and judges them against the file's precision
class (``format.check_limits``). Exit 0 on pass, 1 on fail; an unreadable input raises
``InputFileError`` before torch is imported. Metrics, limits and calibration: docs/check.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .drafter import Drafter
from .errors import DFlashError, InputFileError
from .format.check_limits import ACCEPTANCE_GATED, PRECISION_CLASS, SEMANTICS_HIDDEN_TOL, THRESHOLDS, Thresholds
from .format.family import draft_tokens_per_block, member_of
from .format.ggml import FLOAT_TYPE_NAMES, GGMLType
from .outputs import Inputs, check_output_path
from .sources.checkpoint import Checkpoint, read_checkpoint
from .sources.dispatch import read_checkpoint_drafter
from .sources.features import FeaturesFile, read_features
from .sources.gguf import GGUFFile, read_gguf
from .sources.gguf_drafter import drafter_from_gguf
from .sources.hub import DRAFTER, TARGET_WEIGHTS, resolve_source
from .sources.target import read_target_dir, read_target_gguf
from .target import Target
from .terminal import visible
from .validate import validate
from .validate.gate import failure_summary

SCHEMA = "dflash-convert/check/v1"
FEATURES = ("synthetic", "target")  # where the target features of the draft come from (or a features file)
# the type tags a full-precision sibling may carry in its name, most precise first
SIBLING_TAGS = tuple(tag for name in FLOAT_TYPE_NAMES for tag in (name, name.lower()))


@dataclass
class CheckReport:
    """What ``check`` found: metrics, the limits applied, and the verdict."""

    file: str
    checkpoint: str
    device: str
    file_type: str  # general.file_type's name (or the matrix type when the key is absent)
    precision_class: str  # the THRESHOLDS row applied
    metrics: dict[str, Any]
    thresholds: Thresholds
    failures: list[str]
    warnings: list[str] = field(default_factory=list)
    semantics_gap: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """No failure line."""
        return not self.failures

    @property
    def exit_code(self) -> int:
        """0 on pass, 1 on fail."""
        return 0 if self.passed else 1

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (``SCHEMA``)."""
        return {
            "schema": SCHEMA, "file": self.file, "checkpoint": self.checkpoint, "device": self.device,
            "file_type": self.file_type, "precision_class": self.precision_class, "metrics": self.metrics,
            "thresholds": self.thresholds.as_dict(), "result": "pass" if self.passed else "fail",
            "failures": list(self.failures), "warnings": list(self.warnings), "semantics_gap": self.semantics_gap,
        }

    def to_json(self) -> str:
        """``to_dict`` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def render_text(self) -> str:
        """The report for people: one line per metric, warnings and failures escaped, then PASS or FAIL."""
        m, t = self.metrics, self.thresholds
        lines = [f"check {visible(self.file)}", f"  against {visible(self.checkpoint)} (llama.cpp semantics) on {self.device}",
                 f"  file type {self.file_type}, judged as {self.precision_class}",
                 f"  hidden max abs error   {m['hidden_max_abs_err']:.3g}",
                 f"  hidden max rel error   {m['hidden_max_rel_err']:.3g}  (limit {t.hidden_max_rel:g})",
                 f"  top-1 agreement        {m['top1_agreement']:.3f}  ({m['top1_matches']}/{m['slots']}; "
                 f"{m['top1_agreement_tie_aware']:.3f} counting near-ties, min {t.top1_min:g})",
                 f"  mean KL(ref || gguf)   {m['kl_mean']:.3g}  (limit {t.kl_max:g})"]
        if "draft_top1_agreement" in m:  # DSpark: the gates compare slots conditioned on the checkpoint's draft
            lines.append(f"  own-chain draft        {m['draft_top1_agreement']:.3f}  ({m['draft_matches']}/{m['slots']} of the "
                         "file's greedy Markov chain equal to the checkpoint's)")
        if "confidence_max_abs_err" in m:  # DSpark's confidence head
            lines.append(f"  confidence max abs err {m['confidence_max_abs_err']:.3g}  (limit {t.hidden_max_rel:g})")
        sel = m.get("selector")
        if sel:
            err = "n/a" if sel["lattice_max_abs_err"] is None else f"{sel['lattice_max_abs_err']:.3g}"
            lines.append(f"  selector               candidate sets equal in {sel['candidate_sets_equal']:.3f} of the slots, "
                         f"lattice max abs error {err} (top-k {sel['top_k'][0]}, checkpoint {sel['top_k'][1]})")
        a = m.get("acceptance")
        if a:
            f, c = a["file"], a["checkpoint"]
            lines.append(f"  acceptance             {f['accept']:.3f} ({f['n_accept']}/{f['n_drafted']}); checkpoint "
                         f"{c['accept']:.3f} ({c['n_accept']}/{c['n_drafted']}); lost {a['lost']:+.3f} (allowance "
                         f"{a['allowance']:g}) over {a['sequences']} captured sequences")
        q = m.get("against_reference_gguf")
        if q:
            how = ", the full-precision sibling found by name" if q.get("found_by_name") else ""
            lines.append(f"  against {visible(q['file'])} ({q['file_type']}{how}): top-1 agreement {q['top1_agreement']:.3f}, "
                         f"mean KL {q['kl_mean']:.3g}")
        lines += [f"  warning: {visible(w)}" for w in self.warnings]  # file-derived text: escaped, one line each
        lines += [f"  FAIL: {visible(f)}" for f in self.failures]
        lines.append("PASS" if self.passed else "FAIL")
        return "\n".join(lines)


def precision_class(d: Drafter) -> tuple[str, str]:
    """(file type name, precision class): the loosest class of general.file_type and every matrix's type."""
    matrix_types = sorted({t.dtype.name if isinstance(t.dtype, GGMLType) else str(t.dtype) for t in d.tensors
                           if len(t.shape) >= 2})
    ft_name = d.origin.file_type_name
    names = ([ft_name] if ft_name else []) + matrix_types
    order = list(THRESHOLDS)
    unknown = [n for n in names if n not in PRECISION_CLASS]
    if unknown:
        raise InputFileError(f"no check thresholds for type {unknown[0]} (known: {', '.join(sorted(PRECISION_CLASS))})", d.source)
    cls = max((PRECISION_CLASS[n] for n in names), key=order.index, default="F32")
    worst_matrix = max(matrix_types, key=lambda n: order.index(PRECISION_CLASS[n]), default="F32")
    return ft_name or worst_matrix, cls


def find_sibling(path: str | Path, type_name: str) -> Path | None:
    """A full-precision sibling of a quantized file (``model-Q4_K_M.gguf`` -> ``model-F16.gguf``, ...), or None."""
    p = Path(path)
    at = p.name.lower().rfind(type_name.lower())
    if at < 0:
        return None
    for tag in SIBLING_TAGS:
        cand = p.with_name(p.name[:at] + tag + p.name[at + len(type_name):])
        if cand.name != p.name and cand.is_file() and not cand.samefile(p):
            return cand
    return None


def features_file(features: str) -> FeaturesFile | None:
    """The features file ``--features`` names, read and checked; None for ``synthetic`` and ``target``."""
    if features in FEATURES:
        return None
    if not os.path.lexists(features):
        raise InputFileError(f"no such features file (--features takes {', '.join(FEATURES)}, or a file dflash-convert "
                             "capture wrote)", features)
    return read_features(features)


@dataclass
class CheckInputs:
    """Everything ``check`` reads, each once, before torch."""

    checkpoint_dir: Path
    parsed: GGUFFile
    draft: Drafter
    file_type: str
    precision_class: str
    target: Target | None
    checkpoint: Checkpoint
    written: Drafter
    captured: FeaturesFile | None
    save_io: Path | None


def read_inputs(draft_gguf: str | Path, checkpoint_dir: str | Path, target_model_dir: str | Path | None,
                target_gguf: str | Path | None, context: int, save_io: str | Path | None,
                reference_gguf: str | Path | None, features: str, allow_other_target: bool = False) -> CheckInputs:
    """Resolve and read every input of ``check`` once; a bad one raises before anything runs."""
    # either may be a Hugging Face repo id (org/name[@revision]), resolved to its cache snapshot once
    checkpoint_dir = resolve_source(checkpoint_dir, DRAFTER).path
    if target_model_dir is not None:
        target_model_dir = resolve_source(target_model_dir, TARGET_WEIGHTS).path
    captured = features_file(features)
    if features == "target" and target_model_dir is None:
        raise DFlashError("features from the target need --target-model-dir (a directory with the target's weights)")
    out: Path | None = None
    if save_io is not None:
        inputs = Inputs()
        inputs.add_files([p for p in (draft_gguf, target_gguf, reference_gguf) if p is not None])
        inputs.add_directory(checkpoint_dir)
        inputs.add_directory(target_model_dir)
        out = check_output_path(save_io, inputs, force=True)
    g = read_gguf(draft_gguf)  # parsed once: the Drafter and validate both read it
    d = drafter_from_gguf(g, strict=True)
    ft_name, cls = precision_class(d)
    if d.context_length and context + d.block_size > d.context_length:  # before any weight is read
        raise DFlashError(f"context {context} + block {d.block_size} exceeds the drafter's context length {d.context_length}")
    target = (read_target_dir(target_model_dir) if target_model_dir is not None
              else read_target_gguf(target_gguf) if target_gguf is not None else None)
    if captured is not None:  # the features fit the file and its target, before any number is computed
        captured.check_drafter(d, draft_gguf, draft_tokens_per_block(member_of({t.gguf_name for t in d.tensors}),
                                                                     d.block_size, d.sample_from_anchor))
        if target is not None:
            captured.check_target(target, allow_other_target)
    ckpt = read_checkpoint(checkpoint_dir)
    written = read_checkpoint_drafter(ckpt, target, keep_embeddings=True)  # the checkpoint as convert writes it
    return CheckInputs(checkpoint_dir, g, d, ft_name, cls, target, ckpt, written, captured, out)


def forward_failures(metrics: dict[str, Any], limits: Thresholds, by_acceptance: bool) -> list[str]:
    """The forward gates' failure lines (``by_acceptance``: the acceptance gate judges the drafts instead)."""
    m, out = metrics, []
    if not m["hidden_max_rel_err"] <= limits.hidden_max_rel:
        out.append(f"hidden states differ: max rel error {m['hidden_max_rel_err']:.3g} > {limits.hidden_max_rel:g} "
                   f"(max abs error {m['hidden_max_abs_err']:.3g})")
    if not by_acceptance and not m["top1_agreement_tie_aware"] >= limits.top1_min:
        out.append(f"drafted tokens differ: top-1 agreement {m['top1_agreement_tie_aware']:.3f} counting near-ties "
                   f"({m['top1_matches']}/{m['slots']} exact) < {limits.top1_min:g}")
    if not by_acceptance and not m["kl_mean"] <= limits.kl_max:
        out.append(f"draft distributions differ: mean KL {m['kl_mean']:.3g} > {limits.kl_max:g}")
    return out


def acceptance_failures(a: dict[str, Any], cls: str) -> list[str]:
    """The acceptance gate's failure line, when the file loses more than its class's allowance."""
    if not a["lost"] > a["allowance"]:
        return []
    return [f"accepted tokens lost: the file accepts {a['file']['accept']:.3f} of its drafted tokens, the checkpoint "
            f"{a['checkpoint']['accept']:.3f}: {a['lost']:.3f} more than {a['allowance']:g} ({cls}) lost"]


def semantics_warnings(gap: dict[str, Any]) -> list[str]:
    """Mark ``gap`` (llama.cpp's semantics against the trained ones) as differing or not; a warning when it does."""
    gap["differs"] = gap["top1_agreement"] < 1.0 or gap["hidden_max_abs_err"] > SEMANTICS_HIDDEN_TOL
    if not gap["differs"]:
        return []
    return [f"llama.cpp does not run this drafter as it was trained: top-1 agreement between llama.cpp's semantics and "
            f"the trained model's is {gap['top1_agreement']:.3f} ({gap['top1_matches']}/{gap['slots']}), hidden max abs "
            f"difference {gap['hidden_max_abs_err']:.3g}"]


def check(draft_gguf: str | Path, checkpoint_dir: str | Path, *, target_model_dir: str | Path | None = None,
          target_gguf: str | Path | None = None, device: str = "auto", context: int = 64, seed: int = 0,
          save_io: str | Path | None = None, reference_gguf: str | Path | None = None,
          features: str = "synthetic", allow_other_target: bool = False) -> CheckReport:
    """Run ``draft_gguf`` and ``checkpoint_dir`` on the same draft and judge the difference (docs/check.md)."""
    src = read_inputs(draft_gguf, checkpoint_dir, target_model_dir, target_gguf, context, save_io, reference_gguf, features,
                      allow_other_target)
    d, cls, target, captured = src.draft, src.precision_class, src.target, src.captured
    # torch (seconds to import) only now: every input above is read and checked, so a bad one is one line at once
    from .runtime.check_io import draft_inputs, run_other_gguf, write_save_io
    from .runtime.compare import compare, compare_acceptance, compare_drafts
    from .runtime.device import resolve_device
    from .runtime.diagnose import decoded_by_name, decoded_from_checkpoint, hparam_differences, tensor_differences
    from .runtime.forward import run_gguf
    from .runtime.reference import load_reference, reference_forwards, semantics_differ
    from .runtime.weights import load_weights

    dev = resolve_device(device)
    # memory: the checkpoint's matrices read at each use, the file's kept as stored (docs/check.md, "Memory")
    model = load_reference(src.checkpoint, target, drafter=src.written, device=dev, resident=False)
    if model.drafter.hidden_size != d.hidden_size or len(model.drafter.target_layers) != len(d.target_layers):
        raise InputFileError(f"the checkpoint's drafter (hidden {model.drafter.hidden_size}, {len(model.drafter.target_layers)} "
                             f"taps) is not this file's (hidden {d.hidden_size}, {len(d.target_layers)} taps)", src.checkpoint_dir)
    feats, ref_feats, ids, pos, streams = draft_inputs(d, model, features, captured, target, context, seed, dev)
    weights = load_weights(d, target, device=dev, stored=True)
    got = run_gguf(d, weights, feats, ids, pos)
    # the trained semantics too where they can differ from llama.cpp's (else it is the same forward):
    # both from one pass over the output head
    semantics = ("llama.cpp", "reference") if semantics_differ(model) else ("llama.cpp",)
    drafts = reference_forwards(model, ref_feats, ids, pos, semantics)
    want = drafts["llama.cpp"]
    limits = THRESHOLDS[cls]
    got, want, own_draft, metrics, failures = compare_drafts(got, want, weights, d, model.drafter, ids, limits, src.checkpoint_dir)
    failures += forward_failures(metrics, limits, by_acceptance=captured is not None and cls in ACCEPTANCE_GATED)
    # name what differs, always: a wrong target_layers is invisible to synthetic features, and a
    # scaled norm can hide inside a 4-bit file's forward rounding; the weights cannot hide it
    failures += [f"hyper-parameter differs from the checkpoint's: {x}" for x in hparam_differences(d, model.drafter)]
    failures += [f"tensor differs: {x}" for x in tensor_differences(
        d, src.written, dev, file_values=decoded_by_name(weights.decoded),
        checkpoint_values=decoded_from_checkpoint(model.tensors.kept, src.checkpoint.files))]
    # what the runner computes is moot for a file llama.cpp refuses or cannot run: validate's verdict counts
    summary = failure_summary(validate(draft_gguf, parsed=src.parsed))
    if summary is not None:
        failures.append(f"the file fails validate, so llama.cpp cannot run it as checked here ({summary})")
    if captured is not None:
        metrics["acceptance"] = compare_acceptance(d, weights, model, captured, cls)
        failures += acceptance_failures(metrics["acceptance"], cls)

    warnings = [f"embedding/head: {n}" for n in model.notes]
    gap = compare(want, drafts.get("reference", want))
    warnings += semantics_warnings(gap)

    metrics["against_reference_gguf"] = None
    found_by_name = reference_gguf is None and cls not in FLOAT_TYPE_NAMES
    if found_by_name:
        reference_gguf = find_sibling(draft_gguf, src.file_type)
    if reference_gguf is not None:
        try:
            rd, base = run_other_gguf(reference_gguf, target, dev, feats, ids, pos, streams)
            if base.logits.shape != got.logits.shape:
                raise InputFileError(f"drafts {list(base.logits.shape)} logits, the checked file {list(got.logits.shape)}: "
                                     "not a sibling of the checked file", reference_gguf)
        except DFlashError as e:
            if not found_by_name:  # asked for: its fault is the user's to see
                raise
            warnings.append(f"no quantization report: the file named like a full-precision sibling is not one ({e})")
        else:
            r_ft, r_cls = precision_class(rd)
            if r_cls not in FLOAT_TYPE_NAMES:
                warnings.append(f"the reference GGUF is {r_ft}, not full precision: the quantization report is relative")
            metrics["against_reference_gguf"] = {"file": str(reference_gguf), "file_type": r_ft, "found_by_name": found_by_name,
                                                 **compare(got, base, limits.tie_margin, limits.tie_sd)}

    if src.save_io is not None:
        warnings += write_save_io(src.save_io, feats, ids, pos, own_draft or got, want, dspark=weights.markov is not None,
                                  given=got if own_draft is not None else None)
    return CheckReport(file=str(draft_gguf), checkpoint=str(src.checkpoint_dir), device=str(dev), file_type=src.file_type,
                       precision_class=cls, metrics=metrics, thresholds=limits, failures=failures, warnings=warnings,
                       semantics_gap=gap)


__all__ = ["FEATURES", "SCHEMA", "CheckInputs", "CheckReport", "check", "features_file", "find_sibling", "precision_class",
           "read_inputs"]
