"""A case's expected cost: its benchmark's workload (samples x tokens through the model,
`Benchmark.workload`) x its method's relative cost where measured (`MethodSettings.
relative_cost`). A figure to compare cases by, not a time: the local GPU executor starts the
longest cases first and `--shard` balances its parts by it (kvbench.run.shard)."""
from __future__ import annotations

import functools

from kvbench.benchmarks import BENCHMARKS
from kvbench.suite.case import Case


def expected_cost(case: Case) -> float:
    """0 for a refused case (recorded, never run)."""
    if case.params is None:
        return 0.0
    benchmark = _benchmark(case.benchmark)
    workload = getattr(benchmark, "workload", None)  # a plug-in's class may be no Benchmark
    work = float(workload(case.params)) if workload is not None else 1.0
    return work * getattr(type(case.settings), "relative_cost", 1.0)


def longest_first(cases: list[Case]) -> list[Case]:
    """`cases` by expected cost, the largest first; equal ones in their order."""
    return sorted(cases, key=lambda case: -expected_cost(case))


def shown(cost: float) -> str:
    """A cost as a short figure: 950, 12.3k, 4.1M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if cost >= size:
            return f"{cost / size:.3g}{suffix}"
    return f"{cost:.3g}"


@functools.lru_cache(maxsize=None)
def _benchmark(kind: str):
    return BENCHMARKS.get(kind)()
