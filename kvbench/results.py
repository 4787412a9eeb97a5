"""Result records (versioned) and their reading/writing.

results.jsonl: one header line, then one line per finished case (append-only, fsynced).
results.json: the whole run, written atomically at the end; reports are made from it alone.
Non-finite numbers are written as the JSON strings "NaN", "Infinity" and "-Infinity" (valid
JSON for every reader) and read back as the same floats.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvbench.files import atomic_write_text

# 2: case fingerprints, metric timing kinds, run settings, non-finite numbers as strings.
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1 is read for reports and compare; the gate refuses to mix them

Direction = Literal["higher", "lower", "none"]
# refused: not run, its method's library is not installed here (its error says which)
Status = Literal["ok", "error", "timeout", "refused"]
# unmet: a claim stated as a goal not met yet (its reason in ClaimResult.goal): not a failure;
# skipped: a claim calibrated on another model than the case's, not judged (its reason in
# ClaimResult.measured_as): not a failure
Verdict = Literal["held", "failed", "missing", "unmet", "skipped"]
# absolute: a wall-clock figure (ms, s, tok/s); ratio: a timing divided by a reference timed in
# the same repeat (a memcpy of the same bytes, the plain cache), which load moves far less.
Timing = Literal["absolute", "ratio"]


class _Record(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")


class Metric(_Record):
    value: float
    unit: str = ""
    direction: Direction = "none"
    timing: Timing | None = None  # None: the same inputs give the same value
    # Timed metrics keep every repeat; value is their median.
    samples: list[float] | None = None
    min: float | None = None
    max: float | None = None
    iqr: float | None = None

    @classmethod
    def from_samples(cls, samples: list[float], unit: str, direction: Direction,
                     timing: Timing | None = None) -> "Metric":
        ordered = sorted(float(s) for s in samples)
        if len(ordered) >= 2:
            q = statistics.quantiles(ordered, n=4, method="inclusive")
            iqr = q[2] - q[0]
        else:
            iqr = 0.0
        return cls(
            value=statistics.median(ordered), unit=unit, direction=direction, timing=timing,
            samples=list(map(float, samples)), min=ordered[0], max=ordered[-1], iqr=iqr,
        )

    def finite(self) -> bool:
        return math.isfinite(self.value)


class ClaimResult(_Record):
    claim: str  # as written: "metric op value"
    metric: str
    op: str
    target: float
    measured: float | None
    verdict: Verdict
    source: str = ""  # where the claim was stated: "file:line"
    reference: str | None = None  # the case a "metric / LABEL" claim was judged against
    # What `measured` is when it is not the metric (or its ratio to, or difference from, the
    # reference's): e.g. "low bound of the 95% paired interval, 40 samples".
    measured_as: str | None = None
    goal: str | None = None  # a goal not met yet: why (an unmet goal does not fail the run)


class CaseError(_Record):
    type: str
    message: str
    traceback: str


class Footprint(_Record):
    """What kvbench.run.case recorded of a model-running case's memory: its figures are among the
    case's metrics (kvbench.benchmarks.specs.base.FOOTPRINT_METRICS), `metrics` names those it
    added (a benchmark's own metric of the same name stands), `probe` what the peak measured."""

    probe: str
    metrics: list[str] = Field(default_factory=list)


class CaseResult(_Record):
    id: str
    benchmark: str
    bench_params: dict[str, Any]
    method: str  # registry name or module:Class
    method_label: str
    method_params: dict[str, Any]
    model: str | None = None
    device: str = "cpu"
    backend: str = "torch"
    threads: int | None = None  # the suite's torch thread setting; None: torch's default
    model_dtype: str = "float32"  # as it ran ("auto" only in a plan, before it runs)
    model_revision: str | None = None  # a hub model's commit
    chat: dict[str, Any] = Field(default_factory=dict)  # a system prompt, template arguments
    seed: int = 0
    status: Status
    metrics: dict[str, Metric] = Field(default_factory=dict)
    claims: list[ClaimResult] = Field(default_factory=list)
    # Values that must match for two results of this case to be compared (e.g. token hash).
    comparable: dict[str, str] = Field(default_factory=dict)
    # sha256 of defining_parts(): a baseline case with another one is not comparable.
    fingerprint: str = ""
    # What was wrong with a case that finished (a non-finite metric, say).
    warnings: list[str] = Field(default_factory=list)
    info: dict[str, Any] = Field(default_factory=dict)
    footprint: Footprint | None = None  # None: not a model-running case, or an older record
    error: CaseError | None = None
    started: str = ""
    duration_s: float = 0.0


def defining_parts(case: CaseResult) -> dict[str, Any]:
    """What defines a case: two results may be compared only if all of it is equal. The
    machine is checked per run (its key), the code is what a gate judges, so neither is here.
    A float32 model, no hub commit and no chat options are left out, as every record before
    them was: their fingerprints hold. A hub model is its repository and commit, however the
    suite named the revision."""
    model = case.model
    if case.model_revision and model:
        model = model.partition("@")[0]
    parts = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": case.benchmark, "bench_params": case.bench_params,
        "method": case.method, "method_params": case.method_params,
        "backend": case.backend, "model": model, "threads": case.threads,
        "data": case.comparable,
    }
    later = {"model_dtype": case.model_dtype != "float32" and case.model_dtype,
             "model_revision": case.model_revision, "chat": case.chat}
    parts.update({key: value for key, value in later.items() if value})
    return _portable(parts)


