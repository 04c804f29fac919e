"""`marlctl report`."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer

from marlctl.cli import output
from marlctl.cli.app import JsonOpt
from marlctl.cli.output import arg_problem, emit_json, exit_codes, print_table, say
from marlctl.errors import SpecError


class ReportFormat(StrEnum):
    md = "md"
    html = "html"
    csv = "csv"
    json = "json"


ExperimentsArg = Annotated[
    list[str] | None,
    typer.Argument(metavar="[EXPERIMENT]...", help="Experiments to compare (default: all)."),
]
RunsOpt = Annotated[
    list[str] | None,
    typer.Option("--runs", help="Only these runs (parent, trial or seed), comma-separated."),
]
FiltersOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--filter", help="KEY=V1,V2 | KEY!=V | KEY<N (<=, >, >=) on params or tags; repeat."
    ),
]
GroupByOpt = Annotated[
    str | None,
    typer.Option(
        "--group-by",
        help="Comma-separated params or tags that make a group (default: algo.name,env.id,"
        " split further where runs differ in other params).",
    ),
]
DirectionOpt = Annotated[
    str | None, typer.Option("--direction", help="maximize | minimize (default: by metric).")
]
FmtOpt = Annotated[
    ReportFormat | None,
    typer.Option("--format", help="md | html | csv | json (default: from --out's suffix)."),
]
OutPathOpt = Annotated[
    str | None,
    typer.Option("--out", help="Write the report here (Markdown adds figure files)."),
]
FigureFilesOpt = Annotated[
    str | None,
    typer.Option(
        "--figures",
        help="png | svg | pdf: figure files beside an md report (default png) or an html"
        " one (default none: its plots are interactive).",
    ),
]
StorageOpt = Annotated[
    str | None,
    typer.Option("--storage", help="Optuna storage of a sweep (default: the one it used)."),
]
TrackingUriOpt = Annotated[
    str | None,
    typer.Option("--tracking-uri", help="MLflow store to read (default: ./mlflow.db)."),
]
NamesOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--label",
        help="GROUP=TEXT: name a group in tables, legends and the appendix (GROUP: its"
        " values comma-separated, e.g. mappo,mpe/simple_spread); repeat. Over the spec's"
        " `label`.",
    ),
]


def report(
    experiments: ExperimentsArg = None,
    runs: RunsOpt = None,
    filters: FiltersOpt = None,
    metric: Annotated[str, typer.Option("--metric", help="Metric to compare.")] = (
        "eval/return_mean"
    ),
    group_by: GroupByOpt = None,
    direction: DirectionOpt = None,
    fmt: FmtOpt = None,
    out_path: OutPathOpt = None,
    figure_files: FigureFilesOpt = None,
    storage: StorageOpt = None,
    tracking_uri: TrackingUriOpt = None,
    names: NamesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare finished runs: final score per group with bootstrap CIs, curves, sweeps."""
    from pathlib import Path

    with exit_codes(as_json):
        target = Path(out_path) if out_path else None
        chosen = _report_format(fmt, target)
        if target is None and chosen in ("md", "html"):
            target = Path(f"report.{chosen}")
        if direction not in (None, "maximize", "minimize"):
            raise SpecError([arg_problem(f"--direction: '{direction}' is not maximize|minimize")])
        if figure_files not in (None, "png", "svg", "pdf"):
            raise SpecError([arg_problem(f"--figures: '{figure_files}' is not png|svg|pdf")])
        if figure_files is not None and chosen not in ("md", "html"):
            raise SpecError([arg_problem("--figures: figure files go with an md or html report")])
        from marlctl import report as reporting
        from marlctl.report import formats

        built = reporting.build(
            tracking_uri,
            experiments or [],
            [r.strip() for text in runs or [] for r in text.split(",") if r.strip()],
            filters or [],
            metric,
            tuple(k.strip() for k in (group_by or "algo.name,env.id").split(",") if k.strip()),
            direction,
            storage,
            split=group_by is None,
            names=names or [],
        )
        if not built.groups and not built.sweeps:
            raise SpecError([arg_problem(_nothing_to_report(built))])
        try:
            written = []
            if target is not None:
                written = formats.write(built, chosen, target, figure_files)
        except OSError as error:
            raise SpecError([arg_problem(f"--out: cannot write '{target}': {error}")]) from None
    if as_json:
        emit_json({"ok": True, "exit_code": 0, **formats.to_dict(built), "files": written})
        return
    if target is None and chosen == "csv":
        sys.stdout.write(formats.to_csv(built))
        return
    if target is None and chosen == "json":
        emit_json(formats.to_dict(built))
        return
    for table in formats.rich_tables(built):
        print_table(table)
    for warning in formats.warnings(built):
        output.out.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)
    for note in formats.notes(built):
        output.out.print(note, style="dim", markup=False, highlight=False)
    for sweep in built.sweeps:
        if sweep.note:
            output.out.print(f"sweep {sweep.name}: {sweep.note}", style="dim", markup=False)
    for path in written:
        say(output.out, f"wrote {path}")


def _report_format(fmt, target) -> str | None:
    if fmt is not None:
        return fmt.value
    if target is None:
        return None
    suffix = target.suffix.lower().lstrip(".")
    known = {"md": "md", "markdown": "md", "html": "html", "htm": "html", "csv": "csv"}
    known["json"] = "json"
    if suffix not in known:
        raise SpecError(
            [arg_problem(f"--out: cannot tell the format of '{target}'; pass --format")]
        )
    return known[suffix]


def _nothing_to_report(built) -> str:
    left = ", ".join(f"{n} {s.lower()}" for s, n in sorted(built.left_out.items()))
    return f"no finished runs match in {built.uri}" + (f" ({left} left out)" if left else "")
