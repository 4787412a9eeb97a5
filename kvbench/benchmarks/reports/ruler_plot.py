"""The ruler benchmark's figure: the mean score over tasks against the compression ratio; and
how ruler's figures (this one and kvbench.benchmarks.reports.ruler_board's) draw identity and a
method's scores."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.benchmarks.reports.ruler_numbers import ruler_table
from kvbench.reportkit.figures import (
    PlotPath, figure_text, legend_handles, line_styles, method_family, panel_row,
    save_score_panels,
)
from kvbench.reportkit.tables import length_name
from kvbench.results import RunResult

RULER_PNG = "ruler_score_vs_ratio.png"
RULER_SCORE = "RULER score, mean over tasks (0-100) [95% CI]"  # the y axis of ruler's figures


@dataclass
class RulerLine:
    """One method (registry name) in one panel: a point per label, in order of ratio."""

    method: str
    family: str  # its colour and marker (kit.figures.method_family)
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


def draw_identity(ax, mean: float, interval: tuple[float, float] | None, label: str) -> None:
    """identity's score dashed across the panel, its 95% interval shaded where it is finite."""
    ax.axhline(mean, color="black", linestyle="--", linewidth=1.2, label=label, zorder=2)
    if interval and all(map(math.isfinite, interval)):
        ax.axhspan(*interval, color="black", alpha=0.07, zorder=1, label="identity 95% CI")


def draw_scores(ax, x: list[float], y: list[float], low: list[float], high: list[float],
                label: str, style: dict) -> None:
    """A method's mean scores at x, each with its interval as an error bar."""
    yerr = [[mean - lo for mean, lo in zip(y, low)], [hi - mean for mean, hi in zip(y, high)]]
    ax.errorbar(x, y, yerr=yerr, markersize=6, capsize=3, linewidth=1.4, elinewidth=1.0,
                label=label, zorder=3, **style)


def ruler_plot_png(result: RunResult, path: str | Path) -> Path | None:
    """Write the kvpress-style figure: per length, the mean RULER score over tasks against the
    compression ratio, a line per method, identity dashed. Returns the path with the plotted
    data as `.plot`; None when nothing can be drawn (nothing written). Raises PlotUnavailable
    without matplotlib."""
    plot = ruler_plot_data(result)
    if plot is None:
        return None
    path = Path(path)
    # one log x for all panels: the eviction methods crowd 1-2x and the codecs reach 20x
    with panel_row(len(plot.panels), 5.2, sharex=True, sharey=True) as (fig, axes):
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        styles = line_styles({line.method: line.family for panel in plot.panels
                              for line in panel.lines})
        for panel, ax in zip(plot.panels, axes):
            if panel.identity is not None:
                draw_identity(ax, panel.identity, panel.identity_ci,
                              f"identity ({panel.identity:.1f})")
            for line in panel.lines:
                # the legend names the variants (intq4, intq2), not only their family
                draw_scores(ax, line.x, line.y, line.low, line.high,
                            ", ".join(dict.fromkeys(line.labels)), styles[line.method])
            if not panel.lines:
                ax.text(0.5, 0.5, "no compressed method\nscored at this length",
                        transform=ax.transAxes, ha="center", va="center", fontsize=9, alpha=0.7)
            ax.set_title(f"context {length_name(panel.length)} tokens", fontsize=10)
            ax.set_xlabel("compression ratio vs 16-bit (x, log)")
            ax.set_xscale("log", base=2)
            # ticks at 1, 1.5, 2, 3, 4, 6, ...: two at least, however narrow the ratios
            ax.xaxis.set_major_locator(LogLocator(base=2, subs=(1.0, 1.5)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.margins(x=0.08)  # a point at either end of the ratios stays off the frame
        low, high = axes[0].get_xlim()
        if high < 2 * low:  # an octave at least (shared by the panels): two ticks or more
            middle = math.sqrt(low * high)
            axes[0].set_xlim(middle / math.sqrt(2), middle * math.sqrt(2))
        # one legend right of the panels, off the points (most methods score low, at the left)
        handles = legend_handles(axes, lambda label: label.split(" (")[0]
                                 if label.startswith("identity (") else label)
        save_score_panels(fig, axes, RULER_SCORE, plot.title, path, handles)
    return PlotPath.of(path, plot)


def ruler_figure(result: RunResult, out_dir: Path | None) -> str | None:
    """The figure's link (writing it when out_dir is given), a note when matplotlib is missing,
    or None when there is nothing to plot: the same text with or without out_dir."""
    return figure_text(
        ruler_plot_data(result), out_dir,
        lambda _, folder: ruler_plot_png(result, folder / RULER_PNG),
        f"![RULER: mean score over tasks vs compression ratio, per context length]({RULER_PNG})",
        "RULER plot")
