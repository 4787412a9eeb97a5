"""`kvbench report --format html`: the results page, read back from its HTML, and in a real
(headless) Chromium: it loads without errors, its tables sort and filter, its links open cases."""
from __future__ import annotations

import glob
import importlib.util
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvbench.benchmarks import BENCHMARKS
from kvbench.benchmarks.specs.base import Benchmark, MetricSpec
from kvbench.methods.settings import build_method
from kvbench.report.html import build_site
from kvbench.reportkit.benchmark import BenchmarkReport, Board
from kvbench.reportkit.figures import method_family
from kvbench.reportkit.tables import md_table, ok_cases
from kvbench.report.markdown import render_markdown
from kvbench.results import Metric, load_results, save_results
from tests.plugins.browser import Browser, chromium_path
from tests.plugins.cli_support import invoke
from tests.plugins.suites import ROOT, SMALL_RESULTS


class _Tables(HTMLParser):
    """Every table by id: rows of (attributes, cell texts, link targets); and the ids of the
    page's <details> elements with their text."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: dict[str, list[tuple[dict, list[str], list[str]]]] = {}
        self.details: dict[str, str] = {}
        self._table = self._row = self._cell = None
        self._details: list[str | None] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id"):
            self._table = self.tables.setdefault(attrs["id"], [])
        elif tag == "tr" and self._table is not None:
            self._row = (attrs, [], [])
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "a" and self._row is not None and attrs.get("href"):
            self._row[2].append(attrs["href"])
        elif tag == "details":  # folds nest (the paired tables): each to its own id, if any
            self._details.append(attrs.get("id"))
            if attrs.get("id"):
                self.details[attrs["id"]] = ""

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row[1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row[1] and self._table is not None:
                self._table.append(self._row)
            self._row = None
        elif tag == "details":
            self._details.pop()

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        for ident in self._details:
            if ident:
                self.details[ident] += data


def _body_rows(table):
    return table[1:]  # the first row is the head


def _site(tmp_path: Path, *runs) -> tuple[Path, _Tables]:
    page = build_site([(f"run{i}.json", run) for i, run in enumerate(runs)], tmp_path / "site")
    return page, _Tables(page.read_text())


def _brute_front(cases, x_name: str, y_name: str) -> set[str]:
    def score(metric):
        return -metric.value if metric.direction == "higher" else metric.value

    points = {c.id: (score(c.metrics[x_name]), score(c.metrics[y_name]), str(c.bench_params))
              for c in cases if x_name in c.metrics and y_name in c.metrics}
    return {i for i, (x, y, g) in points.items()
            if not any(g2 == g and x2 <= x and y2 <= y and (x2, y2) != (x, y)
                       for x2, y2, g2 in points.values())}


def test_the_page_of_one_run(tmp_path):
    run = load_results(SMALL_RESULTS)
    page, parsed = _site(tmp_path, run)
    shipped = load_results(tmp_path / "site/runs/1-small/results.json")
    assert shipped.cases == run.cases  # the run's results beside the page
    assert (tmp_path / "site/runs/1-small/report.md").exists()
    for kind in ("proofs", "perplexity"):
        rows = _body_rows(parsed.tables[f"board-{kind}"])
        ok = [c for c in run.cases if c.benchmark == kind and c.status == "ok"]
        assert [r[1][1] for r in rows] == [c.method_label for c in ok]
        assert [r[0]["data-family"] for r in rows] == [method_family(c.method) for c in ok]
        for (attrs, cells, links), case in zip(rows, ok):
            # every figure and the method link open this case's details
            assert links and set(links) == {links[0]}
            assert case.id in parsed.details[links[0][1:]]
        board = BENCHMARKS.get(kind).report.board  # its columns, as the benchmark declares
        marked = {case.id for (attrs, _, _), case in zip(rows, ok) if attrs.get("class") == "front"}
        assert marked == _brute_front(ok, board.compression, board.quality)
    claims = _body_rows(parsed.tables["claims"])
    expected = [(c.id, cl.claim, cl.verdict, cl.source) for c in run.cases for cl in c.claims]
    assert [(r[1][1], r[1][2], r[1][4], r[1][5]) for r in claims] == expected
    assert all(source for *_, source in expected)  # each claim says where it was stated


def test_two_machines_side_by_side_and_what_is_not_comparable(tmp_path):
    first = load_results(SMALL_RESULTS)
    second = first.model_copy(deep=True)
    second.machine["key"] = "linux-x86_64-other"
    ok = [c for c in second.cases if c.status == "ok"]
    timed, changed = ok[0], ok[1]
    metric = next(iter(timed.metrics))
    timed.metrics[metric].value *= 2
    changed.method_params = {**changed.method_params, "bits": 99}
    _, parsed = _site(tmp_path, first, second)
    rows = {(r[1][0], r[1][2]): r[1] for r in _body_rows(parsed.tables["comparison"])}
    cells = rows[(timed.id, metric)]
    assert cells[6] == "2"  # B/A
    assert not any(case == changed.id for case, _ in rows)
    refused = {r[1][0]: r[1][2] for r in _body_rows(parsed.tables["not-comparable"])}
    assert "method_params.bits" in refused[changed.id] and "-> 99" in refused[changed.id]
    # the machine is what the comparison is for: not a reason
    assert all("machine" not in why for why in refused.values())


def test_a_cpu_run_and_a_gpu_run_are_side_by_side_whatever_their_cpu_threads(tmp_path):
    first = load_results(SMALL_RESULTS)
    second = first.model_copy(deep=True)
    second.machine["key"] = "linux-x86_64-nvidia-h200"
    ok = [c for c in second.cases if c.status == "ok"]
    for case in first.cases:
        case.threads = 1
    for case in second.cases:
        case.threads = None
    for case in ok[1:]:
        case.device = "cuda"
    _, parsed = _site(tmp_path, first, second)
    compared = {r[1][0] for r in _body_rows(parsed.tables["comparison"])}
    refused = {r[1][0]: r[1][2] for r in _body_rows(parsed.tables["not-comparable"])}
    assert {c.id for c in ok[1:]} <= compared
    assert "threads: 1 -> None" in refused[ok[0].id]  # both on the CPU: threads still differ


def test_the_command_line(tmp_path):
    made = invoke("report", SMALL_RESULTS, SMALL_RESULTS, "--format", "html", "--out",
                  tmp_path / "site")
    assert made.exit_code == 0, made.output
    assert (tmp_path / "site/index.html").exists() and (tmp_path / "site/runs/2-small").is_dir()
    refused = invoke("report", SMALL_RESULTS, "--format", "html")
    assert refused.exit_code == 2 and "--out" in refused.output
    refused = invoke("report", SMALL_RESULTS, SMALL_RESULTS)
    assert refused.exit_code == 2 and "--format html" in refused.output



# ------------------------------------------------------------ a plug-in benchmark's own report


class _PluginReport(BenchmarkReport):
    """A section after the plug-in's table, and a board of two of its three metrics."""

    board = Board("kv_bits", "loss", ("speed",))

    def sections(self, result, out_dir=None):
        kind = f"{PluginBench.__module__}:{PluginBench.__qualname__}"
        rows = [[c.method_label, f"{c.metrics['loss'].value:g}"] for c in ok_cases(result, kind)]
        return ["### Plug-in: loss per method", md_table(["method", "loss"], rows)]


