"""The rate-distortion PNG written beside report.md, from a results file alone, and what the
figures share: the Pareto front and one style per method family."""
from __future__ import annotations

import importlib.util
import math

import pytest

from kvbench.benchmarks.reports import proofs
from kvbench.benchmarks.reports.proofs import rate_distortion_data, rate_distortion_png
from kvbench.reportkit.figures import (
    FAMILY_STYLES, PlotUnavailable, family_styles, line_styles, method_family, pareto_front,
)
from kvbench.report.markdown import render_markdown, write_reports
from kvbench.results import Metric, RunResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def with_attn(small) -> RunResult:
    """The stored run (conftest's `small`) with set attention-output errors on its proofs cases,
    plus one more case on outlier data."""
    result = small.model_copy(deep=True)
    errors = {"fp16": 0.0, "intq-4bit-g32": 0.11}
    for case in result.cases:
        if case.benchmark == "proofs" and case.method_label in errors:
            case.metrics["attn_output_error"] = Metric(value=errors[case.method_label],
                                                       direction="lower")
    extra = next(c for c in result.cases if c.id == "proofs/intq-4bit-g32/data=gaussian")
    extra = extra.model_copy(deep=True)
    extra.id, extra.bench_params = "proofs/intq-4bit-g32/data=outliers", {
        **extra.bench_params, "data": "outliers"}
    extra.metrics["attn_output_error"] = Metric(value=1.4, direction="lower")
    result.cases.append(extra)
    return result


def test_png_written_with_one_point_per_proofs_case(with_attn, tmp_path):
    pytest.importorskip("matplotlib")
    path = rate_distortion_png(with_attn, tmp_path / "rd.png")
    assert path == tmp_path / "rd.png"
    assert path.read_bytes()[:8] == PNG_MAGIC
    plot = path.plot
    # fp16 and intq-4bit-g32 on gaussian (the errored case has no metrics), intq on outliers
    assert plot.n_points == 3
    assert [s.data for s in plot.series] == ["gaussian", "outliers"]
    assert plot.series[0].points() == [("identity", "fp16", 16.0, 0.0),
                                       ("intq", "intq-4bit-g32", 5.0, 0.11)]
    # neither beats the other: fewer bits against no error
    assert plot.series[0].front == [("intq-4bit-g32", 5.0, 0.11), ("fp16", 16.0, 0.0)]
    assert plot.log_y  # 0.11 .. 1.4 spans more than 10x
    assert "small" in plot.title
    assert [p.name for p in tmp_path.iterdir()] == ["rd.png"]  # no temp file left


def test_other_axes_and_linear_scale(with_attn):
    plot = rate_distortion_data(with_attn, x="compression_ratio", y="cosine")
    assert plot.n_points == 3 and not plot.log_y  # cosine 0.99..1 spans less than 10x
    assert [x for f in plot.series[0].families for x in f.x] == pytest.approx([1.0, 3.2], abs=1e-4)
    # more compression is better here: the front is read with x reversed
    assert plot.x_direction == "higher"
    assert [label for label, *_ in plot.series[0].front] == ["fp16", "intq-4bit-g32"]


def test_none_without_proofs_cases_with_both_metrics(small_unplotted, with_attn, tmp_path):
    assert rate_distortion_png(small_unplotted, tmp_path / "rd.png") is None  # no attn_output_error
    only_ppl = with_attn.model_copy(deep=True)
    only_ppl.cases = [c for c in only_ppl.cases if c.benchmark != "proofs"]
    assert rate_distortion_png(only_ppl, tmp_path / "rd.png") is None
    assert not (tmp_path / "rd.png").exists()


