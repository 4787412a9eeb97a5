"""Reports made from a stored results file: the Markdown report, README injection, compare.

The stored results are tests/data/results_small.json (the conftest's `small` fixture), a real
run of tests/data/small.yaml; tests/data/README.md says how to remake it and report_small.md.
"""
from __future__ import annotations

import os
import re

import pytest

from kvbench.judge.gate import gate
from kvbench.report.compare import render_compare
from kvbench.report.markdown import render_markdown, write_reports
from kvbench.reportkit.figures import MATPLOTLIB_MISSING
from kvbench.report.readme import inject_section, markers, render_section_table
from kvbench.reportkit.benchmark import BenchmarkReport
from kvbench.reportkit.tables import benchmark_table, fmt_number, fmt_param
from kvbench.results import CaseResult, Metric, RunResult
from tests.plugins.suites import DATA

GOLDEN = DATA / "report_small.md"
FIGURE_LINE = re.compile(r"^!\[rate-distortion.*$", re.M)  # the PNG's link below the proofs table


def _case(result: RunResult, case_id: str):
    return next(c for c in result.cases if c.id == case_id)


def test_markdown_matches_golden(small):
    text = render_markdown(small)
    try:  # as render_markdown tells
        import matplotlib  # noqa: F401
        has_matplotlib = True
    except ImportError:
        has_matplotlib = False
    if os.environ.get("KVBENCH_UPDATE_GOLDEN") == "1":
        assert has_matplotlib, "the golden report links the plot: remake it with matplotlib"
        GOLDEN.write_text(text)
    expected = GOLDEN.read_text()
    assert len(FIGURE_LINE.findall(expected)) == 1
    if not has_matplotlib:  # the report says why there is no plot where the golden links it
        expected = FIGURE_LINE.sub(f"<sub>rate-distortion plot skipped: {MATPLOTLIB_MISSING}</sub>",
                                   expected)
    assert text == expected, "rerun with KVBENCH_UPDATE_GOLDEN=1 and review the diff"


def test_markdown_is_deterministic_and_shows_the_essentials(small):
    text = render_markdown(small)
    assert text == render_markdown(small)
    assert "encode_ms (ms) ↓" in text and "cosine ↑" in text
    assert "error: ValueError: head_dim 64 is not a multiple of block 128 |" in text
    (crashed,) = [c for c in small.cases if c.error is not None]
    assert "Traceback" in crashed.error.traceback
    assert "Traceback" not in text and "hint:" not in text  # only the error's first line
    assert "✅ held" in text and "❌ failed" in text and "⚠ missing" in text
    assert small.machine["torch"] and f"| torch | {small.machine['torch']} |" in text


def test_write_reports_writes_report_md(small_unplotted, tmp_path):
    path = write_reports(small_unplotted, tmp_path / "out")
    assert path == tmp_path / "out" / "report.md"
    assert path.read_text() == render_markdown(small_unplotted)
    assert [p.name for p in path.parent.iterdir()] == ["report.md"]  # no temp file left


def test_markdown_gate_section(small):
    current = small.model_copy(deep=True)
    _case(current, "perplexity/intq-4bit-g32/context=512").metrics["perplexity"].value += 1.0
    _case(current, "proofs/intq-4bit-g32/data=gaussian").metrics["mse"].value = 0.003
    report = gate(current, small)
    text = render_markdown(current, report)
    section = text.split("## Gate against the baseline")[1]
    assert "**regression** (exit 1)" in section
    assert "### Regressions" in section and "| perplexity/intq-4bit-g32/context=512 | perplexity |" in section
    assert "### Improvements" in section and "| mse | 0.006103 | 0.003 | 0.49 |" in section


@pytest.mark.parametrize("value, unit, shown", [
    (1.0, "", "1"), (3.5556, "x", "3.556"), (0.009123456, "", "0.009123"), (1.2e-5, "", "1.200e-05"),
    (123456.7, "", "123,457"), (9999.7, "", "10,000"), (2654208.0, "bytes", "2.531 MiB"), (512.0, "B", "512 B"),
    (float("nan"), "", "nan"),
])
def test_fmt_number(value, unit, shown):
    assert fmt_number(value, unit) == shown


