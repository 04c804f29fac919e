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
        where they are not frames. `[H, W]` is one channel; `[H, W, C]` is PettingZoo's image
        layout, and `[C, H, W]` is read where `channels_first` says so."""
        shape = self.obs_shape
        if self.obs_flattened or len(shape) not in (2, 3):
            return None
        if len(shape) == 2:
            return (shape[0], shape[1], 1)
        if self.channels_first:
            return (shape[1], shape[2], shape[0])
        return (shape[0], shape[1], shape[2])

    @property
    def channels_first(self) -> bool:
        """A 3-D observation whose first dimension is at most 4 and smaller than the other two
        holds its channels first (LBF's grid: `[3, 5, 5]`; an image is `[H, W, 3]`)."""
        shape = self.obs_shape
        return len(shape) == 3 and shape[0] <= 4 and shape[0] < min(shape[1], shape[2])

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

    @property
    def n_agents(self) -> int:
        return sum(g.n_agents for g in self.groups)


def group_name(agents: list[str]) -> str:
    # `adversary_0` and `agent 1` (VMAS's het_mass) name groups `adversary` and `agent`.
    prefixes = {re.sub(r"[\s_-]*\d+$", "", a) for a in agents}
    return prefixes.pop() if len(prefixes) == 1 and "" not in prefixes else "agents"
