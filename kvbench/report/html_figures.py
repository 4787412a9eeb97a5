"""The results page's headline figures, drawn from the result files as inline SVG (kit.svg):

- per benchmark whose board has both axes (proofs, perplexity, niah, ruler, ...): quality
  against compression, a point per method, the Pareto front joined (the leaderboard's ★);
- the memory ladder: the KV cache held and the peak memory the case added, against the
  context length, a line per method;
- stress: aggregate output tok/s against concurrent users, a line per method.

The page holds many runs; each figure draws one group of comparable cases (one run, model and
benchmark parameters: the group with the most methods, or the most points for a line figure)
and its caption says which, the rest being in the leaderboards below. A method's cases that
differ only in `task` (RULER's tasks) are one point, their mean, as RULER reports a method.
"""
from __future__ import annotations

import html
import json
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

from kvbench.report.html_run import Run
from kvbench.reportkit.benchmark import Board
from kvbench.reportkit.figures import (
    as_lower_better, family_styles, line_styles, method_family, pareto_front,
)
from kvbench.reportkit.svg import (
    Chart, Series, legend_key, render_svg, short_bytes, short_number,
)
from kvbench.reportkit.tables import BYTE_UNITS, length_name
from kvbench.report.metric_labels import metric_label
from kvbench.results import CaseResult

POOLED = ("task",)  # a method's point is its mean over these
# Line figures: (the parameter along x, its name, [(metric, what the figure shows)])
TRENDS = {
    "ladder": ("length", "context length (tokens, log)", (
        ("retained_kv_bytes", "Memory ladder: the KV cache held"),
        ("peak_over_loaded_bytes", "Memory ladder: the peak memory the case added"))),
    "stress": ("users", "concurrent users (log)", (
        ("output_tok_s", "Throughput against users: aggregate output tok/s"),)),
}
# positive values spanning this factor or more are drawn on a log scale: compression ratios and
# bytes (not scores, whose differences are what matters)
LOG_SPREAD = 8
CAPTION_PARAMS = 3  # a caption names at most this many parameters, then "…"


@dataclass
class Figure:
    title: str
    caption: str
    chart: Chart
    legend: list[tuple[str, str, bool]]  # (name, family, drawn as a line)


def _params_key(params: dict, left_out: Sequence[str]) -> str:
    return json.dumps({k: v for k, v in params.items() if k not in left_out}, sort_keys=True,
                      default=str)


def _log(values: list[float]) -> bool:
    return bool(values) and min(values) > 0 and max(values) >= LOG_SPREAD * min(values)


def _log_y(values: list[float], unit: str) -> bool:
    return unit in BYTE_UNITS and _log(values)


def _format(unit: str) -> Callable[[float], str]:
    return short_bytes if unit in BYTE_UNITS else short_number


def _what_differs(runs: Sequence[Run], kind: str, key: tuple, left_out: Sequence[str]) -> str:
    """The group's run, and its model and benchmark parameters where they differ between the
    kind's groups (what every group shares says nothing here)."""
    run_index, model, params = key
    run = next(r for r in runs if r.index == run_index)
    seen: dict[str, set[str]] = {}
    for other in runs:
        for case in other.result.cases:
            if case.benchmark == kind:
                seen.setdefault("model", set()).add(case.model or "")
                for k, v in case.bench_params.items():
                    if k not in left_out:
                        seen.setdefault(k, set()).add(json.dumps(v, sort_keys=True, default=str))
    varying = {k for k, values in seen.items() if len(values) > 1}
    named = [f"{k}={v}" for k, v in json.loads(params).items() if k in varying and v is not None]
    shown = ", ".join(named[:CAPTION_PARAMS]) + (", …" if len(named) > CAPTION_PARAMS else "")
    # the run's machine is in the runs table; its number and suite say which it is
    parts = [f"run #{run.index} {run.result.suite.name}"] + (
        [model] if model and "model" in varying else []) + ([shown] if shown else [])
    return " · ".join(parts)


