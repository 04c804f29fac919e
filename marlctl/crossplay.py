"""Cross-play: trained policies against each other's, seat by seat.

`marlctl eval RUN --vs OTHER,...` pairs every finished seed run of RUN with every one of the
OTHERs' (a parent run stands for its seeds; RUN's own seeds play each other where RUN is named
among the OTHERs). A seat is what one run of a pair plays while the other plays the rest:

- a group seat (`--seats groups`): an agent group one of the two learned; that run plays the
  seat with its policy and the other run plays every other group it learned with its own;
  groups neither learned keep the seat's run's players.
- an agent seat (`--seats agents`): one agent of a group both learned; that run plays the
  agent and the other run plays the group's other agents and every other group it learned.
  The seat's score is its group's return, which on a cooperative task is the team's: the
  matrix of these scores is zero-shot coordination (Hu et al. 2020, "Other-Play"), with each
  run's self-play on its diagonal.

`--seats auto` plays group seats where the runs have a group to play against, else agent
seats. Both directions are played, over the evaluation episodes of the seat's run (its eval
seed), deterministically, or with `--sampled` as the policies act in training. Each match is
stored with the seat's run, as the artifact `crossplay/<opponent run id>.json` (agent seats
and self-play: `<id>-agents.json`; sampled: `-sampled` added), so that `marlctl report`
reads the matrices from tracking alone and the same command reproduces every figure from
the run ids.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from typing import Literal

from pydantic import ConfigDict, TypeAdapter

from marlctl import tracking
from marlctl.atomic import staging
from marlctl.errors import SpecError

FOLDER = "crossplay"


@dataclass
class Match:
    run_id: str  # the seed run that plays `seat`
    seed: int
    seat: str  # the group it plays (`agent`: one agent of it)
    opponent: str  # the seed run that plays the rest it learned (itself: self-play)
    opponent_seed: int
    opponent_groups: list[str]
    episodes: int
    eval_seed: int
    score: float  # the seat's group's return
    returns: dict[str, float]  # every group's return
    win_rate: float | None = None  # the seat run's, where the env says who won
    agent: str | None = None  # the one agent of `seat` the run plays; None: all of them
    sampled: bool = False  # every policy acted as in training, not deterministically

    @property
    def self_play(self) -> bool:
        return self.opponent == self.run_id

    @property
    def group_seat(self) -> bool:
        """A whole group against another run's other groups: what ratings are made of."""
        return self.agent is None and not self.self_play

    @property
    def label(self) -> str:
        """The seat, with its agent and how the policies acted: matches with one label
        compare."""
        seat = self.seat if self.agent is None else f"{self.seat}/{self.agent}"
        return f"{seat} (sampled)" if self.sampled else seat


# What a stored record must be, field by field (strict: a number stays a finite number), so
# that an artifact edited or written by another version is left out, not half-read.
_RECORD = TypeAdapter(list[Match], config=ConfigDict(strict=True, allow_inf_nan=False))


@dataclass
class CrossPlay:
    matches: list[Match]

    def to_dict(self) -> dict:
        return {
            "matches": [asdict(m) for m in self.matches],
            "coordination": [c.to_dict() for c in coordination(self.matches)],
        }


def learned_groups(client, run_id: str) -> dict[str, tuple[str, ...]]:
    """The groups a seed run's policy plays, each with its agents: the env's, less those its
    spec gave players."""
    import tempfile

    from marlctl.envs.probe import probe
    from marlctl.plan import learner_info
    from marlctl.spec import load_spec
    from marlctl.stored import SPEC_ARTIFACT

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, SPEC_ARTIFACT, tmp)
        except Exception:
            raise SpecError.at("--vs", f"run '{run_id}' has no {SPEC_ARTIFACT} artifact") from None
        spec = load_spec(
            path, ["hardware.device=cpu", "hardware.devices=null"], stored=f"run {run_id}"
        ).spec
    info = learner_info(probe(spec.env.id, dict(spec.env.params)), spec)
    return {g.name: g.agents for g in info.groups}


@dataclass
class _Seat:
    """One match to play: `run` plays `seat` (or its `agent`), `other` the rest it learned."""

    run: object  # mlflow Run
    other: object
    seat: str
    agent: str | None
    against: dict[str, str]  # groups -> the other run
    partners: dict[str, tuple[str, list[str]]]  # the seat's group -> the other run, agents


def _pairs(ours: list, theirs: list) -> list[tuple]:
    """Each unordered pair of two different seed runs, one of RUN's and one of the OTHERs'."""
    seen, out = set(), []
    for a in ours:
        for b in theirs:
            key = frozenset((a.info.run_id, b.info.run_id))
            if len(key) == 2 and key not in seen:
                seen.add(key)
                out.append((a, b))
    return out


def _group_seats(pairs: list[tuple], learned: dict) -> list[_Seat]:
    out = []
    for a, b in pairs:
        for run, other in ((a, b), (b, a)):
            theirs = learned[other.info.run_id]
            for seat in learned[run.info.run_id]:
                groups = [g for g in theirs if g != seat]
                if groups:
                    against = {g: other.info.run_id for g in groups}
                    out.append(_Seat(run, other, seat, None, against, {}))
    return out


