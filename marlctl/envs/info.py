"""What an environment looks like to the trainers: its agent groups (agents that share observation
and action spaces) with their shapes, and its global state."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class GroupInfo:
    """Agents that share observation and action spaces."""

    name: str
    agents: tuple[str, ...]
    obs_shape: tuple[int, ...]
    obs_dtype: str
    discrete: bool
    n_actions: int  # discrete: number of actions; continuous: action dimension
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    # Where action masks come from: "obs" (a dict observation), "info" (the infos), "env" (a
    # native env that has no other backend computes them), None (no masks).
    mask_source: str | None = None
    # The observations are not a Box: each is flattened as `gymnasium.spaces.flatten` does
    # (one-hots for Discrete, their concatenation for MultiDiscrete, Dict and Tuple members
    # in order), into `obs_shape` float32 values.
    obs_flattened: bool = False

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.obs_shape))

    @property
    def frame_shape(self) -> tuple[int, int, int] | None:
        """The observations as frames `(H, W, C)`, which a convolutional encoder reads; None
        where they are not frames (`frame_of`)."""
        return None if self.obs_flattened else frame_of(self.obs_shape)

    @property
    def channels_first(self) -> bool:
        """The observations hold their channels first (`channels_first`)."""
        return channels_first(self.obs_shape)

    @property
    def obs_storage(self) -> str:
        """The dtype observations travel and are stored in: uint8 frames stay uint8 (a
        quarter of float32; the networks scale them to [0, 1] on the device), others float32."""
        return "uint8" if self.obs_dtype == "uint8" and not self.obs_flattened else "float32"


@dataclass(frozen=True)
class EnvInfo:
    id: str
    factory: str
    groups: tuple[GroupInfo, ...]
    state_dim: int
    state_from_env: bool  # env.state() exists; otherwise observations are concatenated
    agents: tuple[str, ...] = field(default=())
    # One agent acts per step (an AEC game): an agent's return runs across the other
    # players' moves, from one of its turns to its next.
    turn_based: bool = False
    # Objectives of a multi-objective env (MOMAland's vector rewards); 0 = a scalar reward.
    objectives: int = 0
    # The params a `train.schedule` may change while the training env runs (`set_param`).
    schedulable: tuple[str, ...] = ()
    # The global state's shape and dtype as the env's `state_space` gives them where it has
    # more than one dimension; () otherwise (a flat `state_space`, a `state()` alone, the
    # observations side by side, native and VMAS envs): the state is flat float32 values.
    state_shape: tuple[int, ...] = ()
    state_dtype: str = "float32"

    @property
    def state_frame(self) -> tuple[int, int, int] | None:
        """The global state as a frame `(H, W, C)` (pistonball's screen, Melting Pot's map,
        pursuit's grid), which a centralised critic's convolutions read; None where it is
        not one. A state is a frame only with channels: a 2-D one is rather a table (the
        entities of knights-archers-zombies, a row each)."""
        return frame_of(self.state_shape) if len(self.state_shape) == 3 else None

    @property
    def state_channels_first(self) -> bool:
        return channels_first(self.state_shape)

    @property
    def state_storage(self) -> str:
        """The dtype the global state travels from the env in: uint8 frames stay uint8 (a
        quarter of float32) and are scaled to [0, 1] on the device, as observations are."""
        return "uint8" if self.state_dtype == "uint8" and self.state_frame else "float32"

    @property
    def n_agents(self) -> int:
        return sum(g.n_agents for g in self.groups)


def frame_of(shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """`shape` as a frame `(H, W, C)`, or None where it is not one: `[H, W]` is one channel;
    `[H, W, C]` is PettingZoo's image layout, and `[C, H, W]` is read where `channels_first`
    says so."""
    if len(shape) == 2:
        return (shape[0], shape[1], 1)
    if len(shape) != 3:
        return None
    if channels_first(shape):
        return (shape[1], shape[2], shape[0])
    return (shape[0], shape[1], shape[2])


def channels_first(shape: tuple[int, ...]) -> bool:
    """A 3-D shape whose first dimension is at most 4 and smaller than the other two holds
    its channels first (LBF's grid: `[3, 5, 5]`; an image is `[H, W, 3]`)."""
    return len(shape) == 3 and shape[0] <= 4 and shape[0] < min(shape[1], shape[2])


def group_name(agents: list[str]) -> str:
    # `adversary_0` and `agent 1` (VMAS's het_mass) name groups `adversary` and `agent`.
    prefixes = {re.sub(r"[\s_-]*\d+$", "", a) for a in agents}
    return prefixes.pop() if len(prefixes) == 1 and "" not in prefixes else "agents"
