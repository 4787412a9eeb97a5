"""What the suite loader produces and the runner consumes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvbench.judge.claims import Claim
from kvbench.judge.tolerance import Tolerance
from kvbench.models.options import ChatOptions, LoadOptions
from kvbench.results import CaseError, CaseResult


@dataclass
class Case:
    id: str  # stable and readable: "<benchmark>/<method label>/<bench params>"
    benchmark: str
    bench_params: dict[str, Any]
    method: str
    method_label: str
    method_params: dict[str, Any]
    model: str | None
    device: str
    seed: int
    repeats: int
    timeout_s: float | None
    backend: str = "torch"
    threads: int | None = None  # torch CPU threads; None: torch's default
    cpu_heap: str = "keep"  # on a CPU: glibc keeps freed blocks, or releases them (Defaults)
    model_dtype: str = "auto"  # auto: resolved where the case runs (models.options)
    # a hub model's commit, resolved from its revision when the suite was validated: every
    # process that runs the case loads that commit
    model_revision: str | None = None
    load_options: LoadOptions = field(default_factory=LoadOptions)
    chat: ChatOptions = field(default_factory=ChatOptions)
    claims: list[Claim] = field(default_factory=list)
    # What the case runs with: the benchmark's Params and the method's settings as the suite
    # validated them (their plain data is bench_params and method_params, for the record). A
    # case reaches a child process or a Ray worker pickled, so they arrive as built, not
    # rebuilt. None for a refused case.
    params: Any = None
    settings: Any = None
    # why it cannot run here (its method's library is not installed, or the method cannot run
    # on the model's layers): recorded, never run
    refused: str | None = None
    refused_as: str = "LibraryMissing"  # or "LayersUnsupported": the record's error type

    def record(self) -> CaseResult:
        """The record of this case before it runs: what defines it, nothing measured yet (for a
        refused case, its refusal)."""
        return CaseResult(
            id=self.id, benchmark=self.benchmark, bench_params=self.bench_params,
            method=self.method, method_label=self.method_label, method_params=self.method_params,
            model=self.model, device=self.device, backend=self.backend, threads=self.threads,
            model_dtype=self.model_dtype, model_revision=self.model_revision,
            chat=self.chat.record(), seed=self.seed,
            status="refused" if self.refused else "ok",
            error=self.refused and CaseError(type=self.refused_as, message=self.refused,
                                             traceback=""),
        )


@dataclass
class LoadedSuite:
    name: str
    path: str
    hash: str
    resolved: dict[str, Any]  # the suite after includes and defaults, as plain data
    cases: list[Case]
    tolerances: dict[str, Tolerance]  # per metric
    default_tolerance: Tolerance

    def tolerance_for(self, metric: str) -> Tolerance:
        return self.tolerances.get(metric, self.default_tolerance)