def _agent_seats(pairs: list[tuple], learned: dict) -> list[_Seat]:
    out = []
    for a, b in pairs:
        for run, other in ((a, b), (b, a)):
            mine, theirs = learned[run.info.run_id], learned[other.info.run_id]
            for seat, agents in mine.items():
                if len(agents) < 2 or theirs.get(seat) != agents:
                    continue
                against = {g: other.info.run_id for g in theirs if g != seat}
                for agent in agents:
                    rest = [x for x in agents if x != agent]
                    partners = {seat: (other.info.run_id, rest)}
                    out.append(_Seat(run, other, seat, agent, against, partners))
    return out


def _no_match(seats: str, learned: dict) -> SpecError:
    groups = ", ".join(sorted({g for found in learned.values() for g in found}))
    if seats == "agents":
        return SpecError.at(
            "--seats",
            f"no agent seat to play: the runs learned group {groups}; an agent seat needs a "
            "group of two or more agents that both runs learned",
        )
    hint = ""
    if seats == "groups" and any(len(a) > 1 for found in learned.values() for a in found.values()):
        hint = "; --seats agents plays one agent of a group beside the other run's others"
    return SpecError.at(
        "--vs",
        f"no match to play: each run learned only group {groups}; a match needs an "
        f"opponent that learned a group other than the seat{hint}",
    )


def cross_play(
    run_id: str,
    others: list[str],
    tracking_uri: str | None,
    episodes: int | None,
    device: str | None,
    seats: Literal["auto", "groups", "agents"] = "auto",
    sampled: bool = False,
) -> CrossPlay:
    """Every match between RUN's seeds and the OTHERs', both ways; stored with the runs."""
    from mlflow.exceptions import MlflowException

    from marlctl.stored import finished, not_finished, seed_runs

    tracking.check_store(tracking_uri, writes=True)
    client = tracking.client_for(tracking_uri)

    def seeds_of(given: str, where: str) -> list:
        found = tracking.resolve_run_id(client, given, where)
        try:
            run = client.get_run(found)
        except MlflowException:
            raise SpecError.at(where, f"no run '{given}'") from None
        runs = seed_runs(client, run)
        if not runs:
            raise SpecError.at(where, f"run '{found}' has no finished seed runs")
        for seed_run in runs:  # a seed run named itself
            if not finished(seed_run):
                raise SpecError.at(where, not_finished(seed_run))
        return runs

    ours = seeds_of(run_id, "RUN_ID")
    theirs = [run for other in others for run in seeds_of(other, "--vs")]
    pairs = _pairs(ours, theirs)
    if not pairs:
        raise SpecError.at(
            "--vs",
            "name at least one run other than RUN_ID's own seeds (its seeds play each other "
            "where it has two or more)",
        )
    runs = {r.info.run_id: r for pair in pairs for r in pair}
    learned = {found: learned_groups(client, found) for found in runs}
    found = [] if seats == "agents" else _group_seats(pairs, learned)
    if not found and seats != "groups":
        found = _agent_seats(pairs, learned)
    if not found:
        raise _no_match(seats, learned)
    matches = [_play(client, s, episodes, device, sampled) for s in found]
    if found[0].agent is not None:  # each run's self-play: the diagonal of coordination
        for run in runs.values():
            for seat in sorted({s.seat for s in found if s.run is run}):
                alone = _Seat(run, run, seat, None, {}, {})
                matches.append(_play(client, alone, episodes, device, sampled))
    _store(client, matches)
    return CrossPlay(matches)


def _play(client, seat: _Seat, episodes: int | None, device: str | None, sampled: bool) -> Match:
    from marlctl.evaluation import _evaluate_one

    run, other = seat.run, seat.other
    result = _evaluate_one(
        client,
        run,
        None,
        episodes,
        None,
        device,
        None,
        None,
        seat.against or None,
        partners=seat.partners or None,
        sampled=sampled,
    )
    return Match(
        run.info.run_id,
        result.seed,
        seat.seat,
        other.info.run_id,
        int(other.data.tags.get("marlctl.seed", 0)),
        sorted({*seat.against, *seat.partners}),
        result.episodes,
        result.eval_seed,
        result.returns[seat.seat],
        result.returns,
        result.win_rate,
        seat.agent,
        sampled,
    )


@dataclass
class Coordination:
    """Zero-shot coordination on group `seat`: `cells[(a, b)]` is the mean score of the
    agent-seat matches between runs a and b, both ways and every agent; `cells[(a, a)]` is
    a's self-play; `sampled`: the policies acted as in training."""

    seat: str
    sampled: bool
    runs: list[str]
    cells: dict[tuple[str, str], float]

    @property
    def self_play(self) -> float | None:
        found = [v for (a, b), v in self.cells.items() if a == b]
        return statistics.fmean(found) if found else None

    @property
    def cross_play(self) -> float | None:
        found = [v for (a, b), v in self.cells.items() if a < b]
        return statistics.fmean(found) if found else None

    def to_dict(self) -> dict:
        return {
            "seat": self.seat,
            "sampled": self.sampled,
            "runs": self.runs,
            "cells": [{"run": a, "with": b, "score": v} for (a, b), v in self.cells.items()],
            "self_play": self.self_play,
            "cross_play": self.cross_play,
        }


