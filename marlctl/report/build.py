"""Build a report from an MLflow store: select the runs, group their seeds, score each group
and read the sweeps and cross-play matches among them."""

from __future__ import annotations

import re

import numpy as np

from marlctl import tracking
from marlctl.errors import SpecError
from marlctl.report import labels, stats
from marlctl.report.model import (
    DEFAULT_GROUP_BY,
    DEFAULT_METRIC,
    INCIDENTAL,
    CrossPlayTable,
    Curve,
    Duplicate,
    Group,
    Report,
    differing_params,
    seed_of,
)
from marlctl.report.references import CellReference
from marlctl.report.runs import Filter, RunRecord, Selection, load_curves, select
from marlctl.report.sweeps import sweep_of


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
    sweeps = [sweep_of(selection, study, storage) for study in selection.studies]
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
    from marlctl.crossplay import coordination, ratings, stored_matches

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
    return CrossPlayTable(named, matches, ratings(matches), coordination(matches))


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
        differs = differing_params(members) if split else []
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
        tagged = {r.tags[tracking.REFERENCE_TAG] for r in runs if tracking.REFERENCE_TAG in r.tags}
        group.references = len(tagged)
        if len(tagged) == 1 and all(tracking.REFERENCE_TAG in r.tags for r in runs):
            group.reference = CellReference.from_tag(tagged.pop())
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
        group.differs = differing_params(runs)
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
