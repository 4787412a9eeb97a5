"""The samples a gate found worse than the baseline's (kvbench.judge.per_sample), as the report
and `kvbench compare` list them: per case, each sample's prompt hash, values and answers."""
from __future__ import annotations

from kvbench.judge.gate import GateReport
from kvbench.reportkit.tables import md_table

LISTED = 20  # samples listed per case: the rest are counted
ANSWER_CHARS = 60


def flipped_section(report: GateReport, heading: str = "### Samples worse than the baseline's"
                    ) -> str:
    """"" when no case has a sample worse than its baseline's."""
    parts = []
    for shift in report.sample_shifts:
        if not shift.worse:
            continue
        c = shift.comparison
        rows = [[str(s.index), (s.prompt_sha256 or "—")[:12], f"{s.before:g}", f"{s.after:g}",
                 _answer(s.before_answer), _answer(s.after_answer)] for s in shift.worse[:LISTED]]
        more = len(shift.worse) - LISTED
        parts.append(f"`{shift.case_id}` {shift.metric}: {shift.rule} ({c.verdict})\n\n"
                     + md_table(["sample", "prompt sha256", "baseline", "current",
                                 "baseline answer", "current answer"], rows, right={2, 3})
                     + (f"\n\n{more} more samples worse, not listed." if more > 0 else ""))
    if not parts:
        return ""
    note = ("Each case's samples paired with the baseline's by prompt hash; the verdict is the"
            " paired sign test's (a regression when they got worse with p < 0.05, whatever the"
            " mean did).")
    return "\n\n".join([heading, note, *parts])


def _answer(text: str | None) -> str:
    if text is None:
        return "(not recorded)"
    text = " ".join(text.split())
    return text if len(text) <= ANSWER_CHARS else text[: ANSWER_CHARS - 1] + "…"
