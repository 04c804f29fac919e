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
    if sweep.batch != 1:
        problem = batch_problem(loaded)
        if problem is not None:
            raise SpecError([problem])
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
    from marlctl.train.build import row_fields, trainer_class

    spec = loaded.spec
    if not spec.hardware.batch_seeds:
        message = "trials train as one batch with hardware.batch_seeds: true only"
        return loaded.provenance.problem("sweep.batch", message)
    if not row_fields(spec):
        what = "learning teams" if spec.teams else f"algorithm {spec.algo.name}"
        able = [name for name in registered_algos() if trainer_class(name).row_fields]
        message = (
            f"{what} takes no hyperparameters per row; trials train as one batch with "
            f"{', '.join(able)} (or set sweep.batch: 1)"
        )
        return loaded.provenance.problem("sweep.batch", message)
    return None


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
