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
        ) + _schedule_comment(complete[0].user_attrs.get(SCHEDULE_ATTR))
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


def _schedule_comment(schedule: dict | None) -> str:
    """A population member's hyperparameter schedule as comment lines of its `best.yaml`
    (which holds its final values)."""
    if not schedule:
        return ""
    lines = ["# Population-based training: its values from each env step on (the spec holds "
             "the last):"]  # fmt: skip
    for key, points in schedule.items():
        shown = ", ".join(f"{int(step)}: {value:.6g}" for step, value in points)
        lines.append(f"#   {key}: {{{shown}}}")
    return "\n".join(lines) + "\n"


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
