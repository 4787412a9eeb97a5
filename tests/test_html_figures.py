"""The results page's headline figures (kvbench.report.html_figures, drawn by kit.svg): which
group of cases each draws, its points and Pareto front, the ladder's and stress's lines, and the
SVG they become."""
from __future__ import annotations

import math
import re
import statistics

import pytest

from kvbench.benchmarks import BENCHMARKS
from kvbench.report.html import build_site
from kvbench.report.html_figures import TRENDS, pareto_figure, trend_figures
from kvbench.report.html_run import Run
from kvbench.reportkit.svg import Chart, Series, log_ticks, nice_ticks, render_svg
from kvbench.results import load_results
from tests.plugins.suites import ROOT


def _runs(*names: str) -> list[Run]:
    return [Run(i, name, load_results(ROOT / f"reports/{name}/results.json"), name, [])
            for i, name in enumerate(names, start=1)]


def _brute_front(points: dict[str, tuple[float, float]], x_higher: bool, y_higher: bool):
    def better(a, b):  # a at least as good as b on both, and not the same point
        ax, ay = (-a[0] if x_higher else a[0]), (-a[1] if y_higher else a[1])
        bx, by = (-b[0] if x_higher else b[0]), (-b[1] if y_higher else b[1])
        return ax <= bx and ay <= by and (ax, ay) != (bx, by)

    return {name for name, p in points.items() if not any(better(q, p) for q in points.values())}


def test_a_pareto_figure_draws_the_group_with_the_most_cases_and_joins_its_front():
    runs = _runs("quick", "niah")  # quick's niah has 2 cases, niah's run 9
    board = BENCHMARKS.get("niah").report.board
    figure = pareto_figure("niah", board, runs)
    cases = [c for c in runs[1].result.cases if c.benchmark == "niah" and c.status == "ok"]
    points = {c.method_label: (c.metrics["compression_ratio"].value, c.metrics["score"].value)
              for c in cases}
    drawn = {label: (x, y) for s in figure.chart.series for x, y, label in s.points}
    assert drawn == points and "run #2 niah" in figure.caption
    assert "1 other group(s)" in figure.caption
    front = _brute_front(points, x_higher=True, y_higher=True)
    assert set(figure.chart.front) == {points[name] for name in front}
    assert figure.chart.x_log and not figure.chart.y_log  # ratios from 0.5 to 14, a 0-100 score
    assert "compression_ratio × vs 16-bit K/V" in figure.chart.x_label


def test_ruler_s_point_is_a_method_s_mean_over_its_tasks():
    runs = _runs("ruler")
    figure = pareto_figure("ruler", BENCHMARKS.get("ruler").report.board, runs)
    length = int(re.search(r"length=(\d+)", figure.caption).group(1))
    here = [c for c in runs[0].result.cases if c.benchmark == "ruler"
            and c.bench_params["length"] == length]
    for series in figure.chart.series:
        for x, y, label in series.points:
            mine = [c for c in here if c.method_label == label]
            assert len(mine) > 1 and series.tips[label] == f"mean of {len(mine)} tasks"
            assert y == pytest.approx(statistics.fmean(c.metrics["score"].value for c in mine))
            assert x == pytest.approx(statistics.fmean(c.metrics["compression_ratio"].value
                                                       for c in mine))


@pytest.mark.parametrize("kind, run", [("ladder", "ladder"), ("stress", "stress")])
def test_the_ladder_and_stress_draw_a_line_per_method_along_their_parameter(kind, run):
    runs = _runs(run)
    along, _, panels = TRENDS[kind]
    figures = trend_figures(kind, runs)
    assert [f.title for f in figures] == [title for _, title in panels]
    for figure, (metric, _) in zip(figures, panels):
        assert figure.chart.x_ticks == sorted(figure.chart.x_ticks)
        for series in figure.chart.series:
            assert series.line
            for x, y, label in series.points:
                case = next(c for c in runs[0].result.cases if c.benchmark == kind
                            and c.method_label == label and c.bench_params[along] == x
                            and c.metrics.get(metric) and c.metrics[metric].value == y)
                assert case.status == "ok"
    # the group with the most points: no other group of the run has more
    drawn = sum(len(s.points) for s in figures[0].chart.series)
    by_group: dict[str, int] = {}
    for case in runs[0].result.cases:
        if case.benchmark == kind and case.status == "ok" and panels[0][0] in case.metrics:
            rest = {k: v for k, v in case.bench_params.items() if k != along}
            key = repr(sorted(rest.items())) + str(case.model)
            by_group[key] = by_group.get(key, 0) + 1
    assert drawn == max(by_group.values())


def test_ticks_are_round_numbers_and_powers_of_two_for_bytes():
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert log_ticks(0.45, 21) == [0.5, 1, 2, 5, 10, 20]
    ticks = log_ticks(3e6, 2e9, base=2)
    assert all(math.log2(t).is_integer() for t in ticks) and 2 <= len(ticks) <= 6


def test_the_svg_has_a_marker_and_a_tip_per_point_and_the_front_as_a_line():
    chart = Chart("x", "y", [Series("a", "intq", [(1.0, 2.0, "intq4"), (2.0, 1.0, "intq2")]),
                             Series("b", "turbo", [(3.0, 3.0, "turbo3")])],
                  front=[(1.0, 2.0), (3.0, 3.0)])
    svg = render_svg(chart, "a & b")
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "aria-label='a &amp; b'" in svg
    assert re.findall(r"<title>([^<]+)</title>", svg) == ["intq4: 1, 2", "intq2: 2, 1",
                                                         "turbo3: 3, 3"]
    assert svg.count("<polyline") == 1  # the front
    assert render_svg(chart, "a & b") == svg  # the same data, the same bytes


def test_the_page_leads_with_a_figure_per_board_and_the_ladder_and_stress(tmp_path):
    runs = _runs("niah", "ladder", "stress", "quick")
    page = build_site([(r.source, r.result) for r in runs], tmp_path / "site").read_text()
    section = page.split("<section id='headline-figures'>")[1].split("</section>")[0]
    titles = re.findall(r"<figure class='headline'><figcaption><b>([^<]+)</b>", section)
    kinds = {c.benchmark for r in runs for c in r.result.cases}
    boards = {k: BENCHMARKS.get(k).report.board for k in kinds}
    expected = {f"{k}: {b.quality} against {b.compression}" for k, b in boards.items()
                if b and b.compression and b.quality and k not in TRENDS}
    expected |= {title for k in kinds & set(TRENDS) for _, title in TRENDS[k][2]}
    assert set(titles) == expected and len(titles) == section.count("<svg class='chart'")
    # before the paired comparisons and every leaderboard
    assert page.index("id='headline-figures'") < page.index("id='against-identity'") \
        < page.index("id='leaderboard-")
