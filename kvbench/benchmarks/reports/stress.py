"""The stress benchmark's part of the report: per method, a table over the concurrency levels
(aggregate and per-user tok/s, their ratio to the single-user pass, p99 TTFT and e2e, errors,
token agreement with the single-user answers, responses flagged as beyond float noise, sessions
held), a warning line for every level with flagged responses or errors, and one figure with
three panels against users: aggregate tok/s, per-user tok/s, p99 TTFT, one line per method;
and its leaderboard's columns.

Made from results alone; the figure needs matplotlib (without it, one line says so).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.report.kit.benchmark import BenchmarkReport, Board
from kvbench.report.kit.figures import PlotPath, figure_text, pyplot, save_png, xy_lines
from kvbench.report.kit.tables import finite_metric, fmt_bytes, md_table, ok_cases
from kvbench.results import CaseResult, RunResult

BENCHMARK = "stress"
THROUGHPUT_PNG = "stress_throughput.png"
# (metric, column, format): the columns of a method's table after `users`
COLUMNS = (
    ("output_tok_s", "output tok/s ↑", "{:.1f}"),
    ("per_user_tok_s", "per-user tok/s ↑", "{:.2f}"),
    ("aggregate_vs_single", "aggregate × single ↑", "{:.2f}"),
    ("ttft_s_p99", "p99 TTFT s ↓", "{:.3f}"),
    ("chunk_gap_s_p99", "p99 chunk gap s ↓", "{:.3f}"),
    ("e2e_s_p99", "p99 e2e s ↓", "{:.2f}"),
    ("errors", "errors ↓", "{:.0f}"),
    ("token_agreement", "token agreement ↑", "{:.3f}"),
    ("responses_differing", "differing", "{:.0f}"),
    ("responses_flagged", "flagged ↓", "{:.0f}"),
    ("sessions_held", "sessions held ↑", "{:g}"),
)
# shown where some level had a long-prompt user
LONG_PROMPT_COLUMNS = (("chunk_gap_s_max", "max chunk gap s ↓", "{:.2f}"),
                       ("long_prompt_ttft_s", "long-prompt TTFT s ↓", "{:.2f}"))
# (metric, panel title, y label) of the figure's panels
PANELS = (
    ("output_tok_s", "aggregate output tok/s", "tok/s (higher is better)"),
    ("per_user_tok_s", "per-user tok/s", "tok/s (higher is better)"),
    ("ttft_s_p99", "p99 time to first token", "s (lower is better)"),
)
_GRID_PARAM = "users"
# Settings the section states once when every line shares them
_SHOWN = ("requests_per_user", "prompts", "prompt_tokens", "max_tokens", "api", "text",
          "tie_margin", "shift_nats")


@dataclass
class StressTable:
    """Each line (a method label, split by any other setting that differs between its cases):
    its cases by users."""

    lines: dict[str, dict[int, CaseResult]] = field(default_factory=dict)

    @property
    def users(self) -> list[int]:
        return sorted({n for cases in self.lines.values() for n in cases})


def _users(case: CaseResult) -> int:
    return int(case.bench_params.get(_GRID_PARAM, 1))


def _setting(case: CaseResult) -> tuple:
    return (case.model, *sorted((k, repr(v)) for k, v in case.bench_params.items()
                                if k != _GRID_PARAM))


def stress_table(result: RunResult) -> StressTable | None:
    cases = ok_cases(result, BENCHMARK)
    if not cases:
        return None
    settings: dict[str, list[tuple]] = {}
    for case in cases:
        seen = settings.setdefault(case.method_label, [])
        if _setting(case) not in seen:
            seen.append(_setting(case))
    table = StressTable()
    for case in cases:
        name = case.method_label
        if len(settings[name]) > 1:  # the same method under two settings: two lines
            name += f" ({_differing(case, cases)})"
        table.lines.setdefault(name, {})[_users(case)] = case
    return table


def _differing(case: CaseResult, cases: list[CaseResult]) -> str:
    """The bench params (and model) that differ between this method label's cases, as set in
    `case`."""
    mine = [c for c in cases if c.method_label == case.method_label]
    keys = sorted({k for c in mine for k in c.bench_params if k != _GRID_PARAM})
    differing = [k for k in keys if len({repr(c.bench_params.get(k)) for c in mine}) > 1]
    parts = [f"{k}={_short(case.bench_params.get(k))}" for k in differing]
    if len({c.model for c in mine}) > 1:
        parts.insert(0, f"model={case.model}")
    return ", ".join(parts) or "?"


def _common(values: list[Any]) -> Any:
    """The value when every one is the same, else None."""
    return values[0] if values and all(v == values[0] for v in values) else None


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("url", str(value))
    return str(value)


def stress_section(result: RunResult) -> str | None:
    table = stress_table(result)
    if table is None:
        return None
    cases = [c for line in table.lines.values() for c in line.values()]
    intro = (
        "Each level: `users` users started together, each sending `requests_per_user` streamed"
        " greedy requests one after another (`prompt_tokens`-token prompts, `max_tokens` output"
        " tokens each). Every response is compared with the single-user answer to its prompt on"
        " the same server: *token agreement* is the mean common prefix over the single-user"
        " answer's length; *differing* responses are not token for token that answer;"
        " *flagged* ones differ beyond float noise: neither a near-tie (that answer's top-2"
        " within `tie_margin` nats) nor the same candidates perturbed (each side's token in the"
        " other's top 5, none moved by more than `shift_nats`), which is what a cache that"
        " leaks between sessions produces. *aggregate × single* is output tok/s over the single-user"
        " pass's on the same server in the same run. TTFT: request sent to the first token;"
        " e2e: to the last."
    )
    common = [f"{k}={_short(c)}" for k in _SHOWN
              if (c := _common([case.bench_params.get(k) for case in cases])) is not None]
    server = _common([case.info.get("server") for case in cases])
    if server:
        common.append(f"server: {server}")
    if common:
        intro += f"\n\n<sub>all lines: {' · '.join(common)}</sub>"
    parts = ["### Concurrent users", intro]
    budgets = {c.bench_params.get("kv_budget") for cases in table.lines.values()
               for c in cases.values()}
    if budgets - {0, None}:
        parts.append("KV budgets (kvbench serve --kv-budget): " + ", ".join(
            "none" if not b else fmt_bytes(b) for b in sorted(b or 0 for b in budgets))
            + "; *sessions held* is the most requests streaming at once, seen by the client.")
    columns = COLUMNS
    if any(finite_metric(case, "long_prompt_ttft_s") is not None for case in cases):
        columns += LONG_PROMPT_COLUMNS
        parts.append("A *long-prompt user* (`long_prompt_tokens`) sends one more request"
                     " `long_prompt_after_s` into the level; its prefill shows in the others'"
                     " chunk gaps (`prefill_chunk`: kvbench serve's tokens per prefill"
                     " forward), in the largest above all: a prefill in one forward stalls"
                     " every stream once, a few gaps among hundreds, under the p99.")
    for name, cases in table.lines.items():
        rows = []
        for users in sorted(cases):
            case = cases[users]
            cells = [str(users)]
            for metric, _, form in columns:
                v = finite_metric(case, metric)
                cells.append("—" if v is None else form.format(v))
            rows.append(cells)
        header = ["users"] + [column for _, column, _ in columns]
        parts.append(f"**{name}**\n\n" + md_table(header, rows,
                                                   right=set(range(len(header)))))
    warnings = _warnings(table)
    if warnings:
        parts.append("\n".join(warnings))
    return "\n\n".join(parts)


def _warnings(table: StressTable) -> list[str]:
    lines = []
    for name, cases in table.lines.items():
        for users in sorted(cases):
            case = cases[users]
            flagged, errors = finite_metric(case, "responses_flagged"), finite_metric(case, "errors")
            if flagged:
                lines.append(f"- ⚠ **{name}** at {users} users: {flagged:.0f} response(s)"
                             " differ from the single-user answer beyond float noise (the"
                             " run's predictions.jsonl keeps each with both texts)")
            if errors:
                reasons = case.info.get("failures") or {}
                why = "; ".join(f"{n}× {r}" for r, n in list(reasons.items())[:3])
                lines.append(f"- **{name}** at {users} users: {errors:.0f} failed request(s)"
                             + (f": {why}" if why else ""))
    return lines


# ---------------------------------------------------------------------------------------------
# the figure


def stress_figures(result: RunResult, out_dir: Path | None) -> str | None:
    """The figure's link (written to out_dir when given), a note without matplotlib, or None
    when no method has two levels or more (nothing to draw a curve of)."""
    table = stress_table(result)
    if table is not None and not any(panel_lines(table, metric) for metric, _, _ in PANELS):
        table = None
    return figure_text(
        table, out_dir,
        lambda table, folder: stress_throughput_png(table, folder / THROUGHPUT_PNG,
                                                    result.suite.name),
        f"![aggregate and per-user tok/s and p99 TTFT against concurrent users]"
        f"({THROUGHPUT_PNG})", "stress plot")


def panel_lines(table: StressTable, metric: str) -> dict[str, tuple[list[int], list[float]]]:
    """Per line of two levels or more (a single level, such as a capacity run, is no curve):
    the levels with a finite `metric`, and its values there."""
    return xy_lines({name: [(n, finite_metric(cases[n], metric)) for n in sorted(cases)]
                     for name, cases in table.lines.items()}, least=2)


def stress_throughput_png(table: StressTable, path: Path, title: str) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), dpi=100)
    try:
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        markers = "osD^v<>P*X"
        plotted = {}
        for ax, (metric, name, ylabel) in zip(axes, PANELS):
            lines = panel_lines(table, metric)
            labels = _short_labels(table, list(lines))
            for k, (line, (x, y)) in enumerate(lines.items()):
                ax.plot(x, y, marker=markers[k % len(markers)], color=colours[k % len(colours)],
                        linewidth=1.4, label=labels[line])
            plotted[metric] = lines
            levels = sorted({n for x, _ in lines.values() for n in x})
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(n) for n in levels])
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("concurrent users")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.35)
        fig.suptitle(f"kvbench {title}: throughput and first-token latency under load")
        handles, labels = axes[0].get_legend_handles_labels()
        rows = -(-len(labels) // 4)  # the legend below the panels, four labels a row
        fig.tight_layout(rect=(0, 0.055 * rows + 0.02, 1, 1))
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)
        save_png(fig, path)
    finally:
        plt.close(fig)
    return PlotPath.of(path, plotted)


def _short_labels(table: StressTable, names: list[str]) -> dict[str, str]:
    """Each plotted line's method label, when that alone tells them apart, else its full name
    (the label and the settings that differ)."""
    labels = {name: next(iter(table.lines[name].values())).method_label for name in names}
    if len(set(labels.values())) == len(names):
        return labels
    return {name: name for name in names}


class StressReport(BenchmarkReport):
    board = Board(None, "errors", ("token_agreement", "sessions_held", "output_tok_s",
                                   "aggregate_vs_single"))

    def sections(self, result: RunResult, out_dir: Path | None = None) -> list[str]:
        return [part for part in (stress_section(result), stress_figures(result, out_dir))
                if part]


REPORT = StressReport()
