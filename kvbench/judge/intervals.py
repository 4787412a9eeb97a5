"""95% intervals for scores that are fractions of a whole (retrieval scores, 0-100).

A Wilson score interval: it stays inside [0, 100] and does not collapse to a point when every
sample scored the same (5 samples all at 0 still leave room up to ~43%), which a normal
interval on so few samples would.
"""
from __future__ import annotations

import math

Z_95 = 1.959963984540054


def wilson_interval(mean_percent: float, samples: int, z: float = Z_95) -> tuple[float, float]:
    """(low, high) in percent for a mean score `mean_percent` (0-100) over `samples` samples.
    Exact as a binomial interval when every sample scores 0 or 100; for partial scores (a
    fraction of references found) it treats the mean as a proportion, which is conservative."""
    if samples < 1:
        raise ValueError("an interval needs at least one sample")
    p = min(max(mean_percent / 100.0, 0.0), 1.0)
    denominator = 1 + z * z / samples
    centre = (p + z * z / (2 * samples)) / denominator
    half = z * math.sqrt(p * (1 - p) / samples + z * z / (4 * samples * samples)) / denominator
    # at p = 0 or 1 the bound is p itself; computed, it can land a rounding error past it
    low = 0.0 if p == 0 else max(0.0, centre - half)
    high = 1.0 if p == 1 else min(1.0, centre + half)
    return low * 100.0, high * 100.0
