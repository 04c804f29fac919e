"""The `marlctl` command line. Thin: parses arguments, prints, and maps errors to exit codes.

torch and mlflow are imported only inside commands that train.
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from marlctl.errors import MarlctlError, SpecError, one_line
from marlctl.redact import redact

app = typer.Typer(
    name="marlctl",
    help="Declarative experiments for multi-agent reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# No emoji codes: `line100.yaml:` must not print as "line💯".
out = Console(emoji=False)
err = Console(stderr=True, emoji=False)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
TrustOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--trust-factory",
        metavar="MODULE:FACTORY",
        help="Let a spec read from the tracking store import and call this env factory or "
        "scripted policy (repeatable; or list them in MARLCTL_TRUSTED_FACTORIES).",
    ),
]


def _trust(factories: list[str] | None) -> None:
    """Trusted env factories for this command and the run processes it starts."""
    import os

    from marlctl.envs.registry import TRUSTED_FACTORIES_VAR

    if factories:
        known = [f for f in os.environ.get(TRUSTED_FACTORIES_VAR, "").split(",") if f]
        os.environ[TRUSTED_FACTORIES_VAR] = ",".join([*known, *factories])


Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Hydra overrides, e.g. algo.lr=3e-4 seeds=[0,1] +env.params.N=4", show_default=False
    ),
]


# Control characters (ANSI escapes among them) and line breaks in text from users.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def _say(
    console: Console, message: str, label: str = "", style: str = "", lines: bool = False
) -> None:
    """Print text that may come from the user (file names, spec values, exception messages)
    as it is: no markup or emoji, control characters shown escaped, passwords masked; one
    line unless `lines`."""
    control = _CONTROL_BUT_LINES if lines else _CONTROL
    text = Text(control.sub(_escaped, redact(message)))
    if label:
        text = Text.assemble((label, style), " ", text)
    console.print(text, highlight=False, soft_wrap=True)


def _print_table(table) -> None:
    """Tables print whole when piped: a file or pager gets long lines, not wrapped cells."""
    if out.is_terminal:
        out.print(table)
    else:
        Console(width=max(out.width, 200)).print(table)


def _emit_json(document: dict[str, Any]) -> None:
    sys.stdout.write(redact(json.dumps(document, indent=2, default=str)) + "\n")


# Problems printed one per line: past a screenful, a list is the same mistake repeated (or
# input that is not a spec) and would take seconds to print.
SHOWN_PROBLEMS = 50


def _fail(error: MarlctlError, as_json: bool) -> None:
    if as_json:
        problems = [str(p) for p in getattr(error, "problems", [])] or [str(error)]
        _emit_json({"ok": False, "exit_code": error.exit_code, "errors": problems})
    elif isinstance(error, SpecError):
        for problem in error.problems[:SHOWN_PROBLEMS]:
            _say(err, str(problem))
        count = len(error.problems)
        if count > SHOWN_PROBLEMS:
            err.print(f"... and {count - SHOWN_PROBLEMS:,} more (--json lists them all)")
        err.print(f"[red]{count} problem{'s' if count != 1 else ''}; nothing was run.[/red]")
    else:
        _say(err, str(error), "error:", "red")
    raise typer.Exit(error.exit_code)


def _load(spec_path: str, overrides: list[str] | None, tracked: bool = False):
    """The spec and its plan; with `tracked`, its tracking server answering too (the
    commands that log to it)."""
    from marlctl.plan import compile_plan
    from marlctl.spec import load_spec, tracking_problem

    loaded = load_spec(spec_path, overrides or [])
    for note in loaded.notes:  # what composition changed for the user, e.g. dropped params
        _say(err, note, "note", "yellow")
    problem = tracking_problem(loaded) if tracked else None
    try:
        plan = compile_plan(loaded)
    except SpecError as error:
        if problem is not None:
            from marlctl.spec import sort_problems

            raise SpecError(sort_problems([*error.problems, problem])) from None
        raise
    if problem is not None:
        raise SpecError([problem])
    return loaded, plan


# ---------------------------------------------------------------- validate


@app.command()
def validate(
    spec: Annotated[str, typer.Argument(help="Spec file (.yaml or .toml).")],
    overrides: Overrides = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a spec and its overrides; print every problem (exit 2) or nothing wrong (exit 0)."""
    try:
        loaded, plan = _load(spec, overrides, tracked=True)
    except MarlctlError as error:
        _fail(error, as_json)
    if as_json:
        _emit_json({"ok": True, "spec": loaded.resolved, "runs": len(plan.runs)})
    else:
        _say(err, f"{spec}: {plan.algo} on {plan.env.id}, {len(plan.runs)} run(s)", "ok", "green")


