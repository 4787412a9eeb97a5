"""The ladder's part of the report: each method against identity at every rung (e2e x, peak x,
retained KV x, as seed 003 tabulates them), the absolute figures at the top rung, whether each
method's saving is physical or only logical and why, and two figures: the ratios against context
length, and the top rung's peak split into weights, KV and the rest; and its leaderboard's
columns."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvbench.benchmarks.records.ladder import LadderRecord
from kvbench.reportkit.benchmark import BenchmarkReport, Board
from kvbench.reportkit.figures import (
    PlotPath, figure_text, line_styles, method_family, pyplot, save_png, xy_lines,
)
from kvbench.reportkit.tables import (
    fmt_bytes, join_blocks, length_name, md_table, ok_cases, pair_key,
)
from kvbench.results import CaseResult, RunResult

BENCHMARK = "ladder"
REFERENCE = "identity"
RATIOS_PNG = "ladder_ratios.png"
PEAK_SPLIT_PNG = "ladder_peak_split.png"
# (metric, column name): the ratios against the same rung's identity case
RATIOS = (("e2e_s", "e2e ×"), ("peak_bytes", "peak ×"), ("retained_kv_bytes", "retained KV ×"),
          ("kv_high_water_bytes", "cache high-water ×"))
# Share of the KV bytes saved that the peak must also save to call a compression physical.
PHYSICAL_SHARE = 0.5


@dataclass
class Rung:
    case: CaseResult
    reference: CaseResult | None

    def value(self, metric: str) -> float | None:
        metric_ = self.case.metrics.get(metric)
        return None if metric_ is None else metric_.value

    def ratio(self, metric: str) -> float | None:
        mine = self.value(metric)
        ref = None if self.reference is None else self.reference.metrics.get(metric)
        if mine is None or ref is None or ref.value == 0:
            return None
        return mine / ref.value


@dataclass
class LadderTable:
    lengths: list[int]
    methods: list[str]  # labels, identity first
    rungs: dict[str, dict[int, Rung]] = field(default_factory=dict)
    beyond: int | None = None  # the first rung past the model's trained context

    @property
    def top(self) -> int:
        return self.lengths[-1]


def ladder_table(result: RunResult) -> LadderTable | None:
    cases = ok_cases(result, BENCHMARK)
    if not cases:
        return None
    identity = {pair_key(c, ()): c for c in cases if c.method_label == REFERENCE}
    labels = list(dict.fromkeys(c.method_label for c in cases))
    labels.sort(key=lambda label: label != REFERENCE)
    table = LadderTable(sorted({_length(c) for c in cases}), labels)
    for case in cases:
        rung = Rung(case, identity.get(pair_key(case, ())))
        table.rungs.setdefault(case.method_label, {})[_length(case)] = rung
        if LadderRecord.of(case).beyond_trained_context:
            table.beyond = min(table.beyond or _length(case), _length(case))
    return table


def _length(case: CaseResult) -> int:
    return int(case.bench_params["length"])


def _x(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if value < 0.1 else f"{value:.2f}"


def verdict(rung: Rung) -> tuple[str, str]:
    """(physical | partly | logical | reference | —, why) of one method at one rung, from what
    the peak saved against what the KV saved, and what the cache held at its largest."""
    if rung.case.method_label == REFERENCE:
        return "reference", ""
    ref = rung.reference
    names = ("peak_bytes", "retained_kv_bytes", "kv_high_water_bytes", "loaded_bytes")
    try:
        peak, kept, high, loaded = (rung.case.metrics[n].value for n in names)
        ref_peak, ref_kept, ref_high = (ref.metrics[n].value for n in names[:3])
    except (AttributeError, KeyError):  # no identity case at this rung, or an older record
        return "—", "no identity figures at this rung"
    kv_saved, peak_saved = ref_kept - kept, ref_peak - peak
    if kv_saved <= 0:
        return "—", "keeps as many bytes as identity"
    share = peak_saved / kv_saved
    held = high / ref_high
    others = peak - loaded - high
    if held >= 0.9:
        why = f"the cache held {held:.2f}× the plain bytes before end_prefill compressed it"
    else:
        why = f"the cache never held more than {held:.2f}× the plain bytes"
    why += (f"; the case's peak above the loaded model and the cache at its largest is"
            f" {fmt_bytes(others)} (attention temporaries, decoded copies, scores)")
    saving = (f"peak saves {share:.0%} of the {fmt_bytes(kv_saved)} the KV saves"
              if peak_saved >= 0 else f"the peak is {fmt_bytes(-peak_saved)} above identity's"
              f" although the KV saves {fmt_bytes(kv_saved)}")
    if share >= PHYSICAL_SHARE:
        return "physical", f"{saving}; {why}"
    return ("partly" if share > 0.1 else "logical"), f"{saving}; {why}"


def ladder_section(result: RunResult) -> str | None:
    table = ladder_table(result)
    if table is None:
        return None
    first = next(iter(table.rungs[table.methods[0]].values())).case
    params, peak = first.bench_params, LadderRecord.of(first).peak_memory
    lines = [
        f"Each rung: a {params.get('text')} prompt of `length` tokens fed in forwards of"
        f" {params.get('prefill_chunk')} tokens (only the last logits kept), end_prefill, then"
        f" {params.get('decode')} greedy tokens, all through the method's cache. Peak:"
        f" {'?' if peak is None else peak}. Ratios are against identity at the same rung"
        " in this run (lower is better in every column).",
    ]
    if table.beyond is not None:
        lines.append(f"Rungs from {length_name(table.beyond)} are past the model's trained"
                     " context: they measure time and memory only, and say nothing of quality.")
    parts = ["### Against identity at each rung", " ".join(lines)]
    for metric, name in RATIOS:
        rows = []
        for label in table.methods[1:]:
            rungs = table.rungs[label]
            rows.append([label] + [_x(rungs[n].ratio(metric)) if n in rungs else "—"
                                   for n in table.lengths])
        if rows:
            header = [f"{name} ↓"] + [length_name(n) for n in table.lengths]
            parts.append(md_table(header, rows, right=set(range(1, len(header)))))
    parts.append(_top_rung(table))
    parts.append(_decode_against_plain(table, result))
    return join_blocks(parts)


def _joining_identity(case: CaseResult) -> bool:
    """identity joined at every step, as DynamicCache grows: storage concat, or recorded before
    identity had a storage (no key: it always joined then; unset, None, is the buffer)."""
    return case.method == REFERENCE and case.method_params.get("storage", "concat") == "concat"


def _decode_against_plain(table: LadderTable, result: RunResult) -> str | None:
    """At the top rung, each method's decode rate against identity (written in place) and, where
    the run has it, identity joined at every step; and against the bytes bound: what a step
    reads of identity's (weights and KV) over what it reads of the method's, the most a decode
    bound by memory could gain."""
    top = table.top
    reference = table.rungs.get(REFERENCE, {}).get(top)
    if reference is None:
        return None
    joined = next((c for c in ok_cases(result, BENCHMARK) if _joining_identity(c)
                   and _length(c) == top and c.method_label != REFERENCE), None)
    rows = []
    for label in table.methods[1:]:
        rung = table.rungs[label].get(top)
        if rung is None or _joining_identity(rung.case):
            continue
        v = rung.value
        weights, mine = v("weights_bytes"), v("retained_kv_bytes")
        speed = rung.ratio("decode_tok_s")
        if weights is None or mine is None or speed is None:
            continue
        bound = (weights + reference.value("retained_kv_bytes")) / (weights + mine)
        row = [label, f"{v('decode_tok_s'):.2f}", _x(speed)]
        if joined is not None:
            row.append(_x(v("decode_tok_s") / joined.metrics["decode_tok_s"].value))
        rows.append(row + [_x(bound), f"{speed / bound:.0%}"])
    if not rows:
        return None
    how = ("joined at every step: recorded before identity kept a buffer"
           if _joining_identity(reference.case) else "its cache written in place")
    note = f"Decode tok/s against identity ({how})"
    header = ["method", "decode tok/s", "× identity ↑"]
    if joined is not None:
        note += (f" and against {joined.method_label}, joined at every step as transformers'"
                 " DynamicCache grows")
        header.append(f"× {joined.method_label} ↑")
    note += (". The bytes bound is what a step reads of identity's (weights and KV) over what"
             " it reads of the method's: the most a decode bound by memory could gain; the last"
             " column is the share of it reached.")
    header += ["bytes bound", "of the bound"]
    return (f"### Decode at {length_name(top)} tokens against the plain caches\n\n{note}\n\n"
            + md_table(header, rows, right=set(range(1, len(header)))))


def _top_rung(table: LadderTable) -> str:
    top = table.top
    header = ["method", "prefill s", "decode tok/s", "e2e s", "peak", "over loaded",
              "weights", "KV retained", "cache high-water", "saving", "why"]
    rows = []
    for label in table.methods:
        rung = table.rungs[label].get(top)
        if rung is None:
            continue
        v = rung.value
        kind, why = verdict(rung)
        rows.append([label, f"{v('prefill_s'):.1f}", f"{v('decode_tok_s'):.2f}",
                     f"{v('e2e_s'):.1f}", fmt_bytes(v("peak_bytes")),
                     fmt_bytes(v("peak_over_loaded_bytes")), fmt_bytes(v("weights_bytes")),
                     fmt_bytes(v("retained_kv_bytes")), fmt_bytes(v("kv_high_water_bytes")),
                     kind, why])
    note = (f"A saving is *physical* when the peak falls by at least {PHYSICAL_SHARE:.0%} of the"
            " bytes the KV falls by, *logical* when the bytes fall and the peak does not (under"
            " 10%), *partly* between. `cache high-water` is the most the cache's arrays held"
            " after any forward.")
    return (f"### At {length_name(top)} tokens\n\n{note}\n\n"
            + md_table(header, rows, right=set(range(1, 9))))


# ---------------------------------------------------------------------------------------------
# figures


def ladder_figures(result: RunResult, out_dir: Path | None) -> str | None:
    """The figures' links (written to out_dir when given), a note without matplotlib, or None
    when there is no ladder."""
    def draw(table: LadderTable, folder: Path) -> None:
        ladder_ratios_png(table, folder / RATIOS_PNG, result.suite.name)
        ladder_peak_split_png(table, folder / PEAK_SPLIT_PNG, result.suite.name)

    return figure_text(
        ladder_table(result), out_dir, draw,
        f"![e2e, peak and retained KV against identity vs context length]({RATIOS_PNG})\n\n"
        f"![peak memory at the top rung: weights, KV and the rest]({PEAK_SPLIT_PNG})",
        "ladder plots")


def ratio_lines(table: LadderTable, metric: str) -> dict[str, tuple[list[int], list[float]]]:
    """Per method other than identity: the rungs and its ratio there (rungs without one left
    out)."""
    return xy_lines({label: [(n, r.ratio(metric)) for n, r in sorted(table.rungs[label].items())]
                     for label in table.methods[1:]})


def ladder_ratios_png(table: LadderTable, path: Path, title: str) -> Path:
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), dpi=100)
    try:
        styles = line_styles({label: method_family(next(iter(rungs.values())).case.method)
                              for label, rungs in table.rungs.items()})
        plotted = {}
        for ax, (metric, name) in zip(axes, RATIOS[:3]):
            ax.axhline(1.0, color="black", linestyle="--", linewidth=1.2, label=REFERENCE)
            for label, (x, y) in ratio_lines(table, metric).items():
                ax.plot(x, y, linewidth=1.4, label=label, **styles[label])
                plotted.setdefault(metric, {})[label] = (x, y)
            ax.set_xscale("log", base=2)
            ax.set_xticks(table.lengths, [length_name(n) for n in table.lengths])
            if metric == "retained_kv_bytes":
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # not 10^-1
            if table.beyond is not None:
                ax.axvspan(table.beyond / 1.2, table.lengths[-1] * 1.2, color="grey", alpha=0.08)
            ax.set_title(f"{name} vs identity", fontsize=10)
            ax.set_xlabel("context (tokens)")
            ax.grid(True, alpha=0.35)
        axes[0].set_ylabel("method / identity at the same rung (lower is better)")
        note = " (shaded: past the model's trained context)" if table.beyond else ""
        fig.suptitle(f"kvbench {title}: each method against identity at the same context{note}")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.tight_layout(rect=(0, 0, 1 - 1.5 / fig.get_figwidth(), 1))
        fig.legend(handles, labels, loc="center right", fontsize=8)
        save_png(fig, path)
    finally:
        plt.close(fig)
    return PlotPath.of(path, plotted)


def peak_split(rung: Rung) -> tuple[float, float, float]:
    """(weights, KV at its largest, everything else) of a rung's peak, in bytes."""
    v = rung.value
    weights, kv = v("weights_bytes"), v("kv_high_water_bytes")
    return weights, kv, max(v("peak_bytes") - weights - kv, 0.0)


