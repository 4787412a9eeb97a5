"""Whether a stored baseline can judge a run: its schema, suite and machine key, and each case
defined alike (checked before anything runs; the data, token hashes, by the gate after)."""
from __future__ import annotations

from kvbench.judge.gate import fingerprint_differences
from kvbench.results import SCHEMA_VERSION, CaseResult, RunResult, fingerprint


def baseline_problems(baseline: RunResult, suite_name: str, machine_key: str) -> list[str]:
    """Why `baseline` cannot gate a run of `suite_name` on the machine `machine_key`."""
    problems = []
    if baseline.schema_version != SCHEMA_VERSION:
        problems.append(f"schema version {baseline.schema_version} != {SCHEMA_VERSION} (remake "
                        "it with this kvbench)")
    if baseline.suite.name != suite_name:
        problems.append(f"it is for suite {baseline.suite.name!r}, not {suite_name!r}")
    if baseline.machine.get("key") != machine_key:
        problems.append(f"machine key {baseline.machine.get('key')!r} != this machine's "
                        f"{machine_key!r}")
    return problems


def definition_problems(baseline: RunResult, planned: list[CaseResult]) -> list[str]:
    """The planned cases (records before they run) that the baseline defines otherwise (method
    or benchmark settings, model, backend, threads): their results could never be compared."""
    stored = {c.id: c for c in baseline.cases}
    problems = []
    for record in planned:
        old = stored.get(record.id)
        if old is None or old.status != "ok":
            continue
        known_later = {"comparable": old.comparable}  # the data's hashes, once it runs
        if record.model_dtype == "auto":  # resolved on the device that runs it
            known_later["model_dtype"] = old.model_dtype
        record = record.model_copy(update=known_later)
        record.fingerprint = fingerprint(record)
        differences = fingerprint_differences(old, record)
        if differences:
            problems.append(f"{record.id}: " + "; ".join(differences))
    return problems


class RefreshRefused(ValueError):
    """The cases asked for cannot be taken from that run into that baseline."""


def refreshed(baseline: RunResult, run: RunResult, case_ids: list[str]) -> RunResult:
    """`baseline` with the cases `case_ids` taken from `run` (replaced, or added): the baseline of
    the cases a changed setting made not comparable, the others' kept. The run-level record (the
    suite as resolved, its gate settings, versions) is the run's, which defines those cases."""
    problems = baseline_problems(baseline, run.suite.name, run.machine.get("key"))
    by_id = {case.id: case for case in run.cases}
    unknown = [case_id for case_id in case_ids if case_id not in by_id]
    if unknown:
        problems.append(f"not in the run: {', '.join(unknown)} (it has {len(by_id)} case(s))")
    failed = [case_id for case_id in case_ids if case_id in by_id
              and by_id[case_id].status != "ok"]
    if failed:
        problems.append(f"did not finish ok in the run: {', '.join(failed)}")
    if run.interrupted:
        problems.append("the run was interrupted; finish it with --resume first")
    if problems:
        raise RefreshRefused("; ".join(problems))
    taken = set(case_ids)
    kept = [by_id[case.id] if case.id in taken else case for case in baseline.cases]
    known = {case.id for case in baseline.cases}
    added = [by_id[case_id] for case_id in case_ids if case_id not in known]
    return run.model_copy(update={
        "cases": kept + added, "plugins": {**baseline.plugins, **run.plugins},
        "planned": [case.id for case in kept + added], "selection": {},
    })
