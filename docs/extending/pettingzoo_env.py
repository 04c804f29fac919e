"""Template: a PettingZoo env of your own, trained by naming its factory in a spec.

    env:
      id: pettingzoo_env:parallel_env   # package.module:callable on the Python path
      params: {size: 7}                 # keyword arguments of the factory

Rendezvous: two agents on a line of `size` cells step left, stay or right, and share the
reward minus their distance; the episode ends after `max_cycles` steps. Each agent sees
its own and the other's position, one-hot; `state()` gives both, for centralised critics.
An agent's action mask (in the `info`) forbids stepping off the line.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class Rendezvous(ParallelEnv):
    metadata = {"name": "rendezvous_v0"}

    def __init__(self, size: int = 5, max_cycles: int = 10):
        if size < 2 or max_cycles < 1:
            raise ValueError("size must be at least 2 and max_cycles at least 1")
        self.size, self.max_cycles = int(size), int(max_cycles)
        self.possible_agents = ["walker_0", "walker_1"]
        self.agents: list[str] = []
        self.state_space = spaces.Box(0.0, 1.0, (2 * self.size,), np.float32)
        # One space object per agent: PettingZoo asks for them again and again.
        self._observation_spaces = {a: self.state_space for a in self.possible_agents}
        self._action_spaces = {a: spaces.Discrete(3) for a in self.possible_agents}

    def observation_space(self, agent: str) -> spaces.Space:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_spaces[agent]  # 0 left, 1 stay, 2 right

    def reset(self, seed: int | None = None, options: dict | None = None):
        rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.pos = rng.integers(0, self.size, 2)
        self.steps = 0
        return self._observations(), self._infos()

    def step(self, actions: dict[str, int]):
        for i, agent in enumerate(self.possible_agents):
            self.pos[i] = np.clip(self.pos[i] + int(actions[agent]) - 1, 0, self.size - 1)
        self.steps += 1
        reward = -float(abs(self.pos[0] - self.pos[1]))
        over = self.steps >= self.max_cycles
        obs, infos = self._observations(), self._infos()
        rewards = {a: reward for a in self.agents}
        terminated = {a: False for a in self.agents}
        truncated = {a: over for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, terminated, truncated, infos

    def state(self) -> np.ndarray:
        return self._observations()["walker_0"]

    def _observations(self) -> dict[str, np.ndarray]:
        both = np.zeros((2, self.size), np.float32)
        both[0, self.pos[0]] = both[1, self.pos[1]] = 1.0
        return {
            "walker_0": both.ravel(),
            "walker_1": both[::-1].ravel().copy(),  # own position first
        }

    def _infos(self) -> dict[str, dict]:
        infos = {}
        for i, agent in enumerate(self.possible_agents):
            mask = np.ones(3, np.int8)
            mask[0] = self.pos[i] > 0
            mask[2] = self.pos[i] < self.size - 1
            infos[agent] = {"action_mask": mask}
        return infos


def parallel_env(**params) -> Rendezvous:
    return Rendezvous(**params)
