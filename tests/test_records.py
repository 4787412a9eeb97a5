"""Every benchmark's typed record (kvbench.benchmarks.records): the runner refuses an info its
record does not declare; every committed case's info is its benchmark's record; a record
round-trips through results.json; and each benchmark's table in report.md and its leaderboard
on the results page show the cells of one row definition (its report's `row`)."""
from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from kvbench.benchmarks.records.base import OpenRecord
from kvbench.benchmarks.specs import BENCHMARKS
from kvbench.benchmarks.specs.base import BUILTIN_BENCHMARKS
from kvbench.report.html_boards import board_columns, board_of, leaderboard
from kvbench.report.html_run import Run
from kvbench.report.markdown import benchmark_report
from kvbench.reportkit.tables import benchmark_table
from kvbench.results import RunResult, load_results, save_results
from kvbench.run.runner import run_suite
from kvbench.suite.loader import load_suite

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "reports").glob("*/results.json"))

SUITE = """\
kvbench: 1
methods:
  - name: tests.plugins.kvb_testplugin:Nop
benchmarks:
  - kind: tests.plugins.kvb_testplugin:Declares
    matrix: {i: [0, 1, 2]}
"""


def test_the_runner_refuses_an_info_its_record_does_not_declare(tmp_path):
    (tmp_path / "s.yaml").write_text(SUITE)
    cases = run_suite(load_suite(tmp_path / "s.yaml"), tmp_path / "out").result.cases
    fits, stray, mistyped = sorted(cases, key=lambda c: c.bench_params["i"])
    assert fits.status == "ok" and fits.info == {"kept": 7}
    assert stray.status == "error" and stray.error.type == "ValidationError"
    assert "stray" in stray.error.message and "Extra inputs" in stray.error.message
    assert mistyped.status == "error" and "kept" in mistyped.error.message


def _committed_cases() -> dict[str, list]:
    cases: dict[str, list] = {}
    for path in COMMITTED:
        for case in load_results(path).cases:
            if case.status == "ok":
                cases.setdefault(case.benchmark, []).append(case)
    return cases


# A benchmark no committed report ran: its cases from a run of the tiny model here.
UNCOMMITTED = {"compaction": """\
kvbench: 1
defaults: {model: "tiny:llama", device: cpu}
methods: [{name: identity}, {name: am_task, params: {ratio: 0.3}}]
benchmarks:
  - kind: compaction
    params: {trajectory: "The tower was finished in the year 1889.", task: "When?",
             chat: false, max_new_tokens: 4}
"""}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, list]:
    found = _committed_cases()
    for kind, suite in UNCOMMITTED.items():
        folder = tmp_path_factory.mktemp(kind)
        (folder / "s.yaml").write_text(suite)
        run = run_suite(load_suite(folder / "s.yaml"), folder / "out").result
        found[kind] = [c for c in run.cases if c.status == "ok"]
    return found


@pytest.mark.parametrize("kind", BUILTIN_BENCHMARKS)
def test_every_builtin_declares_its_record_and_its_cases_hold_to_it(kind, cases):
    record = BENCHMARKS.get(kind).record
    assert record is not OpenRecord, f"{kind} declares no record"
    assert cases.get(kind), f"no case of {kind} to check its record against"
    for case in cases[kind]:
        typed = record.of(case)
        # what Record.of drops is only what an older kvbench wrote and nothing reads now
        record.check(typed.to_info())
        assert set(typed.to_info()) == set(case.info) & set(record.model_fields)


@pytest.mark.parametrize("kind", BUILTIN_BENCHMARKS)
def test_a_record_round_trips_through_results_json(kind, cases, tmp_path):
    record = BENCHMARKS.get(kind).record
    kept = cases[kind]
    written = _run_of([c.model_copy(update={"info": record.of(c).to_info()}) for c in kept])
    save_results(tmp_path / "results.json", written)
    read = load_results(tmp_path / "results.json").cases
    assert [record.of(c) for c in read] == [record.of(c) for c in kept]
    assert [c.info for c in read] == [c.info for c in written.cases]


def _run_of(cases: list) -> RunResult:
    return load_results(COMMITTED[0]).model_copy(update={"cases": cases})


def _html_cells(board: str, link: str) -> list[str]:
    """The texts of the cells of the leaderboard's row of the case anchored at `link`."""
    row = next(r for r in board.split("<tr")[1:] if f"<a href='#{link}'>" in r)
    texts = re.findall(r"<td[^>]*>(.*?)</td>", row)
    return [html.unescape(re.sub(r"<[^>]+>", "", t)) for t in texts]


@pytest.mark.parametrize("kind", BUILTIN_BENCHMARKS)
def test_markdown_and_the_results_page_show_one_row_definition(kind, cases):
    report = benchmark_report(kind)
    cases = list({case.id: case for case in cases[kind]}.values())[:6]  # an id anchors a row
    run = Run(1, "results.json", _run_of(cases), ".", [])
    anchors = {(1, case.id): f"c{n}" for n, case in enumerate(cases)}
    page = leaderboard(kind, [run], anchors)
    on_page = board_columns(board_of(kind, cases), cases)
    metrics = list(dict.fromkeys(m for c in cases for m in c.metrics))
    table = benchmark_table(cases, report.row).splitlines()
    for n, case in enumerate(cases):
        row = [line for line in table if line.startswith(f"| {case.method_label} |")]
        expected = [cell.text for cell in report.row(case, metrics)]
        assert any(line[2:-2].split(" | ")[-len(metrics):] == expected for line in row), \
            (kind, case.id, expected, row)
        # the page's metric cells come after family, method, settings and parameters
        shown = _html_cells(page, f"c{n}")[4:4 + len(on_page)]
        assert shown == [cell.text or "-" for cell in report.row(case, on_page)], (kind, case.id)
