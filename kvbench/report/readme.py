"""Keep README tables current: replace the text between a named pair of markers."""
from __future__ import annotations

from pathlib import Path

from kvbench.report.kit.tables import benchmark_table, by_benchmark, model_grid
from kvbench.files import atomic_write_text
from kvbench.results import RunResult


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
        if benchmark not in groups:
            raise ValueError(f"no cases of benchmark {benchmark!r} in this run "
                             f"(it has: {', '.join(groups) or 'none'})")
        return benchmark_table(groups[benchmark])
    return "\n\n".join(f"### {name}\n\n{benchmark_table(cases)}" for name, cases in groups.items())


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
