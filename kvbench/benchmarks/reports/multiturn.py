"""The multiturn benchmark's part of the report, made from results alone: per mode (multi-turn,
multi-request), the score of each turn per method with its 95% interval and the slope over
turns (identity first); each method against identity on the same samples, turn by turn (a pair
is one sample's answer to that turn's question); the bytes each method held after each turn's
answer; each method's output length against identity's; a figure of the score per turn, one
panel per mode; and the leaderboard's columns.

The figure needs matplotlib (the `plots` extra): without it the section says so in one line.
The Markdown is the same with or without an output folder, so `kvbench report` prints what
the run wrote.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.benchmarks.records.multiturn import MultiturnRecord
from kvbench.benchmarks.reports.retrieval import ci
from kvbench.judge.paired import paired_samples
from kvbench.reportkit.benchmark import Board, BenchmarkReport
from kvbench.reportkit.drift import length_drift_section
from kvbench.reportkit.figures import (
    PlotPath, figure_text, line_styles, method_family, panel_row, save_score_panels,
)
from kvbench.reportkit.paired import (
    IDENTITY, IdentityReferences, PairedScope, paired_legend, paired_table, signed,
)
from kvbench.reportkit.tables import fmt_bytes, join_blocks, md_table, ok_cases
from kvbench.results import CaseResult, RunResult

BENCHMARK = "multiturn"
MODES = ("multi-turn", "multi-request")
# Bench params that do not change which samples a case draws: identity's answers pair with a
# method's over every other param equal (mode, turns, length, samples, data_seed, ...).
_UNPAIRED_PARAMS = ("compress", "reads")
SCOPE_HEADER = "mode · turn"  # the paired table's scope column (report.against_identity)
MULTITURN_PNG = "multiturn_score_per_turn.png"
BOARD = Board("compression_ratio", "score",
              ("score_first", "score_last", "turn_slope", "retained_kv"))


@dataclass
class TurnRow:
    """One case in its mode's tables: its per-turn scores and intervals, as it recorded them."""

    name: str  # the method label, and any setting that splits it from another case's
    case: CaseResult
    record: MultiturnRecord  # the case's

    @property
    def is_identity(self) -> bool:
        return self.case.method == IDENTITY

    @property
    def turns(self) -> int:
        return len(self.scores)

    @property
    def scores(self) -> list[float]:
        return self.record.turn_scores

    @property
    def intervals(self) -> list[tuple[float, float]]:
        found = self.record.turn_ci or []
        return list(found) if len(found) == self.turns else [(math.nan, math.nan)] * self.turns


def mode_of(case: CaseResult) -> str:
    return str(case.bench_params.get("mode", MODES[0]))


def _cases(result: RunResult) -> list[CaseResult]:
    return [c for c in ok_cases(result, BENCHMARK) if MultiturnRecord.of(c).turn_scores]


def _extras(cases: list[CaseResult]) -> list[str]:
    """Settings besides the mode that differ between cases of one method label in one mode:
    they go into the row's name."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for case in cases:
        shown = {k: v for k, v in case.bench_params.items() if k != "mode"}
        if case.model:
            shown["model"] = case.model
        groups.setdefault((case.method_label, mode_of(case)), []).append(shown)
    keys = list(dict.fromkeys(k for group in groups.values() for s in group for k in s))
    return [k for k in keys if any(len({repr(s.get(k)) for s in g}) > 1 for g in groups.values())]


def rows_by_mode(result: RunResult) -> dict[str, list[TurnRow]]:
    """Per mode (in the order the run has them), its rows: identity's first."""
    cases = _cases(result)
    extras = _extras(cases)
    by_mode: dict[str, list[TurnRow]] = {}
    for case in cases:
        name = case.method_label
        if extras:
            name += " (" + ", ".join(
                f"{k}={case.model if k == 'model' else case.bench_params.get(k)}"
                for k in extras) + ")"
        by_mode.setdefault(mode_of(case), []).append(
            TurnRow(name, case, MultiturnRecord.of(case)))
    return {mode: [r for r in rows if r.is_identity] + [r for r in rows if not r.is_identity]
            for mode, rows in by_mode.items()}