def test_readme_injection_round_trip(small, tmp_path):
    readme = tmp_path / "README.md"
    start, end = markers("perplexity")
    readme.write_text(f"# Title\n\nintro\n\n{start}\nold table\n{end}\n\nafter\n")
    table = render_section_table(small, "perplexity")
    inject_section(readme, "perplexity", table)
    once = readme.read_text()
    assert once == f"# Title\n\nintro\n\n{start}\n{table}\n{end}\n\nafter\n"
    assert "old table" not in once and "## proofs" not in once
    inject_section(readme, "perplexity", table)
    assert readme.read_text() == once  # idempotent


@pytest.mark.parametrize("body", ["no markers here\n", "{start}\n{start}\n{end}\n", "{end}\n{start}\n"])
def test_readme_injection_refuses_bad_markers(tmp_path, body):
    start, end = markers("speed")
    readme = tmp_path / "README.md"
    readme.write_text(body.format(start=start, end=end))
    with pytest.raises(ValueError) as info:
        inject_section(readme, "speed", "table")
    message = str(info.value)
    assert str(readme) in message and "'speed'" in message and start in message and end in message


def test_section_table_for_all_benchmarks_and_unknown_one(small):
    both = render_section_table(small)
    assert "### proofs" in both and "### perplexity" in both
    with pytest.raises(ValueError, match="niah"):
        render_section_table(small, "niah")


def test_compare_marks(small):
    b = small.model_copy(deep=True)
    b.machine = {**b.machine, "key": "linux-x86_64-nvidia-h100", "device": "NVIDIA H100"}
    _case(b, "proofs/intq-4bit-g32/data=gaussian").metrics["mse"].value = 0.004  # better
    _case(b, "proofs/intq-4bit-g32/data=gaussian").metrics["cosine"].value = 0.996  # ~
    fast = _case(small, "perplexity/intq-4bit-g32/context=512").metrics["decode_tok_s"].value
    slow = Metric.from_samples([fast * (0.75 + i / 100) for i in range(5)], "tok/s", "higher")
    _case(b, "perplexity/intq-4bit-g32/context=512").metrics["decode_tok_s"] = slow  # worse
    _case(b, "perplexity/fp16/context=512").comparable["tokens_sha256"] = "other text"  # x
    b.cases = [c for c in b.cases if c.id != "proofs/fp16/data=gaussian"]  # x: missing in B
    text = render_compare(small, b)

    def mark(case_id: str, metric: str) -> str:
        line = next(l for l in text.splitlines() if f"| {case_id} | {metric}" in l)
        return line.split("|")[1].strip()

    assert mark("proofs/intq-4bit-g32/data=gaussian", "mse") == "better"
    assert mark("proofs/intq-4bit-g32/data=gaussian", "cosine") == "~"
    assert mark("proofs/intq-4bit-g32/data=gaussian", "nbytes") == ""
    assert mark("perplexity/intq-4bit-g32/context=512", "decode_tok_s") == "worse"
    assert mark("perplexity/fp16/context=512", "perplexity") == "x"
    assert mark("proofs/fp16/data=gaussian", "cosine") == "x"
    assert f"| machine key | {small.machine['key']} | linux-x86_64-nvidia-h100 |" in text
    assert f"| device | {small.machine['device']} | NVIDIA H100 |" in text
    assert "data.tokens_sha256: " in text and "-> 'other text'" in text


def test_by_method_table_joins_the_headline_metrics_of_each_benchmark(small):
    from kvbench.reportkit.tables import method_table
    from kvbench.report.markdown import benchmark_report

    template = small.cases[0]

    def case(benchmark, label, **values):
        metrics = {name: Metric(value=v, unit="", direction="lower") for name, v in values.items()}
        return template.model_copy(update={"id": f"{benchmark}/{label}", "benchmark": benchmark,
                                           "method_label": label, "metrics": metrics})

    cases = [case("perplexity", "a", ppl_rel_delta=0.5, perplexity=12.0),
             case("perplexity", "b", ppl_rel_delta=0.25),
             case("quality", "a", kl_plain_method=0.125),
             case("quality", "c", kl_plain_method=0.75)]
    # each benchmark's headline metrics, as its report declares them
    headlines = {kind: benchmark_report(kind).headline for kind in ("perplexity", "quality")}
    table = method_table(cases, headlines).splitlines()
    assert table[0] == "| method | perplexity: ppl_rel_delta ↓ | quality: kl_plain_method ↓ |"
    assert table[2:] == ["| a | 0.5 | 0.125 |"]  # only methods in both; headline metrics only
    assert method_table(cases[:2], headlines) is None
    assert "## by method" not in render_markdown(small)


