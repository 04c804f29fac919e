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
from marlctl.sweep.records import record_schedule
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
    plan = compile_plan(loaded)
    index, here = (0, 1) if ctx.alone else (ctx.worker, ctx.workers)
    base = loaded.spec
    sweep = base.sweep or _default_sweep()
    size = batch_size(sweep, plan, ctx.trials, here)
    ctx.placement = ctx.placement or placement(loaded, plan, index, here, ctx.free_cores, size)
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
        taken = take(study, ctx.trials, size)
        if not taken:
            return report
        report.trials += [trial.number for trial in taken]
        run_trials(ctx, sweep, study, taken)
        if after_trial is not None:
            after_trial()


def take(study, budget: int, size: int) -> list:
    """Up to `size` trials to train (re-queued ones first), no more than the budget leaves;
    none where other workers took the last."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    room = max(1, min(size, budget - len(counted(trials)) + waiting))
    taken = []
    for _ in range(room):
        trial = study.ask()
        is_retry = "failed_trial" in frozen(study, trial.number).system_attrs
        if not is_retry and over_budget(study, trial, budget):
            trial.set_user_attr(SURPLUS_ATTR, True)
            study.tell(trial, state=TrialState.FAIL)
            break
        taken.append(trial)
    return taken


def batch_size(sweep, plan, budget: int, workers: int) -> int:
    """The trials a worker trains at once (`sweep.batch`). auto: as many as fit in half of the
    memory of the worker's first device by the plan's estimate, at most a quarter of the
    budget's share of each worker (the sampler learns from the batches before), on a CPU at
    most `CPU_ROWS` rows, at least 1."""
    if sweep.sampler == "pbt":  # the whole population, as one batch
        return budget
    if sweep.batch != "auto":
        return sweep.batch
    share = max(1, math.ceil(budget / max(workers, 1) / 4))
    per_trial = sum(run.est_memory_mb for run in plan.runs)
    device = plan.runs[0].device
    fits = int(_device_memory_mb(device) / 2 // max(per_trial, 1.0))
    if not device.startswith("cuda"):
        fits = min(fits, CPU_ROWS // len(plan.runs))
    return max(1, min(share, fits))


# On a CPU a row's throughput holds up to about 8 rows of a batch and falls beyond
# (bench/results/sweep_batch.md): more trials at once would only slow each down.
CPU_ROWS = 8


def _device_memory_mb(device: str) -> float:
    """The memory of `device`: a GPU's own, else this machine's (4 GiB where it is not
    known)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**20
    from marlctl.plan import physical_memory_mb

    return physical_memory_mb() or 4096.0


