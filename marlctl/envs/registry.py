"""Environment ids and their factories: an id looked up (registered, native, a family task or
`package.module:factory`), the factory imported and called, its parameters read. Pure: imports
numpy, gymnasium and PettingZoo, never torch, so `validate` can probe an env."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from marlctl.callables import calling_user_code, standard_library_refusal
from marlctl.envs import families
from marlctl.envs.families import EnvEntry
from marlctl.envs.signature import FactoryParams, factory_params

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
    if env_id in families.ENVS:
        return families.ENVS[env_id]
    from marlctl.envs.native import NATIVE, NATIVE_ONLY

    if env_id in NATIVE_ONLY:
        return EnvEntry(env_id, NATIVE[env_id], "native", NATIVE_ONLY[env_id])
    versioned = _VERSIONED.match(env_id)
    if versioned and versioned.group("base") in families.ENVS:
        return families.ENVS[versioned.group("base")]
    family = families.family_entry(env_id)
    if family is not None:
        return family
    if _FACTORY_RE.match(env_id):
        return EnvEntry(env_id, env_id, "user", "user factory")
    import difflib

    close = difflib.get_close_matches(env_id, [*families.ENVS, *NATIVE_ONLY], n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else "; see `marlctl list envs`"
    raise EnvLookupError(
        f"unknown env '{env_id}' (not registered and not package.module:factory){hint}"
    )


@functools.cache
def _distributions(where: tuple[str, ...] | None) -> dict[str, list[str]]:
    """Top-level modules -> the installed distributions that provide them, from the
    distributions recorded in the folders `where` (all of `sys.path` for None): a scan, done
    once a process per folder set."""
    from importlib import metadata

    if where is None:
        return metadata.packages_distributions()
    found: dict[str, list[str]] = {}
    for dist in metadata.distributions(path=list(where)):
        tops = (dist.read_text("top_level.txt") or "").split()
        if not tops:
            tops = {f.parts[0].removesuffix(".py") for f in dist.files or () if f.parts}
        for top in tops:
            found.setdefault(top, []).append(dist.metadata["Name"])
    return found


def _folder_of(module: str) -> tuple[str, ...] | None:
    """The `sys.path` folder `module` is imported from (found, not imported), where a
    distribution holding it would be recorded; None where it cannot be found."""
    from importlib.util import find_spec

    try:
        found = find_spec(module)
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    from pathlib import Path

    if found.submodule_search_locations is not None:  # a package: the folders holding it
        folders = {str(Path(p).parent) for p in found.submodule_search_locations}
    elif found.has_location and found.origin:  # a module file
        folders = {str(Path(found.origin).parent)}
    else:
        return None
    return tuple(sorted(folders)) or None


def _distribution_names(module: str) -> list[str]:
    """The distributions that may hold top-level `module`: the one of its own name unless its
    record names other modules only (a lookup: most env packages), else those recorded
    beside the module (a module on the path with no distribution beside it has none)."""
    from importlib import metadata

    try:
        top = metadata.distribution(module).read_text("top_level.txt")
    except metadata.PackageNotFoundError:
        top = ""
    # No record (an editable install, a wheel not built by setuptools): its own name.
    if top is None or module in top.split():
        return [module]
    return _distributions(_folder_of(module)).get(module) or [module]  # recorded nowhere


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
    for name in _distribution_names(module):
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
    if not isinstance(env_id, str) or env_id in families.ENVS:
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
    if entry.suite != "user" and entry.missing:  # a registered env whose package is missing
        needs = ", ".join(entry.missing)
        raise EnvLookupError(
            f"env '{entry.id}' needs {needs}, which is not installed: {entry.install_hint}"
        )
    return _bound(entry)


def _bound(entry: EnvEntry) -> Callable[..., Any]:
    obj = import_callable(entry.factory, f" for env '{entry.id}'")
    return _Bound(obj, dict(entry.kwargs)) if entry.kwargs else obj


class _Bound:
    """A family factory with its task's keywords filled in."""

    def __init__(self, factory: Callable[..., Any], kwargs: dict[str, Any]):
        self.factory, self.kwargs = factory, kwargs

    def __call__(self, **params: Any) -> Any:
        return self.factory(**self.kwargs, **params)

    def parameters(self) -> FactoryParams:
        """The family's own list for its task, or its signature's keywords but the task's."""
        if hasattr(self.factory, "parameters"):
            return self.factory.parameters(**self.kwargs)
        found = factory_params(self.factory)
        kept = {k: v for k, v in found.defaults.items() if k not in self.kwargs}
        return FactoryParams(kept, found.open)