def _turn_pairs(row: TurnRow,
                reference: CaseResult) -> list[tuple[list[float], list[float]]] | None:
    """Per turn, (the row's scores, identity's) over the samples both answered on the same
    prompts (info is sample-major: entry sample * turns + turn); None when nothing pairs."""
    pair = paired_samples(row.case, reference)
    if pair is None:
        return None
    mine, theirs = pair
    turns = row.turns
    whole = len(mine) // turns * turns  # the samples both answered every turn of
    if not whole:
        return None
    return [(mine[t:whole:turns], theirs[t:whole:turns]) for t in range(turns)]


def _score_table(rows: list[TurnRow]) -> str:
    most = max(row.turns for row in rows)
    header = ["method", *(f"turn {t + 1} [95% CI] ↑" for t in range(most)),
              "slope (points/turn)", "compression ratio (x) ↑"]
    body = []
    for row in rows:
        cells = [row.name]
        for t in range(most):
            if t < row.turns:
                low, high = row.intervals[t]
                cells.append(ci(row.scores[t], low, high))
            else:
                cells.append("—")
        slope = row.case.metrics.get("turn_slope")
        cells.append("—" if slope is None else signed(slope.value))
        ratio = row.case.metrics.get("compression_ratio")
        cells.append("—" if ratio is None else f"{ratio.value:.2f}")
        body.append(cells)
    return md_table(header, body, set(range(1, len(header))))


def _bytes_table(rows: list[TurnRow]) -> str | None:
    found = [(row, row.record.turn_retained_bytes) for row in rows
             if row.record.turn_retained_bytes]
    if not found:
        return None
    most = max(len(held) for _, held in found)
    header = ["method", *(f"after turn {t + 1}" for t in range(most))]
    body = [[row.name, *(fmt_bytes(held[t]) if t < len(held) else "—"
                         for t in range(most))] for row, held in found]
    return md_table(header, body, set(range(1, len(header))))


def _paired_scopes(mode: str, rows: list[TurnRow],
                   references: IdentityReferences) -> list[PairedScope]:
    scopes = []
    for row, pairs in references.scored(rows, _turn_pairs, lambda row: row.case):
        if pairs is None:
            scopes.append(PairedScope(row.name, f"{mode} · every turn",
                                      unpaired=["other samples"]))
        else:
            scopes += [PairedScope(row.name, f"{mode} · {t + 1}", [pair])
                       for t, pair in enumerate(pairs)]
    return scopes


def multiturn_section(result: RunResult) -> str | None:
    """The multiturn summary below its generic table; None when the run has no ok case."""
    by_mode = rows_by_mode(result)
    if not by_mode:
        return None
    references = IdentityReferences(_cases(result), _UNPAIRED_PARAMS)
    parts = []
    for mode, rows in by_mode.items():
        samples = sorted({len(r.record.sample_scores or []) for r in rows})
        parts += [f"### multiturn ({mode}): score per turn [95% CI]", _score_table(rows),
                  f"<sub>{_mode_note(mode)} Score 0-100 (RULER's string_match_all), ↑ higher"
                  f" is better; {' or '.join(map(str, samples))} samples (contexts) per case,"
                  " each turn's interval a 95% Wilson interval over them; slope: least squares"
                  " over the per-turn means.</sub>"]
        scopes = _paired_scopes(mode, rows, references)
        if scopes:
            parts += [f"### multiturn ({mode}): against identity, on the same samples",
                      paired_table(scopes, SCOPE_HEADER),
                      paired_legend("one sample's answer to that turn's question (the same"
                                    " context and question; in multi-turn each method's history"
                                    " holds its own earlier answers)")]
        held = _bytes_table(rows)
        if held:
            parts += [f"<sub>multiturn ({mode}): accounted KV bytes the cache held after each"
                      " turn's answer, the mean over samples.</sub>", held]
    parts.append(length_drift_section(result, BENCHMARK, mode_of,
                                      "one sample's answer to one turn's question",
                                      _UNPAIRED_PARAMS, title="multiturn", scope_header="mode"))
    return join_blocks(parts)


