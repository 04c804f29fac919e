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
from marlctl.train.core import (
    BatchedMLP,
    EpisodeStats,
    RunningMeanStd,
    gae,
    one_hot_ids,
    per_seed,
)

# Argument validation costs a host sync and a pass over every tensor on each call.
torch.distributions.Distribution.set_default_validate_args(False)

# ---------------------------------------------------------------- networks


class GroupPolicy(nn.Module):
    """Actor and critic of one agent group, shared across its agents or one per agent."""

    def __init__(
        self,
        group: GroupInfo,
        critic_dim: int,
        shared: bool,
        model: ModelSpec,
        centralised: bool,
        generators: list[torch.Generator],
    ):
        super().__init__()
        self.group, self.shared, self.centralised = group, shared, centralised
        n, seeds = group.n_agents, len(generators)
        self.copies = copies = 1 if shared else n
        self.id_dim = n if shared and n > 1 else 0
        hidden, act, norm = list(model.hidden), model.activation, model.layer_norm
        common = {"activation": act, "layer_norm": norm, "generators": generators}
        self.actor = BatchedMLP(
            seeds, copies, group.obs_dim + self.id_dim, hidden, group.n_actions, out_gain=0.01,
            **common,
        )  # fmt: skip
        self.critic = BatchedMLP(
            seeds, copies, critic_dim + self.id_dim, hidden, 1, out_gain=1.0, **common
        )
        self.log_std = (
            None if group.discrete else nn.Parameter(torch.zeros(seeds, copies, group.n_actions))
        )
        self.value_norm = RunningMeanStd(seeds)

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
        shape = (out.shape[0], *([1] * (out.dim() - 3)), self.copies, out.shape[-1])
        return Normal(out, self.log_std.exp().view(shape).expand_as(out))

    def value(self, critic_in: torch.Tensor) -> torch.Tensor:
        return self.critic(critic_in).squeeze(-1)


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


def seed_first(x: torch.Tensor) -> torch.Tensor:
    """[T, S, E, ...] -> [S, T * E, ...]: one seed's samples together, for its minibatches."""
    return x.transpose(0, 1).flatten(1, 2)


# ---------------------------------------------------------------- trainer