# ---------------------------------------------------------------- run


@app.command()
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
    trust_factory: TrustOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate, compile and train every seed; log to MLflow; print a summary."""
    _stop_on_sigterm()
    _trust(trust_factory)
    with _exit_codes(as_json):
        if resume is not None:
            if spec is not None:
                raise SpecError([_arg_problem("--resume takes a run id, not a spec file")])
            from marlctl.launch import resume as resume_run

            summary = _with_progress(lambda make: resume_run(resume, tracking_uri, make), as_json)
        else:
            if spec is None:
                raise SpecError([_arg_problem("a spec file is required (or --resume RUN_ID)")])
            loaded, plan = _load(spec, overrides, tracked=True)
            if dry_run:
                _print_plan(plan, loaded, as_json)
                return
            from marlctl.cores import passive_wait

            # Set before torch loads: OpenMP reads how to wait once, as it starts.
            with passive_wait(plan.passive_wait):
                from marlctl import tracking
                from marlctl.launch import run_plan

                tracking.check_reachable(loaded.spec.tracking.uri)  # before the display
                summary = _with_progress(lambda make: run_plan(loaded, plan, make(plan)), as_json)
    if as_json:
        _emit_json(summary.to_dict())
    else:
        _print_summary(summary)
    if summary.interrupted:
        raise typer.Exit(130)
    if not summary.ok:
        raise typer.Exit(1)


@contextmanager
def _exit_codes(as_json: bool):
    """The project's errors and Ctrl-C become messages and exit codes."""
    try:
        yield
    except MarlctlError as error:
        _fail(error, as_json)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/yellow]")
        raise typer.Exit(130) from None


def _stop_on_sigterm() -> None:
    """A scheduler's SIGTERM stops training the way Ctrl-C does: checkpoint, KILLED, 130."""
    import signal

    def stop(signum, frame):
        from marlctl.launch import Terminated

        raise Terminated

    signal.signal(signal.SIGTERM, stop)


def _arg_problem(message: str):
    from marlctl.errors import Problem

    return Problem("<arguments>", None, "", message)


def _with_progress(work, as_json: bool):
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    # Fits 80 columns (a piped or narrow terminal cuts a longer line short): env steps done
    # of the budget, training speed now, the return of training episodes (with exploration),
    # the last evaluation's return (deterministic policy).
    columns = [
        TextColumn("{task.description}"),
        BarColumn(bar_width=10),
        TextColumn("{task.fields[done]:>5}/{task.fields[budget]}"),
        TextColumn("{task.fields[rate]:>7} steps/s"),
        TextColumn("train {task.fields[ret]:>6}"),
        TextColumn("eval {task.fields[eval]:>6}"),
        TimeRemainingColumn(compact=True),
    ]
    with Progress(*columns, console=err, transient=False, disable=as_json) as bar:
        tasks: dict[int, Any] = {}
        marks: dict[int, tuple[float, int]] = {}

        def make(plan):
            for r in plan.runs:
                tasks[r.seed] = bar.add_task(
                    f"seed {r.seed}", total=r.total_env_steps, rate="-", ret="-", eval="-",
                    done="0", budget=_count(r.total_env_steps),
                )  # fmt: skip

            def update(event: dict[str, Any]) -> None:
                import time

                if event.get("kind") == "eval":
                    score = event["metrics"].get("eval/return_mean")
                    if score is not None and event["seed"] in tasks:
                        bar.update(tasks[event["seed"]], eval=f"{score:.2f}")
                    return
                now = time.perf_counter()
                seed, step = event["seed"], event["step"]
                last = marks.get(seed)
                marks[seed] = (now, step)
                fields: dict[str, Any] = {}
                if last is not None and now > last[0]:
                    fields["rate"] = f"{(step - last[1]) / (now - last[0]):,.0f}"
                if event.get("return") is not None:
                    fields["ret"] = f"{event['return']:.2f}"
                done = min(step, event["total"])
                bar.update(tasks[seed], completed=done, done=_count(done), **fields)

            return update

        return work(make)


