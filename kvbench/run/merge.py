"""`kvbench merge A B ... --out DIR`: the runs of one suite joined into one, as if it had run
whole. Each input is a shard (`kvbench run --shard i/n`) or a whole run (a part run on its own,
`--only`, or shards merged before); inputs that planned the same cases are the shards of one part,
and the parts must plan different cases. A suite longer than a session runs as parts, one a
session, joined here. The cases go part by part, in the order the parts' first runs are given,
each part in the suite's order; a claim against a case of another part was judged missing where
it ran (split parts as shards split a suite: tied cases together).

Refused (MergeRefused): runs of different suites (by hash, timeouts aside: a timeout ends a case,
it does not change what it measures), schema or kvbench versions, git commits, settings (device,
backend, repeats) or machines (machine key) unless allow_mixed (each case then keeps its machine
and commit in info); parts whose case selections overlap; a case in two runs; shards of
different splits (1/2 with 1/3) or one shard twice. Reported and merged anyway: shards not given,
and cases planned that no run finished (an interrupted shard's results.jsonl can be merged, and
resumed later).
"""
from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.files import atomic_write_text
from kvbench.results import RunResult, save_jsonl, save_results
from kvbench.run.files import FILES, JSON, JSONL, PREDICTIONS
from kvbench.run.shard import parse_shard
from kvbench.suite.versions import TIMEOUTS, digest_without


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
    ("suite", lambda run: f"{run.suite.name} (hash, timeouts aside, "
                          f"{digest_without(run.suite.resolved, TIMEOUTS)[:12]})"),
    ("schema version", lambda run: run.schema_version),
    ("kvbench version", lambda run: run.kvbench_version),
    ("settings", lambda run: {k: v for k, v in run.settings.items()
                              if k not in ("shard", "split", "merged_from")}),
)
_MIXED = (  # allowed with allow_mixed: each case keeps its own in info
    ("git_sha", "git commit", lambda run: run.git_sha),
    ("machine", "machine", lambda run: run.machine.get("key")),
)


def merge_runs(runs: list[tuple[str, RunResult]], allow_mixed: bool = False) -> Merged:
    """`runs`: (where it was read, the run), one per shard or part."""
    if not runs:
        raise MergeRefused("nothing to merge")
    problems = _differences(runs, _SAME if allow_mixed else
                            (*_SAME, *((what, value) for _, what, value in _MIXED)))
    unplanned = [path for path, run in runs if run.planned is None]
    if unplanned:
        problems.append(f"{', '.join(unplanned)}: written by a kvbench without shards (no "
                        "planned cases)")
        raise MergeRefused("cannot merge:\n  " + "\n  ".join(problems))
    parts: dict[tuple[str, ...], list[tuple[str, RunResult]]] = {}
    for path, run in runs:
        parts.setdefault(tuple(run.planned), []).append((path, run))
    problems += _overlaps(parts)
    missing_shards = []
    for part in parts.values():
        missing, trouble = _shards_of(part, len(parts) > 1)
        missing_shards += missing
        problems += trouble
    plugins: dict[str, dict[str, str]] = {}
    for path, run in runs:
        for module, entry in run.plugins.items():
            if plugins.setdefault(module, entry) != entry:
                problems.append(f"plug-in {module} is other code in {path} (source sha256"
                                f" {entry.get('sha256', '?')[:12]}) than in an earlier run")
    owner: dict[str, str] = {}
    for path, run in runs:
        for case in run.cases:
            if case.id in owner:
                problems.append(f"case {case.id} is in both {owner[case.id]} and {path}")
            owner[case.id] = path
    if problems:
        raise MergeRefused("cannot merge:\n  " + "\n  ".join(problems))

    planned = [case_id for selection in parts for case_id in selection]
    order = {case_id: i for i, case_id in enumerate(planned)}
    cases = sorted((case for _, run in runs for case in run.cases),
                   key=lambda case: order.get(case.id, len(order)))
    for key, _, value in _MIXED:  # where runs differ, each case keeps its own
        if len({value(run) for _, run in runs}) > 1:
            for _, run in runs:
                for case in run.cases:  # a merged input's cases may know theirs already
                    case.info.setdefault(key, value(run))
    first = runs[0][1]
    kept = {key: value for key, value in first.settings.items() if key != "split"}
    settings = {**kept, "shard": None, "merged_from": [
        {"path": path, "shard": run.settings.get("shard"), "machine": run.machine.get("key"),
         "git_sha": run.git_sha, "started": run.started, "finished": run.finished,
         **({"merged_from": run.settings["merged_from"]} if run.settings.get("merged_from")
            else {})}
        for path, run in runs]}
    result = first.model_copy(update={
        "settings": settings, "cases": cases, "planned": planned, "plugins": plugins,
        "started": min(run.started for _, run in runs),
        "finished": max(run.finished for _, run in runs),
        "interrupted": any(run.interrupted for _, run in runs),
    })
    missing_cases = [case_id for case_id in planned if case_id not in owner]
    machines = sorted({str(run.machine.get("key")) for _, run in runs})
    return Merged(result, missing_shards, missing_cases, machines)


def _overlaps(parts: dict[tuple[str, ...], list[tuple[str, RunResult]]]) -> list[str]:
    """Parts that planned some of the same cases (not the same selection: not shards of one)."""
    problems, seen = [], {}
    for selection, part in parts.items():
        path = part[0][0]
        shared = [case_id for case_id in selection if case_id in seen]
        if shared:
            problems.append(f"{seen[shared[0]]} and {path} planned different cases that overlap "
                            f"({len(shared)}, e.g. {shared[0]}): run every shard of a part with "
                            "the same --only, --methods and --limit, and parts with different ones")
        for case_id in selection:
            seen.setdefault(case_id, path)
    return problems


def _shards_of(part: list[tuple[str, RunResult]], named: bool) -> tuple[list[str], list[str]]:
    """The shards of one part missing, and what is wrong with them; a part of one whole run has
    none. named: say which part a missing shard belongs to."""
    shards = {path: run.settings.get("shard") for path, run in part}
    whole = [path for path, text in shards.items() if text is None]
    if whole and len(part) == 1:
        return [], []
    if whole:
        return [], [f"{', '.join(whole)}: not a shard, but planned the same cases as "
                    f"{', '.join(p for p in shards if p not in whole)}"]
    parsed = {path: parse_shard(text) for path, text in shards.items()}
    problems = []
    if len({shard.count for shard in parsed.values()}) > 1:
        problems.append("shards of different splits: " + ", ".join(
            f"{path} is {shard}" for path, shard in parsed.items()))
    for shard, times in Counter(parsed.values()).items():
        if times > 1:
            problems.append(f"shard {shard} is given {times} times: " + ", ".join(
                path for path, other in parsed.items() if other == shard))
    count = next(iter(parsed.values())).count
    given = {shard.index for shard in parsed.values()}
    where = f" (the part of {part[0][0]})" if named else ""
    return [f"{i}/{count}{where}" for i in range(1, count + 1) if i not in given], problems


def _differences(runs: list[tuple[str, RunResult]], checks) -> list[str]:
    first_path, first = runs[0]
    problems = []
    for what, value in checks:
        for path, run in runs[1:]:
            if value(run) == value(first):
                continue
            hint = (" (--allow-mixed joins runs of different machines or commits)"
                    if what in {label for _, label, _ in _MIXED} else "")
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
