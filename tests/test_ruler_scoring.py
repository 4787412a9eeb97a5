"""kvbench.benchmarks.measure.ruler_scoring against NVIDIA RULER's scoring
(scripts/eval/evaluate.py's postprocess_pred, scripts/eval/synthetic/constants.py's
string_match_all / string_match_part)."""
import re

import pytest

from kvbench.benchmarks.measure.ruler_scoring import (
    postprocess, sample_score, string_match_all, string_match_part,
)


def upstream_all(preds, refs):  # constants.py, verbatim but for round(., 2)
    return sum([sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref)
                for pred, ref in zip(preds, refs)]) / len(preds) * 100


def upstream_part(preds, refs):
    return sum([max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref])
                for pred, ref in zip(preds, refs)]) / len(preds) * 100


def upstream_postprocess(predict_str):  # evaluate.py's postprocess_pred
    predict_str = predict_str.strip()
    np_pattern = re.compile(r'[\x00-\x1f]')
    return np_pattern.sub('\n', predict_str).strip()


def test_all_gives_partial_credit():
    refs = [["1234567", "7654321", "1111111", "2222222"]]
    assert string_match_all(["1234567 and 7654321."], refs) == 50.0
    assert sample_score("1234567 and 7654321.", refs[0], "all") == 50.0
    assert string_match_all(["2222222, 1111111, 7654321, 1234567"], refs) == 100.0


def test_part_is_any_reference():
    refs = [["Agnes Ferrow", "Ferrow", "the engineer Agnes Ferrow"]]
    assert string_match_part(["It was Ferrow."], refs) == 100.0
    assert sample_score("It was Ferrow.", refs[0], "part") == 100.0
    assert string_match_all(["It was Ferrow."], refs) == pytest.approx(100 / 3)
    assert string_match_part(["It was Smith."], refs) == 0.0


def test_case_insensitive_both_ways():
    assert string_match_all(["THE WORDS: APPLE-PIE"], [["apple-pie"]]) == 100.0
    assert string_match_part(["the answer is calder"], [["River CALDER", "Calder"]]) == 100.0
    assert sample_score("Fcaf615D-5609", ["fcaf615d-5609"], "all") == 100.0


def test_substring_not_token_match():
    # RULER checks `r in pred`: a reference inside a longer number still counts
    assert sample_score("91234567", ["1234567"], "all") == 100.0
    assert sample_score("123456", ["1234567"], "all") == 0.0


def test_empty_prediction_scores_zero():
    assert string_match_all([""], [["a", "b"]]) == 0.0
    assert string_match_part([""], [["a"]]) == 0.0
    assert sample_score(postprocess("  \n\t "), ["x"], "part") == 0.0


def test_means_over_samples_match_upstream():
    preds = ["alpha beta", "GAMMA", "", "delta epsilon zeta", "nothing"]
    refs = [["alpha", "beta", "gamma"], ["gamma"], ["x"], ["zeta", "eta", "delta", "theta"],
            ["no", "thing", "nothing!"]]
    assert string_match_all(preds, refs) == pytest.approx(upstream_all(preds, refs))
    assert string_match_part(preds, refs) == pytest.approx(upstream_part(preds, refs))
    for metric, fn in (("all", string_match_all), ("part", string_match_part)):
        mean = sum(sample_score(p, r, metric) for p, r in zip(preds, refs)) / len(preds)
        assert mean == fn(preds, refs)
    # "eta" is found inside "zeta": 3 of 4 there
    assert string_match_all(preds, refs) == pytest.approx((200 / 3 + 100 + 0 + 75 + 200 / 3) / 5)
    assert string_match_part(preds, refs) == 80.0


def test_postprocess_control_characters_to_newlines():
    raw = "  \x00The answer\tis\x1b[0m 42\r\nok\x1f  \n"
    assert postprocess(raw) == "The answer\nis\n[0m 42\n\nok"
    assert postprocess(raw) == upstream_postprocess(raw)
    assert postprocess("\x7fkeep\x7f") == "\x7fkeep\x7f"  # DEL is not in \x00-\x1f
    assert postprocess("\t\n") == ""


def test_bad_input():
    with pytest.raises(ValueError, match="metric"):
        sample_score("a", ["a"], "exact")
    with pytest.raises(ValueError, match="no predictions"):
        string_match_all([], [])
    with pytest.raises(ValueError, match="2 predictions for 1"):
        string_match_part(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="at least one reference"):
        sample_score("a", [], "all")
    with pytest.raises(TypeError, match="not one string"):
        sample_score("abc", "abc", "all")
