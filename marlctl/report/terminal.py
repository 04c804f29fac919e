"""The report as rich tables, for the terminal."""

from __future__ import annotations

from marlctl.report import reproduction
from marlctl.report.content import (
    crossplay_tables,
    dataset_rows,
    rows,
    scenario_rows,
    sweep_summary,
    trial_rows,
    verdict_rows,
)
from marlctl.report.model import Report


def rich_tables(report: Report) -> list:
    from rich.markup import escape
    from rich.table import Table

    header, body, marks = rows(report)
    tables = []
    if body:
        title = escape(f"{report.metric} at the end of training")
        table = Table(*map(escape, header), title=title)
        for i, cells in enumerate(body):
            table.add_row(
                *(
                    f"[bold green]{escape(c)}[/bold green]" if marks.get((i, j)) else escape(c)
                    for j, c in enumerate(cells)
                )
            )
        tables.append(table)
    results = reproduction.cell_results(report)
    if results:
        head, cells = verdict_rows(report, results)
        verdicts = Table(*map(escape, head), title="suite cells against their references")
        for row in cells:
            verdicts.add_row(*map(escape, row))
        tables.append(verdicts)
    for sweep in report.sweeps:
        head, cells = trial_rows(sweep)
        title = escape(f"sweep {sweep.name}: best trials — {sweep_summary(sweep)}")
        trials = Table(*map(escape, head), title=title)
        for row in cells:
            trials.add_row(*map(escape, row))
        tables.append(trials)
        if sweep.importances:
            title = escape(f"sweep {sweep.name}: importances")
            imp = Table("parameter", "importance", title=title)
            for name, value in sweep.importances.items():
                imp.add_row(escape(name), f"{value:.3f}")
            tables.append(imp)
    datasets = dataset_rows(report)
    if datasets is not None:
        tables.append(_plain("Offline runs and their datasets", *datasets))
    scenarios = scenario_rows(report)
    if scenarios is not None:
        tables.append(_plain("Melting Pot scenarios: focal per-capita return", *scenarios))
    for title, head, cells in crossplay_tables(report):
        tables.append(_plain(escape(title), head, cells))
    return tables


def _plain(title: str, head: list[str], cells: list[list[str]]):
    """A titled table of text cells, each escaped for rich."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(*map(escape, head), title=title)
    for row in cells:
        table.add_row(*map(escape, row))
    return table