def placement(
    loaded, plan, index: int, workers: int, free: int | None = None, trials: int = 1
) -> list[str]:
    """Hardware overrides giving worker `index` its share of this machine: CPU threads
    split between the workers (with `threads_per_run: auto`, of the `free` cores, those
    other processes leave free, measured where not given, and as many as the rows of a
    run process's batch, `trials` at once, make worth it); GPUs dedicated when there are
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
        rows = max(1, seeds // processes) * trials if hw.batch_seeds else 1
        wanted = auto_threads(loaded.spec, plan.env, share, rows)
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


class _Trial:
    """One trial a worker took: sampled, its MLflow run and spec made (`prepare`), trained
    alone or with others (`run_trials`), then told to the study (`conclude`)."""

    def __init__(self, ctx: SweepContext, sweep, study, trial):
        from marlctl import tracking

        self.ctx, self.sweep, self.study, self.trial = ctx, sweep, study, trial
        self.heartbeat = _Heartbeat(trial, sweep.heartbeat_s)
        self.client = tracking.client_for(ctx.tracking_uri)
        self.run_id: str | None = None
        self.state: str | None = None  # once finished
        self.told = False
        self.loaded = self.plan = self.reporter = self.stop = None

    def prepare(self) -> bool:
        """Sample the trial, create its MLflow run and validate its spec; False where it
        ended already (an invalid spec is a failed trial)."""
        import multiprocessing as mp

        from marlctl import tracking
        from marlctl.launch import log_spec, run_tags
        from marlctl.plan import compile_plan
        from marlctl.spec import load_spec

        ctx, trial, client = self.ctx, self.trial, self.client
        values = sample(trial, ctx.params)
        chosen = overrides_for(values, listed_groups(ctx.spec_path))
        trial.set_user_attr("marlctl.overrides", redact_all(chosen))
        trial.set_user_attr("marlctl.worker", f"{socket.gethostname()}:{os.getpid()}")
        experiment_id = tracking.ensure_experiment(client, ctx.experiment, ctx.tracking_uri)
        self.run_id = client.create_run(
            experiment_id,
            run_name=f"trial-{trial.number}",
            tags={
                tracking.PARENT_TAG: ctx.study_run_id,
                "marlctl.role": "trial",
                "marlctl.study": ctx.study,
                "marlctl.trial": str(trial.number),
            },
        ).info.run_id
        trial.set_user_attr(RUN_ATTR, self.run_id)
        tracking.log_params(client, self.run_id, {k: param_text(v) for k, v in values.items()})
        try:
            # The spec as the user would run it (best.yaml), then with this worker's share.
            portable = load_spec(ctx.spec_path, [*ctx.overrides, *chosen])
            self.loaded = load_spec(ctx.spec_path, [*ctx.overrides, *chosen, *ctx.placement])
            self.plan = compile_plan(self.loaded)
        except SpecError as err:
            self.finish("FAIL", "invalid spec: " + "; ".join(str(p) for p in err.problems))
            return False
        loaded = self.loaded
        resolved = {k: v for k, v in portable.resolved.items() if k != "sweep"}
        trial.set_user_attr(SPEC_ATTR, redact_all({**resolved, "name": loaded.experiment}))
        tracking.log_params(client, self.run_id, tracking.flatten(resolved))
        for key, value in run_tags(loaded, self.plan).items():
            client.set_tag(self.run_id, key, value)
        log_spec(client, self.run_id, {**resolved, "name": loaded.experiment})
        self.stop = mp.get_context("spawn").Event()
        self.reporter = _Reporter(
            trial,
            self.sweep.metric,
            list(loaded.spec.seeds),
            self.sweep.objective,
            self.stop,
            loaded.spec.train.eval_every,
            self.heartbeat,
        )
        return True

    def finish(self, state: str, error: str | None = None, value: float | None = None) -> str:
        from optuna.trial import TrialState

        from marlctl import tracking

        self.heartbeat.stop()
        run_id, client, trial = self.run_id, self.client, self.trial
        if run_id is not None:
            if value is not None:
                client.log_metric(run_id, "objective", value)
            status = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED"}.get(state, "FAILED")
            tracking.end_run(client, run_id, status, error, tags={"marlctl.trial_state": state})
        try:
            if error is not None:
                trial.set_user_attr(ERROR_ATTR, redact(error)[:2000])
            if state == "COMPLETE":
                self.study.tell(trial, value)
            else:
                self.study.tell(trial, state=TrialState[state])
            self.told = True
        except Exception as err:  # failed as lost by another worker meanwhile
            if run_id is not None:
                client.set_tag(run_id, "marlctl.tell_error", str(err)[:500])
        self.state = state  # only now: an interrupt before this fails it as interrupted
        return state

    def interrupted(self) -> None:
        """Failed, and re-queued unless another worker failed (and re-queued) it as lost."""
        self.finish("FAIL", "interrupted")
        if self.told:
            retry(self.study, frozen(self.study, self.trial.number), self.sweep.retries)

    def conclude(self, summary) -> str:
        """Tell the study how the trial's seeds ended."""
        trial, sweep = self.trial, self.sweep
        trial.set_user_attr("marlctl.env_steps", sum(r.env_steps for r in summary.runs))
        failed = [r for r in summary.runs if r.status == "FAILED"]
        if failed:
            return self.finish("FAIL", f"seed {failed[0].seed} failed: {failed[0].error}")
        if any(r.status == "PRUNED" for r in summary.runs):
            return self.finish("PRUNED")
        finals = _final_values(self.client, summary, sweep.metric)
        if isinstance(finals, str):
            return self.finish("FAIL", finals)
        for key, value in summary.aggregate().items():
            if value is not None:
                self.client.log_metric(self.run_id, key, value)
        if sweep.sampler == "pbt":
            first = summary.runs[0].run_id
            record_schedule(self.client, trial, self.run_id, first, self.loaded.spec, sweep.space)
        return self.finish("COMPLETE", value=aggregate(finals, sweep.objective))


def run_trials(ctx: SweepContext, sweep, study, trials: list) -> list[str]:
    """Sample, validate, train and tell the trials a worker took: those whose specs differ
    only in hyperparameters a batch's row may have of its own train as one batch (with
    `hardware.batch_seeds`). Their states' names, in order."""
    taken = [_Trial(ctx, sweep, study, trial) for trial in trials]
    try:
        ready = []
        for one in taken:
            try:
                if one.prepare():
                    ready.append(one)
            except Exception as err:
                one.finish("FAIL", f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
        for group in _groups(ready):
            _train_together(group)
    except KeyboardInterrupt:
        for one in taken:
            if one.state is None:
                one.interrupted()
        raise
    return [one.state or "FAIL" for one in taken]


def _groups(ready: list[_Trial]) -> list[list[_Trial]]:
    """The trials in batches of those that may train as rows of one batch, in order."""
    import json

    from marlctl.train.build import structure

    groups: dict[str, list[_Trial]] = {}
    for one in ready:
        key = json.dumps(structure(one.loaded.spec), sort_keys=True, default=str)
        groups.setdefault(key, []).append(one)
    return list(groups.values())


def _train_together(group: list[_Trial]) -> None:
    from marlctl.launch import Planned, run_together

    population = group[0].sweep.sampler == "pbt"
    planned = [
        Planned(one.loaded, one.plan, one.run_id, one.stop, one.reporter, population)
        for one in group
    ]
    try:
        summaries = run_together(planned)
    except KeyboardInterrupt:
        raise
    except Exception as err:
        for one in group:
            one.finish("FAIL", f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
        return
    for one, summary in zip(group, summaries, strict=True):
        # Interrupted: the trials that had ended (pruned, failed) are told so; the others
        # are failed and re-queued by the caller.
        if not summary.interrupted:
            one.conclude(summary)
    if any(summary.interrupted for summary in summaries):
        raise KeyboardInterrupt


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
