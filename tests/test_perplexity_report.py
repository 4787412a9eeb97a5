"""The perplexity report's section over windows: from a real run on a tiny model, made again
from results.json alone, to the byte."""
from __future__ import annotations

from kvbench.reportkit.paired import p_text
from kvbench.reportkit.tables import fmt_number
from kvbench.report.markdown import render_markdown
from kvbench.results import load_results
from kvbench.run.runner import run_suite
from kvbench.suite.loader import load_suite

SUITE = """\
kvbench: 1
name: windows
defaults: {model: "tiny:llama", device: cpu, repeats: 1, seed: 3}
methods:
  - name: identity
  - name: intq
    params: {bits: 2}
benchmarks:
  - kind: perplexity
    params: {context: 24, continuation: 8, calibration: 0}
    matrix: {windows: [4, 1]}
"""


def test_the_section_shows_each_case_over_windows_and_rerenders_from_results_alone(tmp_path):
    (tmp_path / "windows.yaml").write_text(SUITE)
    ran = run_suite(load_suite(tmp_path / "windows.yaml"), tmp_path / "out").result
    assert [c.status for c in ran.cases] == ["ok"] * 4
    result = load_results(tmp_path / "out" / "results.json")
    text = render_markdown(result)
    assert text == render_markdown(load_results(tmp_path / "out" / "results.json"))
    assert text == render_markdown(ran)  # what the run holds, not only what the file says
    section = text[text.index("### perplexity over windows, against identity"):]
    rows = section.split("\n\n")[1].splitlines()[2:]  # the table's, below its header
    # the cases with one window have no interval to show: not in the section
    assert [row.split(" | ")[0] for row in rows] == ["| identity/windows=4", "| intq/windows=4"]
    identity, intq = ({c.method: c for c in result.cases if c.info.get("vs_plain")}[m]
                      for m in ("identity", "intq"))
    assert rows[0].split(" | ")[1:] == [
        "4", _perplexity_cell(identity), _perplexity_cell(identity).split(" [")[0],
        "±0.00% [±0.00%, ±0.00%]", "±0.0000 [±0.0000, ±0.0000]", "not separated", "1.000",
        "0 / 0 of 4 |"]
    paired = intq.info["vs_plain"]
    cells = rows[1].split(" | ")
    assert cells[6:] == [paired["verdict"], p_text(paired["p_value"]),
                         f"{paired['wins']} / {paired['losses']} of 4 |"]
    assert cells[2].count("[") == 1 and cells[4].endswith("%]")


def _perplexity_cell(case) -> str:
    low, high = case.info["perplexity_interval"]
    return (f"{fmt_number(case.metrics['perplexity'].value)} [{fmt_number(low)},"
            f" {fmt_number(high)}]")
