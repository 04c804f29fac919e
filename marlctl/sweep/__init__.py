"""`marlctl sweep`: an Optuna study over `sweep.space`, run by workers that share it.

`prepare` checks the spec and the whole space before anything runs (exit 2 on a problem);
`run_sweep` creates (or continues) the study and its MLflow run, starts the workers here
or on SLURM through submitit, waits, and writes the best trial as a runnable spec;
`sweep_status` reads a study without running anything.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from marlctl.atomic import replacing
from marlctl.errors import Problem, SpecError
from marlctl.redact import redact_all, shown_url
from marlctl.spec import load_spec, tracking_problem
from marlctl.sweep.space import check_space, space_of, split_overrides
from marlctl.sweep.study import (
    BUDGET_ATTR,
    ERROR_ATTR,
    PROGRESS_ATTR,
    SPEC_ATTR,
    SweepContext,
    check_same_space,
    counted,
    create_study,
    load_study,
    storage_url,
)

Progress = Callable[[dict[str, Any]], None]
TOP = 10


@dataclass
class Launcher:
    """Where workers run: processes here, or submitit jobs (SLURM, or its local executor)."""

    kind: str = "local"  # local | submitit
    cluster: str | None = None  # submitit: slurm | local; None = what submitit detects
    partition: str | None = None
    gpus_per_worker: int = 0
    cpus_per_worker: int | None = None
    time_min: int = 60
    folder: str | None = None


@dataclass
class SweepSummary:
    study: str
    storage: str
    tracking_uri: str
    study_run_id: str
    budget: int
    counts: dict[str, int]
    retried: int
    env_steps: int
    best: dict[str, Any] | None
    top: list[dict[str, Any]]
    best_spec: str | None
    interrupted: bool = False
    worker_errors: list[str] = field(default_factory=list)

    @property
    def budget_used(self) -> bool:
        """Every trial of the budget ended (complete, pruned or failed), none still running."""
        done = sum(self.counts.get(s, 0) for s in ("COMPLETE", "PRUNED", "FAIL"))
        return done >= self.budget and not self.counts.get("RUNNING")

    @property
    def ok(self) -> bool:
        """A best trial, and the budget used even if a worker died (others took its share)."""
        return self.best is not None and (self.budget_used or not self.worker_errors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "study": self.study,
            "storage": self.storage,
            "tracking_uri": self.tracking_uri,
            "study_run_id": self.study_run_id,
            "budget": self.budget,
            "counts": self.counts,
            "retried": self.retried,
            "env_steps": self.env_steps,
            "best": self.best,
            "top": self.top,
            "best_spec": self.best_spec,
            "interrupted": self.interrupted,
            "worker_errors": self.worker_errors,
        }


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


def open_sweep(ctx: SweepContext, sweep, launcher: Launcher):
    """The study to run, created or continued, after every check that can refuse the sweep
    (launcher, tracking server, a continued study's search space): a refusal comes before
    any progress is shown."""
    if launcher.kind == "submitit":
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise SpecError(
                [_launcher_problem("submitit is not installed: pip install 'marlctl[cluster]'")]
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
    ctx.study_run_id = _study_run(ctx, sweep)
    contexts = [
        SweepContext(**{**ctx.__dict__, "worker": i, "workers": workers}) for i in range(workers)
    ]
    interrupted, errors = False, []
    try:
        if launcher.kind == "submitit":
            errors = _run_submitit(contexts, launcher, study, ctx, progress)
        else:
            errors = _run_local(contexts, study, ctx, progress)
    except KeyboardInterrupt:
        interrupted = True
    except BaseException as err:  # the study run must not stay RUNNING
        from marlctl import tracking

        client = tracking.client_for(ctx.tracking_uri)
        tracking.end_run(client, ctx.study_run_id, "FAILED", f"{type(err).__name__}: {err}")
        raise
    summary = summarize(study, ctx, sweep, out_dir)
    summary.interrupted, summary.worker_errors = interrupted, errors
    _finish_study_run(ctx, summary)
    return summary


def sweep_status(
    spec_path: str, overrides: list[str], storage: str | None, out_dir: Path | None
) -> SweepSummary:
    """Read the study of this spec: best trial, top trials, counts; writes best.yaml."""
    from marlctl.sweep.study import is_database

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
    ctx.study_run_id = _find_study_run(ctx) or ""
    ctx.trials = int(study.user_attrs.get(BUDGET_ATTR, ctx.trials))  # the budget last asked
    return summarize(study, ctx, sweep, out_dir)


# ---------------------------------------------------------------- results


def summarize(study, ctx: SweepContext, sweep, out_dir: Path | None) -> SweepSummary:
    from optuna.trial import TrialState

    from marlctl import tracking

    trials = study.get_trials(deepcopy=False)
    mine = counted(trials)
    counts = {s.name: 0 for s in TrialState}
    for t in mine:
        counts[t.state.name] += 1
    complete = [t for t in mine if t.state == TrialState.COMPLETE and t.value is not None]
    complete.sort(key=lambda t: t.value, reverse=sweep.direction == "maximize")
    top = [_trial_row(t) for t in complete[:TOP]]
    best_spec = None
    if complete and SPEC_ATTR in complete[0].user_attrs:
        folder = out_dir or Path(ctx.cwd) / f"sweep-{_file_name(ctx.study)}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "best.yaml"
        header = (
            f"# Best trial ({complete[0].number}) of study '{ctx.study}' in "
            f"{shown_url(storage_url(ctx.storage, ctx.cwd))}: "
            f"{sweep.metric} = {complete[0].value:.6g}\n"
        )
        with replacing(path) as tmp:  # never a half-written spec
            spec = yaml.safe_dump(redact_all(complete[0].user_attrs[SPEC_ATTR]), sort_keys=False)
            tmp.write_text(header + spec)
        best_spec = str(path)
    retried = (
        len(trials) - len(mine) - sum(bool(t.user_attrs.get("marlctl.surplus")) for t in trials)
    )
    return SweepSummary(
        study=ctx.study,
        storage=shown_url(storage_url(ctx.storage, ctx.cwd)),
        tracking_uri=tracking.resolve_uri(ctx.tracking_uri),
        study_run_id=ctx.study_run_id,
        budget=ctx.trials,
        counts={k: v for k, v in counts.items() if v},
        retried=retried,
        env_steps=sum(int(t.user_attrs.get("marlctl.env_steps", 0)) for t in trials),
        best=top[0] if top else None,
        top=top,
        best_spec=best_spec,
    )


def _trial_row(trial) -> dict[str, Any]:
    return {
        "trial": trial.number,
        "value": trial.value,
        "params": dict(trial.params),
        "env_steps": trial.user_attrs.get("marlctl.env_steps"),
        "mlflow_run_id": trial.user_attrs.get("marlctl.mlflow_run_id"),
        "error": trial.user_attrs.get(ERROR_ATTR),
    }


# ---------------------------------------------------------------- MLflow study run


def _find_study_run(ctx: SweepContext) -> str | None:
    from marlctl import tracking

    client = tracking.client_for(ctx.tracking_uri)
    experiment = client.get_experiment_by_name(ctx.experiment)
    if experiment is None:
        return None
    found = client.search_runs(
        [experiment.experiment_id],
        f"tags.`marlctl.role` = 'study' and tags.`marlctl.study` = '{ctx.study}' "
        f"and tags.`marlctl.storage` = '{_storage_key(ctx)}'",
        order_by=["attributes.start_time ASC"],
    )
    return found[0].info.run_id if found else None


def _file_name(name: str) -> str:
    """A study name as one file name in the working folder: `x/../../tmp` stays here."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name).lstrip(".") or "study"


def _storage_key(ctx: SweepContext) -> str:
    import hashlib

    return hashlib.sha256(storage_url(ctx.storage, ctx.cwd).encode()).hexdigest()[:16]


def _study_run(ctx: SweepContext, sweep) -> str:
    """The study's parent run, shared by every worker and every re-run of the sweep."""
    from marlctl import tracking

    client = tracking.client_for(ctx.tracking_uri)
    found = _find_study_run(ctx)
    if found is not None:
        tracking.reopen_run(client, found)
        return found
    experiment_id = tracking.ensure_experiment(client, ctx.experiment, ctx.tracking_uri)
    run = client.create_run(
        experiment_id,
        run_name=f"sweep-{ctx.study}",
        tags={
            "marlctl.role": "study",
            "marlctl.study": ctx.study,
            "marlctl.storage": _storage_key(ctx),
            "marlctl.storage_url": shown_url(storage_url(ctx.storage, ctx.cwd)),
        },
    )
    params = {
        "sweep.metric": sweep.metric,
        "sweep.direction": sweep.direction,
        "sweep.sampler": sweep.sampler,
        "sweep.pruner": sweep.pruner,
        "sweep.objective": sweep.objective,
    }
    tracking.log_params(client, run.info.run_id, params)
    # Two machines starting at once may both create one: the earliest wins, the other goes.
    first = _find_study_run(ctx)
    if first is not None and first != run.info.run_id:
        client.delete_run(run.info.run_id)
        return first
    return run.info.run_id


def _finish_study_run(ctx: SweepContext, summary: SweepSummary) -> None:
    from marlctl import tracking

    client = tracking.client_for(ctx.tracking_uri)
    run_id = ctx.study_run_id
    for state, count in summary.counts.items():
        client.log_metric(run_id, f"sweep/trials_{state.lower()}", count)
    if summary.best is not None:
        client.log_metric(run_id, "sweep/best_value", summary.best["value"])
        client.set_tag(run_id, "marlctl.best_trial", str(summary.best["trial"]))
    if summary.best_spec:
        client.log_artifact(run_id, summary.best_spec)
    error = "; ".join(summary.worker_errors) or None
    if summary.interrupted:
        tracking.end_run(client, run_id, "KILLED", error)
    elif summary.budget_used:  # a worker that died left its trials to the others
        tracking.end_run(client, run_id, "FINISHED", error)
    elif summary.worker_errors:
        tracking.end_run(client, run_id, "FAILED", error)


# ---------------------------------------------------------------- launching workers


def _worker_main(ctx: SweepContext) -> None:
    """A worker process: its own trials until the budget is used; exit 130 on Ctrl-C."""
    import signal
    import sys

    from marlctl.launch import Terminated
    from marlctl.sweep.study import work

    def stop(signum, frame):
        raise Terminated

    signal.signal(signal.SIGTERM, stop)
    try:
        work(ctx)
    except KeyboardInterrupt:
        sys.exit(130)


def _run_local(
    contexts: list[SweepContext], study, ctx: SweepContext, progress: Progress | None
) -> list[str]:
    """One spawned process per worker; the coordinator watches them and the study. A single
    worker runs in this process."""
    if len(contexts) == 1:
        from marlctl.sweep.study import work

        # The display follows the running trial from the storage, as for many workers.
        done = threading.Event()

        def watch() -> None:
            while not done.wait(1.0):
                _poll(study, ctx, progress)

        watcher = threading.Thread(target=watch, daemon=True, name="sweep-progress")
        watcher.start()
        try:
            work(contexts[0])  # the watcher alone polls: two pollers would print trials twice
        finally:
            done.set()
            watcher.join()
        _poll(study, ctx, progress)
        return []
    from marlctl.cores import free_cores

    free = free_cores().free
    contexts = [SweepContext(**{**c.__dict__, "free_cores": free}) for c in contexts]
    spawn = mp.get_context("spawn")
    procs = [
        spawn.Process(target=_worker_main, args=(c,), name=f"worker-{c.worker}") for c in contexts
    ]
    for proc in procs:
        proc.start()
    try:
        while any(p.is_alive() for p in procs):
            _poll(study, ctx, progress)
            for proc in procs:
                proc.join(timeout=1.0 / len(procs))
    except KeyboardInterrupt as interrupt:
        # Ctrl-C reached the workers too; a SIGTERM only this process: pass it on.
        from marlctl.launch import Terminated

        for proc in procs:
            if proc.is_alive() and isinstance(interrupt, Terminated):
                proc.terminate()
        _wait_stopped(procs)
        raise
    _poll(study, ctx, progress)
    return [
        f"worker {c.worker} exited with code {p.exitcode}"
        for c, p in zip(contexts, procs, strict=True)
        if p.exitcode not in (0, 130)
    ]


def _wait_stopped(procs) -> None:
    """Workers checkpoint their runs on an interrupt (their run processes may take up to
    2 × STOP_GRACE_S); past that and a margin they are ended."""
    from marlctl.launch import STOP_GRACE_S

    deadline = time.monotonic() + 2 * STOP_GRACE_S + 30.0
    for proc in procs:
        while proc.is_alive():
            try:
                proc.join(timeout=max(0.1, deadline - time.monotonic()))
            except KeyboardInterrupt:  # a second Ctrl-C while waiting
                continue
            if proc.is_alive() and time.monotonic() > deadline:
                proc.kill()


def _run_submitit(
    contexts: list[SweepContext],
    launcher: Launcher,
    study,
    ctx: SweepContext,
    progress: Progress | None,
) -> list[str]:
    """One submitit job per worker: SLURM, or submitit's local executor (`--cluster local`)."""
    import submitit  # checked by run_sweep

    folder = Path(launcher.folder or Path(ctx.cwd) / ".submitit" / ctx.study)
    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=launcher.cluster)
    except (RuntimeError, ValueError) as err:
        raise SpecError(
            [_launcher_problem(f"{err}; --cluster local runs the jobs on this machine")]
        ) from None
    params: dict[str, Any] = {"timeout_min": launcher.time_min, "name": f"marlctl-{ctx.study}"}
    if launcher.cpus_per_worker:
        params["cpus_per_task"] = launcher.cpus_per_worker
    if launcher.gpus_per_worker:
        params["gpus_per_node"] = launcher.gpus_per_worker
    if launcher.partition:
        params["slurm_partition"] = launcher.partition
    executor.update_parameters(**params)
    jobs = [executor.submit(_submitit_job, c) for c in contexts]
    try:
        while not all(job.done() for job in jobs):
            _poll(study, ctx, progress)
            time.sleep(1.0)
    except KeyboardInterrupt:
        for job in jobs:
            job.cancel(check=False)
        raise
    _poll(study, ctx, progress)
    errors = []
    for job, c in zip(jobs, contexts, strict=True):
        error = job.exception()
        if error is not None:
            errors.append(f"worker {c.worker} (job {job.job_id}) failed: {error}")
    return errors


