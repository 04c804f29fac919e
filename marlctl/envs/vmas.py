"""The `vmas` backend: VMAS scenarios (Bettini et al. 2022), batched torch on the run's device.

VMAS steps every env of a batch in one set of tensor operations, so this backend hands its
tensors to the trainer as they are: observations per agent `[E, obs]` stacked into groups,
rewards `[E]` per agent, terminated and truncated `[E]` (the time limit is `max_steps`).
Agents with the same observation and action spaces form a group, as on every backend;
heterogeneous scenarios (football's teams, MPE's speaker and listener) get one group each.
Ended envs are reset in place (`reset_at`; all at once when every env ended, as under a
common time limit). VMAS has no global state: a centralised critic reads every agent's
observation, concatenated.

VMAS draws from one random state per process, shared by every VMAS env in it (and from the
device's CUDA generator on a GPU). Each `VmasEnv` keeps a state of its own, seeded by
`reset(seed)`, and swaps it in around every call into VMAS: training and evaluation envs
never draw from each other's stream, and `VmasSeeds` steps one env per seed
(`hardware.batch_seeds`) with each seed's draws exactly those it makes alone.

Scenario parameters are the keywords each scenario's `make_world` reads from its kwargs
(`n_agents`, `shared_rew`, ...), found in its source; `continuous_actions`, `max_steps` and
the other keywords of `vmas.make_env` sit beside them in `env.params`.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import inspect
import textwrap
from typing import Any

from marlctl.envs.signature import FactoryParams

# Keywords of `vmas.make_env` a spec sets, with marlctl's defaults: discrete actions (every
# algorithm takes them), VMAS's benchmark horizon of 100 steps (BenchMARL's `max_steps`).
MAKE_ENV = {"continuous_actions": False, "max_steps": 100, "multidiscrete_actions": False}


# Where VMAS keeps its scenarios; `vmas.make_env` takes each by its bare name. `debug` holds
# the small ones VMAS's heterogeneity work starts from (het_mass: two agents of different
# masses, kinematic_bicycle: two kinds of dynamics).
SCENARIO_FOLDERS = ("scenarios", "scenarios/mpe", "scenarios/debug")


def scenario_names() -> list[str]:
    """VMAS's scenarios, MPE's and the debug ones included (`mpe/simple_spread` is
    `simple_spread`), found without importing VMAS (which imports torch)."""
    try:
        spec = importlib.util.find_spec("vmas")
    except ImportError:
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    from pathlib import Path

    names = []
    for folder in spec.submodule_search_locations:
        for sub in SCENARIO_FOLDERS:
            for path in sorted((Path(folder) / sub).glob("*.py")):
                if not path.stem.startswith("_"):
                    names.append(path.stem)
    return names


def _scenario_module(name: str):
    for folder in SCENARIO_FOLDERS:
        module = f"vmas.{folder.replace('/', '.')}.{name}"
        if importlib.util.find_spec(module) is not None:
            return importlib.import_module(module)
    raise ValueError(f"VMAS has no scenario '{name}'")


@functools.cache
def parameters(scenario: str) -> FactoryParams:
    """`vmas.make_env`'s keywords a spec sets, and the scenario's own: each
    `kwargs.pop("name", default)` or `kwargs.get(...)` of its `make_world` whose default is
    a literal."""
    cls = _scenario_module(scenario).Scenario
    defaults: dict[str, Any] = dict(MAKE_ENV)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.make_world)))
    except (OSError, TypeError, SyntaxError):
        return FactoryParams(defaults, open=True)
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("pop", "get")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "kwargs"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            continue
        name = node.args[0].value
        try:
            defaults.setdefault(
                name, ast.literal_eval(node.args[1]) if len(node.args) > 1 else None
            )
        except ValueError:  # a computed default: the key is taken, null keeps VMAS's value
            defaults.setdefault(name, None)
    return FactoryParams(defaults)


class _Factory:
    """The registry's factory of a VMAS id: its parameters, and the env described."""

    def __call__(self, scenario: str, **params: Any):
        raise TypeError("VMAS scenarios run on env.backend: vmas")

    def parameters(self, scenario: str) -> FactoryParams:
        return parameters(scenario)


make = _Factory()


def describe_vmas(env_id: str, scenario: str, params: dict[str, Any]):
    """The EnvInfo of a scenario with `params`: one env on the CPU, reset and stepped once."""
    import torch

    env = VmasEnv(env_id, scenario, params, 1, torch.device("cpu"))
    ob = env.reset(0)
    env.step(_zero_actions(env.info, ob))
    return env.info


