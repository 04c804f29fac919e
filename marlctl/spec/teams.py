"""Who learns what: the teams of a spec on an env, the env as its learners see it, and the
spec's fields that take no part in a run."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from marlctl.algos import registered_algos
from marlctl.spec.models import Spec

if TYPE_CHECKING:
    from marlctl.envs.info import EnvInfo


def learning_teams(spec, info: EnvInfo):
    """(team name, (spec key of its algorithm, of its model), algorithm config, model,
    groups) of every team that learns: each group with an algorithm or model of its own is a
    team named after it; the other learning groups are the default team, named "", with the
    top-level `algo` and `model`."""
    own, others = spec.teams, spec.opponents
    rest = [g for g in info.groups if g.name not in own and g.name not in others]
    if rest or not own:
        yield "", ("algo", "model"), spec.algo, spec.model, rest
    for g in info.groups:
        if g.name in own:
            group = own[g.name]
            key = f"groups.{g.name}.algo" if group.algo is not None else "algo"
            keys = (key, f"groups.{g.name}.model")
            yield g.name, keys, group.algo or spec.algo, group.model, [g]


def team_rollouts(spec, info: EnvInfo) -> list[tuple[str, int]]:
    """(spec key of its algorithm, rollout steps) of every learning team; an off-policy
    team steps once a round."""
    return [
        (keys[0], getattr(algo_cfg, "rollout_steps", 1))
        for _, keys, algo_cfg, _, _ in learning_teams(spec, info)
    ]


def learner_info(info: EnvInfo, spec) -> EnvInfo:
    """The env as its learners see it: the groups that learn, with every agent's state (the
    spec's `groups` play the others)."""
    others = spec.opponents
    if not others:
        return info
    groups = tuple(g for g in info.groups if g.name not in others)
    agents = tuple(a for g in groups for a in g.agents)
    return dataclasses.replace(info, groups=groups, agents=agents)


def unused_fields(spec: Spec, info: EnvInfo) -> list[str]:
    """The spec's fields that take no part in this run, by dotted key: a report leaves them
    out of its hyperparameters. A key shared by several teams (`algo` of groups with a model
    of their own) is unused only where every one of them leaves it unused."""
    unused: dict[str, bool] = {}

    def mark(key: str, is_unused: bool) -> None:
        unused[key] = unused.get(key, True) and is_unused

    for _, (algo_key, model_key), cfg, model, groups in learning_teams(spec, info):
        algo = registered_algos()[cfg.name]
        continuous = any(not g.discrete for g in groups)
        # The actor's distribution of continuous actions (on-policy trainers').
        mark(f"{model_key}.action_dist", not (algo.action_dists and continuous))
        sharing = model.sharing
        if isinstance(sharing, dict):
            modes = {sharing.get(g.name, "shared") for g in groups}
        else:
            modes = {sharing}
        mark(f"{model_key}.federated_every", "federated" not in modes)
        mark(f"{model_key}.agent_ids", "shared" not in modes)  # ids go to shared networks
        if hasattr(cfg, "sequence_length"):  # the Q-learners' windows of recurrent agents
            for name in ("sequence_length", "burn_in"):
                mark(f"{algo_key}.{name}", model.recurrent is None)
        if hasattr(cfg, "tau") and hasattr(cfg, "target_update_every"):
            mark(f"{algo_key}.tau", cfg.target_update_every > 0)  # hard copies instead
    mark("env.reward_weights", not info.objectives)
    return sorted(key for key, is_unused in unused.items() if is_unused)
