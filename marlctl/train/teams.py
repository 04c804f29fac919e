"""Several algorithms in one env: each team of agent groups learns with its own trainer.

A group that names its own `algo` or `model` in the spec's `groups` is a team of its own;
the other learning groups form the default team, trained with the spec's `algo` and
`model`. Every team's trainer runs its own iterations (rollouts, replay, updates) in a
thread of its own, against a view of the one env that shows it its groups only. The env
moves in lockstep: a step happens once every team has given its groups' actions, from the
observation each last saw; the last team to arrive steps the env. So each team sees the
others act in every step, as in a single-algorithm run, and a team's updates overlap the
others' computation. A round of `steps_per_iteration` env steps is a whole number of every
team's iterations (the plan checks it), so no team waits for a step that never comes.

The teams' checkpoints, policies and losses sit side by side: a team's keys are prefixed
with its name (`adversary.`), and its losses end in `/<team>` (`loss/policy/adversary`);
the default team's keep their plain names.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import nn

from marlctl.envs.batch import Observation, Transition, only, transition_for
from marlctl.envs.info import EnvInfo
from marlctl.train.core import EpisodeStats, per_seed_outcomes

DEFAULT = ""  # the default team's name: its keys are unprefixed


@dataclass
class Team:
    name: str
    groups: list[str]
    trainer: object  # a Trainer over `groups`


class Failed(RuntimeError):
    """Another team's thread failed: this one stops too."""


class Lockstep:
    """One env, stepped once every team has given its actions for the step."""

    def __init__(self, env, teams: list[Team], stats: EpisodeStats, seeds: int):
        self.env, self.teams, self.stats, self.seeds = env, teams, stats, seeds
        self.cond = threading.Condition()
        self.pending: dict[str, dict[str, torch.Tensor]] = {}
        self.steps = 0
        self.transition: Transition | None = None
        self.failed = False
        self.left: set[str] = set()
        self.error: str | None = None

    def submit(self, team: str, actions: dict[str, torch.Tensor]) -> Transition:
        with self.cond:
            if self.failed:
                raise Failed("another team failed")
            self.pending[team] = actions
            step = self.steps
            if len(self.pending) == len(self.teams):
                self._advance()
            elif self._stranded(team):
                raise Failed(self.error)
            else:
                self.cond.wait_for(lambda: self.steps > step or self.failed)
                if self.failed:
                    raise Failed("another team failed")
            return self.transition

    def _advance(self) -> None:
        joint: dict[str, torch.Tensor] = {}
        for actions in self.pending.values():
            joint.update(actions)
        tr = self.env.step(joint)
        S = self.seeds
        done = (tr.terminated | tr.truncated).view(S, -1)
        rewards = {k: v.view(S, -1, *v.shape[1:]) for k, v in tr.rewards.items()}
        self.stats.record(rewards, done, **per_seed_outcomes(tr, S))
        self.transition = tr
        self.pending.clear()
        self.steps += 1
        self.cond.notify_all()

    def fail(self) -> None:
        with self.cond:
            self.failed = True
            self.cond.notify_all()

    def leave(self, team: str) -> None:
        """`team` took every step of its round: a team still waiting for it never gets one."""
        with self.cond:
            self.left.add(team)
            self._stranded(team)

    def _stranded(self, team: str) -> bool:
        """Whether a waiting team waits for one that has left (the lock held); if so, every
        team stops with the reason."""
        if not (self.left and self.pending):
            return False
        if len(self.left) + len(self.pending) < len(self.teams):
            return False
        self.error = (
            f"teams {sorted(self.left)} ended their round while {sorted(self.pending)} still "
            "needed steps: every team's iteration must step the env rollout_steps times"
        )
        self.failed = True
        self.cond.notify_all()
        return True


class TeamView:
    """The env as one team sees it: its groups' observations, masks and rewards."""

    def __init__(self, lockstep: Lockstep, team: Team, info: EnvInfo):
        self.lockstep, self.team, self.info = lockstep, team, info
        self.num_envs, self.device = lockstep.env.num_envs, lockstep.env.device

    def step(self, actions: dict[str, torch.Tensor]) -> Transition:
        return transition_for(self.lockstep.submit(self.team.name, actions), self.team.groups)

    def reset(self, seed):
        raise RuntimeError("the teams' env is reset by the run, not by a team")

    def close(self) -> None:
        pass


