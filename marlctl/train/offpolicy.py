"""The loop every replay-based trainer shares: act, store, and update from samples.

Each iteration collects `rollout_steps` steps of every env into the replay buffer, then,
once `learning_starts` transitions are stored, takes `updates` gradient steps on sampled
batches. Rewards are stored raw and normalised when sampled, by running statistics of every
collected reward per group and seed (EPyMARL's `standardise_rewards`). Target networks
follow the online ones by Polyak averaging or by a hard copy every `target_update_every`
gradient steps. Subclasses define the networks, `explore` (acting while collecting),
`act_step` (acting for evaluation) and `update` (one gradient step on a sample).
"""

from __future__ import annotations

import torch
from torch import nn

from marlctl.algos.offpolicy import OffPolicyConfig
from marlctl.envs.batch import BatchedEnv, Observation
from marlctl.envs.registry import EnvInfo
from marlctl.spec.models import ModelSpec
from marlctl.train.base import Trainer, next_observation
from marlctl.train.core import RunningMeanStd, per_seed
from marlctl.train.replay import Field, ReplayBuffer, transition, transition_fields


class OffPolicyTrainer(Trainer):
    loss_keys: tuple[str, ...] = ()

    def __init__(
        self,
        config: OffPolicyConfig,
        model: ModelSpec,
        info: EnvInfo,
        num_envs: int,
        device,
        seeds: tuple[int, ...],
        sequence_length: int = 1,
    ):
        super().__init__(model.for_algo(config), info, num_envs, device, seeds)
        self.cfg = config
        self.sequence_length = sequence_length
        self.buffer: ReplayBuffer | None = None  # made on the first step: eval needs none
        self.env_steps = 0  # per seed
        # (target, online) -> both parameter lists, gathered once: walking modules costs.
        self._pair_parameters: dict[tuple[int, int], tuple[list, list]] = {}
        S = len(self.seeds)
        self.reward_stats = nn.ModuleDict({g.name: RunningMeanStd(S) for g in info.groups}).to(
            self.device
        )

    # ------------------------------------------------------------ storage

    def extra_fields(self) -> dict[str, Field]:
        """Fields a subclass stores beyond `transition_fields` (e.g. ensemble members)."""
        return {}

    def hidden_sizes(self) -> dict[str, int]:
        return {}

    def _ensure_buffer(self) -> ReplayBuffer:
        if self.buffer is None:
            fields = transition_fields(self.info, self.hidden_sizes()) | self.extra_fields()
            self.buffer = ReplayBuffer(
                fields,
                len(self.seeds),
                self.num_envs,
                self.cfg.buffer_size,
                self.device,
                self.generators,
            )
        return self.buffer

    # ------------------------------------------------------------ collecting

    def explore(
        self, ob: Observation, first: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Actions `[S, E, n, ...]` while collecting, and extra fields to store with them
        (e.g. `hidden/<group>`)."""
        raise NotImplementedError

    @torch.no_grad()
    def collect_step(self, env: BatchedEnv, ob: Observation) -> Observation:
        S = len(self.seeds)
        buffer = self._ensure_buffer()
        split = self.split(ob)
        actions, extra = self.explore(split, self._first)
        tr = env.step({k: v.flatten(0, 1) for k, v in actions.items()})
        done = (tr.terminated | tr.truncated).view(S, -1)
        terminated = tr.terminated.view(S, -1) if self.cfg.bootstrap_time_limit else done
        rewards = {k: v.view(S, -1, *v.shape[1:]) for k, v in tr.rewards.items()}
        self.stats.record(rewards, done)
        if self.cfg.reward_scaling != "none":
            for name, stats in self.reward_stats.items():
                stats.update(rewards[name], split.active[name])
        step = transition(
            split, self.split(next_observation(tr)), actions, rewards, terminated, self._first
        )
        buffer.add(**step, **extra)
        self._first = done
        self.env_steps += self.num_envs
        return tr.next

    # ------------------------------------------------------------ one iteration

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def reward(self, batch: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        """Group `name`'s sampled rewards, normalised as `reward_scaling` says."""
        reward = batch[f"reward/{name}"]
        stats = self.reward_stats[name]
        if self.cfg.reward_scaling == "standardise":
            return stats.normalize(reward)
        if self.cfg.reward_scaling == "scale":
            return reward / torch.sqrt(per_seed(stats.var, reward) + 1e-8)
        return reward

    def _parameter_lists(self, target: nn.Module, online: nn.Module):
        key = (id(target), id(online))
        if key not in self._pair_parameters:
            self._pair_parameters[key] = (list(target.parameters()), list(online.parameters()))
        return self._pair_parameters[key]

    def update_targets(self, pairs: list[tuple[nn.Module, nn.Module]]) -> None:
        """After a gradient step: Polyak-average each (target, online) pair, or copy the
        online weights every `target_update_every` steps."""
        every = self.cfg.target_update_every
        if every and (self.updates + 1) % every:
            return
        lists = [self._parameter_lists(target, online) for target, online in pairs]
        targets = [t for pair in lists for t in pair[0]]
        sources = [p for pair in lists for p in pair[1]]
        with torch.no_grad():
            if every:
                torch._foreach_copy_(targets, sources)
            else:
                torch._foreach_lerp_(targets, sources, self.cfg.tau)

    def train_iteration(self, env: BatchedEnv, ob: Observation):
        for _ in range(self.cfg.rollout_steps):
            ob = self.collect_step(env, ob)
        S = len(self.seeds)
        buffer = self.buffer
        ready = len(buffer) >= max(self.cfg.learning_starts, self.cfg.batch_size)
        ready = ready and buffer.written >= self.sequence_length
        totals = {k: torch.zeros(S, device=self.device) for k in self.loss_keys}
        if ready:
            for _ in range(self.cfg.updates):
                losses = self.update(buffer.sample(self.cfg.batch_size, self.sequence_length))
                self.after_update()
                for key, value in losses.items():
                    totals[key] += value.detach() / self.cfg.updates
        self.iteration += 1
        return ob, {f"loss/{k}": v for k, v in totals.items()} | self.schedules()

    def schedules(self) -> dict[str, torch.Tensor]:
        """Per-seed values of annealed hyperparameters, logged with the losses."""
        return {}

    @property
    def steps_per_iteration(self) -> int:
        return self.cfg.rollout_steps * self.num_envs

    # ------------------------------------------------------------ checkpoints

    def extra_state(self, index: int | None) -> dict:
        pick = slice(None) if index is None else slice(index, index + 1)
        state: dict = {
            "env_steps": self.env_steps,
            "reward_stats": {
                f"{name}.{key}": value[pick].clone()
                for name, stats in self.reward_stats.items()
                for key, value in stats.state_dict().items()
            },
        }
        if self.cfg.checkpoint_replay and self.buffer is not None:
            state["replay"] = self.buffer.state_dict(index)
        return state

    def load_extra_states(self, states: list[dict]) -> None:
        self.env_steps = int(states[0].get("env_steps", 0))
        if all("reward_stats" in s for s in states):
            joined = {
                k: torch.cat([s["reward_stats"][k] for s in states])
                for k in states[0]["reward_stats"]
            }
            self.reward_stats.load_state_dict(joined)
        if all("replay" in s for s in states):
            self._ensure_buffer().load_state_dicts([s["replay"] for s in states])
