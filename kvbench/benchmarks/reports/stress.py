"""The stress benchmark's part of the report: per method, a table over the concurrency levels
(aggregate and per-user tok/s, their ratio to the single-user pass, p99 TTFT and e2e, errors,
token agreement with the single-user answers, responses flagged as beyond float noise, sessions
held), a warning line for every level with flagged responses or errors, and one figure with
three panels against users: aggregate tok/s, per-user tok/s, p99 TTFT, one line per method;
and its leaderboard's columns.

Where cases sent task samples (`task`): per method, a table over the levels of the score under
load with its interval, the score alone, their paired comparison, goodput, SLO attainment and
the share answered correctly, and a figure of goodput against users; the answers' lengths
against identity's on the same prompts (kvbench.reportkit.drift). Under a KV budget: the
capacity table (sessions held, throughput and, with task samples, accuracy at the same memory).
With a shared prefix: its table (kvbench.benchmarks.reports.stress_prefix). The lines:
kvbench.benchmarks.reports.stress_table; the figures: kvbench.benchmarks.reports.stress_figures.

Made from results alone; the figures need matplotlib (without it, one line says so).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench.benchmarks.records.stress import StressRecord
from kvbench.judge.paired import SEPARATION_LEVEL
from kvbench.reportkit.benchmark import BenchmarkReport, Board
from kvbench.reportkit.drift import length_drift_section
from kvbench.reportkit.paired import p_text, signed
from kvbench.benchmarks.reports.stress_figures import goodput_figure, stress_figures
from kvbench.benchmarks.reports.stress_prefix import prefix_section
from kvbench.benchmarks.reports.stress_table import (
    BENCHMARK, StressTable, short, stress_table, task_lines, task_of,
)
from kvbench.reportkit.tables import finite_metric, fmt_bytes, md_table, ok_cases, pair_key
from kvbench.results import CaseResult, RunResult

# Parameters that do not change a case's prompts nor its single-user answers (one request at a
# time): its output lengths pair with identity's across them
UNPAIRED = ("users", "requests_per_user", "kv_budget", "slo_ttft_s", "slo_tpot_s",
            "request_timeout_s", "level_timeout_s", "tie_margin", "shift_nats",
            "long_prompt_tokens", "long_prompt_after_s", "prefill_chunk", "prefix_cache")
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
# Settings the section states once when every line shares them
_SHOWN = ("requests_per_user", "prompts", "prompt_tokens", "max_tokens", "api", "text",
          "tie_margin", "shift_nats")
# ... and these when every case sent task samples (prompt_tokens and max_tokens then mean nothing)
_SHOWN_TASK = ("requests_per_user", "prompts", "task", "task_length", "data_seed", "api",
               "tie_margin", "shift_nats")


def _common(values: list[Any]) -> Any:
    """The value when every one is the same, else None."""
    return values[0] if values and all(v == values[0] for v in values) else None


def stress_section(result: RunResult) -> str | None:
    table = stress_table(result)
    if table is None:
        return None
    cases = [c for line in table.lines.values() for c in line.values()]
    prompts = ("RULER task samples, each up to its task's tokens_to_generate or end-of-sequence:"
               " see the accuracy table" if all(task_of(case) for case in cases) else
               "`prompt_tokens`-token prompts, `max_tokens` output tokens each")
    intro = (
        "Each level: `users` users started together, each sending `requests_per_user` streamed"
        f" greedy requests one after another ({prompts}). Every response is compared with the single-user answer to its prompt on"
        " the same server: *token agreement* is the mean common prefix over the single-user"
        " answer's length; *differing* responses are not token for token that answer;"
        " *flagged* ones differ beyond float noise: neither a near-tie (that answer's top-2"
        " within `tie_margin` nats) nor the same candidates perturbed (each side's token in the"
        " other's top 5, none moved by more than `shift_nats`), which is what a cache that"
        " leaks between sessions produces. *aggregate × single* is output tok/s over the single-user"
        " pass's on the same server in the same run. TTFT: request sent to the first token;"
        " e2e: to the last."
    )
    shown = _SHOWN_TASK if all(task_of(case) for case in cases) else _SHOWN
    common = [f"{k}={short(c)}" for k in shown
              if (c := _common([case.bench_params.get(k) for case in cases])) is not None]
    server = _common([StressRecord.of(case).server for case in cases])
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


# ---- task samples: accuracy under load, goodput


def _score_cell(case: CaseResult) -> str:
    score = finite_metric(case, "score")
    if score is None:
        return "—"
    low, high = finite_metric(case, "score_ci_low"), finite_metric(case, "score_ci_high")
    return f"{score:.1f}" + ("" if low is None or high is None else f" [{low:.1f}, {high:.1f}]")


def _paired_cells(case: CaseResult) -> list[str]:
    """Δ under load − alone [paired CI], and the sign test's verdict with its p."""
    paired = StressRecord.of(case).paired
    if paired is None:
        return ["—", "—"]
    delta = f"{signed(paired.mean_difference)} [{signed(paired.low)}, {signed(paired.high)}]"
    return [delta, f"{paired.verdict} (p {p_text(paired.p_value)})"]


