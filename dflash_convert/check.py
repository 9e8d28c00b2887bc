"""``dflash-convert check``: does a drafter GGUF compute what its checkpoint computes?

Why: a converted file can be complete and valid yet wrong (a rope base, two swapped matrices, a
norm written from the wrong tensor); only running it shows that. ``check`` runs one draft of the
GGUF the way llama.cpp runs it (``runtime.forward.run_gguf``) and the same draft from the
Hugging Face checkpoint (``runtime.reference.reference_forward``, ``semantics="llama.cpp"``),
on identical inputs: synthetic target features drawn from ``seed`` (float32
``[context, n_taps * hidden]``), the block ``[anchor, mask, ...]`` (anchor drawn from ``seed``) and
positions ``0 .. context + block_size - 1``. The reference runs in float64, the GGUF in float32.
With ``features="target"`` the target model itself runs over ``context`` tokens drawn from
``seed`` (``runtime.capture``): the GGUF gathers its ``dflash.target_layers`` from the target's
layer inputs as llama.cpp does, the checkpoint its own ``target_layer_ids`` as its training code
does, and the anchor is the target's greedy next token. Only then can a wrong ``target_layers``
show in the draft.

Every check also compares the file with the checkpoint directly (``runtime.diagnose``): every
forward hyper-parameter the file and the checkpoint's config disagree on, and every tensor whose
values are not the checkpoint's beyond its storage type's rounding (with the checkpoint tensor it
holds instead, when two were swapped, or the factor of a scaled vector). Each such difference fails
the check and is named: with synthetic features a wrong ``target_layers`` would otherwise pass, and
at 4 bits a scaled norm could hide inside the forward's rounding.

Metrics (GGUF against checkpoint):

* ``hidden_max_abs_err``: max |h_gguf - h_ref| over the final-norm hidden states of every slot;
* ``hidden_max_rel_err``: that, divided by max |h_ref| (the scale of the states; a per-element
  ratio would explode on entries near zero);
* ``top1_agreement``: share of the ``block_size - 1`` predicted slots whose greedy token agrees;
  ``top1_agreement_tie_aware`` also counts a slot where the two disagree but the reference rates
  the GGUF's token within ``tie_margin`` nats of its own choice, or within ``tie_sd`` standard
  deviations of that slot's reference logits (a near-tie: a flip that rounding of this precision
  causes, which costs a draft next to nothing); the gate uses this;
* ``kl_mean``: mean over those slots of KL(p_ref || p_gguf), p = softmax(logits), in nats.

A file passes when hidden_max_rel_err <= ``hidden_max_rel``, top1_agreement_tie_aware >= ``top1_min`` and
kl_mean <= ``kl_max`` of its precision class (table ``THRESHOLDS``; the class is the loosest of
``general.file_type`` and every matrix's ggml type, so a mixed file is judged by its lowest
precision), and no hyper-parameter or tensor differs from the checkpoint's (below):

==========  ==============  ========  ======  ==========  ======  ==========================================
class       hidden_max_rel  top1_min  kl_max  tie_margin  tie_sd  types
==========  ==============  ========  ======  ==========  ======  ==========================================
F32         1e-4            1.0       1e-6    1e-4        0       F32
F16         5e-3            0.9       1e-3    1e-2        0.02    F16
BF16        6e-2            0.85      5e-3    5e-2        0.1     BF16
Q8_0        6e-2            0.85      5e-3    5e-2        0.1     Q8_0
Q6_K        0.2             0.8       2e-2    0.1         0.25    Q6_K
Q5          0.4             0.75      5e-2    0.1         0.8     Q5_0, Q5_1, Q5_K_S, Q5_K_M
Q4          0.7             0.65      0.15    0.1         1.0     Q4_0, Q4_1, Q4_K_S, Q4_K_M, IQ4_NL, IQ4_XS
Q3_K        1.3             0.5       0.4     0.1         2.0     Q3_K_S, Q3_K_M, Q3_K_L
Q2_K        1.6             0.35      0.8     0.1         3.5     Q2_K
==========  ==============  ========  ======  ==========  ======  ==========================================

The quantized rows were measured on the worst case we know, random drafters (flat distributions
where every slot is a near-tie and a 256-wide layer amplifies rounding: ``tests/test_check_quant.py``
runs every type of ours and of llama-quantize through them), with headroom; there the forward gates
only catch gross breakage, and the weight comparison (always on) catches a wrong tensor of any
file exactly. The reason for each value is next to it in ``THRESHOLDS``.

The reason for each value is next to it in ``THRESHOLDS``. ``exit_code`` is 0 on pass, 1 on
fail; an unreadable input raises ``InputFileError`` (a command line maps it to 2).

Also reported, never failing the check:

* ``semantics_gap``: the checkpoint under its trained semantics (``semantics="reference"``)
  against llama.cpp's. Where they differ (top-1 agreement below 1 or hidden states further apart
  than ``SEMANTICS_HIDDEN_TOL``), llama.cpp does not run this drafter as it was trained (a causal
  or windowed sliding layer, exact GELU, ...) and a warning says how much the greedy drafts agree.
* ``reference_gguf``: a full-precision sibling (F16/F32) of the checked file; the checked file's
  top-1 agreement and KL against it isolate what quantization alone costs
  (``metrics["against_reference_gguf"]``). For a quantized file without one, a sibling named like
  it with the type tag swapped (``model-Q4_K_M.gguf`` -> ``model-F16.gguf``, see
  ``find_sibling``) is used when it exists.

``save_io`` writes the inputs and both sides' outputs to an ``.npz`` (schema in ``save_io_arrays``).

DSpark files (``markov_w1.weight``): both sides run the Markov chain and confidence head
(``runtime.dspark``); the gates compare the file's slots conditioned on the checkpoint's draft
(``conditioned_like``), the free-running agreement is ``draft_top1_agreement``, the confidences are
gated by ``confidence_max_abs_err <= hidden_max_rel``, and a different block layout is a named failure
(``dspark_common_slots``). docs/check.md has the details and the ``.npz`` arrays it adds.

DFlash2 drafters are judged on what the driver drafts: ``tokens`` are the walk over the selector
lattice (not the argmax of the logits), a flipped slot is a near-tie when the reference's walked
lattice row rates the file's token within the class's margin (a token outside the reference's
candidates never is), and the KL compares the transformed logits the candidates are drawn from.
``metrics["selector"]`` reports (never gates) the share of slots whose candidate sets agree and the
largest lattice difference where they do (``selector_agreement``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .drafter import Drafter
from .errors import DFlashError, InputFileError
from .format.family import draft_tokens_per_block, member_of
from .format.ggml import FLOAT_TYPE_NAMES, GGMLType
from .outputs import Inputs, TemporaryOutput, check_output_path, clear_stale_partials
from .sources.checkpoint import read_checkpoint
from .sources.dispatch import read_checkpoint_drafter
from .sources.features import FeaturesFile, read_features
from .sources.gguf_drafter import read_drafter
from .sources.hub import DRAFTER, TARGET_WEIGHTS, resolve_source
from .sources.target import read_target_dir, read_target_gguf
from .target import Target
from .terminal import visible
from .validate import validate
from .validate.gate import failure_summary

if TYPE_CHECKING:
    import torch

    # the runtime modules import torch as well
    from .runtime.forward import ForwardResult

SCHEMA = "dflash-convert/check/v1"
FEATURES = ("synthetic", "target")  # where the target features of the draft come from (or a features file)

# acceptance a file may lose against its checkpoint, per precision class: the live loop's accept
# (n_accept / n_drafted), absolute. Calibrated on the trained pair (fixtures/trained.py: 6 prompts,
# -n 64, both drafters, every type our quantize writes, CPU numerics): the worst drop seen in the class,
# times 1.5, and never below a finer class's. Worst drops seen (points): F16 and BF16 0, Q8_0 1.2,
# Q6_K 0.2, Q5 1.75 (Q5_K_M, sliding-window drafter), Q4 4.8 (Q4_0, full), Q3_K 2.6, Q2_K 8.7 (SWA).
# Below ~2 points the live loop's own noise on 6 prompts dominates (one near-tie changes its path).
ACCEPT_ALLOWANCE: dict[str, float] = {
    "F32": 0.005, "F16": 0.01, "BF16": 0.01, "Q8_0": 0.02, "Q6_K": 0.02, "Q5": 0.03, "Q4": 0.07, "Q3_K": 0.07,
    "Q2_K": 0.13,
}
# classes whose forward top-1 and KL gates come from random drafters only: with captured features the
# acceptance gate replaces them (the hidden-state gate and the weight diagnosis stay)
ACCEPTANCE_GATED = ("Q8_0", "Q6_K", "Q5", "Q4", "Q3_K", "Q2_K")
# the two semantics of one float64 reference: identical computations agree to ~1e-15, so anything
# above this is a real difference in the graph (mask, activation), not rounding
SEMANTICS_HIDDEN_TOL = 1e-6
# a flipped slot whose GGUF token the reference itself rates within this many nats of its own top-1
# (probability ratio >= e^-0.1 = 0.905) is a near-tie, not a defect: it costs a draft essentially
# nothing in acceptance, and tiny or unsure drafters (flat distributions) flip such slots under any
# rounding. The gate counts those slots as agreeing; the raw agreement is reported beside it. Each
# precision class narrows it to the logit noise it can cause (``Thresholds.tie_margin``)
TIE_MARGIN = 0.1


@dataclass(frozen=True)
class Thresholds:
    """Pass limits of one precision class (see the module docstring)."""

    hidden_max_rel: float
    top1_min: float
    kl_max: float
    tie_margin: float = TIE_MARGIN  # nats: a flip between tokens this close in the reference counts as agreeing
    tie_sd: float = 0.0  # ... or this close in standard deviations of the slot's reference logits

    def as_dict(self) -> dict[str, float]:
        return {"hidden_max_rel": self.hidden_max_rel, "top1_min": self.top1_min, "kl_max": self.kl_max,
                "tie_margin": self.tie_margin, "tie_sd": self.tie_sd}


# precision class -> limits, strictest first (the order is used to pick the loosest class of a file)
THRESHOLDS: dict[str, Thresholds] = {
    # float32 runner against the float64 reference: only float32 rounding, measured ~1e-6 relative;
    # any real mistake (rope base, swapped or scaled tensor) is orders of magnitude above 1e-4. Only
    # ties within float32 logit noise may flip: every other token must be the checkpoint's
    "F32": Thresholds(1e-4, 1.0, 1e-6, 1e-4, 0.0),
    # fp16 keeps 11 significant bits (weight error ~2.4e-4 relative, rms lower); a few layers amplify
    # it to ~1e-3 in the normed states. One in ten greedy slots may flip where two candidates tie
    # within that noise (late block slots of a real drafter are near-ties)
    "F16": Thresholds(5e-3, 0.9, 1e-3, 1e-2, 0.02),
    # bf16 keeps 8 bits (~2e-3 relative per weight, 8x fp16); Q8_0 (int8 per 32 values with an fp16
    # scale) has a comparable error, ~1/254 of each block's largest magnitude: measured up to 0.03 in
    # the normed states of a random 256-wide drafter, logit noise 0.03 sd
    "BF16": Thresholds(6e-2, 0.85, 5e-3, 5e-2, 0.1),
    "Q8_0": Thresholds(6e-2, 0.85, 5e-3, 5e-2, 0.1),
    # the rows below: measured on random 256-wide drafters (3 seeds, every type of the class), the
    # worst hidden error and the worst flip (in sd of the reference's logits), then ~1.5x headroom.
    # Q6_K: hidden 0.10, flips within 0.03 sd, KL 2.6e-3
    "Q6_K": Thresholds(0.2, 0.8, 2e-2, 0.1, 0.25),
    # 5-bit: hidden 0.23, flips within 0.56 sd, KL 1.4e-2
    "Q5": Thresholds(0.4, 0.75, 5e-2, 0.1, 0.8),
    # 4-bit (K-quants, legacy, IQ4 non-linear): hidden 0.41, flips within 0.61 sd, KL 5.3e-2
    "Q4": Thresholds(0.7, 0.65, 0.15, 0.1, 1.0),
    # 3-bit and 2-bit: large, documented quality loss (hidden 0.85 and 1.0, flips within 1.3 and 2.3
    # sd, KL 0.10 and 0.33): only gross breakage fails the forward here
    "Q3_K": Thresholds(1.3, 0.5, 0.4, 0.1, 2.0),
    "Q2_K": Thresholds(1.6, 0.35, 0.8, 0.1, 3.5),
}

# ggml type / file type name -> precision class
_CLASS_OF: dict[str, str] = {
    "F32": "F32", "F64": "F32", "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q8_1": "Q8_0", "Q8_K": "Q8_0",
    "Q6_K": "Q6_K", "Q5_0": "Q5", "Q5_1": "Q5", "Q5_K": "Q5", "Q5_K_S": "Q5", "Q5_K_M": "Q5",
    "Q4_0": "Q4", "Q4_1": "Q4", "Q4_K": "Q4", "Q4_K_S": "Q4", "Q4_K_M": "Q4", "IQ4_NL": "Q4", "IQ4_XS": "Q4",
    "Q3_K": "Q3_K", "Q3_K_S": "Q3_K", "Q3_K_M": "Q3_K", "Q3_K_L": "Q3_K", "Q2_K": "Q2_K",
}


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
        return not self.failures

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "file": self.file, "checkpoint": self.checkpoint, "device": self.device,
            "file_type": self.file_type, "precision_class": self.precision_class, "metrics": self.metrics,
            "thresholds": self.thresholds.as_dict(), "result": "pass" if self.passed else "fail",
            "failures": list(self.failures), "warnings": list(self.warnings), "semantics_gap": self.semantics_gap,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def render_text(self) -> str:
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


# --- comparisons -------------------------------------------------------------------------------


def hidden_errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max abs error, max abs error / max |want|) of two hidden-state tensors, in float64."""
    # torch (seconds to import) only when something runs: check's input errors come first
    import torch

    a, b = got.detach().to("cpu", torch.float64), want.detach().to("cpu", torch.float64)
    err = float((a - b).abs().max())
    return err, err / max(float(b.abs().max()), 1e-30)


