"""The stand-in's game: players walk a 6x6 torus and eat apples, which regrow. Each player sees
the 5x5 cells around it, 8 pixels a cell, as Melting Pot's substrates draw their views."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

SIZE, VIEW, SPRITE, LENGTH = 6, 5, 8, 30
MOVES = ((0, 0), (-1, 0), (0, 1), (1, 0), (0, -1), (0, 0), (0, 0), (0, 0))  # 8 actions
COLOURS = {"apple": (0, 200, 0), "player": (200, 0, 0), "self": (0, 0, 200)}


@dataclass(frozen=True)
class Spec:
    shape: tuple[int, ...]
    dtype: type = np.uint8
    name: str = ""


@dataclass(frozen=True)
class DiscreteArray:
    num_values: int


class StepType:
    FIRST, MID, LAST = 0, 1, 2


@dataclass(frozen=True)
class TimeStep:
    step_type: int
    reward: list
    discount: float
    observation: list

    def first(self) -> bool:
        return self.step_type == StepType.FIRST

    def last(self) -> bool:
        return self.step_type == StepType.LAST


class Game:
    """`players` players; `focal` of them are exposed, the others move by `bot` (a scenario's
    background population). The episode seed is drawn from Python's `random`, as Melting
    Pot's builder draws its Lua seed."""

    def __init__(self, players: int, focal: int | None = None):
        self.players, self.focal = players, players if focal is None else focal
        self.seed = random.randint(1, 2**31 - 1)
        self.rng = np.random.default_rng(self.seed)
        self.pos = np.zeros((players, 2), int)
        self.apples = np.zeros((SIZE, SIZE), bool)
        self.t = 0

    def observation_spec(self) -> list[dict[str, Spec]]:
        side = VIEW * SPRITE
        world = SIZE * SPRITE
        one = {
            "RGB": Spec((side, side, 3)),
            "READY_TO_SHOOT": Spec((), np.float64),
            "COLLECTIVE_REWARD": Spec((), np.float64),
            "WORLD.RGB": Spec((world, world, 3)),
        }
        return [dict(one) for _ in range(self.focal)]

    def action_spec(self) -> list[DiscreteArray]:
        return [DiscreteArray(len(MOVES)) for _ in range(self.focal)]

    def reset(self) -> TimeStep:
        self.t = 0
        self.pos = self.rng.integers(0, SIZE, (self.players, 2))
        self.apples = self.rng.random((SIZE, SIZE)) < 0.4
        return self._timestep(StepType.FIRST, np.zeros(self.players))

    def step(self, actions) -> TimeStep:
        joint = list(actions) + [self._bot(i) for i in range(self.focal, self.players)]
        rewards = np.zeros(self.players)
        for i, a in enumerate(joint):
            self.pos[i] = (self.pos[i] + MOVES[int(a)]) % SIZE
            r, c = self.pos[i]
            if self.apples[r, c]:
                self.apples[r, c] = False
                rewards[i] = 1.0
        self.apples |= self.rng.random((SIZE, SIZE)) < 0.03
        self.t += 1
        kind = StepType.LAST if self.t >= LENGTH else StepType.MID
        return self._timestep(kind, rewards)

    def _bot(self, i: int) -> int:
        return int(self.rng.integers(1, 5))  # a background player wanders

    def _cells(self, me: int) -> np.ndarray:
        cells = np.zeros((SIZE, SIZE, 3), np.uint8)
        cells[self.apples] = COLOURS["apple"]
        for j, (r, c) in enumerate(self.pos):
            cells[r, c] = COLOURS["self" if j == me else "player"]
        return cells

    def _timestep(self, kind: int, rewards: np.ndarray) -> TimeStep:
        world = np.kron(self._cells(-1), np.ones((SPRITE, SPRITE, 1), np.uint8))
        half = VIEW // 2
        observations = []
        for i in range(self.focal):
            r, c = self.pos[i]
            rows, cols = (
                np.arange(r - half, r + half + 1) % SIZE,
                np.arange(c - half, c + half + 1) % SIZE,
            )
            view = self._cells(i)[np.ix_(rows, cols)]
            observations.append(
                {
                    "RGB": np.kron(view, np.ones((SPRITE, SPRITE, 1), np.uint8)),
                    "READY_TO_SHOOT": np.float64(1.0),
                    "COLLECTIVE_REWARD": np.float64(rewards.sum()),
                    "WORLD.RGB": world,
                }
            )
        reward = [np.float64(r) for r in rewards[: self.focal]]
        return TimeStep(kind, reward, 1.0, observations)

    def close(self) -> None:
        pass
