"""How the footprint grows with the context (kvbench.reportkit.footprint_growth): cases of one
benchmark and method at several contexts side by side, the growth over four times the context,
one method under two settings told apart, and the figure's points equal to the table's."""
from __future__ import annotations

import pytest

from kvbench.reportkit.footprint_growth import growth_lines, growth_png, growth_section
from kvbench.results import CaseResult, Footprint, Metric

MiB = 2**20


def _case(method: str, context: int, grown_mib: float, chunk: int = 256,
          benchmark: str = "perplexity") -> CaseResult:
    axis = "context" if benchmark == "perplexity" else "length"
    start = 500 * MiB
    metrics = {"peak_bytes": Metric(value=start + grown_mib * MiB, unit="B"),
               "held_at_start_bytes": Metric(value=start, unit="B"),
               "plain_cache_bytes": Metric(value=context * 16384, unit="B"),
               "eval_overhead": Metric(value=grown_mib / 1000)}
    return CaseResult(id=f"{benchmark}/{method}/{axis}={context}", benchmark=benchmark,
                      bench_params={axis: context, "prefill_chunk": chunk, "samples": 2},
                      method=method, method_label=method, method_params={}, status="ok",
                      metrics=metrics, footprint=Footprint(probe="rss"), duration_s=10.0)


CASES = [
    *(_case("identity", n, n / 64) for n in (4096, 8192, 16384, 32768)),  # linear
    *(_case("h2o", n, (n / 4096) ** 2) for n in (4096, 8192, 16384, 32768)),  # quadratic
    _case("snapkv", 8192, 100), _case("snapkv", 32768, 300), _case("snapkv", 32768, 50, 512),
    _case("snapkv", 8192, 40, 512), _case("intq", 8192, 30),  # one context: no line
    _case("identity", 4096, 70, benchmark="ruler"), _case("identity", 16384, 200,
                                                          benchmark="ruler"),
]


def test_each_method_at_several_contexts_is_one_line_with_its_growth_over_four_times():
    lines = {(line.benchmark, line.label): line for line in growth_lines(CASES)}
    assert set(lines) == {
        ("perplexity", "identity"), ("perplexity", "h2o"), ("ruler", "identity"),
        ("perplexity", "snapkv (prefill_chunk=256)"), ("perplexity", "snapkv (prefill_chunk=512)")}
    assert lines["perplexity", "identity"].growth() == (32768, pytest.approx(4.0))
    assert lines["perplexity", "h2o"].growth() == (32768, pytest.approx(16.0))
    assert lines["perplexity", "snapkv (prefill_chunk=256)"].growth() == (32768,
                                                                         pytest.approx(3.0))
    assert lines["ruler", "identity"].growth() == (16384, pytest.approx(200 / 70))


def test_the_section_tabulates_what_each_context_added_and_its_seconds_per_sample():
    text = growth_section(CASES, None)
    row = next(line for line in text.splitlines() if line.startswith("| perplexity | h2o"))
    # 4k: 1 MiB added, 10 s over 2 samples; ... x4 context 16.00; overhead at 32k 64/1000
    assert "| 1 MiB · 5 s |" in row and row.endswith("| 16.00 | 0.064 |")
    assert growth_section(CASES[-3:-2], None) == ""  # one context: nothing grows


def test_the_figure_plots_what_the_table_says(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots extra is not installed")
    path = growth_png(growth_lines(CASES), tmp_path / "growth.png")
    assert path.exists()
    x, y = path.plot["perplexity"]["h2o"]
    assert x == [4096, 8192, 16384, 32768] and y == [(n / 4096) ** 2 * MiB for n in x]
