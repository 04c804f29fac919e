"""The batched multi-agent interface every algorithm sees.

Tensors are shaped `[num_envs, n_agents, ...]` per agent group, on the run's device.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from marlctl.envs.info import EnvInfo


class Observation(NamedTuple):
    obs: dict[str, torch.Tensor]  # group -> [E, n, *obs_shape] float32
    state: torch.Tensor  # [E, state_dim] global state for centralised critics
    masks: dict[str, torch.Tensor | None]  # group -> [E, n, n_actions] bool, or None
    active: dict[str, torch.Tensor]  # group -> [E, n] bool: agent acts this step


class Transition(NamedTuple):
    next: Observation  # after auto-reset where an episode ended
    rewards: dict[str, torch.Tensor]  # group -> [E, n]
    terminated: torch.Tensor  # [E] bool: episode ended for good
    truncated: torch.Tensor  # [E] bool: episode cut by a time limit
    # The last observation of an ended episode (rows where done); `next` itself when no
    # episode ended this step, so a trainer can skip bootstrapping without a host sync.
    final: Observation
    # A multi-objective env's reward vectors before `env.reward_weights` scalarised them:
    # [E, k], the mean over all agents; None for a scalar reward.
    objectives: torch.Tensor | None = None
    # [E] bool, read where an episode ended: the learners won it (SMAX's battles); None for
    # an env without a notion of winning.
    won: torch.Tensor | None = None
    # group -> [E, n] bool, for the groups that a pool of snapshots plays in some episodes:
    # the agents the learners play in the episode of this step. None, or a group not named:
    # the learners play every agent.
    played: dict[str, torch.Tensor] | None = None


def only(ob: Observation, groups: list[str]) -> Observation:
    """`ob` for `groups` only, every agent's global state kept (what a team or the learners
    beside scripted groups see)."""
    return Observation(
        {k: ob.obs[k] for k in groups},
        ob.state,
        {k: ob.masks[k] for k in groups},
        {k: ob.active[k] for k in groups},
    )


def transition_for(tr: Transition, groups: list[str]) -> Transition:
    """`tr` for `groups` only: their observations and rewards, the env's episode ends."""
    nxt = only(tr.next, groups)
    final = nxt if tr.final is tr.next else only(tr.final, groups)
    rewards = {k: tr.rewards[k] for k in groups}
    played = None if tr.played is None else {k: v for k, v in tr.played.items() if k in groups}
    return tr._replace(next=nxt, rewards=rewards, final=final, played=played)


class Wrapper:
    """A batched env with something changed on its way to the trainer; the rest (frames to
    render, compiling its step, closing it) passes through."""

    def __init__(self, env):
        self.env = env
        self.num_envs, self.device = env.num_envs, env.device

    @property
    def frames(self):
        return getattr(self.env, "frames", None)

    def compile(self) -> None:
        if hasattr(self.env, "compile"):
            self.env.compile()

    def set_param(self, name: str, value: float) -> None:
        self.env.set_param(name, value)

    def close(self) -> None:
        self.env.close()


class BatchedEnv(Protocol):
    info: EnvInfo
    num_envs: int
    device: torch.device

    def reset(self, seed: int) -> Observation: ...

    def step(self, actions: dict[str, torch.Tensor]) -> Transition: ...

    def close(self) -> None: ...
