"""The worker loop, the same in every worker process, SLURM job or machine: give up lost trials,
take a trial (a re-queued one first), train its seeds with `run_plan` under the trial's MLflow
run, report each evaluation to the pruner, tell the study the result."""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from marlctl.errors import SpecError
from marlctl.redact import redact, redact_all
from marlctl.sweep.budget import LostTrials, counted, over_budget, retry
from marlctl.sweep.context import (
    ERROR_ATTR,
    HEARTBEAT_ATTR,
    PROGRESS_ATTR,
    PROGRESS_EVERY_S,
    RUN_ATTR,
    SPEC_ATTR,
    SURPLUS_ATTR,
    SweepContext,
)
from marlctl.sweep.search import frozen, make_pruner, make_sampler, param_text, sample
from marlctl.sweep.space import (
    listed_groups,
    overrides_for,
)
from marlctl.sweep.storage import load_study


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
        if not is_retry and over_budget(study, trial, ctx.trials):
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
        tracking.log_params(client, run_id, {k: param_text(v) for k, v in values.items()})
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
