"""The stress report's figures: throughput and first-token latency, and goodput, against users."""
from __future__ import annotations

from pathlib import Path

from kvbench.benchmarks.reports.stress_table import StressTable, stress_table, task_lines
from kvbench.reportkit.figures import PlotPath, figure_text, pyplot, save_png, xy_lines
from kvbench.reportkit.tables import finite_metric
from kvbench.results import RunResult

THROUGHPUT_PNG = "stress_throughput.png"
GOODPUT_PNG = "stress_goodput.png"
# (metric, panel title, y label) of the figure's panels
PANELS = (
    ("output_tok_s", "aggregate output tok/s", "tok/s (higher is better)"),
    ("per_user_tok_s", "per-user tok/s", "tok/s (higher is better)"),
    ("ttft_s_p99", "p99 time to first token", "s (lower is better)"),
)


def goodput_lines(table: StressTable) -> dict[str, tuple[list[int], list[float]]]:
    """Per line with task samples at two levels or more: the levels with a finite goodput, and
    its values there."""
    return xy_lines({name: [(n, finite_metric(cases[n], "goodput_rps")) for n in sorted(cases)]
                     for name, cases in task_lines(table).items()}, least=2)


def goodput_figure(result: RunResult, out_dir: Path | None) -> str | None:
    """The goodput figure's link (written to out_dir when given), a note without matplotlib,
    or None when no line with task samples has two levels."""
    table = stress_table(result)
    if table is not None and not goodput_lines(table):
        table = None
    return figure_text(
        table, out_dir,
        lambda table, folder: stress_goodput_png(table, folder / GOODPUT_PNG, result.suite.name),
        f"![goodput (requests meeting the SLOs and answered correctly, per second) against"
        f" concurrent users]({GOODPUT_PNG})", "stress goodput plot")


def stress_goodput_png(table: StressTable, path: Path, title: str) -> Path:
    """Goodput against users, a solid line per method; its request throughput (every
    successful request) dashed in the same colour: the gap is the requests that missed an SLO
    or were answered wrongly."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=100)
    try:
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        markers = "osD^v<>P*X"
        lines = goodput_lines(table)
        labels = _short_labels(table, list(lines))
        throughput = {}
        for k, (line, (x, y)) in enumerate(lines.items()):
            colour = colours[k % len(colours)]
            ax.plot(x, y, marker=markers[k % len(markers)], color=colour, linewidth=1.6,
                    label=labels[line])
            cases = table.lines[line]
            tx = [n for n in x if finite_metric(cases[n], "request_throughput") is not None]
            ty = [finite_metric(cases[n], "request_throughput") for n in tx]
            throughput[line] = (tx, ty)
            ax.plot(tx, ty, linestyle="--", color=colour, linewidth=0.9, alpha=0.6)
        levels = sorted({n for x, _ in lines.values() for n in x})
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.set_xlabel("concurrent users")
        ax.set_ylabel("req/s (higher is better)")
        ax.set_title(f"kvbench {title}: goodput (within the SLOs and correct); dashed: all"
                     " successful requests", fontsize=10)
        ax.grid(True, alpha=0.35)
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_png(fig, path)
    finally:
        plt.close(fig)
    return PlotPath.of(path, {"goodput_rps": lines, "request_throughput": throughput})


def stress_figures(result: RunResult, out_dir: Path | None) -> str | None:
    """The figure's link (written to out_dir when given), a note without matplotlib, or None
    when no method has two levels or more (nothing to draw a curve of)."""
    table = stress_table(result)
    if table is not None and not any(panel_lines(table, metric) for metric, _, _ in PANELS):
        table = None
    return figure_text(
        table, out_dir,
        lambda table, folder: stress_throughput_png(table, folder / THROUGHPUT_PNG,
                                                    result.suite.name),
        f"![aggregate and per-user tok/s and p99 TTFT against concurrent users]"
        f"({THROUGHPUT_PNG})", "stress plot")


def panel_lines(table: StressTable, metric: str) -> dict[str, tuple[list[int], list[float]]]:
    """Per line of two levels or more (a single level, such as a capacity run, is no curve):
    the levels with a finite `metric`, and its values there."""
    return xy_lines({name: [(n, finite_metric(cases[n], metric)) for n in sorted(cases)]
                     for name, cases in table.lines.items()}, least=2)


def stress_throughput_png(table: StressTable, path: Path, title: str) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), dpi=100)
    try:
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        markers = "osD^v<>P*X"
        plotted = {}
        for ax, (metric, name, ylabel) in zip(axes, PANELS):
            lines = panel_lines(table, metric)
            labels = _short_labels(table, list(lines))
            for k, (line, (x, y)) in enumerate(lines.items()):
                ax.plot(x, y, marker=markers[k % len(markers)], color=colours[k % len(colours)],
                        linewidth=1.4, label=labels[line])
            plotted[metric] = lines
            levels = sorted({n for x, _ in lines.values() for n in x})
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(n) for n in levels])
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("concurrent users")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.35)
        fig.suptitle(f"kvbench {title}: throughput and first-token latency under load")
        handles, labels = axes[0].get_legend_handles_labels()
        rows = -(-len(labels) // 4)  # the legend below the panels, four labels a row
        fig.tight_layout(rect=(0, 0.055 * rows + 0.02, 1, 1))
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)
        save_png(fig, path)
    finally:
        plt.close(fig)
    return PlotPath.of(path, plotted)


def _short_labels(table: StressTable, names: list[str]) -> dict[str, str]:
    """Each plotted line's method label, when that alone tells them apart, else its full name
    (the label and the settings that differ)."""
    labels = {name: next(iter(table.lines[name].values())).method_label for name in names}
    if len(set(labels.values())) == len(names):
        return labels
    return {name: name for name in names}
