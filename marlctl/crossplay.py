"""Cross-play: trained policies against each other's, seat by seat.

`marlctl eval RUN --vs OTHER,...` pairs every finished seed run of RUN with every one of the
OTHERs' (a parent run stands for its seeds). For each pair and each agent group one of the
two learned (a seat), that run plays the seat with its policy and the other run plays every
other group it learned with its own; groups neither learned keep the seat's run's players.
Both directions are played, over the evaluation episodes of the seat's run (its eval seed),
deterministically. Each match is stored with the seat's run, as the artifact
`crossplay/<opponent run id>.json`, so that `marlctl report` reads the matrix from tracking
alone and the same command reproduces every figure from the run ids.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from pydantic import ConfigDict, TypeAdapter

from marlctl import tracking
from marlctl.atomic import staging
from marlctl.errors import SpecError

FOLDER = "crossplay"


@dataclass
class Match:
    run_id: str  # the seed run that plays `seat`
    seed: int
    seat: str  # the group it plays
    opponent: str  # the seed run that plays the other groups it learned
    opponent_seed: int
    opponent_groups: list[str]
    episodes: int
    eval_seed: int
    score: float  # the seat's return
    returns: dict[str, float]  # every group's return
    win_rate: float | None = None  # the seat run's, where the env says who won


# What a stored record must be, field by field (strict: a number stays a finite number), so
# that an artifact edited or written by another version is left out, not half-read.
_RECORD = TypeAdapter(list[Match], config=ConfigDict(strict=True, allow_inf_nan=False))


@dataclass
class CrossPlay:
    matches: list[Match]

    def to_dict(self) -> dict:
        return {"matches": [asdict(m) for m in self.matches]}


def learned_groups(client, run_id: str) -> list[str]:
    """The groups a seed run's policy plays: the env's, less those its spec gave players."""
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
    return [g.name for g in info.groups]


def cross_play(
    run_id: str,
    others: list[str],
    tracking_uri: str | None,
    episodes: int | None,
    device: str | None,
) -> CrossPlay:
    """Every match between RUN's seeds and the OTHERs', both ways; stored with the runs."""
    from mlflow.exceptions import MlflowException

    from marlctl.evaluation import _evaluate_one
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
    mine = {r.info.run_id for r in ours}
    unique = {r.info.run_id: r for r in theirs if r.info.run_id not in mine}
    theirs = list(unique.values())
    if not theirs:
        raise SpecError.at("--vs", "name at least one run other than RUN_ID's own seeds")
    learned = {r.info.run_id: learned_groups(client, r.info.run_id) for r in [*ours, *theirs]}
    matches = []
    for a in ours:
        for b in theirs:
            for seat_run, other in ((a, b), (b, a)):
                for seat in learned[seat_run.info.run_id]:
                    groups = [g for g in learned[other.info.run_id] if g != seat]
                    if not groups:
                        continue
                    against = {g: other.info.run_id for g in groups}
                    result = _evaluate_one(
                        client, seat_run, None, episodes, None, device, None, None, against
                    )
                    matches.append(
                        Match(
                            seat_run.info.run_id,
                            result.seed,
                            seat,
                            other.info.run_id,
                            int(other.data.tags.get("marlctl.seed", 0)),
                            groups,
                            result.episodes,
                            result.eval_seed,
                            result.returns[seat],
                            result.returns,
                            result.win_rate,
                        )
                    )
    if not matches:
        groups = ", ".join(sorted({g for found in learned.values() for g in found}))
        raise SpecError.at(
            "--vs",
            f"no match to play: each run learned only group {groups}; a match needs an "
            "opponent that learned a group other than the seat",
        )
    _store(client, matches)
    return CrossPlay(matches)


def _store(client, matches: list[Match]) -> None:
    """One artifact per (seat run, opponent run), replaced when the pair is played again."""
    pairs: dict[tuple[str, str], list[Match]] = {}
    for m in matches:
        pairs.setdefault((m.run_id, m.opponent), []).append(m)
    for (run_id, opponent), found in pairs.items():
        with staging() as tmp:
            path = tmp / f"{opponent}.json"
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
    """(seat, run a, run b, outcome) for every seat two runs both played against each other:
    each plays the seat against the other's other groups, and the one whose seat scores more
    (its win rate where the env says who won, else its return) wins it; outcome 1 = a won,
    0 = a draw, -1 = b won. In a fixed order (seat, then run ids), which the ratings follow."""
    found = {(m.seat, m.run_id, m.opponent): m for m in matches}
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
