"""A benchmark's record: what its measurement writes into a case's info and what its report
reads back, declared as one typed model per benchmark (kvbench.benchmarks.records.<kind>) and
named by its declaration (`Benchmark.record`). The case runner checks every info against it
before the case is kept, so a key no record declares, or a value of the wrong type, is the
measurement's bug, named there; reports read `Record.of(case)` rather than string keys. In
results.json the info stays the plain mapping it was: a record round-trips through it."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from kvbench.results import CaseResult


class Record(BaseModel):
    """What every case's info may hold besides its benchmark's own keys: the run's (which
    implementation ran, the Ray attempt, the GPUs the case's process saw, and, in a merge of
    runs that differ, each case's own commit and machine)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    impl: dict[str, str] | None = None  # kvbench.run.case: which implementation ran each step
    ray: dict[str, Any] | None = None  # kvbench.run.ray_executor: the node, pid and attempt
    # kvbench.run.case: CUDA_VISIBLE_DEVICES as the case's process saw it, where it was set
    # (`--gpus` and Ray pin each case's process to its GPUs with it)
    cuda_visible_devices: str | None = None
    git_sha: str | None = None  # kvbench.run.merge: where merged runs differ
    machine: str | None = None

    @classmethod
    def check(cls, info: dict[str, Any]) -> None:
        """pydantic's ValidationError naming each undeclared key or mistyped value of `info`."""
        cls.model_validate(info)

    @classmethod
    def of(cls, case: CaseResult) -> Any:
        """The typed record of `case`'s info (a key an older kvbench wrote that no record
        declares now is left out: nothing reads it)."""
        return cls.model_validate({k: v for k, v in case.info.items() if k in cls.model_fields})

    def to_info(self) -> dict[str, Any]:
        """The info a measurement writes: the keys it set, as JSON holds them."""
        return self.model_dump(mode="json", exclude_unset=True)


class OpenRecord(Record):
    """The record of a benchmark that declares none (a plug-in's): any keys."""

    model_config = ConfigDict(extra="allow", frozen=True)
