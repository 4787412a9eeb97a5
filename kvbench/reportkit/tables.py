"""Markdown table pieces: what the report, the README injection, the comparison and the
benchmarks' own report sections draw their tables with."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from kvbench.results import CaseResult, Metric, RunResult

ARROWS = {"higher": "↑", "lower": "↓", "none": ""}
BYTE_UNITS = {"B", "bytes"}
_BINARY_PREFIXES = ["KiB", "MiB", "GiB", "TiB"]
ERROR_CHARS = 120  # an error's first line is cut here so the table stays readable
LONG_SETTING = 40  # a setting's value longer than this is written out below its table


def fmt_number(value: float | None, unit: str = "") -> str:
    """About 4 significant digits; whole numbers with thousands separators; bytes in KiB/MiB."""
    if value is None:
        return ""
    if unit in BYTE_UNITS:
        return fmt_bytes(value)
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1000:  # .4g would switch to 1e+04 notation near 10,000
        return f"{value:,.0f}"
    if abs(value) < 1e-3:
        return f"{value:.3e}"
    short = f"{value:.4g}"
    # 0.99999 must not print as "1": near-integers get the digits that tell them apart
    return f"{value:.6g}" if float(short) == int(float(short)) else short


def ok_cases(result: RunResult, benchmark: str) -> list[CaseResult]:
    """The run's cases of `benchmark` that finished ok."""
    return [c for c in result.cases if c.benchmark == benchmark and c.status == "ok"]


def finite_metric(case: CaseResult, name: str) -> float | None:
    """The case's value of metric `name`; None when it has none or it is not finite."""
    metric = case.metrics.get(name)
    if metric is None or not math.isfinite(metric.value):
        return None
    return metric.value


def length_name(length: int) -> str:
    """A context length as the reports name it: 4096 -> "4K"."""
    return f"{length // 1024}K" if length >= 1024 and length % 1024 == 0 else str(length)


def pair_key(case: CaseResult, unpaired: tuple[str, ...]) -> tuple:
    """What two cases of different methods must share to be compared: the model and every
    benchmark parameter but the `unpaired` ones."""
    return (case.model, *sorted((k, repr(v)) for k, v in case.bench_params.items()
                                if k not in unpaired))


def fmt_ratio(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}"


def fmt_bytes(value: float) -> str:
    if not math.isfinite(value) or abs(value) < 1024:
        return f"{fmt_number(value)} B"
    for prefix in _BINARY_PREFIXES:
        value /= 1024
        if abs(value) < 1024:
            break
    return f"{value:.4g} {prefix}"


def is_timed(metric: Metric) -> bool:
    return metric.samples is not None and len(metric.samples) >= 2


def fmt_spread(value: float, unit: str = "") -> str:
    """Two significant digits are all a spread deserves."""
    if unit in BYTE_UNITS:
        return fmt_bytes(value)
    return fmt_number(round(value)) if abs(value) >= 100 else f"{value:.2g}"


def metric_cell(metric: Metric) -> str:
    """The value; a timed metric as median ± IQR/2 of its repeats."""
    text = fmt_number(metric.value, metric.unit)
    if is_timed(metric) and metric.iqr is not None:
        text += f" ± {fmt_spread(metric.iqr / 2, metric.unit)}"
    return text


def metric_header(name: str, unit: str, direction: str) -> str:
    shown_unit = f" ({unit})" if unit and unit not in BYTE_UNITS else ""
    arrow = ARROWS.get(direction, "")
    return f"{name}{shown_unit} {arrow}".rstrip()


def fmt_param(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 1] + "…"


def escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:
    """A pipe table; columns whose index is in `right` are right-aligned (numbers)."""
    rule = ["---:" if i in right else "---" for i in range(len(header))]
    lines = [header, rule] + rows
    return "\n".join("| " + " | ".join(escape(c) for c in line) + " |" for line in lines)


def join_blocks(blocks: Iterable[str | None]) -> str:
    """The Markdown blocks that say something (None or "" dropped), a blank line between."""
    return "\n\n".join(block for block in blocks if block)


def by_benchmark(cases: list[CaseResult]) -> dict[str, list[CaseResult]]:
    """Cases grouped by benchmark, both in order of first appearance."""
    groups: dict[str, list[CaseResult]] = {}
    for case in cases:
        groups.setdefault(case.benchmark, []).append(case)
    return groups


