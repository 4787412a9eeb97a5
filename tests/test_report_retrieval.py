"""The ruler and niah report sections and figures, from synthetic results alone."""
from __future__ import annotations

import math

import pytest

from kvbench.benchmarks.reports import niah, ruler_plot
from kvbench.benchmarks.reports.niah import niah_heatmap_pngs, niah_section
from kvbench.benchmarks.reports.ruler import ruler_section
from kvbench.benchmarks.reports.ruler_plot import RULER_PNG, ruler_plot_png
from kvbench.benchmarks.reports.ruler_numbers import ruler_table
from kvbench.judge.intervals import wilson_interval
from kvbench.reportkit import figures as figure_kit
from kvbench.reportkit.figures import PlotUnavailable
from kvbench.report.markdown import render_markdown, write_reports
from kvbench.results import CaseResult, Metric, RunResult, SuiteRecord

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PYDOC = "pydoc text in place of RULER's Paul Graham essays"
NOISE = "noise (as RULER)"
HAYSTACK = {"niah_single_1": PYDOC, "vt": NOISE, "cwe": NOISE}

# Per-sample scores (4 samples, the same samples for every method) by (label, task, length).
SCORES = {
    ("identity", "niah_single_1", 4096): [100, 100, 100, 0],
    ("identity", "vt", 4096): [100, 100, 0, 0],
    ("identity", "niah_single_1", 8192): [100, 100, 100, 100],
    ("identity", "vt", 8192): [100, 0, 0, 0],
    ("snapkv-0.5", "niah_single_1", 4096): [100, 100, 0, 0],
    ("snapkv-0.5", "vt", 4096): [100, 100, 0, 0],
    ("snapkv-0.5", "niah_single_1", 8192): [100, 100, 100, 0],
    ("snapkv-0.5", "vt", 8192): [0, 0, 0, 0],
    ("snapkv-0.25", "niah_single_1", 4096): [100, 0, 0, 0],
    ("snapkv-0.25", "vt", 4096): [0, 0, 0, 0],
    ("snapkv-0.25", "niah_single_1", 8192): [100, 0, 0, 0],
    ("snapkv-0.25", "vt", 8192): [0, 0, 0, 0],
    # intq ran cwe at 4096, which identity did not: its mean has 3 tasks, its Δ 2
    ("intq-4bit", "niah_single_1", 4096): [100, 100, 0, 0],
    ("intq-4bit", "vt", 4096): [100, 0, 0, 0],
    ("intq-4bit", "cwe", 4096): [100, 100, 100, 100],
}
METHODS = {"identity": "identity", "snapkv-0.5": "snapkv", "snapkv-0.25": "snapkv",
           "intq-4bit": "intq"}
RATIOS = {("identity", 4096): 1.0, ("identity", 8192): 1.0,
          ("snapkv-0.5", 4096): 2.0, ("snapkv-0.5", 8192): 2.2,
          ("snapkv-0.25", 4096): 4.0, ("snapkv-0.25", 8192): 4.4,
          ("intq-4bit", 4096): 3.5}
DEPTHS = [0, 50, 100]
LENGTHS = [1024, 2048]


def _metric(value: float, unit: str = "", direction: str = "none") -> Metric:
    return Metric(value=value, unit=unit, direction=direction)


def ruler_case(label: str, task: str, length: int) -> CaseResult:
    scores = SCORES[(label, task, length)]
    mean = sum(scores) / len(scores)
    low, high = wilson_interval(mean, len(scores))
    return CaseResult(
        id=f"ruler/{label}/task={task},length={length}", benchmark="ruler",
        bench_params={"task": task, "length": length, "samples": 4, "data_seed": 0,
                      "compress": "context"},
        method=METHODS[label], method_label=label, method_params={}, model="tiny:llama",
        status="ok",
        metrics={"score": _metric(mean, "%", "higher"),
                 "score_ci_low": _metric(low, "%"), "score_ci_high": _metric(high, "%"),
                 "empty_predictions": _metric(0, "count"),
                 "compression_ratio": _metric(RATIOS[(label, length)], "x", "higher")},
        info={"scores": scores, "haystack": HAYSTACK[task], "metric": "string_match_all",
              "prompt_tokens": length - 100, "codec_reads": "decoded"},
        comparable={"prompts_sha256": f"{task}@{length}"})  # every method draws the same


