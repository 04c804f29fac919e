"""`marlctl report`: compare finished runs, read from MLflow only.

Seeds are grouped (by `algo.name,env.id` unless told otherwise); each group gets its final
score as mean and IQM with stratified-bootstrap 95% CIs (`stats`), its cost (env steps,
wall-clock, throughput) and a sample-efficiency curve. A sweep gets its best trials, its
optimisation history and the parameters' importances. An appendix (`appendix`) lists every
group's hyperparameters, where the runs came from and how they were evaluated. Runs that played
each other (`marlctl eval RUN --vs ...`) get a cross-play matrix per seat and ratings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from marlctl import tracking
from marlctl.errors import SpecError
from marlctl.report import labels, stats
from marlctl.report.runs import Filter, RunRecord, Selection, load_curves, select

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
    """The matches stored among the report's seed runs, and the runs' ratings from them."""

    labels: dict[str, str]  # run id -> how the report names it
    matches: list  # marlctl.crossplay.Match
    ratings: list  # marlctl.crossplay.Rating, best first

    @property
    def seats(self) -> list[str]:
        return sorted({m.seat for m in self.matches})


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


def build(
    uri: str | None,
    experiments: list[str],
    run_ids: list[str],
    filters: list[str],
    metric: str = DEFAULT_METRIC,
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY,
    direction: str | None = None,
    storage: str | None = None,
    reps: int = stats.REPS,
    split: bool = True,
    names: list[str] | tuple[str, ...] = (),
) -> Report:
    """`split`: runs of one group that differ in a param (other than seeds, hardware and
    tracking) form groups of their own, so configurations are never pooled as seeds.
    `names`: `GROUP=TEXT` labels (`report --label`), over those the runs' specs give."""
    from mlflow.exceptions import MlflowException

    from marlctl.redact import shown_url

    parsed = [Filter.parse(text, i + 1) for i, text in enumerate(filters)]
    tracking.check_store(uri)
    try:
        client = tracking.client_for(uri)
        selection = select(client, uri, experiments, run_ids, parsed)
        load_curves(client, selection.seeds, metric)
        crossplay = _cross_play(client, selection.seeds)
    except MlflowException as err:
        shown = shown_url(tracking.resolve_uri(uri))
        raise SpecError.at("--tracking-uri", f"{shown}: {err}") from None
    if direction is None:
        direction = "minimize" if metric.startswith("loss/") else "maximize"
    groups = _groups(selection, metric, group_by, reps, split=split)
    name_groups(groups, names)
    sweeps = [_sweep(selection, study, storage) for study in selection.studies]
    return Report(
        shown_url(selection.uri),
        metric,
        direction,
        group_by,
        groups,
        sweeps,
        dict(selection.left_out),
        crossplay,
    )


def _cross_play(client, seeds: list[RunRecord]) -> CrossPlayTable | None:
    """The matches the report's seed runs played against each other, or None."""
    from marlctl.crossplay import ratings, stored_matches

    chosen = {r.run_id: r for r in seeds}
    matches = [
        m
        for r in seeds
        for m in stored_matches(client, r.run_id)
        if m.run_id == r.run_id and m.opponent in chosen  # a record names its own run
    ]
    if not matches:
        return None
    named = {
        run_id: labels.public(
            f"{r.experiment} · seed {r.tags.get('marlctl.seed', '?')} · {run_id[:8]}"
        )
        for run_id, r in chosen.items()
    }
    return CrossPlayTable(named, matches, ratings(matches))


# ---------------------------------------------------------------- groups


def _final(run: RunRecord, metric: str) -> float | None:
    if run.diverged:
        return None
    if run.curve is not None:
        return float(run.curve[1][-1])
    value = run.metrics.get(metric)
    return value if value is not None and np.isfinite(value) else None


def _buckets(runs: list[RunRecord], group_by: tuple[str, ...], split: bool):
    buckets: dict[tuple[str | None, ...], list[RunRecord]] = {}
    for run in runs:
        buckets.setdefault(tuple(run.lookup(k) for k in group_by), []).append(run)
    for key, members in buckets.items():
        differs = _differing_params(members) if split else []
        if not differs:
            yield key, {}, members
            continue
        parts: dict[tuple, list[RunRecord]] = {}
        for run in members:
            parts.setdefault(tuple(run.params.get(k) for k in differs), []).append(run)
        for values, part in parts.items():
            extra = {k: v for k, v in zip(differs, values, strict=True)}
            yield key, extra, part


