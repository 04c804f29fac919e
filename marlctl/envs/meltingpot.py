"""Melting Pot's substrates and scenarios (Leibo et al. 2021; Agapiou et al. 2023) as
PettingZoo ParallelEnvs.

A substrate is a dm_env environment of several players: each step takes one discrete action
per player and returns a `TimeStep` whose `observation` is one dict per player and whose
`reward` is one value per player. `MeltingPotEnv` presents it as a ParallelEnv of agents
`player_0`, `player_1`, ..., so the PettingZoo backend batches it like any other env:

- `observation: rgb` (the default): each player's `RGB` view, `[88, 88, 3]` uint8 frames
  the `cnn` encoder reads (`model.cnn.downsample: 8` gives one pixel per sprite, as the
  substrates draw 8x8 sprites). `observation: vector`: the player's other permitted
  observations (`READY_TO_SHOOT`, `INVENTORY`, ...; `scenario.PERMITTED_OBSERVATIONS`),
  flattened in name order, for an MLP.
- The global state is `WORLD.RGB`, the whole map, averaged over `state_downsample` x
  `state_downsample` blocks (one value per cell at 8) and scaled to [0, 1]: a frame, which
  a centralised critic reads through convolutions under `model.encoder: cnn`.
- An episode ends for every player at once; a `LAST` step with discount 0 is a
  termination, any other `LAST` step (the substrates' episode length) a truncation.
- `scenario: NAME` builds one of the substrate's scenarios instead: the agents are its focal
  players only and the background population (bots the package loads from its assets)
  plays the other slots. The mean return of the agents is then the focal per-capita
  return, the score Melting Pot defines for a population.

A substrate is rebuilt at every reset (the package's own `ResetWrapper` does that), so
episodes are not reproducible from a seed: Melting Pot draws the Lua simulation's seed from
Python's `random` module and places players by it, and two substrates built with the same
seed start differently. `reset(seed)` seeds Python's `random` for the rebuild and nothing
more.

Pure: imports numpy, gymnasium and PettingZoo, and `meltingpot` when an env is made.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

OBSERVATIONS = ("rgb", "vector")


def _module(name: str):
    return importlib.import_module(f"meltingpot.{name}")


class MeltingPotEnv(ParallelEnv):
    """One Melting Pot substrate (or scenario) as a ParallelEnv."""

    metadata = {"name": "meltingpot", "render_modes": ["rgb_array"], "is_parallelizable": True}

    def __init__(
        self,
        substrate: str,
        scenario: str | None = None,
        observation: str = "rgb",
        state_downsample: int = 8,
        render_mode: str | None = None,
    ):
        if observation not in OBSERVATIONS:
            raise ValueError(
                f"observation must be one of {', '.join(OBSERVATIONS)}, not {observation!r}"
            )
        if int(state_downsample) < 1:
            raise ValueError(f"state_downsample must be 1 or more, not {state_downsample!r}")
        substrates, scenarios = _module("substrate"), _module("scenario")
        if substrate not in substrates.SUBSTRATES:
            raise ValueError(f"Melting Pot has no substrate {substrate!r}")
        if scenario is not None:
            own = sorted(scenarios.SCENARIOS_BY_SUBSTRATE.get(substrate, ()))
            if scenario not in own:
                raise ValueError(
                    f"{scenario!r} is not a scenario of {substrate}; its scenarios: "
                    f"{', '.join(own) or 'none'}"
                )
        self.substrate, self.scenario, self.observation = substrate, scenario, observation
        self.state_downsample, self.render_mode = int(state_downsample), render_mode
        self._permitted = frozenset(scenarios.PERMITTED_OBSERVATIONS)
        self._env = self._build()
        specs = self._env.observation_spec()
        self.possible_agents = [f"player_{i}" for i in range(len(specs))]
        self.agents: list[str] = []
        spec = specs[0]
        self._vector_keys = sorted(k for k in spec if k in self._permitted and k != "RGB")
        if observation == "rgb":
            if "RGB" not in spec:
                raise ValueError(f"{substrate}'s players observe no RGB view")
            shape = tuple(spec["RGB"].shape)
            self._obs_space = spaces.Box(0, 255, shape, np.uint8)
        else:
            if not self._vector_keys:
                raise ValueError(f"{substrate}'s players have no vector observations")
            size = sum(int(np.prod(spec[k].shape)) for k in self._vector_keys)
            self._obs_space = spaces.Box(-np.inf, np.inf, (size,), np.float32)
        self._actions = spaces.Discrete(int(self._env.action_spec()[0].num_values))
        # The substrate's map, which a scenario's focal players do not observe: its state
        # keeps the substrate's size, zeros (only training's critics read it).
        world = substrates.get_factory(substrate).timestep_spec().observation.get("WORLD.RGB")
        height, width = (0, 0) if world is None else world.shape[:2]
        d = self.state_downsample
        self._state_shape = (height // d, width // d, 3)
        self.state_space = spaces.Box(0.0, 1.0, self._state_shape, np.float32)  # a frame
        self._last: Any = None

    def _build(self, seed: int | None = None):
        """The substrate (or scenario), built with Python's `random` seeded by `seed`."""
        saved = random.getstate()
        if seed is not None:
            random.seed(seed)
        try:
            if self.scenario is not None:
                return _module("scenario").build(self.scenario)
            substrates = _module("substrate")
            roles = substrates.get_config(self.substrate).default_player_roles
            return substrates.build(self.substrate, roles=roles)
        finally:
            random.setstate(saved)

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._actions

    def _observe(self, player: dict[str, Any]) -> np.ndarray:
        if self.observation == "rgb":
            return np.asarray(player["RGB"], np.uint8)
        values = [np.asarray(player[k], np.float32).ravel() for k in self._vector_keys]
        return np.concatenate(values)

    def _observations(self, timestep) -> dict[str, np.ndarray]:
        return {a: self._observe(o) for a, o in zip(self.agents, timestep.observation, strict=True)}

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:  # a fresh build from the seeded draw
            self._env.close()
            self._env = self._build(seed)
        self._last = self._env.reset()
        self.agents = list(self.possible_agents)
        return self._observations(self._last), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]):
        joint = [int(actions[a]) for a in self.possible_agents]
        self._last = timestep = self._env.step(joint)
        agents = self.agents
        obs = self._observations(timestep)
        rewards = {a: float(r) for a, r in zip(agents, timestep.reward, strict=True)}
        ended = timestep.last()
        terminated = ended and float(np.asarray(timestep.discount)) == 0.0
        terms = dict.fromkeys(agents, bool(terminated))
        truncs = dict.fromkeys(agents, bool(ended and not terminated))
        infos = {a: {} for a in agents}
        if ended:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def _world_rgb(self) -> np.ndarray | None:
        if self._last is None:
            return None
        first = self._last.observation[0]
        return None if "WORLD.RGB" not in first else np.asarray(first["WORLD.RGB"])

    def state(self) -> np.ndarray:
        world = self._world_rgb()
        if world is None:
            return np.zeros(self.state_space.shape, np.float32)
        d, (h, w, _) = self.state_downsample, self._state_shape
        blocks = world[: h * d, : w * d].reshape(h, d, w, d, 3).mean((1, 3), dtype=np.float32)
        return blocks / 255.0

    def render(self) -> np.ndarray | None:
        return self._world_rgb()

    def close(self) -> None:
        self._env.close()


def make(
    substrate: str,
    scenario: str | None = None,
    observation: str = "rgb",
    state_downsample: int = 8,
    render_mode: str | None = None,
) -> MeltingPotEnv:
    """Melting Pot substrate `substrate`, or its scenario `scenario` (focal players only)."""
    return MeltingPotEnv(substrate, scenario, observation, state_downsample, render_mode)
