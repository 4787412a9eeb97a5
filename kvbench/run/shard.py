"""`kvbench run --shard i/n`: a split of a suite's cases over n runs (CI jobs, machines) that
take about equal time.

Each case weighs its expected cost (kvbench.run.cost): the groups of cases are dealt out
heaviest first, each to the part that holds the least so far (longest processing time first),
ties going by id, so the split depends on the suite's cases and not on their order; it is made
over all the suite's cases, so --only, --methods and --limit do not move a case to another
shard (cases added to the suite may). Cases tied by a claim against another case
(`peak_bytes / identity <= 0.51`) are one group: every claim is judged inside one shard, as in a
whole run.
"""
from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass

from kvbench.run.cost import expected_cost
from kvbench.suite.case import Case

_FORM = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based, as written
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """"2/4" -> Shard(2, 4); ValueError naming the expected form otherwise."""
    match = _FORM.match(text)
    if not match:
        raise ValueError(f"--shard {text!r}: expected i/n, e.g. 1/2 (the first of two shards)")
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text!r}: i must be from 1 to n")
    return Shard(index, count)


@dataclass(frozen=True)
class Part:
    """One shard of a split: its cases' ids (in the suite's order) and their summed cost."""

    case_ids: tuple[str, ...]
    cost: float


def split(suite_cases: list[Case], count: int) -> list[Part]:
    """The suite's cases dealt into `count` parts of about equal expected cost."""
    group = _claim_groups(suite_cases)
    members: dict[str, list[Case]] = {}
    for case in suite_cases:
        members.setdefault(group[case.id], []).append(case)
    weight = {root: math.fsum(expected_cost(case) for case in cases)  # any order: one sum
              for root, cases in members.items()}
    loads = [(0.0, 0, index) for index in range(count)]  # (cost, groups, index): least first
    chosen: dict[str, int] = {}
    for root in sorted(members, key=lambda root: (-weight[root], root)):
        cost, groups, index = heapq.heappop(loads)
        chosen[root] = index
        heapq.heappush(loads, (cost + weight[root], groups + 1, index))
    return [Part(tuple(c.id for c in suite_cases if chosen[group[c.id]] == index),
                 math.fsum(weight[root] for root in members if chosen[root] == index))
            for index in range(count)]


def select_shard(suite_cases: list[Case], selection: list[Case], shard: Shard) -> list[Case]:
    """The cases of `selection` (the suite's, filtered) in `shard`, in their order. The split is
    made over all the suite's cases, so a case's shard does not depend on the filters."""
    ids = set(split(suite_cases, shard.count)[shard.index - 1].case_ids)
    return [c for c in selection if c.id in ids]


def split_record(parts: list[Part]) -> dict:
    """What a sharded run's header keeps of the split: each part's cases and expected cost."""
    return {"by": "expected cost", "cases": [len(part.case_ids) for part in parts],
            "costs": [round(part.cost, 3) for part in parts]}


def _claim_groups(cases: list[Case]) -> dict[str, str]:
    """Each case id -> the smallest id among the cases its claims tie it to (union-find)."""
    parent = {c.id: c.id for c in cases}

    def root(case_id: str) -> str:
        while parent[case_id] != case_id:
            parent[case_id] = parent[parent[case_id]]
            case_id = parent[case_id]
        return case_id

    for case in cases:
        for claim in case.claims:
            if claim.reference is None:
                continue
            other = claim.reference_id(case.id, case.benchmark, case.method_label)
            if other in parent:
                a, b = sorted((root(case.id), root(other)))
                parent[b] = a
    return {case_id: root(case_id) for case_id in parent}