def _groups(selection: Selection, metric: str, group_by: tuple[str, ...], reps: int, split: bool):
    groups = []
    for key, extra, found in _buckets(selection.seeds, group_by, split):
        runs, duplicates = _deduplicate(found)
        finals = {r.run_id: _final(r, metric) for r in runs}
        scored = [(r, s) for r in runs if (s := finals[r.run_id]) is not None]
        group = Group(key, runs, [s for _, s in scored], config=extra, duplicates=duplicates)
        group.finals = finals
        given = sorted({r.params["label"] for r in runs if r.params.get("label", "null") != "null"})
        group.custom = " / ".join(given) or None
        tasks = [_task(r) for r, _ in scored]
        group.envs = tuple(sorted({_task(r) for r in runs}))
        group.diverged = sum(r.diverged for r in runs)
        if scored:
            count, env = stats.fewest_per_task(tasks)
            group.fewest_seeds = (count, env if len(set(tasks)) > 1 else None)
            group.mean = stats.estimate(np.array(group.scores), tasks, "mean", reps)
            group.iqm = stats.estimate(np.array(group.scores), tasks, "iqm", reps)
        group.env_steps = _average(r.env_steps for r in runs)
        group.wall_s = _average(r.wall_s for r in runs)
        group.steps_per_s = _average(r.steps_per_s for r in runs)
        group.differs = _differing_params(runs)
        group.curve = _curve(runs, reps)
        starts = [r.curve[0][0] for r in runs if r.curve is not None and len(r.curve[0]) > 0]
        if 0 in starts:
            group.no_step0 = sum(start > 0 for start in starts)
        groups.append(group)
    groups.sort(key=lambda g: (tuple("" if v is None else v for v in g.key), str(g.config)))
    return groups


def name_groups(groups: list[Group], names: list[str] | tuple[str, ...]) -> None:
    """Apply `GROUP=TEXT` labels. GROUP is a group's default label or its parts separated by
    commas (`mappo,mpe/simple_spread`, `mappo,mpe/simple_spread,algo.lr=0.001`); the text
    after the `=` that ends a GROUP names it."""
    for index, text in enumerate(names, 1):
        where = f"--label #{index}"
        found = None
        for at in (i for i, c in enumerate(text) if c == "="):
            wanted = [p.strip() for p in re.split(r"[,·]", text[:at])]
            matches = [g for g in groups if wanted == g.parts or text[:at] == g.default_label]
            if matches:
                found = (matches, text[at + 1 :].strip())
                break
        if found is None:
            known = "; ".join(",".join(g.parts) for g in groups)
            raise SpecError.at(where, f"'{text}' names no group (GROUP=TEXT); the groups: {known}")
        matches, label = found
        if not label:
            raise SpecError.at(where, f"'{text}' gives the group no text")
        for group in matches:
            group.custom = label


def seed_of(run: RunRecord) -> str | None:
    return run.tags.get("marlctl.seed", run.params.get("seed"))


def _deduplicate(runs: list[RunRecord]) -> tuple[list[RunRecord], list[Duplicate]]:
    """One run per seed and configuration: of several finished runs of the same seed with
    the same params (seeds, hardware and tracking aside), the newest to finish. Counting
    both would count the seed twice and narrow the intervals; they trained the same budget
    (it is a param), and the later one is the run its command was re-run to produce."""
    by_identity: dict[tuple, list[RunRecord]] = {}
    for run in runs:
        seed = seed_of(run)
        if seed is None:  # runs that record no seed cannot be told apart
            by_identity[("run", run.run_id)] = [run]
            continue
        params = run.params.items()
        config = tuple(sorted((k, v) for k, v in params if not k.startswith(INCIDENTAL)))
        by_identity.setdefault((seed, config), []).append(run)
    kept, duplicates = [], []
    for identity, members in by_identity.items():
        members.sort(key=lambda r: (r.end_ms or 0, r.start_ms or 0, r.run_id), reverse=True)
        kept.append(members[0])
        if len(members) > 1:
            duplicates.append(Duplicate(str(identity[0]), members[0], members[1:]))
    order = {r.run_id: i for i, r in enumerate(runs)}
    kept.sort(key=lambda r: order[r.run_id])
    return kept, sorted(duplicates, key=lambda d: order[d.kept.run_id])


