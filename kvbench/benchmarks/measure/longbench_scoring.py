"""The dataset benchmark's metrics: LongBench's (THUDM/LongBench, LongBench/metrics.py and eval.py)
and two plain string matches, each a per-answer score in [0, 1].

- qa_f1: LongBench's qa_f1_score, the token F1 of the two texts after normalize_answer
  (lowercase, punctuation and the articles a/an/the removed, whitespace collapsed).
- rouge_l: ROUGE-L F-measure from Google's `rouge-score` package (rouge_scorer, no stemming).
  LongBench calls the `rouge` package instead, whose tokenisation differs slightly.
- exact: 1 when both texts are equal after normalize_answer (SQuAD's exact match).
- contains: 1 when the reference's words, after normalize_answer, occur as a run of whole words
  in the prediction's.
- classification: LongBench's classification_score over the sample's classes.

sample_score is LongBench's scorer for one sample: the best score over its references, scaled
to 0-100, with the prediction cut to its first line first where asked (LongBench does so for
trec, triviaqa, samsum and lsht).
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Callable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """LongBench's normalize_answer: lower, punctuation removed, articles removed, whitespace
    collapsed (in that order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: Sequence[str], reference: Sequence[str]) -> float:
    """LongBench's f1_score over two token lists: the F1 of their common tokens (a multiset)."""
    same = sum((Counter(prediction) & Counter(reference)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(reference)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, reference: str, classes: Sequence[str] = ()) -> float:
    return token_f1(normalize_answer(prediction).split(), normalize_answer(reference).split())


def rouge_l(prediction: str, reference: str, classes: Sequence[str] = ()) -> float:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    return scorer.score(reference, prediction)["rougeL"].fmeasure


def exact(prediction: str, reference: str, classes: Sequence[str] = ()) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def contains(prediction: str, reference: str, classes: Sequence[str] = ()) -> float:
    # padded with spaces: whole words only ("cat" is not in "concatenate")
    return float(f" {normalize_answer(reference)} " in f" {normalize_answer(prediction)} ")


def classification(prediction: str, reference: str, classes: Sequence[str] = ()) -> float:
    """LongBench's classification_score: the classes named in the prediction, less those that are
    part of the reference without being it; 1 / their number when the reference is among them."""
    matches = [name for name in classes if name in prediction]
    # LongBench removes from the list while iterating over it, so the match after a removed one
    # is not looked at; kept, so that scores equal LongBench's
    for match in matches:
        if match in reference and match != reference:
            matches.remove(match)
    return 1.0 / len(matches) if reference in matches else 0.0


METRICS: dict[str, Callable[[str, str, Sequence[str]], float]] = {
    "qa_f1": qa_f1, "rouge_l": rouge_l, "exact": exact, "contains": contains,
    "classification": classification,
}


def first_line(prediction: str) -> str:
    """LongBench's cut for its few-shot tasks: the first line after any leading newlines."""
    return prediction.lstrip("\n").split("\n")[0]


def sample_score(prediction: str, references: Sequence[str], metric: str,
                 classes: Sequence[str] = (), only_first_line: bool = False) -> float:
    """One sample's 0-100 score: the best of `metric` over its references (LongBench's scorer)."""
    if isinstance(references, str):
        raise TypeError("references must be a sequence of strings, not one string")
    if not references:
        raise ValueError("a sample needs at least one reference")
    score = METRICS[metric]
    if only_first_line:
        prediction = first_line(prediction)
    return 100.0 * max(score(prediction, reference, classes) for reference in references)
