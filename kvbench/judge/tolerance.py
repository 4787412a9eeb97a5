"""How far a metric may move before the gate calls it a regression (torch-free: the gate,
compare and report use it without the suite loader)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """A metric may move this far in its worse direction before the gate calls it a regression."""

    abs: float | None = None
    rel: float | None = None

    def allowed(self, baseline: float) -> float:
        slack = [0.0]
        if self.abs is not None:
            slack.append(self.abs)
        if self.rel is not None:
            slack.append(self.rel * abs(baseline))
        return max(slack)

    def __str__(self) -> str:
        parts = [f"{name} {value:g}" for name, value in (("abs", self.abs), ("rel", self.rel))
                 if value is not None]
        return " or ".join(parts) or "exact"


# When a suite names none: a metric may move 5% in its worse direction.
DEFAULT_TOLERANCE = Tolerance(rel=0.05)
