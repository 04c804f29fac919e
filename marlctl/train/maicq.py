"""MAICQ: multi-agent implicit constraint Q-learning from a dataset (`algos.offline`).

Yang, Ma, Li, Zheng, Zhang, Huang, Zhou, Zhang: "Believe What You See: Implicit Constraint
Approach for Offline Multi-Agent Reinforcement Learning", NeurIPS 2021; as Off-the-Grid
MARL's `maicq` runs it. The critic is QMIX on the dataset's own joint actions: its target
bootstraps from the target networks' Q_tot of the *next dataset* joint action (no max over
actions the dataset never took), each weighted by the batch's softmax of that value over
`target_beta`. Each agent's policy clones the dataset's actions, weighted by the batch's
softmax of its advantage over `advantage_beta` (Q of the action less the policy's expected
Q) and by the mixer's weight on the agent. The mixer's weights enter the actors' loss as
constants here (Off-the-Grid MARL lets the actors' loss train them too).

Samples are windows of two consecutive steps; where the next step opens another episode
(the episode ended, by termination or time limit) nothing is bootstrapped.
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
from marlctl.train.offline import Offline
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
        self.params = [*self.actor.parameters(), *online.parameters()]
        self.optimizer = adam(self.params, cfg.lr, cfg.adam_eps)
        self.optimizers = {"adam": self.optimizer}

    def sampled_batch(self) -> dict[str, torch.Tensor]:
        return self.buffer.sample(self.cfg.batch_size, 2)  # each step and the next

    def _agents(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per agent, across groups `[S, B, N]`: Q of the dataset action with gradient, its
        advantage, the log-probability the policy gives it, whether it acts, and the target
        networks' Q of the next step's dataset action."""
        parts: dict[str, list] = {k: [] for k in ("q", "adv", "logp", "active", "next_q")}
        for name, group in self.groups.items():
            obs = flat_obs(batch[f"obs/{name}"], group)  # [S, 2, B, n, O]
            action = batch[f"action/{name}"].unsqueeze(-1)
            q, _ = self.q[name](obs[:, 0])
            mask = batch.get(f"mask/{name}")
            logits = mask_logits(self.actor[name](obs[:, 0])[0], None if mask is None
                                 else mask[:, 0])  # fmt: skip
            taken = q.gather(-1, action[:, 0]).squeeze(-1)
            with torch.no_grad():
                expected = (torch.softmax(logits, -1) * q).sum(-1)
                parts["next_q"].append(
                    self.target["q"][name](obs[:, 1])[0].gather(-1, action[:, 1]).squeeze(-1)
                )
            parts["q"].append(taken)
            parts["adv"].append(taken.detach() - expected)
            parts["logp"].append(F.log_softmax(logits, -1).gather(-1, action[:, 0]).squeeze(-1))
            parts["active"].append(batch[f"active/{name}"][:, 0].to(q.dtype))
        return {k: torch.cat(v, -1) for k, v in parts.items()}

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cfg, agents = self.cfg, self._agents(batch)
        B, active = agents["q"].shape[1], agents["active"]
        state, next_state = batch["state"][:, 0], batch["state"][:, 1]
        weight = B * torch.softmax(agents["adv"] / cfg.advantage_beta, 1)  # over the batch
        slope = self.mixer.k(state).detach()
        policy = -masked_mean(slope * weight * agents["logp"], active)
        q_tot = self.mixer(agents["q"] * active, state)
        with torch.no_grad():
            nxt = self.target["mixer"](agents["next_q"], next_state)
            nxt = B * torch.softmax(nxt / cfg.target_beta, 1) * nxt
            rewards = torch.cat([batch[f"reward/{n}"][:, 0] for n in self.groups], -1).mean(-1)
            going = ~batch["terminated"][:, 0] & ~batch["first"][:, 1]
            target = rewards + cfg.gamma * going.to(nxt.dtype) * nxt
        critic = masked_mean((q_tot - target) ** 2, (active.sum(-1) > 0).to(q_tot.dtype))
        self.optimizer.zero_grad(set_to_none=True)
        (critic + policy).sum().backward()  # seeds share no parameter
        grad = clip_grad_norm_per_seed(self.params, cfg.max_grad_norm, len(self.seeds))
        self.optimizer.step()
        if (self.updates + 1) % cfg.target_update_every == 0:
            self.target.load_state_dict(self.policies["online"].state_dict())
        q_mean = masked_mean(q_tot.detach(), (active.sum(-1) > 0).to(q_tot.dtype))
        return {"critic": critic.detach(), "policy": policy.detach(), "q_taken": q_mean,
                "grad_norm": grad}  # fmt: skip

    def act_step(self, ob: Observation, deterministic: bool, first: torch.Tensor | None):
        actions = {}
        for name, net in self.actor.items():
            logits = mask_logits(net(flat_obs(ob.obs[name], self.groups[name]))[0],
                                 ob.masks[name])  # fmt: skip
            actions[name] = (logits.argmax(-1) if deterministic
                             else self.sample_categorical(torch.softmax(logits, -1)))  # fmt: skip
        return actions
