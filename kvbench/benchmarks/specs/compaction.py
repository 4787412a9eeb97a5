"""`compaction`: seed 000's demo. A trajectory (a passage) is prefilled and compacted, then a task
question is asked from the compacted cache and the answer generated greedily: how far the
trajectory shrank, how long compaction took, the answer, and whether it holds the fact."""
from __future__ import annotations

from dataclasses import dataclass

from kvbench.config.fields import Settings, SettingError, at_least, param
from kvbench.benchmarks.records.compaction import CompactionRecord
from kvbench.benchmarks.reports.compaction import REPORT
from kvbench.benchmarks.specs.base import MetricSpec, ModelBenchmark, register_benchmark


@dataclass
class CompactionParams(Settings):
    """Parameters of the compaction benchmark."""

    trajectory: str = param(meaning="the passage that is compacted")
    task: str = param(meaning="the question asked after compaction")
    expect: str = param("", meaning='text the answer must contain to hold the fact ("" = not'
                        ' checked)')
    max_new_tokens: int = param(24, range=at_least(1), meaning="greedy answer length (stops"
                                " early at the end-of-sequence token)")
    chat: bool = param(True, meaning="wrap trajectory and task as one user turn of the model's"
                       " chat template")
    probe: bool = param(True, meaning="feed the task and take it back before compaction (task"
                        " queries)")

    def check(self) -> None:
        if not self.trajectory.strip() or not self.task.strip():
            raise SettingError(("trajectory", "task"), "trajectory and task must not be empty")


@register_benchmark("compaction")
class Compaction(ModelBenchmark):
    """Compact a passage, ask a question from the compacted cache: retention, compaction time,
    the answer and whether it holds the expected fact.

    With `probe` (the default) the question is first fed through the cache and taken back before
    end_prefill, so a task-guided method (am_task) or SnapKV can use its queries; without it a
    method gets its own reference probe, if it has one (am with `queries: repeat`). The plain
    cache answers the same question from the whole trajectory."""
    measured_in = "kvbench.benchmarks.measure.compaction"
    report = REPORT
    record = CompactionRecord

    Params = CompactionParams
    needs = {"probe": ("trim", False)}  # the task is fed, then taken back
    metrics = {
        "prompt_tokens": MetricSpec("tokens", "lower", "trajectory tokens prefilled"),
        "kept_tokens": MetricSpec("tokens", "lower", "K/V slots kept per layer after compaction,"
                                  " block summaries included (mean over layers)"),
        "retention": MetricSpec("", "lower", "kept_tokens / prompt_tokens"),
        "compaction_s": MetricSpec("s", "lower", "end_prefill wall time, per repeat",
                                   timing="absolute"),
        "compaction_vs_prefill": MetricSpec(
            "x", "lower", "compaction_s / the prefill forward's time just before it",
            timing="ratio"),
        "answer_holds_fact": MetricSpec("", "higher", "1 if the answer contains `expect`"),
        "plain_holds_fact": MetricSpec("", "higher", "1 if the plain cache's answer does"),
        "answer_agreement": MetricSpec(
            "", "higher", "fraction of answer tokens equal to the plain cache's"),
    }

    def workload(self, params: CompactionParams) -> float:
        return len(params.trajectory) / 4 + params.max_new_tokens  # about 4 characters a token
