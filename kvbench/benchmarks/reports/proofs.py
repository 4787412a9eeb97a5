"""The proofs benchmark's part of the report: after its table, a note naming the methods whose
cache policy its rows leave out (they measure the bare codecs) and the rate-distortion figure of
its cases (one panel per data kind, a line per method family, the Pareto front); its
leaderboard's columns. Made from results alone; the figure needs matplotlib (without it, one
line says so).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.benchmarks.records.proofs import ProofsRecord
from kvbench.reportkit.benchmark import BenchmarkReport, Board
from kvbench.reportkit.figures import (
    PlotPath, family_styles, figure_text, legend_handles, legend_right, method_family,
    pareto_front, pyplot, save_png,
)
from kvbench.results import RunResult

BENCHMARK = "proofs"
RATE_DISTORTION_PNG = "rate_distortion.png"
_LOG_SPAN = 10.0  # y on a log scale when its positive values span more than this factor


@dataclass
class Family:
    """One method family's points in one panel, in order of x (then y)."""

    name: str
    labels: list[str] = field(default_factory=list)
    x: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)


@dataclass
class Series:
    """The points of one data kind (one panel), by method family in order of first appearance,
    and the panel's Pareto front in order of x (empty when a metric has no better direction)."""

    data: str
    families: list[Family] = field(default_factory=list)
    front: list[tuple[str, float, float]] = field(default_factory=list)  # (label, x, y)

    @property
    def n_points(self) -> int:
        return sum(len(f.x) for f in self.families)

    def points(self) -> list[tuple[str, str, float, float]]:
        """(family, label, x, y) of every point, family by family."""
        return [(f.name, label, px, py) for f in self.families
                for label, px, py in zip(f.labels, f.x, f.y)]


@dataclass
class RatePlot:
    """What a rate-distortion figure shows; `rate_distortion_png` returns it as `.plot` on the path."""

    title: str
    x: str
    y: str
    series: list[Series]
    log_y: bool
    x_direction: str = "lower"  # of the x metric: which way the front's steps go
    y_direction: str = "lower"

    @property
    def n_points(self) -> int:
        return sum(s.n_points for s in self.series)


def rate_distortion_data(result: RunResult, x: str = "bits_per_value",
                         y: str = "attn_output_error") -> RatePlot | None:
    """One point per finished proofs case with finite x and y, one series per bench param `data`
    (in order of first appearance), its points by method family, each family in order of x; the
    Pareto front by the metrics' directions. None when no case has both metrics."""
    by_data: dict[str, dict[str, Family]] = {}
    directions = {}
    for case in result.cases:
        if case.benchmark != BENCHMARK or case.status != "ok":
            continue
        mx, my = case.metrics.get(x), case.metrics.get(y)
        if mx is None or my is None or not (math.isfinite(mx.value) and math.isfinite(my.value)):
            continue
        directions.setdefault(x, mx.direction)
        directions.setdefault(y, my.direction)
        families = by_data.setdefault(str(case.bench_params.get("data", "?")), {})
        name = method_family(case.method)
        family = families.setdefault(name, Family(name))
        family.labels.append(case.method_label)
        family.x.append(mx.value)
        family.y.append(my.value)
    if not by_data:
        return None
    series = []
    for data, families in by_data.items():
        for family in families.values():
            order = sorted(range(len(family.x)), key=lambda i: (family.x[i], family.y[i]))
            family.labels, family.x, family.y = ([values[i] for i in order] for values in
                                                 (family.labels, family.x, family.y))
        s = Series(data, list(families.values()))
        s.front = _front(s, directions[x], directions[y])
        series.append(s)
    positive = [v for s in series for f in s.families for v in f.y if v > 0]
    log_y = bool(positive) and max(positive) / min(positive) > _LOG_SPAN
    return RatePlot(title=f"kvbench {result.suite.name}: rate-distortion (proofs)", x=x, y=y,
                    series=series, log_y=log_y, x_direction=directions[x],
                    y_direction=directions[y])


def _front_order(xy: list[tuple[float, float]], x_direction: str,
                 y_direction: str) -> list[int] | None:
    """Indices of the Pareto front of points (x, y), in order of x; None when either metric has
    no better direction."""
    if x_direction not in ("lower", "higher") or y_direction not in ("lower", "higher"):
        return None
    sign = 1.0 if x_direction == "lower" else -1.0  # pareto_front takes fewer x as better
    front = pareto_front([(sign * px, py) for px, py in xy], y_direction)
    return sorted(front, key=lambda i: (xy[i][0], i))


