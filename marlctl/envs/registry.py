"""Environment ids, factories, and what an environment looks like (spaces, agent groups).

Pure: imports numpy, gymnasium and PettingZoo, never torch, so `validate` can probe an env.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from marlctl.callables import calling_user_code, standard_library_refusal
from marlctl.envs.signature import FactoryParams, factory_params


@dataclass(frozen=True)
class EnvEntry:
    id: str
    factory: str  # "module:callable" returning a PettingZoo ParallelEnv
    suite: str
    summary: str
    requires: tuple[str, ...] = ()  # modules the env imports beyond its package
    extra: str | None = None  # the marlctl extra that installs `requires` (pyproject.toml)
    # Keywords the factory always gets for this id (a family factory's task name).
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def missing(self) -> tuple[str, ...]:
        """Modules the env needs that are not installed (found without importing them)."""
        modules = (self.factory.split(":")[0].split(".")[0], *self.requires)
        return tuple(m for m in modules if not _importable(m))

    @property
    def installed(self) -> bool:
        return not self.missing

    @property
    def install_hint(self) -> str | None:
        """The command that installs what is missing, or None when nothing is."""
        missing = self.missing
        if not missing:
            return None
        if self.extra is not None:
            return f"pip install 'marlctl[{self.extra}]'"
        return "pip install " + " ".join(DISTRIBUTIONS.get(m, m) for m in missing)


# The distribution that provides a module, where the names differ. MOMAland declares pygame
# (which would overwrite the pygame-ce the SISL envs install) and wandb; the MOMAland envs
# registered here import neither, so it is installed without its declared dependencies.
DISTRIBUTIONS = {"pygame": "pygame-ce", "Box2D": "box2d", "momaland": "--no-deps momaland"}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _latest(package: str, name: str) -> str | None:
    """`package.name_vN` with the highest N that is installed, without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except ImportError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    versions = []
    for folder in spec.submodule_search_locations:
        for path in Path(folder).glob(f"{name}_v*.py"):
            suffix = path.stem.removeprefix(f"{name}_v")
            if suffix.isdigit():
                versions.append(int(suffix))
    return f"{package}.{name}_v{max(versions)}" if versions else None


def _suite(
    prefix: str,
    package: str,
    envs: dict[str, tuple[str, tuple[str, ...]]],
    extra: str | None = None,
):
    for name, (summary, requires) in envs.items():
        module = _latest(package, name)
        if module is not None:
            factory = f"{module}:parallel_env"
            yield EnvEntry(f"{prefix}/{name}", factory, prefix, summary, requires, extra)


MPE = {
    "simple": ("one agent reaches a landmark", ()),
    "simple_spread": ("N agents cover N landmarks, cooperative", ()),
    "simple_adversary": ("good agents hide the target from an adversary", ()),
    "simple_tag": ("predators chase faster prey", ()),
    "simple_push": ("adversary pushes an agent away from its landmark", ()),
    "simple_reference": ("two agents communicate each other's goal", ()),
    "simple_speaker_listener": ("a speaker guides a listener (heterogeneous)", ()),
    "simple_crypto": ("two agents talk privately past an eavesdropper", ()),
    "simple_world_comm": ("leader-led adversaries, forests, food", ()),
    "simple_line": ("agents form a line", ()),
    "simple_formation": ("agents form a shape around a landmark", ()),
    "collect_treasure": ("hunters collect and deposit treasure", ()),
}
SISL = {
    "pursuit": ("pursuers surround evaders on a grid", ("pygame",)),
    "waterworld": ("archea eat food and avoid poison", ("pygame", "pymunk")),
    "multiwalker": ("walkers carry a package", ("pygame", "Box2D")),
}
BUTTERFLY = {
    "knights_archers_zombies": ("knights and archers hold off zombies", ("pygame",)),
    "pistonball": ("pistons move a ball left (image obs)", ("pygame", "pymunk")),
    "cooperative_pong": ("two paddles keep a ball in play (image obs)", ("pygame",)),
}

# Gymnasium envs with tuple spaces (`marlctl.envs.gymma`): the tasks of EPyMARL's benchmark
# (Papoudakis et al. 2021) are listed, with presets; any other id the package registers is
# found by `lookup` too.
LBF_TASKS = (
    "Foraging-8x8-2p-2f-coop-v3",
    "Foraging-2s-8x8-2p-2f-coop-v3",
    "Foraging-8x8-2p-3f-v3",
    "Foraging-10x10-3p-3f-v3",
    "Foraging-2s-10x10-3p-3f-v3",
    "Foraging-15x15-4p-3f-v3",
)
RWARE_TASKS = (
    "rware-tiny-2ag-v2",
    "rware-tiny-4ag-v2",
    "rware-small-4ag-v2",
    "rware-tiny-2ag-hard-v2",
)
_LBF_ID = re.compile(
    r"^Foraging(?P<grid>-grid)?(?P<sight>-\d+s)?-(?P<size>\d+)x\d+-(?P<players>\d+)p-"
    r"(?P<food>\d+)f(?P<coop>-coop)?(-ind)?(-pen)?-v\d+$"
)
_RWARE_ID = re.compile(
    r"^rware(?P<image>-img)?-(?P<size>tiny|small|medium|large)-(?P<agents>\d+)ag"
    r"(?P<difficulty>-easy|-hard)?-v\d+$"
)


