"""Small PettingZoo ParallelEnvs for tests, named in specs as `toy_envs:factory`."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


def crashing_spread(crash_at: int = 50, **params):
    """MPE simple_spread that raises after `crash_at` steps (a broken env mid-training)."""
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(**params)
    step, count = env.step, {"n": 0}

    def crashing_step(actions):
        count["n"] += 1
        if count["n"] > crash_at:
            raise RuntimeError(f"simulated env failure at step {count['n']}")
        return step(actions)

    env.step = crashing_step
    return env


def dying_spread(die_at: int = 500, marker: str = "", **params):
    """MPE simple_spread whose process kills itself (SIGKILL) after `die_at` steps of one env.

    Only while `marker` does not exist yet: it is created just before the kill, so the
    resumed run trains on undisturbed.
    """
    import os
    import signal
    from pathlib import Path

    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(**params)
    step, count = env.step, {"n": 0}

    def dying_step(actions):
        count["n"] += 1
        if count["n"] >= die_at and marker and not Path(marker).exists():
            try:  # atomic: of several processes only the one that creates the marker dies
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return step(actions)
            os.kill(os.getpid(), signal.SIGKILL)
        return step(actions)

    env.step = dying_step
    return env


class MaskedRelay(ParallelEnv):
    """Heterogeneous agents with action masks.

    Two `scout`s (obs 4, Discrete(4), dict obs with an action mask) and one `carrier`
    (obs 6, Box(-1, 1, (2,))). A scout's mask forbids one action per step; taking a forbidden
    action is counted in `MaskedRelay.violations`. Scouts are rewarded for matching the
    allowed action named by their observation; the carrier for pushing its action towards
    a target in its observation. Episodes last `max_cycles` steps.
    """

    metadata = {"name": "masked_relay_v0"}
    violations = 0

    def __init__(self, max_cycles: int = 8, leave_at: int = 0):
        self.possible_agents = ["scout_0", "scout_1", "carrier_0"]
        self.max_cycles = max_cycles
        self.leave_at = leave_at  # scout_1 leaves the episode after this many steps (0: never)
        self._obs = {
            a: spaces.Dict(
                {
                    "observation": spaces.Box(-1, 1, (4,), np.float32),
                    "action_mask": spaces.MultiBinary(4),
                }
            )
            for a in self.possible_agents[:2]
        }
        self._obs["carrier_0"] = spaces.Box(-1, 1, (6,), np.float32)
        self._act = {a: spaces.Discrete(4) for a in self.possible_agents[:2]}
        self._act["carrier_0"] = spaces.Box(-1, 1, (2,), np.float32)
        self.rng = np.random.default_rng()

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._act[agent]

    def _observe(self):
        out = {}
        for i, agent in enumerate(self.possible_agents[:2]):
            obs = np.zeros(4, np.float32)
            obs[self.targets[i]] = 1.0
            mask = np.ones(4, np.int8)
            mask[self.forbidden[i]] = 0
            out[agent] = {"observation": obs, "action_mask": mask}
        out["carrier_0"] = np.concatenate([self.goal, np.zeros(4, np.float32)]).astype(np.float32)
        return out

    def _draw(self):
        self.targets = self.rng.integers(0, 4, size=2)
        self.forbidden = (self.targets + self.rng.integers(1, 4, size=2)) % 4
        self.goal = self.rng.uniform(-1, 1, size=2).astype(np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        self._draw()
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        rewards = {}
        for i, agent in enumerate(self.possible_agents[:2]):
            if agent not in actions:
                continue
            action = int(actions[agent])
            if action == self.forbidden[i]:
                MaskedRelay.violations += 1
            rewards[agent] = 1.0 if action == self.targets[i] else 0.0
        push = np.asarray(actions["carrier_0"], np.float32)
        rewards["carrier_0"] = float(-np.abs(push - self.goal).sum())
        self.t += 1
        done = self.t >= self.max_cycles
        self._draw()
        obs = {a: o for a, o in self._observe().items() if a in self.agents}
        leaving = self.leave_at and self.t == self.leave_at and "scout_1" in self.agents
        terms = {a: bool(leaving and a == "scout_1") for a in self.agents}
        truncs = {a: done for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        elif leaving:
            self.agents.remove("scout_1")
        return obs, rewards, terms, truncs, infos

    def state(self):
        obs = self._observe()
        return np.concatenate(
            [obs["scout_0"]["observation"], obs["scout_1"]["observation"], obs["carrier_0"]]
        ).astype(np.float32)

    @property
    def state_space(self):
        return spaces.Box(-1, 1, (14,), np.float32)


def masked_relay(**params):
    return MaskedRelay(**params)


class TwoStepGame(ParallelEnv):
    """The two-step cooperative game of the QMIX paper (Rashid et al. 2018, §6.1).

    In state 1 agent_0's action picks the second state: 2A (every joint action pays 7) or 2B
    (pays [[0, 1], [1, 8]]). Both agents observe the state one-hot and get the team reward at
    the second step, then the episode terminates. VDN's additive value cannot represent 2B
    well enough to prefer it and settles for 7; QMIX's monotonic mixer on the state finds 8.
    """

    metadata = {"name": "two_step_v0"}
    PAYOFF_2B = np.array([[0.0, 1.0], [1.0, 8.0]])

    def __init__(self):
        self.possible_agents = ["agent_0", "agent_1"]
        self._obs = spaces.Box(0, 1, (3,), np.float32)
        self._act = spaces.Discrete(2)

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        return self._act

    def _observe(self):
        obs = np.zeros(3, np.float32)
        obs[self.stage] = 1.0
        return {a: obs.copy() for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.stage = 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        a0, a1 = int(actions["agent_0"]), int(actions["agent_1"])
        if self.stage == 0:
            self.stage = 1 + a0  # 1 = 2A, 2 = 2B
            reward, done = 0.0, False
        else:
            reward = 7.0 if self.stage == 1 else float(self.PAYOFF_2B[a0, a1])
            done = True
        obs = self._observe()
        agents = list(self.agents)
        if done:
            self.agents = []
        return (
            obs,
            {a: reward for a in agents},
            {a: done for a in agents},
            {a: False for a in agents},
            {a: {} for a in agents},
        )

    def state(self):
        obs = np.zeros(3, np.float32)
        obs[self.stage] = 1.0
        return obs

    @property
    def state_space(self):
        return spaces.Box(0, 1, (3,), np.float32)


def two_step(**params):
    return TwoStepGame(**params)


class ConstantReward(ParallelEnv):
    """Two agents paid `bonus` every step for `max_cycles` steps, whatever they do: the
    episode return is exactly `bonus * max_cycles`, a known objective for sweep tests."""

    metadata = {"name": "constant_reward", "is_parallelizable": True}

    def __init__(self, bonus: float = 1.0, max_cycles: int = 5):
        self.bonus, self.max_cycles = float(bonus), max_cycles
        self.possible_agents = ["a_0", "a_1"]
        self.agents = list(self.possible_agents)
        self._t = 0

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (1,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def state(self):
        return np.array([self._t / self.max_cycles], np.float32)

    def reset(self, seed=None, options=None):
        self.agents, self._t = list(self.possible_agents), 0
        return {a: self.state() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self._t += 1
        obs = {a: self.state() for a in self.agents}
        return _timed(self, obs, {a: self.bonus for a in self.agents})


def _timed(env, obs: dict, rewards: dict):
    """A step's result for a game that only ends at its time limit (`env.max_cycles`)."""
    done = env._t >= env.max_cycles
    truncated = {a: done for a in env.agents}
    result = obs, rewards, {a: False for a in env.agents}, truncated, {a: {} for a in env.agents}
    if done:
        env.agents = []
    return result