def top1_agreement(got: torch.Tensor, want: torch.Tensor) -> tuple[int, int]:
    """(matching slots, slots) of two greedy token rows."""
    return int((got.cpu() == want.cpu()).sum()), int(want.numel())


def kl_mean(want_logits: torch.Tensor, got_logits: torch.Tensor) -> float:
    """Mean over slots of KL(softmax(want) || softmax(got)) in nats.

    Entries where the reference has probability zero (-inf logits outside a d2t vocabulary)
    contribute nothing; a token the reference allows and the GGUF rules out makes it infinite.
    """
    # torch (seconds to import) only when something runs: check's input errors come first
    import torch

    lw = torch.log_softmax(want_logits.detach().to("cpu", torch.float64), dim=-1)
    lg = torch.log_softmax(got_logits.detach().to("cpu", torch.float64), dim=-1)
    live = torch.isfinite(lw)
    terms = torch.where(live, lw.exp() * (lw - lg), torch.zeros_like(lw))
    return float(terms.sum(-1).mean())


def near_ties(want_logits: torch.Tensor, got_tokens: torch.Tensor, margin: float = TIE_MARGIN, sd: float = 0.0) -> torch.Tensor:
    """Per slot: does ``want`` rate ``got``'s token within ``margin`` nats, or within ``sd`` standard
    deviations of that slot's finite logits, of its own top-1? (-inf: never)."""
    # torch (seconds to import) only when something runs: check's input errors come first
    import torch

    lw = want_logits.detach().to("cpu", torch.float64)
    own = lw.gather(-1, got_tokens.detach().to("cpu", torch.int64)[:, None])[:, 0]
    gap = lw.max(-1).values - own
    if sd <= 0:
        return gap <= margin
    finite = torch.isfinite(lw)
    n = finite.sum(-1).clamp(min=2)
    mean = torch.where(finite, lw, torch.zeros_like(lw)).sum(-1) / n
    var = torch.where(finite, (lw - mean[:, None]) ** 2, torch.zeros_like(lw)).sum(-1) / (n - 1)
    return (gap <= margin) | (gap <= sd * var.sqrt())


