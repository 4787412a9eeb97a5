"""Output-length drift: does a method answer at another length than identity on the same
prompts? A compressed cache that "wins" bytes but talks longer costs the time it saved, and more.

Every generating benchmark records, per sample and in the order of its samples, the tokens each
answer generated (info.generated) and the seconds it took (info.answer_s); kvbench.judge.paired
pairs them with identity's answers to the same prompts. Per method and scope (a length, a mode,
a level): the mean difference in tokens with its paired bootstrap interval and the exact sign
test (longer / shorter / not separated), and the mean difference in answer time that follows,
with its interval (the seconds are this machine's: the tokens carry over, the time does not)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kvbench.judge.paired import (
    LEVEL, SEPARATION_LEVEL, compare_paired, paired_interval, paired_samples,
)
from kvbench.reportkit.paired import IdentityReferences, Pair, p_text, signed
from kvbench.reportkit.tables import md_table, ok_cases
from kvbench.results import CaseResult, RunResult

VERDICTS = {"better": "longer", "worse": "shorter", "not separated": "not separated"}


@dataclass
class DriftScope:
    """One method over one scope: its answers' lengths and times paired with identity's."""

    method: str
    scope: str
    tokens: list[Pair] = field(default_factory=list)
    seconds: list[Pair] = field(default_factory=list)

    def flat(self, pairs: list[Pair]) -> tuple[list[float], list[float]]:
        return ([v for mine, _ in pairs for v in mine], [v for _, theirs in pairs for v in theirs])


def drift_scopes(cases: list[CaseResult], scope_of: Callable[[CaseResult], str],
                 unpaired_params: tuple[str, ...] = ()) -> list[DriftScope]:
    """Each non-identity case's per-sample lengths and times paired with the first identity
    case that shares its model and every bench param but `unpaired_params`, pooled per (method
    label, scope) in the order the cases come."""
    scopes: dict[tuple[str, str], DriftScope] = {}
    for case, ref in IdentityReferences(cases, unpaired_params).pairs(cases):
        tokens = paired_samples(case, ref, "generated_tokens")
        if tokens is None:
            continue
        scope = scopes.setdefault((case.method_label, scope_of(case)),
                                  DriftScope(case.method_label, scope_of(case)))
        scope.tokens.append(tokens)
        seconds = paired_samples(case, ref, "answer_s")
        if seconds is not None and len(seconds[0]) == len(tokens[0]):
            scope.seconds.append(seconds)
    return list(scopes.values())


def _row(scope: DriftScope) -> list[str]:
    mine, theirs = scope.flat(scope.tokens)
    comparison = compare_paired(mine, theirs)
    time_cell = "—"
    if scope.seconds:
        my_s, their_s = scope.flat(scope.seconds)
        mean, low, high = paired_interval([a - b for a, b in zip(my_s, their_s)])
        time_cell = f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]".replace("-", "−")
    return [scope.method, scope.scope, str(comparison.pairs),
            f"{sum(theirs) / len(theirs):.1f}", f"{sum(mine) / len(mine):.1f}",
            f"{signed(comparison.mean_difference)} [{signed(comparison.low)},"
            f" {signed(comparison.high)}]",
            f"{comparison.wins} / {comparison.losses}", p_text(comparison.p_value),
            VERDICTS[comparison.verdict], time_cell]


def drift_table(scopes: list[DriftScope], scope_header: str) -> str:
    header = ["method", scope_header, "pairs", "identity tokens", "method tokens",
              f"Δ tokens [{LEVEL:.0%} paired CI]", "longer / shorter", "p (sign test)",
              "length verdict", f"Δ answer time s [{LEVEL:.0%} CI]"]
    return md_table(header, [_row(scope) for scope in scopes], set(range(2, len(header))))


ANSWER_TIME = "from the answer's first forward to its last token"


def drift_legend(pairs_are: str, seconds_are: str = ANSWER_TIME) -> str:
    return (f"<sub>A pair is {pairs_are}: the same prompt answered by the method and by identity."
            " tokens: generated per answer, end-of-sequence not counted (the mean over the pairs)."
            " longer / shorter: answers the method made longer / shorter than identity's. p: exact"
            f" two-sided sign test over the pairs that differ; longer or shorter when p <"
            f" {SEPARATION_LEVEL:g}, else not separated. Δ answer time: the mean per-answer"
            f" difference in seconds, {seconds_are}, this"
            " machine's (a bootstrap interval over the pairs): the latency the length"
            " difference, and the method's own step time, add to each answer.</sub>")


def length_drift_section(result: RunResult, benchmark: str,
                         scope_of: Callable[[CaseResult], str], pairs_are: str,
                         unpaired_params: tuple[str, ...] = (), title: str = "",
                         scope_header: str = "scope",
                         seconds_are: str = ANSWER_TIME) -> str | None:
    """The benchmark's output-length table against identity, with its heading and legend;
    None when no case's lengths pair with identity's (no identity, or none recorded)."""
    scopes = drift_scopes(ok_cases(result, benchmark), scope_of, unpaired_params)
    if not scopes:
        return None
    # not "against identity": that marks the score verdicts the page and README gather
    heading = f"### {title or benchmark}: output length, paired with identity's answers"
    return "\n\n".join([heading, drift_table(scopes, scope_header),
                        drift_legend(pairs_are, seconds_are)])
