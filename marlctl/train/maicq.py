"""MAICQ: multi-agent implicit constraint Q-learning from a dataset (`algos.offline`).

Yang, Ma, Li, Zheng, Zhang, Huang, Zhou, Zhang: "Believe What You See: Implicit Constraint
Approach for Offline Multi-Agent Reinforcement Learning", NeurIPS 2021; as Off-the-Grid
MARL's `maicq` runs it. The critic is QMIX on the dataset's own joint actions: its target
bootstraps from the target networks' Q_tot of the *next dataset* joint action (no max over
actions the dataset never took), each weighted by the batch's softmax of that value over
`target_beta`; an agent that does not act at a step (dead) counts 0 in Q_tot there, on both
sides (OG-MARL masks neither). The mixer reads the state standardised and bounded to 5
standard deviations by default (`state_scaling: clipped`): the target's weights are
exponential in Q_tot, and a mixer inflated on a state feature far out in its tail feeds on
itself. Each agent's policy clones
the dataset's actions, weighted by the batch's softmax of its advantage over `advantage_beta`
(Q of the action less the policy's expected Q) and by the mixer's weight on the agent. The
mixer's weights enter the actors' loss as constants here (Off-the-Grid MARL lets the actors'
loss train them too).

Samples are windows of two consecutive steps, or of `sequence_length` for recurrent agents
(`model.recurrent`), which unroll each window from a zero state, reset where an episode
starts; every step but the window's last is trained, its next step the one after. Where the
next step opens another episode (the episode ended, by termination or time limit) nothing is
bootstrapped. The batch softmaxes are taken per step of the window, as OG-MARL's are.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from marlctl.envs.batch import Observation
from marlctl.train.actions import flat_obs, mask_logits, masked_mean
from marlctl.train.base import Trainer, TrainerSetup, clip_grad_norm_per_seed
from marlctl.train.core import adam
from marlctl.train.offline import Offline, unroll_window
from marlctl.train.qmix import QMixer


class MAICQTrainer(Offline, Trainer):
    loss_keys = ("critic", "policy", "q_taken", "grad_norm")

    def __init__(self, setup: TrainerSetup):
        cfg = setup.config
        super().__init__(setup.model.for_algo(cfg), setup.info, setup.num_envs, setup.device,
                         setup.seeds)  # fmt: skip
        self.cfg, self.buffer, self.reward_stats = cfg, None, nn.ModuleDict()
        info, S = setup.info, len(self.seeds)
        self.groups = {g.name: g for g in info.groups}
        self.q = nn.ModuleDict({
            g.name: self.agent_net(g, g.obs_dim, g.n_actions, out_gain=1.0, observes=True)
            for g in info.groups
        })  # fmt: skip
        self.actor = nn.ModuleDict({
            g.name: self.agent_net(g, g.obs_dim, g.n_actions, out_gain=0.01, observes=True)
            for g in info.groups
        })  # fmt: skip
        self.mixer = QMixer(S, info.n_agents, info.state_dim, cfg.mixer_embed, 2,
                            cfg.hypernet_hidden, self.init_generators)  # fmt: skip
        online = nn.ModuleDict({"q": self.q, "mixer": self.mixer})
        self.target = copy.deepcopy(online).requires_grad_(False)
        self.policies = nn.ModuleDict({"actor": self.actor, "online": online,
                                       "target": self.target}).to(self.device)  # fmt: skip
        self.online_params = list(online.parameters())
        self.target_params = list(self.target.parameters())  # in the same order
        self.params = [*self.actor.parameters(), *self.online_params]
        self.optimizer = adam(self.params, cfg.lr, cfg.adam_eps)
        self.optimizers = {"adam": self.optimizer}
        self.recurrent = setup.model.recurrent is not None

    def hidden_sizes(self) -> dict[str, int]:
        return {n: net.hidden_size for n, net in self.actor.items()} if self.recurrent else {}

    def sampled_batch(self) -> dict[str, torch.Tensor]:
        return self.buffer.sample(self.cfg.batch_size, self.cfg.sequence_length
                                  if self.recurrent else 2)  # fmt: skip

    def _agents(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per agent, across groups, at every step of the window but its last `[S, T, B, N]`:
        Q of the dataset action with gradient, its advantage, the log-probability the policy
        gives it, whether it acts, the target networks' Q of the next step's dataset action
        and whether it acts then."""
        parts: dict[str, list] = {
            k: [] for k in ("q", "adv", "logp", "active", "next_q", "next_active")
        }
        now, after = slice(0, -1), slice(1, None)
        for name, group in self.groups.items():
            obs = flat_obs(batch[f"obs/{name}"], group)  # [S, L, B, n, O]
            action = batch[f"action/{name}"].unsqueeze(-1)
            q = unroll_window(self.q[name], obs, batch, name, now)
            mask = batch.get(f"mask/{name}")
            logits = mask_logits(unroll_window(self.actor[name], obs, batch, name, now),
                                 None if mask is None else mask[:, now])  # fmt: skip
            taken = q.gather(-1, action[:, now]).squeeze(-1)
            with torch.no_grad():
                expected = (torch.softmax(logits, -1) * q).sum(-1)
                target = unroll_window(self.target["q"][name], obs, batch, name, after)
                parts["next_q"].append(target.gather(-1, action[:, after]).squeeze(-1))
            parts["q"].append(taken)
            parts["adv"].append(taken.detach() - expected)
            parts["logp"].append(F.log_softmax(logits, -1).gather(-1, action[:, now]).squeeze(-1))
            parts["active"].append(batch[f"active/{name}"][:, now].to(q.dtype))
            parts["next_active"].append(batch[f"active/{name}"][:, after].to(q.dtype))
        return {k: torch.cat(v, -1) for k, v in parts.items()}

    def _mixed(self, mixer: QMixer, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Q_tot `[S, T, B]` of per-agent values `[S, T, B, N]` at states `[S, T, B, D]`."""
        return mixer(q.flatten(1, 2), state.flatten(1, 2)).view(q.shape[:3])

    @torch.no_grad()
    def _target(self, batch: dict[str, torch.Tensor], agents: dict[str, torch.Tensor]):
        """The critic's in-sample target `[S, T, B]`: the reward plus the discounted target
        Q_tot of the next dataset joint action (agents inactive then count 0, as in Q_tot),
        weighted by the batch's softmax of that Q_tot over `target_beta`."""
        nxt = agents["next_q"] * agents["next_active"]
        nxt = self._mixed(self.target["mixer"], nxt, batch["state"][:, 1:])
        nxt = nxt.shape[2] * torch.softmax(nxt / self.cfg.target_beta, 2) * nxt
        rewards = torch.cat([batch[f"reward/{n}"][:, :-1] for n in self.groups], -1)
        going = ~batch["terminated"][:, :-1] & ~batch["first"][:, 1:]
        return rewards.mean(-1) + self.cfg.gamma * going.to(nxt.dtype) * nxt

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cfg, agents = self.cfg, self._agents(batch)
        B, active = agents["q"].shape[2], agents["active"]
        state = batch["state"][:, :-1]
        weight = B * torch.softmax(agents["adv"] / cfg.advantage_beta, 2)  # over the batch
        slope = self.mixer.k(state.flatten(1, 2)).view(active.shape).detach()
        policy = -masked_mean(slope * weight * agents["logp"], active)
        q_tot = self._mixed(self.mixer, agents["q"] * active, state)
        target = self._target(batch, agents)
        acting = (active.sum(-1) > 0).to(q_tot.dtype)
        critic = masked_mean((q_tot - target) ** 2, acting)
        self.optimizer.zero_grad(set_to_none=True)
        (critic + policy).sum().backward()  # seeds share no parameter
        grad = clip_grad_norm_per_seed(self.params, cfg.max_grad_norm, len(self.seeds))
        self.optimizer.step()
        self.copy_targets(self.target_params, self.online_params, cfg.target_update_every)
        return {"critic": critic.detach(), "policy": policy.detach(),
                "q_taken": masked_mean(q_tot.detach(), acting), "grad_norm": grad}  # fmt: skip

    def act_step(self, ob: Observation, deterministic: bool, first: torch.Tensor | None):
        actions = {}
        for name, net in self.actor.items():
            out = self.acting_output(name, net, flat_obs(ob.obs[name], self.groups[name]), first)
            logits = mask_logits(out, ob.masks[name])
            actions[name] = (logits.argmax(-1) if deterministic
                             else self.sample_categorical(torch.softmax(logits, -1)))  # fmt: skip
        return actions