def niah_case(label: str, method: str, ratio: float, scores: list[list[float]]) -> CaseResult:
    """One sample a cell, recorded as before info["scores"]: the grid holds the samples."""
    mean = sum(map(sum, scores)) / sum(map(len, scores))
    return CaseResult(
        id=f"niah/{label}", benchmark="niah",
        bench_params={"lengths": LENGTHS, "depths": DEPTHS, "samples": 1},
        method=method, method_label=label, method_params={}, status="ok",
        metrics={"score": _metric(mean, "%", "higher"), "score_ci_low": _metric(10.0, "%"),
                 "score_ci_high": _metric(90.0, "%"),
                 "compression_ratio": _metric(ratio, "x", "higher")},
        info={"grid": {"lengths": LENGTHS, "depths": DEPTHS, "scores": scores},
              "haystack": PYDOC},
        comparable={"prompts_sha256": "the grid's needles"})


def run(cases: list[CaseResult]) -> RunResult:
    return RunResult(kvbench_version="0.1.0", git_sha=None, machine={"key": "test"},
                     suite=SuiteRecord(name="retrieval", path="retrieval.yaml", hash="0" * 64,
                                       resolved={}),
                     started="2026-01-01T00:00:00+00:00", cases=cases)


# depth rows, length columns: 0% depth is the first row
IDENTITY_GRID = [[100, 100], [100, 0], [100, 100]]
SNAP_GRID = [[100, 0], [0, 0], [50, 100]]


@pytest.fixture
def result() -> RunResult:
    # snapkv-0.25 first, so identity's coming first in the tables is the section's doing
    order = ["snapkv-0.25", "identity", "snapkv-0.5", "intq-4bit"]
    cases = [ruler_case(label, task, length) for label in order
             for (lab, task, length) in SCORES if lab == label]
    failed = ruler_case("snapkv-0.25", "vt", 8192).model_copy(
        update={"id": "ruler/snapkv-0.25/cwe", "status": "error", "metrics": {},
                "bench_params": {"task": "cwe", "length": 8192, "samples": 4, "data_seed": 0,
                                 "compress": "context"}})
    cases.append(failed)
    cases += [niah_case("identity", "identity", 1.0, IDENTITY_GRID),
              niah_case("snapkv 0.5/ctx", "snapkv", 2.0, SNAP_GRID)]
    return run(cases)


