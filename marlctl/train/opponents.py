"""Agent groups played by something other than the learners (the spec's `groups`).

A group is scripted (uniformly random actions, or a policy function the spec names) or
frozen (a trained policy from a finished run, never updated). `WithOpponents` wraps a
batched env so that the trainer sees only the groups that learn: each step it asks every
other group's player for that group's actions, from the observation the env gave last, and
hands the learners their own observations and rewards, with every agent's global state.

A player acts as its group would in its own run: sampling while the learners train,
deterministically in evaluations.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from marlctl.envs.batch import Observation, Transition, Wrapper, only, transition_for
from marlctl.envs.info import EnvInfo, GroupInfo
from marlctl.errors import SpecError, one_line
from marlctl.plan import learner_info
from marlctl.spec.models import RANDOM_PLAYER, Spec, run_ref
from marlctl.train.actions import ActionBounds, uniform_probs
from marlctl.train.core import inclusive_cumsum


class Player(Protocol):
    def act(
        self, ob: Observation, first: torch.Tensor | None, deterministic: bool
    ) -> torch.Tensor: ...


# ---------------------------------------------------------------- players


class RandomPlayer:
    """Uniformly random allowed actions, or uniform over the action box; env rows are
    seed-major and each seed's rows draw from that seed's own generator."""

    def __init__(self, group: GroupInfo, seeds: list[int], device: torch.device):
        self.group, self.device = group, device
        self.generators = [torch.Generator(device=device).manual_seed(seed + 2) for seed in seeds]
        self.bounds = None if group.discrete else ActionBounds(group, device)

    def _uniform(self, shape: tuple[int, ...]) -> torch.Tensor:
        chunks = torch.Size((shape[0] // len(self.generators), *shape[1:]))
        return torch.cat(
            [torch.rand(chunks, generator=g, device=self.device) for g in self.generators]
        )

    def act(self, ob: Observation, first, deterministic: bool) -> torch.Tensor:
        g = self.group
        rows = ob.obs[g.name].shape[0]
        if g.discrete:
            probs = uniform_probs(ob.masks[g.name], (rows, g.n_agents, g.n_actions), self.device)
            u = self._uniform((rows, g.n_agents)).unsqueeze(-1)
            return (inclusive_cumsum(probs) < u).sum(-1).clamp_max(g.n_actions - 1)
        return self.bounds.to_env(2.0 * self._uniform((rows, g.n_agents, g.n_actions)) - 1.0)


class ScriptedPlayer:
    """A policy function the spec names: fn(obs, mask, group) -> actions."""

    def __init__(self, group: GroupInfo, fn: Callable[..., Any], name: str):
        self.group, self.fn, self.name = group, fn, name

    def act(self, ob: Observation, first, deterministic: bool) -> torch.Tensor:
        g = self.group
        obs = ob.obs[g.name]
        who = f"scripted policy '{self.name}' of group '{g.name}'"
        # One that calls exit() fails its run too: ending the process would leave it open.
        try:
            returned = self.fn(obs, ob.masks[g.name], g)
        except (Exception, SystemExit) as err:
            raise RuntimeError(f"{who} raised {type(err).__name__}: {one_line(str(err))}") from err
        try:
            actions = torch.as_tensor(returned, device=obs.device)
        except (TypeError, ValueError, RuntimeError):
            kind = "None" if returned is None else f"a {type(returned).__name__}"
            raise RuntimeError(f"{who} returned {kind}, not a tensor of actions") from None
        rows = obs.shape[0]
        want = (rows, g.n_agents) if g.discrete else (rows, g.n_agents, g.n_actions)
        if tuple(actions.shape) != want:
            raise RuntimeError(
                f"{who} returned actions of shape {tuple(actions.shape)}; expected {want}"
            )
        # The function runs on the host every step already: reading one flag back is cheap.
        if g.discrete:
            valid = (actions >= 0) & (actions < g.n_actions)
            if actions.is_floating_point():
                valid &= actions == actions.floor()
            if not bool(valid.all()):
                bad = actions[~valid][0].item()
                raise RuntimeError(
                    f"{who} returned the action {bad:g}; expected whole numbers from 0 to "
                    f"{g.n_actions - 1}"
                )
            return actions.long()
        if not bool(torch.isfinite(actions).all()):
            raise RuntimeError(f"{who} returned actions that are not finite numbers")
        return actions.float()


class FrozenPlayer:
    """Group `name`'s policy in seed run `run_id`'s trainer, loaded once and never updated."""

    def __init__(self, trainer, name: str, run_id: str):
        self.trainer, self.name, self.run_id = trainer, name, run_id
        self.groups = [g.name for g in trainer.info.groups]

    def act(self, ob: Observation, first, deterministic: bool) -> torch.Tensor:
        return self.trainer.act(only(ob, self.groups), deterministic, first)[self.name]


# ---------------------------------------------------------------- the env the learners see


class WithOpponents(Wrapper):
    """`env` with the groups in `players` played by them: the learners' observations,
    rewards and masks only, every agent's global state, the env's episode ends. `partners`
    (group -> a player and agent indices) plays some agents of a learners' group instead
    (zero-shot coordination): the learners act for every agent as they would alone, and
    those agents take the partner's action, chosen from the same observation."""

    def __init__(
        self,
        env,
        learners: EnvInfo,
        players: dict[str, Player],
        deterministic: bool,
        partners: dict[str, tuple[Player, list[int]]] | None = None,
    ):
        super().__init__(env)
        self.info, self.players = learners, players
        self.partners = partners or {}
        self.deterministic = deterministic
        self._names = [g.name for g in learners.groups]
        self._ob: Observation | None = None
        self._first: torch.Tensor | None = None

    # A player may act on the host (a scripted function, another run's trainer).
    graph_blocker = "groups played by scripted or frozen policies act on the host"

    def reset(self, seed) -> Observation:
        self._ob, self._first = self.env.reset(seed), None  # every episode starts now
        return only(self._ob, self._names)

    def step(self, actions: dict[str, torch.Tensor]) -> Transition:
        joint = dict(actions)
        for name, player in self.players.items():
            joint[name] = player.act(self._ob, self._first, self.deterministic)
        for name, (player, index) in self.partners.items():
            theirs = player.act(self._ob, self._first, self.deterministic)
            mixed = joint[name].clone()
            mixed[:, index] = theirs[:, index].to(mixed.dtype)
            joint[name] = mixed
        tr = self.env.step(joint)
        self._ob, self._first = tr.next, tr.terminated | tr.truncated
        return transition_for(tr, self._names)


