"""Turn-based PettingZoo (AEC) envs, as ParallelEnvs in which one agent acts per step.

An AEC env steps one agent at a time (`agent_selection`), and every agent's reward can
change on any step (a player who loses gets -1 on the winner's move). `TurnBasedEnv` turns
each of those steps into a step of a ParallelEnv whose `agents` is the one agent to act:
the batched backend then marks the others inactive, so their actions are ignored and they
are masked out of the loss; each step's rewards reach every agent. Trainers treat such an
env as turn-based (`EnvInfo.turn_based`): an agent's return runs from one of its turns to
its next, across the other players' moves. Legal-action masks come from the dict
observation's `action_mask`, as the classic games give them.

With `opponent: random` one seat plays uniformly random legal moves inside the env, a
different seat each episode, drawn from the env's seed: the env is then a one-agent env
(`player`), whose steps are the learner's own moves and whose reward is its seat's, so any
algorithm trains on it and its return is the learner's score against that opponent. In
tic-tac-toe, `opponent: minimax` plays perfectly instead (a solved game: the best a learner
can do against it is a draw), picking among its best moves at random.

`CycleParallel` steps PettingZoo's own parallel conversion of an AEC env whose agents all act
each cycle (the butterfly and sisl envs) without computing each agent's observation twice.

Pure: imports numpy and PettingZoo.
"""

from __future__ import annotations

import importlib
import re
from collections import defaultdict
from functools import cache
from typing import Any

import numpy as np
from pettingzoo import ParallelEnv
from pettingzoo.utils.conversions import aec_to_parallel_wrapper

from marlctl.envs.signature import FactoryParams, factory_params

OPPONENTS = ("random", "minimax")
SOLVED = {"minimax": ("tictactoe",)}  # the games a perfect opponent is written for
LEARNER = "player"  # the one agent of an env with a scripted opponent


class TurnBasedEnv(ParallelEnv):
    """An AEC env as a ParallelEnv of one acting agent per step."""

    turn_based = True

    def __init__(self, aec: Any):
        self.aec = aec
        self.possible_agents = list(aec.possible_agents)
        self.agents: list[str] = []
        self.metadata = dict(getattr(aec, "metadata", {}))
        self.render_mode = getattr(aec, "render_mode", None)

    def observation_space(self, agent: str):
        return self.aec.observation_space(agent)

    def action_space(self, agent: str):
        return self.aec.action_space(agent)

    def reset(self, seed: int | None = None, options: dict | None = None):
        self.aec.reset(seed=seed, options=options)
        self._skip_dead()
        return self._observations(), self._infos()

    def step(self, actions: dict[str, Any]):
        agent = self.aec.agent_selection
        self.aec.step(actions[agent])
        # The rewards of this move, for every agent (the AEC env clears them on the next).
        rewards = {a: float(self.aec.rewards.get(a, 0.0)) for a in self.possible_agents}
        terms = {a: bool(self.aec.terminations.get(a, True)) for a in self.possible_agents}
        truncs = {a: bool(self.aec.truncations.get(a, False)) for a in self.possible_agents}
        observations, infos = self._observations(), self._infos()
        self._skip_dead()
        return observations, rewards, terms, truncs, infos

    def _skip_dead(self) -> None:
        """Remove the agents whose game is over (the AEC way: a None step each) until a live
        agent is to act; `agents` is then that agent, or empty once every agent is out."""
        aec = self.aec
        while aec.agents and (
            aec.terminations[aec.agent_selection] or aec.truncations[aec.agent_selection]
        ):
            aec.step(None)
        self.agents = [aec.agent_selection] if aec.agents else []

    def _observations(self) -> dict[str, Any]:
        return {a: self.aec.observe(a) for a in self.possible_agents}

    def _infos(self) -> dict[str, dict]:
        return {a: dict(self.aec.infos.get(a, {})) for a in self.possible_agents}

    def state(self):
        return self.aec.state()

    def render(self):
        return self.aec.render()

    def close(self) -> None:
        self.aec.close()


