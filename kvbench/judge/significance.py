"""Mann-Whitney U: did a timing's repeats move, or is the difference what noise gives?

Exact for the sample sizes a suite's repeats give (the null distribution of U is the coefficient
list of a Gaussian binomial), a normal approximation beyond. Deterministic: the same samples
always get the same p-value, so a gate verdict can be made again from the stored files.
"""
from __future__ import annotations

import math
from functools import cache

# Beyond this many (before x after) pairs, the normal approximation is within 1e-3 of the exact
# p-value and the exact tables would grow large.
EXACT_PAIRS = 2500


def shift_p_value(before: list[float], after: list[float], larger: bool) -> float:
    """One-sided p-value that `after` tends to be larger (larger=True) or smaller than
    `before`: P(U >= observed) under the hypothesis that both come from one distribution.
    Ties count half a pair; the no-ties null distribution then makes the test slightly
    conservative."""
    m, n = len(before), len(after)
    if not m or not n:
        raise ValueError("both sides need at least one sample")
    sign = 1 if larger else -1
    u = sum(1.0 if sign * (b - a) > 0 else 0.5 if b == a else 0.0
            for a in before for b in after)
    if m * n <= EXACT_PAIRS:
        counts = _u_counts(min(m, n), max(m, n))
        at_least = sum(counts[math.ceil(u):])
        return at_least / math.comb(m + n, m)
    mean, sd = m * n / 2, math.sqrt(m * n * (m + n + 1) / 12)
    z = (u - 0.5 - mean) / sd  # continuity correction
    return 0.5 * math.erfc(z / math.sqrt(2))


def smallest_p_value(m: int, n: int) -> float:
    """The smallest one-sided p-value m and n samples can give: below the level the test uses,
    or the repeats cannot show any difference at all."""
    return 1 / math.comb(m + n, m)


@cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many orderings of m + n distinct samples give U = 0 .. m*n: the coefficients of
    the Gaussian binomial [m+n choose m] = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i)."""
    poly = [1]
    for i in range(1, m + 1):
        poly += [0] * (n + i)
        for k in range(len(poly) - 1, n + i - 1, -1):  # times (1 - q^(n+i))
            poly[k] -= poly[k - n - i]
        for k in range(i, len(poly)):  # divided by (1 - q^i): a running sum with stride i
            poly[k] += poly[k - i]
    return tuple(poly[: m * n + 1])
