"""A suite run: every cell planned first (its spec loaded and checked, its reference translated
to marlctl's conventions or refused), so a suite with a bad cell trains nothing; then each
cell's seeds trained through the run machinery (`launch.run_plan`: device pools, batched seeds,
MLflow), tagged with the suite, the cell and the reference, and judged by
`report.reproduction.decide`; or, for `--dry-run`, each cell's cost estimated (`estimate`)."""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marlctl import tracking
from marlctl.errors import SpecError
from marlctl.report.references import CellReference, Point
from marlctl.report.reproduction import decide
from marlctl.report.stats import Estimate
from marlctl.reproduce.conventions import SAMPLED, Refused, Translated, translate
from marlctl.reproduce.suite import Cell, load_suite
from marlctl.stored import Stopped, finished_seeds, stopped_seeds

# Env parameters that fix an episode's length, by the names the env families use.
EPISODE_LENGTH_PARAMS = ("max_cycles", "max_steps", "max_episode_steps")


@dataclass
class CellPlan:
    """One cell with one algorithm: its own (`method` None) or a compared preset."""

    suite: str
    name: str
    method: str | None
    cell: Cell
    folder: Path
    overrides: list[str]  # the command's, then `algos=METHOD`
    seeds: list[int]
    scale: float
    loaded: Any = None
    plan: Any = None
    translated: Translated | None = None
    budget: int = 0  # env steps per seed
    sized: list[str] = field(default_factory=list)  # the overrides that give it that budget
    refused: str | None = None
    notes: tuple[str, ...] = ()  # what was translated, and a differing env package version
    points: dict[str, str] = field(default_factory=dict)  # name -> player (`points`)
    measured: tuple[Point, ...] = ()  # their scores, once `run_cell` has them

    @property
    def metric(self) -> str:
        return self.cell.reference.conventions.metric

    def tags(self) -> dict[str, str]:
        """What each seed run of the cell carries, for `marlctl report`."""
        assert self.translated is not None
        low, high = self.translated.bounds
        ref = self.cell.reference
        tagged = CellReference(
            self.suite, self.name, self.metric, low, high, self.translated.budget,
            ref.source.kind, ref.source.citation, ref.conventions.statistic, self.measured,
        )  # fmt: skip
        return {
            tracking.SUITE_TAG: self.suite,
            tracking.CELL_TAG: self.name,
            tracking.REFERENCE_TAG: tagged.to_tag(),
        }


@dataclass
class CellOutcome:
    name: str
    # a verdict, `refused` (the reference cannot be compared), `failed`, or `interrupted`
    # (Ctrl-C or SIGTERM stopped its training, or came before it started)
    kind: str
    method: str = ""  # the algorithm trained
    reason: str = ""
    ours: Estimate | None = None
    reference: tuple[float, float] | None = None
    budget: int = 0  # env steps per seed
    seeds: int = 0
    wall_s: float = 0.0
    run_id: str | None = None  # the MLflow parent run of the seeds trained now
    run_ids: list[str] = field(default_factory=list)  # every seed run judged
    reused: int = 0  # seeds whose finished runs the store held already
    resumed: int = 0  # seeds whose stopped runs were continued from their checkpoints
    source: str = ""  # where the reference comes from
    notes: tuple[str, ...] = field(default_factory=tuple)
    uri: str | None = None  # the cell's store
    points: tuple[Point, ...] = ()  # the cell's reference points, scored

    def to_dict(self) -> dict[str, Any]:
        ours = None if self.ours is None else vars(self.ours)
        points = [vars(p) for p in self.points]
        return {**vars(self), "ours": ours, "notes": list(self.notes), "points": points}


def episode_length(params: dict[str, Any]) -> int | None:
    for name in EPISODE_LENGTH_PARAMS:
        if isinstance(params.get(name), int):
            return params[name]
    return None


def _load(cp: CellPlan, seeds: list[int], extra: list[str]):
    from marlctl.plan import compile_plan
    from marlctl.spec import load_spec

    named = [f"name={cp.suite}-{cp.name}", f"seeds=[{','.join(map(str, seeds))}]"]
    given = [*cp.cell.overrides, *cp.overrides, *named, *extra]
    loaded = load_spec(str(cp.folder / cp.cell.spec), given)
    return loaded, compile_plan(loaded)


