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
from marlctl.train.base import (
    Trainer,
    TrainerSetup,
    clip_grad_norm_per_seed,
    next_observation,
)
from marlctl.train.core import RunningMeanStd, per_seed, per_seed_outcomes
from marlctl.train.replay import Field, ReplayBuffer, transition, transition_fields
from marlctl.train.rows import RowValues


class OffPolicyTrainer(Trainer):
    loss_keys: tuple[str, ...] = ()

    def __init__(self, setup: TrainerSetup, sequence_length: int = 1):
        config: OffPolicyConfig = setup.config
        info = setup.info
        super().__init__(
            setup.model.for_algo(config), info, setup.num_envs, setup.device, setup.seeds
        )
        self.cfg = config
        # A row's own values where `setup.rows` gives them (`row_fields`), else the config's.
        self.values = RowValues(config, self.row_fields, setup.rows, len(setup.seeds),
                                self.device)  # fmt: skip
        if self.values.differ("gamma") and getattr(config, "n_step", 1) > 1:
            raise ValueError("a discount per row: not with n_step above 1")
        self.sequence_length = sequence_length
        self.buffer: ReplayBuffer | None = None  # made on the first step: eval needs none
        self.env_steps = 0  # per seed
        # (target, online) -> both parameter lists, gathered once: walking modules costs.
        self._pair_parameters: dict[tuple[int, int], tuple[list, list]] = {}
        S = len(self.seeds)
        self._clip = clip_grad_norm_per_seed
        self._compiled = False
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
                # A compiled batch must not read host counts (each new one would compile
                # anew); the trainer's draws can be made ahead of it (`Region`).
                counters_on_device=True if self._compiled else None,
                uniform=lambda shape, dtype: self.noise(shape, False, dtype),
            )
        return self.buffer

    def keep_rows(self, index: torch.Tensor) -> None:
        super().keep_rows(index)
        if self.buffer is not None:
            self.buffer.keep(index, self.generators)

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
        self.stats.record(rewards, done, **per_seed_outcomes(tr, S))
        if self.cfg.reward_scaling != "none":
            for name, stats in self.reward_stats.items():
                stats.update(rewards[name], split.active[name])
        step = transition(
            split, self.split(next_observation(tr)), actions, rewards, terminated, self._first
        )
        buffer.add(**step, **extra)
        self._first = done
        self.env_steps += self.num_envs
        if self.graph is not None:
            self._env_steps_t += self.num_envs
        return tr.next

    def annealed(
        self, start: float, end: float, steps: int, host: bool = False
    ) -> float | torch.Tensor:
        """Linear from `start` to `end` over the first `steps` env steps (0: `end` from the
        start). A captured run computes it on the device from its env-step count, with the
        same float64 arithmetic, so that a replay reads the current value; `host` gives the
        host's float in any case (for logging)."""
        if steps == 0:
            return end
        if self.graph is None or host:
            return start + min(1.0, self.env_steps / steps) * (end - start)
        frac = (self._env_steps_t.double() / steps).clamp(max=1.0)
        return (start + frac * (end - start)).float()

    def annealed_rows(self, start: str, end: str, steps: str, host: bool = False):
        """`annealed` of the config fields named `start`, `end` and `steps`, each row with
        its own values where the rows differ: a float, or one per row (`[S]` on the device,
        a list of floats with `host`)."""
        names = (start, end, steps)
        if not self.values.differ(*names):
            return self.annealed(*(getattr(self.cfg, n) for n in names), host=host)
        first, last, length = (self.values.tensor(n, torch.float64) for n in names)
        if self.graph is None or host:
            count: float | torch.Tensor = float(self.env_steps)
        else:  # a replay reads the device-side count
            count = self._env_steps_t.double()
        frac = torch.where(length > 0, (count / length.clamp(min=1)).clamp(max=1.0), 1.0)
        value = first + frac * (last - first)
        return value.tolist() if host else value.float()

    # ------------------------------------------------------------ one iteration

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    # Methods that compute a gradient step's losses from a batch, with no host-side state
    # (counters, schedules) read inside: `hardware.compile: true` compiles each into one
    # region, whose backward AOTAutograd compiles too. The optimiser steps, target updates
    # and host-side branching (policy delays) stay outside, in `update`.
    compiled_regions: tuple[str, ...] = ()

    def compile(self) -> None:
        from marlctl.train.regions import Region

        if self.buffer is not None:
            raise RuntimeError("compile a replay-based trainer before it collects")
        self._compiled = True
        for name in ("sampled_batch", *self.compiled_regions):
            setattr(self, name, Region(self, getattr(self, name)))
        self._clip = torch.compile(clip_grad_norm_per_seed, dynamic=False)

    def clip_gradients(self, params: list[torch.Tensor]) -> torch.Tensor:
        """Clip each seed's gradient of `params` to `max_grad_norm`; the norms before, `[S]`."""
        return self._clip(params, self.values.of("max_grad_norm"), len(self.seeds))

    def prepare(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A sampled batch as `update` reads it: rewards normalised (`reward`) and `discount`,
        the factor of each sample's bootstrapped value. With `n_step` > 1 each window
        `[S, n, B, ...]` becomes one transition `[S, 1, B, ...]`: the first step's inputs, the
        discounted sum of its normalised rewards up to the window's end or the episode's, and
        the next observation and termination of the step it stops at, discounted by gamma to
        the number of steps summed (HARL's off-policy buffers)."""
        gamma, n = self.values.of("gamma"), self.cfg.n_step
        batch = dict(batch)
        for name in self.reward_stats:
            batch[f"reward/{name}"] = self.reward(batch, name)
        if n == 1:
            terminated = batch["terminated"]
            if torch.is_tensor(gamma):  # a discount per row
                batch["discount"] = per_seed(gamma, terminated).expand(terminated.shape)
                return batch
            batch["discount"] = torch.full(terminated.shape, gamma, device=terminated.device)
            return batch
        first = batch["first"]  # [S, n, B]: step k opens an episode, so step k - 1 ended one
        counted = torch.cat([torch.ones_like(first[:, :1]), ~first[:, 1:]], 1).float().cumprod(1)
        steps = counted.sum(1, keepdim=True)  # [S, 1, B]
        powers = gamma ** torch.arange(n, device=first.device, dtype=torch.float32)
        weight = counted * powers.view(1, n, 1)
        last = steps.long() - 1
        out = {}
        for key, value in batch.items():
            tail = [1] * (value.dim() - 3)
            if key.startswith("reward/"):
                out[key] = (value * weight.view(*weight.shape, *tail)).sum(1, keepdim=True)
            elif key.startswith("next_") or key == "terminated":
                index = last.view(*last.shape, *tail).expand(-1, -1, -1, *value.shape[3:])
                out[key] = value.gather(1, index)
            else:
                out[key] = value[:, :1]
        out["discount"] = gamma**steps
        return out

    def sampled_batch(self) -> dict[str, torch.Tensor]:
        """A batch for one gradient step: sampled from the buffer, then `prepare`d."""
        return self.prepare(self.buffer.sample(self.cfg.batch_size, self.window))

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
        lists = [self._parameter_lists(target, online) for target, online in pairs]
        targets = [t for pair in lists for t in pair[0]]
        sources = [p for pair in lists for p in pair[1]]
        if every:
            self.copy_targets(targets, sources, every)
            return
        tau = self.values.of("tau")
        if torch.is_tensor(tau):  # a rate per row
            tau = [per_seed(tau, t) for t in targets]
        with torch.no_grad():
            torch._foreach_lerp_(targets, sources, tau)

    def ready(self) -> bool:
        """Enough transitions are stored for the gradient steps to begin."""
        buffer = self.buffer
        if buffer is None or len(buffer) < max(self.cfg.learning_starts, self.cfg.batch_size):
            return False
        return buffer.written >= self.window

    @property
    def window(self) -> int:
        """Consecutive steps per sample: a recurrent sequence, or an n-step return's."""
        return max(self.sequence_length, self.cfg.n_step)

    def train_iteration(self, env: BatchedEnv, ob: Observation):
        # Captured once gradient steps begin: from then on every iteration runs the same
        # kernels.
        if self.graph is not None and self.ready():
            ob, totals = self.graph.run(lambda: self.iterate(env, env.observe_now()))
        else:
            ob, totals = self.iterate(env, ob)
        self.iteration += 1
        return ob, {f"loss/{k}": v for k, v in totals.items()} | self.schedules()

    def iterate(self, env: BatchedEnv, ob: Observation):
        """`rollout_steps` env steps, then `updates` gradient steps once `ready`."""
        for _ in range(self.cfg.rollout_steps):
            ob = self.collect_step(env, ob)
        totals = {k: torch.zeros(len(self.seeds), device=self.device) for k in self.loss_keys}
        if self.ready():
            for _ in range(self.cfg.updates):
                losses = self.update(self.sampled_batch())
                self.after_update()
                for key, value in losses.items():
                    totals[key] += value.detach() / self.cfg.updates
        return ob, totals

    def capture_blocker(self, env: BatchedEnv) -> str | None:
        reason = super().capture_blocker(env)
        if reason is not None:
            return reason
        if not self._ensure_buffer().on_device:
            return "the replay buffer is kept in CPU memory (too large for the GPU's share)"
        delay = getattr(self.cfg, "policy_delay", 1)
        if self.cfg.updates % delay:
            return f"algo.updates ({self.cfg.updates}) is not a multiple of algo.policy_delay"
        return None

    def graph_counters(self) -> list[tuple[object, str]]:
        # Counts a replay reads (exploration, hard target copies), kept on the device too.
        self._env_steps_t = torch.tensor(self.env_steps, device=self.device)
        return [*super().graph_counters(), (self, "env_steps"), (self.buffer, "written")]

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
