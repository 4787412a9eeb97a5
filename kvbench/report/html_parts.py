"""The pieces every section of the results page is written with: a table row, a table (in
its scrolling frame), a section with its heading (its id the contents link to), and escaped
text. kvbench.report.html and its sections' modules share them."""
from __future__ import annotations

import html
import re


def row(cells: list[str], family: str | None = None, front: bool = False,
        verdict: str | None = None) -> str:
    attrs = ""
    if family is not None:
        attrs += f" data-family='{esc(family)}'"
    if front:
        attrs += " class='front'"
    if verdict is not None:
        attrs += f" data-verdict='{verdict}'"
    tds = "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells)
    return f"<tr{attrs}>{tds}</tr>"


def table(head: list[str], rows: list[str], sortable: bool = False,
          table_id: str | None = None) -> str:
    ident = f" id='{table_id}'" if table_id else ""
    cls = " class='sortable'" if sortable else ""
    ths = "".join(f"<th>{esc(h) if not h.startswith('<') else h}</th>" for h in head)
    return (f"<div class='scroll'><table{ident}{cls}><thead><tr>{ths}</tr></thead><tbody>"
            f"{''.join(rows)}</tbody></table></div>")


def section(title: str, body: str, level: int = 2) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return f"<section id='{slug}'><h{level}>{esc(title)}</h{level}>{body}</section>"


def esc(text) -> str:
    return html.escape(str(text), quote=True)
