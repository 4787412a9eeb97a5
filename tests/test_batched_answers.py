"""The samples of a retrieval case decoded together (kvbench.models.batch_step through
session.step_rows) answer as each decoded alone: every shipped method on the bundled model, both
compress settings, prompts of different lengths stopping at different steps; on torch and MLX."""
from __future__ import annotations

import pytest

from kvbench.benchmarks.measure.answering import Prompt, answer_all
from kvbench.models.shared_prefill import PrefillStore
from tests.plugins.model_runs import methods_on

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]

# every method kvbench ships, at settings for the bundled model's 300-600-token prompts
EVERY_METHOD = [
    ("identity", {}), ("intq", {"bits": 4}), ("intq", {"bits": 2, "prefill_reads": "stored"}),
    ("kivi", {"bits": 2, "group_size": 32, "residual": 128}), ("lloydmax", {}),
    ("turbo", {"bits": 3, "block": 64}), ("turbo2", {"block": 64}), ("turbo2.5", {"block": 64}),
    ("turbo3", {"block": 64}), ("turbo3.5", {"block": 64}), ("turbo4", {"block": 64}),
    ("adaptive", {"base_params": {"block": 64}}), ("decay", {"base_params": {"block": 64}}),
    ("sparse_v", {}),
    ("streamingllm", {"ratio": 0.25}), ("snapkv", {"ratio": 0.25}), ("h2o", {"ratio": 0.25}),
    ("am", {"ratio": 0.25}), ("am_task", {"ratio": 0.25}), ("butterfly", {}),
]
# a codec and a running eviction that watches the queries (the slow test takes every method)
QUICK = [EVERY_METHOD[i] for i in (1, 16)]


def _prompts(tok) -> list[Prompt]:
    """Needles of different lengths: the rows answer in different numbers of steps."""
    filler = "The grass is green and the sky is blue. The river runs to the sea. "
    made = []
    for i, repeats in enumerate((18, 27, 36)):
        context = tok.encode(f"<|im_start|>user\nThe special magic number for item{i} is"
                             f" {4172 + 981 * i}. " + filler * repeats)
        made.append(Prompt(context, tok.encode(
            f" What is the special magic number for item{i}?<|im_end|>\n<|im_start|>assistant\n"
            "The special magic number is")))
    return made


def _answers_alike(session, methods):
    backend, prompts = session.memo_key[0], _prompts(session.tokenizer)
    store = PrefillStore()
    calibration = session.tokenizer.encode("A calibration text about rivers and seas. " * 20)
    try:
        for method in methods_on(backend, methods):
            session.calibrate(method, calibration)
            for compress in ("context", "context+question"):
                budgets = [24, 2, 16]  # one row stops on its budget before the others
                alone = [answer_all(session, method, [p], compress, [n], shared=store)[0]
                         for p, n in zip(prompts, budgets)]
                together = answer_all(session, method, prompts, compress, budgets, shared=store)
                assert together == alone, (method.name, method.settings, compress)
                assert len({a.generated for a in alone}) > 1  # rows ended at different steps
    finally:
        store.close()


# MLX on the bundled model is slow here (a reference BLAS): the quick test takes the tiny model;
# the bundled model on torch (~20-50 s) is in the slow run
@pytest.mark.parametrize("session_fixture", [
    pytest.param("bundled_session", marks=pytest.mark.slow), "tiny_mlx_session"])
def test_samples_decoded_together_answer_as_alone(request, session_fixture):
    _answers_alike(request.getfixturevalue(session_fixture), QUICK)


@pytest.mark.slow
@pytest.mark.parametrize("session_fixture", ["bundled_session", "bundled_mlx_session"])
def test_every_shipped_method_answers_alike_decoded_together(request, session_fixture):
    _answers_alike(request.getfixturevalue(session_fixture), EVERY_METHOD)
