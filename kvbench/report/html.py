"""`kvbench report RESULTS... --format html --out DIR`: a static results page made from result
files alone, to open from disk (no server, no network, no script or font from elsewhere).

DIR/index.html holds, for every run given:
- a leaderboard per benchmark kind: one row per case, its compression and quality figures, the
  Pareto front (per run and benchmark parameters) marked; sortable by any column, filterable by
  method family;
- the run's claims, with verdict and where each was stated (`suite.yaml:line`);
- its figures (the PNGs `kvbench report` draws, beside the run's files);
- every case in full: id, parameters, suite hash, git sha, machine, every metric; each cell of a
  leaderboard links to it.
Several runs side by side: a case id found in two runs is compared metric by metric with the
ratio, unless what defines it differs (then the page says what); the backend and the machine
are what such a comparison is for, and are not counted as differences.
DIR/runs/<n>-<suite>/ holds each run's results.json, report.md and figures.
"""
from __future__ import annotations

import html
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kvbench.benchmarks import BENCHMARKS
from kvbench.judge.gate import fingerprint_differences
from kvbench.report.html_assets import SCRIPT, STYLE
from kvbench.report.kit.benchmark import Board
from kvbench.report.kit.figures import method_family, pareto_front
from kvbench.report.kit.tables import fmt_number
from kvbench.report.markdown import benchmark_report, write_reports
from kvbench.files import atomic_write_text
from kvbench.results import CaseResult, Metric, RunResult, save_results

PAGE = "index.html"


# A benchmark's leaderboard shows the columns of its report's board; one without a board shows
# its first metrics.
_FALLBACK_COLUMNS = 6


@dataclass
class Run:
    """One result file on the page: its number, where it came from, its folder (its
    results.json, report.md and figures) as a path relative to the page, and its figures."""

    index: int
    source: str
    result: RunResult
    folder: str
    figures: list[str]

    @property
    def label(self) -> str:
        return f"#{self.index} {self.result.suite.name} · {self.result.machine.get('key', '?')}"


def build_site(sources: list[tuple[str, RunResult]], out_dir: str | Path,
               link: bool = False) -> Path:
    """Write DIR/index.html and, beside it, each run's folder: results.json, report.md and
    figures (runs/<n>-<suite>/). link: point to each results file's own folder instead, which
    must hold its report.md and figures already (as reports/ does); nothing is copied.
    Returns the page's path."""
    out = Path(out_dir)
    runs = []
    for index, (source, result) in enumerate(sources, start=1):
        if link:
            folder = Path(source).parent
        else:
            folder = out / "runs" / f"{index}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', result.suite.name)}"
            save_results(folder / "results.json", result)
            write_reports(result, folder)  # report.md and its figures
        runs.append(Run(index, source, result, Path(os.path.relpath(folder, out)).as_posix(),
                        sorted(p.name for p in folder.glob("*.png"))))
    page = out / PAGE
    atomic_write_text(page, render_page(runs))
    return page


def render_page(runs: list[Run]) -> str:
    cases = [(run, case) for run in runs for case in run.result.cases]
    anchors = {(run.index, case.id): f"c{n}" for n, (run, case) in enumerate(cases, start=1)}
    families = sorted({method_family(case.method) for _, case in cases})
    kinds = board_order(list(dict.fromkeys(case.benchmark for _, case in cases)))
    parts = [
        _head(runs),
        _runs_table(runs),
        _family_filter(families),
        *(_leaderboard(kind, runs, anchors) for kind in kinds),
        _claims(runs, anchors),
        _comparison(runs, anchors) if len(runs) > 1 else "",
        _figures(runs),
        _case_details(cases, anchors),
        f"<script>{SCRIPT}</script></body></html>\n",
    ]
    parts.insert(1, _contents(parts))
    return "\n".join(part for part in parts if part)


def _contents(parts: list[str]) -> str:
    """A table of contents: a link to each top-level section, in page order."""
    found = re.findall(r"<section id='([^']+)'><h2>([^<]*)</h2>", "".join(parts))
    links = "".join(f"<li><a href='#{slug}'>{title}</a></li>" for slug, title in found)
    return f"<nav id='contents'><b>Contents</b><ul>{links}</ul></nav>"


def board_order(present: list[str]) -> list[str]:
    """The order of the leaderboards of the benchmark kinds `present` (in order of appearance):
    those with a board in the order their benchmarks were registered (the built-ins' order is
    set in kvbench.benchmarks.specs), then the others as they appear."""
    boarded = [kind for kind in BENCHMARKS.in_order()
               if kind in present and benchmark_report(kind).board is not None]
    return boarded + [kind for kind in present if kind not in boarded]


# ------------------------------------------------------------ sections


