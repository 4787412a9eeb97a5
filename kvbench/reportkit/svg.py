"""Small charts as inline SVG text, for the results page: points and lines on linear or log
axes, each series in its family's colour and marker (kit.figures' styles, the same as in the
PNG figures), an optional Pareto front and reference line. No matplotlib and no script: the
same data give the same bytes, and the page stays one file that opens from disk."""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kvbench.reportkit.figures import family_styles, line_styles

WIDTH, HEIGHT = 330, 215
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 62, 10, 8, 38
MARKER_RADIUS = 4.5
FRONT_COLOUR = "#c77c00"  # the ★ of the leaderboards
# matplotlib's dashes (kit.figures.line_styles) as SVG dash arrays
DASHES = {"-": "", "-.": "6 2 1 2"}


@dataclass
class Series:
    """One line or cloud of points: (x, y, label) each, the label shown on hover (with its
    tip, where `tips` has one) and beside a point of the front."""

    name: str
    family: str
    points: list[tuple[float, float, str]] = field(default_factory=list)
    line: bool = False  # joined in order of x
    tips: dict[str, str] = field(default_factory=dict)  # label -> more said on hover


@dataclass
class Chart:
    x_label: str
    y_label: str
    series: list[Series]
    x_log: bool = False
    y_log: bool = False
    y_base: int = 10  # a log y's ticks: 1, 2, 5 times powers of 10, or powers of 2 (bytes)
    x_ticks: Sequence[float] | None = None  # None: chosen from the range
    x_format: Callable[[float], str] | None = None
    y_format: Callable[[float], str] | None = None
    front: list[tuple[float, float]] = field(default_factory=list)  # joined, in x order
    front_labels: bool = True  # name the front's points beside them
    reference: tuple[float, str] | None = None  # a horizontal dashed line and its name


def short_number(value: float) -> str:
    """Three significant digits at most, no exponent below a million."""
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or abs(value) < 1e-3:
        return f"{value:.2g}"
    text = f"{value:.3g}"
    return text if "e" not in text else f"{value:,.0f}"