def compare(got: ForwardResult, want: ForwardResult, tie_margin: float = TIE_MARGIN, tie_sd: float = 0.0) -> dict[str, Any]:
    """The check's metrics of ``got`` against ``want``."""
    abs_err, rel_err = hidden_errors(got.hidden, want.hidden)
    match, n = top1_agreement(got.tokens, want.tokens)
    # a near-tie is judged on what the driver chose the token from (DFlash2: the walked lattice row)
    ties = near_ties(want.choice_logits(), got.tokens, tie_margin, tie_sd)
    tie_aware = int(((got.tokens.cpu() == want.tokens.cpu()) | ties).sum())
    return {"hidden_max_abs_err": abs_err, "hidden_max_rel_err": rel_err, "top1_agreement": match / n if n else 1.0,
            "top1_matches": match, "slots": n, "top1_agreement_tie_aware": tie_aware / n if n else 1.0,
            "kl_mean": kl_mean(want.logits, got.logits)}


def _sorted_lattice(candidates: torch.Tensor, lattice: torch.Tensor) -> torch.Tensor:
    """[n, k, k] lattice with both axes in ascending candidate-id order (predecessors: the previous slot's
    candidates; the first slot's rows are all the anchor's and stay as they are)."""
    # torch (seconds to import) only when something runs: check's input errors come first
    import torch

    n, k = candidates.shape
    perm = candidates.argsort(-1)
    prev = torch.cat([torch.arange(k)[None], perm[:-1]]) if n else perm
    out = lattice.gather(-1, perm[:, None, :].expand(n, k, k))
    return out.gather(1, prev[:, :, None].expand(n, k, k))


