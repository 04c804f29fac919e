"""`marlctl run`: train a spec's seeds, show its plan (`--dry-run`), or continue an interrupted run
(`--resume`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from marlctl.cli import output
from marlctl.cli.app import JsonOpt, Overrides, TrustOpt, load, trust
from marlctl.cli.output import (
    arg_problem,
    emit_json,
    exit_codes,
    print_rows,
    say,
    stop_on_sigterm,
)
from marlctl.cli.progress import with_progress
from marlctl.errors import SpecError
from marlctl.redact import redact


def run(
    spec: Annotated[str | None, typer.Argument(help="Spec file (.yaml or .toml).")] = None,
    overrides: Overrides = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the compiled plan and exit.")
    ] = False,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume", metavar="RUN_ID", help="Continue an interrupted run from its checkpoint."
        ),
    ] = None,
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            "--tracking-uri", help="MLflow store holding the run to resume (default: ./mlflow.db)."
        ),
    ] = None,
    skip_finished: Annotated[
        bool,
        typer.Option(
            "--skip-finished",
            help="Train only the seeds the store does not hold finished with the same spec and "
            "versions.",
        ),
    ] = False,
    trust_factory: TrustOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate, compile and train every seed; log to MLflow; print a summary."""
    stop_on_sigterm()
    trust(trust_factory)
    with exit_codes(as_json):
        if resume is not None:
            if spec is not None:
                raise SpecError([arg_problem("--resume takes a run id, not a spec file")])
            from marlctl.launch import resume as resume_run

            summary = with_progress(lambda make: resume_run(resume, tracking_uri, make), as_json)
        else:
            if spec is None:
                raise SpecError([arg_problem("a spec file is required (or --resume RUN_ID)")])
            loaded, plan = load(spec, overrides, tracked=True)
            if dry_run:
                _print_plan(plan, loaded, as_json)
                return
            if skip_finished:
                loaded, plan = _unfinished(spec, overrides, loaded, plan, as_json)
                if plan is None:
                    return
            from marlctl.cores import passive_wait

            # Set before torch loads: OpenMP reads how to wait once, as it starts.
            with passive_wait(plan.passive_wait):
                from marlctl import tracking
                from marlctl.launch import run_plan

                tracking.check_reachable(loaded.spec.tracking.uri)  # before the display
                summary = with_progress(lambda make: run_plan(loaded, plan, make(plan)), as_json)
    if as_json:
        emit_json(summary.to_dict())
    else:
        _print_summary(summary)
    if summary.interrupted:
        raise typer.Exit(130)
    if not summary.ok:
        raise typer.Exit(1)


def _unfinished(spec: str, overrides: list[str] | None, loaded, plan, as_json: bool):
    """The spec and plan of the seeds the store does not hold finished; (loaded, None) where
    every seed finished before, which it prints."""
    from marlctl.stored import finished_seeds

    done = finished_seeds(loaded, plan, "eval/return_mean")
    todo = [r.seed for r in plan.runs if r.seed not in done]
    seeds = {r.seed for r in plan.runs}
    skipped = [
        {"seed": s, "run_id": run_id, "eval_return": value}
        for s, (value, run_id) in sorted(done.items())
        if s in seeds
    ]
    if not todo:
        if as_json:
            emit_json({"ok": True, "trained": [], "finished_before": skipped})
        else:
            output.out.print("every seed finished before with this spec; nothing to train")
            cells = [[str(r["seed"]), f"{r['eval_return']:.2f}", r["run_id"]] for r in skipped]
            print_rows(["seed", "eval return", "MLflow run"], cells, whole=(2,))
        return loaded, None
    if skipped:
        listed = ", ".join(str(r["seed"]) for r in skipped)
        say(
            output.err,
            f"seeds {listed} finished before with this spec: not trained again",
            "note",
            "yellow",
        )
        loaded, plan = load(spec, [*(overrides or []), f"seeds=[{','.join(map(str, todo))}]"])
    return loaded, plan


