"""NVIDIA RULER's scoring: postprocess_pred (scripts/eval/evaluate.py) and string_match_all /
string_match_part (scripts/eval/synthetic/constants.py; niah, vt, cwe and fwe use "all", qa
"part").

Both metrics are case-insensitive (RULER lowercases the reference and the prediction) and
substring-based: a reference counts when it occurs anywhere in the prediction. RULER returns
round(mean * 100, 2); here the means are not rounded, so that the mean of sample_score over the
samples equals the list functions exactly. As in evaluate.py, predictions are postprocessed
before they are scored: call postprocess() first (the metrics themselves do not).
"""
from __future__ import annotations

import re
from typing import Sequence

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """RULER's postprocess_pred: strip, every control character (0x00-0x1f) to a newline,
    strip again."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def _hits(prediction: str, references: Sequence[str]) -> list[float]:
    if isinstance(references, str):
        raise TypeError("references must be a sequence of strings, not one string")
    if not references:
        raise ValueError("a sample needs at least one reference")
    lowered = prediction.lower()
    return [1.0 if r.lower() in lowered else 0.0 for r in references]


def sample_score(prediction: str, references: Sequence[str], metric: str) -> float:
    """One sample's 0-100 score: "all", the share of the references found in the prediction;
    "part", 100 if any is found. Their mean over samples is string_match_all / _part."""
    hits = _hits(prediction, references)
    if metric == "all":
        return 100.0 * sum(hits) / len(hits)
    if metric == "part":
        return 100.0 * max(hits)
    raise ValueError(f"unknown RULER metric {metric!r} (expected 'all' or 'part')")


def _mean(predictions: list[str], references: list[list[str]], metric: str) -> float:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} reference lists")
    if not predictions:
        raise ValueError("no predictions to score")
    return sum(sample_score(p, r, metric) for p, r in zip(predictions, references)) / len(predictions)


def string_match_all(predictions: list[str], references: list[list[str]]) -> float:
    """RULER's string_match_all: the mean over samples of the share of a sample's references
    that occur (case-insensitively) in its prediction, 0-100."""
    return _mean(predictions, references, "all")


def string_match_part(predictions: list[str], references: list[list[str]]) -> float:
    """RULER's string_match_part: the share of samples where any reference occurs
    (case-insensitively) in the prediction, 0-100. Not lm-eval's ruler string_match_part, which
    takes the largest per-sample share of references found, divided by the number of samples."""
    return _mean(predictions, references, "part")
