"""Optuna around plan/launch: one study per sweep, trials trained by workers sharing it.

Workers are processes on this machine, SLURM jobs through submitit, or `marlctl sweep`
started on other machines against the same database storage. Every worker runs the same
loop: give up lost trials, take a trial (a re-queued one first), train its seeds with
`run_plan` under the trial's MLflow run, report each evaluation to the pruner, tell the
study the result. The trial budget is global: the study itself counts its trials.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marlctl.errors import Problem, SpecError
from marlctl.redact import redact, redact_all, shown_url
from marlctl.sweep.space import (
    Param,
    active,
    decode_choice,
    encode_choice,
    listed_groups,
    overrides_for,
)

JOURNAL = "optuna.journal"  # the embedded default storage, next to mlflow.db
HEARTBEAT_ATTR = "marlctl.heartbeat"
PROGRESS_ATTR = "marlctl.progress"  # [env steps of the slowest seed, total] while running
BUDGET_ATTR = "marlctl.budget"  # the trials last asked of the study (`--trials`)
PROGRESS_EVERY_S = 2.0
ERROR_ATTR = "marlctl.error"
RUN_ATTR = "marlctl.mlflow_run_id"
SPEC_ATTR = "marlctl.spec"
SURPLUS_ATTR = "marlctl.surplus"
LOST_AFTER_BEATS = 4


@dataclass
class SweepContext:
    """Everything a worker needs; plain data, so it crosses process and SLURM boundaries."""

    spec_path: str
    overrides: list[str]  # the user's plain overrides
    params: list[Param]
    study: str
    storage: str | None
    experiment: str
    tracking_uri: str | None
    study_run_id: str
    trials: int
    cwd: str
    worker: int = 0  # index among all workers started together (sampler seed)
    workers: int = 1
    alone: bool = False  # the only worker on its machine (a submitit job): all of it is its own
    placement: list[str] = field(default_factory=list)  # hardware overrides for this worker
    # Cores other processes left free, measured once before the workers of this machine
    # start (each measuring as the others start up would count them as busy); None: the
    # worker measures.
    free_cores: int | None = None


# ---------------------------------------------------------------- storage and study


def storage_url(storage: str | None, cwd: str | Path | None = None) -> str:
    """The storage as the user would pass it to optuna-dashboard or the optuna CLI."""
    if storage is None:
        return str(Path(cwd or Path.cwd()) / JOURNAL)
    return storage


def is_database(storage: str) -> bool:
    return "://" in storage


def open_storage(storage: str | None, cwd: str | Path | None = None):
    """A database URL, or a journal file that any number of local processes share safely."""
    import optuna

    url = storage_url(storage, cwd)
    if is_database(url):
        return _open_database(url)
    from optuna.storages.journal import JournalFileBackend

    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(url))


def _open_database(url: str, attempts: int = 5):
    """RDBStorage creates its tables on first use: machines starting together on an empty
    database race to create them, and the losers see duplicate-object errors. They retry."""
    import random

    import optuna
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
        except (IntegrityError, ProgrammingError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 + random.random())
    raise AssertionError("unreachable")


def create_study(name: str, storage: str | None, direction: str, cwd: str | Path | None = None):
    """Create the study, or continue the one with this name; its direction must match."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            study_name=name,
            storage=open_storage(storage, cwd),
            direction=direction,
            load_if_exists=True,
        )
    except Exception as err:  # an unreachable database, a bad URL
        raise SpecError(
            [
                Problem(
                    "--storage",
                    None,
                    "",
                    f"cannot open {shown_url(storage_url(storage, cwd))}: {err}",
                )
            ]
        ) from None
    found = study.direction.name.lower()
    if found != direction:
        raise SpecError(
            [
                Problem(
                    "sweep.direction",
                    None,
                    "",
                    f"study '{name}' in {shown_url(storage_url(storage, cwd))} was created "
                    f"to {found}; the spec says {direction} (set sweep.study to start a new "
                    "study)",
                )
            ]
        )
    return study


SPACE_ATTR = "marlctl.space"


def check_same_space(study, params: list[Param]) -> None:
    """A study continues with the space it began with; Optuna cannot mix two distributions
    under one parameter name, so a changed space needs a new study."""
    import json

    space = json.dumps(
        [
            [
                p.key,
                p.low,
                p.high,
                p.log,
                p.step,
                p.is_int,
                [encode_choice(c) for c in p.choices],
                p.when,
            ]
            for p in params
        ],
        sort_keys=True,
        default=list,
    )
    stored = study.user_attrs.get(SPACE_ATTR)
    if stored is None:
        study.set_user_attr(SPACE_ATTR, space)
    elif stored != space:
        raise SpecError(
            [
                Problem(
                    "sweep.space",
                    None,
                    "",
                    f"study '{study.study_name}' was started with another search space; keep "
                    "that space to continue it, or set sweep.study to start a new study",
                )
            ]
        )


