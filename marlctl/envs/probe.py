"""An environment built, reset and stepped once to read its agents, spaces, masks and global state
(`describe`), within a time limit, before any run starts."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Any

import numpy as np

from marlctl.callables import calling_user_code
from marlctl.envs.info import EnvInfo, GroupInfo, group_name
from marlctl.envs.registry import as_parallel, factory_kwargs, lookup, resolve_factory


def _space_key(space: Any) -> str:
    return repr(space)


def describe(env: Any, env_id: str, factory: str, teams_by_name: bool = False) -> EnvInfo:
    """Group a ParallelEnv's agents by space and read shapes, masks and global state; with
    `teams_by_name`, agents of one space whose names differ (`red_0`, `blue_0`: two armies)
    form a group each."""
    import gymnasium.spaces as spaces

    _, infos = env.reset(seed=0)
    agents = list(env.possible_agents)
    by_key: dict[tuple[str, ...], list[str]] = {}
    for agent in agents:
        key = (_space_key(env.observation_space(agent)), _space_key(env.action_space(agent)))
        if teams_by_name:
            key += (group_name([agent]),)
        by_key.setdefault(key, []).append(agent)
    groups: list[GroupInfo] = []
    names: set[str] = set()
    for members in by_key.values():
        obs_space, act_space = env.observation_space(members[0]), env.action_space(members[0])
        mask_source = None
        if isinstance(obs_space, spaces.Dict) and "observation" in obs_space.spaces:
            mask_source = "obs" if "action_mask" in obs_space.spaces else None
            obs_space = obs_space["observation"]
        elif isinstance((infos or {}).get(members[0]), dict) and "action_mask" in infos[members[0]]:
            mask_source = "info"
        flattened = not isinstance(obs_space, spaces.Box)
        if flattened:
            unsupported = _unsupported(obs_space)
            if unsupported is not None:
                part = "" if unsupported is obs_space else f" (its part {unsupported})"
                raise UnsupportedSpace(
                    f"agent '{members[0]}' has an unsupported observation space "
                    f"{obs_space}{part}; supported: {SUPPORTED_OBSERVATIONS}"
                )
            obs_space = spaces.flatten_space(obs_space)
        if isinstance(act_space, spaces.Discrete):
            discrete, n, low, high = True, int(act_space.n), (), ()
        elif isinstance(act_space, spaces.Box):
            discrete, n = False, int(np.prod(act_space.shape))
            low = tuple(float(x) for x in np.broadcast_to(act_space.low, act_space.shape).ravel())
            high = tuple(float(x) for x in np.broadcast_to(act_space.high, act_space.shape).ravel())
        else:
            raise UnsupportedSpace(
                f"agent '{members[0]}' has an unsupported action space {act_space}; "
                f"supported: {SUPPORTED_ACTIONS}"
            )
        name = group_name(members)
        while name in names:
            name += "_"
        names.add(name)
        groups.append(
            GroupInfo(
                name,
                tuple(members),
                tuple(obs_space.shape),
                "float32" if flattened else str(obs_space.dtype),
                discrete,
                n,
                low,
                high,
                mask_source,
                flattened,
            )
        )
    state_dim = _state_dim(env) if _module(env) not in BROKEN_STATE else None
    state_from_env = state_dim is not None
    if state_dim is None:
        state_dim = sum(g.obs_dim * g.n_agents for g in groups)
    turn_based = bool(getattr(env, "turn_based", False))
    objectives = 0
    if callable(getattr(env, "reward_space", None)):  # MOMAland: a reward vector per agent
        objectives = int(np.prod(env.reward_space(agents[0]).shape))
    # A state of more than one dimension keeps its shape and dtype (a frame); a flat one is
    # `state_dim` float32 values, as a native env's is.
    space = getattr(env, "state_space", None) if state_from_env else None
    shaped = space is not None and len(getattr(space, "shape", None) or ()) > 1
    return EnvInfo(
        env_id,
        factory,
        tuple(groups),
        state_dim,
        state_from_env,
        tuple(agents),
        turn_based,
        objectives,
        state_shape=tuple(int(n) for n in space.shape) if shaped else (),
        state_dtype=str(space.dtype) if shaped and space.dtype is not None else "float32",
    )


# Env modules whose `state()` fails partway through episodes: their global state is the
# agents' observations concatenated, as for an env without one.
BROKEN_STATE = {
    # A fallen walker's body is destroyed and `state()` then reads its position
    # (AttributeError): at the end of every episode a fall ends, and mid-episode with
    # terminate_on_fall=False. Observations stay valid (zeros for a fallen walker) and hold
    # almost all the state does: each walker's body and lidar, its neighbours and the
    # package relative to it (the state adds the package's absolute position).
    "pettingzoo.sisl.multiwalker.multiwalker": "state() fails once a walker has fallen",
    # MOMAland's multiwalker is PettingZoo's, with a reward vector: the same failure.
    "momaland.envs.multiwalker_stability.momultiwalker_stability": (
        "state() fails once a walker has fallen"
    ),
    # The live agents' observations concatenated: empty once an episode has ended, where a
    # final state is needed, and the same values as the fallback before.
    "momaland.envs.beach.beach": "state() is empty once an episode has ended",
}


def _module(env: Any) -> str:
    """The module of the env class under a PettingZoo env's wrappers."""
    return type(getattr(env, "unwrapped", env)).__module__


def _has_state(env: Any) -> bool:
    try:
        env.state()
    except (NotImplementedError, AttributeError):
        return False
    return True