# What every case has besides its bench params: the settings_set filter always keeps them.
CASE_SETTINGS = ("model", "model_revision", "device", "model_dtype", "seed")


@dataclass(frozen=True)
class Cell:
    """A case's cell for one metric: its text, as Markdown and HTML show it, and the number the
    results page sorts it by (None: it has none)."""

    text: str
    value: float | None = None


# A benchmark's row definition (kvbench.reportkit.benchmark.BenchmarkReport.row): a case's cells
# for the metrics named, in their order.
Row = Callable[[CaseResult, list[str]], list[Cell]]


def benchmark_table(cases: list[CaseResult], row: Row,
                    columns: list[str] | None = None,
                    settings_set: set[str] | None = None) -> str:
    """One row per case (method and the settings that vary), one column per metric (its cells
    from `row`, the benchmark's row definition), then a legend.

    Settings (bench params, model, device) equal in every row are stated once above the table;
    unset ones (None) are not shown; a value too long for a cell is marked [n] and written out
    below the table. columns: the metrics shown, in that order (default: every metric of the
    cases, in order of appearance; own_metrics: those but the runner's footprint); a case
    without one has an empty cell. settings_set: the bench params the suite set (its benchmark
    entries' params and matrix): the line above the table names only those, with the model,
    device, dtype and seed, and says the rest are at their defaults (default: every setting
    equal in all rows).
    """
    labels = [_settings(case) for case in cases]
    keys = _ordered_keys(labels)
    fixed = [k for k in keys if _same_in_all(labels, k)]
    varying = [k for k in keys if k not in fixed]
    at_defaults = False
    if settings_set is not None:
        kept = [k for k in fixed if k in settings_set or k in CASE_SETTINGS]
        at_defaults = len(kept) < len(fixed)
        fixed = kept
    metrics: dict[str, Metric] = {}  # first occurrence gives each column its unit and direction
    for case in cases:
        for name, metric in case.metrics.items():
            metrics.setdefault(name, metric)
    if columns is not None:
        metrics = {name: metrics[name] for name in columns if name in metrics}
    show_status = any(case.status != "ok" for case in cases)
    long_values: dict[tuple[str, str], str] = {}  # (setting, value) -> its mark, e.g. "[1]"

    def shown(key: str, value: str) -> str:
        if len(value) <= LONG_SETTING:
            return value
        return long_values.setdefault((key, value), f"[{len(long_values) + 1}]")

    header = ["method", *varying, *(metric_header(n, m.unit, m.direction) for n, m in metrics.items())]
    if show_status:
        header.append("status")
    rows = []
    for case, label in zip(cases, labels):
        cells = [case.method_label, *(shown(k, label.get(k, "")) for k in varying)]
        cells += [cell.text for cell in row(case, list(metrics))]
        if show_status:
            cells.append(_status_cell(case))
        rows.append(cells)
    right = set(range(1 + len(varying), 1 + len(varying) + len(metrics)))
    caption = " · ".join(f"{k}={shown(k, labels[0][k])}" for k in fixed)
    if at_defaults:
        caption += " · the other settings at their defaults"
    written_out = "\n".join(f"- {mark} {key}: `{value}`"
                             for (key, value), mark in long_values.items())
    parts = [f"<sub>all rows: {caption}</sub>" if caption else "", md_table(header, rows, right),
             written_out, _legend(cases, metrics)]
    return join_blocks(parts)


def recorded_by_runner(cases: list[CaseResult]) -> set[str]:
    """The metrics the runner added to the cases (their memory footprint's), not their
    benchmark's: shown in their own table (kvbench.reportkit.footprint)."""
    return {name for case in cases if case.footprint is not None
            for name in case.footprint.metrics}


def own_metrics(cases: list[CaseResult]) -> list[str]:
    """The metrics of the cases, in order of appearance, but those the runner recorded: a
    benchmark's table's columns."""
    recorded = recorded_by_runner(cases)
    return [name for name in dict.fromkeys(m for case in cases for m in case.metrics)
            if name not in recorded]


def _settings(case: CaseResult) -> dict[str, str]:
    shown = {k: fmt_param(v) for k, v in case.bench_params.items() if v is not None}  # unset
    shown.update({k: v for k, v in (("model", case.model), ("device", case.device)) if v})
    if case.model_revision:  # a hub model's commit, as git shortens it
        shown["model_revision"] = case.model_revision[:12]
    if case.model_dtype != "float32":
        shown["model_dtype"] = case.model_dtype
    shown["seed"] = str(case.seed)
    return shown


