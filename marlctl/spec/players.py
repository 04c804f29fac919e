"""The players of the groups that do not learn, checked before any run starts: every
scripted policy imports, and every frozen run and every run a pool includes fits its group,
its weights loaded into its networks."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from marlctl.errors import MarlctlError, Problem
from marlctl.spec.models import RANDOM_PLAYER
from marlctl.spec.provenance import LoadedSpec
from marlctl.spec.teams import learner_info

if TYPE_CHECKING:
    from marlctl.envs.info import EnvInfo

# The players are built by the trainers, which import the spec: they are named here and
# imported only for a spec that has such players, as the algorithm registry names its
# trainers ("module:name").
IMPORT_POLICY = "marlctl.train.opponents:import_policy"
FROZEN_PLAYER = "marlctl.train.opponents:frozen_player"


def _resolve(reference: str) -> Any:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def players_problems(loaded: LoadedSpec, info: EnvInfo) -> list[Problem]:
    """What keeps a scripted policy, a frozen run or a run a pool includes from playing its
    group, at its spec line."""
    spec, prov = loaded.spec, loaded.provenance
    scripted = {
        name: g.scripted
        for name, g in spec.opponents.items()
        if g.scripted not in (None, RANDOM_PLAYER)
    }
    frozen = any(g.frozen is not None for g in spec.opponents.values())
    included = any(pool.include for pool in spec.pools.values())
    if not scripted and not frozen and not included:
        return []
    client = _store_client(spec.tracking.uri) if frozen or included else None
    problems = []
    for name, group in spec.opponents.items():
        try:
            if name in scripted:
                _resolve(IMPORT_POLICY)(group.scripted, [prov.spec.path.parent])
            elif group.frozen is not None and client is not None:
                _frozen(client, loaded, info, name, group.frozen)
        except ValueError as err:
            key = "scripted" if group.scripted is not None else "frozen"
            problems.append(prov.problem(f"groups.{name}.{key}", str(err)))
    learning = {g.name for g in learner_info(info, spec).groups}
    for name, pool in spec.pools.items() if client is not None else ():
        for index, ref in enumerate(pool.include):
            try:
                player = _frozen(client, loaded, info, name, ref)
                # It acts on what the learners see: every group its policies read must learn.
                missing = [g for g in player.groups if g not in learning]
                if missing:
                    raise ValueError(
                        f"run '{player.run_id}' also trained group(s) {', '.join(missing)}, "
                        "which do not learn here: include a run whose other learning groups "
                        "learn here too"
                    )
            except ValueError as err:
                problems.append(prov.problem(f"groups.{name}.pool.include.{index}", str(err)))
    return problems


def _frozen(client, loaded: LoadedSpec, info: EnvInfo, name: str, ref: str):
    import torch

    return _resolve(FROZEN_PLAYER)(client, loaded.spec, info, name, ref, torch.device("cpu"), 1)


def _store_client(uri: str | None):
    """The tracking store's client, opened as `run` opens it; None where the store does not
    answer (the commands that log to it say so: `tracking_problem`, `check_reachable`)."""
    from marlctl import tracking

    try:
        tracking.check_reachable(uri, writes=False)
    except MarlctlError:
        return None
    return tracking.client_for(uri)
