"""The trial budget, counted by the study itself, and trials lost with their workers: given up,
recorded as failed, and re-queued up to `sweep.retries` times."""

from __future__ import annotations

import time
from typing import Any

from marlctl.sweep.context import (
    ERROR_ATTR,
    HEARTBEAT_ATTR,
    LOST_AFTER_BEATS,
    RUN_ATTR,
    SURPLUS_ATTR,
)
from marlctl.sweep.search import frozen


def counted(trials) -> list:
    """Trials that use the budget: a re-queued retry stands for the trial it replaces."""
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    return [t for t in trials if not t.user_attrs.get(SURPLUS_ATTR) and t.number not in retried]


def retry(study, trial, max_retry: int) -> bool:
    """Re-queue a lost or interrupted trial with its parameters (Optuna's retry convention:
    `failed_trial` and `retry_history` system attributes). False when out of retries."""
    import optuna

    history = [*trial.system_attrs.get("retry_history", []), trial.number]
    if len(history) > max_retry:
        return False
    study.add_trial(
        optuna.create_trial(
            state=optuna.trial.TrialState.WAITING,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs={"marlctl.retry_of": trial.number},
            system_attrs={
                **trial.system_attrs,  # the grid sampler's point, among others
                "failed_trial": trial.system_attrs.get("failed_trial", trial.number),
                "retry_history": history,
            },
        )
    )
    return True


class LostTrials:
    """Finds RUNNING trials whose worker stopped beating, and fails (and re-queues) them.

    A trial is lost when its heartbeat has not changed for 4 beats of this process's own
    clock, so machines need no synchronised clocks. The state change is the lock: of several
    workers finding the same lost trial, one succeeds in failing it and only that one
    re-queues it.
    """

    def __init__(self, sweep, tracking_uri: str | None):
        self.sweep, self.tracking_uri = sweep, tracking_uri
        self.seen: dict[int, tuple[Any, float]] = {}  # trial number -> (beat, when seen)

    def check(self, study) -> list[int]:
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        now, limit = time.monotonic(), LOST_AFTER_BEATS * self.sweep.heartbeat_s
        lost = []
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            beat = (trial.user_attrs.get(HEARTBEAT_ATTR), trial.datetime_start)
            previous = self.seen.get(trial.number)
            if previous is None or previous[0] != beat:
                self.seen[trial.number] = (beat, now)
                continue
            if now - previous[1] <= limit:
                continue
            reason = f"worker lost: no heartbeat for {now - previous[1]:.0f} s"
            storage = study._storage  # failing another worker's trial has no public API
            try:
                storage.set_trial_user_attr(trial._trial_id, ERROR_ATTR, reason)
                storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            except (UpdateFinishedTrialError, RuntimeError):
                continue  # another worker got there first, or it just finished
            lost.append(trial.number)
            retry(study, frozen(study, trial.number), self.sweep.retries)
            _fail_mlflow_runs(self.tracking_uri, trial.user_attrs.get(RUN_ATTR), reason)
        return lost


def _fail_mlflow_runs(tracking_uri: str | None, run_id: str | None, reason: str) -> None:
    """The trial's MLflow run and its seeds' runs, left RUNNING by the lost worker."""
    if not run_id:
        return
    from marlctl import tracking

    client = tracking.client_for(tracking_uri)
    try:
        run = client.get_run(run_id)
        children = client.search_runs(
            [run.info.experiment_id], f"tags.`{tracking.PARENT_TAG}` = '{run_id}'"
        )
        for r in [run, *children]:
            if r.info.status == "RUNNING":
                tracking.end_run(
                    client, r.info.run_id, "FAILED", reason, tags={"marlctl.trial_state": "FAIL"}
                )
    except Exception:  # another machine's MLflow store: nothing to mark here
        pass


def over_budget(study, trial, budget: int) -> bool:
    """Several workers may take a trial at once when one slot is left: the later ones yield."""
    numbers = sorted(t.number for t in counted(study.get_trials(deepcopy=False)))
    return trial.number in numbers and numbers.index(trial.number) >= budget