def _print_plan(plan, loaded, as_json: bool) -> None:
    if as_json:
        emit_json({"ok": True, "plan": plan.to_dict(), "spec": loaded.resolved})
        return
    env = plan.env
    groups = ", ".join(
        f"{g.name}×{g.n_agents} (obs {list(g.obs_shape)}, "
        f"{'discrete ' + str(g.n_actions) if g.discrete else 'continuous ' + str(g.n_actions)})"
        for g in env.groups
    )
    output.out.print(
        f"[bold]{plan.experiment}[/bold]: {plan.algo} on {env.id} — {groups}; "
        f"state dim {env.state_dim} "
        + (f"(a {'x'.join(map(str, env.state_frame))} frame, " if env.state_frame else "(")
        + f"{'env.state()' if env.state_from_env else 'observations concatenated'})",
        highlight=False,
        soft_wrap=True,
    )
    output.out.print(
        f"{len(plan.runs)} run(s), {plan.parallel_runs} at once on {plan.cores} core(s); "
        f"{plan.steps_per_iteration:,} {plan.step_unit} per iteration"
        + ("; seeds batched in one process per device" if plan.batch_seeds else ""),
        highlight=False,
        soft_wrap=True,
    )
    if plan.threads_note:
        output.out.print(f"threads: {plan.threads_note}", highlight=False, soft_wrap=True)
    table = Table(
        "run", "seed", "device", "threads", "num_envs", plan.step_unit, "iterations", "est. memory"
    )
    for r in plan.runs:
        table.add_row(
            str(r.index),
            str(r.seed),
            r.device,
            str(r.threads),
            str(r.num_envs),
            f"{r.total_env_steps:,}",
            f"{r.iterations:,}",
            f"{r.est_memory_mb:.1f} MiB",
        )
    output.out.print(table)


def _print_summary(summary) -> None:
    from rich import box

    # Run ids whole at any width, to be copied: the other columns wrap, failures go below.
    table = Table(
        title=Text(summary.experiment),
        caption=redact(f"MLflow: {summary.tracking_uri}"),
        box=box.SIMPLE_HEAD,
    )
    # Cells wrap rather than end in '…' where the terminal (or a pipe's 80 columns) is narrow.
    table.add_column("seed", overflow="fold")
    table.add_column("status", overflow="fold")
    table.add_column("eval return", justify="right", overflow="fold")
    table.add_column("train env steps/s", justify="right", overflow="fold")
    table.add_column("MLflow run", no_wrap=True, min_width=32)

    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for r in summary.runs:
        table.add_row(
            str(r.seed), r.status, fmt(r.final_return, ".2f"), fmt(r.steps_per_s, ",.0f"), r.run_id
        )
    agg = summary.aggregate()
    spread = f" ± {agg['eval/return_std']:.2f}" if agg["eval/return_std"] is not None else ""
    table.add_row(
        "all",
        "interrupted" if summary.interrupted else "ok" if summary.ok else "failed",
        fmt(agg["eval/return_mean"], ".2f") + spread,
        fmt(agg["perf/env_steps_per_s"], ",.0f"),
        summary.parent_run_id,
        style="bold",
    )
    output.out.print(table)
    for r in summary.runs:
        if r.error is not None:
            where = f" (traceback: {r.trace_file})" if r.trace_file else ""
            output.out.print(Text(f"seed {r.seed} {r.status}: {r.error}{where}"), soft_wrap=True)
    if summary.interrupted:
        output.out.print(Text(f"to continue: {resume_command(summary)}"), soft_wrap=True)


def resume_command(summary) -> str:
    """The command that continues every unfinished seed of an interrupted invocation."""
    from marlctl import tracking

    command = f"marlctl run --resume {summary.parent_run_id}"
    if summary.tracking_uri != tracking.default_uri():
        command += f" --tracking-uri {redact(summary.tracking_uri)}"
    return command