class PluginBench(Benchmark):
    """A test-only plug-in benchmark (named `module:Class` in its cases): its report is its own."""

    metrics = {"kv_bits": MetricSpec("bits", "lower"), "loss": MetricSpec("", "lower"),
               "speed": MetricSpec("tok/s", "higher"), "other": MetricSpec("", "none")}
    report = _PluginReport()


def test_a_plugin_benchmark_gets_its_section_and_its_board(tmp_path):
    run = load_results(SMALL_RESULTS)
    kind = f"{PluginBench.__module__}:{PluginBench.__qualname__}"
    template = next(c for c in run.cases if c.status == "ok")
    figures = {"p-a": (4.0, 0.5, 10.0), "p-b": (2.0, 0.9, 20.0), "p-c": (3.0, 1.0, 5.0)}
    plugin = [template.model_copy(update={
        "id": f"plugin/{label}", "benchmark": kind, "method_label": label, "claims": [],
        "metrics": {name: PluginBench.metrics[name].of(value) for name, value in
                    zip(("other", "kv_bits", "loss", "speed"), (1.0, *values))}})
        for label, values in figures.items()]
    # a kind that cannot be looked up where the report is made: the generic report
    missing = template.model_copy(update={"id": "gone/a", "benchmark": "not_installed_kind",
                                          "claims": [], "metrics": {
                                              "m": Metric(value=1.0, direction="lower")}})
    run.cases = plugin + run.cases + [missing]
    page, parsed = _site(tmp_path, run)
    report = (tmp_path / "site/runs/1-small/report.md").read_text()
    mine = report.split(f"## {kind}\n\n", 1)[1].split("\n## ", 1)[0]
    assert "### Plug-in: loss per method\n\n| method | loss |" in mine  # after its table
    assert "| p-b | 0.9 |" in mine
    assert "## not_installed_kind" in report
    # its board: the declared columns in order, its own metric left out; the front from them
    head, *rows = parsed.tables[f"board-{kind}"]
    assert [cell.split(" ")[0] for cell in head[1][4:-1]] == ["kv_bits", "loss", "speed"]
    marked = {cells[1] for attrs, cells, _ in rows if attrs.get("class") == "front"}
    assert marked == {c.method_label for c in plugin if c.id in _brute_front(
        plugin, "kv_bits", "loss")} == {"p-a", "p-b"}
    # after the built-in boards, before the kinds without one; the unknown kind's first metrics
    text = page.read_text()
    assert (text.index("id='board-proofs'") < text.index("id='board-perplexity'")
            < text.index(f"id='board-{kind}'") < text.index("id='board-not_installed_kind'"))
    head, *_ = parsed.tables["board-not_installed_kind"]
    assert [cell.split(" ")[0] for cell in head[1][4:-1]] == ["m"]

