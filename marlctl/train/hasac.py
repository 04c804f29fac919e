"""HASAC: heterogeneous-agent soft actor-critic (config: `marlctl.algos.hetero`).

Liu et al. 2024, "Maximum Entropy Heterogeneous-Agent Reinforcement Learning" (ICLR), as
HARL's `OffPolicyHARunner` runs it. The critics and temperatures are MASAC's
(`marlctl.train.masac`). The actors take their soft policy steps one after another, in a
random order drawn for every gradient step: every agent's action is first sampled from its
current policy; an agent then steps against the critics with the others' actions as they
stand (those updated before it resampled from their new policies, the rest from their old
ones), and its own action is resampled from its new policy for the agents after it.

The unit that steps at once is an agent with its own network (`model.sharing: independent`,
the default, as in HARL) or a group whose agents share one. Seeds trained as one batch each
draw their own order; a unit's forward pass runs only its agent's network, and `AgentAdam`
moves only the networks that stepped.
"""

from __future__ import annotations

from collections import Counter

import torch

from marlctl.algos.hetero import HASACConfig
from marlctl.train.actions import masked_mean
from marlctl.train.base import TrainerSetup
from marlctl.train.core import AgentAdam
from marlctl.train.hetero import Unit, pick_agent, positions, units_of
from marlctl.train.masac import MASACTrainer, flat_batch


class HASACTrainer(MASACTrainer):
    """MASAC with the actors' step taken agent by agent (`update_actors`)."""

    cfg: HASACConfig
    captured_by_default = False

    def __init__(self, setup: TrainerSetup):
        super().__init__(setup)
        config = self.cfg
        self.optimizers["actor"] = AgentAdam(self.actor_params, config.lr, config.adam_eps)

    def joint_action(self, name: str, dist) -> torch.Tensor:
        """A sampled action as a critic's joint-action slot: one-hot, or in [-1, 1]."""
        sample = self.sample(name, dist)
        return sample[1] if self.groups[name].discrete else sample[0]

    def update_actors(self, batch: dict[str, torch.Tensor]):
        cfg, S = self.cfg, len(self.seeds)
        b = flat_batch(batch)
        alpha, active, obs, _ = self.actor_inputs(b)
        names = list(self.groups)
        actors = [self.actors[name] for name in names]
        masks = {name: b.get(f"mask/{name}") for name in names}
        with torch.no_grad():  # every agent's action under its current policy
            joint = {name: self.joint_action(name, self.policy(name, obs[name], masks[name]))
                     for name in names}  # fmt: skip
        per_group = Counter(index for index, _ in units_of(actors))
        actor_loss = torch.zeros(S, device=self.device)
        alpha_loss = torch.zeros(S, device=self.device)
        entropy = torch.zeros(S, device=self.device)
        for position in positions(self, actors, cfg.fixed_order):
            for index, on, copy in position:
                name = names[index]
                unit = Unit(list(self.actors[name].parameters()), on, copy)
                loss, h, target, act = self.unit_loss(
                    index, name, alpha, obs[name], masks[name], active[name], b["state"],
                    joint, copy,
                )  # fmt: skip
                self.optimizers["actor"].zero_grad(set_to_none=True)
                (unit.weight * loss).sum().backward()
                self.clip_gradients(unit.params)
                self.optimizers["actor"].step(unit.moved)
                share = unit.weight / per_group[index]  # a group's units average
                actor_loss = actor_loss + share * loss.detach()
                alpha_loss = alpha_loss + share * self.temperature_loss(index, h, target, act)
                entropy = entropy + share * masked_mean(h, act) / len(names)
                with torch.no_grad():  # the unit's action under its new policy
                    joint[name] = self.unit_action(
                        name, obs[name], masks[name], copy, joint[name], on
                    )
        self.step_temperature(alpha_loss)
        return actor_loss, alpha_loss, entropy

    compiled_regions = ("critic_loss", "unit_loss", "unit_action")

    def unit_loss(self, index: int, name: str, alpha, obs, mask, active, state, joint, copy):
        """A unit's policy loss (seed-weighted mean over its agents' samples), its entropy,
        the temperature's target and the unit's active flags; `copy` picks the agent of each
        seed where the group's agents have networks of their own."""
        o, mask, act = (_cut(x, copy) for x in (obs, mask, active))
        loss, h, target = self.policy_loss(name, alpha[:, index], o, mask, state, joint, copy)
        return masked_mean(loss, act), h, target, act

    def unit_action(self, name: str, obs, mask, copy, current, on) -> torch.Tensor:
        """The group's joint-action slots with the unit's agents acting under their new
        policy (`replace`)."""
        o, mask = _cut(obs, copy), _cut(mask, copy)
        new = self.joint_action(name, self.policy(name, o, mask, copy))
        return self.replace(current, new, on, copy)

    @staticmethod
    def replace(current, new, on: torch.Tensor, copy: torch.Tensor | None) -> torch.Tensor:
        """`current` `[S, X, n, w]` with the unit's agents' slots (agent `copy[s]`, or every
        agent) taken from `new`, in the seeds `on` marks."""
        S, n = current.shape[0], current.shape[2]
        where = on.view(S, 1).expand(S, n)
        if copy is not None:
            where = where & (torch.arange(n, device=on.device) == copy.view(S, 1))
        return torch.where(where.view(S, 1, n, 1), new, current)


def _cut(x: torch.Tensor | None, copy: torch.Tensor | None) -> torch.Tensor | None:
    """Agent `copy[s]`'s rows of x `[S, X, n, ...]`; all of them where `copy` is None."""
    return x if x is None or copy is None else pick_agent(x, copy, 2)
