"""A sweep's Optuna storage: a journal file next to the MLflow store by default, or a database
(PostgreSQL, MySQL, SQLite) that workers on other machines share; the study in it, created once
and checked to search the same space when continued."""

from __future__ import annotations

import time
from pathlib import Path

from marlctl.errors import Problem, SpecError
from marlctl.redact import shown_url
from marlctl.sweep.context import SweepContext
from marlctl.sweep.space import (
    Param,
    encode_choice,
)

JOURNAL = "optuna.journal"  # the embedded default storage, next to mlflow.db


def storage_url(storage: str | None, cwd: str | Path | None = None) -> str:
    """The storage as the user would pass it to optuna-dashboard or the optuna CLI."""
    if storage is None:
        return str(Path(cwd or Path.cwd()) / JOURNAL)
    return storage


def is_database(storage: str) -> bool:
    return "://" in storage


def open_storage(storage: str | None, cwd: str | Path | None = None):
    """A database URL, or a journal file that any number of local processes share safely."""
    import optuna

    url = storage_url(storage, cwd)
    if is_database(url):
        return _open_database(url)
    from optuna.storages.journal import JournalFileBackend

    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(url))


def _open_database(url: str, attempts: int = 5):
    """RDBStorage creates its tables on first use: machines starting together on an empty
    database race to create them, and the losers see duplicate-object errors. They retry."""
    import random

    import optuna
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
        except (IntegrityError, ProgrammingError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 + random.random())
    raise AssertionError("unreachable")


def create_study(name: str, storage: str | None, direction: str, cwd: str | Path | None = None):
    """Create the study, or continue the one with this name; its direction must match."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            study_name=name,
            storage=open_storage(storage, cwd),
            direction=direction,
            load_if_exists=True,
        )
    except Exception as err:  # an unreachable database, a bad URL
        raise SpecError(
            [
                Problem(
                    "--storage",
                    None,
                    "",
                    f"cannot open {shown_url(storage_url(storage, cwd))}: {err}",
                )
            ]
        ) from None
    found = study.direction.name.lower()
    if found != direction:
        raise SpecError(
            [
                Problem(
                    "sweep.direction",
                    None,
                    "",
                    f"study '{name}' in {shown_url(storage_url(storage, cwd))} was created "
                    f"to {found}; the spec says {direction} (set sweep.study to start a new "
                    "study)",
                )
            ]
        )
    return study


SPACE_ATTR = "marlctl.space"


def check_same_space(study, params: list[Param]) -> None:
    """A study continues with the space it began with; Optuna cannot mix two distributions
    under one parameter name, so a changed space needs a new study."""
    import json

    space = json.dumps(
        [
            [
                p.key,
                p.low,
                p.high,
                p.log,
                p.step,
                p.is_int,
                [encode_choice(c) for c in p.choices],
                p.when,
            ]
            for p in params
        ],
        sort_keys=True,
        default=list,
    )
    stored = study.user_attrs.get(SPACE_ATTR)
    if stored is None:
        study.set_user_attr(SPACE_ATTR, space)
    elif stored != space:
        raise SpecError(
            [
                Problem(
                    "sweep.space",
                    None,
                    "",
                    f"study '{study.study_name}' was started with another search space; keep "
                    "that space to continue it, or set sweep.study to start a new study",
                )
            ]
        )


def load_study(ctx: SweepContext, sampler=None, pruner=None):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(
        study_name=ctx.study,
        storage=open_storage(ctx.storage, ctx.cwd),
        sampler=sampler,
        pruner=pruner,
    )