def _front(series: Series, x_direction: str, y_direction: str) -> list[tuple[str, float, float]]:
    """The series' Pareto front, (label, x, y) in order of x; none when either metric has no
    better direction."""
    points = series.points()
    order = _front_order([(px, py) for _, _, px, py in points], x_direction, y_direction)
    return [points[i][1:] for i in order or []]


def _axis_label(result: RunResult, metric: str) -> str:
    unit = next((c.metrics[metric].unit for c in result.cases if metric in c.metrics), "")
    names = {
        "bits_per_value": "bits per value (K and V, all stored bytes)",
        "compression_ratio": "compression ratio vs 16-bit",
        "attn_output_error": "attention-output error (relative Frobenius)",
        "mse": "MSE per element",
        "cosine": "mean cosine similarity",
    }
    name = names.get(metric, metric)
    if unit and unit not in ("bytes", "B"):
        return f"{name} [{unit}]"
    if not unit and metric in ("attn_output_error", "mse", "cosine", "ip_rel_error"):
        return f"{name} [dimensionless]"
    return name


def rate_distortion_png(result: RunResult, path: str | Path, x: str = "bits_per_value",
                        y: str = "attn_output_error") -> Path | None:
    """Write the rate-distortion PNG of the run's proofs cases to `path` (via a temp file and a
    rename). Returns the path, with the plotted data as `.plot`; None when the run has no proofs
    case with both metrics (nothing written). Raises PlotUnavailable without matplotlib."""
    plot = rate_distortion_data(result, x, y)
    if plot is None:
        return None
    plt = pyplot()

    path = Path(path)
    styles = family_styles(f.name for s in plot.series for f in s.families)
    # One panel per data kind (stacked, same axes); one legend for all of them, on the right.
    rows = len(plot.series)
    fig, axes = plt.subplots(rows, 1, figsize=(12, 1.2 + 4.2 * rows), dpi=100, sharex=True,
                             sharey=True, squeeze=False)
    try:
        for s, ax in zip(plot.series, axes[:, 0]):
            _rate_panel(ax, s, plot, styles)
            ax.set_ylabel(_axis_label(result, y) + (" (log)" if plot.log_y else ""), fontsize=9)
        axes[-1, 0].set_xlabel(_axis_label(result, x))
        fig.suptitle(plot.title)
        handles = legend_handles(axes[:, 0])
        if "Pareto front" in handles:  # last, after the families
            handles["Pareto front"] = handles.pop("Pareto front")
        legend_right(fig, handles, fontsize=9, title="method family")
        # names go on last, once the layout has fixed where every point is
        renderer = fig.canvas.get_renderer()
        for s, ax in zip(plot.series, axes[:, 0]):
            # only the front is named: every name would crowd the lower-bit corner
            _label_where_room(ax, renderer, [p for p in s.front if _drawn(plot, p[2])],
                              [(px, py) for *_, px, py in s.points()])
        save_png(fig, path)
    finally:
        plt.close(fig)
    return PlotPath.of(path, plot)


def _family_line(points: list[tuple[float, float]], x_direction: str,
                 y_direction: str) -> list[tuple[float, float]]:
    """A family's line: its own Pareto front, in order of x (all its points where a metric has
    no better direction)."""
    order = _front_order(points, x_direction, y_direction)
    return sorted(points) if order is None else [points[i] for i in order]


def _drawn(plot: RatePlot, y: float) -> bool:
    return y > 0 or not plot.log_y  # a log axis cannot show 0: the panel's title lists those