def load_study(ctx: SweepContext, sampler=None, pruner=None):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(
        study_name=ctx.study,
        storage=open_storage(ctx.storage, ctx.cwd),
        sampler=sampler,
        pruner=pruner,
    )


def make_sampler(sweep, params: list[Param], worker: int):
    import warnings

    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    if sweep.sampler == "grid":
        # Every worker must shuffle the grid alike: Optuna maps trial numbers to points.
        seed = sweep.seed or 0
    elif sweep.seed is None:
        seed = None
    else:  # distinct per worker, and per machine when several run workers 0..N-1
        seed = sweep.seed + worker + 1000 * (zlib.crc32(socket.gethostname().encode()) % 1000)
    if sweep.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if sweep.sampler == "grid":

        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, study, trial, state, values) -> None:
                # GridSampler stops the study when the grid is used up, which works inside
                # `optimize` only; the worker loop stops at the budget (the grid's size).
                pass

        grid = {p.key: [encode_choice(v) for v in p.grid()] for p in params}
        return Grid(grid, seed=seed)
    if sweep.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(
            n_startup_trials=max(sweep.startup_trials, 1),
            seed=seed,
            warn_independent_sampling=False,
        )
    conditional = any(p.when for p in params)
    return optuna.samplers.TPESampler(
        n_startup_trials=sweep.startup_trials,
        seed=seed,
        multivariate=True,
        group=conditional,
        constant_liar=True,  # workers in parallel do not all sample the same point
    )


def make_pruner(sweep, train):
    import optuna

    if sweep.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=sweep.startup_trials)
    if sweep.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=max(train.eval_every, 1), max_resource=train.total_env_steps
        )
    return optuna.pruners.NopPruner()


# ---------------------------------------------------------------- the trial budget


def counted(trials) -> list:
    """Trials that use the budget: a re-queued retry stands for the trial it replaces."""
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    return [t for t in trials if not t.user_attrs.get(SURPLUS_ATTR) and t.number not in retried]


def retry(study, trial, max_retry: int) -> bool:
    """Re-queue a lost or interrupted trial with its parameters (Optuna's retry convention:
    `failed_trial` and `retry_history` system attributes). False when out of retries."""
    import optuna

    history = [*trial.system_attrs.get("retry_history", []), trial.number]
    if len(history) > max_retry:
        return False
    study.add_trial(
        optuna.create_trial(
            state=optuna.trial.TrialState.WAITING,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs={"marlctl.retry_of": trial.number},
            system_attrs={
                **trial.system_attrs,  # the grid sampler's point, among others
                "failed_trial": trial.system_attrs.get("failed_trial", trial.number),
                "retry_history": history,
            },
        )
    )
    return True


class LostTrials:
    """Finds RUNNING trials whose worker stopped beating, and fails (and re-queues) them.

    A trial is lost when its heartbeat has not changed for 4 beats of this process's own
    clock, so machines need no synchronised clocks. The state change is the lock: of several
    workers finding the same lost trial, one succeeds in failing it and only that one
    re-queues it.
    """

    def __init__(self, sweep, tracking_uri: str | None):
        self.sweep, self.tracking_uri = sweep, tracking_uri
        self.seen: dict[int, tuple[Any, float]] = {}  # trial number -> (beat, when seen)

    def check(self, study) -> list[int]:
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        now, limit = time.monotonic(), LOST_AFTER_BEATS * self.sweep.heartbeat_s
        lost = []
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            beat = (trial.user_attrs.get(HEARTBEAT_ATTR), trial.datetime_start)
            previous = self.seen.get(trial.number)
            if previous is None or previous[0] != beat:
                self.seen[trial.number] = (beat, now)
                continue
            if now - previous[1] <= limit:
                continue
            reason = f"worker lost: no heartbeat for {now - previous[1]:.0f} s"
            storage = study._storage  # failing another worker's trial has no public API
            try:
                storage.set_trial_user_attr(trial._trial_id, ERROR_ATTR, reason)
                storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            except (UpdateFinishedTrialError, RuntimeError):
                continue  # another worker got there first, or it just finished
            lost.append(trial.number)
            retry(study, frozen(study, trial.number), self.sweep.retries)
            _fail_mlflow_runs(self.tracking_uri, trial.user_attrs.get(RUN_ATTR), reason)
        return lost