def _cell(case: CaseResult, metric: str, form: str) -> str:
    value = finite_metric(case, metric)
    return "—" if value is None else form.format(value)


def _slo_text(cases: list[CaseResult]) -> str:
    parts = []
    for key, what in (("slo_ttft_s", "TTFT"), ("slo_tpot_s", "TPOT")):
        values = {case.bench_params.get(key) for case in cases}
        if len(values) > 1:
            parts.append(f"{what}: per case (`{key}`)")
            continue
        value = values.pop()
        parts.append(f"{what} ≤ {value:g} s" if value else f"no {what} SLO")
    return ", ".join(parts)


def accuracy_section(table: StressTable) -> str | None:
    lines = task_lines(table)
    if not lines:
        return None
    cases = [case for line in lines.values() for case in line.values()]
    tasks = sorted({task_of(case) for case in cases})
    intro = (
        f"The prompts are RULER samples ({', '.join(f'`{t}`' for t in tasks)}, made by the"
        " ruler benchmark's generators to `task_length` tokens, framed by the model's chat"
        " template), each answered up to its task's tokens_to_generate or end-of-sequence, and"
        " scored as RULER scores it. *Score under load*: the mean over the level's successful"
        " responses [95% Wilson interval]; *alone*: the single-user answers (one request at a"
        " time, the same server) to the same prompts, one per response. *Δ* is each response's"
        " score under load less the single-user answer's to its prompt, with a paired bootstrap"
        " interval; the verdict is the exact sign test's over the responses whose score moved"
        f" (worse / better when p < {SEPARATION_LEVEL:g}, else not separated). *Goodput*:"
        " requests that met both SLOs and were answered correctly (score 100: every reference"
        " found, under string_match_all) per second of the level's wall time; *SLO attainment*"
        " and *correct*: shares of the level's planned requests (a failed request is neither)."
        f" SLOs: {_slo_text(cases)}."
    )
    parts = ["### Accuracy under load and goodput", intro]
    header = ["users", "score under load [95% CI]", "score alone", "Δ load − alone [95% CI]",
              "verdict (sign test)", "goodput req/s ↑", "req/s", "SLO attainment ↑",
              "correct ↑", "tokens under load / alone", "errors ↓"]
    for name, line in lines.items():
        rows = []
        for users in sorted(line):
            case = line[users]
            tokens = "—"
            if finite_metric(case, "answer_tokens") is not None:
                tokens = (f"{_cell(case, 'answer_tokens', '{:.1f}')} /"
                          f" {_cell(case, 'answer_tokens_alone', '{:.1f}')}")
            rows.append([str(users), _score_cell(case), _cell(case, "score_alone", "{:.1f}"),
                         *_paired_cells(case), _cell(case, "goodput_rps", "{:.3f}"),
                         _cell(case, "request_throughput", "{:.3f}"),
                         _cell(case, "slo_attainment", "{:.2f}"),
                         _cell(case, "correct_share", "{:.2f}"), tokens,
                         _cell(case, "errors", "{:.0f}")])
        parts.append(f"**{name}**\n\n" + md_table(header, rows, set(range(len(header)))))
    worse = [f"- ⚠ **{name}** at {users} users: the score under load is below the single-user"
             f" answers' ({_paired_cells(case)[0]} points, p {p_text(paired.p_value)})"
             for name, line in lines.items() for users, case in sorted(line.items())
             if (paired := StressRecord.of(case).paired) and paired.verdict == "worse"]
    if worse:
        parts.append("\n".join(worse))
    return "\n\n".join(parts)


