"""What every figure of a report shares: one colour and marker per method family, the Pareto
front, deterministic PNG bytes, and what a report says of a figure (its link, or that
matplotlib is missing, or nothing when there is nothing to plot).

matplotlib is optional (the `plots` extra) and imported only when a figure is drawn, with the
Agg backend (no display). Without it `pyplot()` raises `PlotUnavailable`, which `figure_text`
turns into a one-line note.
"""
from __future__ import annotations

import itertools
import math
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, TypeVar

from kvbench.files import replacing

MATPLOTLIB_MISSING = "matplotlib is not installed (pip install 'kvbench[plots]')"

# The built-in families' colour and marker, fixed so that a method looks the same in every
# figure of every report; all pairs differ, as a ruler or ladder figure may hold most of them.
FAMILY_STYLES = {
    "identity": ("#7f7f7f", "o"),
    "intq": ("#1f77b4", "o"),
    "kivi": ("#ff7f0e", "s"),
    "lloydmax": ("#2ca02c", "D"),
    "turbo": ("#d62728", "^"),
    "adaptive": ("#9467bd", "v"),
    "decay": ("#8c564b", "<"),
    "sparse_v": ("#e377c2", ">"),
    "streamingllm": ("#bcbd22", "P"),
    "snapkv": ("#17becf", "X"),
    "h2o": ("#393b79", "h"),
    "am": ("#637939", "*"),
    "am_task": ("#ad494a", "p"),
    "butterfly": ("#7b4173", "d"),
}
# Plugin families, in order of appearance in a figure.
_OTHER_STYLES = [("#843c39", "o"), ("#3182bd", "s"), ("#e6550d", "D"), ("#31a354", "^"),
                 ("#756bb1", "v"), ("#636363", "<"), ("#de9ed6", ">"), ("#8ca252", "P")]
# A family's second, third, ... line in one panel (another setting of the same method).
_LINESTYLES = ("-", (0, (5, 2)), (0, (1, 1.5)), "-.")

T = TypeVar("T")


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed: the figure is skipped, the report says so."""


def method_family(method: str) -> str:
    """The family a case's method (CaseResult.method) is drawn in: its registry name; a preset
    named after a built-in family (FAMILY_STYLES) and its bits (turbo3, turbo2.5) is that
    family's; a `module:Class` method is its class name."""
    if ":" in method:
        return method.rpartition(":")[2]
    preset = re.fullmatch(r"(.*[A-Za-z_])\d+(?:\.\d+)?", method)
    if preset and preset.group(1) in FAMILY_STYLES:
        return preset.group(1)
    return method


def family_styles(families: Iterable[str]) -> dict[str, tuple[str, str]]:
    """(colour, marker) of each family: the built-ins' fixed ones, the others' in turn."""
    styles, others = {}, itertools.cycle(_OTHER_STYLES)
    for family in dict.fromkeys(families):
        styles[family] = FAMILY_STYLES.get(family) or next(others)
    return styles


def line_styles(line_families: dict[str, str]) -> dict[str, dict[str, Any]]:
    """matplotlib keywords (color, marker, linestyle) of each named line from its family's
    style; lines of one family in one figure differ by the line's dashes."""
    colours = family_styles(line_families.values())
    seen: dict[str, int] = {}
    styles = {}
    for line, family in line_families.items():
        k = seen[family] = seen.get(family, -1) + 1
        colour, marker = colours[family]
        styles[line] = {"color": colour, "marker": marker,
                        "linestyle": _LINESTYLES[k % len(_LINESTYLES)]}
    return styles


def as_lower_better(value: float, direction: str) -> float:
    """`value` turned so that lower is better (a higher-is-better metric negated), for
    pareto_front's points."""
    return -value if direction == "higher" else value


