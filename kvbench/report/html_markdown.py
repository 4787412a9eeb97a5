"""report.md's own blocks on the results page: the few Markdown forms kvbench's reports write
(headings, pipe tables as kit.tables.md_table writes them, <sub> notes, <details> folds, plain
lines with `code` and **bold**) as HTML, every text escaped. Used for the paired comparisons
against identity (kvbench.report.against_identity), which the page shows as report.md has them."""
from __future__ import annotations

import html
import re

from kvbench.report.against_identity import VERDICTS, split_row

_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*")
_SUMMARY = re.compile(r"<details><summary>(.*?)</summary>", re.S)


def inline(text: str) -> str:
    """Escaped text with `code` and **bold** as HTML."""
    out, last = [], 0
    for match in _INLINE.finditer(text):
        out.append(html.escape(text[last:match.start()]))
        code, bold = match.groups()
        out.append(f"<code>{html.escape(code)}</code>" if code is not None
                   else f"<b>{html.escape(bold)}</b>")
        last = match.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def table(block: str) -> str:
    """A pipe table; columns whose rule is ---: right-aligned, verdict cells coloured."""
    lines = block.splitlines()
    header, rule = split_row(lines[0]), split_row(lines[1])
    right = {i for i, r in enumerate(rule) if r.endswith(":")}
    head = "".join(f"<th>{inline(h)}</th>" for h in header)
    rows = []
    for line in lines[2:]:
        cells = []
        for i, cell in enumerate(split_row(line)):
            classes = (["num"] if i in right else []) + (
                ["verdict", cell.replace(" ", "-")] if cell in VERDICTS else [])
            attr = f" class='{' '.join(classes)}'" if classes else ""
            cells.append(f"<td{attr}>{inline(cell)}</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (f"<div class='scroll'><table class='from-md'><thead><tr>{head}</tr></thead><tbody>"
            f"{''.join(rows)}</tbody></table></div>")


def blocks_html(blocks: list[str], heading_level: int = 4) -> str:
    """The blocks (a Markdown text split at its blank lines) as HTML; headings become
    h`heading_level` whatever their depth (they sit inside a page section)."""
    out = []
    for block in blocks:
        if block.startswith("#"):
            title = block.lstrip("#").strip()
            out.append(f"<h{heading_level}>{inline(title)}</h{heading_level}>")
        elif block.startswith("|"):
            out.append(table(block))
        elif block.startswith("<details"):
            summary = _SUMMARY.match(block)
            out.append(f"<details class='fold'><summary>"
                       f"{inline(summary.group(1) if summary else 'more')}</summary>")
        elif block.strip() == "</details>":
            out.append("</details>")
        elif block.startswith("<sub>") and block.endswith("</sub>"):
            note = block.removeprefix("<sub>").removesuffix("</sub>")
            out.append(f"<p class='note small'>{inline(note)}</p>")
        else:
            out.append(f"<p>{inline(block)}</p>")
    return "".join(out)
