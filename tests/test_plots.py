"""The rate-distortion PNG written beside report.md, from a results file alone."""
from __future__ import annotations

import importlib.util

import pytest

from kvbench.report import plots
from kvbench.report.markdown import render_markdown, write_reports
from kvbench.report.plots import PlotUnavailable, rate_distortion_data, rate_distortion_png
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
    assert plot.series[0].labels == ["fp16", "intq-4bit-g32"]
    assert plot.series[0].x == [16.0, 5.0] and plot.series[0].y == [0.0, 0.11]
    assert plot.log_y  # 0.11 .. 1.4 spans more than 10x
    assert "small" in plot.title
    assert [p.name for p in tmp_path.iterdir()] == ["rd.png"]  # no temp file left


def test_other_axes_and_linear_scale(with_attn):
    plot = rate_distortion_data(with_attn, x="compression_ratio", y="cosine")
    assert plot.n_points == 3 and not plot.log_y  # cosine 0.99..1 spans less than 10x
    assert plot.series[0].x == pytest.approx([1.0, 3.2], abs=1e-4)


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
        plots.rate_distortion_png(with_attn, tmp_path / "rd.png")
    text = write_reports(with_attn, tmp_path / "out").read_text()
    notes = [line for line in text.splitlines() if "rate-distortion plot skipped" in line]
    assert len(notes) == 1 and "matplotlib" in notes[0]
    assert "](rate_distortion.png)" not in text
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["report.md"]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    assert render_markdown(with_attn) == text  # `kvbench report` says the same