def _lbf_summary(task: str) -> str | None:
    m = _LBF_ID.match(task)
    if m is None:
        return None
    sight = f", sight {m['sight'][1:-1]}" if m["sight"] else ""
    coop = ", every food needs all players" if m["coop"] else ""
    return (
        f"level-based foraging: {m['size']}x{m['size']} grid, {m['players']} players, "
        f"{m['food']} food{sight}{coop}"
    )


def _rware_summary(task: str) -> str | None:
    m = _RWARE_ID.match(task)
    if m is None:
        return None
    difficulty = f", {m['difficulty'][1:]} requests" if m["difficulty"] else ""
    return f"robot warehouse: {m['size']}, {m['agents']} robots{difficulty}"


_FAMILIES = {  # prefix -> (factory, summary of a task id, module, extra)
    "lbf": ("marlctl.envs.gymma:lbf", _lbf_summary, "lbforaging", "lbf"),
    "rware": ("marlctl.envs.gymma:rware", _rware_summary, "rware", "rware"),
}


def _family_entry(env_id: str) -> EnvEntry | None:
    """The entry of `PREFIX/TASK` for a tuple-space family task, or None."""
    prefix, _, task = env_id.partition("/")
    if prefix not in _FAMILIES:
        return None
    factory, summary, module, extra = _FAMILIES[prefix]
    text = summary(task)
    if text is None:
        return None
    return EnvEntry(env_id, factory, prefix, text, (module,), extra, (("task", task),))


# Turn-based (AEC) games, one agent acting per step (`marlctl.envs.turns`).
CLASSIC = {
    "tictactoe": ("tic-tac-toe: two players take turns on a 3x3 board (turn-based)", ()),
    "connect_four": ("connect four: two players drop discs into 7 columns (turn-based)", ()),
}


def _turn_based(envs: dict[str, tuple[str, tuple[str, ...]]]):
    for name, (summary, requires) in envs.items():
        module = _latest("pettingzoo.classic", name)
        if module is not None:
            game = (("game", module.rpartition(".")[2]),)
            factory = "marlctl.envs.turns:classic"
            yield EnvEntry(f"classic/{name}", factory, "classic", summary, requires, None, game)


def _vmas():
    from marlctl.envs.vmas import scenario_names

    for name in scenario_names():
        summary = f"VMAS {name.replace('_', ' ')} (batched torch, CPU or GPU)"
        scenario = (("scenario", name),)
        yield EnvEntry(
            f"vmas/{name}", "marlctl.envs.vmas:make", "vmas", summary, (), "vmas", scenario
        )


# Multi-objective envs (MOMAland, Felten et al. 2024): a reward vector per agent, scalarised
# for training by `env.reward_weights`; every objective's return is logged.
MOMALAND = {
    "beach": ("momaland.envs.beach", "mobeach", "beach problem: sections' capacity vs mix"),
    "catch": ("momaland.envs.crazyrl.catch", "catch", "drones catch a moving target"),
    "surround": ("momaland.envs.crazyrl.surround", "surround", "drones surround a target"),
    "escort": ("momaland.envs.crazyrl.escort", "escort", "drones escort a moving target"),
    "multiwalker_stability": (
        "momaland.envs.multiwalker_stability",
        "momultiwalker_stability",
        "walkers carry a package steadily",
    ),
}


def _momaland():
    for name, (package, stem, summary) in MOMALAND.items():
        module = _latest(package, stem)
        if module is not None:
            text = f"{summary} (multi-objective)"
            yield EnvEntry(f"momaland/{name}", f"{module}:parallel_env", "momaland", text)


ENVS: dict[str, EnvEntry] = {
    e.id: e
    for e in [
        *_suite("mpe", "mpe2", MPE),  # mpe2 is one of marlctl's own dependencies
        *_suite("sisl", "pettingzoo.sisl", SISL, extra="sisl"),
        *_suite("butterfly", "pettingzoo.butterfly", BUTTERFLY, extra="butterfly"),
        *(_family_entry(f"lbf/{task}") for task in LBF_TASKS),
        *(_family_entry(f"rware/{task}") for task in RWARE_TASKS),
        *_turn_based(CLASSIC),
        *_vmas(),
        *_momaland(),
    ]
}