def pareto_figure(kind: str, board: Board, runs: Sequence[Run]) -> Figure | None:
    """Quality against compression for the kind's group with the most methods; None when no
    case has both figures."""
    groups: dict[tuple, dict[str, list[CaseResult]]] = {}
    for run in runs:
        for case in run.result.cases:
            if case.benchmark != kind or case.status != "ok":
                continue
            x, y = case.metrics.get(board.compression), case.metrics.get(board.quality)
            if x is None or y is None or not (x.finite() and y.finite()):
                continue
            key = (run.index, case.model or "", _params_key(case.bench_params, POOLED))
            groups.setdefault(key, {}).setdefault(case.method_label, []).append(case)
    if not groups:
        return None
    # the group with the most cases (methods times tasks), the first of them on a tie
    key, labels = max(groups.items(), key=lambda item: sum(map(len, item[1].values())))
    first = next(iter(labels.values()))[0]
    x_metric, y_metric = first.metrics[board.compression], first.metrics[board.quality]
    series: dict[str, Series] = {}
    points, pooled = [], 1
    for label, cases in labels.items():
        x = statistics.fmean(c.metrics[board.compression].value for c in cases)
        y = statistics.fmean(c.metrics[board.quality].value for c in cases)
        pooled = max(pooled, len(cases))
        family = method_family(cases[0].method)
        line = series.setdefault(family, Series(family, family))
        line.points.append((x, y, label))
        if len(cases) > 1:
            line.tips[label] = f"mean of {len(cases)} {POOLED[0]}s"
        points.append((x, y))
    ranked = pareto_front([(as_lower_better(x, x_metric.direction),
                            as_lower_better(y, y_metric.direction)) for x, y in points])
    front = [points[i] for i in ranked]
    chart = Chart(
        metric_label(kind, board.compression, x_metric.unit, x_metric.direction),
        metric_label(kind, board.quality, y_metric.unit, y_metric.direction),
        list(series.values()), x_log=_log([x for x, _ in points]),
        y_log=_log_y([y for _, y in points], y_metric.unit),
        y_base=2 if y_metric.unit in BYTE_UNITS else 10, x_format=_format(x_metric.unit),
        y_format=_format(y_metric.unit), front=front, front_labels=len(front) <= 8)
    what = _what_differs(runs, kind, key, POOLED)
    mean = f", each the mean of its {pooled} {POOLED[0]}s" if pooled > 1 else ""
    others = f"; {len(groups) - 1} other group(s) below" if len(groups) > 1 else ""
    caption = f"{what}: {len(labels)} methods{mean}{others}."
    chart.x_label += " (log)" if chart.x_log else ""
    return Figure(f"{kind}: {board.quality} against {board.compression}", caption, chart,
                  [(family, family, False) for family in series])


def trend_figures(kind: str, runs: Sequence[Run]) -> list[Figure]:
    """The kind's line figures (TRENDS) for its group with the most points; [] without one."""
    if kind not in TRENDS:
        return []
    along, x_label, panels = TRENDS[kind]
    groups: dict[tuple, dict[str, dict[float, CaseResult]]] = {}
    for run in runs:
        for case in run.result.cases:
            x = case.bench_params.get(along)
            if case.benchmark != kind or case.status != "ok" or not isinstance(x, (int, float)):
                continue
            key = (run.index, case.model or "", _params_key(case.bench_params, (along,)))
            groups.setdefault(key, {}).setdefault(case.method_label, {})[x] = case
    if not groups:
        return []
    key, lines = max(groups.items(), key=lambda item: sum(len(v) for v in item[1].values()))
    xs = sorted({x for by_x in lines.values() for x in by_x})
    what = _what_differs(runs, kind, key, (along,))
    figures = []
    for metric, title in panels:
        series, unit, direction = [], "", "none"
        for label, by_x in lines.items():
            values = [(x, case.metrics[metric].value, label) for x, case in sorted(by_x.items())
                      if metric in case.metrics and case.metrics[metric].finite()]
            if values:
                found = next(c.metrics[metric] for c in by_x.values() if metric in c.metrics)
                unit, direction = found.unit, found.direction
                series.append(Series(label, method_family(next(iter(by_x.values())).method),
                                     values, line=True))
        if not series:
            continue
        ys = [y for s in series for _, y, _ in s.points]
        chart = Chart(x_label, metric_label(kind, metric, unit, direction), series, x_log=True,
                      y_log=_log_y(ys, unit), y_base=2 if unit in BYTE_UNITS else 10, x_ticks=xs,
                      x_format=length_name if along == "length" else short_number,
                      y_format=_format(unit), front_labels=False)
        caption = f"{what}: {len(series)} methods at {len(xs)} {along} values."
        figures.append(Figure(title, caption, chart, [(s.name, s.family, True) for s in series]))
    return figures


def _legend(figure: Figure) -> str:
    colours = family_styles(family for _, family, _ in figure.legend)
    dashes = line_styles({name: family for name, family, line in figure.legend if line})
    items = []
    for name, family, line in figure.legend:
        colour, code = colours[family]
        key = legend_key(code, colour, dashes[name]["linestyle"] if line else None)
        items.append(f"<li>{key}{html.escape(name)}</li>")
    return f"<ul class='legend'>{''.join(items)}</ul>"


def figure_html(figure: Figure) -> str:
    return (f"<figure class='headline'><figcaption><b>{html.escape(figure.title)}</b> "
            f"<span class='muted'>{html.escape(figure.caption)}</span></figcaption>"
            f"{render_svg(figure.chart, figure.title)}{_legend(figure)}</figure>")


def headline_figures(kinds: list[str], boards: dict[str, Board | None],
                     runs: Sequence[Run]) -> str:
    """Every headline figure of the kinds (in board order) as HTML; "" when there is none."""
    figures: list[Figure] = []
    for kind in kinds:
        board = boards.get(kind)
        if kind in TRENDS:
            figures += trend_figures(kind, runs)
        elif board is not None and board.compression and board.quality:
            figure = pareto_figure(kind, board, runs)
            if figure is not None:
                figures.append(figure)
    if not figures:
        return ""
    note = ("<p class='note'>Each figure draws one group of comparable cases, named in its "
            "caption (every group is in the leaderboards below). The <b style='color:#c77c00'>"
            "orange line</b> joins the Pareto front, the leaderboards' ★: no other method is "
            "better on both axes. Hover a point for its method and values.</p>")
    return f"{note}<div class='headlines'>{''.join(figure_html(f) for f in figures)}</div>"
