"""`kvbench run --shard i/n`: a stable split of a suite's cases over n runs (CI jobs, machines).

A case's shard is a hash of its id, so it does not depend on the order of the cases, on which
shard runs first, or on cases added elsewhere in the suite. Cases tied by a claim against another
case (`peak_bytes / identity <= 0.51`) share the shard of the group's first id: every claim is
judged inside one shard, as in a whole run.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

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


def shard_of(case_id: str, count: int) -> int:
    """The 1-based shard of `case_id` among `count`."""
    digest = hashlib.sha256(case_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def select_shard(suite_cases: list[Case], selection: list[Case], shard: Shard) -> list[Case]:
    """The cases of `selection` (the suite's, filtered) in `shard`, in their order. The split is
    made over all the suite's cases, so a case's shard does not depend on the filters."""
    group = _claim_groups(suite_cases)
    return [c for c in selection if shard_of(group.get(c.id, c.id), shard.count) == shard.index]


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
