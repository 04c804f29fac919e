"""A sweep in MLflow: one study run per study and storage, its trials' runs under it, and the
summary of the best trials, written as a runnable spec when the sweep ends."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from marlctl.atomic import replacing
from marlctl.redact import redact_all, shown_url
from marlctl.sweep.budget import counted
from marlctl.sweep.context import (
    ERROR_ATTR,
    SCHEDULE_ATTR,
    SPEC_ATTR,
    TOP,
    SweepContext,
    SweepSummary,
)
from marlctl.sweep.storage import storage_url


def summarize(study, ctx: SweepContext, sweep, out_dir: Path | None) -> SweepSummary:
    from optuna.trial import TrialState

    from marlctl import tracking

    trials = study.get_trials(deepcopy=False)
    mine = counted(trials)
    counts = {s.name: 0 for s in TrialState}
    for t in mine:
        counts[t.state.name] += 1
    complete = [t for t in mine if t.state == TrialState.COMPLETE and t.value is not None]
    complete.sort(key=lambda t: t.value, reverse=sweep.direction == "maximize")
    top = [_trial_row(t) for t in complete[:TOP]]
    best_spec = None
    if complete and SPEC_ATTR in complete[0].user_attrs:
        folder = out_dir or Path(ctx.cwd) / f"sweep-{_file_name(ctx.study)}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "best.yaml"
        header = (
            f"# Best trial ({complete[0].number}) of study '{ctx.study}' in "
            f"{shown_url(storage_url(ctx.storage, ctx.cwd))}: "
            f"{sweep.metric} = {complete[0].value:.6g}\n"
        ) + _schedule_comment(complete[0].user_attrs)
        with replacing(path) as tmp:  # never a half-written spec
            spec = yaml.safe_dump(redact_all(complete[0].user_attrs[SPEC_ATTR]), sort_keys=False)
            tmp.write_text(header + spec)
        best_spec = str(path)
    retried = (
        len(trials) - len(mine) - sum(bool(t.user_attrs.get("marlctl.surplus")) for t in trials)
    )
    return SweepSummary(
        study=ctx.study,
        storage=shown_url(storage_url(ctx.storage, ctx.cwd)),
        tracking_uri=tracking.resolve_uri(ctx.tracking_uri),
        study_run_id=ctx.study_run_id,
        budget=ctx.trials,
        counts={k: v for k, v in counts.items() if v},
        retried=retried,
        env_steps=sum(int(t.user_attrs.get("marlctl.env_steps", 0)) for t in trials),
        best=top[0] if top else None,
        top=top,
        best_spec=best_spec,
    )


def _schedule_comment(attrs: dict) -> str:
    """What the `best.yaml` of a population-based training holds (`attrs`: the best trial's
    user attributes)."""
    if not attrs.get(SCHEDULE_ATTR):
        return ""
    if not attrs.get(SPEC_ATTR, {}).get("train", {}).get("schedule"):
        return (
            "# Population-based training's best member: its lineage never changed its values\n"
            "# (it exploited no other member); `algo` holds them.\n"
        )
    return (
        "# Population-based training's best member: `algo` holds the values its lineage (the\n"
        "# members whose weights it descends from) started with, `train.schedule` those it\n"
        "# took from each exploit on. Training this spec replays that schedule from scratch,\n"
        "# without the weights the member copied.\n"
    )


def record_schedule(client, trial, run_id: str, seed_run: str, spec, space) -> None:
    """A population member's hyperparameters over training (`pbt/KEY`, as its first seed
    `seed_run` logged them) on its trial: as metrics of its run `run_id` and as
    `SCHEDULE_ATTR`; and the spec `best.yaml` is written from, which replays its lineage's
    schedule: `algo` the values the lineage started with, `train.schedule` those it took from
    each exploit on (`spec`: the member's, whose fields' types the values keep; `space`: the
    sweep's)."""
    from mlflow.entities import Metric

    from marlctl.train.population import SCHEDULE_PREFIX, field_value

    def kept(key: str, value: float) -> float | int:  # an int field's values stay ints
        return int(round(value)) if isinstance(field_value(spec, key), int) else value

    schedule, copied = {}, []
    for key in space:
        history = client.get_metric_history(seed_run, SCHEDULE_PREFIX + key)
        copied += [Metric(m.key, m.value, m.timestamp, m.step) for m in history]
        points = sorted((m.step, m.value) for m in history)
        schedule[key] = [[step, kept(key, value)] for step, value in points]
    client.log_batch(run_id, metrics=copied)  # one write, not one per point
    trial.set_user_attr(SCHEDULE_ATTR, schedule)
    body = dict(trial.user_attrs.get(SPEC_ATTR, {}))
    algo, train, replayed = dict(body.get("algo", {})), dict(body.get("train", {})), {}
    for key, points in _lineage(client, seed_run).items():
        algo[key.split(".", 1)[1]] = kept(key, points[0][1])
        if len(points) > 1:
            replayed[key] = [[step, kept(key, value)] for step, value in points[1:]]
    if replayed:
        train["schedule"] = replayed
    trial.set_user_attr(SPEC_ATTR, {**body, "algo": algo, "train": train})


def _lineage(client, run_id: str) -> dict[str, list]:
    """The lineage a population member's run keeps (`population.LINEAGE`)."""
    import json

    from marlctl.atomic import staging
    from marlctl.train.population import LINEAGE

    with staging() as tmp:
        path = client.download_artifacts(run_id, LINEAGE, str(tmp))
        return json.loads(Path(path).read_text())


def _trial_row(trial) -> dict[str, Any]:
    return {
        "trial": trial.number,
        "value": trial.value,
        "params": dict(trial.params),
        "env_steps": trial.user_attrs.get("marlctl.env_steps"),
        "mlflow_run_id": trial.user_attrs.get("marlctl.mlflow_run_id"),
        "error": trial.user_attrs.get(ERROR_ATTR),
    }


def find_study_run(ctx: SweepContext) -> str | None:
    from marlctl import tracking

    client = tracking.client_for(ctx.tracking_uri)
    experiment = client.get_experiment_by_name(ctx.experiment)
    if experiment is None:
        return None
    found = client.search_runs(
        [experiment.experiment_id],
        f"tags.`marlctl.role` = 'study' and tags.`marlctl.study` = '{ctx.study}' "
        f"and tags.`marlctl.storage` = '{_storage_key(ctx)}'",
        order_by=["attributes.start_time ASC"],
    )
    return found[0].info.run_id if found else None


def _file_name(name: str) -> str:
    """A study name as one file name in the working folder: `x/../../tmp` stays here."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name).lstrip(".") or "study"


def _storage_key(ctx: SweepContext) -> str:
    import hashlib

    return hashlib.sha256(storage_url(ctx.storage, ctx.cwd).encode()).hexdigest()[:16]


def study_run(ctx: SweepContext, sweep) -> str:
    """The study's parent run, shared by every worker and every re-run of the sweep."""
    from marlctl import tracking

    client = tracking.client_for(ctx.tracking_uri)
    found = find_study_run(ctx)
    if found is not None:
        tracking.reopen_run(client, found)
        return found
    experiment_id = tracking.ensure_experiment(client, ctx.experiment, ctx.tracking_uri)
    run = client.create_run(
        experiment_id,
        run_name=f"sweep-{ctx.study}",
        tags={
            "marlctl.role": "study",
            "marlctl.study": ctx.study,
            "marlctl.storage": _storage_key(ctx),
            "marlctl.storage_url": shown_url(storage_url(ctx.storage, ctx.cwd)),
        },
    )
    params = {
        "sweep.metric": sweep.metric,
        "sweep.direction": sweep.direction,
        "sweep.sampler": sweep.sampler,
        "sweep.pruner": sweep.pruner,
        "sweep.objective": sweep.objective,
    }
    tracking.log_params(client, run.info.run_id, params)
    # Two machines starting at once may both create one: the earliest wins, the other goes.
    first = find_study_run(ctx)
    if first is not None and first != run.info.run_id:
        client.delete_run(run.info.run_id)
        return first
    return run.info.run_id


def finish_study_run(ctx: SweepContext, summary: SweepSummary) -> None:
    from marlctl import tracking

    client = tracking.client_for(ctx.tracking_uri)
    run_id = ctx.study_run_id
    for state, count in summary.counts.items():
        client.log_metric(run_id, f"sweep/trials_{state.lower()}", count)
    if summary.best is not None:
        client.log_metric(run_id, "sweep/best_value", summary.best["value"])
        client.set_tag(run_id, "marlctl.best_trial", str(summary.best["trial"]))
    if summary.best_spec:
        client.log_artifact(run_id, summary.best_spec)
    error = "; ".join(summary.worker_errors) or None
    if summary.interrupted:
        tracking.end_run(client, run_id, "KILLED", error)
    elif summary.budget_used:  # a worker that died left its trials to the others
        tracking.end_run(client, run_id, "FINISHED", error)
    elif summary.worker_errors:
        tracking.end_run(client, run_id, "FAILED", error)
