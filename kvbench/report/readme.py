"""Keep README tables current: replace the text between a named pair of markers, with the
tables a SectionChoice asks for (benchmarks, columns, the paired comparisons, the claims)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvbench.report.against_identity import against_identity
from kvbench.reportkit.tables import benchmark_table, by_benchmark, model_grid, own_metrics
from kvbench.report.markdown import benchmark_report, claims_section
from kvbench.files import atomic_write_text
from kvbench.results import CaseResult, RunResult


def markers(section: str) -> tuple[str, str]:
    return f"<!-- kvbench:start {section} -->", f"<!-- kvbench:end {section} -->"


def inject_section(readme_path: str | Path, section: str, markdown: str) -> None:
    """Put `markdown` between the section's markers (kept), writing the file atomically."""
    path = Path(readme_path)
    text = path.read_text()
    start, end = markers(section)
    counts = (text.count(start), text.count(end))
    if counts != (1, 1) or text.index(start) > text.index(end):
        found = f"found the start marker {counts[0]} time(s) and the end marker {counts[1]} time(s)"
        raise ValueError(
            f"{path}: section {section!r} needs exactly one pair of markers, start before end "
            f"({found}). Add these two lines where the table belongs:\n{start}\n{end}"
        )
    head, rest = text.split(start)
    _, tail = rest.split(end)
    atomic_write_text(path, f"{head}{start}\n{markdown.strip()}\n{end}{tail}")


def render_section_table(result: RunResult, benchmark: str | None = None) -> str:
    """The compact table of one benchmark, or of each with a heading; made from the results file."""
    groups = by_benchmark(result.cases)
    if benchmark is not None:
        cases = _cases_of(groups, benchmark)
        return benchmark_table(cases, benchmark_report(benchmark).row, own_metrics(cases))
    return render_section(result)


@dataclass(frozen=True)
class SectionChoice:
    """What `kvbench report --readme` puts in its section; the defaults give every benchmark's
    full table, under a line of the settings the suite set.

    benchmarks: the benchmarks shown, in this order (default: every one of the run).
    columns: the metrics shown, in this order; each must be a metric of a chosen benchmark, and
        a benchmark's table has those it has (default: all of them).
    paired: each benchmark's comparisons against identity, as report.md has them, below its
        table (kvbench.report.against_identity).
    claims: the claims of the chosen benchmarks' cases, after the tables.
    suite_settings: the line above a table names only the settings the suite set (and the model,
        device and seed), not every default; False: every setting equal in all rows."""

    benchmarks: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    paired: bool = False
    claims: bool = False
    suite_settings: bool = True


def render_section(result: RunResult, choice: SectionChoice = SectionChoice()) -> str:
    """The README section the choice asks for: a `### benchmark` heading and table per chosen
    benchmark, its paired comparisons under it (paired), then the claims (claims). ValueError
    naming the choices when a benchmark or a column is not in the run."""
    groups = by_benchmark(result.cases)
    chosen = {name: _cases_of(groups, name) for name in choice.benchmarks} or groups
    columns = list(choice.columns) or None
    if columns is not None:
        _check_columns(chosen, columns)
    parts, paired = [], 0
    for name, cases in chosen.items():
        settings = suite_settings(result, name) if choice.suite_settings else None
        table = benchmark_table(cases, benchmark_report(name).row, columns, settings)
        parts.append(f"### {name}\n\n{table}")
        if choice.paired:
            blocks = against_identity(result, name)
            paired += bool(blocks)
            # a level below the benchmark's heading, under which they sit here
            parts += [f"#{block}" if block.startswith("#") else block for block in blocks]
    if choice.paired and not paired:
        raise ValueError(f"--paired: no comparison against identity in {', '.join(chosen)} "
                         "(ruler, niah and perplexity have one where identity ran the same "
                         "samples)")
    if choice.claims:
        claims = claims_section([c for cases in chosen.values() for c in cases], "### Claims")
        if not claims:
            raise ValueError(f"--claims: no claim on the cases of {', '.join(chosen)}")
        parts.append(claims)
    return "\n\n".join(parts)


def suite_settings(result: RunResult, benchmark: str) -> set[str] | None:
    """The bench params the suite set for `benchmark`: its entries' params and matrix keys, as
    the results file records the resolved suite; None when it records none (an old file)."""
    entries = [entry for entry in result.suite.resolved.get("benchmarks") or []
               if isinstance(entry, dict) and entry.get("kind") == benchmark]
    if not entries:
        return None
    return {key for entry in entries for part in ("params", "matrix")
            for key in (entry.get(part) or {})}


def _cases_of(groups: dict[str, list[CaseResult]], benchmark: str) -> list[CaseResult]:
    if benchmark not in groups:
        raise ValueError(f"no cases of benchmark {benchmark!r} in this run "
                         f"(it has: {', '.join(groups) or 'none'})")
    return groups[benchmark]


def _check_columns(chosen: dict[str, list[CaseResult]], columns: list[str]) -> None:
    have = {name: list(dict.fromkeys(m for case in cases for m in case.metrics))
            for name, cases in chosen.items()}
    unknown = [c for c in columns if not any(c in metrics for metrics in have.values())]
    if unknown:
        listed = "; ".join(f"{name}: {', '.join(metrics) or 'none'}"
                           for name, metrics in have.items())
        raise ValueError(f"unknown column(s) {', '.join(map(repr, unknown))}: the metrics are "
                         f"{listed}")


def render_grids(result: RunResult, grids: list[str]) -> str:
    """Each BENCHMARK:METRIC of `grids` as a model-by-method grid (model_grid), with a heading."""
    groups = by_benchmark(result.cases)
    parts = []
    for grid in grids:
        benchmark, _, metric = grid.partition(":")
        if benchmark not in groups:
            raise ValueError(f"--grid {grid}: no cases of benchmark {benchmark!r} in this run"
                             f" (it has: {', '.join(groups) or 'none'})")
        if not any(metric in case.metrics for case in groups[benchmark]):
            raise ValueError(f"--grid {grid}: no case of {benchmark!r} has a metric {metric!r}")
        parts.append(f"### {benchmark}: {metric}\n\n{model_grid(groups[benchmark], metric)}")
    return "\n\n".join(parts)
