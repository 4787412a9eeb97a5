"""The perplexity benchmark's part of the report: its leaderboard's columns, its metrics in the
by-method table and, for cases that scored more than one window, a section made from their
results alone (their records, kvbench.benchmarks.records.perplexity): per case,
perplexity over the windows with its 95% interval, and the paired verdict against identity
(worse / not separated / better, its p, the relative delta and the mean per-window difference in
NLL, each with its interval)."""
from __future__ import annotations

import math

from kvbench.benchmarks.records.perplexity import PerplexityRecord
from kvbench.judge.paired import LEVEL, RESAMPLES, SEPARATION_LEVEL
from kvbench.reportkit.benchmark import BenchmarkReport, Board
from kvbench.reportkit.paired import p_text
from kvbench.reportkit.tables import finite_metric, fmt_number, md_table, ok_cases
from kvbench.results import CaseResult, RunResult

BENCHMARK = "perplexity"

NOTE = (
    "<sub>Each case scores `windows` windows of context + continuation tokens drawn from the"
    " text with the case's seed (every method of a run with one seed scores the same windows)."
    " perplexity is exp(total NLL / every scored token); its interval and ppl_rel_delta's are"
    f" {LEVEL:.0%} percentile bootstraps over the windows ({RESAMPLES:,} resamples, seeded: a"
    " report re-renders to the byte). vs identity compares each window's NLL with the plain"
    " cache's on the same tokens (identity at the model's dtype equals the plain cache bit for"
    " bit): an exact two-sided sign test over the windows that differ, worse or better when"
    f" p < {SEPARATION_LEVEL:g}, else not separated. ΔNLL is the mean per-window difference in"
    " nats per scored token, method − plain.</sub>"
)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _interval(value: float | None, ends: tuple[float | None, float | None] | None,
              show) -> str:
    if value is None:
        return "—"
    low, high = ends or (None, None)
    low, high = _finite(low), _finite(high)
    if low is None or high is None:
        return show(value)
    return f"{show(value)} [{show(low)}, {show(high)}]"


def _percent(value: float) -> str:
    text = f"{value * 100:+.2f}%"
    return "±0.00%" if text in ("+0.00%", "-0.00%") else text


def _nats(value: float) -> str:
    text = f"{value:+.4f}"
    return "±0.0000" if text in ("+0.0000", "-0.0000") else text


def _row(case: CaseResult) -> list[str]:
    record = PerplexityRecord.of(case)
    paired = record.vs_plain
    p_value = _finite(paired.p_value)
    return [
        case.id.removeprefix(f"{BENCHMARK}/"),
        str(len(record.windows or []) or "—"),
        _interval(finite_metric(case, "perplexity"), record.perplexity_interval, fmt_number),
        fmt_number(finite_metric(case, "ppl_reference")) or "—",
        _interval(finite_metric(case, "ppl_rel_delta"),
                  (finite_metric(case, "ppl_rel_delta_ci_low"),
                   finite_metric(case, "ppl_rel_delta_ci_high")), _percent),
        _interval(_finite(paired.mean_difference), (paired.low, paired.high), _nats),
        paired.verdict,
        "—" if p_value is None else p_text(p_value),
        f"{paired.wins} / {paired.losses} of {paired.pairs}",
    ]


def windows_section(result: RunResult) -> str | None:
    """The table of the perplexity cases that scored more than one window; None when there is
    none."""
    cases = [c for c in ok_cases(result, BENCHMARK) if PerplexityRecord.of(c).vs_plain is not None]
    if not cases:
        return None
    ci = f"[{LEVEL:.0%} CI]"
    header = ["case", "windows", f"perplexity {ci} ↓", "plain", f"ppl_rel_delta {ci} ↓",
              f"ΔNLL (nats/token) {ci} ↓", "vs identity", "p (sign test)",
              "windows worse / better"]
    return "\n\n".join([
        "### perplexity over windows, against identity",
        md_table(header, [_row(c) for c in cases],
                 set(range(1, len(header))) - {header.index("vs identity")}),
        NOTE,
    ])


REPORT = BenchmarkReport(
    board=Board("compression_ratio", "ppl_rel_delta", ("perplexity", "kv_bytes", "retained_kv")),
    headline=("ppl_rel_delta", "retained_kv"),
    parts=lambda result, out_dir: [windows_section(result)])