class PPOTrainer:
    """Collect `rollout_steps` from every env, then `epochs` of minibatch PPO updates.

    Trains one seed, or several at once (`hardware.batch_seeds`): env rows are seed-major,
    `[S * E, ...]`, and every network, normaliser, random stream, minibatch order and
    gradient clip is per seed, so a seed's numbers do not depend on the others.
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
        self.cfg, self.info, self.device = config, info, torch.device(device)
        self.num_envs, self.total_iterations = num_envs, max(1, total_iterations)
        self.seeds = tuple(seeds)
        S = len(self.seeds)
        init = [torch.Generator().manual_seed(seed) for seed in self.seeds]
        self.generators = [
            torch.Generator(device=self.device).manual_seed(seed + 1) for seed in self.seeds
        ]
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
                    init,
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
        self._rows = torch.arange(S, device=self.device).unsqueeze(1)
        self.stats = EpisodeStats(
            {g.name: g.n_agents for g in info.groups}, num_envs, self.device, S
        )

    def compile(self) -> None:
        """torch.compile every network in place (parameter names and checkpoints unchanged)."""
        for pol in self.policies.values():
            pol.actor.compile(dynamic=False)
            pol.critic.compile(dynamic=False)

    # ------------------------------------------------------------ seeds

    def split(self, ob: Observation) -> Observation:
        """Env rows [S * E, ...] -> [S, E, ...]."""
        S = len(self.seeds)

        def view(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.view(S, -1, *x.shape[1:])

        return Observation(
            {k: view(v) for k, v in ob.obs.items()},
            view(ob.state),
            {k: view(v) for k, v in ob.masks.items()},
            {k: view(v) for k, v in ob.active.items()},
        )

    def _noise(self, shape: torch.Size, normal: bool) -> torch.Tensor:
        """Per-seed random numbers, shape [S, ...], each seed from its own generator."""
        draw = torch.randn if normal else torch.rand
        if len(self.generators) == 1:  # the same numbers as the stack below, without a copy
            return draw(shape, generator=self.generators[0], device=self.device)
        return torch.stack(
            [draw(shape[1:], generator=g, device=self.device) for g in self.generators]
        )

    def _sample(self, pol: GroupPolicy, dist) -> torch.Tensor:
        if pol.group.discrete:  # inverse CDF: masked actions have zero mass
            probs = dist.probs
            u = self._noise(probs.shape[:-1], normal=False).unsqueeze(-1)
            return (probs.cumsum(-1) < u).sum(-1).clamp_max(probs.shape[-1] - 1)
        return dist.mean + dist.stddev * self._noise(dist.mean.shape, normal=True)

    # ------------------------------------------------------------ acting

    @torch.no_grad()
    def act(self, ob: Observation, deterministic: bool = True) -> dict[str, torch.Tensor]:
        """Actions for env rows [S * E, ...]."""
        split = self.split(ob)
        actions = {}
        for name, pol in self.policies.items():
            dist = pol.distribution(pol.actor_input(split), split.masks[name])
            if deterministic:
                action = dist.probs.argmax(-1) if pol.group.discrete else dist.mean
            else:
                action = self._sample(pol, dist)
            actions[name] = action.flatten(0, 1)
        return actions

    # ------------------------------------------------------------ rollout

    @torch.no_grad()
    def collect(
        self, env: BatchedEnv, ob: Observation
    ) -> tuple[dict[str, GroupRollout], Observation, torch.Tensor]:
        steps, gamma, S = self.cfg.rollout_steps, self.cfg.gamma, len(self.seeds)
        buf: dict[str, dict[str, list]] = {
            n: {k: [] for k in GroupRollout.__annotations__} for n in self.policies
        }
        dones = []
        for _ in range(steps):
            split = self.split(ob)
            actions = {}
            for name, pol in self.policies.items():
                a_in, c_in = pol.actor_input(split), pol.critic_input(split)
                dist = pol.distribution(a_in, split.masks[name])
                action = self._sample(pol, dist)
                b = buf[name]
                b["actor_in"].append(a_in)
                b["critic_in"].append(c_in)
                b["actions"].append(action)
                b["log_probs"].append(_log_prob(dist, action, pol.group.discrete))
                b["values"].append(pol.value_norm.denormalize(pol.value(c_in)))
                b["active"].append(split.active[name])
                b["masks"].append(split.masks[name])
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
                final_v = pol.value_norm.denormalize(pol.value(pol.critic_input(final)))
                buf[name]["rewards"].append(rewards[name] + gamma * final_v * trunc)
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
        """PPO epochs over the rollout; returns each loss term per seed, `[S]`."""
        cfg, S = self.cfg, len(self.seeds)
        if cfg.anneal_lr:
            frac = 1.0 - self.iteration / self.total_iterations
            self.optimizer.param_groups[0]["lr"] = cfg.lr * frac
            self.optimizer.param_groups[1]["lr"] = (cfg.critic_lr or cfg.lr) * frac
        last_split = self.split(last_ob)
        data = {}
        with torch.no_grad():
            for name, pol in self.policies.items():
                r = rollouts[name]
                last = pol.value_norm.denormalize(pol.value(pol.critic_input(last_split)))
                # An agent continues past step t if its env did not end and it still acts at
                # t + 1; one that left early must not bootstrap from its blank observation.
                next_active = torch.cat([r.active[1:], last_split.active[name].unsqueeze(0)])
                continues = (~dones).unsqueeze(-1) & next_active
                adv, ret = gae(r.rewards, r.values, last, continues, cfg.gamma, cfg.gae_lambda)
                adv, ret, active = seed_first(adv), seed_first(ret), seed_first(r.active)
                weight = active.to(torch.float32)
                if cfg.normalize_advantages:
                    count = weight.sum((1, 2)).clamp_min(1.0)
                    mean = (adv * weight).sum((1, 2)) / count
                    std = (((adv - per_seed(mean, adv)) ** 2 * weight).sum((1, 2)) / count).sqrt()
                    adv = (adv - per_seed(mean, adv)) / (per_seed(std, adv) + 1e-8)
                if cfg.value_norm:
                    pol.value_norm.update(ret, active)
                data[name] = {
                    "actor_in": seed_first(r.actor_in),
                    "critic_in": seed_first(r.critic_in),
                    "actions": seed_first(r.actions),
                    "log_probs": seed_first(r.log_probs),
                    "values": seed_first(r.values),
                    "masks": None if r.masks is None else seed_first(r.masks),
                    "active": weight,
                    "adv": adv,
                    "ret": ret,
                }

        batch = dones.shape[0] * dones.shape[2]  # samples per seed
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
                totals["grad_norm"] += grad
                updates += 1
        self.iteration += 1
        return {k: v / max(updates, 1) for k, v in totals.items()}

    def _group_loss(self, pol: GroupPolicy, d: dict, idx: torch.Tensor):
        """Loss terms per seed, `[S]`, on minibatch rows `idx` `[S, B]`."""
        cfg = self.cfg

        def take(x: torch.Tensor) -> torch.Tensor:
            return x[self._rows, idx]

        mask = take(d["masks"]) if d["masks"] is not None else None
        dist = pol.distribution(take(d["actor_in"]), mask)
        log_prob = _log_prob(dist, take(d["actions"]), pol.group.discrete)
        active = take(d["active"])
        count = active.sum((1, 2)).clamp_min(1.0)

        def mean(x: torch.Tensor) -> torch.Tensor:
            return (x * active).sum((1, 2)) / count

        adv, old_log_prob = take(d["adv"]), take(d["log_probs"])
        log_ratio = log_prob - old_log_prob
        ratio = log_ratio.exp()
        surrogate = torch.min(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
        policy_loss = -mean(surrogate)
        entropy = mean(_entropy(dist, pol.group.discrete))

        value = pol.value(take(d["critic_in"]))
        ret, old_value = take(d["ret"]), take(d["values"])
        if cfg.value_norm:
            ret, old_value = pol.value_norm.normalize(ret), pol.value_norm.normalize(old_value)
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

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {
            "policies": self.policies.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "iteration": self.iteration,
            "generators": [g.get_state() for g in self.generators],
        }

    def load_state_dict(self, state: dict) -> None:
        own = self.policies.state_dict()
        # Policies saved before the seed axis existed lack its leading 1.
        policies = {
            k: v.unsqueeze(0) if v.dim() == own[k].dim() - 1 else v
            for k, v in state["policies"].items()
        }
        self.policies.load_state_dict(policies)
        if "optimizer" in state:
            optimizer = state["optimizer"]
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            for index, entry in optimizer["state"].items():
                for key, value in entry.items():
                    if torch.is_tensor(value) and value.dim() == params[index].dim() - 1:
                        entry[key] = value.unsqueeze(0)
            self.optimizer.load_state_dict(optimizer)
        self.iteration = int(state.get("iteration", 0))
        for g, saved in zip(self.generators, state.get("generators", []), strict=False):
            g.set_state(saved)

    def seed_state(self, index: int) -> dict:
        """Seed `index`'s part of the state: what training it alone would have saved."""
        state = self.state_dict()

        def cut(v):
            return v[index : index + 1].clone() if torch.is_tensor(v) and v.dim() else v

        optimizer = state["optimizer"]
        return {
            "policies": {k: cut(v) for k, v in state["policies"].items()},
            "optimizer": {
                "state": {
                    i: {k: cut(v) for k, v in entry.items()}
                    for i, entry in optimizer["state"].items()
                },
                "param_groups": optimizer["param_groups"],
            },
            "iteration": state["iteration"],
            "generators": [state["generators"][index]],
        }

    def load_seed_states(self, states: list[dict]) -> None:
        """The inverse of `seed_state` over every seed, in order."""
        if len(states) == 1:
            self.load_state_dict(states[0])
            return

        def join(values):
            first = values[0]
            return torch.cat(values) if torch.is_tensor(first) and first.dim() else first

        optimizers = [s["optimizer"] for s in states]
        self.load_state_dict(
            {
                "policies": {
                    k: join([s["policies"][k] for s in states]) for k in states[0]["policies"]
                },
                "optimizer": {
                    "state": {
                        i: {k: join([o["state"][i][k] for o in optimizers]) for k in entry}
                        for i, entry in optimizers[0]["state"].items()
                    },
                    "param_groups": optimizers[0]["param_groups"],
                },
                "iteration": states[0]["iteration"],
                "generators": [s["generators"][0] for s in states],
            }
        )


def clip_grad_norm_per_seed(
    params: list[torch.Tensor], max_norm: float, seeds: int
) -> torch.Tensor:
    """`clip_grad_norm_` for each seed's slice of the parameters; returns the norms `[S]`."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(seeds)
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(seeds, -1), dim=1) for g in grads])
    total = torch.linalg.vector_norm(norms, dim=0)
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(per_seed(scale, g))
    return total
