"""Replay storage for off-policy algorithms: a ring of time steps for every env, per seed.

Each field is one tensor `[S, C, E, ...]` (seeds, C time steps, envs), written one time step
for all envs at once and sampled as single transitions or as windows of consecutive steps
of one env (recurrent agents). A transition keeps its own next observation, which is the
final observation where an episode was cut by a time limit, and a `terminated` flag: a
target bootstraps through a truncation and never through a termination.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

# A buffer takes at most this share of the GPU memory that is free when it is created.
DEVICE_SHARE = 0.5


class Field(NamedTuple):
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32


def storage_device(device: torch.device, needed: int, free: int | None = None) -> torch.device:
    """The run's device when `needed` bytes fit in its share of free memory, else the CPU."""
    if device.type != "cuda":
        return device
    if free is None:
        free, _ = torch.cuda.mem_get_info(device)
    return device if needed <= DEVICE_SHARE * free else torch.device("cpu")


class ReplayBuffer:
    """`capacity` transitions per seed (rounded down to whole time steps of `num_envs` envs)."""

    def __init__(
        self,
        fields: dict[str, Field],
        seeds: int,
        num_envs: int,
        capacity: int,
        device: torch.device,
        generators: list[torch.Generator],
        counters_on_device: bool | None = None,
        uniform: Callable[[torch.Size, torch.dtype], torch.Tensor] | None = None,
    ):
        """counters_on_device: keep the write position and fill level on the storage device
        (default: where the storage is a GPU's). uniform: draws `[S, ...]` uniform numbers,
        each seed's row from its own generator (default: from `generators`), for sampling
        with the counters on the device."""
        self.seeds, self.num_envs = seeds, num_envs
        self.steps = max(1, capacity // num_envs)
        self.device = torch.device(device)  # where samples are used
        per_step = sum(
            num_envs * math.prod(f.shape) * torch.empty((), dtype=f.dtype).element_size()
            for f in fields.values()
        )
        self.nbytes = seeds * self.steps * per_step
        self.storage = storage_device(self.device, self.nbytes)
        pin = self.storage.type == "cpu" and self.device.type == "cuda"
        self.data = {
            name: torch.zeros(
                seeds, self.steps, num_envs, *f.shape, dtype=f.dtype, device=self.storage
            )
            for name, f in fields.items()
        }
        if pin:
            self.data = {k: v.pin_memory() for k, v in self.data.items()}
        self.generators = generators
        self.uniform = uniform or self._uniform
        self.written = 0  # time steps written so far
        self._shift = 0  # head = (written + shift) % steps (not 0 after loading a full ring)
        self._rows = torch.arange(seeds, device=self.storage).view(seeds, 1, 1)
        # On a GPU the write position and the fill level also live on the device, where adding
        # and sampling read them: no host value is baked into a captured CUDA graph.
        self.on_device = (
            self.storage.type == "cuda" if counters_on_device is None else counters_on_device
        )
        if self.on_device:
            self._head_t = torch.zeros((), dtype=torch.long, device=self.storage)
            self._written_t = torch.zeros((), dtype=torch.long, device=self.storage)

    @property
    def head(self) -> int:
        """The next time step to write."""
        return (self.written + self._shift) % self.steps

    def __len__(self) -> int:
        """Transitions stored per seed."""
        return min(self.written, self.steps) * self.num_envs

    def add(self, **step: torch.Tensor) -> None:
        """One time step of every env: each field `[S, E, ...]`."""
        if self.on_device:
            for name, value in step.items():
                self.data[name].index_copy_(1, self._head_t.view(1), value.unsqueeze(1))
            self._head_t.copy_((self._head_t + 1) % self.steps)
            self._written_t += 1
        else:
            for name, value in step.items():
                self.data[name][:, self.head].copy_(value, non_blocking=True)
        self.written += 1

    def sample(self, batch: int, length: int = 1) -> dict[str, torch.Tensor]:
        """`batch` windows of `length` consecutive steps per seed: fields `[S, length, B, ...]`.

        A window never spans the write head, where old and new data meet; it may span an
        episode boundary, which the stored flags mark.
        """
        if self.on_device:  # uniform over the windows, counted on the device
            # (no host count is read: a compiled or captured sample holds for any fill)
            valid = self._written_t.clamp(max=self.steps)
            u = self.uniform(torch.Size((self.seeds, batch)), torch.float64)
            draws = (u * ((valid - length + 1) * self.num_envs)).long()
            head = self._head_t
        else:
            valid = min(self.written, self.steps)
            if valid < length:
                raise ValueError(f"{valid} stored steps cannot give windows of {length}")
            starts_per_env = valid - length + 1
            draws = torch.stack(
                [
                    torch.randint(
                        starts_per_env * self.num_envs, (batch,), generator=g, device=g.device
                    )
                    for g in self.generators
                ]
            ).to(self.storage)
            head = self.head
        offset, env = draws // self.num_envs, draws % self.num_envs
        oldest = (head - valid) % self.steps
        time = (
            oldest
            + offset.unsqueeze(1)
            + torch.arange(length, device=self.storage).view(1, length, 1)
        ) % self.steps  # [S, L, B]
        # One flat row index per sample: index_select is far cheaper than indexing three axes.
        rows = ((self._rows * self.steps + time) * self.num_envs + env.unsqueeze(1)).flatten()
        out = {
            name: value.view(-1, *value.shape[3:])
            .index_select(0, rows)
            .view(*time.shape, *value.shape[3:])
            for name, value in self.data.items()
        }
        if self.storage != self.device:
            out = {k: v.to(self.device, non_blocking=True) for k, v in out.items()}
        return out

    def keep(self, index: torch.Tensor, generators: list[torch.Generator]) -> None:
        """Only seed rows `index` go on, each with its contents, drawing from `generators`."""

        def cut(value: torch.Tensor) -> torch.Tensor:
            kept = value.index_select(0, index.to(value.device))
            return kept.pin_memory() if value.is_pinned() else kept

        self.data = {name: cut(value) for name, value in self.data.items()}
        self.nbytes = self.nbytes // self.seeds * len(generators)
        self.seeds, self.generators = len(generators), generators
        self._rows = torch.arange(self.seeds, device=self.storage).view(self.seeds, 1, 1)

    def _uniform(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        draws = [
            torch.rand(shape[1:], generator=g, device=g.device, dtype=dtype)
            for g in self.generators
        ]
        return torch.stack(draws)

    def state_dict(self, index: int | None = None) -> dict:
        """The contents (seed `index`'s only, if given), oldest step first."""
        valid = min(self.written, self.steps)
        order = (torch.arange(valid, device=self.storage) + self.head - valid) % self.steps
        pick = slice(None) if index is None else slice(index, index + 1)
        return {
            "data": {k: v[pick][:, order].cpu() for k, v in self.data.items()},
            "written": self.written,
        }

    def load_state_dicts(self, states: list[dict]) -> None:
        """Seed by seed, the inverse of `state_dict(index)`; one state for all seeds also works."""
        for name, value in self.data.items():
            stored = torch.cat([s["data"][name] for s in states])
            valid = min(stored.shape[1], self.steps)
            value[:, :valid].copy_(stored[:, stored.shape[1] - valid :])
        self.written = int(states[0]["written"])
        head = min(self.written, self.steps) % self.steps
        self._shift = (head - self.written) % self.steps
        if self.on_device:
            self._head_t.fill_(head)
            self._written_t.fill_(self.written)


def transition_fields(info, hidden: dict[str, int] | None = None) -> dict[str, Field]:
    """The fields of a multi-agent transition for `info`'s groups.

    Per group g: `obs/g`, `next_obs/g` `[n, *obs]`, `action/g` (`[n]` long or `[n, A]`),
    `reward/g`, `active/g`, `next_active/g` `[n]`, `mask/g`, `next_mask/g` where the group has
    action masks, and `hidden/g` `[n, H]` (the recurrent state entering the step) where
    `hidden` gives a size. Per env: `state`, `next_state`, `terminated`, `first` (an episode
    starts at this step).
    """
    fields = {
        "state": Field((info.state_dim,)),
        "next_state": Field((info.state_dim,)),
        "terminated": Field((), torch.bool),
        "first": Field((), torch.bool),
    }
    for g in info.groups:
        n = g.n_agents
        stored = getattr(torch, g.obs_storage)  # uint8 frames stay uint8
        fields[f"obs/{g.name}"] = Field((n, *g.obs_shape), stored)
        fields[f"next_obs/{g.name}"] = Field((n, *g.obs_shape), stored)
        fields[f"action/{g.name}"] = (
            Field((n,), torch.long) if g.discrete else Field((n, g.n_actions))
        )
        fields[f"reward/{g.name}"] = Field((n,))
        fields[f"active/{g.name}"] = Field((n,), torch.bool)
        fields[f"next_active/{g.name}"] = Field((n,), torch.bool)
        if g.mask_source is not None:
            fields[f"mask/{g.name}"] = Field((n, g.n_actions), torch.bool)
            fields[f"next_mask/{g.name}"] = Field((n, g.n_actions), torch.bool)
        if hidden and hidden.get(g.name):
            fields[f"hidden/{g.name}"] = Field((n, hidden[g.name]))
    return fields


def transition(ob, nxt, actions, rewards, terminated, first, hidden=None) -> dict:
    """One step of split (`[S, E, ...]`) observations and results as `transition_fields`."""
    step = {
        "state": ob.state,
        "next_state": nxt.state,
        "terminated": terminated,
        "first": first,
    }
    for name, obs in ob.obs.items():
        step[f"obs/{name}"] = obs
        step[f"next_obs/{name}"] = nxt.obs[name]
        step[f"action/{name}"] = actions[name]
        step[f"reward/{name}"] = rewards[name]
        step[f"active/{name}"] = ob.active[name]
        step[f"next_active/{name}"] = nxt.active[name]
        if ob.masks.get(name) is not None:
            step[f"mask/{name}"] = ob.masks[name]
            step[f"next_mask/{name}"] = nxt.masks[name]
        if hidden and hidden.get(name) is not None:
            step[f"hidden/{name}"] = hidden[name]
    return step
