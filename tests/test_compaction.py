"""The compaction benchmark (seed 000's demo) on the tiny model: identity keeps and answers as the
plain cache does; a compacting method keeps its budget; bad settings are refused. (That the
probe becomes am_task's reference queries: tests/test_token_methods.py.)"""
import pytest

from kvbench.benchmarks import measurement
from kvbench.benchmarks.specs.compaction import Compaction, CompactionParams
from kvbench.methods import implementation
from kvbench.methods.settings.base import build_method
from tests.plugins.model_runs import cpu_context

PARAMS = CompactionParams(
    trajectory="The tower stands in the old city square. It was finished in the year 1889,"
               " after two years of work by three hundred men.",
    task="When was the tower finished?", chat=False, max_new_tokens=8)


def _run(method, params=PARAMS, repeats=1):
    """Compaction on the tiny model; `method` is settings, run as their torch implementation."""
    return measurement(Compaction).run(params, implementation(method),
                                       cpu_context("tiny:llama", repeats))


def test_identity_keeps_everything_and_answers_as_the_plain_cache():
    out = _run(build_method("identity"))
    assert out.metrics["retention"].value == 1
    assert out.metrics["answer_agreement"].value == 1
    assert out.info["answer"] == out.info["plain_answer"]
    assert "answer_holds_fact" not in out.metrics  # no `expect` given


def test_am_task_compacts_the_passage_to_its_budget():
    with_probe = _run(build_method("am_task", {"ratio": 0.3}))
    metrics = with_probe.metrics
    prompt = metrics["prompt_tokens"].value
    assert metrics["kept_tokens"].value == round(0.3 * prompt)
    assert metrics["retention"].value == pytest.approx(round(0.3 * prompt) / prompt)
    assert metrics["compaction_s"].value > 0
    assert set(with_probe.info["kept_tokens_per_layer"]) == {round(0.3 * prompt)}


def test_compaction_is_timed_per_repeat_against_its_prefill():
    metrics = _run(build_method("am_task", {"ratio": 0.3}), repeats=3).metrics
    assert len(metrics["compaction_s"].samples) == 3 and metrics["compaction_s"].timing == "absolute"
    ratio = metrics["compaction_vs_prefill"]
    assert len(ratio.samples) == 3 and ratio.timing == "ratio" and ratio.min > 0


def test_expect_is_checked_against_both_answers():
    params = CompactionParams(**{**PARAMS.__dict__, "expect": "zzz-not-there"})
    out = _run(build_method("identity"), params)
    assert out.metrics["answer_holds_fact"].value == 0
    assert out.metrics["plain_holds_fact"].value == 0


def test_a_model_without_a_chat_template_is_refused():
    params = CompactionParams(**{**PARAMS.__dict__, "chat": True})
    with pytest.raises(ValueError, match="no chat template"):
        _run(build_method("identity"), params)


@pytest.mark.parametrize("field, value", [("max_new_tokens", 0), ("task", " ")])
def test_bad_params_are_refused(field, value):
    with pytest.raises(ValueError):
        CompactionParams(**{**PARAMS.__dict__, field: value})


@pytest.mark.model
def test_bundled_model_answers_from_the_compacted_eiffel_passage(bundled):
    """Seed 000's demo on the real model: am_task keeps about a third and the answer keeps the
    year."""
    ctx = cpu_context(loaded=bundled)
    params = CompactionParams(
        trajectory="The Eiffel Tower is located in Paris, France. It was built in 1889.",
        task="What year was the Eiffel Tower built?", expect="1889")
    out = measurement(Compaction).run(params, implementation(build_method("am_task")), ctx)
    assert out.metrics["plain_holds_fact"].value == 1
    assert out.metrics["answer_holds_fact"].value == 1
    assert 0.2 < out.metrics["retention"].value < 0.5


def test_a_method_that_cannot_take_the_probe_back_is_told_to_skip_it():
    with pytest.raises(ValueError, match="set probe: false"):
        _run(build_method("butterfly", {"block_size": 4, "window": 4}))
    no_probe = CompactionParams(**{**PARAMS.__dict__, "probe": False})
    out = _run(build_method("butterfly", {"block_size": 4, "window": 4}), no_probe)
    # the 4 newest raw tokens plus one summary per completed 4-token block
    kept = out.metrics["kept_tokens"].value
    assert kept == 4 + out.metrics["prompt_tokens"].value // 4