def coordination(matches: list[Match]) -> list[Coordination]:
    """The zero-shot coordination matrix of every group with agent-seat matches among
    `matches`: symmetric, each pair's cell the mean over both directions and every agent."""
    out = []
    for seat, sampled in sorted({(m.seat, m.sampled) for m in matches if m.agent is not None}):
        scores: dict[tuple[str, str], list[float]] = {}
        for m in matches:
            if (m.seat, m.sampled) != (seat, sampled) or m.group_seat:
                continue
            key = tuple(sorted((m.run_id, m.opponent)))
            scores.setdefault(key, []).append(m.score)
        cells = {}
        for (a, b), found in sorted(scores.items()):
            cells[(a, b)] = cells[(b, a)] = statistics.fmean(found)
        runs = sorted({run for key in cells for run in key})
        out.append(Coordination(seat, sampled, runs, cells))
    return out


def _store(client, matches: list[Match]) -> None:
    """One artifact per (seat run, opponent run, kind of seat), replaced when the pair is
    played again with that kind of seat."""
    pairs: dict[tuple[str, str, str], list[Match]] = {}
    for m in matches:
        kind = "" if m.group_seat else "-agents"
        kind += "-sampled" if m.sampled else ""
        pairs.setdefault((m.run_id, m.opponent, kind), []).append(m)
    for (run_id, opponent, kind), found in pairs.items():
        with staging() as tmp:
            path = tmp / f"{opponent}{kind}.json"
            path.write_text(json.dumps([asdict(m) for m in found], indent=1))
            client.log_artifact(run_id, str(path), artifact_path=FOLDER)


def stored_matches(client, run_id: str) -> list[Match]:
    """The matches stored with a seed run (its seat's side of each)."""
    import tempfile

    found = []
    for entry in client.list_artifacts(run_id, FOLDER):
        if not entry.path.endswith(".json"):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(run_id, entry.path, tmp)
            try:
                found += _RECORD.validate_json(open(path, "rb").read())
            except ValueError:  # pydantic's ValidationError too: not a record of this version
                continue
    return found


# ---------------------------------------------------------------- ratings


@dataclass
class Rating:
    """A run's skill over its games: openskill's Thurstone-Mosteller model (TrueSkill's),
    mean `mu` and uncertainty `sigma`; `ordinal` = mu - 3 sigma ranks it conservatively."""

    run_id: str
    mu: float
    sigma: float
    wins: int
    draws: int
    losses: int

    @property
    def ordinal(self) -> float:
        return self.mu - 3.0 * self.sigma

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses


def games(matches: list[Match]) -> list[tuple[str, str, str, int]]:
    """(seat, run a, run b, outcome) for every group seat (its label: sampled apart) two runs
    both played against each other:
    each plays the seat against the other's other groups, and the one whose seat scores more
    (its win rate where the env says who won, else its return) wins it; outcome 1 = a won,
    0 = a draw, -1 = b won. In a fixed order (seat, then run ids), which the ratings follow."""
    found = {
        (m.label, m.run_id, m.opponent): m
        for m in matches
        if m.group_seat  # agent seats cooperate: no game
    }
    out = []
    for (seat, a, b), first in sorted(found.items()):
        second = found.get((seat, b, a))
        if a >= b or second is None:
            continue
        if first.win_rate is not None and second.win_rate is not None:
            x, y = first.win_rate, second.win_rate
        else:
            x, y = first.score, second.score
        tolerance = 1e-9 * max(1.0, abs(x), abs(y))
        out.append((seat, a, b, 0 if abs(x - y) <= tolerance else (1 if x > y else -1)))
    return out


def ratings(matches: list[Match]) -> list[Rating]:
    """Every run's rating from the games among `matches`, best ordinal first. The policies
    do not change between games: the model's additive dynamics (tau) are off."""
    from openskill.models import ThurstoneMostellerFull

    model = ThurstoneMostellerFull(tau=0.0)
    players: dict[str, object] = {}
    tally: dict[str, list[int]] = {}
    for _, a, b, outcome in games(matches):
        for run in (a, b):
            players.setdefault(run, model.rating(name=run))
            tally.setdefault(run, [0, 0, 0])
        ranks = {1: [0, 1], 0: [0, 0], -1: [1, 0]}[outcome]
        [[players[a]], [players[b]]] = model.rate([[players[a]], [players[b]]], ranks=ranks)
        tally[a][1 - outcome] += 1  # wins, draws, losses
        tally[b][1 + outcome] += 1
    found = [Rating(run, rating.mu, rating.sigma, *tally[run]) for run, rating in players.items()]
    return sorted(found, key=lambda r: (-r.ordinal, r.run_id))
