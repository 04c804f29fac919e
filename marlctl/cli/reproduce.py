"""`marlctl reproduce`: a suite's cells trained and judged against their references."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from marlctl.cli import output
from marlctl.cli.app import JsonOpt, Overrides
from marlctl.cli.output import emit_json, exit_codes, print_rows, say, stop_on_sigterm
from marlctl.cli.sweep import ClusterOpt, CpusOpt, LauncherKind, PartitionOpt, TimeMinOpt

CellsOpt = Annotated[
    str | None,
    typer.Option("--cells", help="Only these cells: names or shell patterns, comma-separated."),
]
SeedsOpt = Annotated[
    int | None, typer.Option("--seeds", min=1, help="Seeds per cell (default: each cell's own).")
]
ScaleOpt = Annotated[
    float,
    typer.Option(
        "--budget-scale",
        min=0.001,
        max=1.0,
        help="Train each cell for this fraction of its budget; its verdict is then inconclusive.",
    ),
]
RerunOpt = Annotated[
    bool,
    typer.Option("--rerun", help="Train every seed, also those the store holds finished."),
]
CompareOpt = Annotated[
    str | None,
    typer.Option(
        "--compare",
        metavar="ALGO,...",
        help="Also run these algorithm presets through every cell (beside the suite's"
        " `compare`), judged against the same references.",
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the cells, their runs and the estimated cost (from a few seconds of"
        " measured training per cell); train nothing.",
    ),
]
OutOpt = Annotated[
    str | None,
    typer.Option(
        "--out",
        help="The results document: a report of the judged runs with verdicts, a performance"
        " profile and a figure per cell (.md, .html, .json or .csv; default SUITE-NAME.md).",
    ),
]
# Seconds of training a dry run measures per cell: long enough for a steady rate.
ESTIMATE_SECONDS = 2.0


def reproduce(
    suite: Annotated[str, typer.Argument(help="Suite file (.yaml or .toml).")],
    overrides: Overrides = None,
    cells: CellsOpt = None,
    seeds: SeedsOpt = None,
    scale: ScaleOpt = 1.0,
    rerun: RerunOpt = False,
    compare: CompareOpt = None,
    dry_run: DryRunOpt = False,
    out: OutOpt = None,
    launcher: Annotated[
        LauncherKind,
        typer.Option("--launcher", help="local: cells one after another; submitit: a job each."),
    ] = LauncherKind.local,
    cluster: ClusterOpt = None,
    partition: PartitionOpt = None,
    cpus: CpusOpt = None,
    time_min: TimeMinOpt = 60,
    as_json: JsonOpt = False,
) -> None:
    """Train a suite's cells and judge each against its published reference; seeds already
    finished with the same spec and versions are not trained again, stopped ones resume."""
    stop_on_sigterm()
    methods = [m.strip() for m in (compare or "").split(",") if m.strip()]
    with exit_codes(as_json):
        from marlctl.reproduce import runner

        planned = runner.plan_suite(suite, overrides or [], cells, seeds, scale, methods)
        if dry_run:
            rows = runner.dry_run(planned, ESTIMATE_SECONDS, rerun)
        elif launcher is LauncherKind.submitit:
            from marlctl.reproduce.launchers import run_submitit
            from marlctl.sweep import Launcher

            chosen = Launcher("submitit", cluster, partition, 0, cpus, time_min)
            outcomes = run_submitit(planned, rerun, chosen)
        else:
            outcomes = runner.reproduce(planned, rerun)
        if not dry_run:
            target = Path(out or f"{planned[0].suite}.md")
            from marlctl.reproduce.results import write_results

            metrics = {cp.name: cp.metric for cp in planned}
            written = write_results(planned[0].suite, outcomes, metrics, target)
    if dry_run:
        _print_dry_run(rows, as_json)
        return
    failed = any(o.kind in ("failed", "interrupted") for o in outcomes)
    if as_json:
        emit_json(
            {
                "ok": not failed,
                "cells": [o.to_dict() for o in outcomes],
                "written": [str(p) for p in written],
            }
        )
    else:
        print_rows(
            ["cell", "algorithm", "verdict", "ours", "reference", "env steps", "seeds",
             "wall-clock", "run"],
            [_row(o) for o in outcomes],
            whole=(0, 8),
        )  # fmt: skip
        for o in outcomes:
            for note in o.notes:
                say(output.out, f"{o.name} ({o.method}): {note}")
        if written:
            say(output.out, f"results: {written[0]}")
    if any(o.kind == "interrupted" for o in outcomes):
        raise typer.Exit(130)
    if failed:
        raise typer.Exit(1)


def _row(o) -> list[str]:
    ours = "—" if o.ours is None else f"{o.ours.value:.2f} [{o.ours.low:.2f}, {o.ours.high:.2f}]"
    ref = "—" if o.reference is None else f"[{o.reference[0]:.2f}, {o.reference[1]:.2f}]"
    verdict = f"{o.kind}: {o.reason}" if o.reason else o.kind
    seeds = _seeds(o.seeds, (o.reused, "done before"), (o.resumed, "resumed"))
    return [o.name, o.method or "—", verdict, ours, ref, f"{o.budget:,}", seeds,
            f"{o.wall_s:.0f} s", o.run_id or "—"]  # fmt: skip


def _seeds(total: int, *counts: tuple[int, str]) -> str:
    """`5 (3 done before, 1 resumed)`: the seeds, and how many of them each count names."""
    said = [f"{n} {what}" for n, what in counts if n]
    return f"{total} ({', '.join(said)})" if said else str(total)


def _print_dry_run(rows, as_json: bool) -> None:
    from marlctl.report.labels import duration  # marlctl.report imports MLflow: not at start-up

    total = sum(r.cost.total_s for r in rows if r.cost is not None)
    if as_json:
        cells = [{**vars(r), "cost": r.cost.to_dict() if r.cost else None} for r in rows]
        emit_json({"ok": True, "cells": cells, "estimated_s": total})
        return
    body = []
    for r in rows:
        if r.refused is not None:
            body.append([r.name, r.method, "—", str(r.seeds), "—", f"refused: {r.refused}"])
            continue
        seeds = _seeds(r.seeds, (r.finished, "finished before"), (r.resumed, "stopped, to resume"))
        cost = "nothing to train" if r.cost is None else duration(r.cost.total_s)
        if r.cost is not None:
            cost += f" ({r.cost.env_steps_per_s:,.0f} env steps/s measured)"
        body.append([r.name, r.method, r.env, seeds, f"{r.budget:,}", cost])
    print_rows(
        ["cell", "algorithm", "env", "seeds", "env steps per seed", "estimated wall-clock"],
        body,
        whole=(0,),
    )
    say(output.out, f"estimated total: {duration(total)}, one cell after another")
