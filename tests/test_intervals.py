"""The Wilson interval of retrieval scores: textbook values, exact ends, never empty."""
import math

import pytest

from kvbench.judge.intervals import wilson_interval


def test_matches_the_textbook_wilson_interval():
    # 7 of 20 (35%): p +- z sqrt(p(1-p)/n + z^2/4n^2), centred at (p + z^2/2n), over 1 + z^2/n
    z, n, p = 1.959963984540054, 20, 0.35
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = wilson_interval(35.0, n)
    assert low == pytest.approx(100 * (centre - half)) and high == pytest.approx(100 * (centre + half))
    assert (round(low, 1), round(high, 1)) == (18.1, 56.7)


@pytest.mark.parametrize("n", range(1, 60))
def test_all_wrong_or_all_right_ends_exactly_at_the_score_and_leaves_room(n):
    low, high = wilson_interval(0.0, n)
    assert low == 0.0 and high > 0  # no rounding error below the score: plots take score - low
    low, high = wilson_interval(100.0, n)
    assert high == 100.0 and low < 100


def test_two_samples_say_little():
    assert wilson_interval(0.0, 2)[1] > 60 and wilson_interval(50.0, 2) == pytest.approx(
        (100 - wilson_interval(50.0, 2)[1], wilson_interval(50.0, 2)[1]))


def test_needs_a_sample():
    with pytest.raises(ValueError, match="at least one sample"):
        wilson_interval(50.0, 0)