def _head(runs: list[Run]) -> str:
    names = ", ".join(sorted({run.result.suite.name for run in runs}))
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>kvbench: {_e(names)}</title><style>{STYLE}</style></head><body>"
            f"<h1>kvbench results</h1><p class='lede'>{len(runs)} run(s): {_e(names)}. Made from "
            "result files alone by <code>kvbench report --format html</code>; every figure links "
            "to the case that produced it, and each run's <code>results.json</code> is beside "
            "this page.</p>")


def _runs_table(runs: list[Run]) -> str:
    rows = []
    for run in runs:
        r, machine = run.result, run.result.machine
        rows.append(_row([
            _e(f"#{run.index}"),
            f"<a href='{run.folder}/results.json'>{_e(r.suite.name)}</a> "
            f"(<a href='{run.folder}/report.md'>report.md</a>)",
            f"<code>{_e(r.suite.hash[:12])}</code>", f"<code>{_e(r.git_sha or '-')}</code>",
            _e(machine.get("key", "?")), _e(machine.get("cpu", "")),
            _e(machine.get("device", "")), _e(r.kvbench_version), _e(r.started),
            str(len(r.cases)), _e(run.source)]))
    return _section("Runs", _table(["run", "suite", "suite hash", "git sha", "machine", "cpu",
                                    "device", "kvbench", "started", "cases", "from"], rows))


def _family_filter(families: list[str]) -> str:
    boxes = "".join(f"<label><input type='checkbox' class='family' value='{_e(f)}' checked> "
                    f"{_e(f)}</label>" for f in families)
    return (f"<fieldset id='families'><legend>method families shown</legend>{boxes}"
            "<button type='button' id='all-families'>all</button></fieldset>")


def _leaderboard(kind: str, runs: list[Run], anchors: dict) -> str:
    rows = [(run, case) for run in runs for case in run.result.cases
            if case.benchmark == kind and case.status == "ok"]
    if not rows:
        return ""
    board = benchmark_report(kind).board or _fallback_board(rows)
    columns = [m for m in (board.compression, board.quality, *board.extra) if m is not None
               and any(m in case.metrics for _, case in rows)]
    front = _front(rows, board)
    varying = _varying([case.bench_params for _, case in rows])
    settings = {family: _varying([case.method_params for _, case in rows
                                  if method_family(case.method) == family])
                for family in {method_family(case.method) for _, case in rows}}
    many = len(runs) > 1
    head = (["run"] if many else []) + ["family", "method", "settings", "parameters"] + [
        _metric_head(rows, m) for m in columns] + ["front"]
    body = []
    for run, case in rows:
        link = anchors[(run.index, case.id)]
        cells = ([_e(f"#{run.index}")] if many else []) + [
            _e(method_family(case.method)), f"<a href='#{link}'>{_e(case.method_label)}</a>",
            f"<td class='params'>"
            f"{_e(_params(case.method_params, settings[method_family(case.method)]))}</td>",
            f"<td class='params'>{_e(_params(case.bench_params, varying))}</td>"]
        cells += [_metric_cell(case.metrics.get(m), link) for m in columns]
        on = (run.index, case.id) in front
        cells.append("<span class='star' title='on the Pareto front'>★</span>" if on else "")
        body.append(_row(cells, family=method_family(case.method), front=on))
    note = _board_note(board)
    return _section(f"Leaderboard: {kind}", f"<p class='note'>{note}</p>" + _table(
        head, body, sortable=True, table_id=f"board-{kind}"), level=2)


def _fallback_board(rows: list[tuple[Run, CaseResult]]) -> Board:
    names = list(dict.fromkeys(m for _, case in rows for m in case.metrics))
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
        point = (_lower_better(x), _lower_better(y))
        groups.setdefault(key, []).append(((run.index, case.id), point))
    on = set()
    for members in groups.values():
        ranked = pareto_front([point for _, point in members])
        on |= {members[i][0] for i in ranked}
    return on


def _lower_better(metric: Metric) -> float:
    return -metric.value if metric.direction == "higher" else metric.value


def _board_note(board: Board) -> str:
    if board.compression and board.quality:
        return (f"★: on the Pareto front of <b>{_e(board.compression)}</b> against "
                f"<b>{_e(board.quality)}</b>, among the cases of every run shown with the "
                "same model and benchmark parameters: no other case is better on both. Click "
                "a column to sort; a figure opens its case.")
    return "Click a column to sort; a figure opens its case."