def test_write_reports_links_the_png_only_when_written(small_unplotted, with_attn, tmp_path):
    pytest.importorskip("matplotlib")
    plain = write_reports(small_unplotted, tmp_path / "plain")
    assert plain.read_text() == render_markdown(small_unplotted)  # nothing to plot: unchanged
    assert "rate_distortion" not in plain.read_text()
    report = write_reports(with_attn, tmp_path / "out")
    text = report.read_text()
    assert "](rate_distortion.png)" in text
    assert text.index("## proofs") < text.index("rate_distortion.png") < text.index("## perplexity")
    assert sorted(p.name for p in report.parent.iterdir()) == ["rate_distortion.png", "report.md"]
    assert (report.parent / "rate_distortion.png").read_bytes()[:8] == PNG_MAGIC
    assert write_reports(with_attn, tmp_path / "out").read_text() == text  # deterministic
    assert render_markdown(with_attn) == text  # what `kvbench report RESULTS` prints


def test_missing_matplotlib_is_a_note_not_a_failure(with_attn, tmp_path, monkeypatch,
                                                    without_matplotlib):
    with pytest.raises(PlotUnavailable):
        proofs.rate_distortion_png(with_attn, tmp_path / "rd.png")
    text = write_reports(with_attn, tmp_path / "out").read_text()
    notes = [line for line in text.splitlines() if "rate-distortion plot skipped" in line]
    assert len(notes) == 1 and "matplotlib" in notes[0]
    assert "](rate_distortion.png)" not in text
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["report.md"]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    assert render_markdown(with_attn) == text  # `kvbench report` says the same


# ---- the Pareto front ---------------------------------------------------------------------------


def test_pareto_front_drops_dominated_points_and_sorts_by_x():
    points = [(4.0, 0.1), (2.0, 0.5), (3.0, 0.6), (8.0, 0.01), (3.0, 0.3), (9.0, 0.01)]
    # (3, 0.6) loses to (3, 0.3) on y alone; (9, 0.01) to (8, 0.01) on x alone
    assert pareto_front(points) == [1, 4, 0, 3]
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 1.0)]) == [0]


def test_pareto_front_keeps_both_of_equal_points():
    # neither of two equal points beats the other: no strict improvement
    assert pareto_front([(2.0, 0.5), (1.0, 0.9), (2.0, 0.5), (2.0, 0.7)]) == [1, 0, 2]


def test_pareto_front_higher_is_better_and_nan_is_never_on_it():
    points = [(2.0, 0.9), (4.0, 0.99), (3.0, 0.8), (1.0, math.nan), (math.nan, 1.0)]
    assert pareto_front(points, "higher") == [0, 1]
    assert pareto_front(points, "lower") == [0, 2]
    with pytest.raises(ValueError, match="'lower' or 'higher'"):
        pareto_front(points, "none")


# ---- families -----------------------------------------------------------------------------------


def test_method_family_folds_presets_and_plugin_classes():
    assert [method_family(m) for m in ("intq", "turbo3", "turbo2.5", "h2o", "am_task",
                                       "my.pkg.codecs:FancyQuant", "fp8")] == [
        "intq", "turbo", "turbo", "h2o", "am_task", "FancyQuant", "fp8"]


def test_family_styles_fixed_for_built_ins_and_distinct_for_plugins():
    assert len(set(FAMILY_STYLES.values())) == len(FAMILY_STYLES)  # no two built-ins alike
    styles = family_styles(["Plug", "intq", "Other", "Plug"])
    assert list(styles) == ["Plug", "intq", "Other"]
    assert styles["intq"] == FAMILY_STYLES["intq"]
    assert styles["Plug"] != styles["Other"]
    lines = line_styles({"intq4": "intq", "intq8": "intq", "kivi2": "kivi"})
    assert lines["intq4"]["color"] == lines["intq8"]["color"] == FAMILY_STYLES["intq"][0]
    assert lines["intq4"]["linestyle"] != lines["intq8"]["linestyle"]  # told apart by dashes