class AgainstOpponent(ParallelEnv):
    """An AEC game against a scripted opponent: one learner, a random seat per episode."""

    turn_based = False  # the learner acts on every step

    def __init__(self, aec: Any, opponent: str, game: str = ""):
        if opponent not in OPPONENTS:
            raise ValueError(
                f"opponent must be one of {', '.join(OPPONENTS)} or null, not {opponent!r}"
            )
        name = re.sub(r"_v\d+$", "", game)
        if opponent in SOLVED and name not in SOLVED[opponent]:
            raise ValueError(
                f"opponent {opponent} plays {', '.join(SOLVED[opponent])} only, not {name}"
            )
        self.aec, self.opponent = aec, opponent
        self.seats = list(aec.possible_agents)
        self.possible_agents, self.agents = [LEARNER], []
        self.metadata = dict(getattr(aec, "metadata", {}))
        self.render_mode = getattr(aec, "render_mode", None)
        self.rng = np.random.default_rng()
        self.seat = self.seats[0]

    def observation_space(self, agent: str):
        return self.aec.observation_space(self.seats[0])

    def action_space(self, agent: str):
        return self.aec.action_space(self.seats[0])

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.aec.reset(seed=seed, options=options)
        self.seat = self.seats[int(self.rng.integers(len(self.seats)))]
        self._play_opponent()
        self.agents = [LEARNER]
        return self._observation(), self._info()

    def step(self, actions: dict[str, Any]):
        self.aec.step(actions[LEARNER])
        reward = float(self.aec.rewards.get(self.seat, 0.0))
        reward += self._play_opponent()
        over = self._over()
        term = over and not bool(self.aec.truncations.get(self.seat, False))
        trunc = over and not term
        observation, info = self._observation(), self._info()
        if over:
            self.agents = []
        return observation, {LEARNER: reward}, {LEARNER: term}, {LEARNER: trunc}, info

    def _over(self) -> bool:
        aec = self.aec
        return (
            self.seat not in aec.agents or aec.terminations[self.seat] or aec.truncations[self.seat]
        )

    def _play_opponent(self) -> float:
        """The opponent's moves until the learner is to move or the game is over; the
        learner's rewards on them."""
        aec, reward = self.aec, 0.0
        while aec.agents and aec.agent_selection != self.seat and not self._over():
            agent = aec.agent_selection
            if aec.terminations[agent] or aec.truncations[agent]:
                aec.step(None)
                continue
            seen = aec.observe(agent)
            if self.opponent == "minimax":
                moves = best_moves(*tictactoe_board(seen["observation"]))
            else:
                moves = np.flatnonzero(np.asarray(seen["action_mask"], bool))
            aec.step(int(self.rng.choice(moves)))
            reward += float(aec.rewards.get(self.seat, 0.0))
        return reward

    def _observation(self) -> dict[str, Any]:
        return {LEARNER: self.aec.observe(self.seat)}

    def _info(self) -> dict[str, dict]:
        return {LEARNER: dict(self.aec.infos.get(self.seat, {}))}

    def render(self):
        return self.aec.render()

    def close(self) -> None:
        self.aec.close()


def classic(game: str, opponent: str | None = None, **kwargs: Any) -> ParallelEnv:
    """`pettingzoo.classic.GAME`'s AEC env: turn-based, every seat an agent; or, with
    `opponent`, one learner against that scripted player."""
    aec = _module(game).env(**kwargs)
    return TurnBasedEnv(aec) if opponent is None else AgainstOpponent(aec, opponent, game)


# ---------------------------------------------------------------- tic-tac-toe, solved

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def tictactoe_board(observation: Any) -> tuple[int, int]:
    """The mover's and the other player's squares as 9-bit masks, from tic-tac-toe's
    observation `[3, 3, 2]` (square k at row k // 3, column k % 3; action k marks it)."""
    planes = np.asarray(observation).reshape(9, 2)
    mine = sum(1 << k for k in range(9) if planes[k, 0])
    theirs = sum(1 << k for k in range(9) if planes[k, 1])
    return mine, theirs


def _won(squares: int) -> bool:
    return any(all(squares >> k & 1 for k in line) for line in LINES)


@cache
def solve(mine: int, theirs: int) -> int:
    """The game's value for the player to move: 1 win, 0 draw, -1 loss, with best play."""
    if _won(theirs):
        return -1
    free = [k for k in range(9) if not (mine | theirs) >> k & 1]
    if not free:
        return 0
    return max(-solve(theirs, mine | 1 << k) for k in free)


def best_moves(mine: int, theirs: int) -> list[int]:
    """Every move that keeps the mover's best value; the winning ones where it can win now."""
    free = [k for k in range(9) if not (mine | theirs) >> k & 1]
    now = [k for k in free if _won(mine | 1 << k)]
    if now:
        return now
    values = {k: -solve(theirs, mine | 1 << k) for k in free}
    best = max(values.values())
    return [k for k, v in values.items() if v == best]


def _parameters(game: str) -> FactoryParams:
    found = factory_params(_module(game).env)
    return FactoryParams({"opponent": None, **found.defaults}, found.open)


classic.parameters = _parameters  # type: ignore[attr-defined]


def _module(game: str):
    return importlib.import_module(f"pettingzoo.classic.{game}")


# ---------------------------------------------------------------- every agent each cycle


class CycleParallel(aec_to_parallel_wrapper):
    """PettingZoo's own conversion of an AEC env whose agents all act each cycle
    (`aec_to_parallel`: the `parallel_env()` of the butterfly and sisl envs), without the
    observation its step computes and drops before every agent's move (`last()`): the same
    moves, rewards, episode ends and observations, half the `observe` calls. Observing is
    most of a step in the pixel envs (a crop of the screen for every agent)."""

    def step(self, actions):
        aec = self.aec_env
        rewards: dict = defaultdict(int)
        for agent in aec.agents:
            if agent != aec.agent_selection:
                ended = aec.terminations[agent] or aec.truncations[agent]
                raise AssertionError(
                    f"expected agent {agent}, got agent {aec.agent_selection}"
                    + (" ended" if ended else "")
                    + ": the parallel conversion expects agents to step in a cycle and to "
                    "leave only at its end"
                )
            aec.step(actions[agent])
            for other in aec.agents:
                rewards[other] += aec.rewards[other]
        terminations, truncations = dict(**aec.terminations), dict(**aec.truncations)
        infos = dict(**aec.infos)
        observations = {agent: aec.observe(agent) for agent in aec.agents}
        while aec.agents and (
            aec.terminations[aec.agent_selection] or aec.truncations[aec.agent_selection]
        ):
            aec.step(None)
        self.agents = aec.agents
        return observations, rewards, terminations, truncations, infos


def cycle_parallel(env: Any) -> Any:
    """`env`, stepped by `CycleParallel` where it is PettingZoo's own conversion (not a
    subclass, which may step differently)."""
    if type(env) is aec_to_parallel_wrapper:
        env.__class__ = CycleParallel
    return env