def _claims(runs: list[Run], anchors: dict) -> str:
    rows, held = [], 0
    for run in runs:
        for case in run.result.cases:
            for claim in case.claims:
                held += claim.verdict == "held"
                measured = "-" if claim.measured is None else fmt_number(claim.measured)
                if claim.measured is not None and claim.measured_as:  # a paired bound
                    measured += f" ({claim.measured_as})"
                rows.append(_row([
                    _e(f"#{run.index}"),
                    f"<a href='#{anchors[(run.index, case.id)]}'>{_e(case.id)}</a>",
                    f"<code>{_e(claim.claim)}</code>", _e(measured),
                    f"<span class='verdict {claim.verdict}'>{claim.verdict}</span>",
                    f"<code>{_e(claim.source or '-')}</code>"], verdict=claim.verdict))
    if not rows:
        return ""
    only = ("<label><input type='checkbox' id='claims-not-held'> only the claims not held"
            "</label>")
    return _section("Claims", f"<p class='note'>{held} of {len(rows)} held. {only}</p>" + _table(
        ["run", "case", "claim", "measured", "verdict", "stated at"], rows, sortable=True,
        table_id="claims"))


def _comparison(runs: list[Run], anchors: dict) -> str:
    """Each case id in two or more runs, against its first run: value, value, ratio."""
    first: dict[str, tuple[Run, CaseResult]] = {}
    rows, refused = [], []
    for run in runs:
        for case in run.result.cases:
            if case.id not in first:
                first[case.id] = (run, case)
                continue
            base_run, base = first[case.id]
            differences = [d for d in fingerprint_differences(base, case)
                           if not d.startswith("backend:") and not (
                               d.startswith("threads:") and _off_cpu(base, case))]
            links = (f"<a href='#{anchors[(base_run.index, base.id)]}'>#{base_run.index}</a> vs "
                     f"<a href='#{anchors[(run.index, case.id)]}'>#{run.index}</a>")
            if differences or base.status != "ok" or case.status != "ok":
                why = differences or [f"status {base.status} vs {case.status}"]
                refused.append(_row([_e(case.id), links,
                                     f"<td class='why'>{_e('; '.join(why))}</td>"]))
                continue
            for name in base.metrics.keys() & case.metrics.keys():
                a, b = base.metrics[name], case.metrics[name]
                ratio = b.value / a.value if a.value else None
                rows.append(_row([_e(case.id), links, _e(name), _e(a.unit),
                                  _e(fmt_number(a.value, a.unit)), _e(fmt_number(b.value, b.unit)),
                                  _num(ratio, f"{ratio:.3g}" if ratio is not None else "-")]))
    if not rows and not refused:
        return ""
    body = ("<p class='note'>The same case id in two runs (other machines or backends), metric "
            "by metric, with B/A. Cases whose definition differs are not put side by side.</p>")
    if rows:
        body += _table(["case", "runs A vs B", "metric", "unit", "A", "B", "B/A"], sorted(rows),
                       sortable=True, table_id="comparison")
    if refused:
        body += "<h3>Not comparable</h3>" + _table(["case", "runs", "why not"], refused,
                                                   table_id="not-comparable")
    return _section("Side by side", body)


def _off_cpu(*cases: CaseResult) -> bool:
    """Whether one of the cases ran off the CPU, where torch's CPU thread count does not change
    what is computed (a CPU run's threads and a GPU run's are not a difference of definition)."""
    return any(case.device != "cpu" for case in cases)


# What each figure shows, by the start of its file name: the page groups them by topic.
FIGURE_TOPICS = {
    "rate_distortion": "Rate-distortion: error against bits per value (proofs)",
    "niah_": "Needle in a haystack: score by depth and length",
    "ruler_": "RULER: mean score against compression",
    "ladder_": "Memory ladder: what each method saves as the context grows",
    "stress_": "Concurrency: throughput and latency against users",
}


def _figures(runs: list[Run]) -> str:
    topics: dict[str, list[str]] = {}
    for run in runs:
        for name in run.figures:
            topic = next((t for prefix, t in FIGURE_TOPICS.items() if name.startswith(prefix)),
                         "Other figures")
            src = f"{run.folder}/{name}"
            what = name.removesuffix(".png").removeprefix("niah_")
            # the image opens full size: multi-panel figures are too small to read inline
            topics.setdefault(topic, []).append(
                f"<figure><a href='{src}' title='open full size'><img src='{src}' "
                f"alt='{_e(topic)}: {_e(what)}'></a><figcaption>{_e(topic.split(':')[0])}, "
                f"{_e(what)} ({_e(run.label)}) · <a href='{src}'>full size</a></figcaption>"
                "</figure>")
    if not topics:
        return ""
    return _section("Figures", "".join(f"<h3>{_e(topic)}</h3>{''.join(blocks)}"
                                       for topic, blocks in topics.items()))


