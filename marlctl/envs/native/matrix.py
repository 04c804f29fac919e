"""Repeated cooperative matrix games: the climbing and penalty games (Claus & Boutilier 1998,
"The Dynamics of Reinforcement Learning in Cooperative Multiagent Systems").

Two agents each pick one of three actions and both receive the payoff of the pair. The
best joint action sits next to heavy miscoordination penalties, so independent learners
and value factorisations that average over the other agent's exploration settle on a
safer, worse joint action (relative overgeneralisation; Wei & Luke 2016). A small test of
coordination, used in the QTRAN and weighted-QMIX papers.

Observation: each agent sees the fraction of the episode played; the state is the same.
Episodes are `max_cycles` rounds (default 1: the one-shot game) and end by termination:
the game is over, nothing is left to bootstrap. Native only: no PettingZoo original.
"""

from __future__ import annotations

from typing import Any

import torch

from marlctl.envs.native.base import NativeEnv, group
from marlctl.envs.native.params import number

CLIMBING = [[11.0, -30.0, 0.0], [-30.0, 7.0, 6.0], [0.0, 0.0, 5.0]]


def penalty(k: float) -> list[list[float]]:
    return [[k, 0.0, 10.0], [0.0, 2.0, 0.0], [10.0, 0.0, k]]


class MatrixGame(NativeEnv):
    max_cycles = 1

    def payoff(self, **params: Any) -> list[list[float]]:
        raise NotImplementedError

    def build(self, **params: Any):
        self.table = torch.tensor(self.payoff(**params), **self._like)
        return [group("player", 2, 1, 3)], 1

    def start(self, n: int) -> dict[str, torch.Tensor]:
        return {"rounds": torch.zeros(n, device=self.device)}

    def observe(self):
        played = (self.rounds / self.max_cycles).to(self.dtype).unsqueeze(-1)  # [E, 1]
        return {"player": played.unsqueeze(1).expand(-1, 2, 1)}, played, {}

    def advance(self, actions: dict[str, torch.Tensor]):
        a = actions["player"].long()
        reward = self.table[a[:, 0], a[:, 1]]
        self.rounds = self.rounds + 1
        return {"player": reward.unsqueeze(-1).expand(-1, 2)}, self.rounds >= self.max_cycles


class Climbing(MatrixGame):
    """Optimum 11 at (0, 0), flanked by -30; the safe (2, 2) pays 5."""

    env_id = "matrix/climbing"

    def payoff(self) -> list[list[float]]:
        return CLIMBING


class Penalty(MatrixGame):
    """Two optima of 10 at (0, 2) and (2, 0); miscoordinating on them pays `k` (<= 0)."""

    env_id = "matrix/penalty"

    def payoff(self, k: float = -100.0) -> list[list[float]]:
        if number("k", k) > 0:
            raise ValueError(f"k must be 0 or below, not {k}")
        return penalty(float(k))