class TeamsTrainer:
    """The trainers of several teams as one, with a `Trainer`'s interface for the run."""

    graph = None  # iterations run eagerly: the teams' threads meet on the host
    captured_by_default = False

    def __init__(self, teams: list[Team], info: EnvInfo, num_envs: int, device, seeds):
        self.teams, self.info, self.num_envs = teams, info, num_envs
        self.device, self.seeds = torch.device(device), tuple(seeds)
        groups = {g.name: g.n_agents for g in info.groups}
        self.stats = EpisodeStats(groups, num_envs, self.device, len(self.seeds))
        self.policies = nn.ModuleDict({_key(t.name): t.trainer.policies for t in teams})
        self.steps_per_iteration = max(t.trainer.steps_per_iteration for t in teams)
        self.iteration = 0
        self._obs: dict[str, Observation] | None = None

    @property
    def reads_state(self) -> bool:
        return any(t.trainer.reads_state for t in self.teams)

    # ------------------------------------------------------------ acting

    @property
    def stateless_acting(self) -> bool:
        return all(t.trainer.stateless_acting for t in self.teams)

    @torch.no_grad()
    def act(self, ob: Observation, deterministic: bool = True, first=None):
        actions = {}
        for t in self.teams:
            actions.update(t.trainer.act(only(ob, t.groups), deterministic, first))
        return actions

    def restart_episodes(self) -> None:
        self.stats.reset_running()
        for t in self.teams:
            t.trainer.restart_episodes()
        self._obs = None

    def compile(self) -> None:
        for t in self.teams:
            t.trainer.compile()

    def capture(self, env) -> str | None:
        return "several algorithms step one env in lockstep from host threads"

    # ------------------------------------------------------------ training

    def train_iteration(self, env, ob: Observation):
        """One round: `steps_per_iteration` env steps, each team's iterations over them."""
        if self._obs is None:
            self._obs = {t.name: only(ob, t.groups) for t in self.teams}
        lockstep = Lockstep(env, self.teams, self.stats, len(self.seeds))
        losses: dict[str, dict[str, torch.Tensor]] = {}
        errors: list[BaseException] = []

        def run(team: Team) -> None:
            view = TeamView(lockstep, team, team.trainer.info)
            trainer = team.trainer
            found: dict[str, list[torch.Tensor]] = {}
            try:
                for _ in range(self.steps_per_iteration // trainer.steps_per_iteration):
                    self._obs[team.name], out = trainer.train_iteration(view, self._obs[team.name])
                    for key, value in out.items():
                        found.setdefault(key, []).append(value.float())
            except Failed:
                return
            except BaseException as err:  # noqa: BLE001 - handed to the run's thread
                errors.append(err)
                lockstep.fail()
                return
            lockstep.leave(team.name)
            losses[team.name] = {k: torch.stack(v).mean(0) for k, v in found.items()}

        threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in self.teams]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:  # Ctrl-C in the run's thread: the teams stop at their next step
            lockstep.fail()
            for thread in threads:
                thread.join()
            raise
        if errors:
            raise errors[0]
        if lockstep.error is not None:
            raise RuntimeError(lockstep.error)
        self.iteration += 1
        merged = {}
        for t in self.teams:
            for key, value in losses[t.name].items():
                merged[key if t.name == DEFAULT else f"{key}/{t.name}"] = value
        return lockstep.transition.next, merged

    # ------------------------------------------------------------ checkpoints

    def seed_state(self, index: int) -> dict:
        states = {t.name: t.trainer.seed_state(index) for t in self.teams}
        return _joined_state(states)

    def load_seed_states(self, states: list[dict]) -> None:
        for t in self.teams:
            t.trainer.load_seed_states([_team_state(s, t.name) for s in states])


def _key(name: str) -> str:
    return name or "team"


def _joined_state(states: dict[str, dict]) -> dict:
    """The teams' states as one: `policies` keyed `<team>.<key>` (what a policy file and
    `marlctl eval` load), and each team's other state under `teams`."""
    policies = {
        f"{_key(name)}.{k}": v
        for name, state in states.items()
        for k, v in state["policies"].items()
    }
    rest = {
        _key(name): {k: v for k, v in state.items() if k != "policies"}
        for name, state in states.items()
    }
    return {"policies": policies, "teams": rest}


def _team_state(state: dict, name: str) -> dict:
    prefix = f"{_key(name)}."
    policies = {k[len(prefix) :]: v for k, v in state["policies"].items() if k.startswith(prefix)}
    return {"policies": policies, **state["teams"][_key(name)]}
