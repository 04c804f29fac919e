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
from marlctl.train.core import BatchedMLP, EpisodeStats, RunningMeanStd, gae, one_hot_ids

# Argument validation costs a host sync and a pass over every tensor on each call.
torch.distributions.Distribution.set_default_validate_args(False)

# ---------------------------------------------------------------- networks


class GroupPolicy(nn.Module):
    """Actor and critic of one agent group, shared across its agents or one per agent."""

    def __init__(
        self, group: GroupInfo, critic_dim: int, shared: bool, model: ModelSpec, centralised: bool
    ):
        super().__init__()
        self.group, self.shared, self.centralised = group, shared, centralised
        n = group.n_agents
        copies = 1 if shared else n
        self.id_dim = n if shared and n > 1 else 0
        hidden, act, norm = list(model.hidden), model.activation, model.layer_norm
        self.actor = BatchedMLP(
            copies, group.obs_dim + self.id_dim, hidden, group.n_actions, act, norm, out_gain=0.01
        )
        self.critic = BatchedMLP(
            copies, critic_dim + self.id_dim, hidden, 1, act, norm, out_gain=1.0
        )
        self.log_std = (
            None if group.discrete else nn.Parameter(torch.zeros(copies, group.n_actions))
        )
        self.value_norm = RunningMeanStd()

    def _with_ids(self, x: torch.Tensor) -> torch.Tensor:
        if not self.id_dim:
            return x
        ids = one_hot_ids(self.id_dim, x.device).expand(*x.shape[:-2], -1, -1)
        return torch.cat([x, ids], dim=-1)

    def actor_input(self, ob: Observation) -> torch.Tensor:
        obs = ob.obs[self.group.name]
        return self._with_ids(obs.flatten(start_dim=obs.dim() - len(self.group.obs_shape)))

    def critic_input(self, ob: Observation) -> torch.Tensor:
        if not self.centralised:
            return self.actor_input(ob)
        state = ob.state.unsqueeze(-2).expand(*ob.state.shape[:-1], self.group.n_agents, -1)
        return self._with_ids(state)

    def distribution(self, actor_in: torch.Tensor, mask: torch.Tensor | None):
        out = self.actor(actor_in)
        if self.group.discrete:
            if mask is not None:
                out = out.masked_fill(~mask, torch.finfo(out.dtype).min)
            return Categorical(logits=out)
        return Normal(out, self.log_std.exp().expand_as(out))

    def value(self, critic_in: torch.Tensor) -> torch.Tensor:
        return self.critic(critic_in).squeeze(-1)


def _log_prob(dist, action: torch.Tensor, discrete: bool) -> torch.Tensor:
    return dist.log_prob(action) if discrete else dist.log_prob(action).sum(-1)


def _entropy(dist, discrete: bool) -> torch.Tensor:
    return dist.entropy() if discrete else dist.entropy().sum(-1)


# ---------------------------------------------------------------- rollout storage


@dataclass
class GroupRollout:
    actor_in: torch.Tensor  # [T, E, n, A_in]
    critic_in: torch.Tensor  # [T, E, n, C_in]
    actions: torch.Tensor
    log_probs: torch.Tensor  # [T, E, n]
    values: torch.Tensor  # [T, E, n], denormalised
    rewards: torch.Tensor  # [T, E, n], with truncation bootstrap
    active: torch.Tensor  # [T, E, n]
    masks: torch.Tensor | None


# ---------------------------------------------------------------- trainer


