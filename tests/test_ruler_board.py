"""ruler's report in kvpress's leaderboard form (kvbench.benchmarks.reports.ruler_board): the
configured compression ratio (1 - ratio), the achieved one (1 - retained_kv) beside it, a panel
per compress setting with identity as its ceiling, and the figure's points."""
from __future__ import annotations

import pytest

from kvbench.benchmarks.reports.ruler_board import BOARD_PNG, board_data, board_section
from kvbench.judge.intervals import wilson_interval
from kvbench.report.markdown import write_reports
from kvbench.results import CaseResult, Metric, RunResult, SuiteRecord

TASKS = ("niah_single_1", "vt")


def _case(label: str, method: str, ratio: float | None, compress: str, task: str,
          scores: list[float], retained: float) -> CaseResult:
    mean = sum(scores) / len(scores)
    low, high = wilson_interval(mean, len(scores))
    metric = lambda value, unit="": Metric(value=value, unit=unit, direction="none")  # noqa: E731
    return CaseResult(
        id=f"ruler/{label}/compress={compress},task={task}", benchmark="ruler",
        bench_params={"task": task, "length": 4096, "samples": len(scores), "data_seed": 0,
                      "compress": compress},
        method=method, method_label=label,
        method_params={} if ratio is None else {"ratio": ratio}, model="tiny:llama",
        status="ok",
        metrics={"score": Metric(value=mean, unit="%", direction="higher"),
                 "score_ci_low": metric(low, "%"), "score_ci_high": metric(high, "%"),
                 "retained_kv": metric(retained, "x"),
                 "compression_ratio": metric(2.0 / retained, "x")},
        info={"scores": scores, "metric": "string_match_all"},
        comparable={"prompts_sha256": f"{task}@4096"})


def _run(cases: list[CaseResult]) -> RunResult:
    return RunResult(kvbench_version="0.1.0", git_sha=None, machine={"key": "test"},
                     suite=SuiteRecord(name="leaderboard", path="leaderboard.yaml",
                                       hash="0" * 64, resolved={}),
                     started="2026-01-01T00:00:00+00:00", cases=cases)


def _grid() -> list[CaseResult]:
    cases = []
    for compress in ("context", "context+question"):
        for task in TASKS:
            cases.append(_case("identity", "identity", None, compress, task, [100, 100, 100, 0],
                               1.0))
            # snapkv keeps 0.75 and 0.25 of the prompt: kvpress ratios 0.25 and 0.75; it held
            # a little more than that at the end (question and answer kept whole)
            cases.append(_case("snapkv-cr0.25", "snapkv", 0.75, compress, task,
                               [100, 100, 0, 0], 0.8 if task == "vt" else 0.78))
            cases.append(_case("snapkv-cr0.75", "snapkv", 0.25, compress, task,
                               [100, 0, 0, 0] if compress == "context" else [100, 100, 100, 0],
                               0.3))
            cases.append(_case("intq4", "intq", None, compress, task, [100, 100, 100, 0], 0.25))
    return cases


def _row(text: str, label: str, after: str) -> list[str]:
    lines = text[text.index(after):].splitlines()
    line = next(line for line in lines if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_configured_and_achieved_ratios_and_identity_as_the_ceiling_per_compress_setting():
    result = _run(_grid())
    text = board_section(board_data(result))
    assert text.startswith("### RULER in kvpress's leaderboard form")
    low, high = wilson_interval(75.0, 8)
    ceiling = f"(identity, the ceiling: 75.0 [{low:.1f}–{high:.1f}]; 2 tasks, 8 samples)"
    assert f"#### 4K, compress: context {ceiling}" in text
    assert f"#### 4K, compress: context+question {ceiling}" in text
    header = _row(text, "method", "compress: context ")
    assert header == ["method", "compression ratio 0.25", "compression ratio 0.75"]
    blind = _row(text, "snapkv", "compress: context ")
    # mean over the two tasks' 8 samples; achieved = 1 - the tasks' mean retained_kv
    assert blind[1].startswith("50.0 [") and blind[1].endswith("(0.21)")
    assert blind[2].startswith("25.0 [") and blind[2].endswith("(0.70)")
    aware = _row(text, "snapkv", "compress: context+question")
    assert aware[2].startswith("75.0 [")
    assert "| intq |" not in text  # a codec has no configured ratio: not on this board


def test_the_figure_plots_score_against_achieved_ratio(tmp_path):
    pytest.importorskip("matplotlib")
    result = _run(_grid())
    board = board_data(result)
    assert [(p.length, p.compress) for p in board.panels] == [(4096, "context"),
                                                               (4096, "context+question")]
    (line,) = board.panels[0].lines
    assert line.method == "snapkv"
    assert [p.configured for p in line.points] == [0.25, 0.75]
    assert [round(p.achieved, 2) for p in line.points] == [0.21, 0.7]
    assert [p.head.mean for p in line.points] == [50.0, 25.0]
    out = write_reports(result, tmp_path / "out")
    assert f"]({BOARD_PNG})" in out.read_text()
    png = (out.parent / BOARD_PNG).read_bytes()
    assert png.startswith(b"\x89PNG")
    write_reports(result, tmp_path / "again")
    assert (tmp_path / "again" / BOARD_PNG).read_bytes() == png  # same results, same bytes


def test_a_point_over_other_tasks_than_identitys_says_so():
    cases = [c for c in _grid() if not (c.method_label == "snapkv-cr0.75"
                                        and c.bench_params["task"] == "vt")]
    text = board_section(board_data(_run(cases)))
    assert _row(text, "snapkv", "compress: context ")[2].endswith("(1 task; identity 2)")
    assert "identity" not in _row(text, "snapkv", "compress: context ")[1]


def test_no_board_when_no_method_ran_at_two_ratios():
    cases = [c for c in _grid() if c.method_label != "snapkv-cr0.75"]
    assert board_data(_run(cases)) is None
    assert board_section(board_data(_run(cases))) is None


def test_another_setting_that_splits_rows_draws_its_own_line():
    cases = _grid() + [c.model_copy(update={
        "id": c.id + ",reads=packed", "bench_params": {**c.bench_params, "reads": "packed"}})
        for c in _grid() if c.method == "snapkv"]
    panel = board_data(_run(cases)).panels[0]
    names = [line.method for line in panel.lines]
    assert len(names) == 2 and names[0].startswith("snapkv (") and "reads=packed" in names[1]
    assert all(len(line.points) == 2 for line in panel.lines)