def _proofs_case(template, label: str, method: str, bits: float, error: float, data="gaussian"):
    case = template.model_copy(deep=True)
    case.id, case.method, case.method_label = f"proofs/{label}/data={data}", method, label
    case.bench_params = {**case.bench_params, "data": data}
    case.metrics["bits_per_value"] = Metric(value=bits, unit="bits", direction="lower")
    case.metrics["attn_output_error"] = Metric(value=error, direction="lower")
    return case


def test_points_grouped_by_family_each_in_order_of_bits(with_attn, tmp_path):
    template = next(c for c in with_attn.cases if c.id == "proofs/intq-4bit-g32/data=gaussian")
    run = with_attn.model_copy(deep=True)
    run.cases = [_proofs_case(template, *args) for args in (
        ("turbo4", "turbo4", 4.125, 0.14), ("intq8", "intq", 9.0, 0.007),
        ("turbo2", "turbo2", 2.125, 0.46), ("intq2", "intq", 3.0, 0.6),
        ("turbo3", "turbo3", 3.125, 0.26), ("intq4", "intq", 5.0, 0.11),
        ("plug", "pkg.mod:Plug", 3.0, 0.7))]
    plot = rate_distortion_data(run)
    (series,) = plot.series
    assert [(f.name, f.labels, f.x) for f in series.families] == [
        ("turbo", ["turbo2", "turbo3", "turbo4"], [2.125, 3.125, 4.125]),
        ("intq", ["intq2", "intq4", "intq8"], [3.0, 5.0, 9.0]),
        ("Plug", ["plug"], [3.0])]
    assert [label for label, *_ in series.front] == ["turbo2", "turbo3", "turbo4", "intq4", "intq8"]
    pytest.importorskip("matplotlib")
    first = rate_distortion_png(run, tmp_path / "a.png").read_bytes()
    assert first[:8] == PNG_MAGIC
    assert rate_distortion_png(run, tmp_path / "b.png").read_bytes() == first  # same bytes


def test_family_lines_follow_their_best_points_and_names_never_collide(with_attn, tmp_path,
                                                                       monkeypatch):
    """rate_distortion.png's family lines zigzagged between unrelated variants at one rate, and
    names crowded between 2 and 4.5 bits: now each line steps only down to better points, and
    no two names overlap or leave the axes."""
    pytest.importorskip("matplotlib")
    template = next(c for c in with_attn.cases if c.id == "proofs/intq-4bit-g32/data=gaussian")
    run = with_attn.model_copy(deep=True)
    run.cases = [_proofs_case(template, f"{name}-v{i}", name, bits + 0.01 * i, error)
                 for name, rows in (("intq", [(2.0, 0.6), (2.0, 0.9), (4.0, 0.1), (4.0, 0.4),
                                              (4.5, 0.3), (8.0, 0.01)]),
                                    ("turbo3", [(2.1, 0.5), (3.1, 0.26), (3.2, 0.7),
                                                (4.1, 0.14)]),
                                    ("kivi", [(2.2, 0.45), (2.3, 0.5), (4.2, 0.12)]))
                 for i, (bits, error) in enumerate(rows)]
    figures = []
    monkeypatch.setattr(proofs, "save_png",
                        lambda fig, path: figures.append((fig, fig.canvas.get_renderer())))
    rate_distortion_png(run, tmp_path / "rd.png")
    figure, renderer = figures[0]
    (ax,) = figure.axes
    lines = [line for line in ax.get_lines()  # the families' lines: drawn, no markers
             if line.get_linestyle() == "-" and line.get_marker() in ("None", "", None)]
    assert len(lines) == 3  # one per family
    for line in lines:
        xs, ys = list(line.get_xdata()), list(line.get_ydata())
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
        assert all(b < a for a, b in zip(ys, ys[1:])), ys  # each step a better point
    box = ax.get_window_extent(renderer)
    names = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(names) >= 3  # the front is named where there is room
    for i, a in enumerate(names):
        assert box.x0 <= a.x0 and a.x1 <= box.x1 and box.y0 <= a.y0 and a.y1 <= box.y1
        assert not any(a.overlaps(b) for b in names[i + 1:])