# ------------------------------------------------------------ in a browser

CHROMIUM = chromium_path()
needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium (Debian: apt-get install chromium) for the browser test")


@pytest.fixture
def browser():
    pytest.importorskip("websockets", reason="the browser test drives Chromium with websockets")
    opened = Browser(CHROMIUM)
    yield opened
    opened.close()


@needs_browser
def test_in_a_browser_it_loads_sorts_filters_and_opens_cases(browser, tmp_path):
    first = load_results(SMALL_RESULTS)
    second = first.model_copy(deep=True)
    second.machine["key"] = "linux-x86_64-other"
    page, _ = _site(tmp_path, first, second)
    browser.open(page.as_uri())
    assert browser.errors == []
    rows = "document.querySelectorAll('#board-proofs tbody tr')"
    ok = [c for c in first.cases if c.benchmark == "proofs" and c.status == "ok"]
    assert browser.js(f"{rows}.length") == 2 * len(ok)
    column = browser.js("[...document.querySelectorAll('#board-proofs thead th')]"
                        ".findIndex(th => th.textContent.startsWith('attn_output_error'))")
    values = (f"[...{rows}].map(r => parseFloat(r.cells[{column}].getAttribute('data-v')))")
    browser.js(f"document.querySelectorAll('#board-proofs thead th')[{column}].click()")
    ascending = browser.js(values)
    assert ascending == sorted(ascending) and ascending != browser.js("[]")
    browser.js(f"document.querySelectorAll('#board-proofs thead th')[{column}].click()")
    assert browser.js(values) == sorted(ascending, reverse=True)
    # hide a family: its rows go, the others stay
    browser.js("(b => { b.checked = false; b.dispatchEvent(new Event('change')); })"
               "(document.querySelector('input.family[value=intq]'))")
    shown = browser.js(f"[...{rows}].filter(r => r.offsetParent !== null)"
                       ".map(r => r.dataset.family)")
    assert shown and "intq" not in shown
    assert len(shown) == 2 * sum(method_family(c.method) != "intq" for c in ok)
    # a figure opens its case
    target = browser.js(f"{rows}[0].querySelector('td.num a').getAttribute('href')")
    browser.js(f"{rows}[0].querySelector('td.num a').click()")
    assert browser.js(f"document.querySelector('{target}').open") is True
    assert browser.errors == []


