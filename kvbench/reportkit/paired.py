"""The "against identity, on the same samples" tables of the retrieval reports (ruler, niah): a
method's per-sample scores set against identity's on the same samples, pooled over a scope (a
context length, a task at a length, a whole grid) and judged by kvbench.judge.paired: pairs,
wins / losses, the mean difference with its paired interval, the sign test's p and the verdict
worse / not separated / better. IdentityReferences finds each case's identity case to pair
with."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, TypeVar

from kvbench.judge.paired import (
    LEVEL, RESAMPLES, SEPARATION_LEVEL, PairedComparison, compare_paired, paired_samples,
    same_samples,
)
from kvbench.reportkit.tables import md_table, pair_key
from kvbench.results import CaseResult

IDENTITY = "identity"  # the registry name of the full cache: the reference of every pairing
NOT_PAIRED = "not paired: different samples"
Pair = tuple[list[float], list[float]]  # one cell's per-sample scores: (the method's, identity's)
Item = TypeVar("Item")
Paired = TypeVar("Paired")


class IdentityReferences:
    """The reference of each case: the first identity case among `cases` that shares its model
    and every bench param but `unpaired` (those that do not change which samples a case
    draws)."""

    def __init__(self, cases: Iterable[CaseResult], unpaired: tuple[str, ...] = ()):
        self.unpaired = unpaired
        self.found: dict[tuple, CaseResult] = {}
        for case in cases:
            if case.method == IDENTITY:
                self.found.setdefault(pair_key(case, unpaired), case)

    def of(self, case: CaseResult) -> CaseResult | None:
        """None for identity itself, and where no identity case pairs with the case."""
        if case.method == IDENTITY:
            return None
        return self.found.get(pair_key(case, self.unpaired))

    def pairs(self, cases: Iterable[CaseResult]) -> Iterator[tuple[CaseResult, CaseResult]]:
        """(case, its reference) for each case that has one, in order."""
        for case in cases:
            reference = self.of(case)
            if reference is not None:
                yield case, reference

    def scored(self, items: Iterable[Item],
               pairing: Callable[[Item, CaseResult], Paired | None] = paired_samples,
               case_of: Callable[[Item], CaseResult] = lambda item: item,
               ) -> Iterator[tuple[Item, Paired | None]]:
        """(item, pairing(item, its case's reference)) for each item whose case has a
        reference: None where identity ran other samples; an item on the same samples that
        pairs nothing (no per-sample scores) is left out."""
        for item in items:
            case = case_of(item)
            reference = self.of(case)
            if reference is None:
                continue
            paired = pairing(item, reference)
            if paired is not None or not same_samples(case, reference):
                yield item, paired


@dataclass
class PairedScope:
    """One method over one scope: the cells it shares with identity on the same samples, and
    the names of those identity ran on other samples."""

    method: str
    scope: str  # "1K", "1K · vt", "all lengths"
    pairs: list[Pair] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(mine) for mine, _ in self.pairs)

    def comparison(self) -> PairedComparison | None:
        if not self.pairs:
            return None
        return compare_paired([s for mine, _ in self.pairs for s in mine],
                              [s for _, theirs in self.pairs for s in theirs])


def signed(value: float) -> str:
    """Points with their sign (a true minus), zero as ±0.0."""
    text = f"{value:+.1f}"
    return "±0.0" if text in ("+0.0", "-0.0") else text.replace("-", "−")


def p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def paired_table(scopes: list[PairedScope], scope_header: str) -> str:
    """A row per scope (each has pairs, or cells identity ran on other samples: not paired)."""
    rows = []
    for scope in scopes:
        comparison = scope.comparison()
        if comparison is None:
            rows.append([scope.method, scope.scope, "—", "—", "—", "—", NOT_PAIRED])
            continue
        pairs = str(comparison.pairs)
        if scope.unpaired:
            pairs += f" ({NOT_PAIRED}: {', '.join(scope.unpaired)})"
        rows.append([scope.method, scope.scope, pairs, f"{comparison.wins} / {comparison.losses}",
                     f"{signed(comparison.mean_difference)} [{signed(comparison.low)}, "
                     f"{signed(comparison.high)}]", p_text(comparison.p_value), comparison.verdict])
    header = ["method", scope_header, "pairs", "wins / losses",
              f"Δ vs identity, points [{LEVEL:.0%} paired CI]", "p (sign test)", "verdict"]
    return md_table(header, rows, {2, 3, 4, 5})


def paired_legend(pairs_are: str) -> str:
    """What the table's columns mean; `pairs_are`: what one pair is in this benchmark."""
    return (f"<sub>A pair is {pairs_are}, answered by the method and by identity on the same "
            "prompts in the same order (each sample's prompt hash matches; where one case stopped "
            "sooner, sampled to a precision, its samples pair with identity's first ones; where "
            f"identity ran other prompts: {NOT_PAIRED}). wins / losses: samples the method scored above / below "
            "identity. p: exact two-sided sign test over the pairs that differ, ties dropped; "
            f"worse or better when p < {SEPARATION_LEVEL:g}, else not separated. Δ: the mean "
            f"per-sample difference in points, with a {LEVEL:.0%} paired bootstrap interval "
            f"({RESAMPLES:,} resamples, seeded); the verdict is the test's, since over few pairs "
            "a bootstrap interval is narrower than it should be.</sub>")
