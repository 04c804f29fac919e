"""An on-policy agent group's actor and critic (`model.sharing` and `model.recurrent` apply), the
distributions they give, and the rollout and minibatch they train on. Every tensor is seed
first, `[S, ..., n_agents, ...]`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributions import Categorical, Normal

from marlctl.envs.batch import Observation
from marlctl.envs.info import GroupInfo
from marlctl.train.actions import (
    ActionBounds,
    TanhNormal,
    flat_obs,
    mask_logits,
    softplus_scale,
)
from marlctl.train.base import Trainer
from marlctl.train.core import (
    RunningMeanStd,
    select_copy,
)


class GroupPolicy(nn.Module):
    """Actor and critic of one agent group (`model.sharing`, `model.recurrent` apply)."""

    unread_for_acting = ("critic", "value_norm")  # what loading a policy to act leaves out

    def __init__(self, trainer: Trainer, group: GroupInfo, critic_dim: int, centralised: bool):
        super().__init__()
        self.group, self.centralised = group, centralised
        # tanh_normal: the actor outputs a loc and a raw scale per action dimension.
        self.tanh = not group.discrete and trainer.model.action_dist == "tanh_normal"
        self.bounds = None if group.discrete else ActionBounds(group, trainer.device)
        n_out = group.n_actions * (2 if self.tanh else 1)
        self.actor = trainer.agent_net(group, group.obs_dim, n_out, out_gain=0.01, observes=True)
        self.critic = trainer.agent_net(
            group, critic_dim, 1, sharing=trainer.critic_sharing, out_gain=1.0,
            observes=not centralised, reads_state=centralised,
        )  # fmt: skip
        # A centralised critic with one network, no agent ids and no memory gives every agent
        # the same value (BenchMARL's MAPPO critic): it runs once per state, not per agent.
        self.state_critic = centralised and self.critic.same_for_every_agent
        # One that convolves a frame state does so once per state, then per agent (ids).
        self.state_once = self.state_critic or (centralised and self.critic.convolves_once)
        # A frame state is kept in the rollout as the bytes it came as (scaled on reading).
        self.state_bytes = centralised and trainer.info.state_storage == "uint8"
        copies = self.actor.copies
        self.log_std = (
            None
            if group.discrete or self.tanh
            else nn.Parameter(torch.zeros(len(trainer.seeds), copies, group.n_actions))
        )
        self.value_norm = RunningMeanStd(len(trainer.seeds))

    def actor_input(self, ob: Observation) -> torch.Tensor:
        return flat_obs(ob.obs[self.group.name], self.group)

    def critic_input(self, ob: Observation) -> torch.Tensor:
        if not self.centralised:
            return self.actor_input(ob)
        return self.per_agent(ob.state)

    def per_agent(self, state: torch.Tensor) -> torch.Tensor:
        """The global state `[..., D]` as every agent's critic input `[..., n, D]` (a view);
        `[..., 1, D]` for a critic that reads it `state_once` (`AgentNet.convolves_once`),
        and for a `state_critic`, whose `value` is every agent's."""
        n = 1 if self.state_once else self.group.n_agents
        return state.unsqueeze(-2).expand(*state.shape[:-1], n, -1)

    def stored_state(self, state: torch.Tensor) -> torch.Tensor:
        """The global state as the rollout keeps it: a frame scaled from uint8 goes back to
        its bytes, exactly (a quarter of the memory; `scaled` gives the same floats back)."""
        return (state * 255.0).round_().to(torch.uint8) if self.state_bytes else state

    def distribution(self, actor_in: torch.Tensor, mask: torch.Tensor | None, h=None, copy=None):
        """The action distribution, and the actor's next recurrent state (`copy`: one agent's
        network per seed, `AgentNet.forward`)."""
        out, h = self.actor(actor_in, h, copy=copy)
        return self.distribution_of(out, mask, copy), h

    def distribution_of(self, out: torch.Tensor, mask: torch.Tensor | None, copy=None):
        """The action distribution of the actor's output `[S, ..., n, out]` (of agent
        `copy[s]` alone if given)."""
        if self.group.discrete:
            return Categorical(logits=mask_logits(out, mask))
        if self.tanh:
            loc, raw = out.chunk(2, -1)
            return TanhNormal(loc, softplus_scale(raw), self.bounds)
        log_std = self.log_std if copy is None else select_copy(self.log_std, copy)
        shape = (out.shape[0], *([1] * (out.dim() - 3)), log_std.shape[1], out.shape[-1])
        return Normal(out, log_std.exp().view(shape).expand_as(out))

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """A stored action as the env takes it: a tanh_normal sample is kept before its
        squash; a normal one is clipped by the env."""
        return self.bounds.squash(action) if self.tanh else action

    def value(self, critic_in: torch.Tensor, h=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every agent's value `[..., n]` of `critic_input`."""
        out, h = self.critic(critic_in, h)
        value = out.squeeze(-1)
        if self.state_critic:
            value = value.expand(*value.shape[:-1], self.group.n_agents)
        return value, h


def log_prob(dist, action: torch.Tensor, discrete: bool) -> torch.Tensor:
    return dist.log_prob(action) if discrete else dist.log_prob(action).sum(-1)


def entropy(dist, discrete: bool, noise=None) -> torch.Tensor:
    """The policy's entropy per agent; a TanhNormal's is a one-sample estimate (`noise`)."""
    if discrete:
        return dist.entropy()
    if isinstance(dist, TanhNormal):
        return dist.entropy(noise(dist.mean.shape, normal=True)).sum(-1)
    return dist.entropy().sum(-1)


@dataclass
class GroupRollout:
    actor_in: torch.Tensor  # [T, S, E, n, A_in]
    critic_in: torch.Tensor | None  # [T, S, E, D]: the global state, stored once for all the
    # agents (a centralised critic; a uint8 frame's bytes, `stored_state`); None: the critic
    # reads the actor's input (IPPO)
    actions: torch.Tensor
    log_probs: torch.Tensor  # [T, S, E, n]
    values: torch.Tensor  # [T, S, E, n], denormalised
    rewards: torch.Tensor  # [T, S, E, n], with truncation bootstrap
    active: torch.Tensor  # [T, S, E, n]
    masks: torch.Tensor | None
    first: torch.Tensor  # [T, S, E]: an episode starts at this step (recurrent state resets)


@dataclass
class Minibatch:
    """One group's minibatch under the current networks, each `[S, B, n]` (sequences
    flattened to steps): what an update's loss is made of."""

    dist: Categorical | Normal | TanhNormal
    log_prob: torch.Tensor  # of the taken actions, now
    entropy: torch.Tensor
    value: torch.Tensor  # normalised if `value_norm`
    active: torch.Tensor  # 1.0 where the agent acted: the weight of every mean
    adv: torch.Tensor
    old_log_prob: torch.Tensor  # at collection
    old_value: torch.Tensor  # at collection, normalised as `value`
    ret: torch.Tensor  # GAE returns, normalised as `value`


def seed_first(x: torch.Tensor) -> torch.Tensor:
    """[T, S, E, ...] -> [S, T * E, ...]: one seed's samples together, for its minibatches."""
    return x.transpose(0, 1).flatten(1, 2)


def env_first(x: torch.Tensor) -> torch.Tensor:
    """[T, S, E, ...] -> [S, E, T, ...]: one env's sequence together (recurrent minibatches)."""
    return x.permute(1, 2, 0, *range(3, x.dim()))
