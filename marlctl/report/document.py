"""The report as a document: the blocks every written format shows, in order, built once
from a report. A writer (`write_markdown`, `write_html`) only renders them.

Text is a tuple of spans: plain strings and `Code` (a metric or a study's name). A paragraph's
`kind` says what it is to the reader, and each writer styles the kinds its own way: a
`warning` must be seen before an interval is trusted; a `note` explains what precedes it, an
`aside` qualifies it; an `item` is one of a list of remarks; `meta` describes the report or a
sweep."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal

from marlctl.report import appendix, reproduction
from marlctl.report.content import (
    CROSSPLAY_EXPLAINED,
    DATASETS_EXPLAINED,
    EXPLAINED,
    POINTS_EXPLAINED,
    PROFILE_EXPLAINED,
    SCENARIOS_EXPLAINED,
    VERDICTS_EXPLAINED,
    crossplay_tables,
    dataset_rows,
    notes,
    point_rows,
    profile_rows,
    rows,
    scenario_rows,
    seed_rows,
    sweep_summary,
    trial_rows,
    verdict_rows,
    warnings,
)
from marlctl.report.figures import has_curves
from marlctl.report.labels import plural
from marlctl.report.model import Report, Sweep


@dataclass(frozen=True)
class Code:
    text: str


Span = str | Code
Text = tuple[Span, ...]


@dataclass(frozen=True)
class Heading:
    level: int
    text: Text


@dataclass(frozen=True)
class Paragraph:
    text: Text
    kind: Literal["text", "meta", "note", "aside", "item", "warning"] = "text"


@dataclass(frozen=True)
class Table:
    header: list[str]
    body: list[list[str]]
    best: dict[tuple[int, int], bool] = field(default_factory=dict)  # (row, column) cells
    code_column: bool = False  # the first column holds names a reader copies


@dataclass(frozen=True)
class Figure:
    """A figure of the report: `key` names its file (`curves`, `sweep{i}_history`,
    `sweep{i}_importances`, `sweep{i}_schedules`); `plot` says what it draws from `source`."""

    key: str  # also `cell{i}` (a suite cell's curves) and `profile`
    plot: Literal["curves", "history", "importances", "profile", "schedules"]
    source: Report | Sweep
    alt: str
    title: str | None = None  # a heading where the format shows the plot itself


Block = Heading | Paragraph | Table | Figure
_METRIC = "\x00metric\x00"  # where a sentence names the metric, to be shown as code


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def blocks(report: Report) -> list[Block]:
    """Every block of the report, in the order each format shows them."""
    header, body, best = rows(report)
    groups = plural(len(report.groups), "group")
    out: list[Block] = [
        Heading(1, (f"{report.title}: marlctl report" if report.title else "marlctl report",)),
        Paragraph(
            (
                f"{groups} by {', '.join(report.group_by) or 'nothing'} · ",
                Code(report.metric),
                f", {report.direction} · MLflow store: {report.store} · {stamp()}",
            ),
            "meta",
        ),
    ]
    if body:
        out += [Table(header, body, best), Paragraph((EXPLAINED,), "note")]
    out += [Paragraph((w,), "warning") for w in warnings(report)]
    out += [Paragraph((n,), "item") for n in notes(report)]
    if has_curves(report):
        out.append(Figure("curves", "curves", report, "sample efficiency", "Sample efficiency"))
    out += _reproduction_blocks(report)
    if report.groups:
        out += [Heading(2, ("Per-seed results",)), Table(*seed_rows(report))]
    for i, sweep in enumerate(report.sweeps):
        out += _sweep_blocks(i, sweep)
    datasets = dataset_rows(report)
    if datasets is not None:
        out += [
            Heading(2, ("Offline runs and their datasets",)),
            Table(*datasets),
            Paragraph((DATASETS_EXPLAINED,), "note"),
        ]
    scenarios = scenario_rows(report)
    if scenarios is not None:
        out += [
            Heading(2, ("Melting Pot scenarios",)),
            Table(*scenarios),
            Paragraph((SCENARIOS_EXPLAINED,), "note"),
        ]
    found = crossplay_tables(report)
    if found:
        out.append(Heading(2, ("Cross-play",)))
        for title, head, cells in found:
            out += [Heading(3, (f"{title[0].upper()}{title[1:]}",)), Table(head, cells)]
        out.append(Paragraph((CROSSPLAY_EXPLAINED,), "note"))
    if report.groups:
        out += [Heading(2, ("Appendix",)), *_appendix_blocks(report)]
    return out


def _reproduction_blocks(report: Report) -> list[Block]:
    """The verdict of every suite cell in the report, the performance profile across them
    and a figure per cell: its groups' curves against the reference."""
    results = reproduction.cell_results(report)
    if not results:
        return []
    counts = Counter(result.verdict.kind for result in results)
    tally = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    out: list[Block] = [
        Heading(2, ("Reproduction",)),
        Table(*verdict_rows(report, results)),
        Paragraph((f"{plural(len(results), 'verdict')}: {tally}.",), "text"),
        Paragraph((VERDICTS_EXPLAINED,), "note"),
    ]
    header, body = point_rows(results)
    if body:
        out += [
            Heading(3, ("Reference points",)),
            Table(header, body),
            Paragraph((POINTS_EXPLAINED,), "note"),
        ]
    profiled = reproduction.profiles(report, results)
    if profiled:
        out += [
            Heading(3, ("Performance profile",)),
            Table(*profile_rows(profiled)),
            Figure("profile", "profile", report, "performance profile"),
            Paragraph((PROFILE_EXPLAINED,), "note"),
        ]
    for i, ((suite, cell), members) in enumerate(reproduction.cells_of(results).items()):
        part = replace(
            report, groups=[report.groups[g] for g in members], title=f"{suite} · {cell}"
        )
        if has_curves(part):
            out += [
                Heading(3, (f"{suite} · {cell}",)),
                Figure(f"cell{i}", "curves", part, f"{cell}: curves against the reference"),
            ]
    return out