def short_bytes(value: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(value) >= size:
            return f"{short_number(value / size)} {unit}"
    return f"{short_number(value)} B"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round numbers (1, 2 or 5 times a power of ten) from low to high, about `count` of them."""
    if not high > low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks, k = [], 0
    while first + k * step <= high + step * 1e-9:
        ticks.append(round(first + k * step, 12))
        k += 1
    return ticks


def log_ticks(low: float, high: float, base: int = 10) -> list[float]:
    """1, 2 and 5 times the powers of ten within [low, high], or the powers alone over a wide
    range; with base 2, powers of 2 (every other one, or sparser, past six); two ticks at
    least."""
    if base == 2:
        powers = [2.0 ** k for k in range(math.floor(math.log2(low)), math.ceil(math.log2(high)) + 1)
                  if low <= 2.0 ** k <= high]
        stride = max(1, math.ceil(len(powers) / 6))
        ticks = powers[len(powers) % stride::stride] if stride > 1 else powers
        return ticks if len(ticks) >= 2 else [low, high]
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    steps = (1,) if len(decades) > 4 else (1, 2, 5)
    ticks = [m * 10.0 ** d for d in decades for m in steps if low <= m * 10.0 ** d <= high]
    return ticks if len(ticks) >= 2 else [low, high]


class _Axis:
    """Data to pixels along one axis, on a linear or log scale, padded by 5% either side."""

    def __init__(self, values: list[float], log: bool, start: float, end: float):
        self.log = log
        scaled = [self._scale(v) for v in values] or [0.0, 1.0]
        low, high = min(scaled), max(scaled)
        if high - low < 1e-12:
            low, high = low - 0.5, high + 0.5
        pad = (high - low) * 0.05
        self.low, self.high = low - pad, high + pad
        self.start, self.end = start, end

    def _scale(self, value: float) -> float:
        return math.log10(value) if self.log else value

    def __call__(self, value: float) -> float:
        share = (self._scale(value) - self.low) / (self.high - self.low)
        return self.start + share * (self.end - self.start)

    def span(self) -> tuple[float, float]:
        if self.log:
            return 10 ** self.low, 10 ** self.high
        return self.low, self.high

    def ticks(self, given: Sequence[float] | None, base: int = 10) -> list[float]:
        low, high = self.span()
        if given is not None:
            return [t for t in given if low <= t <= high]
        return log_ticks(low, high, base) if self.log else nice_ticks(low, high)


def _f(value: float) -> str:
    return f"{value:.1f}"


def _polygon(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{_f(x)},{_f(y)}" for x, y in points)


def marker(code: str, x: float, y: float, colour: str, radius: float = MARKER_RADIUS,
           extra: str = "") -> str:
    """An SVG shape for matplotlib's marker `code` (o s D d ^ v < > P X h p *) centred on x, y."""
    r = radius
    style = f"fill='{colour}' stroke='#fff' stroke-width='0.8'{extra}"

    def regular(sides: int, turn: float, scale: float = 1.0) -> list[tuple[float, float]]:
        return [(x + scale * r * math.sin(turn + 2 * math.pi * k / sides),
                 y - scale * r * math.cos(turn + 2 * math.pi * k / sides)) for k in range(sides)]

    if code == "o":
        return f"<circle cx='{_f(x)}' cy='{_f(y)}' r='{_f(r)}' {style}/>"
    if code == "s":
        return (f"<rect x='{_f(x - r * 0.85)}' y='{_f(y - r * 0.85)}' width='{_f(r * 1.7)}' "
                f"height='{_f(r * 1.7)}' {style}/>")
    shapes = {
        "D": [(x, y - r), (x + r, y), (x, y + r), (x - r, y)],
        "d": [(x, y - r), (x + r * 0.6, y), (x, y + r), (x - r * 0.6, y)],
        "^": regular(3, 0.0, 1.15), "v": regular(3, math.pi, 1.15),
        "<": regular(3, -math.pi / 2, 1.15), ">": regular(3, math.pi / 2, 1.15),
        "h": regular(6, 0.0), "p": regular(5, 0.0, 1.05),
        "*": [p for k in range(10) for p in [(
            x + (r * 1.25 if k % 2 == 0 else r * 0.5) * math.sin(math.pi * k / 5),
            y - (r * 1.25 if k % 2 == 0 else r * 0.5) * math.cos(math.pi * k / 5))]],
    }
    if code in ("P", "X"):  # a filled plus, turned by 45 degrees for X
        w = r * 0.38
        arm = [(-w, -r), (w, -r), (w, -w), (r, -w), (r, w), (w, w), (w, r), (-w, r), (-w, w),
               (-r, w), (-r, -w), (-w, -w)]
        turn = math.pi / 4 if code == "X" else 0.0
        shapes[code] = [(x + a * math.cos(turn) - b * math.sin(turn),
                         y + a * math.sin(turn) + b * math.cos(turn)) for a, b in arm]
    return f"<polygon points='{_polygon(shapes.get(code, regular(4, math.pi / 4)))}' {style}/>"


def legend_key(code: str, colour: str, line=None) -> str:
    """A legend's key in a small SVG, for a legend written in HTML: the marker, on a stretch of
    the series' line (matplotlib's `line` style, kit.figures.line_styles) when it has one."""
    if line is None:
        return (f"<svg class='key' width='12' height='12' viewBox='0 0 12 12' "
                f"aria-hidden='true'>{marker(code, 6, 6, colour, 4.2)}</svg>")
    dash = _dashes(line)
    return (f"<svg class='key' width='26' height='12' viewBox='0 0 26 12' aria-hidden='true'>"
            f"<line x1='1' y1='6' x2='25' y2='6' stroke='{colour}' stroke-width='1.6'"
            + (f" stroke-dasharray='{dash}'" if dash else "") + f"/>"
            f"{marker(code, 13, 6, colour, 4.2)}</svg>")


def _dashes(style) -> str:
    if isinstance(style, tuple):
        return " ".join(f"{v:g}" for v in style[1])
    return DASHES.get(style, "")


def render_svg(chart: Chart, title: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    """The chart as one <svg> element; `title` is its accessible name."""
    drawn = [s for s in chart.series if s.points]
    xs = [x for s in drawn for x, _, _ in s.points] + [x for x, _ in chart.front]
    ys = [y for s in drawn for _, y, _ in s.points] + [y for _, y in chart.front]
    if chart.reference is not None:
        ys.append(chart.reference[0])
    if chart.x_ticks is not None:
        xs += list(chart.x_ticks)
    left, right = MARGIN_LEFT, width - MARGIN_RIGHT
    top, bottom = MARGIN_TOP, height - MARGIN_BOTTOM
    ax, ay = _Axis(xs, chart.x_log, left, right), _Axis(ys, chart.y_log, bottom, top)
    x_format = chart.x_format or short_number
    y_format = chart.y_format or short_number
    out = [f"<svg class='chart' xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} "
           f"{height}' width='{width}' height='{height}' role='img' "
           f"aria-label='{html.escape(title, quote=True)}'>",
           f"<rect x='{left}' y='{top}' width='{right - left}' height='{bottom - top}' "
           "fill='#fff' stroke='#c9d0db'/>"]
    for tick in ax.ticks(chart.x_ticks):
        px = ax(tick)
        out.append(f"<line x1='{_f(px)}' y1='{top}' x2='{_f(px)}' y2='{bottom}' "
                   "stroke='#eef0f4'/>")
        out.append(f"<text x='{_f(px)}' y='{bottom + 14}' text-anchor='middle' "
                   f"class='tick'>{html.escape(x_format(tick))}</text>")
    for tick in ay.ticks(None, chart.y_base):
        py = ay(tick)
        out.append(f"<line x1='{left}' y1='{_f(py)}' x2='{right}' y2='{_f(py)}' "
                   "stroke='#eef0f4'/>")
        out.append(f"<text x='{left - 5}' y='{_f(py + 3.5)}' text-anchor='end' "
                   f"class='tick'>{html.escape(y_format(tick))}</text>")
    out.append(f"<text x='{_f((left + right) / 2)}' y='{height - 6}' text-anchor='middle' "
               f"class='axis'>{html.escape(chart.x_label)}</text>")
    out.append(f"<text transform='translate(11 {_f((top + bottom) / 2)}) rotate(-90)' "
               f"text-anchor='middle' class='axis'>{html.escape(chart.y_label)}</text>")
    if chart.reference is not None:
        value, name = chart.reference
        py = ay(value)
        out.append(f"<line x1='{left}' y1='{_f(py)}' x2='{right}' y2='{_f(py)}' "
                   "stroke='#222' stroke-dasharray='5 3'/>")
        out.append(f"<text x='{right - 4}' y='{_f(py - 4)}' text-anchor='end' "
                   f"class='ref'>{html.escape(name)}</text>")
    if len(chart.front) > 1:
        path = _polygon([(ax(x), ay(y)) for x, y in sorted(chart.front)])
        out.append(f"<polyline points='{path}' fill='none' stroke='{FRONT_COLOUR}' "
                   "stroke-width='2' stroke-opacity='0.6'/>")
    colours = family_styles(s.family for s in drawn)
    dashes = line_styles({s.name: s.family for s in drawn if s.line})
    for series in drawn:
        colour, code = colours[series.family]
        if series.line and len(series.points) > 1:
            dash = _dashes(dashes[series.name]["linestyle"])
            out.append(f"<polyline points='{_polygon([(ax(x), ay(y)) for x, y, _ in sorted(series.points)])}' "
                       f"fill='none' stroke='{colour}' stroke-width='1.6'"
                       + (f" stroke-dasharray='{dash}'" if dash else "") + "/>")
        for x, y, label in series.points:
            more = f" ({series.tips[label]})" if label in series.tips else ""
            tip = f"{label}{more}: {x_format(x)}, {y_format(y)}"
            out.append(f"<g>{marker(code, ax(x), ay(y), colour)}<title>"
                       f"{html.escape(tip)}</title></g>")
    if chart.front_labels:
        on_front = set(chart.front)
        for series in drawn:
            for x, y, label in series.points:
                if (x, y) in on_front:  # named on the side with room for it
                    px, py = ax(x), ay(y)
                    east = px < (left + right) / 2
                    out.append(f"<text x='{_f(px + 7 if east else px - 7)}' y='{_f(py - 6)}' "
                               f"text-anchor='{'start' if east else 'end'}' "
                               f"class='point'>{html.escape(label)}</text>")
    out.append("</svg>")
    return "".join(out)