@needs_browser
def test_the_page_of_the_committed_reports_in_a_browser(browser, tmp_path):
    paths = sorted(glob.glob(str(ROOT / "reports/*/results.json")))
    runs = [load_results(path) for path in paths]
    page = build_site(list(zip(paths, runs)), tmp_path / "site")
    browser.open(page.as_uri())
    assert browser.errors == []
    for kind in {c.benchmark for run in runs for c in run.cases}:
        expected = sum(c.benchmark == kind and c.status == "ok" for run in runs for c in run.cases)
        assert browser.js(f"document.querySelectorAll('#board-{kind} tbody tr').length") == \
            expected, kind
    figures = browser.js("[...document.images].map(i => i.complete && i.naturalWidth > 0)")
    assert figures and all(figures)  # every figure beside the page loads
    browser.screenshot(tmp_path / "page.png")
    assert (tmp_path / "page.png").stat().st_size > 10_000


def test_a_results_file_saved_again_gives_the_same_page(tmp_path):
    """The page is made from the file alone: the copy beside it makes the same page."""
    run = load_results(SMALL_RESULTS)
    page = build_site([("a", run)], tmp_path / "one")
    save_results(tmp_path / "again.json", load_results(tmp_path / "one/runs/1-small/results.json"))
    again = build_site([("a", load_results(tmp_path / "again.json"))], tmp_path / "two")
    assert page.read_text() == again.read_text()


def test_boards_show_settings_one_front_over_runs_contents_and_a_claims_filter(tmp_path):
    """Method settings were invisible unless in the label, the ★ was per run, the page had no
    table of contents and no way to show only the claims that failed."""
    run = load_results(SMALL_RESULTS)
    intq = next(c for c in run.cases if c.id.startswith("proofs/intq"))
    run.cases.append(intq.model_copy(deep=True, update={
        "id": intq.id.replace("intq-4bit-g32", "intq-8bit"), "method_label": "intq-8bit",
        "method_params": {**intq.method_params, "bits": 8}}))
    board = BENCHMARKS.get("proofs").report.board
    better = run.model_copy(deep=True)  # a second run where intq-4bit-g32 beats itself
    for name in (board.compression, board.quality):
        metric = next(c for c in better.cases if c.id == intq.id).metrics[name]
        metric.value = metric.value * 2 if metric.direction == "higher" else metric.value / 2
    page, parsed = _site(tmp_path, run, better)
    rows = {(cells[0], cells[2]): (attrs, cells) for attrs, cells, _ in
            _body_rows(parsed.tables["board-proofs"])}
    assert rows[("#1", "intq-4bit-g32")][1][3] == "bits=4"
    assert rows[("#1", "intq-8bit")][1][3] == "bits=8"
    assert rows[("#1", "fp16")][1][3] == "dtype=float16"  # identity's default dtype is auto
    assert rows[("#1", "intq-4bit-g32")][0].get("class") != "front"  # #2's beats it
    assert rows[("#2", "intq-4bit-g32")][0].get("class") == "front"
    text = page.read_text()
    contents = re.findall(r"<li><a href='#([^']+)'>", text.split("</nav>")[0])
    assert {"runs", "leaderboard-proofs", "claims", "cases"} <= set(contents)
    assert all(f"<section id='{slug}'>" in text for slug in contents)
    assert "<input type='checkbox' id='claims-not-held'>" in text
    # figures grouped by topic, each captioned by what it shows and opening full size
    if importlib.util.find_spec("matplotlib") is None:
        return  # no figures without the plots extra
    assert "<h3>Rate-distortion: error against bits per value (proofs)</h3>" in text
    assert re.search(r"<figcaption>Rate-distortion, rate_distortion \(#1[^)]*\) · <a href='"
                     r"[^']+/rate_distortion.png'>full size</a></figcaption>", text)


