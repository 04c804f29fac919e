"""A suite run: each cell's spec trained through the run machinery (`launch.run_plan`: device
pools, batched seeds, MLflow), its reference translated to marlctl's conventions, and its
verdict. A cell whose reference cannot be translated is refused before it trains."""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marlctl.errors import SpecError
from marlctl.launch import finished_seeds
from marlctl.report.stats import Estimate
from marlctl.reproduce.conventions import Refused, translate
from marlctl.reproduce.suite import Cell, load_suite
from marlctl.reproduce.verdict import decide

# Env parameters that fix an episode's length, by the names the env families use.
EPISODE_LENGTH_PARAMS = ("max_cycles", "max_steps", "max_episode_steps")


@dataclass
class CellOutcome:
    name: str
    kind: str  # a verdict, `refused` (the reference cannot be compared) or `failed`
    reason: str = ""
    ours: Estimate | None = None
    reference: tuple[float, float] | None = None
    budget: int = 0  # env steps per seed
    seeds: int = 0
    wall_s: float = 0.0
    run_id: str | None = None  # the MLflow parent run of the seeds trained now
    reused: int = 0  # seeds whose finished runs the store held already
    source: str = ""  # where the reference comes from
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        ours = None if self.ours is None else vars(self.ours)
        return {**vars(self), "ours": ours, "notes": list(self.notes)}


def episode_length(params: dict[str, Any]) -> int | None:
    for name in EPISODE_LENGTH_PARAMS:
        if isinstance(params.get(name), int):
            return params[name]
    return None


def _load(folder: Path, cell: Cell, overrides: list[str]):
    from marlctl.plan import compile_plan
    from marlctl.spec import load_spec

    loaded = load_spec(str(folder / cell.spec), [*cell.overrides, *overrides])
    return loaded, compile_plan(loaded)


def plan_cell(
    folder: Path, name: str, cell: Cell, suite: str, overrides: list[str], seeds: list[int],
    scale: float,
):  # fmt: skip
    """The cell's spec and plan for `seeds` at its translated budget (times `scale`), and the
    reference in marlctl's conventions; Refused where it cannot be translated."""
    base = [*overrides, f"name={suite}-{name}", f"seeds=[{','.join(map(str, seeds))}]"]
    loaded, plan = _load(folder, cell, base)
    params = dict(loaded.spec.env.params)
    translated = translate(cell.reference, plan.env.n_agents, episode_length(params))
    budget = max(1, round(translated.budget * scale))
    train = loaded.spec.train
    sized = [
        f"train.total_env_steps={budget}",
        f"train.eval_every={min(train.eval_every, budget)}",
        f"train.checkpoint_every={min(train.checkpoint_every, budget)}",
    ]
    loaded, plan = _load(folder, cell, [*base, *sized])
    return loaded, plan, translated, budget


def run_cell(
    folder: Path, name: str, cell: Cell, suite: str, overrides: list[str], seeds: int,
    scale: float, rerun: bool = False,
) -> CellOutcome:  # fmt: skip
    """Train the cell's seeds that its store does not hold finished already (all of them with
    `rerun`), then judge every seed's final value."""
    from marlctl.launch import run_plan

    ref, wanted = cell.reference, list(range(seeds))
    outcome = CellOutcome(name, "failed", seeds=seeds, source=ref.source.citation)
    try:
        loaded, plan, translated, budget = plan_cell(
            folder, name, cell, suite, overrides, wanted, scale
        )
    except Refused as refusal:
        outcome.kind, outcome.reason = "refused", str(refusal)
        return outcome
    outcome.budget, outcome.notes = budget, translated.notes
    metric = ref.conventions.metric
    done = {} if rerun else finished_seeds(loaded, plan, metric)
    missing = [s for s in wanted if s not in done]
    if missing:
        if len(missing) < len(wanted):
            loaded, plan, *_ = plan_cell(folder, name, cell, suite, overrides, missing, scale)
        start = time.perf_counter()
        summary = run_plan(loaded, plan)
        outcome.wall_s, outcome.run_id = time.perf_counter() - start, summary.parent_run_id
        if not summary.ok:
            failed = [r for r in summary.runs if r.status != "FINISHED"]
            outcome.reason = "; ".join(f"seed {r.seed}: {r.error}" for r in failed)
            return outcome
        trained = finished_seeds(loaded, plan, metric)  # the newest runs: these
        done = {**done, **{s: trained[s] for s in missing if s in trained}}
    outcome.reused = len(wanted) - len(missing)
    finals = [done[s][0] for s in wanted if done.get(s, (None,))[0] is not None]
    if len(finals) != len(wanted):
        outcome.reason = f"no final {metric} for {len(wanted) - len(finals)} seed(s)"
        return outcome
    verdict = decide(finals, translated, baseline=ref.source.kind == "baseline", scaled=scale < 1)
    outcome.kind, outcome.reason = verdict.kind, verdict.reason
    outcome.ours, outcome.reference = verdict.ours, verdict.reference
    return outcome


def selected(names: list[str], pattern: str | None) -> list[str]:
    """The cells `--cells` picks: comma-separated names or shell patterns."""
    if pattern is None:
        return names
    wanted = [p.strip() for p in pattern.split(",") if p.strip()]
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in wanted)]


def reproduce(
    path: str,
    overrides: list[str],
    cells: str | None = None,
    seeds: int | None = None,
    scale: float = 1.0,
    rerun: bool = False,
) -> list[CellOutcome]:
    """Run the suite at `path` (its cells `cells` picks), `seeds` seeds a cell (default: the
    cell's own), budgets times `scale`: every cell's outcome. Seeds whose finished runs the
    store holds are not trained again unless `rerun`."""
    suite, folder = load_suite(path)
    names = selected(list(suite.cells), cells)
    if not names:
        raise SpecError.at("--cells", f"no cell of {suite.name} matches '{cells}'")
    outcomes = []
    for name in names:
        cell = suite.cells[name]
        count = seeds if seeds is not None else cell.seeds
        outcomes.append(run_cell(folder, name, cell, suite.name, overrides, count, scale, rerun))
    return outcomes