def _fail_mlflow_runs(tracking_uri: str | None, run_id: str | None, reason: str) -> None:
    """The trial's MLflow run and its seeds' runs, left RUNNING by the lost worker."""
    if not run_id:
        return
    from marlctl import tracking

    client = tracking.client_for(tracking_uri)
    try:
        run = client.get_run(run_id)
        children = client.search_runs(
            [run.info.experiment_id], f"tags.`{tracking.PARENT_TAG}` = '{run_id}'"
        )
        for r in [run, *children]:
            if r.info.status == "RUNNING":
                tracking.end_run(
                    client, r.info.run_id, "FAILED", reason, tags={"marlctl.trial_state": "FAIL"}
                )
    except Exception:  # another machine's MLflow store: nothing to mark here
        pass


# ---------------------------------------------------------------- the worker loop


@dataclass
class WorkerReport:
    worker: int
    trials: list[int] = field(default_factory=list)
    interrupted: bool = False


def work(ctx: SweepContext, after_trial: Callable[[], None] | None = None) -> WorkerReport:
    """Run trials until the study has used its budget. Raises KeyboardInterrupt on Ctrl-C,
    after the interrupted trial is failed and re-queued."""
    from optuna.trial import TrialState

    from marlctl.plan import compile_plan
    from marlctl.spec import load_spec

    os.chdir(ctx.cwd)
    loaded = load_spec(ctx.spec_path, ctx.overrides)
    index, here = (0, 1) if ctx.alone else (ctx.worker, ctx.workers)
    ctx.placement = ctx.placement or placement(
        loaded, compile_plan(loaded), index, here, ctx.free_cores
    )
    base = loaded.spec
    sweep = base.sweep or _default_sweep()
    study = load_study(
        ctx, make_sampler(sweep, ctx.params, ctx.worker), make_pruner(sweep, base.train)
    )
    report = WorkerReport(ctx.worker)
    lost = LostTrials(sweep, ctx.tracking_uri)
    while True:
        lost.check(study)
        trials = study.get_trials(deepcopy=False)
        waiting = any(t.state == TrialState.WAITING for t in trials)
        if not waiting and len(counted(trials)) >= ctx.trials:
            if not any(t.state == TrialState.RUNNING for t in trials):
                return report
            # Other workers' trials are running: stay to re-run any of them that is lost.
            time.sleep(min(sweep.heartbeat_s, 10.0))
            continue
        trial = study.ask()
        is_retry = "failed_trial" in frozen(study, trial.number).system_attrs
        if not is_retry and _over_budget(study, trial, ctx.trials):
            trial.set_user_attr(SURPLUS_ATTR, True)
            study.tell(trial, state=TrialState.FAIL)
            return report
        report.trials.append(trial.number)
        run_trial(ctx, sweep, study, trial)
        if after_trial is not None:
            after_trial()


