"""ruler in kvpress's leaderboard form (NVIDIA/kvpress evaluation/leaderboard.sh): per context
length and `compress` setting, each token-reduction method's mean score over the tasks at each
configured compression ratio, kvpress's (the fraction of the prompt removed: 1 - the method's
`ratio`), with the achieved ratio beside it (1 - retained_kv: the share of the plain cache's
bytes not held at the end, question and answer included); and a figure of the score against the
achieved ratio, a line per method, identity as the ceiling. Drawn where a method ran at two
configured ratios or more at one length and setting; made from results alone
(kvbench.benchmarks.reports.ruler_numbers)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvbench.benchmarks.reports.retrieval import ci
from kvbench.benchmarks.reports.ruler_numbers import (
    Headline, RulerRow, length_of, ruler_table,
)
from kvbench.benchmarks.reports.ruler_plot import RULER_SCORE, draw_identity, draw_scores
from kvbench.reportkit.figures import (
    PlotPath, figure_text, line_styles, method_family, panel_row, save_score_panels,
)
from kvbench.reportkit.tables import finite_metric, length_name, md_table
from kvbench.results import RunResult

BOARD_PNG = "ruler_score_vs_achieved_ratio.png"


@dataclass
class BoardPoint:
    label: str
    configured: float  # kvpress's compression_ratio: 1 - the method's ratio
    achieved: float | None  # 1 - retained_kv, the mean over the tasks
    head: Headline


@dataclass
class BoardLine:
    method: str  # registry name, and any setting besides compress that splits its rows
    family: str  # its colour and marker (kit.figures.method_family)
    points: list[BoardPoint] = field(default_factory=list)  # by configured ratio


@dataclass
class BoardPanel:
    length: int
    compress: str
    lines: list[BoardLine]
    identity: Headline | None  # the ceiling


@dataclass
class Board:
    title: str
    panels: list[BoardPanel]

    @property
    def ratios(self) -> list[float]:
        return sorted({p.configured for panel in self.panels for line in panel.lines
                       for p in line.points})


def _configured(row: RulerRow) -> float | None:
    ratio = row.cases[0].method_params.get("ratio")
    return None if not isinstance(ratio, (int, float)) else round(1 - ratio, 6)


def _achieved(row: RulerRow, length: int) -> float | None:
    kept = [finite_metric(c, "retained_kv") for c in row.cases if length_of(c) == length]
    kept = [k for k in kept if k is not None]
    return 1 - sum(kept) / len(kept) if kept else None


def _line_name(row: RulerRow, extras: list[str]) -> str:
    """The method, and any setting besides compress that splits rows (the model, reads, ...):
    each draws a line of its own."""
    case = row.cases[0]
    shown = ", ".join(f"{k}={case.model if k == 'model' else case.bench_params.get(k)}"
                      for k in extras)
    return f"{row.method} ({shown})" if shown else row.method


def board_data(result: RunResult) -> Board | None:
    """The leaderboard's panels; None when no method ran at two configured ratios in one."""
    table = ruler_table(result)
    if table is None:
        return None
    panels: dict[tuple[int, str], BoardPanel] = {}
    for row in table.rows:
        compress = str(row.cases[0].bench_params.get("compress", "context"))
        for length, head in row.headline.items():
            panel = panels.setdefault((length, compress), BoardPanel(length, compress, [], None))
            if row.is_identity:
                panel.identity = panel.identity or head
                continue
            configured = _configured(row)
            if configured is None:
                continue
            name = _line_name(row, [k for k in table.extras if k != "compress"])
            line = next((li for li in panel.lines if li.method == name), None)
            if line is None:
                line = BoardLine(name, method_family(row.method))
                panel.lines.append(line)
            line.points.append(BoardPoint(row.cases[0].method_label, configured,
                                          _achieved(row, length), head))
    kept = []
    for panel in panels.values():
        panel.lines = [line for line in panel.lines
                       if len({p.configured for p in line.points}) >= 2]
        for line in panel.lines:
            line.points.sort(key=lambda p: (p.configured, p.label))
        if panel.lines:
            kept.append(panel)
    if not kept:
        return None
    kept.sort(key=lambda p: (p.length, p.compress))
    return Board(f"kvbench {result.suite.name}: RULER score vs achieved compression ratio",
                 kept)


