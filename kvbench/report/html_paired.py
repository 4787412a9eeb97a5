"""The results page's comparisons against identity: a summary row per run and benchmark (each
method by its verdict, worse / not separated / better), and below it, folded, each run's
tables as its report.md has them (kvbench.report.against_identity)."""
from __future__ import annotations

import re

from kvbench.judge.paired import SEPARATION_LEVEL
from kvbench.report.against_identity import VERDICTS, against_identity, verdicts
from kvbench.report.html_markdown import blocks_html
from kvbench.report.html_parts import esc, row, section, table
from kvbench.report.html_run import Run

_NAMED = 4  # methods named in a cell of the summary; the rest are in its title and its table


def against_identity_section(runs: list[Run], kinds: list[str]) -> str:
    """Each run's paired comparisons against identity, as its report.md has them: a summary
    row per run and benchmark (the methods by verdict), each run's tables folded below it."""
    summary, folds = [], []
    for kind in kinds:
        for run in runs:
            blocks = against_identity(run.result, kind)
            if not blocks:
                continue
            found = verdicts(blocks)
            slug = f"paired-{run.index}-{re.sub(r'[^A-Za-z0-9_-]+', '_', kind)}"
            cells = [esc(f"#{run.index}"), f"<a href='#{slug}'>{esc(kind)}</a>"]
            for verdict in VERDICTS:
                named = found.named(verdict)
                if not named:
                    cells.append("<td class='methods'>-</td>")
                    continue
                listed = ", ".join(named[:_NAMED])
                if len(named) > _NAMED:  # the rest in its table below
                    listed += f" … and {len(named) - _NAMED} more"
                cells.append(f"<td class='methods' title='{esc(', '.join(named))}'><span "
                             f"class='verdict {verdict.replace(' ', '-')}'>{len(named)}</span> "
                             f"{esc(listed)}</td>")
            summary.append(row(cells))
            folds.append(f"<details id='{slug}' class='paired'><summary>{esc(run.label)}: "
                         f"{esc(kind)} against identity ({found.rows} comparison"
                         f"{'' if found.rows == 1 else 's'})</summary>"
                         f"{blocks_html(blocks)}</details>")
    if not summary:
        return ""
    note = ("<p class='note'>Each method against <b>identity</b> on the same samples, as its "
            "run's report.md has it: worse or better where the exact sign test over the pairs "
            f"that differ gives p &lt; {SEPARATION_LEVEL:g}, else not separated; a method's "
            "scopes (context lengths) are named where its verdicts differ between them.</p>")
    tables = (f"<details class='paired-all'><summary>The {len(folds)} tables, one per run and "
              f"benchmark</summary>{''.join(folds)}</details>")
    return section("Against identity", note + table(
        ["run", "benchmark", "worse", "not separated", "better"], summary,
        table_id="paired-summary") + tables)
