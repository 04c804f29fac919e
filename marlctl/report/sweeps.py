"""A sweep as a report shows it: its best trials, its history and its parameters' importances,
read from its Optuna storage, or from MLflow where the storage is gone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from marlctl.report import labels
from marlctl.report.model import Sweep, Trial, differing_params
from marlctl.report.runs import RunRecord, Selection

SCHEDULE_ATTR = "marlctl.pbt_schedule"  # where `marlctl sweep` keeps a member's schedule


def sweep_of(selection: Selection, study_run: RunRecord, storage: str | None) -> Sweep:
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
                t.user_attrs.get(SCHEDULE_ATTR),
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
    varying = differing_params(runs)
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