def _sweep_blocks(i: int, sweep: Sweep) -> list[Block]:
    out: list[Block] = [
        Heading(2, ("Sweep ", Code(sweep.name))),
        Paragraph((sweep_summary(sweep),), "meta"),
    ]
    head, cells = trial_rows(sweep)
    out.append(Table(head, cells) if cells else Paragraph(("No complete trials.",)))
    if any(t.value is not None for t in sweep.trials):
        out.append(Figure(f"sweep{i}_history", "history", sweep, "optimisation history"))
    if sweep.importances:
        out.append(Figure(f"sweep{i}_importances", "importances", sweep, "parameter importances"))
    if any(t.schedule for t in sweep.trials):
        alt = "each population member's hyperparameters over training"
        out.append(Figure(f"sweep{i}_schedules", "schedules", sweep, alt))
    if sweep.note:
        out.append(Paragraph((sweep.note,), "aside"))
    return out


def _appendix_blocks(report: Report) -> list[Block]:
    out: list[Block] = []
    for block in appendix.blocks(report):
        out.append(Heading(3, (block.heading,)))
        out += [Paragraph((text,)) for text in block.text]
        if block.rows:
            rows_ = [list(r) for r in block.rows]
            out.append(Table(list(block.header), rows_, code_column=block.code))
    out.append(Heading(3, ("Evaluation protocol",)))
    protocols = appendix.evaluation(report)
    common = appendix.shared(protocols)
    if common is not None:
        sentence = appendix.protocol_sentence(report.metric, common, _METRIC)
    else:
        sentence = appendix.policy_sentence(report.metric, _METRIC)
    before, _, after = sentence.partition(_METRIC)
    out.append(Paragraph((before, Code(report.metric), after)))
    if common is None:
        out.append(Table(*_protocol_table(protocols)))
    return out


def _protocol_table(protocols: list[appendix.Evaluation]) -> tuple[list[str], list[list[str]]]:
    header = ["group", "episodes per evaluation", "evaluated", "training"]
    body = [
        [
            p.group,
            appendix.episodes_text(p.episodes),
            appendix.every_text(p.every),
            appendix.budget_text(p.budget),
        ]
        for p in protocols
    ]
    return header, body
