"""`niah`: a needle-in-a-haystack grid (context length x needle depth) answered through the
cache, each cell a single-needle RULER task."""
from __future__ import annotations

from dataclasses import dataclass

from kvbench.config.fields import SettingError, at_least, one_of, param
from kvbench.benchmarks.records.niah import NiahRecord
from kvbench.benchmarks.reports.niah import REPORT
from kvbench.benchmarks.specs.base import register_benchmark
from kvbench.benchmarks.specs.retrieval import RetrievalBenchmark, RetrievalParams
from kvbench.models.info import ModelInfo

SINGLE_NEEDLE_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3")  # take a depth


@dataclass
class NiahParams(RetrievalParams):
    """Parameters of the niah benchmark, and RetrievalParams' data_seed, compress, essay,
    reads."""

    lengths: list[int] = param(factory=lambda: [1024, 2048, 4096], rule="each >= 256",
                               meaning="context lengths (model tokens of the whole prompt,"
                               " tokens_to_generate included): the heatmap's columns")
    depths: list[float] = param(factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0],
                                rule="percents: 0 to 100", meaning="needle depths, percent of the"
                                " haystack: rows")
    samples: int = param(1, range=at_least(1), meaning="needles per cell (each a fresh key,"
                         " value and haystack draw)")
    task: str = param("niah_single_2", range=one_of(*SINGLE_NEEDLE_TASKS),
                      meaning="the single-needle RULER task each cell is: niah_single_1 (noise"
                      " haystack), niah_single_2 (essay, number), niah_single_3 (essay, uuid)")

    def check(self) -> None:
        if not self.lengths or not self.depths:
            raise SettingError(("lengths", "depths"), "lengths and depths need at least one"
                                                      " value each")
        if min(self.lengths) < 256:
            raise SettingError("lengths", f"lengths must be >= 256, got {min(self.lengths)}")
        if not all(0 <= d <= 100 for d in self.depths):
            raise SettingError("depths", f"depths are percents: 0 to 100, got {self.depths}")
        super().check()


@register_benchmark("niah")
class Niah(RetrievalBenchmark):
    """Needle-in-a-haystack grid through the cache; the haystack is pydoc text, not Paul Graham's.

    A grid of context lengths x needle depths, one needle per cell, answered through the
    method's cache; a heatmap per method in the report. Essay text is `essay` (pydoc by
    default) in place of Paul Graham's essays."""
    measured_in = "kvbench.benchmarks.measure.niah"
    report = REPORT
    record = NiahRecord

    Params = NiahParams

    def workload(self, params: NiahParams) -> float:
        return float(params.samples * len(params.depths) * sum(params.lengths))

    def check(self, params: NiahParams, model: ModelInfo | None) -> None:
        self.check_model(params, model, max(params.lengths), "lengths")
