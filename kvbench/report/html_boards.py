"""A benchmark's leaderboard on the results page: a row per ok case of every run, the
columns its report's board declares (a byte ratio's header naming what it is against), each
method's settings that differ from its defaults, the benchmark parameters that differ between
the rows, and the Pareto front of its two axes marked ★. Its metric cells are the benchmark's
row, as report.md's table has them."""
from __future__ import annotations

import json

from kvbench.report.html_parts import esc, row, section, table
from kvbench.report.html_run import Run
from kvbench.reportkit.benchmark import Board
from kvbench.reportkit.figures import as_lower_better, method_family, pareto_front
from kvbench.reportkit.tables import Cell, recorded_by_runner
from kvbench.report.markdown import benchmark_report
from kvbench.report.method_settings import non_default
from kvbench.report.metric_labels import metric_description, metric_label, reference
from kvbench.results import CaseResult

# A benchmark's leaderboard shows the columns of its report's board; one without a board shows
# its first metrics.
_FALLBACK_COLUMNS = 6
# A value longer than this is cut in a table cell (the cell's title and the case hold it all).
_LONG_VALUE = 40


def leaderboard(kind: str, runs: list[Run], anchors: dict) -> str:
    rows = [(run, case) for run in runs for case in run.result.cases
            if case.benchmark == kind and case.status == "ok"]
    if not rows:
        return ""
    report, cases = benchmark_report(kind), [case for _, case in rows]
    board = board_of(kind, cases)
    columns = board_columns(board, cases)
    front = _front(rows, board)
    # the model among the parameters: a board of several models' cases tells them apart by it
    varying = _varying_keys([_with_model(case) for _, case in rows])
    settings = {method: _varying_keys([case.method_params for _, case in rows
                                      if case.method == method])
                for method in {case.method for _, case in rows}}
    many = len(runs) > 1
    head = (["run"] if many else []) + ["family", "method", "settings", "parameters"] + [
        _metric_head(kind, rows, m) for m in columns] + ["front"]
    body = []
    for run, case in rows:
        link = anchors[(run.index, case.id)]
        cells = ([esc(f"#{run.index}")] if many else []) + [
            esc(method_family(case.method)), f"<a href='#{link}'>{esc(case.method_label)}</a>",
            _settings_cell(case, settings[case.method]),
            _params_cell(_with_model(case), varying)]
        cells += [_metric_cell(cell, link) for cell in report.row(case, columns)]
        on = (run.index, case.id) in front
        cells.append("<span class='star' title='on the Pareto front'>★</span>" if on else "")
        body.append(row(cells, family=method_family(case.method), front=on))
    note = _board_note(board) + _ratio_note(kind, columns)
    return section(f"Leaderboard: {kind}", f"<p class='note'>{note}</p>" + table(
        head, body, sortable=True, table_id=f"board-{kind}"), level=2)


def board_columns(board: Board, cases: list[CaseResult]) -> list[str]:
    """The board's metrics that some of the cases have, in its order."""
    return [m for m in (board.compression, board.quality, *board.extra) if m is not None
            and any(m in case.metrics for case in cases)]


def _settings_cell(case: CaseResult, varying: set[str]) -> str:
    """The method's settings that differ from its defaults, and those that differ between the
    cases of the same method here (intq's bits on a board of intq4 and intq8, whatever the
    default); "defaults" when there is none (all of them on hover)."""
    differ = non_default(case.method, case.method_params)
    keys = varying | set(differ or {})
    shown = _params(case.method_params, keys)
    every = esc(", ".join(f"{k}={_value(v)}" for k, v in case.method_params.items()))
    if shown == "-" and differ:  # set to None where the default is not: that says something
        shown = ", ".join(f"{k}={_value(v)}" for k, v in differ.items())
    if shown == "-":
        # nothing to tell it apart: its defaults, or (a method not found here) unknown ones
        shown = "defaults" if differ is not None else "-"
        return f"<td class='params muted' title='{every}'>{esc(shown)}</td>"
    return f"<td class='params' title='{every}'>{esc(shown)}</td>"


def _with_model(case: CaseResult) -> dict:
    return {"model": case.model, **case.bench_params}


def _params_cell(params: dict, keys: set[str]) -> str:
    every = esc(", ".join(f"{k}={_value(v)}" for k, v in params.items() if k in keys))
    return f"<td class='params' title='{every}'>{esc(_params(params, keys))}</td>"


