"""Gymnasium multi-agent envs with tuple spaces, as PettingZoo ParallelEnvs.

Level-based foraging (`lbforaging`) and the multi-robot warehouse (`rware`) are Gymnasium
envs whose observation and action spaces are tuples with one entry per agent, whose reward
is a list and whose episode end is one flag for all agents: the interface EPyMARL calls
`gymma`. `TupleSpaceEnv` presents them as ParallelEnvs (agents `agent_0`, `agent_1`, ...), so
the PettingZoo backend batches them like any other env. As in EPyMARL:

- `common_reward: true` gives every agent the team's reward, the sum (or, with
  `reward_scalarisation: mean`, the mean) of the agents' own; `false` keeps each agent's.
- An episode cut by the time limit is truncated, not terminated: a warehouse episode only
  ever ends that way, a foraging episode is terminated once every food is collected.
- Level-based foraging's legal moves (no walking into food, walls or other players; loading
  only next to food) are action masks in `infos[agent]["action_mask"]`.

Pure: imports numpy, gymnasium and PettingZoo, and each family's package when its env is
made or described.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from enum import Enum
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from marlctl.envs.signature import FactoryParams

SCALARISATIONS = ("sum", "mean")


class TupleSpaceEnv(ParallelEnv):
    """One Gymnasium env with per-agent tuple spaces, as a ParallelEnv."""

    metadata = {"name": "gymma", "render_modes": ["rgb_array"], "is_parallelizable": True}

    def __init__(
        self,
        family: Family,
        task: str,
        common_reward: bool = False,
        reward_scalarisation: str = "sum",
        render_mode: str | None = None,
        **kwargs: Any,
    ):
        import gymnasium

        if reward_scalarisation not in SCALARISATIONS:
            raise ValueError(
                f"reward_scalarisation must be one of {', '.join(SCALARISATIONS)}, "
                f"not {reward_scalarisation!r}"
            )
        family.load()
        self.family, self.task = family, task
        self.common_reward, self.scalarisation = bool(common_reward), reward_scalarisation
        self.render_mode = render_mode
        # The env class itself, with the task's registered keywords: `gymnasium.make` would
        # take `max_episode_steps` for its own time-limit wrapper, and its passive checker
        # warns on every step about the list reward these envs return.
        spec = family.spec(task)
        make = gymnasium.envs.registration.load_env_creator(spec.entry_point)
        self.env = make(**{**spec.kwargs, **family.from_yaml(kwargs)})
        obs_spaces, act_spaces = self.env.observation_space, self.env.action_space
        if not isinstance(obs_spaces, spaces.Tuple) or not isinstance(act_spaces, spaces.Tuple):
            raise TypeError(f"'{task}' does not have tuple observation and action spaces")
        self.possible_agents = [f"agent_{i}" for i in range(len(obs_spaces))]
        self.agents: list[str] = []
        self._obs = dict(zip(self.possible_agents, obs_spaces.spaces, strict=True))
        self._act = dict(zip(self.possible_agents, act_spaces.spaces, strict=True))
        for agent, space in self._obs.items():
            if not isinstance(space, spaces.Box):
                raise TypeError(
                    f"'{task}': agent {agent} observes {space}; only flat or image (Box) "
                    "observations are supported"
                )

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self._act[agent]

    def reset(self, seed: int | None = None, options: dict | None = None):
        obs, _ = self.env.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        return self._observations(obs), self._infos()

    def step(self, actions: dict[str, Any]):
        joint = [int(actions.get(agent, 0)) for agent in self.possible_agents]
        obs, rewards, done, truncated, _ = self.env.step(joint)
        own = np.asarray(rewards, dtype=np.float64)
        if self.common_reward:
            team = own.sum() if self.scalarisation == "sum" else own.mean()
            own = np.full_like(own, team)
        ended = bool(done or truncated)
        cut = ended and (bool(truncated) or not self.family.solved(self.env))
        agents = self.agents
        reward = {a: float(r) for a, r in zip(self.possible_agents, own, strict=True)}
        terminations = {a: ended and not cut for a in agents}
        truncations = {a: cut for a in agents}
        observations, infos = self._observations(obs), self._infos()
        if ended:
            self.agents = []
        return observations, reward, terminations, truncations, infos

    def _observations(self, obs) -> dict[str, np.ndarray]:
        return {
            a: np.asarray(o, dtype=np.float32)
            for a, o in zip(self.possible_agents, obs, strict=True)
        }

    def _infos(self) -> dict[str, dict]:
        masks = self.family.masks(self.env)
        if masks is None:
            return {a: {} for a in self.possible_agents}
        return {a: {"action_mask": m} for a, m in zip(self.possible_agents, masks, strict=True)}

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return self.env.render(mode="rgb_array")

    def close(self) -> None:
        self.env.close()


class Family:
    """What differs between the tuple-space packages: the module that registers their
    Gymnasium ids, the env class, parameters YAML cannot hold, masks and success."""

    prefix: str = ""  # of marlctl's ids: PREFIX/TASK
    module: str = ""
    entry: str = ""  # "module:Class" of the env
    enums: dict[str, str] = {}  # parameter -> "module:Enum", written in a spec by member name
    hidden: frozenset[str] = frozenset({"render_mode"})

    def load(self) -> None:
        importlib.import_module(self.module)

    def spec(self, task: str):
        """The task's Gymnasium registration; ValueError naming the nearest task if none."""
        import difflib

        import gymnasium

        self.load()
        if task in gymnasium.registry:
            return gymnasium.registry[task]
        close = difflib.get_close_matches(task, list(gymnasium.registry), n=1, cutoff=0.6)
        hint = f"; did you mean '{self.prefix}/{close[0]}'?" if close else ""
        raise ValueError(f"{self.module} registers no task '{task}'{hint}")

    def env_class(self) -> type:
        module, _, name = self.entry.partition(":")
        return getattr(importlib.import_module(module), name)

    def enum(self, name: str) -> type[Enum]:
        module, _, attr = self.enums[name].partition(":")
        return getattr(importlib.import_module(module), attr)

    def from_yaml(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Spec values to the env's: enum members by name, lists as tuples."""
        out = {}
        for key, value in kwargs.items():
            if key in self.enums and isinstance(value, str):
                members = self.enum(key).__members__
                if value.upper() not in members:
                    raise ValueError(f"{key} must be one of {', '.join(members)}, not {value!r}")
                value = members[value.upper()]
            elif isinstance(value, list):
                value = tuple(value)
            out[key] = value
        return out

    def to_yaml(self, value: Any) -> Any:
        if isinstance(value, Enum):
            return value.name
        if isinstance(value, tuple):
            return list(value)
        return value

    def parameters(self, task: str) -> FactoryParams:
        """The task's keyword parameters with their defaults: the env class's, at the values
        the task's registration gives them, and the reward options."""
        registered = self.spec(task).kwargs
        defaults: dict[str, Any] = {"common_reward": False, "reward_scalarisation": "sum"}
        signature = inspect.signature(self.env_class().__init__)
        for p in list(signature.parameters.values())[1:]:
            if p.name in self.hidden or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            value = registered.get(p.name, p.default)
            defaults[p.name] = None if value is inspect.Parameter.empty else self.to_yaml(value)
        return FactoryParams(defaults)

    def masks(self, env: Any) -> list[np.ndarray] | None:
        return None

    def solved(self, env: Any) -> bool:
        """Whether an ended episode ended for good (else its time limit cut it)."""
        return False


class Foraging(Family):
    prefix = "lbf"
    module = "lbforaging"
    entry = "lbforaging.foraging.environment:ForagingEnv"

    def masks(self, env: Any) -> list[np.ndarray]:
        n = env.action_space[0].n
        out = []
        for player in env.players:
            mask = np.zeros(n, dtype=bool)
            mask[[a.value for a in env._valid_actions[player]]] = True
            out.append(mask)
        return out

    def solved(self, env: Any) -> bool:
        return int(env.field.sum()) == 0  # every food collected


class Warehouse(Family):
    prefix = "rware"
    module = "rware"
    entry = "rware.warehouse:Warehouse"
    enums = {
        "reward_type": "rware.warehouse:RewardType",
        "observation_type": "rware.warehouse:ObservationType",
    }
    # Image layers are a list of enums; the default set is kept.
    hidden = frozenset({"render_mode", "image_observation_layers"})


LBF, RWARE = Foraging(), Warehouse()


def _factory(family: Family):
    def make(task: str, **kwargs: Any) -> TupleSpaceEnv:
        return TupleSpaceEnv(family, task, **kwargs)

    make.parameters = functools.partial(family.parameters)  # type: ignore[attr-defined]
    return make


lbf = _factory(LBF)
rware = _factory(RWARE)