def selector_agreement(got: ForwardResult, want: ForwardResult) -> dict[str, Any] | None:
    """DFlash2: the share of slots whose two candidate sets are equal, and the largest lattice difference
    over the slots where both those and the predecessors' sets are (the pairs then mean the same tokens).
    None for drafters without a selector. Reported, never gating: the drafted tokens are gated."""
    # torch (seconds to import) only when something runs: check's input errors come first
    import torch

    # the runtime modules import torch as well
    from .runtime.dflash2 import CANDIDATES, LATTICE

    if CANDIDATES not in got.extras or CANDIDATES not in want.extras:
        return None
    gc, wc = got.extras[CANDIDATES].cpu(), want.extras[CANDIDATES].cpu()
    if gc.shape != wc.shape:
        return {"candidate_sets_equal": 0.0, "lattice_max_abs_err": None, "top_k": [gc.shape[-1], wc.shape[-1]]}
    same = (gc.sort(-1).values == wc.sort(-1).values).all(-1)
    comparable = same & torch.cat([torch.ones(1, dtype=torch.bool), same[:-1]])
    diff = (_sorted_lattice(gc, got.extras[LATTICE].detach().cpu().double())
            - _sorted_lattice(wc, want.extras[LATTICE].detach().cpu().double()))[comparable]
    return {"candidate_sets_equal": float(same.double().mean()) if same.numel() else 1.0,
            "lattice_max_abs_err": float(diff.abs().max()) if diff.numel() else None, "top_k": [gc.shape[-1]] * 2}


# --- file type ---------------------------------------------------------------------------------


def _type_name(t: object) -> str:
    return t.name if isinstance(t, GGMLType) else str(t)


def precision_class(d: Drafter) -> tuple[str, str]:
    """(file type name, precision class): the loosest class of general.file_type and every matrix's type."""
    matrix_types = sorted({_type_name(t.dtype) for t in d.tensors if len(t.shape) >= 2})
    ft_name = d.origin.file_type_name
    names = ([ft_name] if ft_name else []) + matrix_types
    order = list(THRESHOLDS)
    classes = [_CLASS_OF[n] for n in names if n in _CLASS_OF]
    unknown = [n for n in names if n not in _CLASS_OF]
    if unknown:
        raise InputFileError(f"no check thresholds for type {unknown[0]} (known: {', '.join(sorted(_CLASS_OF))})", d.source)
    cls = max(classes, key=order.index) if classes else "F32"
    worst_matrix = max(matrix_types, key=lambda n: order.index(_CLASS_OF[n]), default="F32")
    return ft_name or worst_matrix, cls


# --- inputs and outputs ------------------------------------------------------------------------


def synthetic_inputs(d: Drafter, context: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target_hidden [ctx, T*E] float32, block_ids [block_size] int64, positions [ctx + block_size] int64).

    Standard-normal features: the drafter's fc + hidden norm normalizes their scale, so their
    magnitude does not matter, and random rows exercise every weight. The anchor is a random
    vocabulary id other than the mask token.
    """
    # torch (seconds to import) only when something runs: check's input errors come first
    import torch

    # the runtime modules import torch as well
    from .runtime.forward import block_tokens, contiguous_positions

    if context < 1:
        raise DFlashError(f"context must be at least 1, got {context}")
    g = torch.Generator().manual_seed(int(seed))
    feats = torch.randn(context, len(d.target_layers) * d.hidden_size, generator=g, dtype=torch.float32)
    anchor = int(torch.randint(0, d.vocab_size, (1,), generator=g))
    if anchor == d.mask_token_id:
        anchor = (anchor + 1) % d.vocab_size
    ids = block_tokens(d, anchor)
    return feats, ids, contiguous_positions(context, len(ids))


def captured_inputs(d: Drafter, target: Target, context: int, seed: int,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(layer inputs [n_layers + 1, ctx, E], block_ids, positions) from one pass of the target model.

    The context is ``context`` token ids drawn uniformly from ``seed`` over the ids both the
    drafter and the target's embedding know (any id is a valid input to a model); the anchor is the
    target's greedy prediction after the context, as in a live speculative step.
    """
    # torch (seconds to import) only when something runs: check's input errors come first
    import torch

    # the runtime modules import torch as well
    from .runtime.capture import load_target_model, run_target
    from .runtime.forward import block_tokens, contiguous_positions

    if context < 1:
        raise DFlashError(f"context must be at least 1, got {context}")
    model, layers = load_target_model(target, device)
    n_vocab = int(model.get_input_embeddings().weight.shape[0])
    g = torch.Generator().manual_seed(int(seed))
    ctx_ids = torch.randint(0, min(d.vocab_size, n_vocab), (context,), generator=g, dtype=torch.int64)
    streams, logits = run_target(model, layers, ctx_ids)
    if streams.shape[-1] != d.hidden_size:
        raise InputFileError(f"the target's hidden size is {streams.shape[-1]}, the drafter's {d.hidden_size}", target.source)
    anchor = int(logits[-1, : d.vocab_size].argmax())
    ids = block_tokens(d, anchor)
    return streams, ids, contiguous_positions(context, len(ids))


