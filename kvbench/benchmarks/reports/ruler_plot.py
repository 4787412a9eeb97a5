"""The ruler benchmark's figure: the mean score over tasks against the compression ratio."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.benchmarks.reports.ruler_numbers import ruler_table
from kvbench.reportkit.figures import (
    PlotPath, figure_text, legend_handles, legend_right, line_styles, method_family, pyplot,
    save_png,
)
from kvbench.reportkit.tables import length_name
from kvbench.results import RunResult

RULER_PNG = "ruler_score_vs_ratio.png"


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
                # the legend names the variants (intq4, intq2), not only their family
                ax.errorbar(line.x, line.y, yerr=yerr, markersize=6, capsize=3, linewidth=1.4,
                            elinewidth=1.0, label=", ".join(dict.fromkeys(line.labels)),
                            zorder=3, **styles[line.method])
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
            ax.set_ylim(-3, 102)  # a score of 0 sits above the axis, not on it
            ax.grid(True, alpha=0.35)
        low, high = axes[0, 0].get_xlim()
        if high < 2 * low:  # an octave at least (shared by the panels): two ticks or more
            middle = math.sqrt(low * high)
            axes[0, 0].set_xlim(middle / math.sqrt(2), middle * math.sqrt(2))
        axes[0, 0].set_ylabel("RULER score, mean over tasks (0-100) [95% CI]")
        fig.suptitle(plot.title)
        # one legend right of the panels, off the points (most methods score low, at the left)
        handles = legend_handles(axes[0], lambda label: label.split(" (")[0]
                                 if label.startswith("identity (") else label)
        legend_right(fig, handles, fontsize=8)
        save_png(fig, path)
    finally:
        plt.close(fig)
    return PlotPath.of(path, plot)


def ruler_figure(result: RunResult, out_dir: Path | None) -> str | None:
    """The figure's link (writing it when out_dir is given), a note when matplotlib is missing,
    or None when there is nothing to plot: the same text with or without out_dir."""
    return figure_text(
        ruler_plot_data(result), out_dir,
        lambda _, folder: ruler_plot_png(result, folder / RULER_PNG),
        f"![RULER: mean score over tasks vs compression ratio, per context length]({RULER_PNG})",
        "RULER plot")
