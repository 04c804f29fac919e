"""What every on-policy algorithm shares (config: `marlctl.algos.onpolicy`).

An actor and a critic per agent group (`model.sharing` and `model.recurrent` apply);
rollouts of `rollout_steps` from every env, with time-limit bootstrapping; GAE (Schulman et
al. 2016) with value normalisation; advantages standardised per seed; minibatches of single
steps, or of whole env sequences for recurrent agents; one Adam optimiser with per-seed
gradient clipping and an optional linear learning-rate decay.

An algorithm subclasses `OnPolicyTrainer` and defines `update`, its use of one rollout
(see `marlctl.train.ppo`). Every tensor is seed first, `[S, ..., n_agents, ...]` per group:
no loop over agents or envs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from marlctl.algos.onpolicy import OnPolicyConfig
from marlctl.envs.batch import BatchedEnv, Observation
from marlctl.train.actions import (
    masked_mean,
)
from marlctl.train.base import Trainer, TrainerSetup, clip_grad_norm_per_seed
from marlctl.train.core import (
    Adam,
    gae,
    per_seed,
    per_seed_outcomes,
    turn_gae,
)
from marlctl.train.networks import reset_where
from marlctl.train.policies import (
    GroupPolicy,
    GroupRollout,
    Minibatch,
    entropy,
    env_first,
    log_prob,
    seed_first,
)
from marlctl.train.rows import RowAdam, RowValues


class OnPolicyTrainer(Trainer):
    """Collect `rollout_steps` from every env, estimate advantages, hand them to `update`.

    Recurrent agents carry their state across rollouts (reset at episode starts) and are
    trained on whole rollout sequences, minibatched over envs.
    """

    critic_sharing: str | None = None  # the critics' `model.sharing`; None = the actors'

    def __init__(self, setup: TrainerSetup):
        config: OnPolicyConfig = setup.config
        model, info, num_envs = setup.model, setup.info, setup.num_envs
        centralised = setup.centralised
        super().__init__(model.for_algo(config), info, num_envs, setup.device, setup.seeds)
        self.cfg, self.total_iterations = config, max(1, setup.total_iterations)
        # A row's own values where `setup.rows` gives them (`row_fields`), else the config's.
        self.values = RowValues(config, self.row_fields, setup.rows, len(setup.seeds),
                                self.device)  # fmt: skip
        self.recurrent = model.recurrent is not None
        self.reads_state = centralised
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
        self.optimizers = self.make_optimizers()
        self._act: dict = {}  # compiled regions of a rollout step, by group (`compile`)
        S = len(self.seeds)
        self._hidden = {
            name: (
                pol.actor.initial_state(S, num_envs, device=self.device),
                pol.critic.initial_state(S, num_envs, device=self.device),
            )
            for name, pol in self.policies.items()
        }

    def keep_rows(self, index: torch.Tensor) -> None:
        super().keep_rows(index)
        self._hidden = {
            name: tuple(h.index_select(0, index) for h in pair)
            for name, pair in self._hidden.items()
        }

    def make_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """One Adam: the actors' parameters in its first group, the critics' in its second;
        with a rate per row where the rows' rates differ (`RowAdam`)."""
        cfg, values = self.cfg, self.values
        if values.differ("lr", "critic_lr"):  # a row naming either names both
            rates = [values.tensor(name, torch.float64) for name in ("lr", "critic_lr")]
            self.optimizer = RowAdam(
                [self.actor_params, self.critic_params], rates, cfg.adam_eps,
                names=("lr", "critic_lr"),
            )  # fmt: skip
            return {"adam": self.optimizer}
        self.optimizer = Adam(
            [
                {"params": self.actor_params, "lr": cfg.lr},
                {"params": self.critic_params, "lr": cfg.critic_lr or cfg.lr},
            ],
            eps=cfg.adam_eps,
        )
        return {"adam": self.optimizer}

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
            actions[name] = pol.env_action(action)
        return actions

    def _act_group(self, name: str, a_in, c_in, mask, h_a, h_c) -> tuple:
        """Group `name`'s part of a rollout step: its sampled action, the action's
        log-probability, the value (denormalised), the action as the env takes it
        (`[S * envs, ...]`) and the next recurrent states. With `hardware.compile: true`,
        one compiled region per group (`compile`)."""
        pol = self.policies[name]
        dist, h_a = pol.distribution(a_in, mask, h_a)
        value, h_c = pol.value(c_in, h_c)
        action = self._sample(pol, dist)
        logp = log_prob(dist, action, pol.group.discrete)
        env_action = pol.env_action(action).flatten(0, 1)
        return action, logp, pol.value_norm.denormalize(value), env_action, h_a, h_c

    def compile(self) -> None:
        """The networks compiled, each group's part of a rollout step compiled whole
        (`marlctl.train.regions`: its random draws made ahead of it), and the episode
        statistics' bookkeeping: a step's policy, sampling, log-probability, value and
        returns as a few fused kernels instead of dozens."""
        super().compile()
        from marlctl.train.regions import Region

        self._act = {name: Region(self, self._act_group) for name in self.policies}
        self.stats.record = torch.compile(self.stats.record, dynamic=False)

    def _sample(self, pol: GroupPolicy, dist) -> torch.Tensor:
        if pol.group.discrete:
            return self.sample_categorical(dist.probs)
        return dist.mean + dist.stddev * self.noise(dist.mean.shape, normal=True)

    # ------------------------------------------------------------ rollout

    @torch.no_grad()
    def collect(
        self, env: BatchedEnv, ob: Observation
    ) -> tuple[dict[str, GroupRollout], Observation, torch.Tensor]:
        steps, S = self.cfg.rollout_steps, len(self.seeds)
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
                act = self._act.get(name, self._act_group)
                action, logp, value, env_action, h_a, h_c = act(
                    name, a_in, c_in, split.masks[name], h_a, h_c
                )
                if self.recurrent:
                    self._hidden[name] = (h_a, h_c)
                critic_h[name] = h_c
                b = buf[name]
                b["actor_in"].append(a_in)
                b["critic_in"].append(pol.stored_state(split.state) if pol.centralised else None)
                b["actions"].append(action)
                b["log_probs"].append(logp)
                b["values"].append(value)
                b["active"].append(split.active[name])
                b["masks"].append(split.masks[name])
                b["first"].append(self._first)
                actions[name] = env_action
            tr = env.step(actions)
            done = (tr.terminated | tr.truncated).view(S, -1)
            rewards = {k: v.view(S, -1, *v.shape[1:]) for k, v in tr.rewards.items()}
            self.stats.record(rewards, done, **per_seed_outcomes(tr, S))
            trunc = tr.truncated.view(S, -1).to(torch.float32).unsqueeze(-1)
            cut = tr.final is not tr.next and self.cfg.bootstrap_time_limit
            final = self.split(tr.final) if cut else None
            for name, pol in self.policies.items():
                if final is None:  # no episode ended, or time limits end returns
                    buf[name]["rewards"].append(rewards[name])
                    continue
                # A time limit is not a terminal state: fold gamma * V(final obs) into the reward.
                final_v, _ = pol.value(pol.critic_input(final), critic_h[name])
                final_v = pol.value_norm.denormalize(final_v)
                gamma = self.values.along("gamma", final_v)
                buf[name]["rewards"].append(rewards[name] + gamma * final_v * trunc)
            dones.append(done)
            self._first = done
            ob = tr.next
        rollouts = {}
        for name, b in buf.items():
            # A decentralised critic reads the actor's input: stored once, critic_in None.
            fields = {k: (torch.stack(v) if v[0] is not None else None) for k, v in b.items()}
            rollouts[name] = GroupRollout(**fields)
        return rollouts, ob, torch.stack(dones)

    # ------------------------------------------------------------ advantages

    @torch.no_grad()
    def advantages(
        self, rollouts: dict[str, GroupRollout], last_ob: Observation, dones: torch.Tensor
    ) -> dict[str, dict]:
        """Per group, the rollout laid out for minibatches (`[S, samples, ...]`, or
        `[S, envs, T, ...]` for recurrent agents) with GAE advantages and returns.

        Advantages are standardised per seed if `normalize_advantages`. The value normaliser
        takes in this rollout's returns; `values` stay the critic's outputs at collection,
        normalised with the statistics they were made with (the window of a clipped value
        loss is around them).
        """
        cfg = self.cfg
        last_split = self.split(last_ob)
        layout = env_first if self.recurrent else seed_first
        data = {}
        for name, pol in self.policies.items():
            r = rollouts[name]
            h_c = reset_where(self._hidden[name][1], self._first) if self.recurrent else None
            last, _ = pol.value(pol.critic_input(last_split), h_c)
            last = pol.value_norm.denormalize(last)
            # An agent continues past step t if its env did not end and it still acts at
            # t + 1; one that left early must not bootstrap from its blank observation.
            last_active = last_split.active[name]
            if self.info.turn_based:
                adv, ret, counted = turn_gae(
                    r.rewards, r.values, last, r.active, last_active, dones,
                    self.values.along("gamma", last), self.values.along("gae_lambda", last),
                )  # fmt: skip
            else:
                next_active = torch.cat([r.active[1:], last_active.unsqueeze(0)])
                continues = (~dones).unsqueeze(-1) & next_active
                gamma, lam = self.values.along("gamma", last), self.values.along("gae_lambda", last)
                adv, ret = gae(r.rewards, r.values, last, continues, gamma, lam)
                counted = r.active
            adv, ret, active = layout(adv), layout(ret), layout(counted)
            weight = active.to(torch.float32)
            if cfg.normalize_advantages:
                mean = masked_mean(adv, weight)
                std = masked_mean((adv - per_seed(mean, adv)) ** 2, weight).sqrt()
                adv = (adv - per_seed(mean, adv)) / (per_seed(std, adv) + 1e-8)
            old_values = layout(r.values)
            if cfg.value_norm:
                old_values = pol.value_norm.normalize(old_values)
                pol.value_norm.update(ret, active)
            actor_in = layout(r.actor_in)
            data[name] = {
                "actor_in": actor_in,
                "critic_in": actor_in if r.critic_in is None else layout(r.critic_in),
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
        return data

    # ------------------------------------------------------------ minibatches

    def minibatches(self, data: dict[str, dict], count: int):
        """One pass over the rollout in `count` minibatches: row indices `[S, B]` per seed,
        each seed's own permutation (single steps, or env sequences if recurrent); None for
        a single minibatch, which is every row in stored order (no copy)."""
        if count == 1:
            yield None
            return
        first = next(iter(data.values()))["active"]
        batch = first.shape[1]
        size = max(1, batch // count)
        if self.device.type == "cuda":  # random keys sorted: no host sync, graph-safe
            order = self.noise(torch.Size((len(self.seeds), batch)), normal=False).argsort(-1)
        else:
            order = torch.stack(
                [torch.randperm(batch, generator=g, device=self.device) for g in self.generators]
            )
        for start in range(0, batch - size + 1, size):
            yield order[:, start : start + size]

    def rows(self, idx: torch.Tensor | None):
        """`take`: minibatch rows `idx` `[S, B]` of a layout tensor (None: every row);
        `flat`: sequences flattened to steps."""

        def take(x: torch.Tensor) -> torch.Tensor:
            return x if idx is None else x[self._rows, idx]

        def flat(x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1, 2) if self.recurrent else x

        return take, flat

    def evaluate(self, pol: GroupPolicy, d: dict, idx: torch.Tensor | None) -> Minibatch:
        """The current actor and critic on minibatch rows `idx` `[S, B]` of group data `d`
        (None: every row)."""
        take, flat = self.rows(idx)
        mask = flat(take(d["masks"])) if d["masks"] is not None else None
        dist, value = self._forward(pol, d, take, mask)
        discrete = pol.group.discrete
        ret = flat(take(d["ret"]))
        if self.cfg.value_norm:  # old values are normalised already
            ret = pol.value_norm.normalize(ret)
        return Minibatch(
            dist=dist,
            log_prob=log_prob(dist, flat(take(d["actions"])), discrete),
            entropy=entropy(dist, discrete, self.noise),
            value=value,
            active=flat(take(d["active"])),
            adv=flat(take(d["adv"])),
            old_log_prob=flat(take(d["log_probs"])),
            old_value=flat(take(d["values"])),
            ret=ret,
        )

    def _forward(self, pol: GroupPolicy, d: dict, take, mask):
        """Action distribution and value on the minibatch, `[S, B, n, ...]`."""
        if not self.recurrent:
            actor_in = take(d["actor_in"])
            dist, _ = pol.distribution(actor_in, mask)
            shared = d["critic_in"] is d["actor_in"]  # one gather serves both
            value, _ = pol.value(actor_in if shared else pol.per_agent(take(d["critic_in"])))
            return dist, value
        return self.actor_forward(pol, d, take, mask), self.critic_forward(pol, d, take)

    def actor_forward(self, pol: GroupPolicy, d: dict, take, mask, copy=None):
        """The action distribution on the minibatch, `[S, B, n, ...]`: recurrent actors run
        through each sequence `[S, B, T, ...]` from its stored state. `copy` `[S]`: agent
        `copy[s]`'s network alone, on `take`'s rows of that agent only (`[..., 1, ...]`)."""
        actor_in = take(d["actor_in"])
        if not self.recurrent:
            return pol.distribution(actor_in, mask, copy=copy)[0]
        out = pol.actor.sequence(actor_in, take(d["hidden"][0]), take(d["first"]), copy)
        return pol.distribution_of(out.flatten(1, 2), mask, copy)

    def critic_forward(self, pol: GroupPolicy, d: dict, take) -> torch.Tensor:
        """The value on the minibatch, `[S, B, n]` (sequences flattened to steps)."""
        shared = d["critic_in"] is d["actor_in"]
        critic_in = take(d["critic_in"])
        if not self.recurrent:
            return pol.value(critic_in if shared else pol.per_agent(critic_in))[0]
        c_in = critic_in if shared else pol.per_agent(critic_in)
        out = pol.critic.sequence(c_in, take(d["hidden"][1]), take(d["first"]))
        return out.squeeze(-1).flatten(1, 2)

    def value_loss(
        self,
        value: torch.Tensor,
        old: torch.Tensor,
        ret: torch.Tensor,
        clip: float | torch.Tensor | None,
    ) -> torch.Tensor:
        """MAPPO's value loss, elementwise: the error to the return, and with `clip` (a number,
        or per row shaped to broadcast) the larger of it and the error of the value clipped to
        within `clip` of the old one."""
        loss = self.value_error(ret - value)
        if clip is None:
            return loss
        clipped = old + (value - old).clamp(-clip, clip)
        return torch.max(loss, self.value_error(ret - clipped))

    def value_error(self, error: torch.Tensor) -> torch.Tensor:
        """Huber (`huber_delta`) or half squared error, elementwise."""
        delta = self.cfg.huber_delta
        if delta is None:
            return 0.5 * error**2
        return F.huber_loss(error, torch.zeros_like(error), reduction="none", delta=delta)

    def step(self, loss: torch.Tensor) -> torch.Tensor:
        """One gradient step on per-seed losses `[S]`; returns the actors' gradient norms
        before clipping. Seeds share no parameter: each gets its own gradient and clip."""
        S = len(self.seeds)
        self.optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()
        limit = self.values.of("max_grad_norm")
        grad = clip_grad_norm_per_seed(self.actor_params, limit, S)
        clip_grad_norm_per_seed(self.critic_params, limit, S)
        self.optimizer.step()
        self.after_update()
        return grad

    # ------------------------------------------------------------ one iteration

    def update(self, data: dict[str, dict]) -> dict[str, torch.Tensor]:
        """The algorithm: learn from one rollout's `advantages`; each loss term per seed."""
        raise NotImplementedError

    def train_iteration(self, env: BatchedEnv, ob: Observation):
        cfg = self.cfg
        if cfg.anneal_lr:
            self._decay_lr(1.0 - self.iteration / self.total_iterations)
        if self.graph is not None:  # the env's state is the graph's input: ob is not
            ob, losses = self.graph.run(lambda: self.iterate(env, env.observe_now()))
        else:
            ob, losses = self.iterate(env, ob)
        self.iteration += 1
        return ob, {f"loss/{k}": v for k, v in losses.items()}

    def iterate(self, env: BatchedEnv, ob: Observation):
        """One rollout and the update from it: what a captured iteration replays."""
        rollouts, ob, dones = self.collect(env, ob)
        return ob, self.update(self.advantages(rollouts, ob, dones))

    def _set_lr(self, index: int, value: float) -> None:
        """Learning rate of the actors (0) or the critics (1)."""
        set_lr(self.optimizer.param_groups[index], value)

    def _decay_lr(self, fraction: float) -> None:
        """Learning rates at `fraction` of their starting values (`anneal_lr`)."""
        if isinstance(self.optimizer, RowAdam):
            self.optimizer.scale(0, fraction)
            self.optimizer.scale(1, fraction)
            return
        cfg = self.cfg
        self._set_lr(0, cfg.lr * fraction)
        self._set_lr(1, (cfg.critic_lr or cfg.lr) * fraction)

    @property
    def steps_per_iteration(self) -> int:
        """Env steps per iteration for each seed."""
        return self.cfg.rollout_steps * self.num_envs


def set_lr(group: dict, value: float) -> None:
    """Set an optimiser parameter group's learning rate."""
    if torch.is_tensor(group["lr"]):  # read by the captured optimiser step
        group["lr"].fill_(value)
    else:
        group["lr"] = value
