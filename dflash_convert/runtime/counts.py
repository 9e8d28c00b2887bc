"""llama-speculative-simple's counts, without torch: what ``accept``, ``sweep`` and the search report."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoopCount:
    """llama-speculative-simple's statistics for one sequence (or summed over several)."""

    n_drafted: int = 0
    n_accept: int = 0
    n_predict: int = 0
    steps: int = 0
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def accept(self) -> float:
        """n_accept / n_drafted, as llama-speculative-simple prints it (as a fraction)."""
        return self.n_accept / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Drafted tokens accepted per verification step."""
        return self.n_accept / self.steps if self.steps else 0.0

    def add(self, other: LoopCount) -> None:
        """Add another count to this one."""
        self.n_drafted += other.n_drafted
        self.n_accept += other.n_accept
        self.n_predict += other.n_predict
        self.steps += other.steps
        self.accepted_per_step += other.accepted_per_step


__all__ = ["LoopCount"]