def _submitit_job(ctx: SweepContext) -> list[int]:
    """A submitit job is one worker with its allocation to itself."""
    from marlctl.sweep.study import work

    return work(SweepContext(**{**ctx.__dict__, "alone": True})).trials


def _launcher_problem(message: str) -> Problem:
    return Problem("--launcher", None, "", message)


def _poll(study, ctx: SweepContext, progress: Progress | None) -> None:
    if progress is None:
        return
    from optuna.trial import TrialState

    mine = counted(study.get_trials(deepcopy=False))
    done = [t for t in mine if t.state.is_finished()]
    values = [t.value for t in done if t.state == TrialState.COMPLETE and t.value is not None]
    best = None
    if values:
        best = max(values) if study.direction.name == "MAXIMIZE" else min(values)
    progress(
        {
            "done": len(done),
            "budget": ctx.trials,
            "running": sum(t.state == TrialState.RUNNING for t in mine),
            "progress": {
                t.number: tuple(t.user_attrs[PROGRESS_ATTR])
                for t in mine
                if t.state == TrialState.RUNNING and PROGRESS_ATTR in t.user_attrs
            },
            "best": best if best is not None and math.isfinite(best) else None,
            "finished": [
                {
                    "trial": t.number,
                    "state": t.state.name,
                    "value": t.value,
                    "params": dict(t.params),
                    "error": t.user_attrs.get(ERROR_ATTR),
                }
                for t in done
            ],
        }
    )
