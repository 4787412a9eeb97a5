"""The ladder's report section and figures, from synthetic results alone."""
from __future__ import annotations

import pytest

from kvbench.benchmarks.reports import ladder
from kvbench.report.markdown import render_markdown, write_reports
from kvbench.results import CaseResult, Metric
from tests.test_report_retrieval import PNG_MAGIC, _row, run

MiB = 1 << 20
GiB = 1 << 30
# (label, length) -> (e2e s, peak, retained KV, cache high-water); weights 0.5 GiB, loaded 1 GiB
FIGURES = {
    ("identity", 8192): (40.0, 2.0 * GiB, 400 * MiB, 400 * MiB),
    ("identity", 16384): (120.0, 3.0 * GiB, 800 * MiB, 800 * MiB),
    # packs as it goes: the peak falls with the bytes
    ("intq4", 8192): (44.0, 1.5 * GiB, 62.5 * MiB, 62.5 * MiB),
    ("intq4", 16384): (130.0, 2.2 * GiB, 125 * MiB, 125 * MiB),
    # holds every token until end_prefill: the bytes fall, the peak does not
    ("streamingllm", 8192): (40.0, 2.0 * GiB, 40 * MiB, 400 * MiB),
    ("streamingllm", 16384): (119.0, 3.0 * GiB, 80 * MiB, 800 * MiB),
}


def _metric(value: float, unit: str = "bytes", direction: str = "lower") -> Metric:
    return Metric(value=value, unit=unit, direction=direction)


def ladder_case(label: str, length: int, trained: int = 8192) -> CaseResult:
    e2e, peak, kept, high = FIGURES[(label, length)]
    return CaseResult(
        id=f"ladder/{label}/length={length}", benchmark="ladder",
        bench_params={"length": length, "prefill_chunk": 1024, "decode": 16, "text": "pydoc",
                      "offset": 0, "calibration": 512},
        method=label.rstrip("0123456789"), method_label=label, method_params={},
        model="bundled:smollm2-135m", status="ok",
        metrics={"e2e_s": _metric(e2e, "s"), "prefill_s": _metric(e2e - 1, "s"),
                 "decode_tok_s": _metric(16.0, "tok/s", "higher"),
                 "peak_bytes": _metric(peak), "peak_over_loaded_bytes": _metric(peak - GiB),
                 "loaded_bytes": _metric(GiB, direction="none"),
                 "weights_bytes": _metric(GiB / 2, direction="none"),
                 "retained_kv_bytes": _metric(kept), "kv_bytes_measured": _metric(kept),
                 "kv_high_water_bytes": _metric(high),
                 "retained_kv": _metric(kept / FIGURES[("identity", length)][2], "")},
        info={"peak_memory": "process resident high-water mark (VmHWM)",
              "beyond_trained_context": length > trained})


@pytest.fixture
def result():
    # streamingllm first: identity's coming first is the section's doing
    order = ["streamingllm", "identity", "intq4"]
    return run([ladder_case(label, n) for label in order for n in (8192, 16384)])


def test_ratios_against_the_same_rung_of_identity(result):
    text = ladder.ladder_section(result)
    table = text[text.index("| peak × ↓"):]
    assert _row(table, "intq4") == ["intq4", "0.75", "0.73"]
    assert _row(table, "streamingllm") == ["streamingllm", "1.00", "1.00"]
    retained = text[text.index("| retained KV × ↓"):]
    assert _row(retained, "streamingllm") == ["streamingllm", "0.10", "0.10"]
    assert _row(retained, "intq4") == ["intq4", "0.16", "0.16"]
    e2e = text[text.index("| e2e × ↓"):]
    assert _row(e2e, "intq4") == ["intq4", "1.10", "1.08"]
    assert "| identity |" not in text[: text.index("### At 16K")]  # 1 by definition