@needs_browser
def test_in_a_browser_the_contents_the_claims_filter_and_boards_that_fit(browser, tmp_path):
    """Issue 30's page points in a real browser at 1400 px: every contents link lands on its
    section, "only the claims not held" leaves exactly those, no table pushes the page wider than
    the window, and every figure's "full size" link opens a loaded image."""
    run = load_results(SMALL_RESULTS)
    verdicts = [claim.verdict for case in run.cases for claim in case.claims or []]
    assert "held" in verdicts and set(verdicts) - {"held"}  # both kinds to filter
    page, _ = _site(tmp_path, run, run.model_copy(deep=True))
    browser.open(page.as_uri())
    assert browser.errors == []
    links = browser.js("[...document.querySelectorAll('#contents a')].map(a => a.hash)")
    assert {"#runs", "#claims", "#cases"} <= set(links)
    for link in links:
        browser.js(f"document.querySelector('#contents a[href=\"{link}\"]').click()")
        assert browser.js("location.hash") == link
        top = browser.js(f"document.querySelector('{link}').getBoundingClientRect().top")
        at_bottom = browser.js("window.innerHeight + window.scrollY >= "
                               "document.documentElement.scrollHeight - 2")
        assert abs(top) < 2 or at_bottom, (link, top)  # scrolled to it (or as far as it goes)
    shown = ("[...document.querySelectorAll('#claims tr[data-verdict]')]"
             ".filter(r => r.offsetParent !== null).map(r => r.dataset.verdict)")
    assert sorted(browser.js(shown)) == sorted(2 * verdicts)
    browser.js("(b => { b.checked = true; b.dispatchEvent(new Event('change')); })"
               "(document.getElementById('claims-not-held'))")
    assert sorted(browser.js(shown)) == sorted(2 * [v for v in verdicts if v != "held"])
    browser.js("(b => { b.checked = false; b.dispatchEvent(new Event('change')); })"
               "(document.getElementById('claims-not-held'))")
    assert len(browser.js(shown)) == 2 * len(verdicts)
    assert browser.js("window.innerWidth") == 1400
    assert browser.js("document.documentElement.scrollWidth") <= 1400
    full = browser.js("[...document.querySelectorAll('figcaption a')].map(a => a.href)")
    if importlib.util.find_spec("matplotlib") is not None:
        assert full
    for href in full:
        browser.open(href)
        assert browser.js("document.images.length === 1 && document.images[0].naturalWidth > 0")


# ------------------------------------------------------------ issue 48: what the page hides


def test_settings_name_what_differs_from_the_method_s_defaults(tmp_path):
    """The settings column read "-" for every method with one case on its board."""
    run = load_results(SMALL_RESULTS)
    intq = next(c for c in run.cases if c.id.startswith("perplexity/intq"))
    wider = intq.model_copy(deep=True, update={
        "id": intq.id + "-g64", "method_label": "intq-g64",
        "method_params": {**intq.method_params, "group_size": 64}})
    elsewhere = intq.model_copy(deep=True, update={
        "id": intq.id + "-plugin", "method": "tests.nowhere:Gone", "method_label": "gone"})

    def alone(method: str, **params):  # a method's one case, its settings built as a suite would
        return intq.model_copy(deep=True, update={
            "id": f"{intq.id}-{method}", "method": method, "method_label": method,
            "method_params": build_method(method, params).params()})

    run.cases = [c for c in run.cases if c.benchmark == "perplexity" and c.method != "intq"]
    run.cases += [intq, wider, elsewhere, alone("kivi"), alone("snapkv", ratio=0.25)]
    _, parsed = _site(tmp_path, run)
    settings = {cells[1]: cells[2] for _, cells, _ in _body_rows(parsed.tables["board-perplexity"])}
    assert settings["intq-g64"] == "group_size=64"  # the default is 32
    assert settings["intq-4bit-g32"] == "group_size=32"  # what tells it from intq-g64
    assert settings["snapkv"] == "ratio=0.25"  # alone on its board: "-" before
    assert settings["kivi"] == "defaults"
    assert settings["fp16"] == "dtype=float16"
    assert settings["gone"] == "-"  # settings not found here: nothing to compare with


def test_byte_ratio_columns_name_what_they_are_against(tmp_path):
    """identity's compression_ratio read 0.5 with nothing to say it is against 16-bit K/V."""
    run = load_results(SMALL_RESULTS)
    page, parsed = _site(tmp_path, run)
    head = parsed.tables["board-perplexity"][0][1]
    assert "compression_ratio × vs 16-bit K/V ↑" in head
    assert "retained_kv × vs the model's own cache ↓" in head
    note = page.read_text().split("id='leaderboard-perplexity'")[1].split("<table")[0]
    assert "a float32 model's own cache (identity) reads 0.5" in note


