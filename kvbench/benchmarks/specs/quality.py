"""`quality`: next-token distributions and greedy text through the method's cache, against the
plain model on the same tokens."""
from __future__ import annotations

from dataclasses import dataclass

from kvbench.config.fields import at_least, param
from kvbench.benchmarks.records.quality import QualityRecord
from kvbench.benchmarks.reports.quality import REPORT
from kvbench.benchmarks.specs.base import (
    MetricSpec, TextModelBenchmark, TextWindowParams, register_benchmark,
)


@dataclass
class QualityParams(TextWindowParams):
    """Parameters of the quality benchmark, and TextWindowParams' text, offset and calibration."""

    context: int = param(512, range=at_least(1), meaning="prompt tokens prefilled into the cache")
    continuation: int = param(64, range=at_least(1),
                              meaning="teacher-forced positions compared")
    greedy_tokens: int = param(32, range=at_least(1), meaning="tokens generated greedily by each"
                               " cache and compared")
    top_k: int = param(50, range=at_least(1), meaning="k of the top-k overlap")


@register_benchmark("quality")
class Quality(TextModelBenchmark):
    """Next-token distributions and greedy text through the method's cache, against the plain
    model: top-k overlap, KL both ways, top-1 and greedy agreement."""
    measured_in = "kvbench.benchmarks.measure.quality"
    report = REPORT
    record = QualityRecord

    Params = QualityParams
    metrics = {
        "top_k_overlap": MetricSpec("", "higher", "mean |top-k(method) ∩ top-k(plain)| / k"),
        "kl_plain_method": MetricSpec("nats", "lower", "mean KL(plain || method), full vocab"),
        "kl_method_plain": MetricSpec("nats", "lower", "mean KL(method || plain), full vocab"),
        "top1_agreement": MetricSpec("", "higher", "fraction of positions with the same argmax"),
        "greedy_agreement": MetricSpec(
            "", "higher", "fraction of greedy positions with the same token"),
        "greedy_prefix": MetricSpec(
            "", "higher", "greedy tokens before the first difference / greedy_tokens"),
    }

    def tokens_read(self, params: QualityParams) -> tuple[str, int, tuple[str, ...]]:
        return ("context + continuation (or greedy_tokens)",
                params.context + max(params.continuation, params.greedy_tokens),
                ("context", "continuation", "greedy_tokens"))