def constant_reward(**params):
    return ConstantReward(**params)


class SignalGame:
    """A turn-based (AEC) game whose first mover is paid on the other player's move.

    `first` moves, then `second`; each picks 0 or 1. On `second`'s move the game ends and
    both get 1 if both picked 1, else 0: `first`'s reward arrives on a step it does not act
    on, so a learner that ends an agent's return at its own step never credits it.
    Observations: whose turn it is, one-hot.
    """

    def __new__(cls, **params):
        from pettingzoo import AECEnv
        from pettingzoo.utils import wrappers

        class Env(AECEnv):
            metadata = {"name": "signal_game", "render_modes": []}

            def __init__(self, rounds: int = 1):
                super().__init__()
                self.possible_agents = ["first", "second"]
                self.rounds = rounds
                self._obs = spaces.Box(0.0, 1.0, (2,), np.float32)
                self._act = spaces.Discrete(2)

            def observation_space(self, agent):
                return self._obs

            def action_space(self, agent):
                return self._act

            def observe(self, agent):
                turn = self.possible_agents.index(self.agent_selection)
                return np.eye(2, dtype=np.float32)[turn]

            def reset(self, seed=None, options=None):
                self.agents = list(self.possible_agents)
                self.rewards = {a: 0.0 for a in self.agents}
                self._cumulative_rewards = {a: 0.0 for a in self.agents}
                self.terminations = {a: False for a in self.agents}
                self.truncations = {a: False for a in self.agents}
                self.infos = {a: {} for a in self.agents}
                self.agent_selection, self.picks = "first", []

            def step(self, action):
                agent = self.agent_selection
                if self.terminations[agent] or self.truncations[agent]:
                    self._was_dead_step(action)
                    return
                self.picks.append(int(action))
                self.rewards = {a: 0.0 for a in self.agents}
                if agent == "second":
                    paid = float(self.picks == [1, 1])
                    self.rewards = {a: paid for a in self.agents}
                    self.terminations = {a: True for a in self.agents}
                self.agent_selection = "second" if agent == "first" else "first"
                self._accumulate_rewards()

        return wrappers.OrderEnforcingWrapper(Env(**params))