# ---------------------------------------------------------------- building the players


def import_policy(path: str, near: list[Path] | None = None) -> Callable[..., Any]:
    """The callable `package.module:name` names, or ValueError saying why not; a module not
    found whose file is in the working folder or one of `near` says so."""
    from marlctl.callables import UserCodeError, calling_user_code
    from marlctl.envs.registry import EnvLookupError, import_callable, module_path_hint

    try:
        with calling_user_code():
            return import_callable(path, what="scripted policy")
    except EnvLookupError as err:
        hint = module_path_hint(err.module, [Path.cwd(), *(near or [])]) if err.module else ""
        raise ValueError(one_line(str(err)) + hint) from None
    except Exception as err:  # the module's own code failed as it was imported
        what = str(err) if isinstance(err, UserCodeError) else f"{type(err).__name__}: {err}"
        raise ValueError(f"importing '{path}' raised {one_line(what)}") from None


def frozen_source(client, spec: Spec, info: EnvInfo, name: str, ref: str):
    """(seed run id, its spec, its learners' EnvInfo, policy weights, artifact) of group
    `name`'s policy in run `ref` (RUN_ID[:CHECKPOINT]); ValueError saying what does not fit."""
    from marlctl import tracking
    from marlctl.spec import load_spec
    from marlctl.spec.source import load_source
    from marlctl.stored import SPEC_ARTIFACT, finished, not_finished, policy_weights, seed_runs

    given, checkpoint = run_ref(ref)
    try:
        run_id = tracking.resolve_run_id(client, given, "frozen")
        run = client.get_run(run_id)
    except SpecError as err:
        raise ValueError(err.problems[0].message) from None
    except Exception:
        raise ValueError(f"no run '{given}' in the tracking store") from None
    seeds = seed_runs(client, run)
    if len(seeds) != 1:
        listed = ", ".join(
            f"{r.info.run_id} (seed {r.data.tags.get('marlctl.seed')})" for r in seeds
        )
        raise ValueError(
            f"run '{run_id}' has {len(seeds)} finished seed runs; name one of them"
            + (f": {listed}" if listed else "")
        )
    seed_run = seeds[0]
    seed_id = seed_run.info.run_id
    if not finished(seed_run):
        raise ValueError(not_finished(seed_run))
    shown = f"run {seed_id} {SPEC_ARTIFACT}"  # not the temporary file's path
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(seed_id, SPEC_ARTIFACT, tmp)
        except Exception:
            raise ValueError(f"run '{seed_id}' has no {SPEC_ARTIFACT}") from None
        try:
            stored = load_source(Path(path), shown).data
        except SpecError as err:
            raise ValueError(f"its stored spec does not load: {err.problems[0]}") from None
        env = stored.get("env")
        stored_env = env.get("id") if isinstance(env, dict) else None
        if stored_env != spec.env.id:
            raise ValueError(f"run '{seed_id}' trained on env '{stored_env}', not '{spec.env.id}'")
        # The env is the one this spec names, so its factory is trusted here; the frozen
        # run's own players are never called.
        try:
            theirs = load_spec(path, ["hardware.device=cpu", "hardware.devices=null"]).spec
        except SpecError as err:
            problem = dataclasses.replace(err.problems[0], file=shown)
            raise ValueError(f"its stored spec does not load: {problem}") from None
        try:
            weights, artifact = policy_weights(client, seed_id, checkpoint, tmp, files_too=False)
        except SpecError as err:
            message = err.problems[0].message
            named = message if seed_id in message else f"run '{seed_id}': {message}"
            raise ValueError(named) from None
    if name in theirs.opponents:
        raise ValueError(f"group '{name}' did not learn in run '{seed_id}'")
    from marlctl.envs.probe import probe

    their_info = learner_info(probe(theirs.env.id, dict(theirs.env.params)), theirs)
    mine = next(g for g in info.groups if g.name == name)
    found = next((g for g in their_info.groups if g.name == name), None)
    if found is None or _spaces(found) != _spaces(mine):
        raise ValueError(
            f"group '{name}' of run '{seed_id}' has other agents or spaces than "
            f"this env's ({_describe(found)} against {_describe(mine)})"
        )
    return seed_id, theirs, their_info, weights, artifact