def pareto_front(points: list[tuple[float, float]],
                 direction: Literal["lower", "higher"] = "lower") -> list[int]:
    """Indices of the points no other point beats: fewer or as many x and as good a y, one of
    them strictly (x: lower is better; y: `direction` is better). Equal points are all on the
    front; a NaN is never on it and beats nothing. Sorted by x, then by y, best first."""
    if direction not in ("lower", "higher"):
        raise ValueError(f"direction must be 'lower' or 'higher', not {direction!r}")
    sign = 1.0 if direction == "lower" else -1.0
    finite = [(i, x, sign * y) for i, (x, y) in enumerate(points)
              if not (math.isnan(x) or math.isnan(y))]
    front = [(x, y, i) for i, x, y in finite
             if not any(ox <= x and oy <= y and (ox < x or oy < y) for _, ox, oy in finite)]
    return [i for _, _, i in sorted(front)]


class PlotPath(type(Path())):
    """The written PNG's path, carrying the plotted data (`.plot`) so a caller can check it."""

    plot: Any

    @classmethod
    def of(cls, path: str | Path, plot: Any) -> PlotPath:
        out = cls(path)
        out.plot = plot
        return out


def xy_lines(points: dict[str, list[tuple[float, float | None]]],
             least: int = 1) -> dict[str, tuple[list, list]]:
    """Per line, its points with a finite y as (xs, ys); lines with fewer than `least` such
    points left out."""
    lines = {}
    for name, line in points.items():
        kept = [(x, y) for x, y in line if y is not None and math.isfinite(y)]
        if len(kept) >= least:
            lines[name] = ([x for x, _ in kept], [y for _, y in kept])
    return lines


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


def legend_handles(axes: Iterable[Any], rename: Callable[[str], str] = lambda label: label
                   ) -> dict[str, Any]:
    """Each (renamed) label's first handle over the panels, in order: one legend for them all."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(rename(label), handle)
    return handles


def legend_right(fig, handles: dict[str, Any], margin_in: float = 1.6, **kwargs: Any) -> None:
    """The panels laid out clear of `margin_in` inches at the right, the legend there (off the
    points); kwargs go to fig.legend."""
    fig.tight_layout(rect=(0, 0, 1 - margin_in / fig.get_figwidth(), 1))
    fig.legend(handles.values(), handles.keys(), loc="center right", **kwargs)


@contextmanager
def panel_row(count: int, height: float, **share: bool) -> Iterator[tuple[Any, Any]]:
    """(figure, its axes) of `count` panels side by side, 4.8 inches wide each and 2 more for
    the legend, `height` tall (`share`: sharex, sharey); the figure is closed however the
    drawing ends. PlotUnavailable without matplotlib."""
    plt = pyplot()
    fig, axes = plt.subplots(1, count, figsize=(2 + 4.8 * count, height), dpi=100, **share,
                             squeeze=False)
    try:
        yield fig, axes[0]
    finally:
        plt.close(fig)


def save_score_panels(fig, axes, ylabel: str, title: str, path: Path,
                      handles: dict[str, Any] | None = None, margin_in: float = 1.6) -> None:
    """Every panel on the 0-100 score scale with its grid, `ylabel` on the first, `title` above
    them and one legend at their right (`handles`, else each label's first), written to path."""
    for ax in axes:
        ax.set_ylim(-3, 102)  # a score of 0 sits above the axis, not on it
        ax.grid(True, alpha=0.35)
    axes[0].set_ylabel(ylabel)
    fig.suptitle(title)
    legend_right(fig, legend_handles(axes) if handles is None else handles, margin_in,
                 fontsize=8)
    save_png(fig, path)


def save_png(fig, path: Path) -> None:
    """Via a temp file and a rename; no Software/date metadata, so the same results give the
    same bytes."""
    with replacing(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})


def figure_text(data: T | None, out_dir: str | Path | None, draw: Callable[[T, Path], Any],
                links: str, what: str) -> str | None:
    """What a report section says of its figures, the same text with or without out_dir (so
    `kvbench report` prints what the run wrote): None when there is nothing to plot (`data` is
    None); else `links` (the figures' Markdown links), once draw(data, out_dir) has written
    them when out_dir is given; or, without matplotlib, one line saying `what` was skipped."""
    if data is None:
        return None
    try:
        if out_dir is None:
            check_matplotlib()
        else:
            draw(data, Path(out_dir))
    except PlotUnavailable:
        return f"<sub>{what} skipped: {MATPLOTLIB_MISSING}</sub>"
    return links