def _mode_note(mode: str) -> str:
    if mode == "multi-request":
        return ("multi-request: each question answered on its own from a copy of the one"
                " compressed context.")
    return ("multi-turn: one conversation through one cache, each question after the method's"
            " own earlier answers.")


# ---------------------------------------------------------------------------------------------
# the figure


@dataclass
class TurnLine:
    name: str
    family: str
    is_identity: bool
    turns: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)


@dataclass
class TurnPlot:
    title: str
    panels: dict[str, list[TurnLine]]  # by mode


def multiturn_plot_data(result: RunResult) -> TurnPlot | None:
    by_mode = rows_by_mode(result)
    if not by_mode:
        return None
    panels = {}
    for mode, rows in by_mode.items():
        lines = []
        for row in rows:
            line = TurnLine(row.name, method_family(row.case.method), row.is_identity,
                            list(range(1, row.turns + 1)), row.scores)
            line.low = [low for low, _ in row.intervals]
            line.high = [high for _, high in row.intervals]
            lines.append(line)
        panels[mode] = lines
    models = {r.case.model for rows in by_mode.values() for r in rows if r.case.model}
    on = f" — {models.pop()}" if len(models) == 1 else ""
    return TurnPlot(f"kvbench {result.suite.name}: score per turn{on}", panels)


def multiturn_plot_png(plot: TurnPlot, path: Path) -> Path:
    """One panel per mode: each method's per-turn mean score with its 95% interval (the lines
    set a little apart along x), identity dashed. Raises PlotUnavailable without matplotlib."""
    with panel_row(len(plot.panels), 5.0, sharey=True) as (fig, axes):
        styles = line_styles({line.name: line.family for lines in plot.panels.values()
                              for line in lines if not line.is_identity})
        for (mode, lines), ax in zip(plot.panels.items(), axes):
            for number, line in enumerate(lines):
                # each line a little apart, so equal scores and their intervals stay readable
                dodge = 0.06 * (number - (len(lines) - 1) / 2)
                yerr = [[max(y - lo, 0) if math.isfinite(lo) else 0
                         for y, lo in zip(line.scores, line.low)],
                        [max(hi - y, 0) if math.isfinite(hi) else 0
                         for y, hi in zip(line.scores, line.high)]]
                style = ({"color": "black", "marker": "o", "linestyle": "--"} if line.is_identity
                         else styles[line.name])
                ax.errorbar([t + dodge for t in line.turns], line.scores, yerr=yerr,
                            markersize=5, capsize=3, linewidth=1.4, elinewidth=0.9,
                            label=line.name,
                            zorder=4 if line.is_identity else 3, **style)
            most = max((max(line.turns) for line in lines), default=1)
            ax.set_xticks(range(1, most + 1))
            ax.set_xlim(0.6, most + 0.4)
            ax.set_title(mode, fontsize=10)
            ax.set_xlabel("turn")
        save_score_panels(fig, axes, "score (0-100) [95% CI]", plot.title, path, margin_in=1.8)
    return PlotPath.of(path, plot)


def multiturn_figure(result: RunResult, out_dir: Path | None) -> str | None:
    return figure_text(
        multiturn_plot_data(result), out_dir,
        lambda plot, folder: multiturn_plot_png(plot, folder / MULTITURN_PNG),
        f"![multiturn: score per turn per method, one panel per mode]({MULTITURN_PNG})",
        "multiturn plot")


REPORT = BenchmarkReport(board=BOARD, parts=lambda result, out_dir: (
    multiturn_section(result), multiturn_figure(result, out_dir)))