def _spaces(g: GroupInfo) -> tuple:
    return g.agents, g.obs_shape, g.discrete, g.n_actions, g.action_low, g.action_high


def _describe(g: GroupInfo | None) -> str:
    if g is None:
        return "no such group"
    kind = "discrete" if g.discrete else "continuous"
    return f"{g.n_agents} agents, observations {list(g.obs_shape)}, {g.n_actions} {kind} actions"


def build_players(
    spec: Spec, info: EnvInfo, client, device: torch.device, seeds: list[int], rows: int
) -> dict[str, Player]:
    """A player for every group that does not learn; `rows` env rows (all seeds)."""
    players: dict[str, Player] = {}
    for name, group in spec.opponents.items():
        g = next(x for x in info.groups if x.name == name)
        if group.scripted == RANDOM_PLAYER:
            players[name] = RandomPlayer(g, seeds, device)
        elif group.scripted is not None:
            players[name] = ScriptedPlayer(g, import_policy(group.scripted), group.scripted)
        else:
            players[name] = frozen_player(client, spec, info, name, group.frozen, device, rows)
    return players


def frozen_player(
    client, spec: Spec, info: EnvInfo, name: str, ref: str, device: torch.device, rows: int
) -> FrozenPlayer:
    """Group `name` played by the policy of run `ref` (RUN_ID[:CHECKPOINT])."""
    from marlctl.stored import load_into
    from marlctl.train.build import build_trainer

    run_id, theirs, their_info, weights, artifact = frozen_source(client, spec, info, name, ref)
    trainer = build_trainer(theirs, their_info, rows, device, total_iterations=1)
    try:
        load_into(trainer, weights, artifact)
    except SpecError as err:
        raise ValueError(f"run '{run_id}': {err.problems[0].message}") from None
    return FrozenPlayer(trainer, name, run_id)


def with_opponents(
    env,
    spec: Spec,
    info: EnvInfo,
    client,
    seeds: list[int],
    deterministic: bool,
    against: dict[str, str] | None = None,
    partners: dict[str, tuple[str, list[str]]] | None = None,
):
    """`env` as the learners see it, or `env` itself when every group learns. `against`
    (group -> a seed run) puts other runs' policies in groups of the learners' own, whose
    actions they then replace; `partners` (group -> a seed run and agents of the group) does
    so for some of a group's agents only (cross-play: a run that cannot play is `--vs`'s
    problem)."""
    if not spec.opponents and not against and not partners:
        return env

    def frozen(name: str, run_id: str) -> FrozenPlayer:
        try:
            return frozen_player(client, spec, info, name, run_id, env.device, env.num_envs)
        except ValueError as err:
            raise SpecError.at("--vs", f"group '{name}': {err}") from None

    players = build_players(spec, info, client, env.device, seeds, env.num_envs)
    players |= {name: frozen(name, run_id) for name, run_id in (against or {}).items()}
    agents = {g.name: g.agents for g in info.groups}
    playing = {
        name: (frozen(name, run_id), [agents[name].index(a) for a in chosen])
        for name, (run_id, chosen) in (partners or {}).items()
    }
    return WithOpponents(env, learner_info(info, spec), players, deterministic, playing)