def signal_game(**params):
    return SignalGame(**params)


def still(obs, mask, group):
    """A scripted policy (`groups.NAME.scripted: toy_envs:still`): every agent takes action 0
    (MPE's no-op), or the zero vector of a continuous group."""
    import torch

    shape = obs.shape[:2] if group.discrete else (*obs.shape[:2], group.n_actions)
    return torch.zeros(shape, dtype=torch.long if group.discrete else torch.float32)


def wrong_shape(obs, mask, group):
    """A scripted policy that returns one action per env instead of one per agent."""
    import torch

    return torch.zeros(obs.shape[0], dtype=torch.long)


def _spaces(kind: str):
    """An observation space of each kind PettingZoo envs use, by name."""
    return {
        "box": spaces.Box(-1, 1, (3,), np.float32),
        "discrete": spaces.Discrete(4, start=1),
        "multidiscrete": spaces.MultiDiscrete([2, 3]),
        "multibinary": spaces.MultiBinary(3),
        "dict": spaces.Dict({"cell": spaces.Discrete(3), "pos": spaces.Box(-1, 1, (2,))}),
        "tuple": spaces.Tuple((spaces.MultiBinary(2), spaces.Discrete(2))),
        "masked": spaces.Dict(
            {"observation": spaces.Discrete(3), "action_mask": spaces.MultiBinary(2)}
        ),
        "text": spaces.Text(8),
        "sequence": spaces.Sequence(spaces.Discrete(2)),
        "graph": spaces.Graph(spaces.Box(0, 1, (2,)), None),
        "dict_of_text": spaces.Dict({"name": spaces.Text(8), "cell": spaces.Discrete(3)}),
    }[kind]


class ParityGame(ParallelEnv):
    """Agents paid 1 each for matching their binary action to the step count's parity, for
    `max_cycles` steps; a subclass says what they observe (`_observe`)."""

    max_cycles: int

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _observe(self) -> dict:
        raise NotImplementedError

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        rewards = {a: float(int(actions[a]) == self.t % 2) for a in self.agents}
        self.t += 1
        done = self.t >= self.max_cycles
        obs = self._observe()
        agents = list(self.agents)
        if done:
            self.agents = []
        return (
            obs,
            rewards,
            {a: False for a in agents},
            {a: done for a in agents},
            {a: {} for a in agents},
        )


