"""The ruler benchmark's part of the report, made from results alone (its numbers are
kvbench.benchmarks.reports.ruler_numbers): a headline table (per method and context length, the
mean score over the tasks it ran with a pooled 95% Wilson interval, and its paired difference
from `identity` over the cells both ran), each method against identity on the same samples (per
length, pooling the tasks; per task and length where a cell has pairs enough to separate), a
per-task table per context length, the haystacks used, and a kvpress-style figure of the mean
score against the compression ratio (kvbench.benchmarks.reports.ruler_plot); and its
leaderboard's columns.

The figure needs matplotlib (the `plots` extra): without it `ruler_plot_png` raises
PlotUnavailable and the section says so in one line. The Markdown is the same with or without
an output folder, so `kvbench report` prints what the run wrote.
"""
from __future__ import annotations

from pathlib import Path

from kvbench.benchmarks.records.ruler import RulerRecord
from kvbench.benchmarks.reports.retrieval import BOARD, ci, ratio_text
from kvbench.benchmarks.reports.ruler_board import board_data, board_figure, board_section
from kvbench.benchmarks.reports.ruler_numbers import (
    BENCHMARK, UNPAIRED_PARAMS, Headline, RulerRow, RulerTable, length_of, row_name, ruler_table,
    samples_of, task_of,
)
from kvbench.benchmarks.reports.ruler_plot import ruler_figure
from kvbench.judge.intervals import wilson_interval
from kvbench.judge.paired import fewest_pairs_to_separate
from kvbench.reportkit.benchmark import BenchmarkReport
from kvbench.reportkit.drift import length_drift_section
from kvbench.reportkit.paired import PairedScope, paired_legend, paired_table, signed
from kvbench.reportkit.tables import finite_metric, join_blocks, length_name, md_table
from kvbench.results import CaseResult, RunResult


def _delta_cell(row: RulerRow, head: Headline) -> str:
    if row.is_identity:
        return "(reference)"
    if head.delta is None:
        return "—"
    text = signed(head.delta)
    if len(head.delta_tasks) < len(head.tasks):
        text += f" ({len(head.delta_tasks)} of {len(head.tasks)} tasks)"
    return text


def _headline_table(table: RulerTable) -> str:
    header = ["method"]
    for length in table.lengths:
        name = length_name(length)
        header += [f"{name}: mean over tasks [95% CI] ↑", f"{name}: Δ vs identity"]
    header.append("compression ratio (x) ↑")
    rows = []
    for row in table.rows:
        cells = [row.name]
        for length in table.lengths:
            head = row.headline.get(length)
            if head is None:
                cells += ["—", "—"]
            else:
                cells += [ci(head.mean, head.low, head.high), _delta_cell(row, head)]
        cells.append(ratio_text(row.ratio))
        rows.append(cells)
    return md_table(header, rows, set(range(1, len(header))))


def _covered_line(table: RulerTable) -> str:
    def coverage(row: RulerRow) -> dict[int, list[str]]:
        return {length: head.tasks for length, head in row.headline.items()}

    def describe(cover: dict[int, list[str]]) -> str:
        task_sets = {tuple(tasks) for tasks in cover.values()}
        if len(task_sets) == 1:
            tasks = next(iter(task_sets))
            at = "every length" if len(cover) > 1 else f"length {length_name(next(iter(cover)))}"
            return f"{len(tasks)} task{'s' if len(tasks) != 1 else ''} ({', '.join(tasks)}) at {at}"
        return "; ".join(f"{length_name(length)}: {', '.join(tasks)}"
                         for length, tasks in sorted(cover.items()))

    covers = [coverage(row) for row in table.rows]
    at_length: dict[int, set[tuple[str, ...]]] = {}  # the task sets run at each length
    for cover in covers:
        for length, tasks in cover.items():
            at_length.setdefault(length, set()).add(tuple(tasks))
    if all(cover == covers[0] for cover in covers):
        covered = f"Each mean is over the same {describe(covers[0])}."
    elif all(len(sets) == 1 for sets in at_length.values()):
        # methods ran different lengths, but the same tasks wherever they ran
        covered = ("Every method that ran a length covers the same tasks there: "
                   + describe({length: list(next(iter(sets)))
                               for length, sets in at_length.items()}) + ".")
    else:
        groups: dict[str, list[str]] = {}  # rows with the same coverage named together
        for row, cover in zip(table.rows, covers):
            groups.setdefault(describe(cover), []).append(row.name)
        covered = "The methods ran different tasks; each mean covers: " + " · ".join(
            f"{', '.join(names)}: {text}" for text, names in groups.items()) + "."
    pooled = ("The interval is a 95% Wilson interval over all the samples the mean pools; "
              "a difference that falls inside the intervals is not a difference.")
    delta = ("Δ vs identity is paired: the mean of per-sample differences from identity's "
             "answers to the same samples, only over the (task, length) cells identity also ran.")
    return f"<sub>{covered} {pooled} {delta}</sub>"