def _ratio_note(kind: str, columns: list[str]) -> str:
    """What the board's byte ratios are against, where a column is one."""
    against = {m: reference(kind, m) for m in columns}
    if not any(against.values()):
        return ""
    return (" <b>Byte ratios</b> (hover a column for its definition): “× vs 16-bit K/V” is "
            "the 16-bit K/V of every token seen over the bytes held, so a float32 model's own "
            "cache (identity) reads 0.5 and keeping half of it about 1, a little under where "
            "tokens added after the compression are kept too; “× vs the model's own cache” is "
            "the bytes held over the plain cache's at the model's dtype (identity 1).")


def board_of(kind: str, cases: list[CaseResult]) -> Board:
    """The board its report declares; else the cases' first metrics."""
    declared = benchmark_report(kind).board
    if declared is not None:
        return declared
    recorded = recorded_by_runner(cases)  # the memory footprint: its own section
    names = [m for m in dict.fromkeys(m for case in cases for m in case.metrics)
             if m not in recorded]
    return Board(None, None, tuple(names[:_FALLBACK_COLUMNS]))


def _front(rows: list[tuple[Run, CaseResult]], board: Board) -> set[tuple[int, str]]:
    """(run, case id) of the cases on the Pareto front of the cases with their model and
    benchmark parameters, across every run shown (one star for one board)."""
    if board.compression is None or board.quality is None:
        return set()
    groups: dict[tuple, list[tuple[tuple[int, str], tuple[float, float]]]] = {}
    for run, case in rows:
        x, y = case.metrics.get(board.compression), case.metrics.get(board.quality)
        if x is None or y is None or not (x.finite() and y.finite()):
            continue
        key = (case.model, json.dumps(case.bench_params, sort_keys=True, default=str))
        point = (as_lower_better(x.value, x.direction), as_lower_better(y.value, y.direction))
        groups.setdefault(key, []).append(((run.index, case.id), point))
    on = set()
    for members in groups.values():
        ranked = pareto_front([point for _, point in members])
        on |= {members[i][0] for i in ranked}
    return on


def _board_note(board: Board) -> str:
    if board.compression and board.quality:
        return (f"★: on the Pareto front of <b>{esc(board.compression)}</b> against "
                f"<b>{esc(board.quality)}</b> among the cases of every run shown with the same "
                "model and benchmark parameters (no other is better on both). Click a column to "
                "sort; a figure opens its case.")
    return "Click a column to sort; a figure opens its case."


def _metric_head(kind: str, rows: list[tuple[Run, CaseResult]], name: str) -> str:
    metric = next(case.metrics[name] for _, case in rows if name in case.metrics)
    label = metric_label(kind, name, metric.unit, metric.direction)
    rest = label[len(name):]
    # the name first (as in results.json), what it is and its direction below it
    # long names may break after an underscore (a <wbr>, not in the header's text)
    breakable = esc(name).replace("_", "_<wbr>")
    return (f"<span title='{esc(metric_description(kind, name))}'>{breakable}"
            f"<span class='unit'>{esc(rest)}</span></span>")


def _metric_cell(cell: Cell, link: str) -> str:
    """A cell of the benchmark's row (as report.md shows it), linked to its case."""
    if cell.value is None:
        return f"<td data-v=''>{esc(cell.text or '-')}</td>"
    return (f"<td class='num' data-v='{cell.value!r}'><a href='#{link}'>{esc(cell.text)}</a>"
            "</td>")


def _varying_keys(params: list[dict]) -> set[str]:
    """The parameters that differ between cases (a board's benchmark parameters, a family's
    method settings): the others say nothing there (every case shows them all)."""
    seen: dict[str, set[str]] = {}
    for values in params:
        for key, value in values.items():
            seen.setdefault(key, set()).add(json.dumps(value, sort_keys=True, default=str))
    return {key for key, values in seen.items() if len(values) > 1}


def _value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _params(params: dict, keys: set[str]) -> str:
    """`k=v, ...` of the params named in keys, a long value cut (the cell's title has it all);
    an unset one (None) left out: it says nothing, as in the Markdown tables."""
    def shown(value) -> str:
        text = _value(value)
        return text if len(text) <= _LONG_VALUE else text[:_LONG_VALUE - 1] + "…"

    return ", ".join(f"{k}={shown(v)}" for k, v in params.items()
                     if k in keys and v is not None) or "-"