@functools.cache
def env_params(env_id: str) -> FactoryParams:
    """The keyword parameters env `env_id` takes: its factory's, read from the signature
    (`marlctl.envs.signature`), or a native-only env's own. Raises EnvLookupError. Kept
    for the process: a sweep loads its spec once per trial, and reading source is slow."""
    with calling_user_code():
        entry = lookup(env_id)
        # A family marlctl wraps names its parameters without its package (Melting Pot's).
        own = entry.factory.startswith("marlctl.") and entry.suite == "meltingpot"
        factory = _bound(entry) if own else resolve_factory(entry)
        if hasattr(factory, "parameters"):  # a native task or a family: it lists its own
            return factory.parameters()
        return factory_params(factory)


def registered_ids() -> list[str]:
    """Every registered id, in `marlctl list envs` order."""
    from marlctl.envs.native import NATIVE_ONLY

    return [*families.ENVS, *(i for i in NATIVE_ONLY if i not in families.ENVS)]


def backends(env_id: str) -> list[str]:
    """The backends env `env_id` runs on (`env.backend`), its preset's first: a native-only env
    natively, a PettingZoo env with a native twin on both, a VMAS scenario on VMAS."""
    from marlctl.envs.native import NATIVE_ONLY, is_native

    if env_id in NATIVE_ONLY:
        return ["native"]
    if is_native(env_id):
        return ["pettingzoo", "native"]
    return ["vmas"] if lookup(env_id).suite == "vmas" else ["pettingzoo"]


PREFIXED_PRESETS = frozenset({"hanabi", "pogema"})


def preset_name(env_id: str) -> str:
    """The env preset of a registered id (`envs=NAME`, file `envs/NAME.yaml`): the id without
    its suite, `mpe/simple_tag` -> `simple_tag`; where suites share a name, the first in
    `marlctl list envs` order keeps it and the others are `suite_name` (`vmas_simple_tag`).
    Suites whose task names say little alone always prefix them (`hanabi_2p`,
    `pogema_random`)."""
    suite, _, name = env_id.rpartition("/")
    if suite in PREFIXED_PRESETS:
        return f"{suite}_{name}"
    for other in registered_ids():
        if other.rpartition("/")[2] == name:
            return name if other == env_id else f"{suite.replace('/', '_')}_{name}"
    return name


# Modules of envs that draw the screen their observations are cut from only under a render
# mode: made without one, every agent sees the reset frame (or the bare background) for the
# whole episode (PettingZoo 1.27's pistonball and cooperative pong). Their factories, by
# registered id or named directly, are called with `rgb_array`, which draws every step off
# screen.
DRAWN_ONLY_WHEN_RENDERED = (
    "pettingzoo.butterfly.pistonball",
    "pettingzoo.butterfly.cooperative_pong",
)


def make_env(env_id: str, params: dict[str, Any], render_mode: str | None = None) -> Any:
    from marlctl.envs.magent2 import whole_state
    from marlctl.envs.screens import share_screen

    entry = lookup(env_id)
    env = as_parallel(resolve_factory(entry)(**factory_kwargs(entry, params, render_mode)))
    return whole_state(share_screen(env, entry.factory))


def factory_kwargs(entry: EnvEntry, params: dict[str, Any], render_mode: str | None = None):
    """The keywords an env's factory gets: its params, and the render mode it needs."""
    kwargs = dict(params)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    elif entry.factory.startswith(DRAWN_ONLY_WHEN_RENDERED):
        kwargs.setdefault("render_mode", "rgb_array")
    return kwargs


def as_parallel(env: Any) -> Any:
    """A factory's env as a ParallelEnv: a turn-based (AEC) env is wrapped so that each step
    moves the one agent whose turn it is, and PettingZoo's conversion of an AEC env whose
    agents all act each cycle steps without observing twice (`marlctl.envs.turns`)."""
    from pettingzoo import AECEnv

    from marlctl.envs.turns import TurnBasedEnv, cycle_parallel

    if isinstance(env, AECEnv):
        return TurnBasedEnv(env)
    return cycle_parallel(env)
