"""A spec's trainer: the algorithm's class for its name, built for an env and its seeds.

Its own module because the runner, the opponents (a frozen run's policy) and the pools
(shadow trainers) all build trainers; none of them imports another for it.
"""

from __future__ import annotations

import dataclasses
import importlib

import torch

from marlctl.algos import registered_algos
from marlctl.envs.info import EnvInfo
from marlctl.spec.models import Spec
from marlctl.train.base import Trainer, TrainerSetup


def trainer_class(algo: str) -> type[Trainer]:
    """The trainer of algorithm `algo`. The package's own are imported here, on demand (torch
    code loads only for the algorithm a run uses); one registered elsewhere (`docs/extending.md`)
    is found by the "module:Class" its `register_algo` names."""
    match algo:
        case "mappo" | "ippo":
            from marlctl.train.ppo import PPOTrainer as found
        case "happo":
            from marlctl.train.hetero import HAPPOTrainer as found
        case "hatrpo":
            from marlctl.train.hetero import HATRPOTrainer as found
        case "masac":
            from marlctl.train.masac import MASACTrainer as found
        case "hasac":
            from marlctl.train.hasac import HASACTrainer as found
        case "maddpg" | "matd3":
            from marlctl.train.maddpg import MADDPGTrainer as found
        case "qmix" | "vdn" | "iql":
            from marlctl.train.qmix import QLearningTrainer as found
        case _:
            module, _, name = registered_algos()[algo].trainer.partition(":")
            found = getattr(importlib.import_module(module), name)
    return found


def build_trainer(
    spec: Spec,
    info: EnvInfo,
    num_envs: int,
    device: torch.device,
    total_iterations: int,
    seeds: tuple[int, ...] = (0,),
    rows: list[dict] | None = None,
):
    """The spec's algorithm for `seeds` (one, or several trained as one batch); where groups
    learn with algorithms or models of their own, every team's trainer as one. `rows`: per
    seed, algorithm hyperparameters of its own (`marlctl.train.rows`)."""
    if spec.teams:
        if rows:
            raise ValueError("hyperparameters per row: not with learning teams")
        trainer = _teams(spec, info, num_envs, device, total_iterations, tuple(seeds))
    else:
        found = trainer_class(spec.algo.name)
        if rows and not found.row_fields:
            raise ValueError(f"{spec.algo.name}: no hyperparameters per row")
        setup = _setup(spec.algo, spec.model, info, num_envs, device, total_iterations, seeds)
        trainer = found(dataclasses.replace(setup, rows=rows))
    if spec.hardware.compile is True:
        trainer.compile()
    return trainer


def set_float32_precision(spec: Spec) -> None:
    """This process's float32 matrix products and convolutions on CUDA: TensorFloat-32 where
    `hardware.tf32` asks for it, full float32 otherwise. Set by what trains a spec in its
    process (a run, a bench point, a dry run's estimate), not by `build_trainer`, which also
    builds frozen opponents' trainers from specs of their own."""
    precision = "tf32" if spec.hardware.tf32 else "ieee"
    backends = torch.backends
    if hasattr(backends.cuda.matmul, "fp32_precision"):
        backends.cuda.matmul.fp32_precision = precision
        backends.cudnn.conv.fp32_precision = precision
    else:  # torch before 2.9
        backends.cuda.matmul.allow_tf32 = spec.hardware.tf32
        backends.cudnn.allow_tf32 = spec.hardware.tf32


# What two runs' specs may differ in and still train as rows of one batch, besides the
# trainer's `row_fields`: nothing training reads.
_NOT_TRAINED = frozenset({"name", "label", "seeds", "sweep"})


def structure(spec: Spec) -> dict:
    """What must be the same in specs whose runs train as one batch: everything training
    reads, but the hyperparameters a row may have of its own."""
    dumped = spec.model_dump(mode="json", exclude=set(_NOT_TRAINED))
    for name in spec.row_fields:
        dumped["algo"].pop(name, None)
    return dumped


def batch_rows(specs: list[Spec], always: tuple[str, ...] = ()) -> list[dict] | None:
    """Per run, the hyperparameters it has of its own among `specs` (one spec per run of a
    batch): those `row_fields` in which the specs differ, and those of `always` (values that
    will change row by row); None where there are none. Raises ValueError where the specs
    differ in anything else."""
    first = specs[0]
    if not always and all(spec == first for spec in specs[1:]):
        return None
    base = structure(first)
    for spec in specs[1:]:
        other = structure(spec)
        if other != base:
            differ = sorted(k for k in base.keys() | other.keys() if base.get(k) != other.get(k))
            if differ == ["algo"]:
                differ = sorted(
                    f"algo.{k}" for k in base["algo"].keys() | other["algo"].keys()
                    if base["algo"].get(k) != other["algo"].get(k)
                )  # fmt: skip
            raise ValueError(
                f"runs of one batch may differ only in {', '.join(first.row_fields)}; "
                f"these differ in {', '.join(differ)}"
            )
    differ = [
        name for name in first.row_fields
        if name in always
        or any(getattr(s.algo, name) != getattr(first.algo, name) for s in specs[1:])
    ]  # fmt: skip
    if not differ:
        return None
    return [{name: getattr(spec.algo, name) for name in differ} for spec in specs]


def _setup(algo_config, model, info, num_envs, device, total_iterations, seeds) -> TrainerSetup:
    centralised = registered_algos()[algo_config.name].centralised_critic
    return TrainerSetup(
        algo_config, model, info, num_envs, device, total_iterations, centralised, tuple(seeds)
    )


def _teams(spec: Spec, info: EnvInfo, num_envs, device, total_iterations, seeds):
    """A trainer per team (`marlctl.train.teams`); `total_iterations` counts rounds."""
    from marlctl.plan import learning_teams
    from marlctl.train.teams import Team, TeamsTrainer

    found = list(learning_teams(spec, info))
    longest = max(getattr(cfg, "rollout_steps", 1) for _, _, cfg, _, _ in found)
    teams = []
    for name, _, cfg, model, groups in found:
        sub = dataclasses.replace(
            info, groups=tuple(groups), agents=tuple(a for g in groups for a in g.agents)
        )
        per_round = longest // getattr(cfg, "rollout_steps", 1)
        setup = _setup(cfg, model, sub, num_envs, device, total_iterations * per_round, seeds)
        teams.append(Team(name, [g.name for g in groups], trainer_class(cfg.name)(setup)))
    return TeamsTrainer(teams, info, num_envs, device, seeds)