def _status_cell(case: CaseResult) -> str:
    if case.status == "ok":
        return "ok"
    if case.error is None:
        return case.status
    return f"{case.status}: {first_line(f'{case.error.type}: {case.error.message}')}"


def _legend(cases: list[CaseResult], metrics: dict[str, Metric]) -> str:
    parts = []
    directions = {m.direction for m in metrics.values()}
    if "higher" in directions:
        parts.append("↑ higher is better")
    if "lower" in directions:
        parts.append("↓ lower is better")
    repeats = {len(m.samples) for c in cases for name, m in c.metrics.items()
               if name in metrics and is_timed(m)}  # of the columns shown
    if repeats:
        of = f"{repeats.pop()} samples" if len(repeats) == 1 else "their samples"
        parts.append(f"timed metrics: median ± IQR/2 of {of}")
    return f"<sub>{' · '.join(parts)}</sub>" if parts else ""


def _same_in_all(labels: list[dict[str, str]], key: str) -> bool:
    return all(key in label and label[key] == labels[0][key] for label in labels)


def _ordered_keys(dicts) -> list[str]:
    keys: dict[str, None] = {}
    for d in dicts:
        keys.update(dict.fromkeys(d))
    return list(keys)


def method_table(cases: list[CaseResult], headlines: dict[str, tuple[str, ...]]) -> str | None:
    """One row per method label, the headline metrics of every benchmark that ran it once
    (`headlines`: benchmark -> the metrics that sum it up, as its report declares them), or
    None when fewer than two such benchmarks share a method."""
    once: dict[str, dict[str, CaseResult]] = {}  # benchmark -> label -> its only case
    for benchmark, group in by_benchmark(cases).items():
        if not headlines.get(benchmark):
            continue
        labels = [case.method_label for case in group]
        once[benchmark] = {c.method_label: c for c in group if labels.count(c.method_label) == 1}
    labels = [label for label in dict.fromkeys(c.method_label for c in cases)
              if sum(label in by_label for by_label in once.values()) >= 2]
    if not labels:
        return None
    columns = [(b, name) for b, by_label in once.items() for name in headlines[b]
               if any(name in c.metrics for c in by_label.values())]
    header = ["method"]
    for benchmark, name in columns:
        metric = next(c.metrics[name] for c in once[benchmark].values() if name in c.metrics)
        header.append(f"{benchmark}: {metric_header(name, metric.unit, metric.direction)}")
    rows = []
    for label in labels:
        row = [label]
        for benchmark, name in columns:
            case = once[benchmark].get(label)
            metric = None if case is None else case.metrics.get(name)
            row.append("" if metric is None else metric_cell(metric))
        rows.append(row)
    return md_table(header, rows, set(range(1, len(header))))


def model_grid(cases: list[CaseResult], metric: str) -> str:
    """One benchmark's cases as a grid: a row per model, a column per method, each cell the
    metric, or the status of a case that did not run (a refusal marked [n], its reason written
    out below: the same reason once, whatever the cells it refuses)."""
    models = list(dict.fromkeys(case.model or "" for case in cases))
    methods = list(dict.fromkeys(case.method_label for case in cases))
    cells = {(case.model or "", case.method_label): case for case in cases}
    reasons: dict[str, str] = {}  # reason -> its mark

    def cell(case: CaseResult | None) -> str:
        if case is None:
            return ""
        if case.status == "ok":
            return metric_cell(case.metrics[metric]) if metric in case.metrics else ""
        why = case.error.message if case.error else case.status
        why = why.removeprefix(f"{case.model}: ")
        return f"{case.status} {reasons.setdefault(why, f'[{len(reasons) + 1}]')}"

    rows = [[model, *(cell(cells.get((model, method))) for method in methods)]
            for model in models]
    known = next((c.metrics[metric] for c in cases if metric in c.metrics), None)
    title = metric_header(metric, known.unit, known.direction) if known else metric
    written_out = "\n".join(f"- {mark} {escape(why)}" for why, mark in reasons.items())
    parts = [f"<sub>{title}, by model and method</sub>",
             md_table(["model", *methods], rows, set(range(1, len(methods) + 1))), written_out]
    return join_blocks(parts)
