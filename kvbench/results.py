"""Result records (versioned) and their reading/writing.

results.jsonl: one header line, then one line per finished case (append-only, fsynced).
results.json: the whole run, written atomically at the end; reports are made from it alone.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1

Direction = Literal["higher", "lower", "none"]
Status = Literal["ok", "error", "timeout"]
Verdict = Literal["held", "failed", "missing"]


class Metric(BaseModel):
    value: float
    unit: str = ""
    direction: Direction = "none"
    # Timed metrics keep every repeat; value is their median.
    samples: list[float] | None = None
    min: float | None = None
    max: float | None = None
    iqr: float | None = None

    @classmethod
    def from_samples(cls, samples: list[float], unit: str, direction: Direction) -> "Metric":
        ordered = sorted(float(s) for s in samples)
        if len(ordered) >= 2:
            q = statistics.quantiles(ordered, n=4, method="inclusive")
            iqr = q[2] - q[0]
        else:
            iqr = 0.0
        return cls(
            value=statistics.median(ordered), unit=unit, direction=direction,
            samples=list(map(float, samples)), min=ordered[0], max=ordered[-1], iqr=iqr,
        )


class ClaimResult(BaseModel):
    claim: str  # as written: "metric op value"
    metric: str
    op: str
    target: float
    measured: float | None
    verdict: Verdict
    source: str = ""  # where the claim was stated: "file:line"


class CaseError(BaseModel):
    type: str
    message: str
    traceback: str


class CaseResult(BaseModel):
    id: str
    benchmark: str
    bench_params: dict[str, Any]
    method: str  # registry name or module:Class
    method_label: str
    method_params: dict[str, Any]
    model: str | None = None
    device: str = "cpu"
    backend: str = "torch"
    seed: int = 0
    status: Status
    metrics: dict[str, Metric] = Field(default_factory=dict)
    claims: list[ClaimResult] = Field(default_factory=list)
    # Values that must match for two results of this case to be compared (e.g. token hash).
    comparable: dict[str, str] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)
    error: CaseError | None = None
    started: str = ""
    duration_s: float = 0.0


class SuiteRecord(BaseModel):
    name: str
    path: str
    hash: str  # sha256 of the resolved suite: a resumed run must match it
    resolved: dict[str, Any]


class RunHeader(BaseModel):
    schema_version: int = SCHEMA_VERSION
    kvbench_version: str
    git_sha: str | None
    machine: dict[str, Any]  # hardware.fingerprint(); machine["key"] keys baselines
    suite: SuiteRecord
    started: str


class RunResult(RunHeader):
    finished: str = ""
    interrupted: bool = False
    cases: list[CaseResult] = Field(default_factory=list)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temp file in the same folder, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_jsonl(path: str | Path, record: BaseModel) -> None:
    with open(path, "a") as fh:
        fh.write(record.model_dump_json() + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl(path: str | Path) -> tuple[RunHeader | None, list[CaseResult]]:
    """Header and finished cases; a torn last line (killed mid-write) is ignored."""
    header, cases = None, []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if data.get("type") == "header":
                header = RunHeader.model_validate(data["header"])
            elif data.get("type") == "case":
                cases.append(CaseResult.model_validate(data["case"]))
    return header, cases


class _Line(BaseModel):
    type: Literal["header", "case"]
    header: RunHeader | None = None
    case: CaseResult | None = None


def header_line(header: RunHeader) -> BaseModel:
    return _Line(type="header", header=header)


def case_line(case: CaseResult) -> BaseModel:
    return _Line(type="case", case=case)


def load_results(path: str | Path) -> RunResult:
    """Read results.json (or a results.jsonl of an unfinished run)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        header, cases = read_jsonl(path)
        if header is None:
            raise ValueError(f"{path}: no header line")
        return RunResult(**header.model_dump(), cases=cases, interrupted=True)
    data = json.loads(path.read_text())
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {version!r}, this kvbench reads {SCHEMA_VERSION}")
    return RunResult.model_validate(data)


def save_results(path: str | Path, result: RunResult) -> None:
    atomic_write_text(path, result.model_dump_json(indent=2) + "\n")
