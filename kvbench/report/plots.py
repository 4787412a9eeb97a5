"""Figures of one run, made from its results alone: the rate-distortion plot of its proofs cases.

matplotlib is optional (the `plots` extra) and imported only when a figure is drawn, with the
Agg backend (no display). Without it `rate_distortion_png` raises `PlotUnavailable`, which the
report turns into a one-line note.
"""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.results import RunResult

RATE_DISTORTION_PNG = "rate_distortion.png"
MATPLOTLIB_MISSING = "matplotlib is not installed (pip install 'kvbench[plots]')"
_LOG_SPAN = 10.0  # y on a log scale when its positive values span more than this factor


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed: the figure is skipped, the report says so."""


@dataclass
class Series:
    """The points of one data kind: x, y and the method label of each."""

    data: str
    labels: list[str] = field(default_factory=list)
    x: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)


@dataclass
class RatePlot:
    """What a rate-distortion figure shows; `rate_distortion_png` returns it as `.plot` on the path."""

    title: str
    x: str
    y: str
    series: list[Series]
    log_y: bool

    @property
    def n_points(self) -> int:
        return sum(len(s.x) for s in self.series)


class PlotPath(type(Path())):
    """The written PNG's path, carrying the plotted data (`.plot`) so a caller can check it."""

    plot: Any

    @classmethod
    def of(cls, path: str | Path, plot: Any) -> PlotPath:
        out = cls(path)
        out.plot = plot
        return out


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display); PlotUnavailable without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(MATPLOTLIB_MISSING) from exc
    return plt


def check_matplotlib() -> None:
    """PlotUnavailable unless matplotlib imports: what a report without an output folder asks,
    so it says what writing the figures would have."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotUnavailable(MATPLOTLIB_MISSING) from exc
    del matplotlib  # only whether it is there


def rate_distortion_data(result: RunResult, x: str = "bits_per_value",
                         y: str = "attn_output_error") -> RatePlot | None:
    """One point per finished proofs case with finite x and y, one series per bench param `data`
    (in order of first appearance); None when no case has both metrics."""
    series: dict[str, Series] = {}
    for case in result.cases:
        if case.benchmark != "proofs" or case.status != "ok":
            continue
        mx, my = case.metrics.get(x), case.metrics.get(y)
        if mx is None or my is None or not (math.isfinite(mx.value) and math.isfinite(my.value)):
            continue
        data = str(case.bench_params.get("data", "?"))
        s = series.setdefault(data, Series(data))
        s.labels.append(case.method_label)
        s.x.append(mx.value)
        s.y.append(my.value)
    if not series:
        return None
    positive = [v for s in series.values() for v in s.y if v > 0]
    log_y = bool(positive) and max(positive) / min(positive) > _LOG_SPAN
    return RatePlot(title=f"kvbench {result.suite.name}: rate-distortion (proofs)", x=x, y=y,
                    series=list(series.values()), log_y=log_y)


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


def save_png(fig, path: Path) -> None:
    """Via a temp file and a rename; no Software/date metadata, so the same results give the
    same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", metadata={"Software": None})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    # One panel per data kind (stacked, same axes), so the labels of one kind do not cover another's.
    rows = len(plot.series)
    fig, axes = plt.subplots(rows, 1, figsize=(13, 1.5 + 4.8 * rows), dpi=100, sharex=True,
                             sharey=True, squeeze=False)
    try:
        markers = "osD^v<>P*X"
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, (s, ax) in enumerate(zip(plot.series, axes[:, 0])):
            # a log axis cannot show 0: such points are listed in the panel instead
            shown = [(lab, px, py) for lab, px, py in zip(s.labels, s.x, s.y)
                     if py > 0 or not plot.log_y]
            hidden = [lab for lab, _, py in zip(s.labels, s.x, s.y) if py <= 0 and plot.log_y]
            ax.scatter([p[1] for p in shown], [p[2] for p in shown], s=34, zorder=3,
                       marker=markers[i % len(markers)], color=colours[i % len(colours)],
                       label=f"data={s.data} ({len(s.x)} cases)")
            for k, (label, px, py) in enumerate(sorted(shown, key=lambda p: (p[1], p[2]))):
                # alternate above / below so neighbours at the same rate stay apart
                ax.annotate(label, (px, py), fontsize=7, xytext=(5, 3 if k % 2 == 0 else -9),
                            textcoords="offset points", alpha=0.85)
            if hidden:
                ax.text(0.99, 0.02, f"{plot.y} = 0, not drawn on the log axis: " + ", ".join(hidden),
                        transform=ax.transAxes, ha="right", va="bottom", fontsize=8, alpha=0.8)
            if plot.log_y:
                from matplotlib.ticker import FuncFormatter, LogLocator
                ax.set_yscale("log")
                # label 1, 2, 5 of every decade: a decade alone is too coarse to read values off
                ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_ylabel(_axis_label(result, y) + (" (log)" if plot.log_y else ""), fontsize=9)
            ax.grid(True, which="major", alpha=0.35)
            ax.legend(loc="upper right", fontsize=9)
        axes[-1, 0].set_xlabel(_axis_label(result, x))
        fig.suptitle(plot.title)
        fig.tight_layout()
        save_png(fig, path)
    finally:
        plt.close(fig)
    return PlotPath.of(path, plot)
