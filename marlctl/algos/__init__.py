"""Algorithm registry: each algorithm's typed config and its declared capabilities.

The configs live here, apart from the torch code in `marlctl.train`, because `validate`,
`list` and `--dry-run` must not import torch. Registering an algorithm is a decorator on
its config class; `marlctl.train.<family>` holds the implementation named by `trainer`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, ClassVar

from marlctl.strict import Strict


class AlgoConfig(Strict):
    """Base of every algorithm's hyperparameters; `name` selects the algorithm."""

    # The `model` fields a spec leaves null take these values: the reference implementation's.
    model_defaults: ClassVar[dict[str, Any]] = {
        "activation": "tanh",
        "layer_norm": True,
        "sharing": "shared",
    }
    # The hyperparameters a row of a batch may have of its own (`marlctl.train.rows`): a
    # batched sweep's trials differ in them, population-based training and
    # `train.schedule` change them during training.
    row_fields: ClassVar[tuple[str, ...]] = ()
    name: str


@dataclass(frozen=True)
class AlgoInfo:
    name: str
    config: type[AlgoConfig]
    trainer: str  # "module:Class" of the implementation
    summary: str
    discrete_actions: bool
    continuous_actions: bool
    centralised_critic: bool  # a critic or mixer that sees the global state
    on_policy: bool
    recurrent: bool  # supports `model.recurrent`
    replay: bool  # keeps a replay buffer (`train.checkpoint_replay` applies)
    action_dists: tuple[str, ...] = ()  # `model.action_dist` values of continuous policies
    # Trains from a recorded dataset (`data`), counting gradient steps (`train.total_updates`).
    offline: bool = False

    @property
    def turn_based(self) -> bool:
        """Trains on turn-based envs (one agent acting per step): on-policy learners carry an
        agent's return from one of its turns to its next (`marlctl.train.core.turn_gae`)."""
        return self.on_policy

    @property
    def action_kinds(self) -> list[str]:
        return [
            k
            for k, ok in (
                ("discrete", self.discrete_actions),
                ("continuous", self.continuous_actions),
            )
            if ok
        ]


ALGOS: dict[str, AlgoInfo] = {}


def register_algo(
    name: str,
    *,
    trainer: str,
    summary: str,
    discrete_actions: bool,
    continuous_actions: bool,
    centralised_critic: bool,
    on_policy: bool,
    recurrent: bool,
    action_dists: tuple[str, ...] | None = None,
    offline: bool = False,
):
    """`action_dists`: the `model.action_dist` values the algorithm's continuous actors
    take; None = both for an on-policy algorithm with continuous actions (the on-policy
    trainer's actors), none otherwise."""
    if action_dists is None:
        both = on_policy and continuous_actions
        action_dists = ("normal", "tanh_normal") if both else ()

    def decorate(config: type[AlgoConfig]) -> type[AlgoConfig]:
        ALGOS[name] = AlgoInfo(
            name,
            config,
            trainer,
            summary,
            discrete_actions,
            continuous_actions,
            centralised_critic,
            on_policy,
            recurrent,
            not on_policy and not offline,
            action_dists,
            offline,
        )
        return config

    return decorate


def registered_algos() -> dict[str, AlgoInfo]:
    """Import every module of this package once so its decorators run."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return ALGOS
