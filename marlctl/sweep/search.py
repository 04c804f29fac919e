"""Samplers, pruners and the values a trial takes from the search space."""

from __future__ import annotations

import socket
import zlib
from typing import Any

from marlctl.sweep.space import (
    Param,
    active,
    decode_choice,
    encode_choice,
)


def make_sampler(sweep, params: list[Param], worker: int):
    import warnings

    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    if sweep.sampler == "grid":
        # Every worker must shuffle the grid alike: Optuna maps trial numbers to points.
        seed = sweep.seed or 0
    elif sweep.seed is None:
        seed = None
    else:  # distinct per worker, and per machine when several run workers 0..N-1
        seed = sweep.seed + worker + 1000 * (zlib.crc32(socket.gethostname().encode()) % 1000)
    if sweep.sampler in ("random", "pbt"):  # a population starts from random points
        return optuna.samplers.RandomSampler(seed=seed)
    if sweep.sampler == "grid":

        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, study, trial, state, values) -> None:
                # GridSampler stops the study when the grid is used up, which works inside
                # `optimize` only; the worker loop stops at the budget (the grid's size).
                pass

        grid = {p.key: [encode_choice(v) for v in p.grid()] for p in params}
        return Grid(grid, seed=seed)
    if sweep.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(
            n_startup_trials=max(sweep.startup_trials, 1),
            seed=seed,
            warn_independent_sampling=False,
        )
    conditional = any(p.when for p in params)
    return optuna.samplers.TPESampler(
        n_startup_trials=sweep.startup_trials,
        seed=seed,
        multivariate=True,
        group=conditional,
        constant_liar=True,  # workers in parallel do not all sample the same point
    )


def make_pruner(sweep, train):
    import optuna

    if sweep.sampler == "pbt":  # exploit replaces the worst members instead
        return optuna.pruners.NopPruner()
    if sweep.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=sweep.startup_trials)
    if sweep.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=max(train.eval_every, 1), max_resource=train.budget
        )
    return optuna.pruners.NopPruner()


def frozen(study, number: int):
    """The stored state of trial `number`."""
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def sample(trial, params: list[Param]) -> dict[str, Any]:
    """A point of the space; a conditional parameter only where its condition holds."""
    values: dict[str, Any] = {}
    for param in params:
        if active(param, values):
            values[param.key] = _suggest(trial, param)
    return values


def _suggest(trial, param: Param) -> Any:
    if param.categorical:
        picked = trial.suggest_categorical(param.key, [encode_choice(c) for c in param.choices])
        return decode_choice(param, picked)
    if param.is_int:
        return trial.suggest_int(
            param.key, int(param.low), int(param.high), step=int(param.step or 1), log=param.log
        )
    return trial.suggest_float(
        param.key, float(param.low), float(param.high), step=param.step, log=param.log
    )


def param_text(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)
