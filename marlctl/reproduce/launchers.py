"""A suite's cells as submitit jobs (`--launcher submitit`): one job per cell, on SLURM or
submitit's local executor, each running the cell as `reproduce` would here (its seeds that the
store does not hold finished), all of them at once; the outcomes gathered when every job ends.
A job that fails is its cell's `failed` outcome, with the reason; the cells' store must be one
every job reaches (a server, or a file on a shared disk)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from marlctl.errors import Problem, SpecError
from marlctl.reproduce.runner import CellOutcome, CellPlan, run_cell


def run_submitit(planned: list[CellPlan], rerun: bool, launcher) -> list[CellOutcome]:
    """`launcher`: a `sweep.Launcher` (cluster, partition, CPUs and minutes per job)."""
    try:
        import submitit
    except ImportError:
        message = "submitit is not installed: pip install 'marlctl[cluster]'"
        raise SpecError([Problem("--launcher", None, "", message)]) from None
    folder = Path(launcher.folder or Path.cwd() / ".submitit" / f"reproduce-{planned[0].suite}")
    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=launcher.cluster)
    except (RuntimeError, ValueError) as err:
        message = f"{err}; --cluster local runs the jobs on this machine"
        raise SpecError([Problem("--launcher", None, "", message)]) from None
    params: dict[str, Any] = {
        "timeout_min": launcher.time_min,
        "name": f"marlctl-reproduce-{planned[0].suite}",
    }
    if launcher.cpus_per_worker:
        params["cpus_per_task"] = launcher.cpus_per_worker
    if launcher.partition:
        params["slurm_partition"] = launcher.partition
    executor.update_parameters(**params)
    jobs = []
    for cp in planned:
        wants_gpu = cp.plan is not None and any(r.device.startswith("cuda") for r in cp.plan.runs)
        executor.update_parameters(gpus_per_node=1 if wants_gpu else 0)
        jobs.append(executor.submit(run_cell, cp, rerun))
    try:
        while not all(job.done() for job in jobs):
            time.sleep(1.0)
    except KeyboardInterrupt:
        for job in jobs:
            job.cancel(check=False)
        raise
    outcomes = []
    for job, cp in zip(jobs, planned, strict=True):
        error = job.exception()
        if error is None:
            outcomes.append(job.result())
            continue
        failed = CellOutcome(cp.name, "failed", method=cp.method or "", seeds=len(cp.seeds))
        failed.reason = f"job {job.job_id} failed: {str(error).strip().splitlines()[-1]}"
        outcomes.append(failed)
    return outcomes
