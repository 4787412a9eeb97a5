"""`kvbench merge A B ... --out DIR`: the runs of one suite's shards (`kvbench run --shard i/n`)
joined into one run, as if it had run whole.

Refused (MergeRefused): runs of different suites (by hash), schema or kvbench versions, git
commits, settings (device, backend, repeats) or case selections; a case in two runs; shards of
different splits (1/2 with 1/3) or one shard twice; runs on different machines (machine key)
unless allow_mixed. Reported and merged anyway: shards not given, and cases planned that no run
finished (an interrupted shard's results.jsonl can be merged, and resumed later).
"""
from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.results import RunResult, atomic_write_text, save_jsonl, save_results
from kvbench.run.files import FILES, JSON, JSONL, PREDICTIONS
from kvbench.run.shard import parse_shard


class MergeRefused(ValueError):
    """The runs cannot be joined into one; the message names each reason."""


@dataclass
class Merged:
    result: RunResult
    missing_shards: list[str] = field(default_factory=list)  # "2/3"
    missing_cases: list[str] = field(default_factory=list)  # planned, finished by no run
    machines: list[str] = field(default_factory=list)  # the machine keys joined

    @property
    def complete(self) -> bool:
        return not self.missing_shards and not self.missing_cases


_SAME = (
    ("suite", lambda run: f"{run.suite.name} (hash {run.suite.hash[:12]})"),
    ("schema version", lambda run: run.schema_version),
    ("kvbench version", lambda run: run.kvbench_version),
    ("git commit", lambda run: run.git_sha),
    ("settings", lambda run: {k: v for k, v in run.settings.items() if k != "shard"}),
    ("case selection", lambda run: run.planned),
)
_MACHINE = ("machine", lambda run: run.machine.get("key"))


def merge_runs(runs: list[tuple[str, RunResult]], allow_mixed: bool = False) -> Merged:
    """`runs`: (where it was read, the run), one per shard."""
    if not runs:
        raise MergeRefused("nothing to merge")
    problems = _differences(runs, _SAME if allow_mixed else (*_SAME, _MACHINE))
    if runs[0][1].planned is None:
        problems.append(f"{runs[0][0]} was written by a kvbench without shards (no planned "
                        "cases)")
    shards = {path: run.settings.get("shard") for path, run in runs}
    whole = [path for path, text in shards.items() if text is None]
    if whole:
        problems.append(f"{', '.join(whole)}: not a shard (run with --shard i/n)")
    parsed = {path: parse_shard(text) for path, text in shards.items() if text is not None}
    if len({shard.count for shard in parsed.values()}) > 1:
        problems.append("shards of different splits: " + ", ".join(
            f"{path} is {shard}" for path, shard in parsed.items()))
    for shard, times in Counter(parsed.values()).items():
        if times > 1:
            problems.append(f"shard {shard} is given {times} times: " + ", ".join(
                path for path, other in parsed.items() if other == shard))
    owner: dict[str, str] = {}
    for path, run in runs:
        for case in run.cases:
            if case.id in owner:
                problems.append(f"case {case.id} is in both {owner[case.id]} and {path}")
            owner[case.id] = path
    if problems:
        raise MergeRefused("cannot merge:\n  " + "\n  ".join(problems))

    first_path, first = runs[0]
    count = parsed[first_path].count
    given = {shard.index for shard in parsed.values()}
    missing_shards = [f"{i}/{count}" for i in range(1, count + 1) if i not in given]
    order = {case_id: i for i, case_id in enumerate(first.planned)}
    cases = sorted((case for _, run in runs for case in run.cases),
                   key=lambda case: order.get(case.id, len(order)))
    machines = sorted({str(run.machine.get("key")) for _, run in runs})
    if len(machines) > 1:  # each case keeps the machine it ran on
        for _, run in runs:
            for case in run.cases:
                case.info["machine"] = run.machine.get("key")
    settings = {**first.settings, "shard": None,
                "merged_from": [{"path": path, "shard": run.settings.get("shard"),
                                 "machine": run.machine.get("key"), "started": run.started,
                                 "finished": run.finished} for path, run in runs]}
    result = first.model_copy(update={
        "settings": settings, "cases": cases,
        "started": min(run.started for _, run in runs),
        "finished": max(run.finished for _, run in runs),
        "interrupted": any(run.interrupted for _, run in runs),
    })
    missing_cases = [case_id for case_id in first.planned if case_id not in owner]
    return Merged(result, missing_shards, missing_cases, machines)


def _differences(runs: list[tuple[str, RunResult]], checks) -> list[str]:
    first_path, first = runs[0]
    problems = []
    for what, value in checks:
        for path, run in runs[1:]:
            if value(run) == value(first):
                continue
            if what == "case selection":
                problems.append(f"{first_path} and {path} planned different cases (run every "
                                "shard with the same --only, --methods and --limit)")
                continue
            hint = " (--allow-mixed joins runs of different machines)" if what == "machine" else ""
            problems.append(f"{what} {value(first)!r} in {first_path}, {value(run)!r} in "
                            f"{path}{hint}")
    return problems


def write_merged(result: RunResult, folders: list[Path], out: Path) -> None:
    """The merged run in `out`: results.json and results.jsonl, and the shards' per-sample
    records and kept files joined beside them (OSError when `out` cannot be written)."""
    save_results(out / JSON, result)
    save_jsonl(out / JSONL, result)
    texts = [(folder / PREDICTIONS).read_text(encoding="utf-8") for folder in folders
             if (folder / PREDICTIONS).exists()]
    if texts:
        atomic_write_text(out / PREDICTIONS, "".join(texts))
    for folder in folders:
        if (folder / FILES).is_dir():
            shutil.copytree(folder / FILES, out / FILES, dirs_exist_ok=True)