def _sized(loaded, budget: int, metric: str) -> list[str]:
    """The overrides that train the cell for `budget` env steps and log `metric`: those the
    spec does not say already (none: the spec as loaded is the cell's)."""
    train = loaded.spec.train
    wanted: dict[str, object] = {
        "total_env_steps": budget,
        "eval_every": min(train.eval_every, budget),
        "checkpoint_every": min(train.checkpoint_every, budget),
    }
    if metric.startswith(SAMPLED):
        wanted["eval_sampled"] = True
    return [
        f"train.{key}={str(value).lower() if isinstance(value, bool) else value}"
        for key, value in wanted.items()
        if getattr(train, key) != value
    ]


def plan_cell(cp: CellPlan) -> CellPlan:
    """The cell's spec and plan at its translated budget (times its scale), and the reference
    in marlctl's conventions; `refused` set where it cannot be translated. A spec that does not
    load or check raises its SpecError."""
    loaded, plan = _load(cp, cp.seeds, [])
    params = dict(loaded.spec.env.params)
    try:
        cp.translated = translate(cp.cell.reference, plan.env.n_agents, episode_length(params))
    except Refused as refusal:
        cp.refused = str(refusal)
        return cp
    cp.budget = max(1, round(cp.translated.budget * cp.scale))
    cp.sized = _sized(loaded, cp.budget, cp.metric)
    cp.loaded, cp.plan = _load(cp, cp.seeds, cp.sized) if cp.sized else (loaded, plan)
    statistic = cp.cell.reference.conventions.statistic
    compared = [] if statistic == "final" else [f"compared as the {statistic} over training"]
    noted = [cp.cell.note] if cp.cell.note else []
    cp.notes = (*cp.translated.notes, *compared, *_version_note(cp), *noted)
    return cp


def _version_note(cp: CellPlan) -> list[str]:
    """Where the env package installed is not the one the reference was measured with: its
    scores may differ for that alone."""
    from marlctl.envs.registry import env_package

    env = cp.loaded.spec.env
    installed = env_package(env.id, env.backend)
    ref = cp.cell.reference.env_package
    if installed == f"{ref.name}=={ref.version}":
        return []
    return [f"the reference was measured with {ref.name}=={ref.version}, this run has {installed}"]


def plan_suite(
    path: str,
    overrides: list[str],
    cells: str | None = None,
    seeds: int | None = None,
    scale: float = 1.0,
    compare: list[str] | None = None,
) -> list[CellPlan]:
    """Every picked cell with each algorithm (its own, then the suite's and the command's
    `compare`), planned; the problems of every cell at once as one SpecError."""
    suite, folder = load_suite(path)
    names = selected(list(suite.cells), cells)
    if not names:
        raise SpecError.at("--cells", f"no cell of {suite.name} matches '{cells}'")
    methods = [None, *dict.fromkeys([*suite.compare, *(compare or [])])]
    planned, problems = [], []
    for name in names:
        cell = suite.cells[name]
        wanted = list(range(seeds if seeds is not None else cell.seeds))
        for method in methods:
            extra = [*overrides, *([f"algos={method}"] if method else [])]
            cp = CellPlan(suite.name, name, method, cell, folder, extra, wanted, scale)
            cp.points = suite.points_of(name)
            try:
                planned.append(plan_cell(cp))
            except SpecError as err:
                problems += err.problems
    if problems:
        raise SpecError(problems)
    return planned


def _pending(cp: CellPlan, rerun: bool):
    """`(done, stopped, fresh)`: the seeds the store holds finished with the cell's spec and
    versions, by seed (their value and run id); the seeds whose run there was stopped, by seed
    (`Stopped`: the run `resume` continues); the seeds to train from the start. With
    `rerun` every seed trains from the start."""
    if rerun:
        return {}, {}, list(cp.seeds)
    done = finished_seeds(cp.loaded, cp.plan, cp.metric)
    stopped = {
        seed: run
        for seed, run in stopped_seeds(cp.loaded, cp.plan).items()
        if seed in cp.seeds and seed not in done
    }
    return done, stopped, [s for s in cp.seeds if s not in done and s not in stopped]


