"""A benchmark's paired comparisons against identity, as its part of report.md has them: the
subsections whose heading says "against identity" (ruler's and niah's per-method tables of
wins, losses, Δ and the sign test's verdict; perplexity's per-window verdicts), each with what
follows it up to the next heading or figure. The README (`kvbench report --readme --paired`)
and the results page show them from here, so they read exactly as report.md does; and what
each method's verdicts are, read back from those tables, for the page's summary."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.reportkit.figures import MATPLOTLIB_MISSING
from kvbench.reportkit.paired import IDENTITY
from kvbench.report.markdown import benchmark_report
from kvbench.results import RunResult

MARK = "against identity"
# the verdict column of such a table: ruler's and niah's, perplexity's
VERDICT_COLUMNS = ("verdict", "vs identity")
# the column naming what a row compares (ruler's and niah's "length", "length · task";
# multiturn's "mode · turn"; dataset's "data · metric")
SCOPE_COLUMNS = ("length", "mode · turn", "data · metric")
VERDICTS = ("worse", "not separated", "better")


def against_identity(result: RunResult, kind: str) -> list[str]:
    """The Markdown blocks of `kind`'s paired comparisons against identity in this run's
    report, in order; [] when its report has none (no identity on the same samples, or a
    benchmark that pairs nothing)."""
    text = "\n\n".join(benchmark_report(kind).sections(result, None))
    blocks, keep = [], False
    for block in text.split("\n\n"):
        if block.startswith("#") or block.startswith("!["):
            keep = block.startswith("#") and MARK in block.splitlines()[0]
        # a figure's "skipped: matplotlib is not installed" line is the figure's, not the table's
        if keep and block.strip() and MATPLOTLIB_MISSING not in block:
            blocks.append(block)
    return blocks


def split_row(line: str) -> list[str]:
    """The cells of one row of a pipe table (kit.tables.md_table), escaped pipes kept."""
    cells, cell, escaped = [], "", False
    for char in line.strip().removeprefix("|").removesuffix("|"):
        if escaped:
            cell += char if char == "|" else "\\" + char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "|":
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
    cells.append(cell.strip())
    return cells


@dataclass
class Verdicts:
    """Each method's verdicts in the tables outside a <details> (the pooled comparisons): by
    verdict, the methods with it, each with the scopes where its rows disagree."""

    rows: int = 0
    methods: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # method -> verdict -> scopes

    def named(self, verdict: str) -> list[str]:
        """The methods with `verdict`, each followed by its scopes when not all its rows agree."""
        names = []
        for method, by_verdict in self.methods.items():
            if verdict not in by_verdict:
                continue
            scopes = [s for s in by_verdict[verdict] if s]
            names.append(method if len(by_verdict) == 1 or not scopes
                         else f"{method} ({', '.join(scopes)})")
        return names


def verdicts(blocks: list[str]) -> Verdicts:
    """The verdicts of the tables among `blocks` (against_identity's), those folded in a
    <details> left out (they split the pooled rows further), and identity's own row (the
    perplexity table's reference, not separated from itself)."""
    found, folded = Verdicts(), False
    for block in blocks:
        if block.startswith("<details"):
            folded = True
        if block.startswith("|") and not folded:
            lines = block.splitlines()
            header = split_row(lines[0])
            column = next((header.index(c) for c in VERDICT_COLUMNS if c in header), None)
            scope = next((header.index(c) for c in SCOPE_COLUMNS if c in header), None)
            if column is None:
                continue
            for line in lines[2:]:
                cells = split_row(line)
                if (len(cells) != len(header) or cells[column] not in VERDICTS
                        or cells[0] == IDENTITY):
                    continue
                found.rows += 1
                scopes = found.methods.setdefault(cells[0], {}).setdefault(cells[column], [])
                scopes.append(cells[scope] if scope is not None else "")
        if block.endswith("</details>"):
            folded = False
    return found