def _zero_actions(info, ob):
    import torch

    out = {}
    for g in info.groups:
        E = ob.obs[g.name].shape[0]
        if g.discrete:
            out[g.name] = torch.zeros(E, g.n_agents, dtype=torch.long)
        else:
            out[g.name] = torch.zeros(E, g.n_agents, g.n_actions)
    return out


class VmasEnv:
    """BatchedEnv over one VMAS environment of `num_envs` envs on `device`."""

    def __init__(
        self,
        env_id: str,
        scenario: str,
        params: dict[str, Any],
        num_envs: int,
        device,
        render_mode: str | None = None,
    ):
        import gym.spaces as old_spaces  # VMAS 1.x describes its spaces with gym
        import torch
        import vmas

        from marlctl.envs.info import EnvInfo, GroupInfo, group_name

        known = parameters(scenario)
        unknown = [k for k in params if not known.accepts(k)]
        if unknown:
            raise TypeError(
                f"VMAS scenario '{scenario}' takes no parameter {', '.join(map(repr, unknown))}"
            )
        kwargs = {**MAKE_ENV, **params}
        kwargs = {k: v for k, v in kwargs.items() if v is not None or k in MAKE_ENV}
        self.device, self.num_envs = torch.device(device), num_envs
        self.render_mode = render_mode
        self.frames: list | None = [] if render_mode else None
        self._random = _seeded_state(0, self.device)
        with self._own_random():
            self.env = vmas.make_env(
                scenario,
                num_envs=num_envs,
                device=self.device,
                dict_spaces=True,
                terminated_truncated=True,
                clamp_actions=True,
                **kwargs,
            )
        names = [a.name for a in self.env.agents]
        by_key: dict[tuple[str, str], list[str]] = {}
        for name in names:
            obs, act = self.env.observation_space[name], self.env.action_space[name]
            by_key.setdefault((repr(obs), repr(act)), []).append(name)
        groups, taken = [], set()
        for members in by_key.values():
            obs, act = self.env.observation_space[members[0]], self.env.action_space[members[0]]
            if not isinstance(obs, old_spaces.Box):
                raise TypeError(f"VMAS agent '{members[0]}' observes {obs}; only Box is supported")
            if isinstance(act, old_spaces.Discrete):
                discrete, n, low, high = True, int(act.n), (), ()
            elif isinstance(act, old_spaces.Box):
                discrete, n = False, int(act.shape[0])
                low = tuple(float(x) for x in act.low.ravel())
                high = tuple(float(x) for x in act.high.ravel())
            else:
                raise TypeError(
                    f"VMAS agent '{members[0]}' has action space {act}; set "
                    "multidiscrete_actions: false"
                )
            name = group_name(members)
            while name in taken:
                name += "_"
            taken.add(name)
            groups.append(
                GroupInfo(name, tuple(members), tuple(obs.shape), "float32", discrete, n, low, high)
            )
        state_dim = sum(g.obs_dim * g.n_agents for g in groups)
        self.info = EnvInfo(env_id, "marlctl.envs.vmas:make", tuple(groups), state_dim, False,
                            tuple(names))  # fmt: skip

    @contextlib.contextmanager
    def _own_random(self):
        """VMAS's process-wide random state (and the device's CUDA generator) set to this
        env's own for the duration, then put back."""
        import torch
        from vmas.simulator.environment.environment import Environment

        shared = Environment.vmas_random_state
        saved = list(shared)
        cuda = self.device.type == "cuda"
        saved_cuda = torch.cuda.get_rng_state(self.device) if cuda else None
        shared[:] = self._random[:3]
        if cuda:
            torch.cuda.set_rng_state(self._random[3], self.device)
        try:
            yield
        finally:
            own = list(shared)
            if cuda:
                own.append(torch.cuda.get_rng_state(self.device))
                torch.cuda.set_rng_state(saved_cuda, self.device)
            self._random = own
            shared[:] = saved

    # ------------------------------------------------------------ BatchedEnv

    def _observation(self, obs: dict):
        import torch

        from marlctl.envs.batch import Observation

        grouped = {
            g.name: torch.stack([obs[a] for a in g.agents], 1).to(torch.float32)
            for g in self.info.groups
        }
        E = self.num_envs
        state = torch.cat([o.reshape(E, -1) for o in grouped.values()], -1)
        active = {
            g.name: torch.ones(E, g.n_agents, dtype=torch.bool, device=self.device)
            for g in self.info.groups
        }
        return Observation(grouped, state, {g.name: None for g in self.info.groups}, active)

    def reset(self, seed: int):
        with self._own_random():
            self.env.seed(seed)
            obs = self.env.reset()
            self._frame()
        return self._observation(obs)

    def step(self, actions: dict):
        import torch

        joint = {}
        for g in self.info.groups:
            a = actions[g.name]
            for j, agent in enumerate(g.agents):
                joint[agent] = a[:, j] if g.discrete else a[:, j].to(torch.float32)
        with self._own_random():
            return self._step(joint)

    def _step(self, joint: dict):
        import torch

        from marlctl.envs.batch import Transition

        obs, rewards, terminated, truncated, _ = self.env.step(joint)
        E = self.num_envs
        self._frame()
        rew = {
            g.name: torch.stack([rewards[a].reshape(E) for a in g.agents], 1).float()
            for g in self.info.groups
        }
        terminated, truncated = terminated.reshape(E).bool(), truncated.reshape(E).bool()
        truncated = truncated & ~terminated
        done = terminated | truncated
        after = self._observation(obs)
        ended = done.nonzero().flatten().tolist()
        if not ended:
            return Transition(after, rew, terminated, truncated, after)
        if len(ended) == self.num_envs:
            obs = self.env.reset()
        else:
            for index in ended:
                self.env.reset_at(index, return_observations=False)
            obs = self.env.get_from_scenario(
                get_observations=True, get_rewards=False, get_infos=False, get_dones=False,
                dict_agent_names=True,
            )[0]  # fmt: skip
        self._frame()
        return Transition(self._observation(obs), rew, terminated, truncated, after)

    def _frame(self) -> None:
        if self.frames is not None:
            self.frames.append(self.env.render(mode="rgb_array", env_index=0))

    def close(self) -> None:
        pass


