"""The report as one self-contained HTML page with interactive plots; with a figure format,
its figures also as files in `<stem>_figures/` beside it (a folder of its own: a Markdown
report of the same name keeps `<stem>_files/`), each linked under its plot for print."""

from __future__ import annotations

import html
from pathlib import Path

from marlctl.report import figures
from marlctl.report.document import Block, Code, Figure, Heading, Table, Text, blocks
from marlctl.report.files import with_figures, write_atomic
from marlctl.report.model import Report

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.35rem 0.7rem; text-align: right; }
th { background: #f4f4f4; }
td:first-child, th:first-child { text-align: left; }
td.best { font-weight: bold; color: #0a7d2c; }
.meta, .note { color: #666; font-size: 0.85rem; }
.warning { color: #7a4b00; background: #fff4e0; border-left: 4px solid #e69500;
  padding: 0.4rem 0.8rem; font-size: 0.9rem; }
"""


_DIVS = {
    "curves": figures.curves_div,
    "history": figures.history_div,
    "importances": figures.importances_div,
    "profile": figures.profile_div,
    "schedules": figures.schedules_div,
}


def html_page(report: Report, out: Path, kind: str | None = None) -> list[Path]:
    if kind is None:
        write_atomic(out, render(report))
        return [out]
    folder = out.parent / f"{out.stem}_figures"
    return with_figures(report, out, folder, kind, lambda doc, links: render(report, links, doc))


def render(
    report: Report, links: dict[str, str] | None = None, document: list[Block] | None = None
) -> str:
    """`links` (figure key → relative path) adds a link to each plot's file for print;
    `document` is the report's blocks where they are built already."""
    links = links or {}
    parts: list[str] = []
    plotted = False  # the first plot carries plotly.js inline
    for block in blocks(report) if document is None else document:
        if isinstance(block, Figure):
            parts += _figure(block, links, first=not plotted)
            plotted = True
        else:
            parts.append(_block(block))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>marlctl report</title><style>{_STYLE}</style></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )


def _block(block: Block) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{_text(block.text)}</h{block.level}>"
    if isinstance(block, Table):
        return table(block)
    text = _text(block.text)
    if block.kind == "warning":
        return f'<p class="warning"><strong>Warning:</strong> {text}</p>'
    style = {"text": "", "meta": ' class="meta"'}.get(block.kind, ' class="note"')
    return f"<p{style}>{text}</p>"


def _figure(figure: Figure, links: dict[str, str], first: bool) -> list[str]:
    parts = [f"<h2>{html.escape(figure.title)}</h2>"] if figure.title else []
    parts.append(_DIVS[figure.plot](figure.source, first))
    if figure.key in links:
        name = html.escape(links[figure.key])
        parts.append(f'<p class="note">Figure for print: <a href="{name}">{name}</a></p>')
    return parts


def _text(text: Text) -> str:
    return "".join(
        f"<code>{html.escape(s.text)}</code>" if isinstance(s, Code) else html.escape(s)
        for s in text
    )


def table(block: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in block.header)
    lines = []
    for i, cells in enumerate(block.body):
        tds = "".join(
            f'<td class="best">{html.escape(c)}</td>'
            if block.best.get((i, j))
            else f"<td>{html.escape(c)}</td>"
            for j, c in enumerate(cells)
        )
        lines.append(f"<tr>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"
