"""What every process of a sweep shares: the study's name and storage, the spec, the workers'
placement, the names of the attributes the study keeps on its trials, and what a sweep reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from marlctl.sweep.space import (
    Param,
)

HEARTBEAT_ATTR = "marlctl.heartbeat"
PROGRESS_ATTR = "marlctl.progress"  # [env steps of the slowest seed, total] while running
BUDGET_ATTR = "marlctl.budget"  # the trials last asked of the study (`--trials`)
PROGRESS_EVERY_S = 2.0
ERROR_ATTR = "marlctl.error"
RUN_ATTR = "marlctl.mlflow_run_id"
SPEC_ATTR = "marlctl.spec"
# A population member's hyperparameters over training: {key: [[env step, value], ...]}.
SCHEDULE_ATTR = "marlctl.pbt_schedule"
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
