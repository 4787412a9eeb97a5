"""What the retrieval benchmarks' report sections (niah, ruler) share: how they print a score,
its interval and a compression ratio, and their leaderboard's columns."""
from __future__ import annotations

import math

from kvbench.reportkit.benchmark import Board

# niah's and ruler's leaderboard: the score against the compression ratio
BOARD = Board("compression_ratio", "score", ("retained_kv", "score_ci_low", "score_ci_high"))


def pct(value: float) -> str:
    return f"{value:.1f}"


def ci(value: float, low: float | None, high: float | None) -> str:
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return pct(value)
    return f"{pct(value)} [{pct(low)}–{pct(high)}]"


def ratio_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"
