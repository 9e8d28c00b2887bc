"""``dflash-convert accept``: how many drafted tokens each drafter file gets accepted, as llama.cpp counts.

Only the drafters run (the target ran once, in ``capture``). Specification: docs/acceptance.md, "accept".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DFlashError
from .sources.checkpoint import read_checkpoint
from .sources.dispatch import read_checkpoint_drafter
from .sources.features import FeaturesFile, open_measurement
from .sources.gguf_drafter import read_drafter
from .sources.hub import DRAFTER, resolve_source
from .target import Target
from .terminal import visible

if TYPE_CHECKING:
    import torch

    from .runtime.accept import AnchorStats, LoopCount

SCHEMA = "dflash-convert/accept/v1"


@dataclass
class FileAcceptance:
    """One file's acceptance: its loop counts and every-anchor statistics."""

    name: str  # the file (or "checkpoint DIR")
    file_type: str
    size: int  # bytes (0 for a checkpoint)
    loop: LoopCount
    anchors: AnchorStats

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict."""
        return {"file": self.name, "file_type": self.file_type, "bytes": self.size, "n_drafted": self.loop.n_drafted,
                "n_accept": self.loop.n_accept, "accept": self.loop.accept, "steps": self.loop.steps,
                "mean_accepted_per_step": self.loop.mean_accepted, "n_predict": self.loop.n_predict,
                "every_anchor_mean_length": self.anchors.mean_length, "every_anchor_count": len(self.anchors.lengths),
                "slot_curve": self.anchors.slot_curve()}


@dataclass
class AcceptReport:
    """An accept run: its settings, the files' results and the baseline they are compared with."""

    features: str
    n_max: int
    new_tokens: int
    sequences: int
    device: str
    numerics: str = "cpu"
    results: list[FileAcceptance] = field(default_factory=list)
    baseline: FileAcceptance | None = None  # what differences are taken against

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict, each row with its accept difference from the baseline."""
        base = self.baseline or (self.results[0] if self.results else None)
        rows = []
        for r in self.results:
            row = r.to_dict()
            row["accept_minus_baseline"] = None if base is None or r is base else r.loop.accept - base.loop.accept
            rows.append(row)
        return {"schema": SCHEMA, "features": self.features, "n_max": self.n_max, "new_tokens": self.new_tokens,
                "sequences": self.sequences, "device": self.device, "numerics": self.numerics,
                "baseline": None if base is None else base.name,
                "checkpoint": None if self.baseline is None else self.baseline.to_dict(), "files": rows}

    def to_json(self) -> str:
        """The report as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def render_text(self) -> str:
        """The report as a text table, one row per file."""
        base = self.baseline or (self.results[0] if self.results else None)
        lines = [f"accept: {self.sequences} sequences of {visible(self.features)}, llama-speculative-simple's greedy loop with "
                 f"--spec-draft-n-max {self.n_max} -n {self.new_tokens}, on {self.device} ({self.numerics} numerics)",
                 f"  {'file':<40} {'type':<7} {'MiB':>8} {'drafted':>8} {'accepted':>8} {'accept':>8} {'per step':>8} "
                 f"{'anchors':>8} {'vs base':>8}"]
        shown = ([self.baseline] if self.baseline is not None else []) + self.results
        for r in shown:
            diff = "" if base is None or r is base else f"{(r.loop.accept - base.loop.accept) * 100:+.1f}pp"
            lines.append(f"  {visible(r.name)[-40:]:<40} {r.file_type:<7} {r.size / 2**20:>8.2f} {r.loop.n_drafted:>8} "
                         f"{r.loop.n_accept:>8} {r.loop.accept * 100:>7.2f}% {r.loop.mean_accepted:>8.2f} "
                         f"{r.anchors.mean_length:>8.2f} {diff:>8}")
        lines.append("  accept = n_accept / n_drafted of the live loop; per step = drafted tokens accepted per "
                     "verification; anchors = mean accepted prefix from every anchor")
        for r in shown:
            curve = " ".join(f"{p:.2f}" for p in r.anchors.slot_curve())
            lines.append(f"  slot curve {visible(r.name)[-30:]}: {curve}")
        return "\n".join(lines)


def accept(drafts: list[str | Path], features: str | Path, *, checkpoint: str | Path | None = None, n_max: int | None = None,
           target_model_dir: str | Path | None = None, target_gguf: str | Path | None = None, device: str = "auto",
           batch: int | None = None, numerics: str = "cpu", allow_other_target: bool = False) -> AcceptReport:
    """Measure each drafter file's acceptance on the captured sequences of ``features`` (``numerics``: docs/acceptance.md)."""
    if not drafts:
        raise DFlashError("name at least one drafter GGUF")
    if checkpoint is not None:  # a directory or a repo id (org/name[@revision]), resolved before any measuring
        checkpoint = resolve_source(checkpoint, DRAFTER).path
    m = open_measurement(features, target_model_dir=target_model_dir, target_gguf=target_gguf, numerics=numerics,
                         allow_other_target=allow_other_target)
    feats = m.features
    files = [read_drafter(p) for p in drafts]
    block = {d.block_size for d in files}
    n = n_max if n_max is not None else min(block) - 1
    if not 1 <= n <= min(block) - 1:
        raise DFlashError(f"--n-max {n} must be in 1..{min(block) - 1} (the block size minus the anchor slot)")
    slots = [feats.check_drafter(d, path, n) for path, d in zip(drafts, files, strict=True)]
    # torch (seconds to import) only once every input has been read: a bad file is one line at once
    from .runtime.accept import ACCEPT_BATCH, gguf_drafts, measure
    from .runtime.device import resolve_device
    from .runtime.weights import load_weights

    dev = resolve_device(device)
    batch = ACCEPT_BATCH if batch is None else batch
    report = AcceptReport(str(features), n, feats.new_tokens, len(feats.sequences), str(dev), numerics)
    for path, d, s in zip(drafts, files, slots, strict=True):
        w = load_weights(d, m.target, device=dev)
        loop, stats = measure(gguf_drafts(d, w, n, like_cpu=m.like_cpu, batch=batch, until_rejected=True), feats, s, n)
        report.results.append(FileAcceptance(str(path), d.type_name, Path(path).stat().st_size, loop, stats))
        del w
    if checkpoint is not None:
        report.baseline = _checkpoint_acceptance(checkpoint, m.target, feats, n, dev)
    return report


def _checkpoint_acceptance(checkpoint: str | Path, target: Target | None, feats: FeaturesFile, n_max: int,
                           dev: torch.device) -> FileAcceptance:
    # torch: only where a model runs
    from .runtime.accept import measure, reference_drafts
    from .runtime.reference import load_reference

    ckpt = read_checkpoint(checkpoint)
    drafter = read_checkpoint_drafter(ckpt, target, keep_embeddings=True)
    model = load_reference(ckpt, target, drafter=drafter, device=dev)
    slots = feats.check_drafter(drafter, f"the checkpoint {checkpoint}", n_max)
    loop, stats = measure(reference_drafts(model, n_max), feats, slots, n_max)
    return FileAcceptance(f"checkpoint {checkpoint}", "ckpt", 0, loop, stats)


__all__ = ["AcceptReport", "FileAcceptance", "accept"]