# the type tags a full-precision sibling may carry in its name, most precise first
SIBLING_TAGS = tuple(tag for name in FLOAT_TYPE_NAMES for tag in (name, name.lower()))


def find_sibling(path: str | Path, type_name: str) -> Path | None:
    """A full-precision sibling of a quantized file: its name with the type tag swapped.

    ``model-Q4_K_M.gguf`` -> ``model-F32.gguf``, ``model-f16.gguf``, ... (the names convert and
    quantize give by default), in the same folder. The tag is matched case-insensitively where it
    last occurs in the name; None when no such regular file exists.
    """
    p = Path(path)
    at = p.name.lower().rfind(type_name.lower())
    if at < 0:
        return None
    for tag in SIBLING_TAGS:
        cand = p.with_name(p.name[:at] + tag + p.name[at + len(type_name):])
        if cand.name != p.name and cand.is_file() and not cand.samefile(p):
            return cand
    return None


def save_io_arrays(feats: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, gguf: ForwardResult,
                   ref: ForwardResult, draft_slots: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """The ``.npz`` schema: inputs, then each side's hidden states, logits and drafted tokens. A DSpark
    drafter's logits are the Markov-conditioned ones the driver reads; it adds ``draft_slots`` (the block
    slot of each drafted row) and, with a confidence head, each side's ``confidence_*``. A DFlash2 drafter
    adds each side's member arrays (``candidates``, ``lattice``, ``chosen``; docs/check.md)."""
    # torch (seconds to import) only when something runs: check's input errors come first
    import torch

    def f32(t: torch.Tensor) -> np.ndarray:
        return t.detach().to("cpu", torch.float32).numpy()

    def i64(t: torch.Tensor) -> np.ndarray:
        return t.detach().to("cpu", torch.int64).numpy()

    def typed(t: torch.Tensor) -> np.ndarray:
        return f32(t) if t.is_floating_point() else i64(t)

    out = {"target_hidden": f32(feats), "block_ids": i64(ids), "positions": i64(pos),
           "hidden_gguf": f32(gguf.hidden), "hidden_ref": f32(ref.hidden),
           "logits_gguf": f32(gguf.logits), "logits_ref": f32(ref.logits),
           "tokens_gguf": i64(gguf.tokens), "tokens_ref": i64(ref.tokens)}
    if draft_slots is not None:
        out["draft_slots"] = i64(draft_slots)
        if gguf.confidence is not None and ref.confidence is not None:
            out["confidence_gguf"], out["confidence_ref"] = f32(gguf.confidence), f32(ref.confidence)
    out.update({f"{name}_{side}": typed(v) for side, r in (("gguf", gguf), ("ref", ref)) for name, v in r.extras.items()})
    return out


def write_npz_atomic(out: Path, arrays: dict[str, np.ndarray]) -> list[str]:
    """Write through a temporary file beside ``out`` (``outputs.TemporaryOutput``), then rename: a reader
    never sees half a file, and nobody can aim the write elsewhere. An existing dump is replaced (a
    dump, not a result); temporary files a killed run left are reported. Returns those notes."""
    notes = clear_stale_partials(out, force=False)
    with TemporaryOutput(out) as tmp:
        try:
            with os.fdopen(os.dup(tmp.fd), "wb") as f:
                np.savez(f, **arrays)  # a file object: numpy appends no suffix
        except OSError as e:
            raise DFlashError(f"cannot write: {e.strerror or e}", out) from e
        tmp.commit(replace=True)
    return notes


# --- DSpark ------------------------------------------------------------------------------------


def dspark_common_slots(got: ForwardResult, want: ForwardResult, file: Drafter,
                        checkpoint: Drafter) -> tuple[ForwardResult, ForwardResult, str | None]:
    """Both DSpark drafts cut to the block slots both sides draft, and a failure line when those differ.

    Why: a file whose ``sample_from_anchor`` disagrees with its checkpoint drafts ``block_size`` slots
    where the checkpoint drafts ``block_size - 1`` (or the reverse); the check must fail naming that,
    not stop on the shapes. The drafted rows end at the block's last slot on both sides.
    """
    # torch (seconds to import) only when something runs: check's input errors come first
    from .runtime.forward import ForwardResult

    n = min(got.tokens.shape[0], want.tokens.shape[0])
    note = None
    if got.tokens.shape[0] != want.tokens.shape[0]:
        note = (f"drafted slots differ: the file drafts {got.tokens.shape[0]} slots per block, the checkpoint "
                f"{want.tokens.shape[0]} (sample_from_anchor: file {file.sample_from_anchor is not False}, checkpoint "
                f"{checkpoint.sample_from_anchor is not False})")

    def tail(r: ForwardResult) -> ForwardResult:
        conf = None if r.confidence is None else r.confidence[-n:]
        return ForwardResult(hidden=r.hidden, logits=r.logits[-n:], tokens=r.tokens[-n:], confidence=conf,
                             head_logits=r.head_logits)

    return tail(got), tail(want), note


def conditioned_like(weights: Any, got: ForwardResult, want: ForwardResult, ids: torch.Tensor) -> ForwardResult:
    """The file's DSpark heads over its own states, each slot conditioned on the checkpoint's draft.

    Why: the Markov chain feeds each slot's argmax to the next, so one near-tie flipped by rounding
    makes every later slot of a quantized file differ from the checkpoint's, however exact its heads.
    The gates compare slot by slot under the same conditioning; the free-running agreement of the two
    drafts (what the driver proposes) is reported beside them (``draft_top1_agreement``).
    """
    # torch (seconds to import) only when something runs: check's input errors come first
    from .runtime.dspark import markov_chain
    from .runtime.forward import ForwardResult

    m = markov_chain(weights.markov, got.head_logits, got.hidden, ids[0], weights.d2t, forced=want.tokens[:-1])
    return ForwardResult(hidden=got.hidden, logits=m.logits[-want.tokens.shape[0]:], tokens=m.tokens[-want.tokens.shape[0]:],
                         confidence=None if m.confidence is None else m.confidence[-want.tokens.shape[0]:],
                         head_logits=got.head_logits)


def given_ref_arrays(given: ForwardResult) -> dict[str, np.ndarray]:
    """DSpark's ``--save-io`` extras: the file's logits (and confidences) conditioned on the checkpoint's draft."""
    # torch (seconds to import) only when something runs: check's input errors come first
    import torch

    out = {"logits_gguf_given_ref": given.logits.detach().to("cpu", torch.float32).numpy()}
    if given.confidence is not None:
        out["confidence_gguf_given_ref"] = given.confidence.detach().to("cpu", torch.float32).numpy()
    return out


def confidence_failures(got: ForwardResult, want: ForwardResult, metrics: dict[str, Any], limits: Thresholds) -> list[str]:
    """DSpark's confidence head: ``confidence_max_abs_err`` into ``metrics``, a failure line past its limit.

    The confidences are probabilities the driver compares with ``--spec-draft-p-min``; their limit is the
    class's ``hidden_max_rel`` as an absolute error (a sigmoid moves at most a quarter of its input's
    change, and that input is a dot product of the normed states whose error the hidden gate bounds).
    """
    if got.confidence is None and want.confidence is None:
        return []
    if got.confidence is None or want.confidence is None:
        side = "the file" if got.confidence is None else "the checkpoint"
        return [f"confidence head differs: {side} has none"]
    err = float((got.confidence.detach().cpu().double() - want.confidence.detach().cpu().double()).abs().max())
    metrics["confidence_max_abs_err"] = err
    if not err <= limits.hidden_max_rel:
        return [f"confidences differ: max abs error {err:.3g} > {limits.hidden_max_rel:g}"]
    return []


# --- the check ---------------------------------------------------------------------------------


def file_inputs(d: Drafter, model, captured: FeaturesFile, context: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                                  torch.Tensor, torch.Tensor]:
    """The forward comparison's inputs from the first captured sequence: ``context`` positions (fewer if it is
    shorter) and the block after them, each side tapping its own layers (the file its ``target_layers``, the
    checkpoint its own ids, through ``reference_features``)."""
    # torch (seconds to import) only when something runs: check's input errors come first
    import torch

    # the runtime modules import torch as well
    from .runtime.forward import block_tokens, contiguous_positions
    from .runtime.reference import reference_features

    seq = captured.sequences[0]
    tokens, _ = seq.read_tokens()
    n = max(1, min(context, len(tokens) - 1))
    stored = {layer: torch.from_numpy(seq.read_layer(i)[:n]) for i, layer in enumerate(captured.layers)}
    captured.slots_for(d.target_layers, "the file")
    captured.slots_for(model.drafter.target_layers, "the checkpoint")
    feats = torch.cat([stored[t] for t in d.target_layers], dim=-1)
    ids = block_tokens(d, int(tokens[n]))
    return feats, reference_features(model, stored), ids, contiguous_positions(n, len(ids))


def compare_acceptance(d: Drafter, weights, model, captured: FeaturesFile, cls: str) -> dict[str, Any]:
    """The file's live-loop acceptance on the captured sequences next to its checkpoint's (reference forward)."""
    # torch (seconds to import) only when something runs: check's input errors come first
    from .runtime.accept import gguf_drafts, measure, reference_drafts

    # the driver's most drafted tokens per block: block_size for a DSpark drafter sampling from the anchor
    n_max = draft_tokens_per_block(member_of({t.gguf_name for t in d.tensors}), d.block_size, d.sample_from_anchor)
    file_loop, file_anchors = measure(gguf_drafts(d, weights, n_max), captured, captured.slots_for(d.target_layers, "the file"),
                                      n_max)
    ck_loop, ck_anchors = measure(reference_drafts(model, n_max), captured,
                                  captured.slots_for(model.drafter.target_layers, "the checkpoint"), n_max)

    def side(loop, anchors) -> dict[str, Any]:
        return {"n_drafted": loop.n_drafted, "n_accept": loop.n_accept, "accept": loop.accept, "steps": loop.steps,
                "every_anchor_mean_length": anchors.mean_length}

    return {"file": side(file_loop, file_anchors), "checkpoint": side(ck_loop, ck_anchors),
            "lost": ck_loop.accept - file_loop.accept, "allowance": ACCEPT_ALLOWANCE[cls], "sequences": len(captured.sequences),
            "n_max": n_max, "new_tokens": captured.new_tokens}


def _run_file(path: str | Path, target: Target | None, device: torch.device, feats: torch.Tensor,
              ids: torch.Tensor, pos: torch.Tensor, streams: torch.Tensor | None = None) -> tuple[Drafter, ForwardResult]:
    """Run another GGUF on the same draft (with captured streams, it taps its own layers)."""
    # torch (seconds to import) only when something runs: check's input errors come first
    from .runtime.forward import gather_features, run_gguf
    from .runtime.weights import load_weights

    d = read_drafter(path)
    w = load_weights(d, target, device=device)
    return d, run_gguf(d, w, feats if streams is None else gather_features(d, streams), ids, pos)


def check(draft_gguf: str | Path, checkpoint_dir: str | Path, *, target_model_dir: str | Path | None = None,
          target_gguf: str | Path | None = None, device: str = "auto", context: int = 64, seed: int = 0,
          save_io: str | Path | None = None, reference_gguf: str | Path | None = None,
          features: str = "synthetic", allow_other_target: bool = False) -> CheckReport:
    """Run ``draft_gguf`` and ``checkpoint_dir`` on the same draft and judge the difference.

    ``target_model_dir`` / ``target_gguf`` supply the embedding and head a drafter does not carry
    (the directory is used when both are given). ``features``: ``synthetic`` (drawn from ``seed``,
    the same rows for both sides) or ``target`` (the target model in ``target_model_dir`` runs over
    ``context`` tokens drawn from ``seed``; each side taps its own layers, the anchor is the target's
    greedy next token). ``checkpoint_dir`` and ``target_model_dir`` may be Hugging Face repo ids
    (``org/name[@revision]``, sources/hub.py). Raises InputFileError for an unreadable input (RepoError
    for a repo id that does not resolve), DFlashError for a usage problem (no target where one is
    needed, an output path on an input).

    Each input is read once and handed down as an object: the draft (a Drafter), the checkpoint
    (indexed once, read into the Drafter convert would write), the target; each weight is decoded
    once, by the runner or the reference, and compared from there.
    """
    # either may be a Hugging Face repo id (org/name[@revision]), resolved to its cache snapshot once
    checkpoint_dir = resolve_source(checkpoint_dir, DRAFTER).path
    if target_model_dir is not None:
        target_model_dir = resolve_source(target_model_dir, TARGET_WEIGHTS).path
    captured = None
    if features not in FEATURES:
        if not os.path.lexists(features):
            raise InputFileError(f"no such features file (--features takes {', '.join(FEATURES)}, or a file dflash-convert "
                                 "capture wrote)", features)
        captured = read_features(features)
    if features == "target" and target_model_dir is None:
        raise DFlashError("features from the target need --target-model-dir (a directory with the target's weights)")
    out: Path | None = None
    if save_io is not None:
        inputs = Inputs()
        inputs.add_files([p for p in (draft_gguf, target_gguf, reference_gguf) if p is not None])
        inputs.add_directory(checkpoint_dir)
        inputs.add_directory(target_model_dir)
        out = check_output_path(save_io, inputs, force=True)
    d = read_drafter(draft_gguf)
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
    # torch (seconds to import) only now: every input above is read and checked, so a bad one is one line at once
    import torch

    # the runtime modules import torch as well
    from .runtime.device import resolve_device
    from .runtime.diagnose import decoded_by_name, decoded_from_checkpoint, hparam_differences, tensor_differences
    from .runtime.forward import gather_features, run_gguf
    from .runtime.reference import load_reference, reference_features, reference_forwards, semantics_differ
    from .runtime.weights import load_weights

    dev = resolve_device(device)
    model = load_reference(ckpt, target, drafter=written, device=dev)
    if model.drafter.hidden_size != d.hidden_size or len(model.drafter.target_layers) != len(d.target_layers):
        raise InputFileError(f"the checkpoint's drafter (hidden {model.drafter.hidden_size}, {len(model.drafter.target_layers)} "
                             f"taps) is not this file's (hidden {d.hidden_size}, {len(d.target_layers)} taps)", checkpoint_dir)
    if captured is not None:
        feats, ref_feats, ids, pos = file_inputs(d, model, captured, context)
        streams = None
    elif features == "target":
        assert target is not None
        streams, ids, pos = captured_inputs(d, target, context, seed, dev)
        feats = gather_features(d, streams)
        ref_feats = reference_features(model, streams)
    else:
        streams = None
        feats, ids, pos = synthetic_inputs(d, context, seed)
        ref_feats = feats
    weights = load_weights(d, target, device=dev)
    got = run_gguf(d, weights, feats, ids, pos)
    # the trained semantics too where they can differ from llama.cpp's (else it is the same forward):
    # both from one pass over the output head
    semantics = ("llama.cpp", "reference") if semantics_differ(model) else ("llama.cpp",)
    drafts = reference_forwards(model, ref_feats, ids, pos, semantics)
    want = drafts["llama.cpp"]
    failures = []
    own_draft = None  # DSpark: the file's own greedy chain, when the gates compare slots conditioned like the checkpoint's
    if weights.markov is not None:  # DSpark: compare the block slots both draft (a flipped layout drafts one more)
        got, want, slot_note = dspark_common_slots(got, want, d, model.drafter)
        if slot_note:
            failures.append(slot_note)
        else:
            own_draft, got = got, conditioned_like(weights, got, want, ids)
    if want.logits.shape != got.logits.shape:
        raise InputFileError(f"the checkpoint drafts {list(want.logits.shape)} logits, the file {list(got.logits.shape)}: "
                             "different vocabulary or block size", checkpoint_dir)
    limits = THRESHOLDS[cls]
    metrics = compare(got, want, limits.tie_margin, limits.tie_sd)
    failures += confidence_failures(got, want, metrics, limits)
    if own_draft is not None:
        match, n = int((own_draft.tokens.cpu() == want.tokens.cpu()).sum()), int(want.tokens.numel())
        metrics["draft_top1_agreement"], metrics["draft_matches"] = match / n if n else 1.0, match
    selector = selector_agreement(got, want)  # DFlash2: reported, never gating
    if selector is not None:
        metrics["selector"] = selector
    if not metrics["hidden_max_rel_err"] <= limits.hidden_max_rel:
        failures.append(f"hidden states differ: max rel error {metrics['hidden_max_rel_err']:.3g} > {limits.hidden_max_rel:g} "
                        f"(max abs error {metrics['hidden_max_abs_err']:.3g})")
    by_acceptance = captured is not None and cls in ACCEPTANCE_GATED  # the acceptance gate judges the drafts instead
    if not by_acceptance and not metrics["top1_agreement_tie_aware"] >= limits.top1_min:
        failures.append(f"drafted tokens differ: top-1 agreement {metrics['top1_agreement_tie_aware']:.3f} counting near-ties "
                        f"({metrics['top1_matches']}/{metrics['slots']} exact) < {limits.top1_min:g}")
    if not by_acceptance and not metrics["kl_mean"] <= limits.kl_max:
        failures.append(f"draft distributions differ: mean KL {metrics['kl_mean']:.3g} > {limits.kl_max:g}")
    # name what differs, always: a wrong target_layers is invisible to synthetic features, and a
    # scaled norm can hide inside a 4-bit file's forward rounding; the weights cannot hide it
    failures += [f"hyper-parameter differs from the checkpoint's: {x}" for x in hparam_differences(d, model.drafter)]
    failures += [f"tensor differs: {x}" for x in tensor_differences(
        d, written, dev, file_values=decoded_by_name(weights.decoded),
        checkpoint_values=decoded_from_checkpoint(model.tensors, ckpt.files))]
    # what the runner computes is moot for a file llama.cpp refuses or cannot run: validate's verdict counts
    summary = failure_summary(validate(draft_gguf))
    if summary is not None:
        failures.append(f"the file fails validate, so llama.cpp cannot run it as checked here ({summary})")

    if captured is not None:
        acceptance = compare_acceptance(d, weights, model, captured, cls)
        metrics["acceptance"] = acceptance
        if acceptance["lost"] > acceptance["allowance"]:
            failures.append(f"accepted tokens lost: the file accepts {acceptance['file']['accept']:.3f} of its drafted tokens, "
                            f"the checkpoint {acceptance['checkpoint']['accept']:.3f}: {acceptance['lost']:.3f} more than "
                            f"{acceptance['allowance']:g} ({cls}) lost")

    warnings = [f"embedding/head: {n}" for n in model.notes]
    gap = compare(want, drafts.get("reference", want))
    gap["differs"] = gap["top1_agreement"] < 1.0 or gap["hidden_max_abs_err"] > SEMANTICS_HIDDEN_TOL
    if gap["differs"]:
        warnings.append(f"llama.cpp does not run this drafter as it was trained: top-1 agreement between llama.cpp's "
                        f"semantics and the trained model's is {gap['top1_agreement']:.3f} ({gap['top1_matches']}/{gap['slots']}), "
                        f"hidden max abs difference {gap['hidden_max_abs_err']:.3g}")

    metrics["against_reference_gguf"] = None
    found_by_name = reference_gguf is None and cls not in FLOAT_TYPE_NAMES
    if found_by_name:
        reference_gguf = find_sibling(draft_gguf, ft_name)
    if reference_gguf is not None:
        try:
            rd, base = _run_file(reference_gguf, target, dev, feats, ids, pos, streams)
            if base.logits.shape != got.logits.shape:
                raise InputFileError(f"drafts {list(base.logits.shape)} logits, the checked file {list(got.logits.shape)}: "
                                     "not a sibling of the checked file", reference_gguf)
        except DFlashError as e:
            if not found_by_name:  # asked for: its fault is the user's to see
                raise
            warnings.append(f"no quantization report: the file named like a full-precision sibling is not one ({e})")
        else:
            q = compare(got, base, limits.tie_margin, limits.tie_sd)
            r_ft, r_cls = precision_class(rd)
            if r_cls not in FLOAT_TYPE_NAMES:
                warnings.append(f"the reference GGUF is {r_ft}, not full precision: the quantization report is relative")
            metrics["against_reference_gguf"] = {"file": str(reference_gguf), "file_type": r_ft,
                                                 "found_by_name": found_by_name, **q}

    if out is not None:
        slots = torch.arange(len(ids) - got.tokens.shape[0], len(ids)) if weights.markov is not None else None
        arrays = save_io_arrays(feats, ids, pos, own_draft or got, want, slots)
        if own_draft is not None:
            arrays.update(given_ref_arrays(got))
        warnings += write_npz_atomic(out, arrays)
    return CheckReport(file=str(draft_gguf), checkpoint=str(checkpoint_dir), device=str(dev), file_type=ft_name,
                       precision_class=cls, metrics=metrics, thresholds=limits, failures=failures, warnings=warnings,
                       semantics_gap=gap)




__all__ = ["FEATURES", "SCHEMA", "THRESHOLDS", "TIE_MARGIN", "CheckReport", "Thresholds", "captured_inputs", "check",
           "compare", "find_sibling", "kl_mean", "near_ties", "precision_class", "save_io_arrays",
           "synthetic_inputs"]
