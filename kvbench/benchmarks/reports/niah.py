"""The niah benchmark's part of the report, made from results alone: a small table (method, mean
score over the grid [CI], compression ratio), each method against identity on the same samples
(per length and over the grid), one depth-by-length heatmap per method, and its leaderboard's
columns.

The heatmaps need matplotlib (the `plots` extra): without it `niah_heatmap_pngs` raises
PlotUnavailable and the section says so in one line. The Markdown is the same with or without
an output folder, so `kvbench report` prints what the run wrote.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from kvbench.benchmarks.records.niah import NiahGrid, NiahRecord
from kvbench.benchmarks.reports.retrieval import BOARD, ci, ratio_text
from kvbench.judge.paired import per_sample, same_samples
from kvbench.reportkit.benchmark import BenchmarkReport
from kvbench.reportkit.figures import PlotPath, figure_text, pyplot, save_png
from kvbench.reportkit.drift import length_drift_section
from kvbench.reportkit.paired import IdentityReferences, PairedScope, paired_legend, paired_table
from kvbench.reportkit.tables import (
    finite_metric, join_blocks, length_name, md_table, ok_cases,
)
from kvbench.results import CaseResult, RunResult

BENCHMARK = "niah"
# Bench params that do not change which samples a case draws: identity's grid pairs with a
# method's over every other param equal.
_UNPAIRED_PARAMS = ("compress", "reads")


@dataclass
class NiahHeatmap:
    """What one heatmap shows: scores[depth row][length column], depths ascending (0 on top)."""

    label: str
    title: str
    lengths: list[int]
    depths: list[float]
    scores: list[list[float]]  # NaN where the grid has no score


def _niah_cases(result: RunResult) -> list[CaseResult]:
    return [c for c in ok_cases(result, BENCHMARK) if NiahRecord.of(c).grid is not None]


def _grid(case: CaseResult) -> NiahGrid:
    """The grid of a case _niah_cases keeps."""
    return NiahRecord.of(case).grid


def niah_file_names(cases: list[CaseResult]) -> list[str]:
    """`niah_<label>.png`, the label made safe for a file name (and a link); repeats numbered."""
    names, seen = [], set()
    for case in cases:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", case.method_label).strip("._-") or "case"
        name, n = f"niah_{stem}.png", 2
        while name in seen:
            name, n = f"niah_{stem}-{n}.png", n + 1
        seen.add(name)
        names.append(name)
    return names


def niah_heatmap_data(case: CaseResult) -> NiahHeatmap:
    grid = _grid(case)
    lengths, depths, scores = grid.lengths, grid.depths, grid.scores

    def cell(d: int, k: int) -> float:
        try:
            value = scores[d][k]
        except IndexError:
            return math.nan
        return math.nan if value is None else value

    rows = sorted(range(len(depths)), key=lambda d: depths[d])
    columns = sorted(range(len(lengths)), key=lambda k: lengths[k])
    ratio = finite_metric(case, "compression_ratio")
    title = case.method_label
    if ratio is not None:
        title += f" — KV compression {ratio:.2f}x vs 16-bit"  # identity can be below 1x
    if case.model:
        title += f"\n({case.model})"  # its own line: a one-length grid is a narrow figure
    return NiahHeatmap(case.method_label, title, [lengths[k] for k in columns],
                       [depths[d] for d in rows], [[cell(d, k) for k in columns] for d in rows])


# perceptually uniform and readable with red-green colour blindness (not red to green)
HEATMAP_COLORS = "cividis"


def niah_heatmap_pngs(result: RunResult, out_dir: str | Path) -> list[Path]:
    """One heatmap PNG per ok niah case with a grid, `niah_<label>.png` in out_dir; each path
    carries its data as `.plot`. [] when there is none; PlotUnavailable without matplotlib."""
    cases = _niah_cases(result)
    if not cases:
        return []
    plt = pyplot()
    out_dir = Path(out_dir)
    written = []
    for case, name in zip(cases, niah_file_names(cases)):
        heat = niah_heatmap_data(case)
        # wide enough for the title at any number of lengths
        fig, ax = plt.subplots(figsize=(max(4.6, 2.5 + 0.9 * len(heat.lengths)),
                                        1.8 + 0.45 * len(heat.depths)), dpi=100)
        try:
            cmap = plt.get_cmap(HEATMAP_COLORS)
            image = ax.imshow(heat.scores, cmap=cmap, vmin=0, vmax=100, aspect="auto",
                              origin="upper", interpolation="nearest")
            for d, row in enumerate(heat.scores):
                for k, value in enumerate(row):
                    if math.isnan(value):  # an empty cell: the axes' white shows through
                        ax.text(k, d, "—", ha="center", va="center", fontsize=8, color="black")
                    else:
                        ax.text(k, d, f"{value:.0f}", ha="center", va="center", fontsize=8,
                                color=_ink_on(cmap(value / 100)))
            ax.set_xticks(range(len(heat.lengths)))
            ax.set_xticklabels([length_name(n) for n in heat.lengths])
            ax.set_yticks(range(len(heat.depths)))
            ax.set_yticklabels([f"{d:g}" for d in heat.depths])
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel("needle depth (%)")
            ax.set_title(heat.title, fontsize=10)
            fig.colorbar(image, ax=ax, label="score (0-100)")
            fig.tight_layout()
            save_png(fig, out_dir / name)
        finally:
            plt.close(fig)
        written.append(PlotPath.of(out_dir / name, heat))
    return written


def _scores_by_length(case: CaseResult) -> dict[int, list[float]] | None:
    """The case's per-sample scores at each length of its grid, in the order drawn (depth, then
    sample); None when it recorded none."""
    grid = _grid(case)
    lengths = grid.lengths
    flat = per_sample(case)
    if flat is None and case.bench_params.get("samples") == 1:
        # recorded before info["scores"]: with one sample a cell, the grid's columns are them
        try:
            flat = [row[k] for k in range(len(lengths)) for row in grid.scores]
        except IndexError:
            return None
        if not all(value is not None and math.isfinite(value) for value in flat):
            return None
    if flat is None or not lengths or len(flat) % len(lengths):
        return None
    size = len(flat) // len(lengths)
    return {length: flat[k * size:(k + 1) * size] for k, length in enumerate(lengths)}


def _shape(scores: dict[int, list[float]]) -> dict[int, int]:
    return {length: len(values) for length, values in scores.items()}


def _against_identity(cases: list[CaseResult]) -> list[str]:
    """Each method against identity on the same samples, per length and over the whole grid (a
    pair is a needle: a depth's sample at a length). [] when no method pairs with identity."""
    scopes = []
    for case, reference in IdentityReferences(cases, _UNPAIRED_PARAMS).pairs(cases):
        paired = same_samples(case, reference)
        mine, theirs = _scores_by_length(case), _scores_by_length(reference)
        if paired and (mine is None or theirs is None or _shape(mine) != _shape(theirs)):
            continue  # no per-sample scores to pair
        lengths = _grid(case).lengths
        per_length = [PairedScope(case.method_label, length_name(n),
                                  [(mine[n], theirs[n])] if paired else [],
                                  [] if paired else [length_name(n)]) for n in lengths]
        scopes += per_length
        if len(per_length) > 1:
            scopes.append(PairedScope(case.method_label, "all lengths",
                                      [pair for scope in per_length for pair in scope.pairs],
                                      [name for scope in per_length for name in scope.unpaired]))
    if not scopes:
        return []
    return ["### NIAH: against identity, on the same samples", paired_table(scopes, "length"),
            paired_legend("one needle (a depth's sample at a length)")]


def _ink_on(rgba: tuple[float, ...]) -> str:
    """White on the map's dark ends (deep red, deep green), black elsewhere."""
    red, green, blue = rgba[:3]
    return "white" if 0.299 * red + 0.587 * green + 0.114 * blue < 0.5 else "black"


def niah_section(result: RunResult, out_dir: str | Path | None = None) -> str | None:
    """A table (method, mean score [CI], compression ratio) and the heatmaps' links (writing them
    when out_dir is given) or a note when matplotlib is missing; the same text either way. None
    when the run has no ok niah case."""
    cases = ok_cases(result, BENCHMARK)
    if not cases:
        return None
    rows = []
    for case in cases:
        score = finite_metric(case, "score")
        rows.append([case.method_label,
                     "—" if score is None else ci(score, finite_metric(case, "score_ci_low"),
                                                  finite_metric(case, "score_ci_high")),
                     ratio_text(finite_metric(case, "compression_ratio"))])
    parts = ["### NIAH: mean score over the depth × length grid",
             md_table(["method", "mean score over the grid [95% CI] ↑", "compression ratio (x) ↑"],
                      rows, {1, 2})]
    notes = []
    grids = {(tuple(grid.lengths), tuple(grid.depths))
             for grid in map(_grid, _niah_cases(result))}
    if len(grids) == 1:
        lengths, depths = grids.pop()
        notes.append(f"grid: lengths {', '.join(map(str, lengths))} tokens × depths "
                     f"{', '.join(f'{d:g}' for d in depths)}%")
    haystacks = list(dict.fromkeys(h for h in (NiahRecord.of(c).haystack for c in cases) if h))
    if haystacks:
        notes.append("haystack: " + "; ".join(haystacks))
    if notes:
        parts.append(f"<sub>{' · '.join(notes)}</sub>")
    plotted = _niah_cases(result)
    parts += _against_identity(plotted)
    parts.append(length_drift_section(result, BENCHMARK, lambda case: "grid",
                                      "one needle (a depth's sample at a length)",
                                      _UNPAIRED_PARAMS, "NIAH"))
    links = "\n".join(
        f"![needle in a haystack: {re.sub(r'[][]', '', case.method_label)}]({name})"
        for case, name in zip(plotted, niah_file_names(plotted)))
    parts.append(figure_text(plotted or None, out_dir,
                             lambda _, folder: niah_heatmap_pngs(result, folder), links,
                             "needle heatmaps"))
    return join_blocks(parts)


REPORT = BenchmarkReport(board=BOARD, parts=lambda result, out_dir: [niah_section(result, out_dir)])