def _count(steps: int) -> str:
    """A step count in at most five characters: 950, 12.5k, 1.50M."""
    if steps < 1_000:
        return str(steps)
    if steps < 1_000_000:
        return f"{steps / 1e3:.{1 if steps < 100_000 else 0}f}k"
    return f"{steps / 1e6:.{2 if steps < 10_000_000 else 1}f}M"


def _print_plan(plan, loaded, as_json: bool) -> None:
    if as_json:
        _emit_json({"ok": True, "plan": plan.to_dict(), "spec": loaded.resolved})
        return
    env = plan.env
    groups = ", ".join(
        f"{g.name}×{g.n_agents} (obs {list(g.obs_shape)}, "
        f"{'discrete ' + str(g.n_actions) if g.discrete else 'continuous ' + str(g.n_actions)})"
        for g in env.groups
    )
    out.print(
        f"[bold]{plan.experiment}[/bold]: {plan.algo} on {env.id} — {groups}; "
        f"state dim {env.state_dim} "
        f"({'env.state()' if env.state_from_env else 'observations concatenated'})",
        highlight=False,
        soft_wrap=True,
    )
    out.print(
        f"{len(plan.runs)} run(s), {plan.parallel_runs} at once on {plan.cores} core(s); "
        f"{plan.steps_per_iteration:,} env steps per iteration"
        + ("; seeds batched in one process per device" if plan.batch_seeds else ""),
        highlight=False,
        soft_wrap=True,
    )
    if plan.threads_note:
        out.print(f"threads: {plan.threads_note}", highlight=False, soft_wrap=True)
    table = Table(
        "run", "seed", "device", "threads", "num_envs", "env steps", "iterations", "est. memory"
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
    out.print(table)


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
    out.print(table)
    for r in summary.runs:
        if r.error is not None:
            where = f" (traceback: {r.trace_file})" if r.trace_file else ""
            out.print(Text(f"seed {r.seed} {r.status}: {r.error}{where}"), soft_wrap=True)
    if summary.interrupted:
        out.print(Text(f"to continue: {resume_command(summary)}"), soft_wrap=True)


def resume_command(summary) -> str:
    """The command that continues every unfinished seed of an interrupted invocation."""
    from marlctl import tracking

    command = f"marlctl run --resume {summary.parent_run_id}"
    if summary.tracking_uri != tracking.default_uri():
        command += f" --tracking-uri {redact(summary.tracking_uri)}"
    return command


# ---------------------------------------------------------------- sweep


class LauncherKind(StrEnum):
    local = "local"
    submitit = "submitit"


@app.command()
def sweep(
    spec: Annotated[str, typer.Argument(help="Spec file with a sweep: section.")],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="Hydra overrides; sweep overrides add to the space: algo.clip=0.1,0.2 "
            "'algo.lr=tag(log,interval(1e-5,1e-3))'",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Worker processes (or jobs) sharing the study.")
    ] = 1,
    trials: Annotated[
        int | None,
        typer.Option("--trials", min=1, help="Trials in the whole study (default: sweep.trials)."),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            help="Optuna storage: a journal file, or postgresql://... shared by many machines "
            "(default: sweep.storage, else ./optuna.journal).",
        ),
    ] = None,
    status: Annotated[
        bool, typer.Option("--status", help="Show the study's results; run nothing.")
    ] = False,
    out_dir: Annotated[
        str | None,
        typer.Option(
            "--out",
            help="Folder for best.yaml (default: ./sweep-STUDY, the study name made a file name).",
        ),
    ] = None,
    launcher: Annotated[
        LauncherKind, typer.Option("--launcher", help="local processes, or submitit jobs.")
    ] = LauncherKind.local,
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="submitit: slurm or local (default: what it detects)."),
    ] = None,
    partition: Annotated[
        str | None, typer.Option("--partition", help="submitit: SLURM partition.")
    ] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=0, help="submitit: GPUs per worker.")] = 0,
    cpus: Annotated[
        int | None, typer.Option("--cpus", min=1, help="submitit: CPUs per worker.")
    ] = None,
    time_min: Annotated[
        int, typer.Option("--time", min=1, help="submitit: minutes per worker job.")
    ] = 60,
    as_json: JsonOpt = False,
) -> None:
    """Search hyperparameters: an Optuna study over sweep.space, resumable and shareable."""
    from pathlib import Path

    _stop_on_sigterm()
    out = Path(out_dir) if out_dir else None
    with _exit_codes(as_json):
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
            summary = _with_sweep_progress(
                lambda show: run_sweep(ctx, settings, workers, chosen, out, show, study),
                ctx.trials,
                as_json,
            )
    if as_json:
        _emit_json(summary.to_dict())
    else:
        _print_sweep(summary)
    if summary.interrupted:
        raise typer.Exit(130)
    if not summary.ok:
        raise typer.Exit(1)


