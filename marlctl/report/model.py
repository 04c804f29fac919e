"""What a report says, built once from the runs (`build`) and written in every format: its
groups of seeds with their scores, costs and curves, its sweeps and its cross-play table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marlctl.report import labels, stats
from marlctl.report.references import CellReference
from marlctl.report.runs import RunRecord

DEFAULT_GROUP_BY = ("algo.name", "env.id")
DEFAULT_METRIC = "eval/return_mean"
TOP_TRIALS = 10
# Params that differ between runs of one configuration without changing what it learns.
INCIDENTAL = ("seed", "name", "label", "seeds", "hardware.", "tracking.", "sweep")


@dataclass
class Curve:
    steps: np.ndarray
    value: np.ndarray
    low: np.ndarray
    high: np.ndarray


@dataclass
class Duplicate:
    """Finished runs of one seed with one configuration, in one group: a command re-run
    after an interruption that had let this seed finish. Only `kept` counts as the seed."""

    seed: str
    kept: RunRecord
    left_out: list[RunRecord]


@dataclass
class Group:
    key: tuple[str | None, ...]
    runs: list[RunRecord]
    scores: list[float]  # final metric of each run that has one
    mean: stats.Estimate | None = None
    iqm: stats.Estimate | None = None
    env_steps: float | None = None
    wall_s: float | None = None
    steps_per_s: float | None = None
    differs: list[str] = field(default_factory=list)
    curve: Curve | None = None
    config: dict[str, str | None] = field(default_factory=dict)  # params that split it off
    envs: tuple[str, ...] = ()
    diverged: int = 0  # runs whose final value is not finite
    # Runs with a curve but no evaluation at step 0 while others of the group have one: the
    # mean curve can only start where every seed has data.
    no_step0: int = 0
    # The fewest scored seeds on any one env, and that env (None for a group on one env):
    # the count its stratified intervals rest on.
    fewest_seeds: tuple[int, str | None] = (0, None)
    duplicates: list[Duplicate] = field(default_factory=list)  # runs left out, not in `runs`
    finals: dict[str, float | None] = field(default_factory=dict)  # run id -> final value
    # The name a spec's `label` or `report --label` gives the group, or None.
    custom: str | None = None
    # The suite cell's reference every run of the group carries (`marlctl reproduce`), or None;
    # `references`: how many different ones its runs carry (more than one: cells pooled).
    reference: CellReference | None = None
    references: int = 0

    @property
    def parts(self) -> list[str]:
        """What names the group by default: its group-by values, then the params that split
        it off."""
        return ["—" if v is None else v for v in self.key] + [
            f"{k}={v}" for k, v in self.config.items()
        ]

    @property
    def default_label(self) -> str:
        return labels.public(" · ".join(self.parts)) or "all runs"

    @property
    def label(self) -> str:
        return labels.public(self.custom) if self.custom else self.default_label

    @property
    def tasks(self) -> int:
        return len(self.envs)

    @property
    def missing(self) -> int:
        return len(self.runs) - len(self.scores)


@dataclass
class Trial:
    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    env_steps: int | None
    run_id: str | None
    # A population member's hyperparameters over training: {key: [[env step, value], ...]}.
    schedule: dict[str, list] | None = None


@dataclass
class Sweep:
    name: str
    experiment: str
    run_id: str
    metric: str
    direction: str
    trials: list[Trial]
    importances: dict[str, float] | None
    note: str | None

    @property
    def best(self) -> list[Trial]:
        done = [t for t in self.trials if t.state == "COMPLETE" and t.value is not None]
        return sorted(done, key=lambda t: t.value, reverse=self.direction == "maximize")[
            :TOP_TRIALS
        ]

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials:
            out[t.state] = out.get(t.state, 0) + 1
        return out


@dataclass
class CrossPlayTable:
    """The matches stored among the report's seed runs, the runs' ratings from their group
    seats, and the zero-shot coordination matrices from their agent seats."""

    labels: dict[str, str]  # run id -> how the report names it
    matches: list  # marlctl.crossplay.Match
    ratings: list  # marlctl.crossplay.Rating, best first
    coordination: list = field(default_factory=list)  # marlctl.crossplay.Coordination

    @property
    def seats(self) -> list[str]:
        """The group seats played, by label (sampled matches apart)."""
        return sorted({m.label for m in self.matches if m.group_seat})


@dataclass
class Report:
    uri: str  # the store, password removed: for error messages here, never for a report
    metric: str
    direction: str  # maximize | minimize
    group_by: tuple[str, ...]
    groups: list[Group]
    sweeps: list[Sweep]
    left_out: dict[str, int]
    crossplay: CrossPlayTable | None = None
    title: str | None = None  # what a figure of part of the report is of (a suite's cell)

    @property
    def store(self) -> str:
        """The store as a report names it: its kind and file name, no path, host or password."""
        return labels.place(self.uri)

    @property
    def best(self) -> dict[str, list[int]]:
        """Per column, the indices of the groups with the best value among those on the
        same envs."""
        sign = 1 if self.direction == "maximize" else -1
        columns = {
            "mean": (lambda g: g.mean.value if g.mean else None, sign),
            "iqm": (lambda g: g.iqm.value if g.iqm else None, sign),
            "wall_s": (lambda g: g.wall_s, -1),
            "steps_per_s": (lambda g: g.steps_per_s, 1),
        }
        # Returns on different envs do not compare: the best is per env (or set of envs).
        out: dict[str, list[int]] = {}
        for name, (get, direction) in columns.items():
            by_envs: dict[tuple[str, ...], list[tuple[float, int]]] = {}
            for i, g in enumerate(self.groups):
                if (v := get(g)) is not None:
                    by_envs.setdefault(g.envs, []).append((direction * v, i))
            out[name] = sorted(max(found)[1] for found in by_envs.values() if len(found) > 1)
        return out


def seed_of(run: RunRecord) -> str | None:
    return run.tags.get("marlctl.seed", run.params.get("seed"))


def differing_params(runs: list[RunRecord]) -> list[str]:
    """The params (other than incidental ones) whose value is not the same in every run."""
    keys = set().union(*(r.params for r in runs))
    return sorted(
        k for k in keys if not k.startswith(INCIDENTAL) and len({r.params.get(k) for r in runs}) > 1
    )