def test_physical_and_logical_are_told_apart_and_explained(result):
    table = ladder.ladder_table(result)
    kind, why = ladder.verdict(table.rungs["intq4"][16384])
    assert kind == "physical"
    # peak saved 0.8 GiB of the 675 MiB the KV saved, the cache never above 0.16x
    assert "peak saves 121% of the 675 MiB the KV saves" in why
    assert "never held more than 0.16×" in why
    kind, why = ladder.verdict(table.rungs["streamingllm"][16384])
    assert kind == "logical"
    assert "held 1.00× the plain bytes before end_prefill" in why
    assert ladder.verdict(table.rungs["identity"][16384])[0] == "reference"


def test_the_rungs_past_the_trained_context_are_named(result):
    text = ladder.ladder_section(result)
    assert "Rungs from 16K are past the model's trained context" in text
    within = run([ladder_case(label, 8192) for label in ("identity", "intq4")])
    assert "past the model's trained context" not in ladder.ladder_section(within)


def test_a_rung_without_identity_has_no_ratio():
    alone = run([ladder_case("intq4", 8192), ladder_case("identity", 16384),
                 ladder_case("intq4", 16384)])
    text = ladder.ladder_section(alone)
    peak = text[text.index("| peak × ↓"):]
    assert _row(peak, "intq4") == ["intq4", "—", "0.73"]


def test_figures_plot_the_ratios_and_the_peak_split(result, tmp_path):
    pytest.importorskip("matplotlib")
    write_reports(result, tmp_path)
    for name in (ladder.RATIOS_PNG, ladder.PEAK_SPLIT_PNG):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    table = ladder.ladder_table(result)
    ratios = ladder.ladder_ratios_png(table, tmp_path / "r.png", "t").plot
    assert ratios["peak_bytes"]["intq4"] == ([8192, 16384], [0.75, pytest.approx(2.2 / 3)])
    split = ladder.ladder_peak_split_png(table, tmp_path / "s.png", "t").plot
    # weights, KV at its largest, the rest of the peak
    assert split["streamingllm"] == (GiB / 2, 800 * MiB, 3 * GiB - GiB / 2 - 800 * MiB)
    assert list(split) == ["identity", "streamingllm", "intq4"]


def test_without_matplotlib_the_report_says_so(result, without_matplotlib):
    text = render_markdown(result)
    assert "ladder plots skipped: matplotlib is not installed" in text


def test_claims_against_another_case_show_a_plain_ratio(result):
    from kvbench.results import ClaimResult

    case = result.cases[-1]
    case.claims = [ClaimResult(claim="peak_bytes / identity <= 0.8", metric="peak_bytes",
                               op="<=", target=0.8, measured=0.733, verdict="held",
                               reference="ladder/identity/length=16384")]
    text = render_markdown(result)
    assert "| ladder/intq4/length=16384 | peak_bytes / identity <= 0.8 | 0.733 | ✅ held" in text


def test_decode_against_both_plain_caches_and_the_bytes_bound():
    """identity (in place) is the reference; identity joined at every step is set beside it; the
    bytes bound is (weights + identity's KV) / (weights + the method's KV)."""
    FIGURES[("identity-concat", 16384)] = FIGURES[("identity", 16384)]
    try:
        cases = [ladder_case(label, 16384) for label in ("identity", "identity-concat", "intq4")]
    finally:
        del FIGURES[("identity-concat", 16384)]
    cases[0].method_params = {"storage": None}  # unset: the buffer
    cases[1].method, cases[1].method_params = "identity", {"storage": "concat"}
    cases[0].metrics["decode_tok_s"] = _metric(10.0, "tok/s", "higher")
    cases[1].metrics["decode_tok_s"] = _metric(8.0, "tok/s", "higher")
    cases[2].metrics["decode_tok_s"] = _metric(20.0, "tok/s", "higher")
    text = ladder.ladder_section(run(cases))
    table = text[text.index("| method | decode tok/s"):]
    bound = (512 + 800) / (512 + 125)
    assert _row(table, "intq4") == ["intq4", "20.00", "2.00", "2.50", f"{bound:.2f}",
                                    f"{2 / bound:.0%}"]
    assert "identity-concat |" not in table  # a plain cache is a reference, not a row
    assert "its cache written in place" in text