def _row(text: str, label: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_headline_mean_and_pooled_wilson_interval(result):
    table = ruler_table(result)
    assert [row.name for row in table.rows] == ["identity", "snapkv-0.25", "snapkv-0.5",
                                                "intq-4bit"]
    head = table.rows[0].headline[4096]
    assert head.mean == pytest.approx(62.5) and head.samples == 8  # (75 + 50) / 2, 2 tasks x 4
    # Wilson at p = 0.625, n = 8
    assert (head.low, head.high) == pytest.approx((30.574239, 86.315571), abs=1e-5)
    section = ruler_section(result)
    identity = _row(section, "identity")
    assert identity == ["identity", "62.5 [30.6–86.3]", "(reference)", "62.5 [30.6–86.3]",
                        "(reference)", "1.00"]
    # snapkv-0.5: 4096 (50 + 50) / 2, Δ -12.5; 8192 (75 + 0) / 2 = 37.5, Δ -25; ratio (2 + 2.2) / 2
    snap = _row(section, "snapkv-0.5")
    assert snap[1].startswith("50.0 [") and snap[2] == "−12.5"
    assert snap[3].startswith("37.5 [") and snap[4] == "−25.0" and snap[5] == "2.10"


def test_delta_is_paired_over_the_cells_identity_ran(result):
    head = ruler_table(result).rows[3].headline[4096]
    assert head.tasks == ["niah_single_1", "vt", "cwe"] and head.delta_tasks == ["niah_single_1", "vt"]
    # mean over 3 tasks (50 + 25 + 100) / 3; n = 12 samples
    assert head.mean == pytest.approx(175 / 3) and head.samples == 12
    assert (head.low, head.high) == pytest.approx((31.951131, 80.673969), abs=1e-5)
    # per-sample differences on niah_single_1 and vt only: (0 + 0 - 100 + 0 + 0 - 100 + 0 + 0) / 8.
    # Over its own 3 tasks it would be 58.3 - 62.5 = -4.2.
    assert head.delta == pytest.approx(-25.0)
    intq = _row(ruler_section(result), "intq-4bit")
    assert intq[1] == "58.3 [32.0–80.7]" and intq[2] == "−25.0 (2 of 3 tasks)"
    assert intq[3:5] == ["—", "—"]  # it did not run 8192


def test_tasks_covered_line_names_each_methods_tasks(result):
    section = ruler_section(result)
    (line,) = [line for line in section.splitlines() if "each mean covers" in line]
    assert ("identity, snapkv-0.25, snapkv-0.5: 2 tasks (niah_single_1, vt) at every length"
            in line)
    assert "intq-4bit: 1 tasks" not in line
    assert "intq-4bit: 3 tasks (niah_single_1, vt, cwe) at length 4K" in line
    assert "a difference that falls inside the intervals is not a difference" in line
    same = run([c for c in result.cases if c.method_label != "intq-4bit"])
    (line,) = [line for line in ruler_section(same).splitlines() if "Each mean is over" in line]
    assert "Each mean is over the same 2 tasks (niah_single_1, vt) at every length." in line


def _per_length(section: str) -> dict[str, list[str]]:
    """The per-task part of a ruler section by its `#### <length> tokens` heading: the lines
    after each heading, up to the next heading or the haystacks line."""
    per_task = section[section.index("### RULER: score per task"):]
    tables: dict[str, list[str]] = {}
    for block in per_task.split("\n#### ")[1:]:
        heading, _, body = block.partition("\n")
        assert heading.endswith(" tokens")
        tables[heading.removesuffix(" tokens")] = [
            line for line in body.splitlines() if line and not line.startswith("<sub>Haystacks")]
    return tables


def test_per_task_table_per_length_and_haystacks(result):
    section = ruler_section(result)
    assert "identity's column is the full cache, the reference" in section
    tables = _per_length(section)
    assert list(tables) == ["4K", "8K"]  # one table per length, in order
    small, large = tables["4K"], tables["8K"]
    # rows are tasks in the run's order, columns the methods with identity first
    assert _row("\n".join(small), "task") == ["task", "identity", "snapkv-0.25", "snapkv-0.5",
                                                "intq-4bit"]
    assert [line.split("|")[1].strip() for line in small[2:5]] == ["niah_single_1", "vt", "cwe"]
    assert _row("\n".join(small), "niah_single_1") == [
        "niah_single_1", "75.0 [30.1–95.4]", "25.0 [4.6–69.9]", "50.0 [15.0–85.0]",
        "50.0 [15.0–85.0]"]
    assert _row("\n".join(small), "cwe") == ["cwe", "—", "—", "—", "100.0 [51.0–100.0]"]
    assert small[-1] == "<sub>4 samples per cell.</sub>"
    # intq-4bit ran nothing at 8K: no column, said under the table
    assert _row("\n".join(large), "task") == ["task", "identity", "snapkv-0.25", "snapkv-0.5"]
    assert _row("\n".join(large), "vt") == [
        "vt", "25.0 [4.6–69.9]", "0.0 [0.0–49.0]", "0.0 [0.0–49.0]"]
    # cwe@8K: snapkv-0.25's case failed (its status), the others did not run it (—)
    assert _row("\n".join(large), "cwe") == ["cwe", "—", "error", "—"]
    assert large[-1] == "<sub>4 samples per cell; not run at 8K: intq-4bit.</sub>"
    assert "niah_single_1@" not in section  # no task@length columns any more
    assert ("<sub>Haystacks: niah_single_1: pydoc text in place of RULER's Paul Graham essays"
            " · vt, cwe: noise (as RULER)</sub>") in section


def test_per_task_samples_per_cell_when_they_differ(result):
    cases = list(result.cases)
    i = next(i for i, c in enumerate(cases)
             if (c.method_label, c.bench_params.get("task"), c.bench_params.get("length"))
             == ("intq-4bit", "vt", 4096))
    fewer = cases[i].model_copy(deep=True)
    fewer.info["scores"] = [100, 0, 0]
    fewer.metrics.pop("score_ci_low")
    fewer.metrics.pop("score_ci_high")
    fewer.metrics["score"] = _metric(100 / 3, "%", "higher")
    cases[i] = fewer
    small, large = _per_length(ruler_section(run(cases))).values()
    assert _row("\n".join(small), "vt")[-1] == "33.3 [6.1–79.2] (n=3)"  # Wilson, n = 3
    assert _row("\n".join(small), "niah_single_1")[1] == "75.0 [30.1–95.4] (n=4)"
    assert small[-1] == "<sub>samples per cell differ: n in each cell.</sub>"
    assert large[-1].startswith("<sub>4 samples per cell;")  # each length says its own


def test_no_section_without_ok_ruler_cases(result):
    assert ruler_section(run([c for c in result.cases if c.benchmark != "ruler"])) is None
    errored = [c.model_copy(update={"status": "error"}) for c in result.cases]
    assert ruler_section(run(errored)) is None and niah_section(run(errored)) is None
    assert ruler_plot.ruler_plot_data(run(errored)) is None


def test_ruler_plot_lines_by_registry_name(result, tmp_path):
    pytest.importorskip("matplotlib")
    path = ruler_plot_png(result, tmp_path / RULER_PNG)
    assert path == tmp_path / RULER_PNG and path.read_bytes()[:8] == PNG_MAGIC
    assert [p.name for p in tmp_path.iterdir()] == [RULER_PNG]  # no temp file left
    plot = path.plot
    assert [panel.length for panel in plot.panels] == [4096, 8192]
    small, large = plot.panels
    assert small.identity == pytest.approx(62.5) and large.identity == pytest.approx(62.5)
    assert small.identity_ci == pytest.approx((30.574239, 86.315571), abs=1e-5)
    lines = {line.method: line for line in small.lines}
    assert list(lines) == ["snapkv", "intq"]  # identity is the dashed line, not a line
    assert [line.family for line in small.lines] == ["snapkv", "intq"]  # their colours
    snap = lines["snapkv"]  # two ratios: one line of two points, in order of ratio
    assert snap.labels == ["snapkv-0.5", "snapkv-0.25"] and snap.x == [2.0, 4.0]
    assert snap.y == pytest.approx([50.0, 12.5])
    assert all(lo <= y <= hi for lo, y, hi in zip(snap.low, snap.y, snap.high))
    assert lines["intq"].x == [3.5] and lines["intq"].y == pytest.approx([175 / 3])
    # at 8192 the ratios are that length's, intq has no point
    assert [(line.method, line.x) for line in large.lines] == [("snapkv", [2.2, 4.4])]
    assert plot.n_points == 5
    assert ruler_plot_png(run(result.cases[-2:]), tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_niah_heatmaps_depth_rows_length_columns(result, tmp_path):
    pytest.importorskip("matplotlib")
    paths = niah_heatmap_pngs(result, tmp_path)
    assert [p.name for p in paths] == ["niah_identity.png", "niah_snapkv_0.5_ctx.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in paths]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths)
    heat = paths[1].plot
    assert heat.depths == [0, 50, 100] and heat.lengths == [1024, 2048]
    assert heat.scores == SNAP_GRID  # row = depth (0% first: the top), column = length
    assert heat.scores[2][1] == 100  # depth 100%, length 2048
    assert heat.title == "snapkv 0.5/ctx — KV compression 2.00x vs 16-bit"


def test_the_ruler_figure_names_its_variants_and_ticks_a_narrow_axis(result, tmp_path,
                                                                     monkeypatch):
    """The legend showed families (intq), the log axis one tick when the ratios spanned less
    than a factor of two."""
    pytest.importorskip("matplotlib")
    figures = []
    monkeypatch.setattr(figure_kit, "save_png", lambda fig, path: figures.append(fig))
    narrow = run([c for c in result.cases if c.method_label in ("identity", "snapkv-0.5", "intq")])
    ruler_plot_png(narrow, tmp_path / RULER_PNG)
    (fig,) = figures
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert "snapkv-0.5" in legend and "snapkv" not in legend
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    shown = [t for t in ax.xaxis.get_majorticklocs() if low <= t <= high]
    assert len(shown) >= 2, (low, high, shown)


def test_niah_heatmaps_are_readable_by_red_green_colour_blind_readers(result, tmp_path,
                                                                      monkeypatch):
    """Red to green (RdYlGn) loses its meaning for the commonest colour blindness: the map is
    cividis, made to read the same with it, dark to light as the score rises."""
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    used = []
    imshow = Axes.imshow
    monkeypatch.setattr(Axes, "imshow", lambda self, data, cmap=None, **kw: (
        used.append(cmap.name), imshow(self, data, cmap=cmap, **kw))[1])
    niah_heatmap_pngs(result, tmp_path)
    assert used == ["cividis", "cividis"]


def test_niah_grid_sorted_and_gaps_kept(result):
    case = result.cases[-1].model_copy(deep=True)
    case.info["grid"] = {"lengths": [2048, 1024], "depths": [100, 0],
                         "scores": [[10, 20], [30, None]]}
    case.model = "tiny:llama"
    heat = niah.niah_heatmap_data(case)
    assert heat.lengths == [1024, 2048] and heat.depths == [0, 100]
    assert heat.scores[1] == [20, 10] and math.isnan(heat.scores[0][0]) and heat.scores[0][1] == 30
    assert heat.title.endswith("\n(tiny:llama)")  # its own line: narrow grids cut it off


def test_niah_cell_text_readable_on_the_dark_ends():
    plt = pytest.importorskip("matplotlib.pyplot")
    cmap = plt.get_cmap("RdYlGn")
    assert [niah._ink_on(cmap(v / 100)) for v in (0, 50, 100)] == ["white", "black", "white"]


def test_niah_file_names_are_safe_and_distinct(result):
    cases = [c.model_copy(update={"method_label": label}) for c, label in
             zip(result.cases[-2:] * 2, ["a/b c", "a?b c", "...", "intq-4bit"])]
    assert niah.niah_file_names(cases) == ["niah_a_b_c.png", "niah_a_b_c-2.png",
                                                "niah_case.png", "niah_intq-4bit.png"]


def test_niah_section_table(result):
    text = niah_section(result)
    assert _row(text, "identity") == ["identity", f"{250 / 3:.1f} [10.0–90.0]", "1.00"]
    assert _row(text, "snapkv 0.5/ctx")[2] == "2.00"
    assert "grid: lengths 1024, 2048 tokens × depths 0, 50, 100%" in text
    assert f"haystack: {PYDOC}" in text


def test_report_places_sections_and_is_the_same_with_or_without_out_dir(result, tmp_path):
    pytest.importorskip("matplotlib")
    path = write_reports(result, tmp_path / "out")
    text = path.read_text()
    assert render_markdown(result) == text  # what `kvbench report RESULTS` prints
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "niah_identity.png", "niah_snapkv_0.5_ctx.png", "report.md", RULER_PNG]
    at = text.index
    assert (at("## ruler") < at("### RULER: mean score") < at("### RULER: score per task")
            < at(f"]({RULER_PNG})") < at("## niah") < at("](niah_identity.png)")
            < at("](niah_snapkv_0.5_ctx.png)"))
    assert "![needle in a haystack: snapkv 0.5/ctx](niah_snapkv_0.5_ctx.png)" in text
    assert write_reports(result, tmp_path / "out").read_text() == text  # deterministic


def test_missing_matplotlib_is_a_note(result, tmp_path, without_matplotlib):
    with pytest.raises(PlotUnavailable):
        ruler_plot_png(result, tmp_path / RULER_PNG)
    with pytest.raises(PlotUnavailable):
        niah_heatmap_pngs(result, tmp_path)
    assert list(tmp_path.iterdir()) == []
    text = write_reports(result, tmp_path / "out").read_text()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["report.md"]
    assert sum("RULER plot skipped: matplotlib is not installed" in line
               for line in text.splitlines()) == 1
    assert sum("needle heatmaps skipped: matplotlib is not installed" in line
               for line in text.splitlines()) == 1
    assert ".png)" not in text
    assert "### RULER: mean score" in text  # the tables do not need matplotlib
    assert render_markdown(result) == text


def test_a_setting_that_varies_within_a_cell_splits_the_row(result):
    both = [c for c in result.cases if c.benchmark == "ruler" and c.status == "ok"]
    question = [c.model_copy(update={"bench_params": {**c.bench_params,
                                                      "compress": "context+question"}})
                for c in both if c.method_label == "snapkv-0.5"]
    for case in question:  # it keeps every answer when it sees the question first
        case.info = {**case.info, "scores": SCORES[("identity", *(
            case.bench_params[k] for k in ("task", "length")))]}
        case.metrics = {**case.metrics, "score": _metric(
            sum(case.info["scores"]) / 4, "%", "higher")}
    table = ruler_table(run(both + question))
    names = [row.name for row in table.rows]
    assert names[:3] == ["identity (compress=context)", "snapkv-0.25 (compress=context)",
                         "snapkv-0.5 (compress=context)"]
    assert "snapkv-0.5 (compress=context+question)" in names
    split = table.rows[names.index("snapkv-0.5 (compress=context+question)")]
    assert split.headline[4096].delta == 0.0 and split.headline[4096].mean == 62.5
    # per-task samples that differ between tasks do not split rows
    fewer = [c.model_copy(update={"bench_params": {**c.bench_params, "samples": 3}})
             if c.bench_params["task"] == "vt" else c for c in both]
    assert [row.name for row in ruler_table(run(fewer)).rows] == [
        "identity", "snapkv-0.25", "snapkv-0.5", "intq-4bit"]


def test_no_delta_against_identity_on_other_samples(result):
    cases = [c if c.method_label != "snapkv-0.5" else c.model_copy(
        update={"bench_params": {**c.bench_params, "data_seed": 1}}) for c in result.cases]
    row = next(r for r in ruler_table(run(cases)).rows if r.name == "snapkv-0.5")
    assert row.headline[4096].delta is None and row.headline[4096].delta_tasks == []
    assert _row(ruler_section(run(cases)), "snapkv-0.5")[2] == "—"


def test_methods_at_fewer_lengths_with_the_same_tasks_are_said_to_cover_the_same(result):
    # snapkv-0.5 left out at 8K only: every method that ran a length ran the same tasks there
    cases = [c for c in result.cases if c.method_label != "intq-4bit" and c.status == "ok"
             and not (c.method_label == "snapkv-0.5" and c.bench_params["length"] == 8192)]
    (line,) = [line for line in ruler_section(run(cases)).splitlines() if "covers" in line]
    assert ("Every method that ran a length covers the same tasks there: 2 tasks"
            " (niah_single_1, vt) at every length." in line)
    assert "different" not in line


def _against_identity(section: str) -> dict[tuple[str, str], list[str]]:
    """The pooled table of a section's "against identity" part by (method, scope)."""
    part = section[section.index("against identity, on the same samples"):]
    table = part[:part.index("\n\n<sub>")].splitlines()[4:]  # heading, blank, header, rule
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    return {(row[0], row[1]): row[2:] for row in rows}


def test_ruler_against_identity_per_length_pooling_the_tasks(result):
    section = ruler_section(result)
    assert (section.index("### RULER: mean score") < section.index(
        "### RULER: against identity, on the same samples") < section.index(
        "### RULER: score per task"))
    rows = _against_identity(section)
    assert list(rows) == [("snapkv-0.25", "4K"), ("snapkv-0.25", "8K"), ("snapkv-0.5", "4K"),
                          ("snapkv-0.5", "8K"), ("intq-4bit", "4K")]
    # snapkv-0.25 at 4K: niah_single_1 100,100,100,0 -> 100,0,0,0 and vt 100,100,0,0 -> 0s:
    # 4 losses, no win of 8 pairs: p = 2 / 2^4
    pairs, record, delta, p, verdict = rows[("snapkv-0.25", "4K")]
    assert (pairs, record, p, verdict) == ("8", "0 / 4", "0.125", "not separated")
    assert delta.startswith("−50.0 [")
    # snapkv-0.5 at 4K: one loss (niah_single_1's third sample), the rest ties; its Δ as the
    # headline's
    assert rows[("snapkv-0.5", "4K")][:2] == ["8", "0 / 1"]
    assert rows[("snapkv-0.5", "4K")][2].startswith("−12.5 [")
    assert rows[("snapkv-0.5", "4K")][3:] == ["1.000", "not separated"]
    # intq-4bit's cwe has no identity case: its 8 pairs are niah_single_1's and vt's
    assert rows[("intq-4bit", "4K")][:2] == ["8", "0 / 2"]
    assert "ties dropped; worse or better when p < 0.05" in section
    assert ("Per task and length: at most 4 pairs a cell, and the sign test separates nothing "
            "on fewer than 6") in section
    assert "<details>" not in section


def test_ruler_against_identity_separates_and_shows_cells_with_pairs_enough(result):
    cases = list(result.cases)
    for i, case in enumerate(cases):  # vt at 4K with 8 samples: identity all, snapkv-0.25 none
        if (case.bench_params.get("task"), case.bench_params.get("length")) == ("vt", 4096):
            found = 100.0 if case.method_label == "identity" else 0.0
            cases[i] = case.model_copy(update={"info": {**case.info, "scores": [found] * 8}})
    section = ruler_section(run(cases))
    rows = _against_identity(section)
    # niah_single_1's 4 pairs and vt's 8 at 4K: 2 + 8 losses of 12 pairs, p = 2 / 2^10
    assert rows[("snapkv-0.25", "4K")][:2] == ["12", "0 / 10"]
    assert rows[("snapkv-0.25", "4K")][3:] == ["0.002", "worse"]
    cells = section[section.index("<details><summary>Per task and length</summary>"):]
    assert ("| snapkv-0.25 | 4K · vt | 8 | 0 / 8 | −100.0 [−100.0, −100.0] | 0.008 | worse |"
            in cells)
    assert "| snapkv-0.25 | 4K · niah_single_1 | 4 | 0 / 2 |" in cells


def test_ruler_against_identity_on_other_samples_is_not_paired(result):
    cases = [c.model_copy(update={"comparable": {"prompts_sha256": "other"}})
             if (c.method_label, c.bench_params.get("task")) == ("snapkv-0.5", "vt") else c
             for c in result.cases]
    table = ruler_table(run(cases))
    head = table.rows[2].headline[4096]
    assert head.delta_tasks == ["niah_single_1"] and head.unpaired_tasks == ["vt"]
    assert head.delta == pytest.approx(-25.0)  # over niah_single_1's 4 samples only
    rows = _against_identity(ruler_section(run(cases)))
    assert rows[("snapkv-0.5", "4K")][0] == "4 (not paired: different samples: vt)"
    everything = [c.model_copy(update={"comparable": {"prompts_sha256": "other"}})
                  if c.method_label == "snapkv-0.5" else c for c in result.cases]
    rows = _against_identity(ruler_section(run(everything)))
    assert rows[("snapkv-0.5", "8K")] == ["—"] * 4 + ["not paired: different samples"]


def test_niah_against_identity_per_length_and_over_the_grid(result):
    pytest.importorskip("matplotlib", reason="the section links its figures (the plots extra)")
    text = niah_section(result)
    assert text.index("### NIAH: against identity") < text.index("](niah_identity.png)")
    rows = _against_identity(text)
    assert list(rows) == [("snapkv 0.5/ctx", "1K"), ("snapkv 0.5/ctx", "2K"),
                          ("snapkv 0.5/ctx", "all lengths")]
    # identity's columns 100,100,100 and 100,0,100; snapkv's 100,0,50 and 0,0,100
    assert [row[:2] for row in rows.values()] == [["3", "0 / 2"], ["3", "0 / 1"],
                                                 ["6", "0 / 3"]]
    assert [row[2].split(" [")[0] for row in rows.values()] == ["−50.0", "−33.3", "−41.7"]
    assert [row[3] for row in rows.values()] == ["0.500", "1.000", "0.250"]
    assert "A pair is one needle (a depth's sample at a length)" in text


def test_niah_pairs_its_flat_per_sample_scores_by_length(result):
    identity, snap = (c.model_copy(deep=True) for c in result.cases[-2:])
    for case, found in ((identity, 100.0), (snap, 0.0)):
        case.bench_params["samples"] = 2
        # by length, then depth, then sample: 1K's six needles, then 2K's
        case.info["scores"] = [100.0] * 6 + [found] * 6
    rows = _against_identity(niah_section(run([identity, snap])))
    assert rows[("snapkv 0.5/ctx", "1K")][:2] == ["6", "0 / 0"]
    assert rows[("snapkv 0.5/ctx", "2K")][:2] == ["6", "0 / 6"]
    assert rows[("snapkv 0.5/ctx", "2K")][-1] == "worse"
    snap.comparable["prompts_sha256"] = "other needles"
    rows = _against_identity(niah_section(run([identity, snap])))
    assert {row[-1] for row in rows.values()} == {"not paired: different samples"}
    del identity.info["scores"]  # two samples a cell: the grid's means cannot be paired
    assert "against identity" not in niah_section(run([identity, snap.model_copy(
        update={"comparable": identity.comparable})]))