def _train(cp: CellPlan, stopped: dict[int, Stopped], fresh: list[int], tags: dict[str, str]):
    """Continue the stopped seeds' runs, then train the fresh seeds: the failed seeds'
    reasons, the parent run of the fresh seeds (None where none trained), and whether the
    training was interrupted."""
    from marlctl.launch import resume, run_plan

    ended = []  # the runs of the seeds trained here (a resumed parent lists its others too)
    by_parent: dict[str, list[str]] = {}
    for run in stopped.values():
        by_parent.setdefault(run.parent, []).append(run.run_id)
    for first, *others in by_parent.values():  # each parent's seeds together, batched
        summary = resume(first, cp.loaded.spec.tracking.uri, others=others)
        ended += [r for r in summary.runs if r.run_id in (first, *others)]
        if any(r.status == "KILLED" for r in ended):  # interrupted: no other seed starts
            return [], None, True
    _tag_reused(cp.loaded, [run.run_id for run in stopped.values()], tags)
    parent = None
    if fresh:
        loaded, plan = (cp.loaded, cp.plan) if fresh == cp.seeds else _load(cp, fresh, cp.sized)
        summary = run_plan(loaded, plan, tags=tags)
        ended += summary.runs
        parent = summary.parent_run_id
    failed = [f"seed {r.seed}: {r.error}" for r in ended if r.status != "FINISHED"]
    return failed, parent, any(r.status == "KILLED" for r in ended)


def run_cell(cp: CellPlan, rerun: bool = False) -> CellOutcome:
    """Train the cell's seeds that its store does not hold finished already (all of them with
    `rerun`), then judge every seed's final value."""
    ref = cp.cell.reference
    outcome = CellOutcome(cp.name, "failed", seeds=len(cp.seeds), source=ref.source.citation)
    if cp.refused is not None:
        outcome.kind, outcome.reason = "refused", cp.refused
        outcome.method = cp.method or ""
        return outcome
    assert cp.translated is not None
    outcome.method, outcome.uri = cp.plan.algo, cp.loaded.spec.tracking.uri
    outcome.budget, outcome.notes = cp.budget, cp.notes
    done, stopped, fresh = _pending(cp, rerun)
    try:
        cp.measured = _points(cp, [] if fresh or stopped else [done[s][1] for s in cp.seeds])
    except (ValueError, RuntimeError) as err:
        outcome.reason = f"reference points: {err}"
        return outcome
    outcome.points = cp.measured
    tags = cp.tags()
    missing = [*stopped, *fresh]
    if missing:
        start = time.perf_counter()
        failed, outcome.run_id, interrupted = _train(cp, stopped, fresh, tags)
        outcome.wall_s = time.perf_counter() - start
        if interrupted:
            outcome.kind = "interrupted"
            outcome.reason = "stopped by Ctrl-C or SIGTERM: the next `marlctl reproduce` resumes it"
            return outcome
        if failed:
            outcome.reason = "; ".join(failed)
            return outcome
        trained = finished_seeds(cp.loaded, cp.plan, cp.metric)  # the newest runs: these
        done = {**done, **{s: trained[s] for s in missing if s in trained}}
    outcome.reused, outcome.resumed = len(cp.seeds) - len(missing), len(stopped)
    _tag_reused(cp.loaded, [done[s][1] for s in cp.seeds if s in done and s not in missing], tags)
    finals = [done[s][0] for s in cp.seeds if s in done]
    outcome.run_ids = [done[s][1] for s in cp.seeds if s in done]
    if len(finals) != len(cp.seeds):
        outcome.reason = f"no final {cp.metric} for {len(cp.seeds) - len(finals)} seed(s)"
        return outcome
    statistic = ref.conventions.statistic
    if statistic != "final":
        finals = _statistic(cp.loaded, outcome.run_ids, cp.metric, statistic)
    verdict = decide(
        finals,
        cp.translated.bounds,
        baseline=ref.source.kind == "baseline",
        scaled=cp.budget < cp.translated.budget,
        maximize=not cp.metric.startswith("loss/"),
    )
    outcome.kind, outcome.reason = verdict.kind, verdict.reason
    outcome.ours, outcome.reference = verdict.ours, verdict.reference
    return outcome