def _with_sweep_progress(work, budget: int, as_json: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [
        TextColumn("trials"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best {task.fields[best]}"),
        TextColumn("running {task.fields[running]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=err, disable=as_json) as bar:
        task = bar.add_task("trials", total=budget, running=0, best="-")
        seen: set[int] = set()

        def show(event: dict[str, Any]) -> None:
            for t in event["finished"]:
                if t["trial"] in seen:
                    continue
                seen.add(t["trial"])
                params = " ".join(f"{k}={_short(v)}" for k, v in t["params"].items())
                value = "" if t["value"] is None else f" {t['value']:.4g}"
                why = f" ({t['error'].splitlines()[0][:120]})" if t["error"] else ""
                if not as_json:
                    bar.console.print(
                        f"trial {t['trial']} {t['state']}{value}: {params}{why}",
                        highlight=False,
                        markup=False,
                        soft_wrap=True,
                    )
            best = "-" if event["best"] is None else f"{event['best']:.4g}"
            # Each running trial's env steps (its slowest seed's), as far as it has reported.
            from marlctl.report.labels import steps as count

            steps = event.get("progress", {})
            running = ", ".join(
                f"#{n} {count(done)}/{count(total)}" for n, (done, total) in sorted(steps.items())
            )
            unseen = event["running"] - len(steps)
            running = ", ".join(x for x in (running, f"{unseen} starting" * (unseen > 0)) if x)
            bar.update(task, completed=event["done"], running=running or "0", best=best)

        return work(show)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _print_sweep(summary) -> None:
    counts = ", ".join(f"{n} {state.lower()}" for state, n in summary.counts.items()) or "none"
    retried = f"; {summary.retried} lost or interrupted and re-run" if summary.retried else ""
    _say(
        out,
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
            params = ", ".join(f"{k}={_short(v)}" for k, v in row["params"].items())
            steps = f"{row['env_steps']:,}" if row["env_steps"] is not None else "-"
            table.add_row(str(rank), str(row["trial"]), f"{row['value']:.4g}", params, steps)
        out.print(table)
    if summary.best_spec:
        _say(out, f"best spec: {summary.best_spec} (marlctl run {summary.best_spec})")
    for error in summary.worker_errors:
        _say(err, str(error), "error:", "red")
    if summary.best is None and not summary.interrupted:
        err.print("[red]no trial completed[/red]")


# ---------------------------------------------------------------- list


class ListWhat(StrEnum):
    algos = "algos"
    envs = "envs"


class Backend(StrEnum):
    native = "native"
    pettingzoo = "pettingzoo"


class ReportFormat(StrEnum):
    md = "md"
    html = "html"
    csv = "csv"
    json = "json"


@app.command()
def report(
    experiments: Annotated[
        list[str] | None,
        typer.Argument(metavar="[EXPERIMENT]...", help="Experiments to compare (default: all)."),
    ] = None,
    runs: Annotated[
        list[str] | None,
        typer.Option("--runs", help="Only these runs (parent, trial or seed), comma-separated."),
    ] = None,
    filters: Annotated[
        list[str] | None,
        typer.Option(
            "--filter", help="KEY=V1,V2 | KEY!=V | KEY<N (<=, >, >=) on params or tags; repeat."
        ),
    ] = None,
    metric: Annotated[str, typer.Option("--metric", help="Metric to compare.")] = (
        "eval/return_mean"
    ),
    group_by: Annotated[
        str | None,
        typer.Option(
            "--group-by",
            help="Comma-separated params or tags that make a group (default: algo.name,env.id,"
            " split further where runs differ in other params).",
        ),
    ] = None,
    direction: Annotated[
        str | None, typer.Option("--direction", help="maximize | minimize (default: by metric).")
    ] = None,
    fmt: Annotated[
        ReportFormat | None,
        typer.Option("--format", help="md | html | csv | json (default: from --out's suffix)."),
    ] = None,
    out_path: Annotated[
        str | None,
        typer.Option("--out", help="Write the report here (Markdown adds figure files)."),
    ] = None,
    figure_files: Annotated[
        str | None,
        typer.Option(
            "--figures",
            help="png | svg | pdf: figure files beside an md report (default png) or an html"
            " one (default none: its plots are interactive).",
        ),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option("--storage", help="Optuna storage of a sweep (default: the one it used)."),
    ] = None,
    tracking_uri: Annotated[
        str | None,
        typer.Option("--tracking-uri", help="MLflow store to read (default: ./mlflow.db)."),
    ] = None,
    names: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="GROUP=TEXT: name a group in tables, legends and the appendix (GROUP: its"
            " values comma-separated, e.g. mappo,mpe/simple_spread); repeat. Over the spec's"
            " `label`.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare finished runs: final score per group with bootstrap CIs, curves, sweeps."""
    from pathlib import Path

    with _exit_codes(as_json):
        target = Path(out_path) if out_path else None
        chosen = _report_format(fmt, target)
        if target is None and chosen in ("md", "html"):
            target = Path(f"report.{chosen}")
        if direction not in (None, "maximize", "minimize"):
            raise SpecError([_arg_problem(f"--direction: '{direction}' is not maximize|minimize")])
        if figure_files not in (None, "png", "svg", "pdf"):
            raise SpecError([_arg_problem(f"--figures: '{figure_files}' is not png|svg|pdf")])
        if figure_files is not None and chosen not in ("md", "html"):
            raise SpecError([_arg_problem("--figures: figure files go with an md or html report")])
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
            raise SpecError([_arg_problem(_nothing_to_report(built))])
        try:
            written = []
            if target is not None:
                written = formats.write(built, chosen, target, figure_files)
        except OSError as error:
            raise SpecError([_arg_problem(f"--out: cannot write '{target}': {error}")]) from None
    if as_json:
        _emit_json({"ok": True, "exit_code": 0, **formats.to_dict(built), "files": written})
        return
    if target is None and chosen == "csv":
        sys.stdout.write(formats.to_csv(built))
        return
    if target is None and chosen == "json":
        _emit_json(formats.to_dict(built))
        return
    for table in formats.rich_tables(built):
        _print_table(table)
    for warning in formats.warnings(built):
        out.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)
    for note in formats.notes(built):
        out.print(note, style="dim", markup=False, highlight=False)
    for sweep in built.sweeps:
        if sweep.note:
            out.print(f"sweep {sweep.name}: {sweep.note}", style="dim", markup=False)
    for path in written:
        _say(out, f"wrote {path}")


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
            [_arg_problem(f"--out: cannot tell the format of '{target}'; pass --format")]
        )
    return known[suffix]


def _nothing_to_report(built) -> str:
    left = ", ".join(f"{n} {s.lower()}" for s, n in sorted(built.left_out.items()))
    return f"no finished runs match in {built.uri}" + (f" ({left} left out)" if left else "")


@app.command("eval")
def eval_(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="A seed's run or a parent run.")],
    backend: Annotated[
        Backend | None,
        typer.Option("--backend", help="Env backend to evaluate on (default: the run's)."),
    ] = None,
    episodes: Annotated[
        int | None,
        typer.Option("--episodes", min=1, help="Episodes per run (default: the run's eval)."),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Seed of the episodes (default: the run's own eval seed)."),
    ] = None,
    checkpoint: Annotated[
        str | None,
        typer.Option(
            "--checkpoint",
            help="'latest', an artifact path of the run, or a file (default: the final policy).",
        ),
    ] = None,
    render: Annotated[
        str | None,
        typer.Option("--render", help="Render episodes to this .gif (or .mp4 with ffmpeg)."),
    ] = None,
    render_episodes: Annotated[
        int, typer.Option("--render-episodes", min=1, help="Episodes in the video.")
    ] = 1,
    fps: Annotated[int, typer.Option("--fps", min=1, max=120, help="Video frame rate.")] = 10,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            help="auto | cpu | cuda | cuda:N (default: the run's GPU if here, else cpu)",
        ),
    ] = None,
    tracking_uri: Annotated[
        str | None,
        typer.Option("--tracking-uri", help="MLflow store holding the run (default: ./mlflow.db)."),
    ] = None,
    vs: Annotated[
        str | None,
        typer.Option(
            "--vs",
            metavar="RUN_ID,...",
            help="Cross-play: each group this run learned against the other runs' policies in "
            "the other groups, and theirs against this run's; stored with the runs for the "
            "report.",
        ),
    ] = None,
    trust_factory: TrustOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a trained policy (deterministic actions) on either env backend.

    Without --episodes and --seed it repeats the run's final evaluation.
    """
    _stop_on_sigterm()
    _trust(trust_factory)
    if vs is not None:
        _cross_play(run_id, vs, backend, seed, checkpoint, render, tracking_uri, episodes,
                    device, as_json)  # fmt: skip
        return
    with _exit_codes(as_json):
        from marlctl.evaluation import Render, check_render, evaluate_runs

        video = None
        if render is not None:
            video = Render(check_render(render), render_episodes, fps)
        summary = evaluate_runs(
            run_id,
            tracking_uri,
            backend.value if backend else None,
            episodes,
            seed,
            device,
            checkpoint,
            video,
        )
    if as_json:
        _emit_json(summary.to_dict())
        return
    table = Table("seed", "backend", "episodes", "eval return", "in training", "groups", "run")
    for r in summary.runs:
        groups = ", ".join(f"{g} {v:.2f}" for g, v in r.returns.items())
        logged = "—" if r.logged_return is None else f"{r.logged_return:.2f}"
        table.add_row(
            str(r.seed),
            r.backend,
            str(r.episodes),
            f"{r.return_mean:.2f}",
            logged,
            groups,
            r.run_id,
        )
    _print_table(table)
    for r in summary.runs:
        if r.checkpoint != "policy/final.pt":
            _say(out, f"weights: {r.checkpoint}")
        if r.video:
            _say(out, f"wrote {r.video}")


def _cross_play(
    run_id, vs, backend, seed, checkpoint, render, tracking_uri, episodes, device, as_json
) -> None:
    with _exit_codes(as_json):
        from marlctl.errors import SpecError

        given = {"--backend": backend, "--seed": seed, "--checkpoint": checkpoint,
                 "--render": render}  # fmt: skip
        for option, value in given.items():
            if value is not None:
                raise SpecError.at(
                    option,
                    "cross-play plays each run's final policy on its own backend and "
                    "eval episodes; leave it out with --vs",
                )
        others = list(dict.fromkeys(part.strip() for part in vs.split(",") if part.strip()))
        if not others:
            raise SpecError.at("--vs", "name one or more run ids, separated by commas")
        from marlctl.crossplay import cross_play

        result = cross_play(run_id, others, tracking_uri, episodes, device)
    if as_json:
        _emit_json(result.to_dict())
        return
    table = Table("seat", "run", "seed", "against", "seed", "seat return", "win rate")
    for m in result.matches:
        win = "—" if m.win_rate is None else f"{m.win_rate:.2f}"
        table.add_row(
            m.seat, m.run_id[:8], str(m.seed), m.opponent[:8], str(m.opponent_seed),
            f"{m.score:.2f}", win,
        )  # fmt: skip
    _print_table(table)


@app.command()
def bench(
    spec: Annotated[str, typer.Argument(help="Spec file (.yaml or .toml).")],
    overrides: Overrides = None,
    num_envs: Annotated[
        str | None,
        typer.Option(
            "--num-envs",
            metavar="N,N,...",
            help="num_envs values to measure (default: a sweep for the backend and device).",
        ),
    ] = None,
    seconds: Annotated[
        float, typer.Option("--seconds", min=0.1, max=600, help="Measured time per point.")
    ] = 2.0,
    env_only: Annotated[
        bool, typer.Option("--env-only", help="Measure env stepping only, no training.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Measure env-only and training throughput of the spec's env and algorithm."""
    _stop_on_sigterm()
    with _exit_codes(as_json):
        sweep = _parse_sizes(num_envs)
        loaded, plan = _load(spec, overrides)
        from marlctl.bench import learning_note, run_bench

        console = err if as_json else out
        console.print(
            f"[bold]{plan.env.id}[/bold] ({loaded.spec.env.backend}) · {plan.algo} · "
            f"{plan.runs[0].device} · {plan.runs[0].threads} thread(s)",
            highlight=False,
            soft_wrap=True,
        )
        # Progress on one transient line; the figures are printed once, in the table.
        with err.status("measuring env num_envs=…", spinner="dots") as status:

            def show(point) -> None:
                status.update(f"measured {point.kind} num_envs={point.num_envs}; measuring on…")

            from marlctl.cores import passive_wait

            with passive_wait(plan.passive_wait):  # as `run` would train it
                result = run_bench(loaded, plan, sweep, seconds, train=not env_only, report=show)
    data = result.to_dict()
    best = result.best("train")
    if best is not None:
        data["suggestion_note"] = learning_note(loaded.spec, best.num_envs)
    if not as_json:
        batched = any(p.seeds > 1 for p in result.points)
        graphs = any(p.mode != "eager" for p in result.points)
        columns = ["measure", "num_envs", "env steps/s", "agent steps/s", "peak memory MB"]
        table = Table(
            *columns,
            *(["seeds", "env steps/s per seed"] if batched else []),
            *(["mode", "compile s"] if graphs else []),
        )
        for p in result.points:
            extra = [p.mode, f"{p.compile_s:.2f}" if p.compile_s else ""] if graphs else []
            row = [
                p.kind,
                str(p.num_envs),
                f"{p.env_steps_per_s:,.0f}",
                f"{p.agent_steps_per_s:,.0f}",
                f"{p.peak_memory_mb:,.0f}",
            ]
            table.add_row(*row, *([str(p.seeds), f"{p.per_seed:,.0f}"] if batched else []), *extra)
        out.print(table)
        if result.skipped:
            out.print(
                f"not measured: {', '.join(result.skipped)} (one call of a smaller size took "
                f"longer than --seconds {seconds:g}; pass --num-envs to measure them)",
                highlight=False,
                soft_wrap=True,
            )
        if best is not None:
            out.print(
                f"fastest training: hardware.num_envs={best.num_envs} "
                f"({best.env_steps_per_s:,.0f} env steps/s); {data['suggestion_note']}",
                highlight=False,
                soft_wrap=True,
            )
    else:
        _emit_json(data)


def _parse_sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise SpecError([_arg_problem(f"--num-envs: '{text}' is not a list of positive integers")])
    return sizes


@app.command("list")
def list_(
    what: Annotated[ListWhat, typer.Argument(help="algos or envs")] = ListWhat.algos,
    match: Annotated[
        str | None, typer.Option("--match", help="envs: only ids containing this text.")
    ] = None,
    describe: Annotated[
        bool,
        typer.Option(
            "--describe",
            help="envs: build each installed env at its preset's params and show its agent "
            "groups, spaces and global state.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show registered algorithms or environments with their capabilities."""
    if what is ListWhat.algos:
        from marlctl.algos import registered_algos

        rows = [
            {
                "name": a.name,
                "actions": a.action_kinds,
                "on_policy": a.on_policy,
                "centralised_critic": a.centralised_critic,
                "needs_global_state": a.centralised_critic,
                "recurrent": a.recurrent,
                "replay": a.replay,
                "summary": a.summary,
                "params": {
                    k: {"default": f.default, "description": f.description}
                    for k, f in a.config.model_fields.items()
                    if k != "name"
                },
            }
            for a in registered_algos().values()
        ]
        if as_json:
            _emit_json({"algos": rows})
            return
        table = Table("algo", "actions", "policy", "state", "rnn", "summary")
        for row in rows:
            table.add_row(
                row["name"],
                ", ".join(row["actions"]),
                "on" if row["on_policy"] else "off",
                "yes" if row["needs_global_state"] else "no",
                "gru" if row["recurrent"] else "no",
                row["summary"],
            )
        out.print(table)
        return
    from marlctl.envs.native import NATIVE_ONLY, is_native
    from marlctl.envs.registry import lookup, preset_name, registered_ids

    entries = [lookup(env_id) for env_id in registered_ids() if match is None or match in env_id]
    rows = [
        {
            "id": e.id,
            "suite": e.suite,
            "backends": ["native"]
            if e.id in NATIVE_ONLY
            else ["pettingzoo", "native"]
            if is_native(e.id)
            else ["vmas"]
            if e.suite == "vmas"
            else ["pettingzoo"],
            "factory": e.factory,
            "installed": e.installed,
            "missing": list(e.missing),  # modules not installed
            "install": e.install_hint,  # the command that installs them, or null
            "preset": preset_name(e.id),  # envs=NAME
            "summary": e.summary,
        }
        for e in entries
    ]
    if describe:
        for row in rows:
            row["description"] = _describe_env(row) if row["installed"] else None
    if as_json:
        _emit_json({"envs": rows})
        return
    columns = ["env", "backends", "installed", "preset", "summary"]
    table = Table(*columns, *(["agents and spaces"] if describe else []))
    for row in rows:
        table.add_row(
            row["id"],
            ", ".join(row["backends"]),
            "yes" if row["installed"] else Text(f"no: {row['install']}"),  # [extra]: no markup
            row["preset"],
            row["summary"],
            *([Text(_describe_text(row.get("description")))] if describe else []),
        )
    out.print(table)
    out.print(
        "A spec picks an env's preset with envs=NAME (envs/NAME.yaml). Any PettingZoo "
        "ParallelEnv also works as env.id: package.module:factory",
        soft_wrap=True,
    )


def _describe_env(row: dict) -> dict:
    """An env's groups, spaces and global state, built at its preset's params."""
    from marlctl.envs.registry import probe
    from marlctl.spec import preset_roots

    params: dict = {}
    for root in preset_roots():
        path = root / "envs" / f"{row['preset']}.yaml"
        if path.is_file():
            import yaml

            params = dict(
                (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("params") or {}
            )
            break
    try:
        info = probe(row["id"], params)
    except Exception as err:  # an env that does not build here: say so, list the rest
        return {"error": f"{type(err).__name__}: {err}"}
    return {
        "groups": [
            {
                "name": g.name,
                "agents": list(g.agents),
                "obs_shape": list(g.obs_shape),
                "actions": f"Discrete({g.n_actions})" if g.discrete else f"Box({g.n_actions},)",
                "action_mask": g.mask_source is not None,
            }
            for g in info.groups
        ],
        "state_dim": info.state_dim,
        "state_from_env": info.state_from_env,
        "turn_based": info.turn_based,
        "objectives": info.objectives,
    }


def _describe_text(description: dict | None) -> str:
    if description is None:
        return "not installed"
    if "error" in description:
        return description["error"]
    parts = [
        f"{g['name']} ×{len(g['agents'])}: obs {tuple(g['obs_shape'])}, {g['actions']}"
        + (", masked" if g["action_mask"] else "")
        for g in description["groups"]
    ]
    state = "env state" if description["state_from_env"] else "observations"
    parts.append(f"state {description['state_dim']} ({state})")
    if description["turn_based"]:
        parts.append("turn-based")
    if description["objectives"]:
        parts.append(f"{description['objectives']} objectives")
    return "; ".join(parts)


def main() -> None:
    import faulthandler
    import signal

    from typer.exceptions import TyperException

    # `kill -USR1 PID` prints every thread's stack: where a stuck run is stuck.
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (OSError, ValueError):  # stderr without a file descriptor (embedded, captured)
        pass

    as_json = "--json" in sys.argv[1:]
    try:
        code = app(standalone_mode=False)
    except (KeyboardInterrupt, typer.Abort):
        err.print("[yellow]interrupted[/yellow]")
        code = 130
    except TyperException as error:  # usage errors: bad option, missing argument
        if hasattr(error, "show"):
            error.show()
        else:
            _say(err, error.format_message(), "error:", "red")
        code = 2
    except typer.Exit as done:
        code = done.exit_code
    except MarlctlError as error:  # raised outside a command's own handler
        try:
            _fail(error, as_json)
        except typer.Exit as done:
            code = done.exit_code
    except Exception as error:  # a defect: one line and where the traceback went
        code = _internal_error(error, as_json)
    raise SystemExit(code or 0)


def _internal_error(error: BaseException, as_json: bool) -> int:
    """Write the traceback to a file in the temp dir; say what failed and where it is."""
    import tempfile
    import time
    import traceback

    summary = f"{type(error).__name__}: {one_line(str(error))}"
    text = redact("".join(traceback.format_exception(error)))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        with tempfile.NamedTemporaryFile(
            "w", prefix=f"marlctl-{stamp}-", suffix=".traceback", delete=False
        ) as file:
            file.write(redact(f"marlctl {' '.join(sys.argv[1:])}\n\n{text}"))
        where = file.name
    except OSError:  # nowhere to write: the traceback itself, so nothing is lost
        where = None
    if as_json:
        _emit_json({"ok": False, "exit_code": 1, "errors": [summary], "traceback": where})
    else:
        _say(err, summary, "internal error:", "red")
        _say(err, f"the traceback is in {where}" if where else text, lines=not where)
    return 1
