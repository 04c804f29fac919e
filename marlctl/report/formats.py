"""A built report written as a file: Markdown with figure files, one self-contained HTML
page, CSV or JSON. Every format says the same things, from the same document
(`document.blocks`) or the same data (`data.to_dict`); files are written whole or not at all.
"""

from __future__ import annotations

import json
from pathlib import Path

from marlctl.report.content import notes, warnings
from marlctl.report.data import crossplay_csv, to_csv, to_dict
from marlctl.report.files import write_atomic
from marlctl.report.model import Report
from marlctl.report.terminal import rich_tables
from marlctl.report.write_html import html_page
from marlctl.report.write_markdown import markdown

__all__ = ["notes", "rich_tables", "to_csv", "to_dict", "warnings", "write"]


def write(report: Report, fmt: str, out: Path, figure_files: str | None = None) -> list[Path]:
    """Write the report as `fmt` at `out`; returns every file written. `figure_files`
    (png | svg | pdf) is the format of the figure files: Markdown's default is png; HTML
    writes files only when asked, its plots being interactive and inline."""
    if fmt == "md":
        return markdown(report, out, figure_files or "png")
    if fmt == "html":
        return html_page(report, out, figure_files)
    if fmt == "csv":
        write_atomic(out, to_csv(report))
        crossplay = crossplay_csv(report)
        if crossplay is not None:
            beside = out.with_name(f"{out.stem}_crossplay.csv")
            write_atomic(beside, crossplay)
            return [out, beside]
    else:
        write_atomic(out, json.dumps(to_dict(report), indent=2, default=str) + "\n")
    return [out]
