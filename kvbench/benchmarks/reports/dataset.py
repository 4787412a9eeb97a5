"""The dataset benchmark's part of the report, made from results alone: per data and metric, each
method's score with its 95% interval, the samples scored, skipped and cut, and its compression
ratio (identity first); each method against identity on the same samples (a pair is one row's
answer, paired by its prompt hash); each method's output length against identity's; and the
leaderboard's columns (the retrieval benchmarks').
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench.benchmarks.records.dataset import DatasetRecord
from kvbench.benchmarks.reports.retrieval import BOARD, ci, ratio_text
from kvbench.reportkit.benchmark import BenchmarkReport
from kvbench.reportkit.drift import length_drift_section
from kvbench.reportkit.paired import (
    IDENTITY, IdentityReferences, PairedScope, paired_legend, paired_table,
)
from kvbench.reportkit.tables import finite_metric, join_blocks, md_table, ok_cases
from kvbench.results import CaseResult, RunResult

BENCHMARK = "dataset"
# Bench params that do not change what a sample's prompt is: identity's answers pair with a
# method's over every other param equal.
UNPAIRED_PARAMS = ("compress", "reads")
SCOPE_HEADER = "data · metric"  # the paired table's scope column (report.against_identity)
PAIRS_ARE = "one row's answer"


def data_name(case: CaseResult) -> str:
    """The data as the report names it: a file's name, an hf: source whole."""
    data = str(case.bench_params.get("data", ""))
    return data if data.startswith("hf:") else Path(data).name


def _group(case: CaseResult) -> tuple[str, str]:
    return data_name(case), str(case.bench_params.get("metric", ""))


def _shown(case: CaseResult) -> dict[str, Any]:
    """The settings that may tell a case from another of the same data and metric."""
    shown = {k: v for k, v in case.bench_params.items()
             if k not in ("data", "metric", *UNPAIRED_PARAMS)}
    return {**shown, "model": case.model} if case.model else shown


def _varying(cases: list[CaseResult]) -> dict[tuple[str, str], list[str]]:
    """Per data and metric, the bench params that differ between its cases: they go into the
    scope's name."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for case in cases:
        groups.setdefault(_group(case), []).append(_shown(case))
    return {group: [k for k in dict.fromkeys(k for shown in every for k in shown)
                    if len({repr(shown.get(k)) for shown in every}) > 1]
            for group, every in groups.items()}


def scope_namer(cases: list[CaseResult]):
    """case -> its scope: the data's name and the metric, and any setting that tells it from
    another case of the same data and metric."""
    varying = _varying(cases)

    def scope(case: CaseResult) -> str:
        group = _group(case)
        shown = _shown(case)
        extra = ", ".join(f"{k}={_value(shown.get(k))}" for k in varying.get(group, []))
        return f"{group[0]} · {group[1]}" + (f" ({extra})" if extra else "")

    return scope


def _value(value: Any) -> str:
    return str(value) if len(str(value)) <= 24 else str(value)[:21] + "..."


def _count(case: CaseResult, name: str) -> str:
    value = finite_metric(case, name)
    return "—" if value is None else f"{value:.0f}"


def _score_table(cases: list[CaseResult], scope) -> str:
    order = list(dict.fromkeys(scope(c) for c in cases))
    rows = []
    # by scope as the run has them, identity first in each
    for case in sorted(cases, key=lambda c: (order.index(scope(c)), c.method != IDENTITY)):
        score = finite_metric(case, "score")
        rows.append([case.method_label, scope(case), _count(case, "scored"),
                     _count(case, "skipped"), _count(case, "truncated"),
                     "—" if score is None else ci(score, finite_metric(case, "score_ci_low"),
                                                  finite_metric(case, "score_ci_high")),
                     ratio_text(finite_metric(case, "compression_ratio"))])
    header = ["method", SCOPE_HEADER, "scored", "skipped", "cut", "score [95% CI] ↑",
              "compression ratio (x) ↑"]
    return md_table(header, rows, set(range(2, len(header))))


def _paired_scopes(cases: list[CaseResult], scope) -> list[PairedScope]:
    references = IdentityReferences(cases, UNPAIRED_PARAMS)
    return [PairedScope(case.method_label, scope(case), [pair]) if pair is not None
            else PairedScope(case.method_label, scope(case), unpaired=["other samples"])
            for case, pair in references.scored(cases)]


def dataset_section(result: RunResult) -> str | None:
    """The dataset summary below its generic table; None when the run has no ok case."""
    cases = [c for c in ok_cases(result, BENCHMARK) if DatasetRecord.of(c).scores is not None]
    if not cases:
        return None
    scope = scope_namer(cases)
    parts = ["### dataset: score per method [95% CI]", _score_table(cases, scope),
             "<sub>Score 0-100: per sample the best of the metric over its reference answers"
             " (LongBench's scorer), the mean over the samples scored, with a 95% Wilson"
             " interval; skipped: prompts longer than max_length left out (truncation: skip);"
             " cut: prompts cut to max_length in the middle (truncation: middle). ↑ higher is"
             " better.</sub>"]
    scopes = _paired_scopes(cases, scope)
    if scopes:
        parts += ["### dataset: against identity, on the same samples",
                  paired_table(scopes, SCOPE_HEADER), paired_legend(PAIRS_ARE)]
    parts.append(length_drift_section(result, BENCHMARK, scope, PAIRS_ARE, UNPAIRED_PARAMS,
                                      "dataset", SCOPE_HEADER))
    return join_blocks(parts)


REPORT = BenchmarkReport(board=BOARD, parts=lambda result, out_dir: [dataset_section(result)])