class PPOTrainer:
    """Collect `rollout_steps` from every env, then `epochs` of minibatch PPO updates."""

    def __init__(
        self,
        config: PPOConfig,
        model: ModelSpec,
        info: EnvInfo,
        num_envs: int,
        device: torch.device,
        total_iterations: int,
        centralised: bool,
    ):
        self.cfg, self.info, self.device = config, info, torch.device(device)
        self.num_envs, self.total_iterations = num_envs, max(1, total_iterations)
        share = config.share_params
        critic_dim = info.state_dim if centralised else 0
        self.policies = nn.ModuleDict(
            {
                g.name: GroupPolicy(
                    g,
                    critic_dim if centralised else g.obs_dim,
                    share.get(g.name, True) if isinstance(share, dict) else share,
                    model,
                    centralised,
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
        self.iteration = 0
        self.stats = EpisodeStats({g.name: g.n_agents for g in info.groups}, num_envs, self.device)

    def compile(self) -> None:
        """torch.compile every network in place (parameter names and checkpoints unchanged)."""
        for pol in self.policies.values():
            pol.actor.compile(dynamic=False)
            pol.critic.compile(dynamic=False)

    # ------------------------------------------------------------ acting

    @torch.no_grad()
    def act(self, ob: Observation, deterministic: bool = True) -> dict[str, torch.Tensor]:
        actions = {}
        for name, pol in self.policies.items():
            dist = pol.distribution(pol.actor_input(ob), ob.masks[name])
            if deterministic:
                actions[name] = dist.probs.argmax(-1) if pol.group.discrete else dist.mean
            else:
                actions[name] = dist.sample()
        return actions

    # ------------------------------------------------------------ rollout

    @torch.no_grad()
    def collect(
        self, env: BatchedEnv, ob: Observation
    ) -> tuple[dict[str, GroupRollout], Observation, torch.Tensor]:
        steps, gamma = self.cfg.rollout_steps, self.cfg.gamma
        buf: dict[str, dict[str, list]] = {
            n: {k: [] for k in GroupRollout.__annotations__} for n in self.policies
        }
        dones = []
        for _ in range(steps):
            actions = {}
            for name, pol in self.policies.items():
                a_in, c_in = pol.actor_input(ob), pol.critic_input(ob)
                dist = pol.distribution(a_in, ob.masks[name])
                action = dist.sample()
                b = buf[name]
                b["actor_in"].append(a_in)
                b["critic_in"].append(c_in)
                b["actions"].append(action)
                b["log_probs"].append(_log_prob(dist, action, pol.group.discrete))
                b["values"].append(pol.value_norm.denormalize(pol.value(c_in)))
                b["active"].append(ob.active[name])
                b["masks"].append(ob.masks[name])
                actions[name] = action
            tr = env.step(actions)
            done = tr.terminated | tr.truncated
            self.stats.record(tr.rewards, done)
            trunc = tr.truncated.to(torch.float32).unsqueeze(-1)
            for name, pol in self.policies.items():
                if tr.final is tr.next:  # no episode ended: nothing to bootstrap
                    buf[name]["rewards"].append(tr.rewards[name])
                    continue
                # A time limit is not a terminal state: fold gamma * V(final obs) into the reward.
                final_v = pol.value_norm.denormalize(pol.value(pol.critic_input(tr.final)))
                buf[name]["rewards"].append(tr.rewards[name] + gamma * final_v * trunc)
            dones.append(done)
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
        cfg = self.cfg
        if cfg.anneal_lr:
            frac = 1.0 - self.iteration / self.total_iterations
            self.optimizer.param_groups[0]["lr"] = cfg.lr * frac
            self.optimizer.param_groups[1]["lr"] = (cfg.critic_lr or cfg.lr) * frac
        targets = {}
        with torch.no_grad():
            for name, pol in self.policies.items():
                r = rollouts[name]
                last = pol.value_norm.denormalize(pol.value(pol.critic_input(last_ob)))
                # An agent continues past step t if its env did not end and it still acts at
                # t + 1; one that left early must not bootstrap from its blank observation.
                next_active = torch.cat([r.active[1:], last_ob.active[name].unsqueeze(0)])
                continues = (~dones).unsqueeze(-1) & next_active
                adv, ret = gae(r.rewards, r.values, last, continues, cfg.gamma, cfg.gae_lambda)
                active = r.active.to(torch.float32)
                if cfg.normalize_advantages:
                    count = active.sum().clamp_min(1.0)
                    mean = (adv * active).sum() / count
                    std = (((adv - mean) ** 2 * active).sum() / count).sqrt()
                    adv = (adv - mean) / (std + 1e-8)
                if cfg.value_norm:
                    pol.value_norm.update(ret, active)
                targets[name] = (adv, ret)

        T, E = dones.shape
        batch = T * E
        size = max(1, batch // cfg.minibatches)
        totals = {
            k: torch.zeros((), device=self.device)
            for k in ("policy", "value", "entropy", "approx_kl", "clip_frac", "grad_norm")
        }
        updates = 0
        for _ in range(cfg.epochs):
            order = torch.randperm(batch, device=self.device)
            for start in range(0, batch - size + 1, size):
                idx = order[start : start + size]
                loss = torch.zeros((), device=self.device)
                for name, pol in self.policies.items():
                    parts = self._group_loss(pol, rollouts[name], targets[name], idx)
                    loss = (
                        loss
                        + parts["policy"]
                        + cfg.value_coef * parts["value"]
                        - cfg.entropy_coef * parts["entropy"]
                    )
                    for key in ("policy", "value", "entropy", "approx_kl", "clip_frac"):
                        totals[key] += parts[key].detach() / len(self.policies)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad = nn.utils.clip_grad_norm_(self.actor_params, cfg.max_grad_norm)
                nn.utils.clip_grad_norm_(self.critic_params, cfg.max_grad_norm)
                self.optimizer.step()
                totals["grad_norm"] += grad.detach()
                updates += 1
        self.iteration += 1
        return {k: v / max(updates, 1) for k, v in totals.items()}

    def _group_loss(self, pol: GroupPolicy, r: GroupRollout, target, idx: torch.Tensor):
        cfg = self.cfg
        adv_all, ret_all = target

        def take(x: torch.Tensor) -> torch.Tensor:
            return x.flatten(0, 1)[idx]

        mask = take(r.masks) if r.masks is not None else None
        dist = pol.distribution(take(r.actor_in), mask)
        log_prob = _log_prob(dist, take(r.actions), pol.group.discrete)
        active = take(r.active).to(torch.float32)
        count = active.sum().clamp_min(1.0)
        adv, old_log_prob = take(adv_all), take(r.log_probs)
        log_ratio = log_prob - old_log_prob
        ratio = log_ratio.exp()
        surrogate = torch.min(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
        policy_loss = -(surrogate * active).sum() / count
        entropy = (_entropy(dist, pol.group.discrete) * active).sum() / count

        value = pol.value(take(r.critic_in))
        ret, old_value = take(ret_all), take(r.values)
        if cfg.value_norm:
            ret, old_value = pol.value_norm.normalize(ret), pol.value_norm.normalize(old_value)
        error = ret - value
        if cfg.value_clip:
            clipped = old_value + (value - old_value).clamp(-cfg.clip, cfg.clip)
            error_clipped = ret - clipped
            value_loss = torch.max(self._value_error(error), self._value_error(error_clipped))
        else:
            value_loss = self._value_error(error)
        value_loss = (value_loss * active).sum() / count
        with torch.no_grad():
            approx_kl = (((ratio - 1) - log_ratio) * active).sum() / count
            clip_frac = (((ratio - 1).abs() > cfg.clip).float() * active).sum() / count
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
        return self.cfg.rollout_steps * self.num_envs

    def state_dict(self) -> dict:
        return {
            "policies": self.policies.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "iteration": self.iteration,
        }

    def load_state_dict(self, state: dict) -> None:
        self.policies.load_state_dict(state["policies"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = int(state["iteration"])