def _state_dim(env: Any) -> int | None:
    """The size of the env's global state, or None where it has none: its `state_space`'s,
    or, for an env with `state()` and no `state_space` (PettingZoo does not require one),
    that of the state it returns after a reset."""
    space = getattr(env, "state_space", None)
    if space is not None and getattr(space, "shape", None) is not None:
        return int(np.prod(space.shape)) if _has_state(env) else None
    try:
        state = np.asarray(env.state(), dtype=np.float32)
    except ProbeTimeout:
        raise
    except Exception:  # noqa: BLE001
        # Without a state_space, PettingZoo's own wrappers can fail here (rps_v2's
        # parallel_env calls the dict its AEC env keeps as `state`): no global state, as
        # before one was probed.
        return None
    return int(state.size) or None


class UnsupportedSpace(ValueError):
    """An agent's observation or action space marlctl cannot present to its learners: a
    property of the env, not of its params."""


SUPPORTED_OBSERVATIONS = (
    "Box; Discrete (as a one-hot), MultiDiscrete (concatenated one-hots), MultiBinary (0/1), "
    "and Dict or Tuple of these (flattened as gymnasium.spaces.flatten does); a Dict with "
    "'observation' and 'action_mask' keys gives action masks"
)
SUPPORTED_ACTIONS = "Discrete, or Box (continuous)"


def _unsupported(space: Any) -> Any:
    """The first part of an observation space that cannot be flattened into a fixed number
    of values (Text, Sequence, Graph, OneOf, ...), or None where every part can."""
    import gymnasium.spaces as spaces

    if isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        return None
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        members = space.spaces.values() if isinstance(space, spaces.Dict) else space.spaces
        for member in members:
            found = _unsupported(member)
            if found is not None:
                return found
        return None
    return space


_probed: dict[str, EnvInfo] = {}


def probe(env_id: str, params: dict[str, Any]) -> EnvInfo:
    """Build the env once and describe it; raises EnvLookupError or the factory's own error.

    Descriptions are kept for the process: a sweep checks many specs with the same env.
    """
    import json

    key = json.dumps([env_id, params], sort_keys=True, default=repr)
    if key in _probed:
        return _probed[key]
    with calling_user_code():
        info = _probe(env_id, params)
    _probed[key] = info
    return info


def _probe(env_id: str, params: dict[str, Any]) -> EnvInfo:
    entry = lookup(env_id)
    factory = resolve_factory(entry)  # imports happen here, outside the time limit
    if entry.suite == "vmas":
        import vmas  # noqa: F401  (and torch)

        from marlctl.envs.vmas import describe_vmas
    if entry.suite == "meltingpot":  # imports TensorFlow: seconds, outside the limit
        import meltingpot.scenario  # noqa: F401
    # A VMAS world is built by torch code, a Melting Pot substrate by Lua: seconds for the
    # larger ones on a busy CPU.
    seconds = PROBE_SECONDS * (5 if entry.suite in ("vmas", "meltingpot") else 1)
    with time_limit(seconds, f"building, resetting and stepping env '{env_id}' once"):
        if entry.suite == "native":  # no PettingZoo original: the env describes itself
            from marlctl.envs.native.base import describe_native

            info = describe_native(factory, params)
        elif entry.suite == "vmas":
            info = describe_vmas(entry.id, dict(entry.kwargs)["scenario"], params)
        else:
            env = as_parallel(factory(**factory_kwargs(entry, params)))
            try:
                info = describe(env, entry.id, entry.factory, entry.teams_by_name)
                _step_once(env, info)
            finally:
                env.close()
    return info


# Building, resetting and stepping an env once takes milliseconds; far longer means params
# out of proportion (thousands of agents), and validation must not hang on them.
PROBE_SECONDS = float(os.environ.get("MARLCTL_PROBE_SECONDS", "3"))


def _action_mask(observation: Any, info: Any) -> np.ndarray | None:
    for source in (observation, info):
        if isinstance(source, dict) and "action_mask" in source:
            return np.asarray(source["action_mask"], dtype=np.int8)
    return None


class ProbeTimeout(Exception):
    """The env probe ran past its time limit."""


@contextmanager
def time_limit(seconds: float, what: str):
    """Raise ProbeTimeout in the main thread once `seconds` pass (no limit elsewhere).

    The alarm repeats every tenth of a second until the block ends: code under it that
    swallows an exception (a broad `except` around an attribute lookup, say) gets the next
    one rather than running on unbounded, and a block that swallowed them all still ends in
    ProbeTimeout."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return
    state = {"armed": True, "expired": False}
    message = f"{what} took longer than {seconds:g} s"

    def expire(signum, frame):
        if state["armed"]:
            state["expired"] = True
            raise ProbeTimeout(message)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.1)
    try:
        yield
    finally:
        state["armed"] = False  # first: an alarm on its way now raises nothing
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if state["expired"]:
        raise ProbeTimeout(message)


def _step_once(env: Any, info: EnvInfo) -> None:
    """One step with sampled actions: params that only matter once the env runs (a time
    limit of the wrong type, say) fail here rather than in the first training run."""
    observations, infos = env.reset(seed=0)
    actions = {}
    for agent in env.agents:
        space = env.action_space(agent)
        space.seed(0)
        mask = _action_mask(observations.get(agent), (infos or {}).get(agent))
        actions[agent] = space.sample(mask=mask) if mask is not None else space.sample()
    env.step(actions)
    if info.state_from_env:
        env.state()
