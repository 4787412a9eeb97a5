"""How a case's footprint grows with its context: the cases of one benchmark and method that differ
only in the context's tokens (a `context` or `length` parameter), side by side. Per context, what
the case added to the process (peak − held at start: the method's caches and kvbench's own
evaluation) and the seconds a sample took; then the growth over four times the context (the
longest against a quarter of it: 4 is linear, 16 quadratic) and eval_overhead at the longest. A
figure plots the same against the context, one line per method, beside the plain cache."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvbench.reportkit.figures import (
    PlotPath, figure_text, legend_handles, legend_right, line_styles, method_family, panel_row,
    save_png, xy_lines,
)
from kvbench.reportkit.tables import fmt_bytes, fmt_number, length_name, md_table
from kvbench.results import CaseResult

CONTEXT_PARAMS = ("context", "length")  # a benchmark parameter that is the context's tokens
GROWTH_PNG = "footprint_growth.png"
GROWN = "peak − held at start"


@dataclass
class Line:
    """One benchmark and method's cases by context."""

    benchmark: str
    label: str  # the method's label, and what else sets these cases apart from others
    family: str
    cases: dict[int, CaseResult]

    def grown(self, context: int) -> float | None:
        """Bytes the case added above what was held at its start."""
        case = self.cases.get(context)
        if case is None or "peak_bytes" not in case.metrics:
            return None
        return case.metrics["peak_bytes"].value - case.metrics["held_at_start_bytes"].value

    def growth(self) -> tuple[int, float] | None:
        """(the longest context, what it added over what a quarter of it added)."""
        longest = max(self.cases)
        grown, quarter = self.grown(longest), self.grown(longest // 4)
        if grown is None or not quarter:
            return None
        return longest, grown / quarter


def growth_lines(cases: list[CaseResult]) -> list[Line]:
    """The footprint cases that differ only in the context, grouped, where a group has two
    contexts or more."""
    groups: dict[tuple, Line] = {}
    for case in cases:
        if case.footprint is None or case.status != "ok":
            continue
        axis = next((name for name in CONTEXT_PARAMS
                     if isinstance(case.bench_params.get(name), int)), None)
        if axis is None:
            continue
        rest = {k: v for k, v in case.bench_params.items() if k != axis}
        key = (case.benchmark, case.method_label, repr(sorted(rest.items(), key=str)))
        line = groups.setdefault(key, Line(case.benchmark, case.method_label,
                                           method_family(case.method), {}))
        line.cases[case.bench_params[axis]] = case
    lines = [line for line in groups.values() if len(line.cases) > 1]
    twins: dict[tuple[str, str], list[Line]] = {}
    for line in lines:
        twins.setdefault((line.benchmark, line.label), []).append(line)
    for same in (same for same in twins.values() if len(same) > 1):
        # one method under other settings: name the settings that differ
        settings = [next(iter(line.cases.values())).bench_params for line in same]
        differ = sorted({k for params in settings for k, v in params.items()
                         if k not in CONTEXT_PARAMS and any(p.get(k) != v for p in settings)})
        for line, params in zip(same, settings):
            line.label += " (" + ", ".join(f"{k}={params.get(k)}" for k in differ) + ")"
    return lines


def growth_section(cases: list[CaseResult], out_dir: Path | None) -> str:
    """The table and the figure's link (written to out_dir when given); "" where no method
    ran at several contexts."""
    lines = growth_lines(cases)
    if not lines:
        return ""
    contexts = sorted({context for line in lines for context in line.cases})
    rows = []
    for line in lines:
        cells = [line.benchmark, line.label]
        for context in contexts:
            grown, case = line.grown(context), line.cases.get(context)
            cells.append("" if grown is None else
                         f"{fmt_bytes(grown)} · {fmt_number(seconds_per_sample(case))} s")
        growth = line.growth()
        cells.append("" if growth is None else f"{growth[1]:.2f}")
        overhead = line.cases[max(line.cases)].metrics.get("eval_overhead")
        cells.append("" if overhead is None else f"{overhead.value:.3f}")
        rows.append(cells)
    header = ["benchmark", "method", *(f"{c:,}" for c in contexts),
              "×4 context: grown", "eval overhead ÷ plain, longest"]
    table = md_table(header, rows, right=set(range(2, len(header))))
    figure = figure_text(lines, out_dir, lambda data, folder: growth_png(data, folder / GROWTH_PNG),
                         f"![{GROWN} against the context, per method]({GROWTH_PNG})",
                         "the footprint figure")
    notes = (f"Per context: {GROWN} (the method's caches and kvbench's evaluation) · seconds a"
             " sample took (the case's wall time over its samples). ×4 context: what the longest"
             " context added over what a quarter of it added (4: linear, 16: quadratic).")
    return "\n\n".join(part for part in ("### How it grows with the context", table,
                                         f"<sub>{notes}</sub>", figure) if part)


def seconds_per_sample(case: CaseResult) -> float:
    samples = case.bench_params.get("samples")
    return case.duration_s / (samples if isinstance(samples, int) and samples > 0 else 1)


def growth_png(lines: list[Line], path: Path) -> Path:
    """One panel per benchmark: what each method's case added against the context (log-log),
    and the plain cache of the longest-running method's cases, dashed."""
    benchmarks = sorted({line.benchmark for line in lines})
    styles = line_styles({line.label: line.family for line in lines})
    plotted: dict[str, dict] = {}
    with panel_row(len(benchmarks), 4.8) as (fig, axes):
        for ax, benchmark in zip(axes, benchmarks):
            mine = [line for line in lines if line.benchmark == benchmark]
            for line in mine:
                points = xy_lines({line.label: [(c, line.grown(c)) for c in sorted(line.cases)]})
                for label, (x, y) in points.items():
                    ax.plot(x, [v / 2**20 for v in y], linewidth=1.4, label=label,
                            **styles[label])
                    plotted.setdefault(benchmark, {})[label] = (x, y)
            widest = max(mine, key=lambda line: len(line.cases))
            plain = [(c, case.metrics["plain_cache_bytes"].value / 2**20)
                     for c, case in sorted(widest.cases.items())
                     if "plain_cache_bytes" in case.metrics]
            if plain:
                ax.plot(*zip(*plain), color="black", linestyle="--", linewidth=1.2,
                        label="plain cache")
            ax.set_xscale("log", base=2)
            contexts = sorted({c for line in mine for c in line.cases})
            ax.set_xticks(contexts, [length_name(c) for c in contexts])
            ax.set_yscale("log")
            ax.set_title(benchmark, fontsize=10)
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel(f"{GROWN} (MiB)")
            ax.grid(True, alpha=0.35)
        legend_right(fig, legend_handles(axes), 1.8, fontsize=8)
        save_png(fig, path)
    return PlotPath.of(path, plotted)
