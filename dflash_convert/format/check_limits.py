"""``check``'s limits per precision class, as data: the forward gates, near-tie margins and acceptance allowances.

A file is judged by the loosest precision class of its ``general.file_type`` and every matrix's ggml
type (``PRECISION_CLASS``; a file type's class is its matrix type's, from ``file_types.FILE_TYPES``).
What each limit means and how each row was measured and calibrated: docs/check.md, "Thresholds".
"""

from __future__ import annotations

from dataclasses import dataclass

from .file_types import FILE_TYPES
from .ggml import GGMLType

# nats: a flipped slot whose token the reference rates this close to its own top-1 is a near-tie
TIE_MARGIN = 0.1
# the two semantics of one float64 reference: anything above this is a difference in the graph, not rounding
SEMANTICS_HIDDEN_TOL = 1e-6


@dataclass(frozen=True)
class Thresholds:
    """Pass limits of one precision class (docs/check.md, "Thresholds")."""

    hidden_max_rel: float
    top1_min: float
    kl_max: float
    tie_margin: float = TIE_MARGIN  # nats: a flip between tokens this close in the reference counts as agreeing
    tie_sd: float = 0.0  # ... or this close in standard deviations of the slot's reference logits

    def as_dict(self) -> dict[str, float]:
        """The limits as the JSON report writes them."""
        return {"hidden_max_rel": self.hidden_max_rel, "top1_min": self.top1_min, "kl_max": self.kl_max,
                "tie_margin": self.tie_margin, "tie_sd": self.tie_sd}


# precision class -> limits, strictest first (the order picks the loosest class of a file)
THRESHOLDS: dict[str, Thresholds] = {
    "F32": Thresholds(1e-4, 1.0, 1e-6, 1e-4, 0.0),
    "F16": Thresholds(5e-3, 0.9, 1e-3, 1e-2, 0.02),
    "BF16": Thresholds(6e-2, 0.85, 5e-3, 5e-2, 0.1),
    "Q8_0": Thresholds(6e-2, 0.85, 5e-3, 5e-2, 0.1),
    "Q6_K": Thresholds(0.2, 0.8, 2e-2, 0.1, 0.25),
    "Q5": Thresholds(0.4, 0.75, 5e-2, 0.1, 0.8),
    "Q4": Thresholds(0.7, 0.65, 0.15, 0.1, 1.0),
    "Q3_K": Thresholds(1.3, 0.5, 0.4, 0.1, 2.0),
    "Q2_K": Thresholds(1.6, 0.35, 0.8, 0.1, 3.5),
    "Q1": Thresholds(2.4, 0.25, 0.95, 0.1, 3.5),
}

# acceptance a file may lose against its checkpoint (accepted / drafted, absolute), per class
ACCEPT_ALLOWANCE: dict[str, float] = {
    "F32": 0.005, "F16": 0.01, "BF16": 0.01, "Q8_0": 0.02, "Q6_K": 0.02, "Q5": 0.03, "Q4": 0.07, "Q3_K": 0.07,
    "Q2_K": 0.13, "Q1": 1.0,
}
# classes whose top-1 and KL gates come from random drafters only: with a features file the acceptance gate replaces them
ACCEPTANCE_GATED = ("Q8_0", "Q6_K", "Q5", "Q4", "Q3_K", "Q2_K", "Q1")

# ggml type -> precision class
_TYPE_CLASS: dict[GGMLType, str] = {
    GGMLType.F32: "F32", GGMLType.F64: "F32", GGMLType.F16: "F16", GGMLType.BF16: "BF16",
    GGMLType.Q8_0: "Q8_0", GGMLType.Q8_1: "Q8_0", GGMLType.Q8_K: "Q8_0", GGMLType.Q6_K: "Q6_K",
    GGMLType.Q5_0: "Q5", GGMLType.Q5_1: "Q5", GGMLType.Q5_K: "Q5",
    GGMLType.Q4_0: "Q4", GGMLType.Q4_1: "Q4", GGMLType.Q4_K: "Q4", GGMLType.IQ4_NL: "Q4", GGMLType.IQ4_XS: "Q4",
    GGMLType.Q3_K: "Q3_K", GGMLType.Q2_K: "Q2_K",
    GGMLType.IQ3_XXS: "Q3_K", GGMLType.IQ3_S: "Q3_K", GGMLType.TQ1_0: "Q1", GGMLType.TQ2_0: "Q1",
    GGMLType.Q1_0: "Q1", GGMLType.Q2_0: "Q1",
    GGMLType.IQ2_XXS: "Q1", GGMLType.IQ2_XS: "Q1", GGMLType.IQ2_S: "Q1", GGMLType.IQ1_S: "Q1", GGMLType.IQ1_M: "Q1",
}
# ggml type name or file type name -> precision class (a file type is judged as its matrix type)
PRECISION_CLASS: dict[str, str] = {t.name: c for t, c in _TYPE_CLASS.items()} | {
    name: _TYPE_CLASS[ft.matrix_type] for name, ft in FILE_TYPES.items()}