_FACTORY_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_VERSIONED = re.compile(r"^(?P<base>.+)_v\d+$")


class EnvLookupError(ValueError):
    """An env id that is neither registered nor an importable `package.module:factory`;
    `module` is the module that was not found, when that is why."""

    def __init__(self, message: str, module: str | None = None):
        super().__init__(message)
        self.module = module


def module_path_hint(module: str, folders: list[Path]) -> str:
    """When `module` was not found but its file is in one of `folders` (the working folder,
    the spec's), what to do: Python searches neither unless told to."""
    parts = module.split(".")
    for folder in dict.fromkeys(f.resolve() for f in folders):
        for relative in (Path(*parts).with_suffix(".py"), Path(*parts, "__init__.py")):
            if (folder / relative).is_file():
                here = folder == Path.cwd().resolve()
                where = "the current folder" if here else str(folder)
                return (
                    f"; {relative} is in {where}, which is not on Python's module search "
                    f"path: run with PYTHONPATH={'.' if here else folder}"
                )
    return ""


def lookup(env_id: str) -> EnvEntry:
    """The registry entry for an id; `mpe/simple_spread_v3` finds `mpe/simple_spread`."""
    if env_id in ENVS:
        return ENVS[env_id]
    from marlctl.envs.native import NATIVE, NATIVE_ONLY

    if env_id in NATIVE_ONLY:
        return EnvEntry(env_id, NATIVE[env_id], "native", NATIVE_ONLY[env_id])
    versioned = _VERSIONED.match(env_id)
    if versioned and versioned.group("base") in ENVS:
        return ENVS[versioned.group("base")]
    family = _family_entry(env_id)
    if family is not None:
        return family
    if _FACTORY_RE.match(env_id):
        return EnvEntry(env_id, env_id, "user", "user factory")
    import difflib

    close = difflib.get_close_matches(env_id, [*ENVS, *NATIVE_ONLY], n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else "; see `marlctl list envs`"
    raise EnvLookupError(
        f"unknown env '{env_id}' (not registered and not package.module:factory){hint}"
    )


def env_package(env_id: str, backend: str = "pettingzoo") -> str:
    """The installed distribution that holds env `env_id`'s code, as `name==version`: the
    package a user factory comes from, the one a registered family wraps (lbforaging,
    vmas, ...), or marlctl for a native env. Without a distribution (a module on the path
    only): its name and why it has no version."""
    from importlib import metadata

    entry = lookup(env_id)
    module = entry.factory.split(":")[0].split(".")[0]
    if backend == "native" or entry.suite == "native":
        module = "marlctl"
    elif module == "marlctl":  # a family marlctl wraps: the package it wraps
        wrapped = {"vmas": "vmas", "classic": "pettingzoo"}.get(entry.suite)
        module = wrapped or (entry.requires[0] if entry.requires else "marlctl")
    # An editable install records no top-level modules: the module's own name then.
    names = metadata.packages_distributions().get(module) or [module]
    for name in names:
        try:
            return f"{name}=={metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return f"{module} (not an installed distribution: no version)"


TRUSTED_FACTORIES_VAR = "MARLCTL_TRUSTED_FACTORIES"


def untrusted_factory(env_id: Any) -> str | None:
    """The factory a spec read from a tracking store would import and call, unless it is a
    registered env or one the user trusts on this machine (`MARLCTL_TRUSTED_FACTORIES`,
    comma-separated, or `--trust-factory`); None when loading that spec runs no user code."""
    if not isinstance(env_id, str) or env_id in ENVS:
        return None
    try:
        entry = lookup(env_id)
    except EnvLookupError:
        return None  # validation reports it; nothing would be imported
    if entry.suite != "user":
        return None
    trusted = {f.strip() for f in os.environ.get(TRUSTED_FACTORIES_VAR, "").split(",")}
    return None if entry.factory in trusted else entry.factory


def import_callable(path: str, purpose: str = "", what: str = "env factory") -> Callable[..., Any]:
    """The callable `package.module:name` names (an env factory, a scripted policy); an
    EnvLookupError says why not. `purpose` ends the import failure's message ("for env X").
    The standard library is refused before anything is imported (`marlctl.callables`)."""
    refusal = standard_library_refusal(path, what)
    if refusal is not None:
        raise EnvLookupError(refusal)
    module_name, _, attr = path.partition(":")
    try:
        with calling_user_code():  # the module's own code runs as it is imported
            obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        missing = getattr(err, "name", None) or ""
        # Not found itself (or its package), rather than a module it imports in turn.
        unfound = bool(missing) and (module_name + ".").startswith(missing + ".")
        raise EnvLookupError(
            f"cannot import '{module_name}'{purpose}: {err}",
            module=module_name if unfound else None,
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EnvLookupError(f"'{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EnvLookupError(f"'{path}' is not callable")
    return obj


def resolve_factory(entry: EnvEntry) -> Callable[..., Any]:
    obj = import_callable(entry.factory, f" for env '{entry.id}'")
    return _Bound(obj, dict(entry.kwargs)) if entry.kwargs else obj


class _Bound:
    """A family factory with its task's keywords filled in."""

    def __init__(self, factory: Callable[..., Any], kwargs: dict[str, Any]):
        self.factory, self.kwargs = factory, kwargs

    def __call__(self, **params: Any) -> Any:
        return self.factory(**self.kwargs, **params)

    def parameters(self) -> FactoryParams:
        return self.factory.parameters(**self.kwargs)


@functools.cache
def env_params(env_id: str) -> FactoryParams:
    """The keyword parameters env `env_id` takes: its factory's, read from the signature
    (`marlctl.envs.signature`), or a native-only env's own. Raises EnvLookupError. Kept
    for the process: a sweep loads its spec once per trial, and reading source is slow."""
    with calling_user_code():
        factory = resolve_factory(lookup(env_id))
        if hasattr(factory, "parameters"):  # a native task or a family: it lists its own
            return factory.parameters()
        return factory_params(factory)


def registered_ids() -> list[str]:
    """Every registered id, in `marlctl list envs` order."""
    from marlctl.envs.native import NATIVE_ONLY

    return [*ENVS, *(i for i in NATIVE_ONLY if i not in ENVS)]


def preset_name(env_id: str) -> str:
    """The env preset of a registered id (`envs=NAME`, file `envs/NAME.yaml`): the id without
    its suite, `mpe/simple_tag` -> `simple_tag`; where suites share a name, the first in
    `marlctl list envs` order keeps it and the others are `suite_name` (`vmas_simple_tag`)."""
    suite, _, name = env_id.rpartition("/")
    for other in registered_ids():
        if other.rpartition("/")[2] == name:
            return name if other == env_id else f"{suite.replace('/', '_')}_{name}"
    return name


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

    @property
    def n_agents(self) -> int:
        return sum(g.n_agents for g in self.groups)


def make_env(env_id: str, params: dict[str, Any], render_mode: str | None = None) -> Any:
    factory = resolve_factory(lookup(env_id))
    kwargs = dict(params)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    return as_parallel(factory(**kwargs))


def as_parallel(env: Any) -> Any:
    """A factory's env as a ParallelEnv: a turn-based (AEC) env is wrapped so that each step
    moves the one agent whose turn it is (`marlctl.envs.turns`)."""
    from pettingzoo import AECEnv

    if isinstance(env, AECEnv):
        from marlctl.envs.turns import TurnBasedEnv

        return TurnBasedEnv(env)
    return env


def _group_name(agents: list[str]) -> str:
    # `adversary_0` and `agent 1` (VMAS's het_mass) name groups `adversary` and `agent`.
    prefixes = {re.sub(r"[\s_-]*\d+$", "", a) for a in agents}
    return prefixes.pop() if len(prefixes) == 1 and "" not in prefixes else "agents"


def _space_key(space: Any) -> str:
    return repr(space)


def describe(env: Any, env_id: str, factory: str) -> EnvInfo:
    """Group a ParallelEnv's agents by space and read shapes, masks and global state."""
    import gymnasium.spaces as spaces

    _, infos = env.reset(seed=0)
    agents = list(env.possible_agents)
    by_key: dict[tuple[str, str], list[str]] = {}
    for agent in agents:
        key = (_space_key(env.observation_space(agent)), _space_key(env.action_space(agent)))
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
        name = _group_name(members)
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
    return EnvInfo(
        env_id,
        factory,
        tuple(groups),
        state_dim,
        state_from_env,
        tuple(agents),
        turn_based,
        objectives,
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
    # A VMAS world is built by torch code: seconds for its larger scenarios on a busy CPU.
    seconds = PROBE_SECONDS * (5 if entry.suite == "vmas" else 1)
    with time_limit(seconds, f"building, resetting and stepping env '{env_id}' once"):
        if entry.suite == "native":  # no PettingZoo original: the env describes itself
            from marlctl.envs.native.base import describe_native

            info = describe_native(factory, params)
        elif entry.suite == "vmas":
            info = describe_vmas(entry.id, dict(entry.kwargs)["scenario"], params)
        else:
            env = as_parallel(factory(**params))
            try:
                info = describe(env, entry.id, entry.factory)
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
