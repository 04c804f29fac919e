"""MAPPO / IPPO: clipped-surrogate PPO for agent groups (config: `marlctl.algos.ppo`).

MAPPO (Yu et al. 2021) gives each group's critic the global state; IPPO (de Witt et al.
2020) gives it the agent's own observation. Both use GAE, value normalisation, a clipped
value loss with Huber error, entropy bonus and per-network gradient clipping, as the MAPPO
paper does. Every tensor is `[..., n_agents, ...]` per group: no loop over agents or envs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical, Normal

from marlctl.algos.ppo import PPOConfig
from marlctl.envs.batch import BatchedEnv, Observation
from marlctl.envs.registry import EnvInfo, GroupInfo
from marlctl.spec.models import ModelSpec
from marlctl.train.base import Trainer, clip_grad_norm_per_seed, flat_obs
from marlctl.train.core import RunningMeanStd, gae, per_seed
from marlctl.train.networks import reset_where

# ---------------------------------------------------------------- networks


class GroupPolicy(nn.Module):
    """Actor and critic of one agent group (`model.sharing`, `model.recurrent` apply)."""

    def __init__(self, trainer: Trainer, group: GroupInfo, critic_dim: int, centralised: bool):
        super().__init__()
        self.group, self.centralised = group, centralised
        self.actor = trainer.agent_net(group, group.obs_dim, group.n_actions, out_gain=0.01)
        self.critic = trainer.agent_net(group, critic_dim, 1, out_gain=1.0)
        copies = self.actor.copies
        self.log_std = (
            None
            if group.discrete
            else nn.Parameter(torch.zeros(len(trainer.seeds), copies, group.n_actions))
        )
        self.value_norm = RunningMeanStd(len(trainer.seeds))

    def actor_input(self, ob: Observation) -> torch.Tensor:
        return flat_obs(ob, self.group)

    def critic_input(self, ob: Observation) -> torch.Tensor:
        if not self.centralised:
            return self.actor_input(ob)
        return ob.state.unsqueeze(-2).expand(*ob.state.shape[:-1], self.group.n_agents, -1)

    def distribution(self, actor_in: torch.Tensor, mask: torch.Tensor | None, h=None):
        """The action distribution, and the actor's next recurrent state."""
        out, h = self.actor(actor_in, h)
        if self.group.discrete:
            if mask is not None:
                out = out.masked_fill(~mask, torch.finfo(out.dtype).min)
            return Categorical(logits=out), h
        shape = (out.shape[0], *([1] * (out.dim() - 3)), self.actor.copies, out.shape[-1])
        return Normal(out, self.log_std.exp().view(shape).expand_as(out)), h

    def value(self, critic_in: torch.Tensor, h=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, h = self.critic(critic_in, h)
        return out.squeeze(-1), h


def _log_prob(dist, action: torch.Tensor, discrete: bool) -> torch.Tensor:
    return dist.log_prob(action) if discrete else dist.log_prob(action).sum(-1)


def _entropy(dist, discrete: bool) -> torch.Tensor:
    return dist.entropy() if discrete else dist.entropy().sum(-1)


# ---------------------------------------------------------------- rollout storage


@dataclass
class GroupRollout:
    actor_in: torch.Tensor  # [T, S, E, n, A_in]
    critic_in: torch.Tensor  # [T, S, E, n, C_in]
    actions: torch.Tensor
    log_probs: torch.Tensor  # [T, S, E, n]
    values: torch.Tensor  # [T, S, E, n], denormalised
    rewards: torch.Tensor  # [T, S, E, n], with truncation bootstrap
    active: torch.Tensor  # [T, S, E, n]
    masks: torch.Tensor | None
    first: torch.Tensor  # [T, S, E]: an episode starts at this step (recurrent state resets)


def seed_first(x: torch.Tensor) -> torch.Tensor:
    """[T, S, E, ...] -> [S, T * E, ...]: one seed's samples together, for its minibatches."""
    return x.transpose(0, 1).flatten(1, 2)


def env_first(x: torch.Tensor) -> torch.Tensor:
    """[T, S, E, ...] -> [S, E, T, ...]: one env's sequence together (recurrent minibatches)."""
    return x.permute(1, 2, 0, *range(3, x.dim()))


# ---------------------------------------------------------------- trainer


class PPOTrainer(Trainer):
    """Collect `rollout_steps` from every env, then `epochs` of minibatch PPO updates.

    Recurrent agents carry their state across rollouts (reset at episode starts) and are
    trained on whole rollout sequences, minibatched over envs.
    """

    def __init__(
        self,
        config: PPOConfig,
        model: ModelSpec,
        info: EnvInfo,
        num_envs: int,
        device: torch.device,
        total_iterations: int,
        centralised: bool,
        seeds: tuple[int, ...] = (0,),
    ):
        super().__init__(model.for_algo(config), info, num_envs, device, seeds)
        self.cfg, self.total_iterations = config, max(1, total_iterations)
        self.recurrent = model.recurrent is not None
        self.policies = nn.ModuleDict(
            {
                g.name: GroupPolicy(
                    self, g, info.state_dim if centralised else g.obs_dim, centralised
                )
                for g in info.groups
            }
        ).to(self.device)
        actor_params = [p for pol in self.policies.values() for p in pol.actor.parameters()]
        actor_params += [pol.log_std for pol in self.policies.values() if pol.log_std is not None]
        critic_params = [p for pol in self.policies.values() for p in pol.critic.parameters()]
        self.actor_params, self.critic_params = actor_params, critic_params
        self.optimizer = torch.optim.Adam(
            [
                {"params": actor_params, "lr": config.lr},
                {"params": critic_params, "lr": config.critic_lr or config.lr},
            ],
            eps=1e-5,
        )
        self.optimizers = {"adam": self.optimizer}
        S = len(self.seeds)
        self._hidden = {
            name: (
                pol.actor.initial_state(S, num_envs, device=self.device),
                pol.critic.initial_state(S, num_envs, device=self.device),
            )
            for name, pol in self.policies.items()
        }

    # ------------------------------------------------------------ acting

    def act_step(self, ob: Observation, deterministic: bool, first: torch.Tensor | None):
        actions = {}
        for name, pol in self.policies.items():
            h = None
            if self.recurrent:
                h = self.acting_state(name, pol.actor, first, ob.state.shape[1])
            dist, h = pol.distribution(pol.actor_input(ob), ob.masks[name], h)
            if h is not None:
                self._acting[name] = h
            if deterministic:
                action = dist.probs.argmax(-1) if pol.group.discrete else dist.mean
            else:
                action = self._sample(pol, dist)
            actions[name] = action
        return actions

    def _sample(self, pol: GroupPolicy, dist) -> torch.Tensor:
        if pol.group.discrete:
            return self.sample_categorical(dist.probs)
        return dist.mean + dist.stddev * self.noise(dist.mean.shape, normal=True)

    # ------------------------------------------------------------ rollout

    @torch.no_grad()
    def collect(
        self, env: BatchedEnv, ob: Observation
    ) -> tuple[dict[str, GroupRollout], Observation, torch.Tensor]:
        steps, gamma, S = self.cfg.rollout_steps, self.cfg.gamma, len(self.seeds)
        buf: dict[str, dict[str, list]] = {
            n: {k: [] for k in GroupRollout.__annotations__} for n in self.policies
        }
        self._start_hidden = {}
        dones = []
        for t in range(steps):
            split = self.split(ob)
            actions, critic_h = {}, {}
            for name, pol in self.policies.items():
                a_in, c_in = pol.actor_input(split), pol.critic_input(split)
                h_a = h_c = None
                if self.recurrent:
                    h_a, h_c = (reset_where(h, self._first) for h in self._hidden[name])
                    if t == 0:
                        self._start_hidden[name] = (h_a, h_c)
                dist, h_a = pol.distribution(a_in, split.masks[name], h_a)
                value, h_c = pol.value(c_in, h_c)
                if self.recurrent:
                    self._hidden[name] = (h_a, h_c)
                critic_h[name] = h_c
                action = self._sample(pol, dist)
                b = buf[name]
                b["actor_in"].append(a_in)
                b["critic_in"].append(c_in)
                b["actions"].append(action)
                b["log_probs"].append(_log_prob(dist, action, pol.group.discrete))
                b["values"].append(pol.value_norm.denormalize(value))
                b["active"].append(split.active[name])
                b["masks"].append(split.masks[name])
                b["first"].append(self._first)
                actions[name] = action.flatten(0, 1)
            tr = env.step(actions)
            done = (tr.terminated | tr.truncated).view(S, -1)
            rewards = {k: v.view(S, -1, *v.shape[1:]) for k, v in tr.rewards.items()}
            self.stats.record(rewards, done)
            trunc = tr.truncated.view(S, -1).to(torch.float32).unsqueeze(-1)
            final = None if tr.final is tr.next else self.split(tr.final)
            for name, pol in self.policies.items():
                if final is None:  # no episode ended: nothing to bootstrap
                    buf[name]["rewards"].append(rewards[name])
                    continue
                # A time limit is not a terminal state: fold gamma * V(final obs) into the reward.
                final_v, _ = pol.value(pol.critic_input(final), critic_h[name])
                final_v = pol.value_norm.denormalize(final_v)
                buf[name]["rewards"].append(rewards[name] + gamma * final_v * trunc)
            dones.append(done)
            self._first = done
            ob = tr.next
        rollouts = {}
        for name, b in buf.items():
            fields = {k: (torch.stack(v) if v[0] is not None else None) for k, v in b.items()}
            rollouts[name] = GroupRollout(**fields)
        return rollouts, ob, torch.stack(dones)

    # ------------------------------------------------------------ update

    def update(
        self, rollouts: dict[str, GroupRollout], last_ob: Observation, dones: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """PPO epochs over the rollout; returns each loss term per seed, `[S]`."""
        cfg, S = self.cfg, len(self.seeds)
        if cfg.anneal_lr:
            frac = 1.0 - self.iteration / self.total_iterations
            self.optimizer.param_groups[0]["lr"] = cfg.lr * frac
            self.optimizer.param_groups[1]["lr"] = (cfg.critic_lr or cfg.lr) * frac
        last_split = self.split(last_ob)
        layout = env_first if self.recurrent else seed_first
        data = {}
        with torch.no_grad():
            for name, pol in self.policies.items():
                r = rollouts[name]
                h_c = reset_where(self._hidden[name][1], self._first) if self.recurrent else None
                last, _ = pol.value(pol.critic_input(last_split), h_c)
                last = pol.value_norm.denormalize(last)
                # An agent continues past step t if its env did not end and it still acts at
                # t + 1; one that left early must not bootstrap from its blank observation.
                next_active = torch.cat([r.active[1:], last_split.active[name].unsqueeze(0)])
                continues = (~dones).unsqueeze(-1) & next_active
                adv, ret = gae(r.rewards, r.values, last, continues, cfg.gamma, cfg.gae_lambda)
                adv, ret, active = layout(adv), layout(ret), layout(r.active)
                weight = active.to(torch.float32)
                if cfg.normalize_advantages:
                    dims = tuple(range(1, adv.dim()))
                    count = weight.sum(dims).clamp_min(1.0)
                    mean = (adv * weight).sum(dims) / count
                    std = (((adv - per_seed(mean, adv)) ** 2 * weight).sum(dims) / count).sqrt()
                    adv = (adv - per_seed(mean, adv)) / (per_seed(std, adv) + 1e-8)
                # The clip window is around the critic's own outputs at collection time:
                # normalised with the statistics they were made with, before this update.
                old_values = layout(r.values)
                if cfg.value_norm:
                    old_values = pol.value_norm.normalize(old_values)
                    pol.value_norm.update(ret, active)
                data[name] = {
                    "actor_in": layout(r.actor_in),
                    "critic_in": layout(r.critic_in),
                    "actions": layout(r.actions),
                    "log_probs": layout(r.log_probs),
                    "values": old_values,
                    "masks": None if r.masks is None else layout(r.masks),
                    "active": weight,
                    "adv": adv,
                    "ret": ret,
                    "first": layout(r.first),
                    "hidden": self._start_hidden.get(name),
                }

        # Samples per seed: single steps, or whole env sequences for recurrent agents.
        batch = dones.shape[2] if self.recurrent else dones.shape[0] * dones.shape[2]
        size = max(1, batch // cfg.minibatches)
        keys = ("policy", "value", "entropy", "approx_kl", "clip_frac", "grad_norm")
        totals = {k: torch.zeros(S, device=self.device) for k in keys}
        updates = 0
        for _ in range(cfg.epochs):
            order = torch.stack(
                [torch.randperm(batch, generator=g, device=self.device) for g in self.generators]
            )
            for start in range(0, batch - size + 1, size):
                idx = order[:, start : start + size]
                loss = torch.zeros(S, device=self.device)
                for name, pol in self.policies.items():
                    parts = self._group_loss(pol, data[name], idx)
                    loss = (
                        loss
                        + parts["policy"]
                        + cfg.value_coef * parts["value"]
                        - cfg.entropy_coef * parts["entropy"]
                    )
                    for key in ("policy", "value", "entropy", "approx_kl", "clip_frac"):
                        totals[key] += parts[key].detach() / len(self.policies)
                self.optimizer.zero_grad(set_to_none=True)
                loss.sum().backward()  # seeds share no parameter: each gets its own gradient
                grad = clip_grad_norm_per_seed(self.actor_params, cfg.max_grad_norm, S)
                clip_grad_norm_per_seed(self.critic_params, cfg.max_grad_norm, S)
                self.optimizer.step()
                self.after_update()
                totals["grad_norm"] += grad
                updates += 1
        self.iteration += 1
        return {k: v / max(updates, 1) for k, v in totals.items()}

    def _forward(self, pol: GroupPolicy, d: dict, take, mask):
        """Action distribution and value on the minibatch, `[S, B, n, ...]`."""
        if not self.recurrent:
            dist, _ = pol.distribution(take(d["actor_in"]), mask)
            value, _ = pol.value(take(d["critic_in"]))
            return dist, value
        # Sequences [S, B, T, ...]: run the recurrent nets through time from the stored state.
        actor_in, critic_in, first = take(d["actor_in"]), take(d["critic_in"]), take(d["first"])
        h_a, h_c = (take(h) for h in d["hidden"])
        outs, values = [], []
        for t in range(actor_in.shape[2]):
            h_a, h_c = reset_where(h_a, first[:, :, t]), reset_where(h_c, first[:, :, t])
            out, h_a = pol.actor(actor_in[:, :, t], h_a)
            value, h_c = pol.critic(critic_in[:, :, t], h_c)
            outs.append(out)
            values.append(value.squeeze(-1))
        out = torch.stack(outs, 2).flatten(1, 2)
        if pol.group.discrete:
            if mask is not None:
                out = out.masked_fill(~mask, torch.finfo(out.dtype).min)
            dist = Categorical(logits=out)
        else:
            shape = (out.shape[0], 1, pol.actor.copies, out.shape[-1])
            dist = Normal(out, pol.log_std.exp().view(shape).expand_as(out))
        return dist, torch.stack(values, 2).flatten(1, 2)

    def _group_loss(self, pol: GroupPolicy, d: dict, idx: torch.Tensor):
        """Loss terms per seed, `[S]`, on minibatch rows `idx` `[S, B]`."""
        cfg = self.cfg

        def take(x: torch.Tensor) -> torch.Tensor:
            return x[self._rows, idx]

        def flat(x: torch.Tensor) -> torch.Tensor:  # sequences -> samples
            return x.flatten(1, 2) if self.recurrent else x

        mask = flat(take(d["masks"])) if d["masks"] is not None else None
        dist, value = self._forward(pol, d, take, mask)
        log_prob = _log_prob(dist, flat(take(d["actions"])), pol.group.discrete)
        active = flat(take(d["active"]))
        count = active.sum((1, 2)).clamp_min(1.0)

        def mean(x: torch.Tensor) -> torch.Tensor:
            return (x * active).sum((1, 2)) / count

        adv, old_log_prob = flat(take(d["adv"])), flat(take(d["log_probs"]))
        log_ratio = log_prob - old_log_prob
        ratio = log_ratio.exp()
        surrogate = torch.min(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
        policy_loss = -mean(surrogate)
        entropy = mean(_entropy(dist, pol.group.discrete))

        ret, old_value = flat(take(d["ret"])), flat(take(d["values"]))
        if cfg.value_norm:  # old values are normalised already
            ret = pol.value_norm.normalize(ret)
        error = ret - value
        if cfg.value_clip:
            clipped = old_value + (value - old_value).clamp(-cfg.clip, cfg.clip)
            error_clipped = ret - clipped
            value_loss = torch.max(self._value_error(error), self._value_error(error_clipped))
        else:
            value_loss = self._value_error(error)
        value_loss = mean(value_loss)
        with torch.no_grad():
            approx_kl = mean((ratio - 1) - log_ratio)
            clip_frac = mean(((ratio - 1).abs() > cfg.clip).float())
        return {
            "policy": policy_loss,
            "value": value_loss,
            "entropy": entropy,
            "approx_kl": approx_kl,
            "clip_frac": clip_frac,
        }

    def _value_error(self, error: torch.Tensor) -> torch.Tensor:
        delta = self.cfg.huber_delta
        if delta is None:
            return 0.5 * error**2
        return F.huber_loss(error, torch.zeros_like(error), reduction="none", delta=delta)

    # ------------------------------------------------------------ one iteration

    def train_iteration(self, env: BatchedEnv, ob: Observation):
        rollouts, ob, dones = self.collect(env, ob)
        losses = self.update(rollouts, ob, dones)
        return ob, {f"loss/{k}": v for k, v in losses.items()}

    @property
    def steps_per_iteration(self) -> int:
        """Env steps per iteration for each seed."""
        return self.cfg.rollout_steps * self.num_envs