def _task(run: RunRecord) -> str:
    """What the bootstrap stratifies by: the env."""
    return str(run.lookup("env.id"))


def _average(values) -> float | None:
    found = [v for v in values if v is not None]
    return float(np.mean(found)) if found else None


def _differing_params(runs: list[RunRecord]) -> list[str]:
    keys = set().union(*(r.params for r in runs))
    return sorted(
        k for k in keys if not k.startswith(INCIDENTAL) and len({r.params.get(k) for r in runs}) > 1
    )


def _curve(runs: list[RunRecord], reps: int) -> Curve | None:
    with_curves = [r for r in runs if r.curve is not None and len(r.curve[0]) > 0]
    if not with_curves:
        return None
    steps, values = stats.common_grid([r.curve for r in with_curves])
    if len(steps) == 0:
        return None
    value, low, high = stats.band(values, [_task(r) for r in with_curves], "mean", min(reps, 2000))
    return Curve(steps, value, low, high)


# ---------------------------------------------------------------- sweeps


def _sweep(selection: Selection, study_run: RunRecord, storage: str | None) -> Sweep:
    name = study_run.tags.get("marlctl.study", study_run.name)
    metric = study_run.params.get("sweep.metric", "objective")
    direction = study_run.params.get("sweep.direction", "maximize")
    url = storage or study_run.tags.get("marlctl.storage_url")
    trials, importances, note = None, None, None
    try:
        study = _open_study(name, url)
    except Exception as err:  # any storage failure: fall back to what MLflow holds
        # The reason may name the storage's path or URL: the report shows it made public.
        reason = labels.public(str(err))
        study, note = None, f"Optuna study not opened ({reason}); pass --storage for importances"
    if study is not None:
        trials = [
            Trial(
                t.number,
                t.state.name,
                _value(t),
                {k: _shown(v) for k, v in t.params.items()},
                t.user_attrs.get("marlctl.env_steps"),
                t.user_attrs.get("marlctl.mlflow_run_id"),
            )
            for t in study.trials
        ]
        importances, why = _importances(study)
        note = note or (labels.public(why) if why else None)
    else:
        trials = _trials_from_mlflow(selection.trials.get(study_run.run_id, []))
    return Sweep(
        name, study_run.experiment, study_run.run_id, metric, direction, trials, importances, note
    )


def _open_study(name: str, url: str | None):
    import optuna

    if not url:
        raise ValueError("the study run names no storage")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if "://" not in url:
        if not Path(url).is_file():
            raise FileNotFoundError(f"no journal at {url}")
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(url)))
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise FileNotFoundError(f"no database at {url}")
    return optuna.load_study(study_name=name, storage=url)


def _importances(study) -> tuple[dict[str, float] | None, str | None]:
    import optuna
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 2 or not any(t.params for t in done):
        return None, "parameter importances need two complete trials with parameters"
    try:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (RuntimeError, ValueError) as err:
        return None, f"parameter importances unavailable: {err}"
    return {k: float(v) for k, v in found.items()}, None


def _value(trial) -> float | None:
    """A complete trial's objective; a pruned one's last reported value."""
    if trial.value is not None or not trial.intermediate_values:
        return trial.value
    return trial.intermediate_values[max(trial.intermediate_values)]


def _shown(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _trials_from_mlflow(runs: list[RunRecord]) -> list[Trial]:
    varying = _differing_params(runs)
    trials = []
    for run in runs:
        number = run.tags.get("marlctl.trial")
        trials.append(
            Trial(
                int(number) if number and number.isdigit() else len(trials),
                run.tags.get("marlctl.trial_state", run.status),
                run.metrics.get("objective"),
                {k: run.params.get(k) for k in varying},
                None,
                run.run_id,
            )
        )
    return trials