def placement(loaded, plan, index: int, workers: int, free: int | None = None) -> list[str]:
    """Hardware overrides giving worker `index` its share of this machine: CPU threads
    split between the workers (with `threads_per_run: auto`, of the `free` cores, those
    other processes leave free, measured where not given); GPUs dedicated when there are
    enough, else shared."""
    from marlctl.cores import free_cores
    from marlctl.plan import auto_threads, available_cores
    from marlctl.sweep.space import hydra_value

    hw = loaded.spec.hardware
    cores = available_cores()
    if hw.threads_per_run == "auto":
        cores = free_cores().free if free is None else free
    share = max(1, cores // workers)
    pool = list(dict.fromkeys(r.device for r in plan.runs))
    seeds = len(loaded.spec.seeds)
    processes = min(len(pool), seeds) if hw.batch_seeds else seeds
    concurrent = max(1, min(hw.parallel_runs, processes, share))
    wanted = hw.threads_per_run
    if wanted == "auto":
        wanted = auto_threads(loaded.spec, plan.env, share)
    threads = max(1, min(wanted, share // concurrent))
    out = [f"++hardware.parallel_runs={concurrent}", f"++hardware.threads_per_run={threads}"]
    if any(d.startswith("cuda") for d in pool):
        mine = pool[index::workers] if len(pool) >= workers else [pool[index % len(pool)]]
        out += [f"++hardware.devices={hydra_value(mine)}", "++hardware.device=auto"]
    return out


def _default_sweep():
    from marlctl.spec.models import SweepSpec

    return SweepSpec()


def _over_budget(study, trial, budget: int) -> bool:
    """Several workers may take a trial at once when one slot is left: the later ones yield."""
    numbers = sorted(t.number for t in counted(study.get_trials(deepcopy=False)))
    return trial.number in numbers and numbers.index(trial.number) >= budget


class _Heartbeat:
    """Marks a trial alive every `every` seconds while its worker trains it, and stores its
    progress (`PROGRESS_ATTR`) every few seconds when it has moved, for the sweep's display."""

    def __init__(self, trial, every: float):
        self.trial, self.every = trial, every
        self.progress: tuple[int, int] | None = None  # set by the trial's reporter
        self._stored: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="heartbeat")
        self._thread.start()

    def _beat(self) -> None:
        self._set(HEARTBEAT_ATTR, time.time())

    def _set(self, key: str, value: Any) -> None:
        try:
            self.trial.set_user_attr(key, value)
        except Exception:  # finished meanwhile, or the storage blinked: the next beat retries
            pass

    def _loop(self) -> None:
        last_beat = time.monotonic()
        while not self._stop.wait(min(self.every, PROGRESS_EVERY_S)):
            if time.monotonic() - last_beat >= self.every:
                self._beat()
                last_beat = time.monotonic()
            progress = self.progress
            if progress is not None and progress != self._stored:
                self._set(PROGRESS_ATTR, list(progress))
                self._stored = progress

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _Reporter:
    """Progress callback of a trial's runs: the seeds' evaluations at one env step, combined,
    go to the pruner; when it says prune, every seed stops."""

    def __init__(
        self, trial, metric: str, seeds: list[int], combine: str, stop, every: int, heartbeat
    ):
        self.trial, self.metric, self.seeds, self.combine, self.stop = (
            trial,
            metric,
            seeds,
            combine,
            stop,
        )
        self.every = max(every, 1)
        self.heartbeat = heartbeat
        self.steps: dict[int, int] = {}
        self.pending: dict[int, dict[int, float]] = {}
        self.pruned_at: int | None = None
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("kind") != "eval":  # a seed's training progress
            self.steps[int(event["seed"])] = int(event["step"])
            if len(self.steps) == len(self.seeds):
                self.heartbeat.progress = (min(self.steps.values()), int(event["total"]))
            return
        if self.pruned_at is not None:
            return
        value = event["metrics"].get(self.metric)
        if value is None or not math.isfinite(value):
            return
        # Steps are eval boundaries, so trials whose iterations differ in length (num_envs in
        # the space) still compare at the same steps.
        step = int(event["step"]) // self.every * self.every
        with self.lock:
            got = self.pending.setdefault(step, {})
            got[int(event["seed"])] = float(value)
            if len(got) < len(self.seeds):
                return
            del self.pending[step]
            try:
                self.trial.report(aggregate(list(got.values()), self.combine), step)
                prune = self.trial.should_prune()
            except Exception:  # the storage blinked, or the trial was failed as lost
                return
            if prune:
                self.pruned_at = step
                self.stop.set()


def aggregate(values: list[float], how: str) -> float:
    """Mean, or interquartile mean, over seeds: the same statistics `marlctl report` shows."""
    from marlctl.report.stats import STATISTICS

    return float(STATISTICS[how](values))


def run_trial(ctx: SweepContext, sweep, study, trial) -> str:
    """Sample, validate, train and tell one trial; returns its state name."""
    import multiprocessing as mp

    from optuna.trial import TrialState

    from marlctl import tracking
    from marlctl.launch import log_spec, run_plan, run_tags
    from marlctl.plan import compile_plan
    from marlctl.spec import load_spec

    heartbeat = _Heartbeat(trial, sweep.heartbeat_s)
    client = tracking.client_for(ctx.tracking_uri)
    run_id: str | None = None
    told = {"ok": False}

    def finish(state: str, error: str | None = None, value: float | None = None) -> str:
        heartbeat.stop()
        if run_id is not None:
            if value is not None:
                client.log_metric(run_id, "objective", value)
            status = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED"}.get(state, "FAILED")
            tracking.end_run(client, run_id, status, error, tags={"marlctl.trial_state": state})
        try:
            if error is not None:
                trial.set_user_attr(ERROR_ATTR, redact(error)[:2000])
            if state == "COMPLETE":
                study.tell(trial, value)
            else:
                study.tell(trial, state=TrialState[state])
            told["ok"] = True
        except Exception as err:  # failed as lost by another worker meanwhile
            if run_id is not None:
                client.set_tag(run_id, "marlctl.tell_error", str(err)[:500])
        return state

    def interrupted() -> None:
        finish("FAIL", "interrupted")
        if told["ok"]:  # not when another worker failed (and re-queued) it as lost
            retry(study, frozen(study, trial.number), sweep.retries)

    try:
        values = sample(trial, ctx.params)
        chosen = overrides_for(values, listed_groups(ctx.spec_path))
        trial.set_user_attr("marlctl.overrides", redact_all(chosen))
        trial.set_user_attr("marlctl.worker", f"{socket.gethostname()}:{os.getpid()}")
        experiment_id = tracking.ensure_experiment(client, ctx.experiment, ctx.tracking_uri)
        run_id = client.create_run(
            experiment_id,
            run_name=f"trial-{trial.number}",
            tags={
                tracking.PARENT_TAG: ctx.study_run_id,
                "marlctl.role": "trial",
                "marlctl.study": ctx.study,
                "marlctl.trial": str(trial.number),
            },
        ).info.run_id
        trial.set_user_attr(RUN_ATTR, run_id)
        tracking.log_params(client, run_id, {k: _param_text(v) for k, v in values.items()})
        try:
            # The spec as the user would run it (best.yaml), then with this worker's share.
            portable = load_spec(ctx.spec_path, [*ctx.overrides, *chosen])
            loaded = load_spec(ctx.spec_path, [*ctx.overrides, *chosen, *ctx.placement])
            plan = compile_plan(loaded)
        except SpecError as err:
            return finish("FAIL", "invalid spec: " + "; ".join(str(p) for p in err.problems))
        resolved = {k: v for k, v in portable.resolved.items() if k != "sweep"}
        trial.set_user_attr(SPEC_ATTR, redact_all({**resolved, "name": loaded.experiment}))
        tracking.log_params(client, run_id, tracking.flatten(resolved))
        for key, value in run_tags(loaded, plan).items():
            client.set_tag(run_id, key, value)
        log_spec(client, run_id, {**resolved, "name": loaded.experiment})
        stop = mp.get_context("spawn").Event()
        reporter = _Reporter(
            trial,
            sweep.metric,
            list(loaded.spec.seeds),
            sweep.objective,
            stop,
            loaded.spec.train.eval_every,
            heartbeat,
        )
        summary = run_plan(loaded, plan, reporter, parent_id=run_id, stop=stop)
    except KeyboardInterrupt:
        interrupted()
        raise
    except Exception as err:
        return finish("FAIL", f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
    if summary.interrupted:
        interrupted()
        raise KeyboardInterrupt
    trial.set_user_attr("marlctl.env_steps", sum(r.env_steps for r in summary.runs))
    failed = [r for r in summary.runs if r.status == "FAILED"]
    if failed:
        return finish("FAIL", f"seed {failed[0].seed} failed: {failed[0].error}")
    if any(r.status == "PRUNED" for r in summary.runs):
        return finish("PRUNED")
    finals = _final_values(client, summary, sweep.metric)
    if isinstance(finals, str):
        return finish("FAIL", finals)
    for key, value in summary.aggregate().items():
        if value is not None:
            client.log_metric(run_id, key, value)
    return finish("COMPLETE", value=aggregate(finals, sweep.objective))


def frozen(study, number: int):
    """The stored state of trial `number`."""
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def sample(trial, params: list[Param]) -> dict[str, Any]:
    """A point of the space; a conditional parameter only where its condition holds."""
    values: dict[str, Any] = {}
    for param in params:
        if active(param, values):
            values[param.key] = _suggest(trial, param)
    return values


def _suggest(trial, param: Param) -> Any:
    if param.categorical:
        picked = trial.suggest_categorical(param.key, [encode_choice(c) for c in param.choices])
        return decode_choice(param, picked)
    if param.is_int:
        return trial.suggest_int(
            param.key, int(param.low), int(param.high), step=int(param.step or 1), log=param.log
        )
    return trial.suggest_float(
        param.key, float(param.low), float(param.high), step=param.step, log=param.log
    )


def _param_text(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def _final_values(client, summary, metric: str) -> list[float] | str:
    """The metric's final value in every seed's run, or why it cannot be read."""
    values = []
    for result in summary.runs:
        if metric == "eval/return_mean" and result.final_return is not None:
            values.append(result.final_return)
            continue
        logged = client.get_run(result.run_id).data.metrics
        if metric not in logged:
            known = ", ".join(sorted(logged)) or "none"
            return f"seed {result.seed} logged no '{metric}' (sweep.metric); logged: {known}"
        values.append(logged[metric])
    bad = [v for v in values if not math.isfinite(v)]
    return f"'{metric}' is not finite: {bad}" if bad else values