def _case_details(cases: list[tuple[Run, CaseResult]], anchors: dict) -> str:
    blocks = []
    for run, case in cases:
        r = run.result
        facts = [
            ("run", f"<a href='{run.folder}/results.json'>{_e(run.label)}</a>"),
            ("status", _e(case.status) + (f": {_e(case.error.type)}: {_e(case.error.message)}"
                                          if case.error else "")),
            ("benchmark", _e(case.benchmark)),
            ("parameters", f"<code>{_e(json.dumps(case.bench_params, default=str))}</code>"),
            ("method", f"{_e(case.method)} ({_e(case.method_label)})"),
            ("method parameters",
             f"<code>{_e(json.dumps(case.method_params, default=str))}</code>"),
            ("model", _e(f"{case.model or '-'} ({case.model_dtype})")),
            ("backend, device", _e(f"{case.backend}, {case.device}")),
            ("seed, threads", _e(f"{case.seed}, {case.threads or 'default'}")),
            ("suite", f"{_e(r.suite.name)} <code>{_e(r.suite.hash[:12])}</code>"),
            ("git sha", f"<code>{_e(r.git_sha or '-')}</code>"),
            ("machine", _e(f"{r.machine.get('key')} · {r.machine.get('cpu', '')} · "
                           f"{r.machine.get('device', '')}")),
            ("fingerprint", f"<code>{_e(case.fingerprint[:16])}</code>"),
        ] + [("warning", _e(w)) for w in case.warnings]
        facts_html = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
        metrics = "".join(
            _row([_e(name), _e(fmt_number(m.value, m.unit)), _e(m.unit), _e(m.direction),
                  _e(m.timing or "-"), _e(_spread(m))]) for name, m in case.metrics.items())
        claims = "".join(f"<li><code>{_e(c.claim)}</code>: <span class='verdict {c.verdict}'>"
                         f"{c.verdict}</span> ({_e(c.source)})</li>" for c in case.claims)
        blocks.append(
            f"<details id='{anchors[(run.index, case.id)]}'><summary>{_e(case.id)} "
            f"<span class='muted'>{_e(run.label)}</span></summary><table class='facts'>"
            f"{facts_html}</table>"
            + (_table(["metric", "value", "unit", "better", "timing", "spread"],
                      [metrics]) if metrics else "")
            + (f"<ul>{claims}</ul>" if claims else "") + "</details>")
    return _section("Cases", "".join(blocks))


# ------------------------------------------------------------ pieces


def _spread(metric: Metric) -> str:
    if not metric.samples or len(metric.samples) < 2:
        return "-"
    return (f"{len(metric.samples)} samples, {fmt_number(metric.min, metric.unit)} to "
            f"{fmt_number(metric.max, metric.unit)}")


def _metric_head(rows: list[tuple[Run, CaseResult]], name: str) -> str:
    metric = next(case.metrics[name] for _, case in rows if name in case.metrics)
    arrow = {"higher": " ↑", "lower": " ↓"}.get(metric.direction, "")
    unit = f" [{metric.unit}]" if metric.unit else ""
    return f"{name}{unit}{arrow}"


def _metric_cell(metric: Metric | None, link: str) -> str:
    if metric is None:
        return "<td data-v=''>-</td>"
    return (f"<td class='num' data-v='{metric.value!r}'><a href='#{link}'>"
            f"{_e(fmt_number(metric.value, metric.unit))}</a></td>")


def _num(value: float | None, shown: str) -> str:
    return f"<td class='num' data-v='{'' if value is None else repr(value)}'>{_e(shown)}</td>"


def _varying(params: list[dict]) -> set[str]:
    """The parameters that differ between cases (a board's benchmark parameters, a family's
    method settings): the others say nothing there (every case shows them all)."""
    seen: dict[str, set[str]] = {}
    for values in params:
        for key, value in values.items():
            seen.setdefault(key, set()).add(json.dumps(value, sort_keys=True, default=str))
    return {key for key, values in seen.items() if len(values) > 1}


def _params(params: dict, keys: set[str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items() if k in keys) or "-"


def _row(cells: list[str], family: str | None = None, front: bool = False,
         verdict: str | None = None) -> str:
    attrs = ""
    if family is not None:
        attrs += f" data-family='{_e(family)}'"
    if front:
        attrs += " class='front'"
    if verdict is not None:
        attrs += f" data-verdict='{verdict}'"
    tds = "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells)
    return f"<tr{attrs}>{tds}</tr>"


def _table(head: list[str], rows: list[str], sortable: bool = False,
           table_id: str | None = None) -> str:
    ident = f" id='{table_id}'" if table_id else ""
    cls = " class='sortable'" if sortable else ""
    ths = "".join(f"<th>{_e(h) if not h.startswith('<') else h}</th>" for h in head)
    return (f"<div class='scroll'><table{ident}{cls}><thead><tr>{ths}</tr></thead><tbody>"
            f"{''.join(rows)}</tbody></table></div>")


def _section(title: str, body: str, level: int = 2) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return f"<section id='{slug}'><h{level}>{_e(title)}</h{level}>{body}</section>"


def _e(text) -> str:
    return html.escape(str(text), quote=True)
