"""`kvbench report RESULTS... --format html --out DIR`: a static results page made from result
files alone, to open from disk (no server, no network, no script or font from elsewhere).

DIR/index.html holds, for every run given:
- headline figures at the top (kvbench.report.html_figures): quality against compression with
  the Pareto front per benchmark, the memory ladder, throughput against users;
- the paired comparisons against identity, as each run's report.md has them, with a summary of
  each method's verdict (worse / not separated / better);
- a leaderboard per benchmark kind: one row per case, its compression and quality figures, the
  Pareto front (per run and benchmark parameters) marked; each method's settings that differ
  from its defaults; a byte ratio's column names what it is against; sortable by any column,
  filterable by method family;
- the memory footprint of every model-running case (peak, what was held at its start, the
  method's caches at their largest, kvbench's evaluation overhead), where the runs recorded it;
- the run's claims, with verdict (an unmet goal with its reason, a skipped claim with the model
  it was calibrated on) and where each was stated
  (`suite.yaml:line`);
- its figures (the PNGs `kvbench report` draws, beside the run's files);
- every case in full: id, parameters, suite hash, git sha, machine, every metric; each cell of a
  leaderboard links to it.
Several runs side by side: a case id found in two runs is compared metric by metric with the
ratio, unless what defines it differs (then the page says what); the backend and the machine
are what such a comparison is for, and are not counted as differences.
DIR/runs/<n>-<suite>/ holds each run's results.json, report.md and figures.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from kvbench.judge.gate import fingerprint_differences
from kvbench.report.html_assets import SCRIPT, STYLE
from kvbench.report.html_boards import leaderboard
from kvbench.report.html_figures import headline_figures
from kvbench.report.html_footprint import footprint_section
from kvbench.report.html_paired import against_identity_section
from kvbench.report.html_parts import esc, row, section, table
from kvbench.report.html_run import Run
from kvbench.reportkit.figures import method_family
from kvbench.reportkit.tables import fmt_number
from kvbench.report.markdown import benchmark_report, write_reports
from kvbench.files import atomic_write_text
from kvbench.results import CaseResult, Metric, RunResult, save_results

PAGE = "index.html"

__all__ = ["PAGE", "Run", "board_order", "build_site", "render_page"]


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
    boards = {kind: benchmark_report(kind).board for kind in kinds}
    figures = headline_figures(kinds, boards, runs)
    parts = [
        _head(runs),
        section("Headline figures", figures) if figures else "",
        against_identity_section(runs, kinds),
        _family_filter(families),
        *(leaderboard(kind, runs, anchors) for kind in kinds),
        footprint_section(runs, anchors),
        _claims(runs, anchors),
        _runs_table(runs),
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


# The order of the built-in benchmarks' leaderboards on the page: the compression proofs first,
# then what a method costs in quality, retrieval, memory, serving and speed.
BOARD_ORDER = ("proofs", "perplexity", "quality", "niah", "ruler", "multiturn", "dataset",
               "ladder", "stress", "speed", "decode_attention", "compaction", "parity")


def board_order(present: list[str]) -> list[str]:
    """The order of the leaderboards of the benchmark kinds `present` (in order of appearance):
    the built-ins' with a board in BOARD_ORDER, then the other kinds with a board (plug-ins'),
    then those without, each as they appear."""
    has_board = [kind for kind in present if benchmark_report(kind).board is not None]
    builtin = [kind for kind in BOARD_ORDER if kind in has_board]
    return builtin + [kind for kind in has_board if kind not in builtin] + [
        kind for kind in present if kind not in has_board]


# ------------------------------------------------------------ sections


def _head(runs: list[Run]) -> str:
    names = ", ".join(sorted({run.result.suite.name for run in runs}))
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>kvbench: {esc(names)}</title><style>{STYLE}</style></head><body>"
            f"<h1>kvbench results</h1><p class='lede'>{len(runs)} run(s): {esc(names)}. Made from "
            "result files alone by <code>kvbench report --format html</code>; every figure links "
            "to the case that produced it, and each run's <code>results.json</code> is beside "
            "this page.</p>")


def _runs_table(runs: list[Run]) -> str:
    rows = []
    for run in runs:
        r, machine = run.result, run.result.machine
        sha = r.git_sha or "-"
        rows.append(row([
            esc(f"#{run.index}"),
            f"<a href='{run.folder}/results.json'>{esc(r.suite.name)}</a> "
            f"(<a href='{run.folder}/report.md'>report.md</a>)",
            f"<code title='{esc(r.suite.hash)}'>{esc(r.suite.hash[:12])}</code>",
            # the full sha on hover: 40 digits would widen the table past the window
            f"<code title='{esc(sha)}'>{esc(sha[:12])}{'+dirty' if sha.endswith('dirty') else ''}"
            "</code>",
            esc(machine.get("key", "?")), esc(machine.get("cpu", "")),
            esc(machine.get("device", "")), esc(r.kvbench_version), esc(r.started),
            str(len(r.cases)), esc(run.source)]))
    return section("Runs", table(["run", "suite", "suite hash", "git sha", "machine", "cpu",
                                    "device", "kvbench", "started", "cases", "from"], rows))


def _family_filter(families: list[str]) -> str:
    boxes = "".join(f"<label><input type='checkbox' class='family' value='{esc(f)}' checked> "
                    f"{esc(f)}</label>" for f in families)
    return (f"<fieldset id='families'><legend>method families shown</legend>{boxes}"
            "<button type='button' id='all-families'>all</button></fieldset>")


def _claims(runs: list[Run], anchors: dict) -> str:
    rows, held = [], 0
    for run in runs:
        for case in run.result.cases:
            for claim in case.claims:
                held += claim.verdict == "held"
                measured = "-" if claim.measured is None else fmt_number(claim.measured)
                if claim.measured is not None and claim.measured_as:  # a paired bound
                    measured += f" ({claim.measured_as})"
                verdict = f"<span class='verdict {claim.verdict}'>{claim.verdict}</span>"
                if claim.verdict == "unmet" and claim.goal:  # a goal not met yet says why
                    verdict += f"<span class='why'>: {esc(claim.goal)}</span>"
                if claim.verdict == "skipped":  # so does a claim of another model
                    verdict += f"<span class='why'>: {esc(claim.measured_as or '')}</span>"
                rows.append(row([
                    esc(f"#{run.index}"),
                    f"<a href='#{anchors[(run.index, case.id)]}'>{esc(case.id)}</a>",
                    f"<code>{esc(claim.claim)}</code>", esc(measured), f"<td>{verdict}</td>",
                    f"<code>{esc(claim.source or '-')}</code>"], verdict=claim.verdict))
    if not rows:
        return ""
    only = ("<label><input type='checkbox' id='claims-not-held'> only the claims not held"
            "</label>")
    return section("Claims", f"<p class='note'>{held} of {len(rows)} held. {only}</p>" + table(
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
                refused.append(row([esc(case.id), links,
                                     f"<td class='why'>{esc('; '.join(why))}</td>"]))
                continue
            for name in base.metrics.keys() & case.metrics.keys():
                a, b = base.metrics[name], case.metrics[name]
                ratio = b.value / a.value if a.value else None
                rows.append(row([esc(case.id), links, esc(name), esc(a.unit),
                                  esc(fmt_number(a.value, a.unit)), esc(fmt_number(b.value, b.unit)),
                                  _num(ratio, f"{ratio:.3g}" if ratio is not None else "-")]))
    if not rows and not refused:
        return ""
    body = ("<p class='note'>The same case id in two runs (other machines or backends), metric "
            "by metric, with B/A. Cases whose definition differs are not put side by side.</p>")
    if rows:
        body += table(["case", "runs A vs B", "metric", "unit", "A", "B", "B/A"], sorted(rows),
                       sortable=True, table_id="comparison")
    if refused:
        body += "<h3>Not comparable</h3>" + table(["case", "runs", "why not"], refused,
                                                   table_id="not-comparable")
    return section("Side by side", body)


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
                f"alt='{esc(topic)}: {esc(what)}'></a><figcaption>{esc(topic.split(':')[0])}, "
                f"{esc(what)} ({esc(run.label)}) · <a href='{src}'>full size</a></figcaption>"
                "</figure>")
    if not topics:
        return ""
    return section("Figures", "".join(f"<h3>{esc(topic)}</h3>{''.join(blocks)}"
                                       for topic, blocks in topics.items()))


def _case_details(cases: list[tuple[Run, CaseResult]], anchors: dict) -> str:
    blocks = []
    for run, case in cases:
        r = run.result
        facts = [
            ("run", f"<a href='{run.folder}/results.json'>{esc(run.label)}</a>"),
            ("status", esc(case.status) + (f": {esc(case.error.type)}: {esc(case.error.message)}"
                                          if case.error else "")),
            ("benchmark", esc(case.benchmark)),
            ("parameters", f"<code>{esc(json.dumps(case.bench_params, default=str))}</code>"),
            ("method", f"{esc(case.method)} ({esc(case.method_label)})"),
            ("method parameters",
             f"<code>{esc(json.dumps(case.method_params, default=str))}</code>"),
            ("model", esc(f"{case.model or '-'}"
                          + (f" at {case.model_revision[:12]}" if case.model_revision else "")
                          + f" ({case.model_dtype})")),
            ("backend, device", esc(f"{case.backend}, {case.device}")),
            ("seed, threads", esc(f"{case.seed}, {case.threads or 'default'}")),
            ("suite", f"{esc(r.suite.name)} <code>{esc(r.suite.hash[:12])}</code>"),
            ("git sha", f"<code>{esc(r.git_sha or '-')}</code>"),
            ("machine", esc(f"{r.machine.get('key')} · {r.machine.get('cpu', '')} · "
                           f"{r.machine.get('device', '')}")),
            ("fingerprint", f"<code>{esc(case.fingerprint[:16])}</code>"),
        ] + [("warning", esc(w)) for w in case.warnings]
        facts_html = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
        metrics = "".join(
            row([esc(name), esc(fmt_number(m.value, m.unit)), esc(m.unit), esc(m.direction),
                  esc(m.timing or "-"), esc(_spread(m))]) for name, m in case.metrics.items())
        claims = "".join(f"<li><code>{esc(c.claim)}</code>: <span class='verdict {c.verdict}'>"
                         f"{c.verdict}</span>"
                         + (f": {esc(c.goal)}" if c.verdict == "unmet" and c.goal else "")
                         + (f": {esc(c.measured_as or '')}" if c.verdict == "skipped" else "")
                         + f" ({esc(c.source)})</li>" for c in case.claims)
        blocks.append(
            f"<details id='{anchors[(run.index, case.id)]}'><summary>{esc(case.id)} "
            f"<span class='muted'>{esc(run.label)}</span></summary><table class='facts'>"
            f"{facts_html}</table>"
            + (table(["metric", "value", "unit", "better", "timing", "spread"],
                      [metrics]) if metrics else "")
            + (f"<ul>{claims}</ul>" if claims else "") + "</details>")
    return section("Cases", "".join(blocks))


# ------------------------------------------------------------ pieces


def _spread(metric: Metric) -> str:
    if not metric.samples or len(metric.samples) < 2:
        return "-"
    return (f"{len(metric.samples)} samples, {fmt_number(metric.min, metric.unit)} to "
            f"{fmt_number(metric.max, metric.unit)}")


def _num(value: float | None, shown: str) -> str:
    return f"<td class='num' data-v='{'' if value is None else repr(value)}'>{esc(shown)}</td>"


