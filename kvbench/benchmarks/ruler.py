"""`ruler`: NVIDIA RULER's synthetic tasks answered through the method's cache.

Each sample is generated offline (kvbench.data.ruler, faithful to NVIDIA/RULER's
scripts/data/synthetic generators) to `length` tokens of the suite's model, its own
tokens_to_generate included, framed by the model's chat template, prefilled and compressed,
answered greedily through the compressed cache (kvbench.benchmarks.answering) and scored as
NVIDIA scores it (kvbench.benchmarks.ruler_scoring). Every sample's prompt hash, prediction,
references and score go to predictions.jsonl beside results.json.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

from kvbench.benchmarks.base import BenchmarkOutput, RunContext, check_at_least, register_benchmark
from kvbench.benchmarks.retrieval import (
    METRIC_NAMES, Reader, RetrievalBenchmark, RetrievalParams, common_info, haystack_note,
    one_of, prompts_digest, score_metrics,
)
from kvbench.data.ruler import TASKS, read_qa
from kvbench.data.text import resolve_text
from kvbench.methods.base import Method
from kvbench.models.info import ModelInfo

_QA_FILES = {"squad": "SQuAD v2 dev JSON (dev-v2.0.json, as RULER's qa_1)",
             "hotpotqa": "HotpotQA dev distractor JSON (hotpot_dev_distractor_v1.json, as"
                         " RULER's qa_2)"}


@dataclass
class RulerParams(RetrievalParams):
    """Parameters of the ruler benchmark, and RetrievalParams' data_seed, compress, essay, reads.

    task: str = "niah_single_1" — one of RULER's tasks (kvbench.data.ruler.TASKS).
    length: int = 1024 — model tokens of the whole prompt, the task's tokens_to_generate included.
    samples: int = 10 — prompts per case.
    qa_data: str | None = None — qa_1: SQuAD v2 dev JSON; qa_2: HotpotQA dev distractor JSON (a
        file, or a cached hf: source); other tasks ignore it.
    """

    task: str = "niah_single_1"
    length: int = 1024
    samples: int = 10
    qa_data: str | None = None

    def __post_init__(self):
        one_of("task", self.task, list(TASKS))
        check_at_least(self, {"length": 256, "samples": 1})
        super().__post_init__()


@register_benchmark("ruler")
class Ruler(RetrievalBenchmark):
    """RULER's tasks through the cache; essay haystacks are pydoc text, not Paul Graham's.

    NVIDIA RULER's synthetic long-context tasks (niah, vt, cwe, fwe; qa_1/qa_2 with a local
    SQuAD or HotpotQA), generated offline to `length` model tokens and answered through the
    method's cache, scored as NVIDIA does. Essay haystacks are the `essay` text (pydoc by
    default) in place of Paul Graham's essays; the noise haystacks are RULER's own."""

    Params = RulerParams

    def resolve_paths(self, params: RulerParams, base_dir: Path) -> RulerParams:
        params = super().resolve_paths(params, base_dir)
        if params.qa_data is not None and not params.qa_data.startswith("hf:"):
            params = dataclasses.replace(params, qa_data=resolve_text(params.qa_data, base_dir))
        return params

    def check(self, params: RulerParams, model: ModelInfo | None) -> None:
        kind = TASKS[params.task].needs_qa
        if kind and params.qa_data is None:
            raise ValueError(f"task {params.task} reads {kind}, which kvbench does not ship: set"
                             f" qa_data to a local {_QA_FILES[kind]} or a cached hf: source")
        if kind and not params.qa_data.startswith("hf:") and not Path(params.qa_data).is_file():
            raise ValueError(f"qa_data file {params.qa_data!r} does not exist")
        self.check_model(params, model, params.length)

    def run(self, params: RulerParams, method: Method, ctx: RunContext) -> BenchmarkOutput:
        reader = Reader.open(ctx, method, params.essay)
        spec = TASKS[params.task]
        qa_records = None
        if spec.needs_qa:
            qa_records = ctx.memo.get(("qa", params.qa_data, spec.needs_qa),
                                      lambda: read_qa(params.qa_data, spec.needs_qa))
        records, replies = [], []
        for index in range(params.samples):
            ctx.status(f"sample {index + 1}/{params.samples}: prompt")
            sample = reader.sample(
                (params.essay, params.qa_data), task=params.task, index=index,
                length=params.length, seed=params.data_seed,
                essay=reader.essay if spec.needs_essay else None, qa_records=qa_records)
            record, reply = reader.answer(method, sample, params)
            records.append(record)
            replies.append(reply)
        scores = [r["score"] for r in records]
        return BenchmarkOutput(
            metrics=score_metrics(scores, replies),
            info={
                "scores": scores,
                "metric": METRIC_NAMES[spec.metric],
                "haystack": haystack_note(params.task, params.essay),
                "tokens_to_generate": spec.tokens_to_generate,
                "prompt_tokens": statistics.fmean(r["prompt_tokens"] for r in records),
                **common_info(replies, method, params.reads),
            },
            comparable={"prompts_sha256": prompts_digest(records), "model": reader.session.spec,
                        "model_dtype": reader.session.dtype},
        )