def _seeded_state(seed: int, device) -> list:
    """A VMAS random state (torch, numpy, random) as `vmas.Environment.seed(seed)` leaves
    it, and on a GPU the device generator's current one."""
    import random

    import numpy as np
    import torch

    state = [
        torch.Generator().manual_seed(seed).get_state(),
        np.random.RandomState(seed).get_state(),
        random.Random(seed).getstate(),
    ]
    if device.type == "cuda":  # reseeded by the first `reset(seed)`
        state.append(torch.cuda.get_rng_state(device))
    return state


class VmasSeeds:
    """BatchedEnv over one `VmasEnv` per seed (`hardware.batch_seeds`), rows seed-major
    `[S * E, ...]`. Each seed's env steps with its own random state, so a seed computes what
    it computes alone; the trainer sees one batch."""

    def __init__(
        self, env_id: str, scenario: str, params: dict[str, Any], num_envs: int, device, seeds: int
    ):
        self.envs = [VmasEnv(env_id, scenario, params, num_envs, device) for _ in range(seeds)]
        self.info, self.device = self.envs[0].info, self.envs[0].device
        self.num_envs, self.frames = num_envs * seeds, None

    def reset(self, seeds):
        return _joined([env.reset(s) for env, s in zip(self.envs, seeds, strict=True)])

    def step(self, actions: dict):
        import torch

        E = self.envs[0].num_envs
        parts = [
            env.step({k: v[i * E : (i + 1) * E] for k, v in actions.items()})
            for i, env in enumerate(self.envs)
        ]
        nxt = _joined([tr.next for tr in parts])
        return parts[0]._replace(
            next=nxt,
            rewards={k: torch.cat([tr.rewards[k] for tr in parts]) for k in nxt.obs},
            terminated=torch.cat([tr.terminated for tr in parts]),
            truncated=torch.cat([tr.truncated for tr in parts]),
            # `final is next` where no episode ended: the trainer then skips bootstrapping
            final=nxt
            if all(tr.final is tr.next for tr in parts)
            else _joined([tr.final for tr in parts]),
        )

    def keep_blocks(self, keep: list[int]) -> None:
        """Only seeds `keep` (in that order) go on; the others' envs close."""
        for index, env in enumerate(self.envs):
            if index not in keep:
                env.close()
        self.envs = [self.envs[i] for i in keep]
        self.num_envs = self.envs[0].num_envs * len(keep)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _joined(parts: list):
    """The seeds' observations as one batch, seed-major."""
    import torch

    from marlctl.envs.batch import Observation

    def cat(field: str) -> dict:
        return {
            k: None if v is None else torch.cat([getattr(p, field)[k] for p in parts])
            for k, v in getattr(parts[0], field).items()
        }

    state = torch.cat([p.state for p in parts])
    return Observation(cat("obs"), state, cat("masks"), cat("active"))