def test_a_table_leaves_unset_settings_out_and_writes_long_ones_below_it():
    """perplexity's server: unset (None) in process, a launch command through llama.cpp."""
    command = {"command": ["{python}", "-m", "kvbench.serve.llama_cpp", "--type_k", "2"],
               "url": "http://127.0.0.1:{port}"}

    def row(label: str, server) -> CaseResult:
        return CaseResult(id=f"perplexity/{label}", benchmark="perplexity",
                          bench_params={"windows": 6, "server": server}, method="identity",
                          method_label=label, method_params={}, status="ok",
                          metrics={"ppl": Metric(value=11.0, direction="lower")})

    table = benchmark_table([row("identity", None), row("q4_0", command), row("q4_0b", command)],
                            BenchmarkReport().row)
    lines = table.splitlines()
    assert "null" not in table and "None" not in table
    assert lines[0] == "<sub>all rows: windows=6 · device=cpu · seed=0</sub>"
    assert "| identity |  | 11 |" in lines and "| q4_0 | [1] | 11 |" in lines
    assert "| q4_0b | [1] | 11 |" in lines
    written = f"- [1] server: `{fmt_param(command)}`"
    assert lines.count(written) == 1 and lines.index(written) > lines.index("| q4_0b | [1] | 11 |")


def test_a_grid_puts_models_in_rows_and_methods_in_columns_and_reasons_below():
    """kvbench report --grid: a refusal's reason written once below, whatever cells it refuses."""
    from kvbench.reportkit.tables import model_grid
    from kvbench.results import CaseError

    def case(model: str, label: str, diff: float | None = None) -> CaseResult:
        refused = diff is None
        return CaseResult(
            id=f"parity/{label}@{model}", benchmark="parity", bench_params={}, method=label,
            method_label=label, method_params={}, model=model,
            status="refused" if refused else "ok",
            error=CaseError(type="LayersUnsupported", message=f"{model}: every layer slides",
                            traceback="") if refused else None,
            metrics={} if refused else {"max_logit_diff": Metric(value=diff, unit="logit",
                                                                 direction="lower")})

    grid = model_grid([case("tiny:llama", "identity", 4e-6), case("tiny:llama", "intq4", 0.94),
                       case("tiny:mistral", "identity", 1e-5), case("tiny:mistral", "intq4"),
                       case("tiny:mistral", "kivi")], "max_logit_diff")
    lines = grid.splitlines()
    assert "| model | identity | intq4 | kivi |" in lines
    assert "| tiny:llama | 4.000e-06 | 0.94 |  |" in lines
    assert "| tiny:mistral | 1.000e-05 | refused [1] | refused [1] |" in lines
    assert lines[-1] == "- [1] every layer slides" and grid.count("every layer slides") == 1


# ------------------------------------------------------------ what --readme puts in its section


def test_a_section_chooses_its_benchmarks_and_columns_in_the_order_given(small):
    from kvbench.report.readme import SectionChoice, render_section

    assert render_section(small) == render_section_table(small)  # the default: as before
    text = render_section(small, SectionChoice(("perplexity", "proofs"),
                                               ("ppl_rel_delta", "cosine", "compression_ratio")))
    assert text.index("### perplexity") < text.index("### proofs")
    perplexity, proofs = text.split("### proofs")
    head = next(line for line in perplexity.splitlines() if line.startswith("| method"))
    assert head == "| method | ppl_rel_delta ↓ | compression_ratio (x) ↑ |"  # it has no cosine
    head = next(line for line in proofs.splitlines() if line.startswith("| method"))
    assert head == "| method | cosine ↑ | compression_ratio (x) ↑ | status |"  # turbo3 crashed
    assert "encode_ms" not in text and "timed metrics" not in text  # their legend goes too