def _rate_panel(ax, s: Series, plot: RatePlot, styles: dict[str, tuple[str, str]]) -> None:
    """One data kind: each family's points and line, the Pareto front's steps, the axes."""
    for f in s.families:
        shown = [(px, py) for px, py in zip(f.x, f.y) if _drawn(plot, py)]
        if not shown:
            continue
        colour, marker = styles[f.name]
        # a thin line along the family's own best points only: through every variant it would
        # zigzag between unrelated settings at one rate; the overall front must stand out
        line = _family_line(shown, plot.x_direction, plot.y_direction)
        ax.plot([p[0] for p in line], [p[1] for p in line], color=colour, linewidth=0.9,
                alpha=0.5, zorder=3)
        ax.plot([p[0] for p in shown], [p[1] for p in shown], color=colour, marker=marker,
                markersize=6, linestyle="none", label=f.name, zorder=3)
    front = [(label, px, py) for label, px, py in s.front if _drawn(plot, py)]
    if front:
        ax.step([p[1] for p in front], [p[2] for p in front], color="black", linestyle="--",
                linewidth=1.3, zorder=2, label="Pareto front",
                where="post" if plot.x_direction == "lower" else "pre")
        ax.scatter([p[1] for p in front], [p[2] for p in front], s=130, facecolors="none",
                   edgecolors="black", linewidths=1.2, zorder=4)
        # a front point drawn over any other family's at the same place: its name is printed there
        for family, label, px, py in s.points():
            if (label, px, py) in front:
                colour, marker = styles[family]
                ax.plot([px], [py], color=colour, marker=marker, markersize=6, zorder=3.5)
    if plot.log_y:
        from matplotlib.ticker import FuncFormatter, LogLocator
        ax.set_yscale("log")
        # label 1, 2, 5 of every decade: a decade alone is too coarse to read values off
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    hidden = [label for _, label, _, py in s.points() if not _drawn(plot, py)]
    note = f"; {plot.y} = 0, not drawn on the log axis: " + ", ".join(hidden) if hidden else ""
    ax.set_title(f"data={s.data} ({s.n_points} cases{note})", fontsize=10)
    ax.grid(True, which="major", alpha=0.35)


def _label_where_room(ax, renderer, labelled: list[tuple[str, float, float]],
                      points: list[tuple[float, float]]) -> None:
    """Name each labelled point, in turn, beside it where the name covers no earlier name and
    no point and stays inside the axes; where no side has room it stays unnamed (the report's
    table has every case)."""
    marker = 5.0  # display pixels around a point that a name must keep clear of
    taken = []
    for px, py in points:
        cx, cy = ax.transData.transform((px, py))
        taken.append((cx - marker, cy - marker, cx + marker, cy + marker))
    box = ax.get_window_extent(renderer)
    sides = (((7, 4), "left", "bottom"), ((7, -4), "left", "top"),
             ((-7, 4), "right", "bottom"), ((-7, -4), "right", "top"),
             ((0, 9), "center", "bottom"), ((0, -9), "center", "top"))
    for label, px, py in labelled:
        cx, cy = ax.transData.transform((px, py))
        # the name may sit beside its own point, and so beside any point at the same place
        others = [t for t in taken if not (t[0] < cx < t[2] and t[1] < cy < t[3])]
        for offset, ha, va in sides:
            note = ax.annotate(label, (px, py), xytext=offset, textcoords="offset points",
                               fontsize=7, ha=ha, va=va, zorder=5)
            e = note.get_window_extent(renderer)
            inside = box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1
            clear = all(e.x1 < x0 or x1 < e.x0 or e.y1 < y0 or y1 < e.y0
                        for x0, y0, x1, y1 in others)
            if inside and clear:
                taken.append((e.x0, e.y0, e.x1, e.y1))
                break
            note.remove()


def rate_distortion_figure(result: RunResult, out_dir: Path | None) -> str | None:
    """The line after the proofs table: the PNG's link (writing it when out_dir is given), a
    note when matplotlib is missing, or None when there is nothing to plot."""
    return figure_text(
        rate_distortion_data(result), out_dir,
        lambda _, folder: rate_distortion_png(result, folder / RATE_DISTORTION_PNG),
        f"![rate-distortion: bits_per_value vs attn_output_error per proofs case]"
        f"({RATE_DISTORTION_PNG})", "rate-distortion plot")


def bare_codec_note(result: RunResult) -> str | None:
    """The line after the proofs table naming the methods whose cache does more than their codecs
    (each case's record's policy_not_measured), whose rows are their bare codecs' figures; None
    when no proofs case has such a method."""
    unseen: dict[str, list[str]] = {}
    for case in result.cases:
        policy = ProofsRecord.of(case).policy_not_measured if case.benchmark == BENCHMARK else None
        if policy:
            unseen.setdefault(case.method_label, policy)
    if not unseen:
        return None
    methods = "; ".join(f"{label} ({', '.join(policy)})" for label, policy in unseen.items())
    return ("Proofs measure the bare codecs: every vector is encoded and decoded by the method's"
            " codecs, never through its cache, so these rows leave out what a cache does beyond"
            f" them. Not measured here: {methods}. The benchmarks that run the cache (perplexity,"
            " niah, quality) measure it.")


REPORT = BenchmarkReport(
    board=Board("bits_per_value", "attn_output_error",
                ("compression_ratio", "cosine", "mse", "ip_rel_error")),
    parts=lambda result, out_dir: (bare_codec_note(result),
                                   rate_distortion_figure(result, out_dir)))