def _points(cp: CellPlan, run_ids: list[str]) -> tuple[Point, ...]:
    """The cell's reference points: as the cell's finished seed runs (`run_ids`, every seed
    the store holds already) carry them where they have every one with the same player, else
    measured (`points.measure`)."""
    if not cp.points:
        return ()
    if run_ids:  # every seed's run carries the same tag: the first's is read
        client = tracking.client_for(cp.loaded.spec.tracking.uri)
        tag = client.get_run(run_ids[0]).data.tags.get(tracking.REFERENCE_TAG)
        tagged = CellReference.from_tag(tag)
        if tagged is not None and {p.name: p.player for p in tagged.points} == cp.points:
            return tagged.points
    from marlctl.reproduce.points import measure

    return measure(cp.loaded, cp.plan, cp.points, cp.metric)


def _statistic(loaded, run_ids: list[str], metric: str, statistic: str) -> list[float]:
    """The seeds' values as the reference's statistic takes them from their evaluations."""
    import numpy as np

    from marlctl.report.reproduction import seed_values

    client = tracking.client_for(loaded.spec.tracking.uri)
    curves = []
    for run_id in run_ids:
        history = sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)
        curves.append((np.array([m.step for m in history]), np.array([m.value for m in history])))
    return seed_values(curves, statistic, maximize=not metric.startswith("loss/"))


def _tag_reused(loaded, run_ids: list[str], tags: dict[str, str]) -> None:
    """Seeds read back from the store join the cell: a report of the suite finds them."""
    if not run_ids:
        return
    client = tracking.client_for(loaded.spec.tracking.uri)
    for run_id in run_ids:
        for key, value in tags.items():
            client.set_tag(run_id, key, value)


def selected(names: list[str], pattern: str | None) -> list[str]:
    """The cells `--cells` picks: comma-separated names or shell patterns."""
    if pattern is None:
        return names
    wanted = [p.strip() for p in pattern.split(",") if p.strip()]
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in wanted)]


def reproduce(planned: list[CellPlan], rerun: bool = False) -> list[CellOutcome]:
    """Run the planned cells one after another: every cell's outcome. Seeds whose finished
    runs the store holds are not trained again unless `rerun`. A cell interrupted (Ctrl-C,
    SIGTERM) stops the suite: the cells after it are `interrupted` without starting."""
    outcomes: list[CellOutcome] = []
    for cp in planned:
        if outcomes and outcomes[-1].kind == "interrupted":
            outcome = CellOutcome(cp.name, "interrupted", cp.method or "", seeds=len(cp.seeds))
            outcome.reason = "not started: the command was interrupted"
            outcomes.append(outcome)
            continue
        outcomes.append(run_cell(cp, rerun))
    return outcomes


@dataclass
class DryRow:
    name: str
    method: str
    env: str
    seeds: int
    finished: int  # seeds the store holds finished: not trained again
    budget: int
    refused: str | None
    resumed: int = 0  # seeds whose stopped runs will be continued
    cost: Any = None  # estimate.CostEstimate of the seeds still to train


def dry_run(planned: list[CellPlan], seconds: float, rerun: bool = False) -> list[DryRow]:
    """Each planned cell's runs and, for the seeds still to train, its estimated cost."""
    from marlctl.reproduce.estimate import estimate

    rows = []
    for cp in planned:
        if cp.refused is not None:
            method = cp.method or "—"
            rows.append(DryRow(cp.name, method, "—", len(cp.seeds), 0, 0, cp.refused))
            continue
        done, stopped, fresh = _pending(cp, rerun)
        missing = [s for s in cp.seeds if s not in done]
        finished = len(cp.seeds) - len(missing)  # the store may hold seeds beyond the cell's
        row = DryRow(cp.name, cp.plan.algo, cp.plan.env.id, len(cp.seeds), finished, cp.budget,
                     None, resumed=len(stopped))  # fmt: skip
        if missing:
            whole = len(missing) == len(cp.seeds)
            loaded, plan = (cp.loaded, cp.plan) if whole else _load(cp, missing, cp.sized)
            trained = {seed: run.step for seed, run in stopped.items()}  # resumed from there
            row.cost = estimate(loaded, plan, seconds, trained)
        rows.append(row)
    return rows