def _cell(point: BoardPoint, identity: Headline | None) -> str:
    achieved = "—" if point.achieved is None else f"{point.achieved:.2f}"
    text = f"{ci(point.head.mean, point.head.low, point.head.high)} ({achieved})"
    if identity is not None and sorted(point.head.tasks) != sorted(identity.tasks):
        count = len(point.head.tasks)
        text += f" ({count} task{'' if count == 1 else 's'}; identity {len(identity.tasks)})"
    return text


def board_section(board: Board | None) -> str | None:
    """The tables of board_data(result); None without a board."""
    if board is None:
        return None
    ratios = board.ratios
    out = ["### RULER in kvpress's leaderboard form", "",
           "Mean score over the tasks [95% CI] at each configured compression ratio (kvpress's:"
           " the fraction of the prompt removed, 1 − `ratio`), with the achieved ratio in"
           " brackets: 1 − retained_kv, the share of the plain cache's bytes not held at the"
           " end, question and answer included. identity is the ceiling. `context`: the"
           " question is not seen before compression (kvpress's default); `context+question`:"
           " it is (kvpress's query-aware loop)."]
    for panel in board.panels:
        header = ["method", *(f"compression ratio {r:g}" for r in ratios)]
        rows = []
        for line in panel.lines:
            at = {p.configured: p for p in line.points}
            rows.append([line.method, *(_cell(at[r], panel.identity) if r in at else "—"
                                        for r in ratios)])
        ceiling = ""
        if panel.identity is not None:
            head = panel.identity
            ceiling = (f" (identity, the ceiling: {ci(head.mean, head.low, head.high)};"
                       f" {len(head.tasks)} tasks, {head.samples} samples)")
        out += ["", f"#### {length_name(panel.length)}, compress: {panel.compress}{ceiling}", "",
                md_table(header, rows, set(range(1, len(header))))]
    return "\n".join(out)


def board_plot_png(board: Board, path: str | Path) -> Path:
    """Score against achieved ratio, a panel per (length, compress), a line per method, identity
    dashed with its interval shaded. Raises PlotUnavailable without matplotlib."""
    path = Path(path)
    with panel_row(len(board.panels), 5.2, sharex=True, sharey=True) as (fig, axes):
        styles = line_styles({line.method: line.family
                              for panel in board.panels for line in panel.lines})
        for panel, ax in zip(board.panels, axes):
            if panel.identity is not None:
                draw_identity(ax, panel.identity.mean, (panel.identity.low, panel.identity.high),
                              "identity (ceiling)")
            for line in panel.lines:
                points = [p for p in line.points if p.achieved is not None]
                draw_scores(ax, [p.achieved for p in points], [p.head.mean for p in points],
                            [p.head.low for p in points], [p.head.high for p in points],
                            line.method, styles[line.method])
            ax.set_title(f"{length_name(panel.length)}, compress: {panel.compress}",
                         fontsize=10)
            ax.set_xlabel("achieved compression ratio (share of the plain cache removed)")
            ax.set_xlim(-0.02, 1.0)
        save_score_panels(fig, axes, RULER_SCORE, board.title, path)
    return PlotPath.of(path, board)


def board_figure(board: Board | None, out_dir: Path | None) -> str | None:
    """The figure's link (written when out_dir is given), the same text without out_dir."""
    return figure_text(
        board, out_dir,
        lambda board, folder: board_plot_png(board, folder / BOARD_PNG),
        f"![RULER: mean score over tasks vs achieved compression ratio, kvpress's leaderboard"
        f" form]({BOARD_PNG})", "RULER leaderboard plot")
