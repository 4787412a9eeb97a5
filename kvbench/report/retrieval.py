"""Report sections of the retrieval benchmarks, `ruler` and `niah`, made from results alone.

ruler: a headline table (per method and context length, the mean score over the tasks it ran
with a pooled 95% Wilson interval, and its paired difference from `identity` over the cells both
ran), a per-task table per context length, the haystacks used, and a kvpress-style figure of
the mean score against the compression ratio. niah: a small table and one depth-by-length
heatmap per method.

Figures need matplotlib (the `plots` extra): without it the PNG functions raise
PlotUnavailable and the sections say so in one line. The Markdown is the same with or without
an output folder, so `kvbench report` prints what the run wrote.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.judge.intervals import wilson_interval
from kvbench.report.plots import (
    MATPLOTLIB_MISSING, PlotPath, PlotUnavailable, check_matplotlib, line_styles, method_family,
    pyplot, save_png,
)
from kvbench.report.tables import finite_metric, length_name, md_table, ok_cases, pair_key
from kvbench.results import CaseResult, RunResult

RULER_PNG = "ruler_score_vs_ratio.png"
IDENTITY = "identity"  # the registry name of the full cache: the reference of every delta
# Bench params that place a ruler case in the grid; any other that varies splits a method's row.
_GRID_PARAMS = ("task", "length")
# Bench params that do not change which samples a case draws: identity's answers pair with a
# method's over every other param equal (data_seed, samples, essay, ...).
_UNPAIRED_PARAMS = ("compress", "reads")


# ---------------------------------------------------------------------------------------------
# ruler: the numbers


def _scores(case: CaseResult) -> list[float] | None:
    scores = case.info.get("scores")
    if not isinstance(scores, list) or not scores:
        return None
    try:
        return [float(s) for s in scores]
    except (TypeError, ValueError):
        return None


def _samples(case: CaseResult) -> int:
    """How many samples the case's score is the mean of: its per-sample scores, else the
    requested count."""
    scores = _scores(case)
    if scores is not None:
        return len(scores)
    try:
        return max(int(case.bench_params.get("samples", 0)), 0)
    except (TypeError, ValueError):
        return 0


def _extras(cases: list[CaseResult]) -> list[str]:
    """Settings besides task and length (compress, the model, ...) that differ between cases of
    one method label at one task and length: they split its row, since its cells would
    otherwise mix them. A setting that only differs between tasks (samples, say) does not."""
    def settings(case: CaseResult) -> dict[str, Any]:
        shown = {k: v for k, v in case.bench_params.items() if k not in _GRID_PARAMS}
        if case.model:
            shown["model"] = case.model
        return shown

    cells: dict[tuple, list[dict[str, Any]]] = {}
    for case in cases:
        cells.setdefault((case.method_label, _task(case), _length(case)), []).append(
            settings(case))
    keys = list(dict.fromkeys(k for cell in cells.values() for s in cell for k in s))
    return [k for k in keys
            if any(len({repr(s.get(k)) for s in cell}) > 1 for cell in cells.values())]


def _setting(case: CaseResult, key: str) -> Any:
    return case.model if key == "model" else case.bench_params.get(key)


def _row_name(case: CaseResult, extras: list[str]) -> str:
    if not extras:
        return case.method_label
    shown = ", ".join(f"{k}={_setting(case, k)}" for k in extras)
    return f"{case.method_label} ({shown})"


@dataclass
class Headline:
    """One method row at one length: the mean over the tasks it ran there, pooled interval, and
    the paired difference from identity over the tasks both ran."""

    tasks: list[str]
    mean: float
    low: float
    high: float
    samples: int
    delta: float | None = None  # None: identity ran none of these tasks here (or is this row)
    delta_tasks: list[str] = field(default_factory=list)
    ratio: float | None = None  # mean compression_ratio of these cases


@dataclass
class RulerRow:
    name: str  # the method label (and any setting that splits it)
    method: str  # the registry name
    is_identity: bool
    cases: list[CaseResult]
    headline: dict[int, Headline] = field(default_factory=dict)  # by length

    @property
    def ratio(self) -> float | None:
        return _mean([r for r in (finite_metric(c, "compression_ratio") for c in self.cases)
                      if r is not None])


@dataclass
class RulerTable:
    rows: list[RulerRow]
    lengths: list[int]
    tasks: list[str]  # in order of first appearance
    extras: list[str]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _length(case: CaseResult) -> int:
    return int(case.bench_params.get("length", 0))


def _task(case: CaseResult) -> str:
    return str(case.bench_params.get("task", "?"))


def ruler_table(result: RunResult) -> RulerTable | None:
    """The numbers of the ruler section and figure; None when the run has no ok ruler case
    with a score."""
    cases = [c for c in ok_cases(result, "ruler") if finite_metric(c, "score") is not None]
    if not cases:
        return None
    extras = _extras(cases)
    rows: dict[str, RulerRow] = {}
    for case in cases:
        name = _row_name(case, extras)
        row = rows.setdefault(name, RulerRow(name, case.method, case.method == IDENTITY, []))
        row.cases.append(case)
    ordered = ([r for r in rows.values() if r.is_identity]
               + [r for r in rows.values() if not r.is_identity])
    # The reference of each (model, task, length, seed, samples) cell: the first identity case.
    reference: dict[tuple, CaseResult] = {}
    for row in ordered:
        if row.is_identity:
            for case in row.cases:
                reference.setdefault(pair_key(case, _UNPAIRED_PARAMS), case)
    lengths = sorted({_length(c) for c in cases})
    for row in ordered:
        for length in lengths:
            here = [c for c in row.cases if _length(c) == length]
            if here:
                row.headline[length] = _headline(row, here, reference)
    return RulerTable(ordered, lengths, list(dict.fromkeys(_task(c) for c in cases)), extras)


def _headline(row: RulerRow, cases: list[CaseResult],
              reference: dict[tuple, CaseResult]) -> Headline:
    mean = sum(finite_metric(c, "score") for c in cases) / len(cases)
    samples = sum(_samples(c) for c in cases)
    low, high = wilson_interval(mean, samples) if samples else (math.nan, math.nan)
    ratios = [r for r in (finite_metric(c, "compression_ratio") for c in cases) if r is not None]
    head = Headline([_task(c) for c in cases], mean, low, high, samples, ratio=_mean(ratios))
    if row.is_identity:
        return head
    differences: list[float] = []
    for case in cases:
        ref = reference.get(pair_key(case, _UNPAIRED_PARAMS))
        mine, theirs = _scores(case), None if ref is None else _scores(ref)
        if mine is None or theirs is None or len(mine) != len(theirs):
            continue  # no pairing without both per-sample lists of the same samples
        differences += [a - b for a, b in zip(mine, theirs)]
        head.delta_tasks.append(_task(case))
    head.delta = _mean(differences)
    return head


# ---------------------------------------------------------------------------------------------
# ruler: the section


def _pct(value: float) -> str:
    return f"{value:.1f}"


def _ci(value: float, low: float | None, high: float | None) -> str:
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return _pct(value)
    return f"{_pct(value)} [{_pct(low)}–{_pct(high)}]"


def _signed(value: float) -> str:
    text = f"{value:+.1f}"
    return "±0.0" if text in ("+0.0", "-0.0") else text.replace("-", "−")


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _delta_cell(row: RulerRow, head: Headline) -> str:
    if row.is_identity:
        return "(reference)"
    if head.delta is None:
        return "—"
    text = _signed(head.delta)
    if len(head.delta_tasks) < len(head.tasks):
        text += f" ({len(head.delta_tasks)} of {len(head.tasks)} tasks)"
    return text


def _headline_table(table: RulerTable) -> str:
    header = ["method"]
    for length in table.lengths:
        name = length_name(length)
        header += [f"{name}: mean over tasks [95% CI] ↑", f"{name}: Δ vs identity"]
    header.append("compression ratio (x) ↑")
    rows = []
    for row in table.rows:
        cells = [row.name]
        for length in table.lengths:
            head = row.headline.get(length)
            if head is None:
                cells += ["—", "—"]
            else:
                cells += [_ci(head.mean, head.low, head.high), _delta_cell(row, head)]
        cells.append(_ratio(row.ratio))
        rows.append(cells)
    return md_table(header, rows, set(range(1, len(header))))


def _covered_line(table: RulerTable) -> str:
    def coverage(row: RulerRow) -> dict[int, list[str]]:
        return {length: head.tasks for length, head in row.headline.items()}

    def describe(cover: dict[int, list[str]]) -> str:
        task_sets = {tuple(tasks) for tasks in cover.values()}
        if len(task_sets) == 1:
            tasks = next(iter(task_sets))
            at = "every length" if len(cover) > 1 else f"length {length_name(next(iter(cover)))}"
            return f"{len(tasks)} task{'s' if len(tasks) != 1 else ''} ({', '.join(tasks)}) at {at}"
        return "; ".join(f"{length_name(length)}: {', '.join(tasks)}"
                         for length, tasks in sorted(cover.items()))

    covers = [coverage(row) for row in table.rows]
    at_length: dict[int, set[tuple[str, ...]]] = {}  # the task sets run at each length
    for cover in covers:
        for length, tasks in cover.items():
            at_length.setdefault(length, set()).add(tuple(tasks))
    if all(cover == covers[0] for cover in covers):
        covered = f"Each mean is over the same {describe(covers[0])}."
    elif all(len(sets) == 1 for sets in at_length.values()):
        # methods ran different lengths, but the same tasks wherever they ran
        covered = ("Every method that ran a length covers the same tasks there: "
                   + describe({length: list(next(iter(sets)))
                               for length, sets in at_length.items()}) + ".")
    else:
        groups: dict[str, list[str]] = {}  # rows with the same coverage named together
        for row, cover in zip(table.rows, covers):
            groups.setdefault(describe(cover), []).append(row.name)
        covered = "The methods ran different tasks; each mean covers: " + " · ".join(
            f"{', '.join(names)}: {text}" for text, names in groups.items()) + "."
    pooled = ("The interval is a 95% Wilson interval over all the samples the mean pools; "
              "a difference that falls inside the intervals is not a difference.")
    delta = ("Δ vs identity is paired: the mean of per-sample differences from identity's "
             "answers to the same samples, only over the (task, length) cells identity also ran.")
    return f"<sub>{covered} {pooled} {delta}</sub>"


def _task_cell(case: CaseResult, with_samples: bool) -> str:
    score = finite_metric(case, "score")
    low, high = finite_metric(case, "score_ci_low"), finite_metric(case, "score_ci_high")
    if (low is None or high is None) and _samples(case):
        low, high = wilson_interval(score, _samples(case))
    text = _ci(score, low, high)
    return f"{text} (n={_samples(case)})" if with_samples else text


def _per_task_tables(result: RunResult, table: RulerTable) -> list[str]:
    """One table per context length any ruler case was run at, each under a `#### <length>
    tokens` heading: rows the tasks run at that length (in the run's order), columns the
    methods that ran there (identity first); a cell whose case did not finish shows its status,
    a task the method did not run there "—". Under each table, its samples per cell."""
    every = [c for c in result.cases if c.benchmark == "ruler"]
    failed: dict[tuple[str, str, int], str] = {}
    for case in every:
        if case.status != "ok":
            failed.setdefault((_row_name(case, table.extras), _task(case), _length(case)),
                              case.status)
    names = [row.name for row in table.rows]
    names += [name for name in dict.fromkeys(n for n, _, _ in failed) if name not in names]
    ok = {(row.name, _task(c), _length(c)): c for row in table.rows for c in reversed(row.cases)}
    ran = {*ok, *failed}  # (name, task, length) of every cell with a case
    parts = []
    for length in sorted({_length(c) for c in every}):
        tasks = list(dict.fromkeys(_task(c) for c in every if _length(c) == length))
        here = [n for n in names if any((n, t, length) in ran for t in tasks)]
        absent = [n for n in names if n not in here]
        cases = [ok[(n, t, length)] for n in here for t in tasks if (n, t, length) in ok]
        counts = {_samples(c) for c in cases}
        per_cell = len(counts) > 1
        rows = []
        for task in tasks:
            cells = [task]
            for name in here:
                case = ok.get((name, task, length))
                cells.append(failed.get((name, task, length), "—") if case is None
                             else _task_cell(case, per_cell))
            rows.append(cells)
        header = ["task", *here]
        notes = []
        if per_cell:
            notes.append("samples per cell differ: n in each cell")
        elif counts and counts != {0}:
            count = counts.pop()
            notes.append(f"{count} sample{'s' if count != 1 else ''} per cell")
        if absent:
            notes.append(f"not run at {length_name(length)}: {', '.join(absent)}")
        parts += [f"#### {length_name(length)} tokens",
                  md_table(header, rows, set(range(1, len(header))))]
        if notes:
            parts.append(f"<sub>{'; '.join(notes)}.</sub>")
    return parts


def _haystack_line(table: RulerTable) -> str | None:
    by_haystack: dict[str, list[str]] = {}
    for row in table.rows:
        for case in row.cases:
            haystack = case.info.get("haystack")
            if haystack:
                tasks = by_haystack.setdefault(str(haystack), [])
                if _task(case) not in tasks:
                    tasks.append(_task(case))
    if not by_haystack:
        return None
    return "<sub>Haystacks: " + " · ".join(
        f"{', '.join(tasks)}: {haystack}" for haystack, tasks in by_haystack.items()) + "</sub>"


def ruler_section(result: RunResult) -> str | None:
    """The ruler summary below its generic table; None when the run has no ok ruler case."""
    table = ruler_table(result)
    if table is None:
        return None
    identity = ("identity's column is the full cache, the reference"
                if any(r.is_identity for r in table.rows)
                else "no identity case: no Δ can be given")
    parts = [
        "### RULER: mean score over tasks, per context length",
        _headline_table(table),
        _covered_line(table),
        "### RULER: score per task and length [95% CI]",
        f"<sub>{identity}; score 0-100, ↑ higher is better.</sub>",
        *_per_task_tables(result, table),
    ]
    haystacks = _haystack_line(table)
    if haystacks:
        parts.append(haystacks)
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------
# ruler: the figure


@dataclass
class RulerLine:
    """One method (registry name) in one panel: a point per label, in order of ratio."""

    method: str
    family: str  # its colour and marker (plots.method_family)
    labels: list[str] = field(default_factory=list)
    x: list[float] = field(default_factory=list)  # compression ratio
    y: list[float] = field(default_factory=list)  # mean score over tasks
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)


@dataclass
class RulerPanel:
    length: int
    lines: list[RulerLine]
    identity: float | None = None  # identity's mean score: the dashed line
    identity_ci: tuple[float, float] | None = None


@dataclass
class RulerPlot:
    """What the ruler figure shows; `ruler_plot_png` returns it as `.plot` on the path."""

    title: str
    panels: list[RulerPanel]

    @property
    def n_points(self) -> int:
        return sum(len(line.x) for panel in self.panels for line in panel.lines)


def ruler_plot_data(result: RunResult) -> RulerPlot | None:
    """One panel per length; in each, one line per method (registry name, and any setting that
    splits rows), a point per label with a compression ratio; identity as its score. None when
    there is no point to draw."""
    table = ruler_table(result)
    if table is None:
        return None
    panels = []
    for length in table.lengths:
        lines: dict[str, RulerLine] = {}
        panel = RulerPanel(length, [])
        for row in table.rows:
            head = row.headline.get(length)
            if head is None:
                continue
            if row.is_identity:
                if panel.identity is None:
                    panel.identity, panel.identity_ci = head.mean, (head.low, head.high)
                continue
            if head.ratio is None:
                continue
            extra = row.name[len(row.cases[0].method_label):]  # " (compress=...)" or ""
            line = lines.setdefault(row.method + extra, RulerLine(row.method + extra,
                                                                      method_family(row.method)))
            line.labels.append(row.cases[0].method_label)
            line.x.append(head.ratio)
            line.y.append(head.mean)
            line.low.append(head.low)
            line.high.append(head.high)
        for line in lines.values():
            order = sorted(range(len(line.x)), key=lambda i: (line.x[i], line.labels[i]))
            for name in ("labels", "x", "y", "low", "high"):
                values = getattr(line, name)
                setattr(line, name, [values[i] for i in order])
        panel.lines = list(lines.values())
        if panel.lines or panel.identity is not None:
            panels.append(panel)
    if not any(panel.lines for panel in panels):
        return None
    model = {c.model for row in table.rows for c in row.cases if c.model}
    on = f" — {model.pop()}" if len(model) == 1 else ""
    return RulerPlot(f"kvbench {result.suite.name}: RULER average score vs compression{on}",
                     panels)


def ruler_plot_png(result: RunResult, path: str | Path) -> Path | None:
    """Write the kvpress-style figure: per length, the mean RULER score over tasks against the
    compression ratio, a line per method, identity dashed. Returns the path with the plotted
    data as `.plot`; None when nothing can be drawn (nothing written). Raises PlotUnavailable
    without matplotlib."""
    plot = ruler_plot_data(result)
    if plot is None:
        return None
    plt = pyplot()
    path = Path(path)
    count = len(plot.panels)
    # one log x for all panels: the eviction methods crowd 1-2x and the codecs reach 20x
    fig, axes = plt.subplots(1, count, figsize=(2 + 4.8 * count, 5.2), dpi=100, sharex=True,
                             sharey=True, squeeze=False)
    try:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        styles = line_styles({line.method: line.family for panel in plot.panels
                              for line in panel.lines})
        for panel, ax in zip(plot.panels, axes[0]):
            if panel.identity is not None:
                ax.axhline(panel.identity, color="black", linestyle="--", linewidth=1.2,
                           label=f"identity ({panel.identity:.1f})", zorder=2)
                if panel.identity_ci and all(map(math.isfinite, panel.identity_ci)):
                    ax.axhspan(*panel.identity_ci, color="black", alpha=0.07, zorder=1,
                               label="identity 95% CI")
            for line in panel.lines:
                yerr = [[y - lo for y, lo in zip(line.y, line.low)],
                        [hi - y for y, hi in zip(line.y, line.high)]]
                ax.errorbar(line.x, line.y, yerr=yerr, markersize=6, capsize=3, linewidth=1.4,
                            elinewidth=1.0, label=line.method, zorder=3, **styles[line.method])
            if not panel.lines:
                ax.text(0.5, 0.5, "no compressed method\nscored at this length",
                        transform=ax.transAxes, ha="center", va="center", fontsize=9, alpha=0.7)
            ax.set_title(f"context {length_name(panel.length)} tokens", fontsize=10)
            ax.set_xlabel("compression ratio vs 16-bit (x, log)")
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(LogLocator(base=2))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.margins(x=0.08)  # a point at either end of the ratios stays off the frame
            ax.set_ylim(-3, 102)  # a score of 0 sits above the axis, not on it
            ax.grid(True, alpha=0.35)
        axes[0, 0].set_ylabel("RULER score, mean over tasks (0-100) [95% CI]")
        fig.suptitle(plot.title)
        # one legend right of the panels, off the points (most methods score low, at the left)
        handles = {}
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label.split(" (")[0] if label.startswith("identity (")
                                   else label, handle)
        fig.tight_layout(rect=(0, 0, 1 - 1.6 / fig.get_figwidth(), 1))
        fig.legend(handles.values(), handles.keys(), loc="center right", fontsize=8)
        save_png(fig, path)
    finally:
        plt.close(fig)
    return PlotPath.of(path, plot)


def ruler_figure(result: RunResult, out_dir: Path | None) -> str | None:
    """The figure's link (writing it when out_dir is given), a note when matplotlib is missing,
    or None when there is nothing to plot: the same text with or without out_dir."""
    if ruler_plot_data(result) is None:
        return None
    try:
        if out_dir is None:
            check_matplotlib()
        else:
            ruler_plot_png(result, Path(out_dir) / RULER_PNG)
    except PlotUnavailable:
        return f"<sub>RULER plot skipped: {MATPLOTLIB_MISSING}</sub>"
    return f"![RULER: mean score over tasks vs compression ratio, per context length]({RULER_PNG})"


# ---------------------------------------------------------------------------------------------
# niah


@dataclass
class NiahHeatmap:
    """What one heatmap shows: scores[depth row][length column], depths ascending (0 on top)."""

    label: str
    title: str
    lengths: list[int]
    depths: list[float]
    scores: list[list[float]]  # NaN where the grid has no score


def _niah_cases(result: RunResult) -> list[CaseResult]:
    return [c for c in ok_cases(result, "niah") if isinstance(c.info.get("grid"), dict)]


def niah_file_names(cases: list[CaseResult]) -> list[str]:
    """`niah_<label>.png`, the label made safe for a file name (and a link); repeats numbered."""
    names, seen = [], set()
    for case in cases:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", case.method_label).strip("._-") or "case"
        name, n = f"niah_{stem}.png", 2
        while name in seen:
            name, n = f"niah_{stem}-{n}.png", n + 1
        seen.add(name)
        names.append(name)
    return names


def niah_heatmap_data(case: CaseResult) -> NiahHeatmap:
    grid = case.info["grid"]
    lengths, depths, scores = list(grid["lengths"]), list(grid["depths"]), grid["scores"]

    def cell(d: int, k: int) -> float:
        try:
            value = scores[d][k]
            return math.nan if value is None else float(value)
        except (IndexError, TypeError, ValueError):
            return math.nan

    rows = sorted(range(len(depths)), key=lambda d: depths[d])
    columns = sorted(range(len(lengths)), key=lambda k: lengths[k])
    ratio = finite_metric(case, "compression_ratio")
    title = case.method_label
    if ratio is not None:
        title += f" — KV compression {ratio:.2f}x vs 16-bit"  # identity can be below 1x
    if case.model:
        title += f"\n({case.model})"  # its own line: a one-length grid is a narrow figure
    return NiahHeatmap(case.method_label, title, [lengths[k] for k in columns],
                       [depths[d] for d in rows], [[cell(d, k) for k in columns] for d in rows])


def niah_heatmap_pngs(result: RunResult, out_dir: str | Path) -> list[Path]:
    """One heatmap PNG per ok niah case with a grid, `niah_<label>.png` in out_dir; each path
    carries its data as `.plot`. [] when there is none; PlotUnavailable without matplotlib."""
    cases = _niah_cases(result)
    if not cases:
        return []
    plt = pyplot()
    out_dir = Path(out_dir)
    written = []
    for case, name in zip(cases, niah_file_names(cases)):
        heat = niah_heatmap_data(case)
        # wide enough for the title at any number of lengths
        fig, ax = plt.subplots(figsize=(max(4.6, 2.5 + 0.9 * len(heat.lengths)),
                                        1.8 + 0.45 * len(heat.depths)), dpi=100)
        try:
            cmap = plt.get_cmap("RdYlGn")
            image = ax.imshow(heat.scores, cmap=cmap, vmin=0, vmax=100, aspect="auto",
                              origin="upper", interpolation="nearest")
            for d, row in enumerate(heat.scores):
                for k, value in enumerate(row):
                    if math.isnan(value):  # an empty cell: the axes' white shows through
                        ax.text(k, d, "—", ha="center", va="center", fontsize=8, color="black")
                    else:
                        ax.text(k, d, f"{value:.0f}", ha="center", va="center", fontsize=8,
                                color=_ink_on(cmap(value / 100)))
            ax.set_xticks(range(len(heat.lengths)))
            ax.set_xticklabels([length_name(n) for n in heat.lengths])
            ax.set_yticks(range(len(heat.depths)))
            ax.set_yticklabels([f"{d:g}" for d in heat.depths])
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel("needle depth (%)")
            ax.set_title(heat.title, fontsize=10)
            fig.colorbar(image, ax=ax, label="score (0-100)")
            fig.tight_layout()
            save_png(fig, out_dir / name)
        finally:
            plt.close(fig)
        written.append(PlotPath.of(out_dir / name, heat))
    return written


def _ink_on(rgba: tuple[float, ...]) -> str:
    """White on the map's dark ends (deep red, deep green), black elsewhere."""
    red, green, blue = rgba[:3]
    return "white" if 0.299 * red + 0.587 * green + 0.114 * blue < 0.5 else "black"


def niah_section(result: RunResult, out_dir: str | Path | None = None) -> str | None:
    """A table (method, mean score [CI], compression ratio) and the heatmaps' links (writing them
    when out_dir is given) or a note when matplotlib is missing; the same text either way. None
    when the run has no ok niah case."""
    cases = ok_cases(result, "niah")
    if not cases:
        return None
    rows = []
    for case in cases:
        score = finite_metric(case, "score")
        rows.append([case.method_label,
                     "—" if score is None else _ci(score, finite_metric(case, "score_ci_low"),
                                                   finite_metric(case, "score_ci_high")),
                     _ratio(finite_metric(case, "compression_ratio"))])
    parts = ["### NIAH: mean score over the depth × length grid",
             md_table(["method", "mean score over the grid [95% CI] ↑", "compression ratio (x) ↑"],
                      rows, {1, 2})]
    notes = []
    grids = {(tuple(c.info["grid"].get("lengths", [])), tuple(c.info["grid"].get("depths", [])))
             for c in _niah_cases(result)}
    if len(grids) == 1:
        lengths, depths = grids.pop()
        notes.append(f"grid: lengths {', '.join(map(str, lengths))} tokens × depths "
                     f"{', '.join(f'{d:g}' for d in depths)}%")
    haystacks = list(dict.fromkeys(str(c.info["haystack"]) for c in cases if c.info.get("haystack")))
    if haystacks:
        notes.append("haystack: " + "; ".join(haystacks))
    if notes:
        parts.append(f"<sub>{' · '.join(notes)}</sub>")
    plotted = _niah_cases(result)
    if plotted:
        try:
            if out_dir is None:
                check_matplotlib()
            else:
                niah_heatmap_pngs(result, out_dir)
        except PlotUnavailable:
            parts.append(f"<sub>needle heatmaps skipped: {MATPLOTLIB_MISSING}</sub>")
        else:
            parts.append("\n".join(
                f"![needle in a haystack: {re.sub(r'[][]', '', case.method_label)}]({name})"
                for case, name in zip(plotted, niah_file_names(plotted))))
    return "\n\n".join(parts)