def test_an_unknown_benchmark_or_column_names_the_choices(small):
    from kvbench.report.readme import SectionChoice, render_section

    with pytest.raises(ValueError, match=r"'niah'.*it has: proofs, perplexity"):
        render_section(small, SectionChoice(("niah",)))
    with pytest.raises(ValueError) as info:
        render_section(small, SectionChoice(("proofs",), ("cosine", "cosinus")))
    message = str(info.value)
    assert "'cosinus'" in message and "'cosine'," not in message
    assert "proofs: compression_ratio, bits_per_value, mse, cosine" in message


def test_the_paired_table_and_the_claims_are_report_md_s():
    """--paired takes each benchmark's comparisons against identity from its part of report.md;
    --claims its cases' claims."""
    from kvbench.report.readme import SectionChoice, render_section
    from kvbench.results import load_results
    from tests.plugins.suites import ROOT

    niah = load_results(ROOT / "reports/niah/results.json")
    plain = render_section(niah, SectionChoice(("niah",)))
    text = render_section(niah, SectionChoice(("niah",), paired=True, claims=True))
    report = render_markdown(niah)
    paired = report.split("### NIAH: against identity, on the same samples\n\n")[1]
    table = paired.split("\n\n")[0]
    assert table.startswith("| method | length | pairs |") and table in text
    assert table not in plain and "#### NIAH: against identity" in text  # under ### niah
    claims = [c for case in niah.cases for c in case.claims]
    assert claims and text.endswith(report.split("## Claims\n\n")[1].split("\n\n")[0])
    assert "### Claims" in text and "### Claims" not in plain
    with pytest.raises(ValueError, match="--paired: no comparison against identity in proofs"):
        render_section(load_results(ROOT / "reports/quick/results.json"),
                       SectionChoice(("proofs",), paired=True))


def test_the_line_above_a_table_names_what_the_suite_set_not_each_default():
    """Issue 48: `min_samples=16` above RULER's table where the suite set samples and no
    half_width: bench_params record every default, and the line named them all."""
    from kvbench.report.readme import SectionChoice, render_section, suite_settings
    from kvbench.results import load_results
    from tests.plugins.suites import ROOT

    ruler = load_results(ROOT / "reports/ruler/results.json")
    entries = [e for e in ruler.suite.resolved["benchmarks"] if e["kind"] == "ruler"]
    set_by_suite = {k for e in entries for part in ("params", "matrix") for k in e[part]}
    assert suite_settings(ruler, "ruler") == set_by_suite and "min_samples" not in set_by_suite
    every_line = render_section(ruler, SectionChoice(suite_settings=False)).splitlines()[2]
    assert "min_samples=16" in every_line  # --all-settings: every default, as before
    line = render_section(ruler).splitlines()[2]
    assert line.startswith("<sub>all rows: ")
    shown = {part.split("=")[0] for part in line.removeprefix("<sub>all rows: ").split(" · ")
             if "=" in part}
    assert shown - {"model", "device", "seed"} <= set_by_suite and "samples" in shown
    assert "min_samples" not in line and "the other settings at their defaults" in line


def test_the_command_line_chooses_the_section(tmp_path, small):
    from kvbench.results import save_results
    from tests.plugins.cli_support import invoke

    path = tmp_path / "results.json"
    save_results(path, small)
    readme = tmp_path / "README.md"
    start, end = markers("mine")
    readme.write_text(f"{start}\n{end}\n")
    made = invoke("report", path, "--readme", readme, "--section", "mine", "--benchmark",
                  "perplexity", "--columns", "ppl_rel_delta,kv_bytes", "--claims")
    assert made.exit_code == 0, made.output
    text = readme.read_text()
    assert "### perplexity" in text and "### proofs" not in text and "### Claims" in text
    assert "| method | ppl_rel_delta ↓ | kv_bytes ↓ |" in text
    refused = invoke("report", path, "--columns", "ppl_rel_delta,nope")
    assert refused.exit_code == 2 and "'nope'" in refused.output and "ppl_rel_delta" in refused.output
    refused = invoke("report", path, "--benchmark", "ruler")
    assert refused.exit_code == 2 and "it has: proofs, perplexity" in refused.output
    refused = invoke("report", path, "--grid", "proofs:cosine", "--paired")
    assert refused.exit_code == 2 and "--grid" in refused.output
