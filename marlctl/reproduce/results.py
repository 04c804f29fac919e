"""A suite's results as a document: `marlctl report` of the seed runs a reproduce judged,
grouped by cell and algorithm, with the verdicts, the performance profile and a figure per cell
(`report.reproduction`). Cells compared on different metrics get a document each."""

from __future__ import annotations

import re
from pathlib import Path

from marlctl.reproduce.runner import CellOutcome

GROUP_BY = ("cell", "algo.name")


def write_results(
    suite: str, outcomes: list[CellOutcome], metrics: dict[str, str], out: Path
) -> list[Path]:
    """Write the report of the judged cells' runs at `out` (its format by suffix: md, html,
    json or csv); `metrics`: each cell's metric. Returns the files written."""
    from marlctl.report import build
    from marlctl.report.formats import write

    by_store: dict[tuple[str | None, str], list[str]] = {}
    for o in outcomes:
        if o.run_ids:
            by_store.setdefault((o.uri, metrics[o.name]), []).extend(o.run_ids)
    written: list[Path] = []
    fmt = out.suffix.lstrip(".") or "md"
    for index, ((uri, metric), run_ids) in enumerate(by_store.items()):
        shown = f"{out.stem}_{index + 1}_{_slug(metric)}{out.suffix}"
        path = out if index == 0 else out.with_name(shown)
        report = build(uri, [], run_ids, [], metric=metric, group_by=GROUP_BY)
        report.title = f"suite {suite}"
        written += write(report, fmt, path)
    return written


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")
