"""Starting a sweep's workers: processes on this machine, or SLURM jobs through submitit; and
following the study while they work."""

from __future__ import annotations

import math
import multiprocessing as mp
import threading
import time
from pathlib import Path
from typing import Any

from marlctl.errors import Problem, SpecError
from marlctl.sweep.budget import counted
from marlctl.sweep.context import ERROR_ATTR, PROGRESS_ATTR, Launcher, Progress, SweepContext


def _worker_main(ctx: SweepContext) -> None:
    """A worker process: its own trials until the budget is used; exit 130 on Ctrl-C."""
    import signal
    import sys

    from marlctl.launch import Terminated
    from marlctl.sweep.worker import work

    def stop(signum, frame):
        raise Terminated

    signal.signal(signal.SIGTERM, stop)
    try:
        work(ctx)
    except KeyboardInterrupt:
        sys.exit(130)


def run_local(
    contexts: list[SweepContext], study, ctx: SweepContext, progress: Progress | None
) -> list[str]:
    """One spawned process per worker; the coordinator watches them and the study. A single
    worker runs in this process."""
    if len(contexts) == 1:
        from marlctl.sweep.worker import work

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


def run_submitit(
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
            [launcher_problem(f"{err}; --cluster local runs the jobs on this machine")]
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
    from marlctl.sweep.worker import work

    return work(SweepContext(**{**ctx.__dict__, "alone": True})).trials


def launcher_problem(message: str) -> Problem:
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
