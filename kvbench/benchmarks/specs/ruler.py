"""`ruler`: NVIDIA RULER's synthetic tasks, generated offline to a length, answered through the
cache and scored as NVIDIA does."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from kvbench.config.fields import SettingError, at_least, between, one_of, param
from kvbench.benchmarks.records.ruler import RulerRecord
from kvbench.benchmarks.reports.ruler import REPORT
from kvbench.benchmarks.specs.base import register_benchmark
from kvbench.benchmarks.specs.retrieval import RetrievalBenchmark, RetrievalParams
from kvbench.data.ruler import TASKS
from kvbench.data.text import resolve_text
from kvbench.models.info import ModelInfo

QA_FILES = {"squad": "SQuAD v2 dev JSON (dev-v2.0.json, as RULER's qa_1)",
            "hotpotqa": "HotpotQA dev distractor JSON (hotpot_dev_distractor_v1.json, as"
                        " RULER's qa_2)"}


@dataclass
class RulerParams(RetrievalParams):
    """Parameters of the ruler benchmark, and RetrievalParams' data_seed, compress, essay,
    reads."""

    task: str = param("niah_single_1", range=one_of(*TASKS),
                      meaning="one of RULER's tasks: " + ", ".join(TASKS)
                      + " (qa_1 and qa_2 read qa_data)")
    length: int = param(1024, range=at_least(256), meaning="model tokens of the whole prompt,"
                        " the task's tokens_to_generate included")
    samples: int = param(10, range=at_least(1), meaning="prompts per case; with half_width,"
                         " the most")
    half_width: float | None = param(
        None, range=between(0, 50, low_open=True), meaning="sample to a precision: a case"
        " stops once its score's 95% Wilson interval reaches at most this many points either"
        " side of the mean, checked after each group of samples decoded together (up to 16);"
        " None: always `samples`")
    min_samples: int = param(16, range=at_least(1), meaning="with half_width: the fewest"
                             " prompts a case answers before it may stop")
    qa_data: str | None = param(None, meaning="qa_1: SQuAD v2 dev JSON; qa_2: HotpotQA dev"
                                " distractor JSON (a file, or an hf: dataset on the hub); other"
                                " tasks ignore it")

    def check(self) -> None:
        super().check()
        if self.half_width is not None and self.min_samples > self.samples:
            raise SettingError(("min_samples", "samples"), f"min_samples {self.min_samples} is"
                               f" above samples {self.samples}, the most a case answers")


@register_benchmark("ruler")
class Ruler(RetrievalBenchmark):
    """RULER's tasks through the cache; essay haystacks are pydoc text, not Paul Graham's.

    NVIDIA RULER's synthetic long-context tasks (niah, vt, cwe, fwe; qa_1/qa_2 with a local
    SQuAD or HotpotQA), generated offline to `length` model tokens and answered through the
    method's cache, scored as NVIDIA does. Essay haystacks are the `essay` text (pydoc by
    default) in place of Paul Graham's essays; the noise haystacks are RULER's own."""
    measured_in = "kvbench.benchmarks.measure.ruler"
    report = REPORT
    record = RulerRecord

    Params = RulerParams

    def resolve_paths(self, params: RulerParams, base_dir: Path) -> RulerParams:
        params = super().resolve_paths(params, base_dir)
        if params.qa_data is not None and not params.qa_data.startswith("hf:"):
            params = dataclasses.replace(params, qa_data=resolve_text(params.qa_data, base_dir))
        return params

    def check(self, params: RulerParams, model: ModelInfo | None) -> None:
        kind = TASKS[params.task].needs_qa
        if kind and params.qa_data is None:
            raise SettingError(("qa_data", "task"), f"task {params.task} reads {kind}, which"
                               f" kvbench does not ship: set qa_data to a local"
                               f" {QA_FILES[kind]} or an hf: dataset on the hub")
        if kind and not params.qa_data.startswith("hf:") and not Path(params.qa_data).is_file():
            raise SettingError("qa_data", f"qa_data file {params.qa_data!r} does not exist")
        self.check_model(params, model, params.length, "length")
