"""MADDPG and MATD3 (config: `marlctl.algos.maddpg`).

MADDPG (Lowe et al. 2017): each agent has a deterministic actor on its own observation and
a centralised critic Q_i(s, a_1..a_N) on the global state and every agent's action, trained
from replay; the actor follows dQ_i/da_i with the other agents' actions from the sample (or,
with `actor_joint_action: current`, every agent's action from its current actor).
Discrete actions are relaxed with straight-through Gumbel-softmax (Jang et al. 2017).
Policy ensembles keep K actors per agent, one drawn per episode.

MATD3 (Ackermann et al. 2019) adds TD3's fixes (Fujimoto et al. 2018): the target takes the
smaller of two critics, target actions get clipped noise, and actors update every
`policy_delay` critic updates. Rewards are each agent's own: the setting may be mixed
cooperative-competitive. Every tensor is seed-first, `[S, ..., n, ...]` per group.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from marlctl.algos.maddpg import DDPGFamilyConfig
from marlctl.envs.batch import Observation
from marlctl.envs.info import GroupInfo
from marlctl.train.actions import flat_obs, mask_logits, masked_mean
from marlctl.train.base import TrainerSetup, freeze
from marlctl.train.core import adam
from marlctl.train.offpolicy import OffPolicyTrainer
from marlctl.train.replay import Field

# ---------------------------------------------------------------- joint actions


class JointActions:
    """Where each agent's action sits in the joint action vector the critics see.

    Group order of the env, agents in order; a discrete action is its one-hot (or relaxed)
    vector, a continuous one is scaled to [-1, 1].
    """

    def __init__(self, groups: tuple[GroupInfo, ...], device: torch.device):
        self.width = sum(g.n_agents * g.n_actions for g in groups)
        self.place: dict[str, torch.Tensor] = {}  # [n, w, J]: agent i's slot
        offset = 0
        for g in groups:
            n, w = g.n_agents, g.n_actions
            place = torch.zeros(n, w, self.width, device=device)
            for i in range(n):
                place[i, :, offset + i * w : offset + (i + 1) * w] = torch.eye(w, device=device)
            self.place[g.name] = place
            offset += n * w

    def join(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-group `[S, X, n, w]` -> `[S, X, J]`."""
        return torch.cat([parts[name].flatten(-2) for name in self.place], dim=-1)

    def with_own(self, joint: torch.Tensor, name: str, own: torch.Tensor) -> torch.Tensor:
        """`[S, X, n, J]`: for each agent of group `name`, the joint action with its own slot
        replaced by `own` `[S, X, n, w]` (the others' actions stay as sampled)."""
        place = self.place[name]
        keep = 1.0 - place.sum(1)  # [n, J]
        return joint.unsqueeze(-2) * keep + torch.einsum("sxnw,nwj->sxnj", own, place)


# ---------------------------------------------------------------- trainer