def test_an_unmet_goal_says_why(tmp_path):
    run = load_results(SMALL_RESULTS)
    case = next(c for c in run.cases if c.claims)
    goal = "needs the fused kernel, not written yet"
    case.claims[0] = case.claims[0].model_copy(update={"verdict": "unmet", "goal": goal})
    page, parsed = _site(tmp_path, run)
    verdicts = [cells[4] for _, cells, _ in _body_rows(parsed.tables["claims"])]
    assert f"unmet: {goal}" in verdicts
    assert f"unmet</span>: {goal}" in page.read_text()  # and in the case's details


def test_the_paired_verdicts_are_report_md_s(tmp_path):
    """Each method's verdict against identity, as report.md has it, summed up at the top of the
    page, its table folded below the summary."""
    paths = [ROOT / "reports/niah/results.json", ROOT / "reports/eviction/results.json"]
    runs = [load_results(path) for path in paths]
    page = build_site([(str(p), r) for p, r in zip(paths, runs)], tmp_path / "site").read_text()
    parsed = _Tables(page)
    summary = {cells[1]: cells for _, cells, _ in _body_rows(parsed.tables["paired-summary"])}
    assert set(summary) == {"niah", "perplexity"}
    titles = dict(re.findall(r"<tr><td>#(\d)</td><td><a href='#paired-\d-(\w+)'>", page))
    assert titles == {"1": "niah", "2": "perplexity"}
    row = page.split("<a href='#paired-1-niah'>niah</a>")[1].split("</tr>")[0]
    listed = dict(zip(("worse", "not separated", "better"),
                      re.findall(r"<td class='methods'(?: title='([^']*)')?>", row)))
    report = render_markdown(runs[0])
    table = report.split("### NIAH: against identity, on the same samples\n\n")[1].split("\n\n")[0]
    for line in table.splitlines()[2:]:
        method, scope, *_, verdict = [c.strip() for c in line.strip("|").split("|")]
        assert method in listed[verdict], (method, scope, verdict)
    # the folded table is report.md's, row for row
    folded = page.split("<details id='paired-1-niah' class='paired'>")[1].split("</details>")[0]
    assert folded.count("<tr>") == len(table.splitlines()) - 1  # its head and every row
    eviction = [c for c in runs[1].cases if isinstance(c.info.get("vs_plain"), dict)
                and c.method != "identity"]
    counts = re.findall(r"class='verdict (?:worse|not-separated|better)'>(\d+)</span>",
                        page.split("<a href='#paired-2-perplexity'>")[1].split("</tr>")[0])
    assert sum(map(int, counts)) == len(eviction)  # every method once, identity left out


@needs_browser
def test_in_a_browser_at_1400_px_the_page_leads_with_its_figures_and_every_table_fits(
        browser, tmp_path):
    """Issue 48: tables wider than the window (the ★ column off-screen at 1400 px), no figure
    at the top. Every fold opened, no table scrolls sideways, and the first viewport holds the
    figures and the paired summary."""
    paths = sorted(glob.glob(str(ROOT / "reports/*/results.json")))
    page = build_site([(p, load_results(p)) for p in paths], tmp_path / "site", link=True)
    browser.open(page.as_uri())
    assert browser.errors == []
    assert browser.js("window.innerWidth") == 1400
    browser.js("document.querySelectorAll('details').forEach(d => d.open = true)")
    wide = browser.js("[...document.querySelectorAll('.scroll')]"
                      ".filter(d => d.scrollWidth > d.clientWidth + 1)"
                      ".map(d => d.closest('section, details').id)")
    assert wide == [] and browser.js("document.documentElement.scrollWidth") <= 1400
    stars = browser.js("[...document.querySelectorAll('.star')].map(s => "
                       "s.getBoundingClientRect().right)")
    assert stars and max(stars) <= 1400  # the ★ column in the window
    browser.js("document.querySelectorAll('details').forEach(d => d.open = false)")
    top = "(s => document.querySelector(s).getBoundingClientRect().top)"
    assert browser.js(f"{top}('svg.chart')") < 600
    assert browser.js(f"{top}('#paired-summary')") < 2000
    browser.screenshot(tmp_path / "page.png")