class SpaceZoo(ParityGame):
    """Two agents that observe a space of kind `space` (`_spaces`): at step t, agent i sees
    the space's t-th value of a fixed sequence (`observe`), so a test knows every value.
    Both get reward 1 for action 1 on odd steps, for action 0 on even ones; episodes last
    `max_cycles` steps."""

    metadata = {"name": "space_zoo_v0"}

    def __init__(self, space: str = "discrete", max_cycles: int = 5):
        self.kind, self.max_cycles = space, max_cycles
        self.space = _spaces(space)
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []

    def observation_space(self, agent):
        return self.space

    def observe(self, t: int, i: int):
        """The value agent i observes at step t."""
        k = t + i
        return {
            "box": np.array([k % 2, -0.5, 0.25], np.float32),
            "discrete": 1 + k % 4,
            "multidiscrete": np.array([k % 2, k % 3]),
            "multibinary": np.array([k % 2, (k // 2) % 2, 1], np.int8),
            "dict": {"cell": k % 3, "pos": np.array([0.5, -0.5], np.float32)},
            "tuple": (np.array([1, k % 2], np.int8), k % 2),
            "masked": {"observation": k % 3, "action_mask": np.array([1, 1], np.int8)},
        }.get(self.kind)  # the spaces marlctl refuses are never read

    def _observe(self):
        return {a: self.observe(self.t, i) for i, a in enumerate(self.possible_agents)}


def space_zoo(**params):
    return SpaceZoo(**params)


class Meetup(ParityGame):
    """Three agents that observe 8 values each (24 together) and a global state of 8
    values from `state()`, with no `state_space`, as PettingZoo allows. The state is the
    step count, one-hot over 8; every agent is paid for matching its action to t's parity."""

    metadata = {"name": "meetup_v0"}

    def __init__(self, max_cycles: int = 6, grow_state_at: int = 0):
        self.max_cycles = max_cycles
        self.grow_state_at = grow_state_at  # a broken env: state() longer from this step on
        self.possible_agents = [f"agent_{i}" for i in range(3)]
        self.agents: list[str] = []

    def observation_space(self, agent):
        return spaces.Box(0, 1, (8,), np.float32)

    def state(self):
        size = 9 if self.grow_state_at and self.t >= self.grow_state_at else 8
        return np.eye(size, dtype=np.float32)[self.t % 8]

    def _observe(self):
        return {a: np.full(8, i / 3, np.float32) for i, a in enumerate(self.agents)}


def meetup(**params):
    return Meetup(**params)


class SpotTheSquare(ParallelEnv):
    """Agents that see RGB frames (uint8 `[size, size, 3]`): each frame shows a bright square
    in one of its four quadrants, in a random colour channel, on a dim noisy background, and
    an agent is paid 1 for naming the square's quadrant (Discrete(4)). Each agent has its own
    frame; `max_cycles` steps an episode. Random play earns a quarter of the steps; a policy
    that reads the frames, every step. With `state`, the global state is every agent's frame
    side by side (uint8 `[size, size * agents, 3]`), as pistonball's is its screen."""

    metadata = {"name": "spot_the_square", "is_parallelizable": True}

    def __init__(self, size: int = 12, agents: int = 2, max_cycles: int = 8, state=False):
        self.size, self.max_cycles = size, max_cycles
        self.possible_agents = [f"looker_{i}" for i in range(agents)]
        self.agents = list(self.possible_agents)
        self._rng = np.random.default_rng(0)
        self._t, self._where, self._last = 0, {}, {}
        if state:
            shape = (size, size * agents, 3)
            self.state_space = spaces.Box(0, 255, shape, np.uint8)
            self.state = lambda: np.concatenate([self._last[a] for a in self.possible_agents], 1)

    def observation_space(self, agent):
        return spaces.Box(0, 255, (self.size, self.size, 3), np.uint8)

    def action_space(self, agent):
        return spaces.Discrete(4)

    def _frames(self) -> dict:
        frames = {}
        half = self.size // 2
        for agent in self.agents:
            frame = self._rng.integers(0, 40, (self.size, self.size, 3), dtype=np.uint8)
            quadrant = int(self._rng.integers(4))
            top, left = (quadrant // 2) * half, (quadrant % 2) * half
            side = half // 2 + 1
            row = top + int(self._rng.integers(half - side + 1))
            col = left + int(self._rng.integers(half - side + 1))
            frame[row : row + side, col : col + side, int(self._rng.integers(3))] = 255
            frames[agent], self._where[agent] = frame, quadrant
        self._last = frames
        return frames

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents, self._t = list(self.possible_agents), 0
        return self._frames(), {a: {} for a in self.agents}

    def step(self, actions):
        self._t += 1
        rewards = {a: float(int(actions[a]) == self._where[a]) for a in self.agents}
        return _timed(self, self._frames(), rewards)


def spot_the_square(**params):
    return SpotTheSquare(**params)
