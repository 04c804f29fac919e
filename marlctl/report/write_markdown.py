"""The report as Markdown, its figures as files in `<stem>_files/` beside it, linked
relatively (renders on GitHub; a PDF is linked, as Markdown cannot show one inline)."""

from __future__ import annotations

from pathlib import Path

from marlctl.report.document import Block, Code, Figure, Heading, Paragraph, Table, Text, blocks
from marlctl.report.files import with_figures
from marlctl.report.model import Report

_KINDS = {
    "text": "{}",
    "meta": "{}",
    "note": "{}",
    "aside": "_{}_",
    "item": "- {}",
    "warning": "> **Warning:** {}",
}


def markdown(report: Report, out: Path, kind: str = "png") -> list[Path]:
    folder = out.parent / f"{out.stem}_files"
    return with_figures(report, out, folder, kind, lambda doc, links: render(report, links, doc))


def render(report: Report, links: dict[str, str], document: list[Block] | None = None) -> str:
    """`links` maps each drawn figure's key to its path relative to the document; `document`
    is the report's blocks where they are built already."""
    document = blocks(report) if document is None else document
    parts = [part for block in document for part in _block(block, links)]
    return "\n\n".join(parts) + "\n"


def _block(block: Block, links: dict[str, str]) -> list[str]:
    if isinstance(block, Heading):
        return ["#" * block.level + " " + _text(block.text)]
    if isinstance(block, Paragraph):
        return [_KINDS[block.kind].format(_text(block.text))]
    if isinstance(block, Table):
        return [table(block)]
    return _figure(block, links)


def _figure(figure: Figure, links: dict[str, str]) -> list[str]:
    if figure.key not in links:
        return []
    if links[figure.key].endswith(".pdf"):
        return [f"[{figure.alt} (PDF)]({links[figure.key]})"]
    return [f"![{figure.alt}]({links[figure.key]})"]


def _text(text: Text) -> str:
    return "".join(f"`{span.text}`" if isinstance(span, Code) else span for span in text)


def table(block: Table) -> str:
    lines = ["| " + " | ".join(block.header) + " |", "|" + "---|" * len(block.header)]
    for i, cells in enumerate(block.body):
        shown = [f"**{c}**" if block.best.get((i, j)) else c for j, c in enumerate(cells)]
        if block.code_column and shown:
            shown[0] = f"`{shown[0]}`"
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in shown) + " |")
    return "\n".join(lines)
