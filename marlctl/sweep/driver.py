"""`marlctl sweep`: `prepare` checks the spec and the whole space before anything runs (exit 2 on a
problem); `run_sweep` creates (or continues) the study and its MLflow run, starts the workers,
waits, and writes the best trial as a runnable spec; `sweep_status` reads a study without
running anything."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from marlctl.errors import Problem, SpecError
from marlctl.redact import shown_url
from marlctl.spec import load_spec, tracking_problem
from marlctl.sweep.context import (
    BUDGET_ATTR,
    Launcher,
    Progress,
    SweepContext,
    SweepSummary,
)
from marlctl.sweep.launchers import launcher_problem, run_local, run_submitit
from marlctl.sweep.records import find_study_run, finish_study_run, study_run, summarize
from marlctl.sweep.space import check_space, space_of, split_overrides
from marlctl.sweep.storage import check_same_space, create_study, load_study, storage_url


def prepare(
    spec_path: str,
    overrides: list[str],
    storage: str | None,
    trials: int | None,
    check: bool = True,
) -> tuple[SweepContext, Any]:
    """Validate the spec, its sweep and (with `check`) every value of the space; nothing
    runs yet."""
    from marlctl.plan import compile_plan
    from marlctl.spec.models import SweepSpec

    plain, from_cli = split_overrides(overrides)
    loaded = load_spec(spec_path, plain)
    compile_plan(loaded)
    problem = tracking_problem(loaded) if check else None
    if problem is not None:
        raise SpecError([problem])
    sweep = loaded.spec.sweep or SweepSpec()
    if loaded.spec.sweep is None and not from_cli:
        raise SpecError(
            [
                Problem(
                    spec_path,
                    None,
                    "sweep",
                    "no sweep: section and no sweep overrides (e.g. algo.lr=0.001,0.0003)",
                )
            ]
        )
    if sweep.batch != 1 or sweep.sampler == "pbt":
        problem = batch_problem(loaded)
        if problem is not None:
            raise SpecError([problem])
    if sweep.sampler == "pbt":
        problems = population_problems(loaded, sweep, from_cli)
        if problems:
            raise SpecError(problems)
    params = space_of(loaded, from_cli)
    if check:
        check_space(spec_path, plain, params, sweep.sampler)
    budget = trials or sweep.trials
    if sweep.sampler == "grid":  # every point once
        budget = min(budget, math.prod(len(p.grid()) for p in params))
    ctx = SweepContext(
        spec_path=str(Path(spec_path).resolve()),
        overrides=plain,
        params=params,
        study=sweep.study or loaded.experiment,
        storage=storage or sweep.storage,
        experiment=loaded.experiment,
        tracking_uri=loaded.spec.tracking.uri,
        study_run_id="",
        trials=budget,
        cwd=str(Path.cwd()),
    )
    return ctx, sweep


def batch_problem(loaded) -> Problem | None:
    """Why the trials of this spec cannot train as rows of one batch (`sweep.batch`), or None."""
    from marlctl.algos import registered_algos

    spec = loaded.spec
    key = "sweep.sampler" if spec.sweep and spec.sweep.sampler == "pbt" else "sweep.batch"
    if not spec.hardware.batch_seeds:
        message = "trials train as one batch with hardware.batch_seeds: true only"
        return loaded.provenance.problem(key, message)
    if not spec.row_fields:
        what = "learning teams" if spec.teams else f"algorithm {spec.algo.name}"
        able = [name for name, algo in registered_algos().items() if algo.config.row_fields]
        message = (
            f"{what} takes no hyperparameters per row; trials train as one batch with "
            f"{', '.join(able)}"
        )
        if key == "sweep.batch":
            message += " (or set sweep.batch: 1)"
        return loaded.provenance.problem(key, message)
    return None


def population_problems(loaded, sweep, from_cli: list[str]) -> list[Problem]:
    """What keeps this spec's population-based training from running: a searched value that
    is not a hyperparameter a row may change (`algo.` and the algorithm's per-row fields),
    a condition, an interval that is not a multiple of the evaluations', too few members."""
    spec, prov = loaded.spec, loaded.provenance
    fields = spec.row_fields
    problems = []
    if from_cli:
        message = "population-based training takes its space from the spec's sweep.space only"
        problems.append(Problem("overrides", None, "", message))
    for key, param in sweep.space.items():
        section, _, name = key.partition(".")
        where = f"sweep.space.{key}"
        if section != "algo" or name not in fields:
            message = (
                "population-based training changes only what a row may have of its own: "
                + ", ".join(f"algo.{f}" for f in fields)
            )
            problems.append(prov.problem(where, message))
        elif param.when is not None:
            problems.append(prov.problem(where, "population-based training takes no conditions"))
    every = spec.train.eval_every
    interval = sweep.pbt.interval
    if not every:
        message = "population-based training ranks members at evaluations: set train.eval_every"
        problems.append(prov.problem("train.eval_every", message))
    elif interval is not None and interval % every:
        message = f"{interval} is not a multiple of train.eval_every={every}"
        problems.append(prov.problem("sweep.pbt.interval", message))
    if not sweep.metric.startswith("eval"):
        message = "population-based training ranks members by an evaluation: an eval/ metric"
        problems.append(prov.problem("sweep.metric", message))
    if len(spec.hardware.devices or []) > 1:
        message = "a population trains as one batch on one device: list one device at most"
        problems.append(prov.problem("hardware.devices", message))
    if sweep.trials < 2:
        message = "a population needs at least 2 members (trials)"
        problems.append(prov.problem("sweep.trials", message))
    if spec.train.schedule:
        message = "population-based training sets the schedule itself: remove train.schedule"
        problems.append(prov.problem("train.schedule", message))
    return problems


def open_sweep(ctx: SweepContext, sweep, launcher: Launcher):
    """The study to run, created or continued, after every check that can refuse the sweep
    (launcher, tracking server, a continued study's search space): a refusal comes before
    any progress is shown."""
    if launcher.kind == "submitit":
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise SpecError(
                [launcher_problem("submitit is not installed: pip install 'marlctl[cluster]'")]
            ) from None
    from marlctl import tracking

    tracking.check_reachable(ctx.tracking_uri)
    study = create_study(ctx.study, ctx.storage, sweep.direction, ctx.cwd)
    check_same_space(study, ctx.params)
    return study


def run_sweep(
    ctx: SweepContext,
    sweep,
    workers: int,
    launcher: Launcher,
    out_dir: Path | None = None,
    progress: Progress | None = None,
    study=None,
) -> SweepSummary:
    """Create or continue the study (`open_sweep`, unless `study` is the study it opened),
    run `workers` workers until the budget is used."""
    if sweep.sampler == "pbt" and workers > 1:
        message = "a population trains as one batch in one worker: use --workers 1"
        raise SpecError([Problem("--workers", None, "", message)])
    if study is None:
        study = open_sweep(ctx, sweep, launcher)
    study.set_user_attr(BUDGET_ATTR, ctx.trials)  # what `--status` counts against
    ctx.study_run_id = study_run(ctx, sweep)
    contexts = [
        SweepContext(**{**ctx.__dict__, "worker": i, "workers": workers}) for i in range(workers)
    ]
    interrupted, errors = False, []
    try:
        if launcher.kind == "submitit":
            errors = run_submitit(contexts, launcher, study, ctx, progress)
        else:
            errors = run_local(contexts, study, ctx, progress)
    except KeyboardInterrupt:
        interrupted = True
    except BaseException as err:  # the study run must not stay RUNNING
        from marlctl import tracking

        client = tracking.client_for(ctx.tracking_uri)
        tracking.end_run(client, ctx.study_run_id, "FAILED", f"{type(err).__name__}: {err}")
        raise
    summary = summarize(study, ctx, sweep, out_dir)
    summary.interrupted, summary.worker_errors = interrupted, errors
    finish_study_run(ctx, summary)
    return summary


def sweep_status(
    spec_path: str, overrides: list[str], storage: str | None, out_dir: Path | None
) -> SweepSummary:
    """Read the study of this spec: best trial, top trials, counts; writes best.yaml."""
    from marlctl.sweep.storage import is_database

    ctx, sweep = prepare(spec_path, overrides, storage, None, check=False)
    url = storage_url(ctx.storage, ctx.cwd)

    def problem(message: str) -> SpecError:
        return SpecError([Problem("--status", None, "", message)])

    if not is_database(url) and not Path(url).is_file():
        raise problem(f"no study '{ctx.study}': {url} does not exist")
    try:
        study = load_study(ctx)
    except KeyError:
        raise problem(f"no study '{ctx.study}' in {shown_url(url)}") from None
    except Exception as err:  # an unreachable database, a missing driver, a bad URL
        raise problem(f"cannot open {shown_url(url)}: {type(err).__name__}: {err}") from None
    ctx.study_run_id = find_study_run(ctx) or ""
    ctx.trials = int(study.user_attrs.get(BUDGET_ATTR, ctx.trials))  # the budget last asked
    return summarize(study, ctx, sweep, out_dir)