def capacity_section(table: StressTable) -> str | None:
    """The levels run under a KV budget: sessions held, throughput and (task samples) accuracy
    at the same memory."""
    rows = []
    budgeted = [(name, users, case) for name, line in table.lines.items()
                for users, case in sorted(line.items()) if case.bench_params.get("kv_budget")]
    if not budgeted:
        return None
    scored = any(task_of(case) for _, _, case in budgeted)
    for name, users, case in sorted(budgeted, key=lambda row: row[2].bench_params["kv_budget"]):
        cells = [case.method_label, fmt_bytes(case.bench_params["kv_budget"]), str(users),
                 _cell(case, "sessions_held", "{:g}"), _cell(case, "output_tok_s", "{:.1f}"),
                 _cell(case, "request_throughput", "{:.3f}"), _cell(case, "errors", "{:.0f}")]
        if scored:
            cells += [_score_cell(case), _cell(case, "goodput_rps", "{:.3f}"),
                      _cell(case, "correct_share", "{:.2f}")]
        rows.append(cells)
    header = ["method", "KV budget", "users", "sessions held ↑", "output tok/s ↑", "req/s ↑",
              "errors ↓"]
    if scored:
        header += ["score [95% CI]", "goodput req/s ↑", "correct ↑"]
    text = ("The levels run under a KV budget (`kv_budget`: kvbench serve admits a request only"
            " while the accounted bytes of those it holds fit): the same memory for every"
            " method, and what each does with it. *Sessions held*: the most requests streaming"
            " at once, seen by the client.")
    return "\n\n".join(["### Capacity at the same KV budget", text,
                         md_table(header, rows, set(range(2, len(header))))])


def drift_section(result: RunResult) -> str | None:
    """Each method's single-user answers' lengths against identity's on the same prompts, for
    the cases whose answers end at end-of-sequence (task samples, or ignore_eos off): one case
    per method and setting, since a server's single-user pass does not depend on the level."""
    cases, seen = [], set()
    for case in ok_cases(result, BENCHMARK):
        if not (task_of(case) or case.bench_params.get("ignore_eos") is False):
            continue
        key = (case.method_label, pair_key(case, UNPAIRED))
        if key not in seen:
            seen.add(key)
            cases.append(case)
    if not cases:
        return None
    return length_drift_section(
        result.model_copy(update={"cases": cases}), BENCHMARK, lambda c: task_of(c) or "free text",
        "a prompt answered by the method's single-user pass (one request at a time, its own"
        " server)", UNPAIRED, title="stress", scope_header="prompts of",
        seconds_are="from the request sent to its last token, its prefill included")


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
                reasons = StressRecord.of(case).failures or {}
                why = "; ".join(f"{n}× {r}" for r, n in list(reasons.items())[:3])
                lines.append(f"- **{name}** at {users} users: {errors:.0f} failed request(s)"
                             + (f": {why}" if why else ""))
    return lines


def stress_parts(result: RunResult, out_dir: Path | None) -> list[str | None]:
    table = stress_table(result)
    parts = [stress_section(result), stress_figures(result, out_dir), prefix_section(result)]
    if table is not None:
        parts += [accuracy_section(table), goodput_figure(result, out_dir),
                  capacity_section(table), drift_section(result)]
    return parts


REPORT = BenchmarkReport(
    board=Board(None, "errors", ("token_agreement", "sessions_held", "output_tok_s",
                                 "aggregate_vs_single")),
    parts=stress_parts)
