"""`ruler`: NVIDIA RULER's synthetic tasks answered through the method's cache.

Each sample is generated offline (kvbench.data.ruler, faithful to NVIDIA/RULER's
scripts/data/synthetic generators) to `length` tokens of the suite's model, its own
tokens_to_generate included, framed by the model's chat template, prefilled and compressed,
answered greedily through the compressed cache (kvbench.benchmarks.answering) and scored as
NVIDIA scores it (kvbench.benchmarks.ruler_scoring). Every sample's prompt hash, prediction,
references and score go to predictions.jsonl beside results.json.
"""
from __future__ import annotations

import statistics
from typing import Callable

from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.ruler import Ruler, RulerParams
from kvbench.benchmarks.measure.retrieval import (
    METRIC_NAMES, Reader, common_info, haystack_note, prompts_digest, score_metrics,
)
from kvbench.data.ruler import TASKS, read_qa
from kvbench.judge.intervals import wilson_interval
from kvbench.methods.core.contracts import Implementation

@measures(Ruler)
class RulerRun(Ruler):
    def run(self, params: RulerParams, method: Implementation, ctx: RunContext) -> BenchmarkOutput:
        reader = Reader.open(ctx, method, params.essay)
        spec = TASKS[params.task]
        qa_records = None
        if spec.needs_qa:
            qa_records = ctx.memo.get(("qa", params.qa_data, spec.needs_qa),
                                      lambda: read_qa(params.qa_data, spec.needs_qa))
        samples = []
        for index in range(params.samples):
            ctx.status(f"sample {index + 1}/{params.samples}: prompt")
            samples.append(reader.sample(
                (params.essay, params.qa_data), task=params.task, index=index,
                length=params.length, seed=params.data_seed,
                essay=reader.essay if spec.needs_essay else None, qa_records=qa_records))
        records, replies = reader.answer(method, samples, params, params.length,
                                         enough=precise_enough(params.half_width,
                                                               params.min_samples))
        scores = [r["score"] for r in records]
        return BenchmarkOutput(
            metrics=score_metrics(scores, replies),
            info={
                "scores": scores,
                "metric": METRIC_NAMES[spec.metric],
                "haystack": haystack_note(params.task, params.essay),
                "tokens_to_generate": spec.tokens_to_generate,
                "prompt_tokens": statistics.fmean(r["prompt_tokens"] for r in records),
                "prompt_sha256s": [r["prompt_sha256"] for r in records],
                "predictions": [r["prediction"] for r in records],  # the gate lists flips
                "stopped": stopped(len(records), params),
                **common_info(replies, method, params.reads,
                              reader.prefill_chunk(method, params.prefill_chunk, params.length)),
            },
            comparable={"prompts_sha256": prompts_digest(records), "model": reader.session.spec,
                        "model_dtype": reader.session.dtype},
        )


def precise_enough(half_width: float | None, min_samples: int) -> Callable[[list[float]], bool]:
    """Whether the scores so far are enough: at least min_samples, and the 95% Wilson interval
    of their mean within half_width points either side (never, without a half_width)."""
    def enough(scores: list[float]) -> bool:
        if half_width is None or len(scores) < min_samples:
            return False
        low, high = wilson_interval(statistics.fmean(scores), len(scores))
        return (high - low) / 2 <= half_width

    return enough


def stopped(answered: int, params: RulerParams) -> str:
    if params.half_width is None:
        return f"{answered} samples, as asked"
    if answered < params.samples:
        return f"{answered} samples: the interval reached ±{params.half_width:g} points"
    return (f"{answered} samples, the most asked: the interval did not reach"
            f" ±{params.half_width:g} points")