def ladder_peak_split_png(table: LadderTable, path: Path, title: str) -> Path:
    plt = pyplot()
    top = table.top
    labels = [label for label in table.methods if top in table.rungs[label]]
    parts = [peak_split(table.rungs[label][top]) for label in labels]
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(labels), 4.8), dpi=100)
    try:
        bottom = [0.0] * len(labels)
        layers = (("weights", "#9e9e9e"), ("KV (cache high-water)", "#1f77b4"),
                  ("other (runtime, temporaries)", "#ffbf69"))
        for i, (name, colour) in enumerate(layers):
            heights = [p[i] / 2**30 for p in parts]
            ax.bar(labels, heights, bottom=bottom, color=colour, label=name)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_ylabel("GiB at the case's peak")
        ax.set_title(f"kvbench {title}: peak at {length_name(top)} tokens", fontsize=10)
        ax.tick_params(axis="x", labelrotation=30)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.35)
        fig.tight_layout()
        save_png(fig, path)
    finally:
        plt.close(fig)
    return PlotPath.of(path, dict(zip(labels, parts)))


REPORT = BenchmarkReport(
    board=Board("retained_kv_bytes", "peak_bytes", ("peak_over_loaded_bytes",
                                                    "kv_bytes_measured")),
    parts=lambda result, out_dir: (ladder_section(result), ladder_figures(result, out_dir)))