def _against_identity(table: RulerTable) -> list[str]:
    """Each method against identity on the same samples: per length, pooling the tasks (a pair
    is a task's sample); per task and length only where a cell has pairs enough for the sign
    test to separate. [] when nothing was paired or refused as other samples."""
    pooled, cells = [], []
    for row in table.rows:
        if row.is_identity:
            continue
        for length in table.lengths:
            head = row.headline.get(length)
            if head is None or not (head.pairs or head.unpaired_tasks):
                continue
            name = length_name(length)
            pooled.append(PairedScope(row.name, name, [pair for _, pair in head.pairs],
                                      head.unpaired_tasks))
            cells += [PairedScope(row.name, f"{name} · {task}", [pair])
                      for task, pair in head.pairs]
            cells += [PairedScope(row.name, f"{name} · {task}", unpaired=[task])
                      for task in head.unpaired_tasks]
    if not pooled:
        return []
    parts = ["### RULER: against identity, on the same samples",
             paired_table(pooled, "length"),
             paired_legend("one task's sample at that length, over the tasks both ran")]
    fewest = fewest_pairs_to_separate()
    if any(cell.count >= fewest for cell in cells):
        parts.append("<details><summary>Per task and length</summary>\n\n"
                     + paired_table(cells, "length · task") + "\n\n</details>")
    elif cells:
        most = max(cell.count for cell in cells)
        parts.append(f"<sub>Per task and length: at most {most} pair{'s' if most != 1 else ''}"
                     f" a cell, and the sign test separates nothing on fewer than {fewest}: "
                     "pooled over the tasks only.</sub>")
    return parts


def _length_drift(result: RunResult) -> list[str]:
    """Each method's answer lengths against identity's on the same samples, per context length
    (pooling the tasks); [] when nothing pairs."""
    drift = length_drift_section(result, BENCHMARK, lambda case: length_name(length_of(case)),
                                 "one task's sample at that length", UNPAIRED_PARAMS, "RULER",
                                 "length")
    return [drift] if drift else []


def _task_cell(case: CaseResult, with_samples: bool) -> str:
    score = finite_metric(case, "score")
    low, high = finite_metric(case, "score_ci_low"), finite_metric(case, "score_ci_high")
    if (low is None or high is None) and samples_of(case):
        low, high = wilson_interval(score, samples_of(case))
    text = ci(score, low, high)
    return f"{text} (n={samples_of(case)})" if with_samples else text


def _per_task_tables(result: RunResult, table: RulerTable) -> list[str]:
    """One table per context length any ruler case was run at, each under a `#### <length>
    tokens` heading: rows the tasks run at that length (in the run's order), columns the
    methods that ran there (identity first); a cell whose case did not finish shows its status,
    a task the method did not run there "—". Under each table, its samples per cell."""
    every = [c for c in result.cases if c.benchmark == BENCHMARK]
    failed: dict[tuple[str, str, int], str] = {}
    for case in every:
        if case.status != "ok":
            failed.setdefault((row_name(case, table.extras), task_of(case), length_of(case)),
                              case.status)
    names = [row.name for row in table.rows]
    names += [name for name in dict.fromkeys(n for n, _, _ in failed) if name not in names]
    ok = {(row.name, task_of(c), length_of(c)): c for row in table.rows for c in reversed(row.cases)}
    ran = {*ok, *failed}  # (name, task, length) of every cell with a case
    parts = []
    for length in sorted({length_of(c) for c in every}):
        tasks = list(dict.fromkeys(task_of(c) for c in every if length_of(c) == length))
        here = [n for n in names if any((n, t, length) in ran for t in tasks)]
        absent = [n for n in names if n not in here]
        cases = [ok[(n, t, length)] for n in here for t in tasks if (n, t, length) in ok]
        counts = {samples_of(c) for c in cases}
        per_cell = len(counts) > 1
        rows = []
        for task in tasks:
            cells = [task]
            for name in here:
                case = ok.get((name, task, length))
                cells.append(failed.get((name, task, length), "—") if case is None
                             else _task_cell(case, per_cell))
            rows.append(cells)
        header = ["task", *here]
        notes = []
        if per_cell:
            notes.append("samples per cell differ: n in each cell")
        elif counts and counts != {0}:
            count = counts.pop()
            notes.append(f"{count} sample{'s' if count != 1 else ''} per cell")
        if absent:
            notes.append(f"not run at {length_name(length)}: {', '.join(absent)}")
        parts += [f"#### {length_name(length)} tokens",
                  md_table(header, rows, set(range(1, len(header))))]
        if notes:
            parts.append(f"<sub>{'; '.join(notes)}.</sub>")
    return parts


def _haystack_line(table: RulerTable) -> str | None:
    by_haystack: dict[str, list[str]] = {}
    for row in table.rows:
        for case in row.cases:
            haystack = RulerRecord.of(case).haystack
            if haystack:
                tasks = by_haystack.setdefault(haystack, [])
                if task_of(case) not in tasks:
                    tasks.append(task_of(case))
    if not by_haystack:
        return None
    return "<sub>Haystacks: " + " · ".join(
        f"{', '.join(tasks)}: {haystack}" for haystack, tasks in by_haystack.items()) + "</sub>"


def ruler_section(result: RunResult) -> str | None:
    """The ruler summary below its generic table; None when the run has no ok ruler case."""
    table = ruler_table(result)
    if table is None:
        return None
    identity = ("identity's column is the full cache, the reference"
                if any(r.is_identity for r in table.rows)
                else "no identity case: no Δ can be given")
    parts = [
        "### RULER: mean score over tasks, per context length",
        _headline_table(table),
        _covered_line(table),
        *_against_identity(table),
        *_length_drift(result),
        "### RULER: score per task and length [95% CI]",
        f"<sub>{identity}; score 0-100, ↑ higher is better.</sub>",
        *_per_task_tables(result, table),
        _haystack_line(table),
    ]
    return join_blocks(parts)


def ruler_parts(result: RunResult, out_dir: Path | None) -> tuple[str | None, ...]:
    board = board_data(result)  # once, for its tables and its figure
    return (ruler_section(result), ruler_figure(result, out_dir), board_section(board),
            board_figure(board, out_dir))


REPORT = BenchmarkReport(board=BOARD, parts=ruler_parts)