def _portable(value: Any) -> Any:
    """Absolute file paths (a text file, a checkpoint folder, resolved against the suite) by
    their name: two checkouts in different folders define the same case. What the file held is
    in `data` (its tokens' hash)."""
    if isinstance(value, dict):
        return {key: _portable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_portable(item) for item in value]
    if isinstance(value, str) and os.path.isabs(value):
        return f".../{os.path.basename(value.rstrip('/'))}"
    return value


def fingerprint(case: CaseResult) -> str:
    canonical = json.dumps(defining_parts(case), sort_keys=True, separators=(",", ":"),
                           default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class SuiteRecord(_Record):
    name: str
    path: str
    hash: str  # sha256 of the resolved suite: a resumed run must match it
    resolved: dict[str, Any]


class RunHeader(_Record):
    schema_version: int = SCHEMA_VERSION
    kvbench_version: str
    git_sha: str | None  # of the kvbench source that ran (None: an installed package)
    # plug-in methods and benchmarks by module: distribution, version, source sha256
    plugins: dict[str, dict[str, str]] = Field(default_factory=dict)
    machine: dict[str, Any]  # hardware.fingerprint(); machine["key"] keys baselines
    suite: SuiteRecord
    # What the command line changed (device, backend, repeats): a resumed run must match it.
    settings: dict[str, Any] = Field(default_factory=dict)
    # The ids of the cases the run set out to run, in order (None: written before this field).
    planned: list[str] | None = None
    # The filters that chose them (--only, --methods, --limit); empty: the whole suite.
    selection: dict[str, Any] = Field(default_factory=dict)
    started: str

    def is_subset(self) -> bool:
        """Whether the run left out some of its suite's cases on purpose (filters, a shard):
        then a baseline case it lacks is not lost."""
        return bool(self.selection) or bool(self.settings.get("shard"))


class RunResult(RunHeader):
    finished: str = ""
    interrupted: bool = False
    cases: list[CaseResult] = Field(default_factory=list)


class ResultsFileError(ValueError):
    """A results file that cannot be used: truncated, corrupt, or of a schema this kvbench does
    not read. The message names the file and the fault."""


def append_jsonl(path: str | Path, record: BaseModel) -> None:
    """One line, fsynced. If the write fails (a full disk), the file is cut back to where it
    was, so no half line stays behind for the next append to glue onto."""
    line = (record.model_dump_json() + "\n").encode()
    with open(path, "ab") as fh:
        size = fh.tell()
        try:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        except OSError:
            try:
                fh.truncate(size)
            except OSError:
                pass  # the cut line is dropped, with a message, when the run is resumed
            raise


class _Line(_Record):
    type: Literal["header", "case"]
    header: RunHeader | None = None
    case: CaseResult | None = None


def header_line(header: RunHeader) -> BaseModel:
    return _Line(type="header", header=header)


def case_line(case: CaseResult) -> BaseModel:
    return _Line(type="case", case=case)


@dataclass
class Jsonl:
    header: RunHeader | None
    cases: list[CaseResult]
    # A last line cut mid-write (it has no newline), as bytes: a cut can fall inside a
    # character, and the runner truncates the file by its exact length. b"" when there is none.
    torn_tail: bytes


def read_jsonl(path: str | Path) -> Jsonl:
    """Header and finished cases. Only the last line can be cut by a kill (each line is written
    in one call and ends with a newline): it is returned apart. Any other unreadable line is a
    corrupt file: ResultsFileError naming its line."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    torn = lines.pop()  # after the last newline: empty unless the last write was cut
    header, cases = None, []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            parsed = _Line.model_validate_json(line)
        except ValidationError as exc:
            raise ResultsFileError(f"{path}:{number}: not a kvbench record "
                                   f"({_first_error(exc)})") from None
        if parsed.header is not None:
            header = parsed.header
        elif parsed.case is not None:
            cases.append(parsed.case)
    return Jsonl(header, cases, torn)


def load_results(path: str | Path) -> RunResult:
    """Read results.json (or a results.jsonl of an unfinished run); ResultsFileError when the
    file is truncated, corrupt or of a schema this kvbench does not read."""
    path = Path(path)
    if path.suffix == ".jsonl":
        jsonl = read_jsonl(path)
        if jsonl.header is None:
            raise ResultsFileError(f"{path}: no header line")
        return RunResult(**jsonl.header.model_dump(), cases=jsonl.cases, interrupted=True)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ResultsFileError(f"{path}: not valid JSON, truncated or corrupt (line {exc.lineno},"
                               f" column {exc.colno}: {exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise ResultsFileError(f"{path}: not a text file ({exc})") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        found = "an object" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise ResultsFileError(f"{path}: not a kvbench results file ({found} without"
                               " schema_version)")
    version = data["schema_version"]
    if version not in READABLE_VERSIONS:
        raise ResultsFileError(f"{path}: schema_version {version!r}; this kvbench reads "
                               f"{' and '.join(map(str, READABLE_VERSIONS))}")
    if version == 1:
        _upgrade_v1(data)
    try:
        return RunResult.model_validate(data)
    except ValidationError as exc:
        raise ResultsFileError(f"{path}: not a kvbench results file ({_first_error(exc)})") from None


def _upgrade_v1(data: dict) -> None:
    """Schema 1 wrote a non-finite metric as null; it reads back as NaN. Its cases have no
    fingerprint, so a gate finds them not comparable with schema 2 cases."""
    for case in data.get("cases") or []:
        for metric in (case.get("metrics") or {}).values():
            if isinstance(metric, dict) and metric.get("value") is None:
                metric["value"] = math.nan


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    where = ".".join(map(str, first["loc"])) or "top level"
    more = f"; {len(errors) - 1} more" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def save_jsonl(path: str | Path, result: RunResult) -> None:
    """The whole run as results.jsonl (header, then its cases), atomically: a run made
    elsewhere (`kvbench merge`) that --resume can continue."""
    header = RunHeader(**result.model_dump(include=set(RunHeader.model_fields)))
    lines = [header_line(header)] + [case_line(case) for case in result.cases]
    atomic_write_text(path, "".join(line.model_dump_json() + "\n" for line in lines))


def save_results(path: str | Path, result: RunResult) -> None:
    atomic_write_text(path, result.model_dump_json(indent=2) + "\n")