class MADDPGTrainer(OffPolicyTrainer):
    loss_keys = ("critic", "actor", "q", "grad_norm")

    def __init__(self, setup: TrainerSetup):
        config: DDPGFamilyConfig = setup.config
        info = setup.info
        super().__init__(setup)
        self.twin = config.twin
        self.groups = {g.name: g for g in info.groups}
        self.joint = JointActions(info.groups, self.device)
        critic_in = info.state_dim + self.joint.width
        K = config.ensemble
        self.actors = nn.ModuleDict(
            {
                g.name: self.agent_net(
                    g, g.obs_dim, g.n_actions, out_gain=0.01, ensemble=K, observes=True
                )
                for g in info.groups
            }
        )
        # MATD3's twin critics are one ensemble of two: one batched call evaluates both.
        self.critics = nn.ModuleDict(
            {
                g.name: self.agent_net(
                    g, critic_in, 1, out_gain=1.0, ensemble=2 if self.twin else 1
                )
                for g in info.groups
            }
        )
        online = nn.ModuleDict({"actors": self.actors, "critics": self.critics})
        self.target = copy.deepcopy(online)
        self.target.requires_grad_(False)
        self.policies = nn.ModuleDict({"online": online, "target": self.target}).to(self.device)
        self.actor_params = list(self.actors.parameters())
        self.critic_params = list(self.critics.parameters())
        self.optimizers = {
            "actor": adam(self.actor_params, config.lr, config.adam_eps),
            "critic": adam(self.critic_params, config.critic_lr, config.adam_eps),
        }
        S = len(self.seeds)
        self._member = {  # ensemble member of each env's current episode
            g.name: torch.zeros(S, self.num_envs, g.n_agents, dtype=torch.long, device=self.device)
            for g in info.groups
        }
        self._acting_member: dict[str, torch.Tensor] = {}

    def extra_fields(self) -> dict[str, Field]:
        if self.cfg.ensemble == 1:
            return {}
        return {f"member/{g.name}": Field((g.n_agents,), torch.long) for g in self.info.groups}

    # ------------------------------------------------------------ acting

    def _draw_members(self, first: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        K = self.cfg.ensemble
        if K == 1:
            return current
        draw = (self.noise(current.shape, normal=False) * K).long().clamp_max(K - 1)
        return torch.where(first.unsqueeze(-1), draw, current)

    def _act(self, name: str, ob: Observation, member: torch.Tensor, explore: bool):
        group, actor = self.groups[name], self.actors[name]
        out, _ = actor(flat_obs(ob.obs[name], group), member=member)
        if group.discrete:
            out = mask_logits(out, ob.masks[name])
            if explore:  # a Gumbel-max sample is a sample of softmax(logits)
                return self.sample_categorical(torch.softmax(out, -1))
            return out.argmax(-1)
        action = torch.tanh(out)
        sigma = self.exploration_sigma()
        if explore and (torch.is_tensor(sigma) or sigma > 0):
            noise = self.noise(action.shape, normal=True) * sigma
            action = (action + noise).clamp(-1, 1)
        return self.bounds[name].to_env(action)

    def exploration_sigma(self, host: bool = False) -> float | torch.Tensor:
        """The std of the exploration noise now (relative to half the action range)."""
        cfg = self.cfg
        if cfg.exploration_noise_end is None:
            return cfg.exploration_noise
        return self.annealed(
            cfg.exploration_noise, cfg.exploration_noise_end, cfg.noise_anneal_steps, host
        )

    def schedules(self) -> dict[str, torch.Tensor]:
        if self.cfg.exploration_noise_end is None:
            return {}
        sigma = torch.full((len(self.seeds),), self.exploration_sigma(host=True))
        return {"train/exploration_noise": sigma.to(self.device)}

    def explore(self, ob: Observation, first: torch.Tensor):
        actions, extra = {}, {}
        warmup = self.env_steps < self.cfg.learning_starts
        for name, group in self.groups.items():
            self._member[name] = self._draw_members(first, self._member[name])
            if self.cfg.ensemble > 1:
                extra[f"member/{name}"] = self._member[name]
            if warmup:  # uniform random actions fill the buffer before the first update
                actions[name] = self.random_action(group, ob.masks[name], ob.obs[name].shape[:3])
            else:
                actions[name] = self._act(name, ob, self._member[name], explore=True)
        return actions, extra

    @property
    def stateless_acting(self) -> bool:
        # An ensemble keeps each row's member for its episode.
        return super().stateless_acting and self.cfg.ensemble == 1

    def act_step(self, ob: Observation, deterministic: bool, first: torch.Tensor | None):
        actions = {}
        for name, group in self.groups.items():
            rows = ob.obs[name].shape[1]
            member, start = self._acting_member.get(name), first
            if member is None or member.shape[1] != rows or first is None:
                shape = (len(self.seeds), rows, group.n_agents)
                member = torch.zeros(shape, dtype=torch.long, device=self.device)
                start = torch.ones(shape[:2], dtype=torch.bool, device=self.device)
            member = self._acting_member[name] = self._draw_members(start, member)
            actions[name] = self._act(name, ob, member, explore=not deterministic)
        return actions

    # ------------------------------------------------------------ update

    def _relaxed(self, name: str, logits_or_mean: torch.Tensor, mask: torch.Tensor | None):
        """Differentiable action for the critic: straight-through Gumbel-softmax or tanh."""
        group = self.groups[name]
        if not group.discrete:
            return torch.tanh(logits_or_mean)
        logits = mask_logits(logits_or_mean, mask)
        soft = torch.softmax(
            (logits + self._gumbel(logits.shape)) / self.cfg.gumbel_temperature, -1
        )
        hard = F.one_hot(soft.argmax(-1), group.n_actions).to(soft.dtype)
        return hard - soft.detach() + soft

    def _gumbel(self, shape: torch.Size) -> torch.Tensor:
        return -torch.log(-torch.log(self.noise(shape, normal=False).clamp(1e-10, 1 - 1e-7)))

    @torch.no_grad()
    def _target_action(self, name: str, batch: dict, flat) -> torch.Tensor:
        """mu'(o'): the target actor's greedy action (EPyMARL's `target_actions`: the one-hot
        argmax for discrete actions), or the current actor's without `target_actor`. MATD3
        smooths it: continuous actions get clipped Gaussian noise; discrete ones are sampled
        from softmax(logits / target_noise), the argmax of the logits plus Gumbel noise scaled
        by `target_noise`."""
        group, cfg = self.groups[name], self.cfg
        member = flat(batch[f"member/{name}"]) if cfg.ensemble > 1 else None
        obs = flat(batch[f"next_obs/{name}"])
        actors = self.target["actors"] if cfg.target_actor else self.actors
        out, _ = actors[name](flat_obs(obs, group), member=member)
        smooth = self.twin and cfg.target_noise > 0
        if group.discrete:
            mask = batch.get(f"next_mask/{name}")
            out = mask_logits(out, None if mask is None else flat(mask))
            if smooth:
                out = out + cfg.target_noise * self._gumbel(out.shape)
            return F.one_hot(out.argmax(-1), group.n_actions).to(torch.float32)
        action = torch.tanh(out)
        if smooth:  # target policy smoothing (TD3)
            clip = cfg.target_noise_clip
            noise = (self.noise(action.shape, normal=True) * cfg.target_noise).clamp(-clip, clip)
            action = (action + noise).clamp(-1, 1)
        return action

    def _q(self, critics: nn.ModuleDict, name: str, state: torch.Tensor, joint: torch.Tensor):
        """Q of group `name`'s agents from every critic of the ensemble `[S, X, n, K]`; joint
        `[S, X, J]`, or per agent `[S, X, n, J]`."""
        n, critic = self.groups[name].n_agents, critics[name]
        if joint.dim() == 3 and critic.same_for_every_agent:
            # Every agent's input is the same, and so its value: one per sample, broadcast.
            return critic.every_member_once(torch.cat([state, joint], -1)).squeeze(-1)
        if joint.dim() == 3:
            joint = joint.unsqueeze(-2).expand(*joint.shape[:2], n, joint.shape[-1])
        s = state.unsqueeze(-2).expand(*state.shape[:2], n, state.shape[-1])
        return critic.every_member(torch.cat([s, joint], -1)).squeeze(-1)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        critic_loss, q_mean = self.critic_loss(batch)
        critic_opt = self.optimizers["critic"]
        critic_opt.zero_grad(set_to_none=True)
        critic_loss.sum().backward()  # seeds share no parameter
        grad = self.clip_gradients(self.critic_params)
        critic_opt.step()

        actor_loss = torch.zeros_like(critic_loss)
        delay = getattr(cfg, "policy_delay", 1)
        pairs = [(self.target["critics"], self.critics)]
        if self.updates % delay == 0:
            freeze(self.critic_params, True)  # the actor loss trains the actors only
            actor_loss = self.actor_loss(batch)
            actor_opt = self.optimizers["actor"]
            actor_opt.zero_grad(set_to_none=True)
            actor_loss.sum().backward()
            freeze(self.critic_params, False)
            self.clip_gradients(self.actor_params)
            actor_opt.step()
        if self.updates % delay == 0 or cfg.target_update_every:  # hard copies: all at once
            pairs.append((self.target["actors"], self.actors))
        self.update_targets(pairs)
        return {
            "critic": critic_loss.detach(),
            "actor": actor_loss.detach(),
            "q": q_mean,
            "grad_norm": grad,
        }

    compiled_regions = ("critic_loss", "actor_loss")

    def _taken(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            n: self.critic_action(g, _flat(batch[f"action/{n}"])) for n, g in self.groups.items()
        }

    def critic_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """y_i = r_i + gamma * Q'_i(s', mu'(o')) (the min of the twins for MATD3): the critics'
        loss per seed `[S]` and the mean Q of the taken actions."""
        S = len(self.seeds)
        state, next_state = _flat(batch["state"]), _flat(batch["next_state"])
        keep = 1.0 - _flat(batch["terminated"]).to(state.dtype)
        discount = _flat(batch["discount"]).unsqueeze(-1)
        joint = self.joint.join(self._taken(batch))
        next_joint = self.joint.join({n: self._target_action(n, batch, _flat) for n in self.groups})
        critic_loss = torch.zeros(S, device=self.device)
        q_mean = torch.zeros(S, device=self.device)
        for name in self.groups:
            active = _flat(batch[f"active/{name}"]).to(state.dtype)
            with torch.no_grad():
                next_q = self._q(self.target["critics"], name, next_state, next_joint).amin(-1)
                alive = keep.unsqueeze(-1) * _flat(batch[f"next_active/{name}"]).to(state.dtype)
                y = _flat(batch[f"reward/{name}"]) + discount * alive * next_q
            q = self._q(self.critics, name, state, joint)  # [S, X, n, K]
            error = ((q - y.unsqueeze(-1)) ** 2).sum(-1)
            critic_loss = critic_loss + masked_mean(error, active)
            q_mean = q_mean + masked_mean(q[..., 0].detach(), active) / len(self.groups)
        return critic_loss, q_mean

    def actor_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Ascend Q_i(s, a_1..mu_i(o_i)..a_N): the actors' loss per seed `[S]`."""
        cfg, S = self.cfg, len(self.seeds)
        state = _flat(batch["state"])
        joint = self.joint.join(self._taken(batch))
        outs, owns = {}, {}
        for name, group in self.groups.items():
            obs = _flat(batch[f"obs/{name}"])
            member = _flat(batch[f"member/{name}"]) if cfg.ensemble > 1 else None
            outs[name], _ = self.actors[name](flat_obs(obs, group), member=member)
            mask = batch.get(f"mask/{name}")
            owns[name] = self._relaxed(name, outs[name], None if mask is None else _flat(mask))
        current = self.joint.join(owns) if cfg.actor_joint_action == "current" else None
        actor_loss = torch.zeros(S, device=self.device)
        for name in self.groups:
            acted = self.joint.with_own(joint, name, owns[name]) if current is None else current
            q = self._q(self.critics, name, state, acted)[..., 0]  # TD3: the first
            regular = (outs[name] ** 2).mean(-1)
            active = _flat(batch[f"active/{name}"]).to(state.dtype)
            actor_loss = actor_loss + masked_mean(-q + cfg.policy_regularization * regular, active)
        return actor_loss


def _flat(x: torch.Tensor) -> torch.Tensor:
    """A sampled field `[S, 1, B, ...]` as `[S, B, ...]`."""
    return x.flatten(1, 2)
