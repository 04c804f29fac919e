"""`marlctl sweep`."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from rich.table import Table

from marlctl.cli import output
from marlctl.cli.app import JsonOpt
from marlctl.cli.output import emit_json, exit_codes, say, short, stop_on_sigterm
from marlctl.cli.progress import with_sweep_progress


class LauncherKind(StrEnum):
    local = "local"
    submitit = "submitit"


OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Hydra overrides; sweep overrides add to the space: algo.clip=0.1,0.2 "
        "'algo.lr=tag(log,interval(1e-5,1e-3))'",
        show_default=False,
    ),
]
WorkersOpt = Annotated[
    int, typer.Option("--workers", min=1, help="Worker processes (or jobs) sharing the study.")
]
TrialsOpt = Annotated[
    int | None,
    typer.Option("--trials", min=1, help="Trials in the whole study (default: sweep.trials)."),
]
StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="Optuna storage: a journal file, or postgresql://... shared by many machines "
        "(default: sweep.storage, else ./optuna.journal).",
    ),
]
StatusOpt = Annotated[bool, typer.Option("--status", help="Show the study's results; run nothing.")]
OutDirOpt = Annotated[
    str | None,
    typer.Option(
        "--out",
        help="Folder for best.yaml (default: ./sweep-STUDY, the study name made a file name).",
    ),
]
LauncherOpt = Annotated[
    LauncherKind, typer.Option("--launcher", help="local processes, or submitit jobs.")
]
ClusterOpt = Annotated[
    str | None,
    typer.Option("--cluster", help="submitit: slurm or local (default: what it detects)."),
]
PartitionOpt = Annotated[str | None, typer.Option("--partition", help="submitit: SLURM partition.")]
CpusOpt = Annotated[int | None, typer.Option("--cpus", min=1, help="submitit: CPUs per worker.")]
TimeMinOpt = Annotated[int, typer.Option("--time", min=1, help="submitit: minutes per worker job.")]


def sweep(
    spec: Annotated[str, typer.Argument(help="Spec file with a sweep: section.")],
    overrides: OverridesArg = None,
    workers: WorkersOpt = 1,
    trials: TrialsOpt = None,
    storage: StorageOpt = None,
    status: StatusOpt = False,
    out_dir: OutDirOpt = None,
    launcher: LauncherOpt = LauncherKind.local,
    cluster: ClusterOpt = None,
    partition: PartitionOpt = None,
    gpus: Annotated[int, typer.Option("--gpus", min=0, help="submitit: GPUs per worker.")] = 0,
    cpus: CpusOpt = None,
    time_min: TimeMinOpt = 60,
    as_json: JsonOpt = False,
) -> None:
    """Search hyperparameters: an Optuna study over sweep.space, resumable and shareable."""
    from pathlib import Path

    stop_on_sigterm()
    out = Path(out_dir) if out_dir else None
    with exit_codes(as_json):
        from marlctl.sweep import Launcher, open_sweep, prepare, run_sweep, sweep_status

        if status:
            summary = sweep_status(spec, overrides or [], storage, out)
        else:
            ctx, settings = prepare(spec, overrides or [], storage, trials)
            chosen = Launcher(
                launcher.value,
                cluster,
                partition,
                gpus,
                cpus,
                time_min,
            )
            study = open_sweep(ctx, settings, chosen)  # refusals before the progress display
            summary = with_sweep_progress(
                lambda show: run_sweep(ctx, settings, workers, chosen, out, show, study),
                ctx.trials,
                as_json,
            )
    if as_json:
        emit_json(summary.to_dict())
    else:
        _print_sweep(summary)
    if summary.interrupted:
        raise typer.Exit(130)
    if not summary.ok:
        raise typer.Exit(1)


def _print_sweep(summary) -> None:
    counts = ", ".join(f"{n} {state.lower()}" for state, n in summary.counts.items()) or "none"
    retried = f"; {summary.retried} lost or interrupted and re-run" if summary.retried else ""
    say(
        output.out,
        f"({summary.storage}): trials {counts} of {summary.budget}{retried}; "
        f"{summary.env_steps:,} env steps in all",
        f"study {summary.study}",
        "bold",
    )
    if summary.top:
        table = Table(title="top trials", caption=f"MLflow study run {summary.study_run_id}")
        for column in ("rank", "trial", "objective", "params", "env steps"):
            table.add_column(column)
        for rank, row in enumerate(summary.top, start=1):
            params = ", ".join(f"{k}={short(v)}" for k, v in row["params"].items())
            steps = f"{row['env_steps']:,}" if row["env_steps"] is not None else "-"
            table.add_row(str(rank), str(row["trial"]), f"{row['value']:.4g}", params, steps)
        output.out.print(table)
    if summary.best_spec:
        say(output.out, f"best spec: {summary.best_spec} (marlctl run {summary.best_spec})")
    for error in summary.worker_errors:
        say(output.err, str(error), "error:", "red")
    if summary.best is None and not summary.interrupted:
        output.err.print("[red]no trial completed[/red]")
