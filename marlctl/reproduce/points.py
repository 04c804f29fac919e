"""A cell's reference points: where a policy that does not learn scores in the cell's env,
drawn beside its results so that a reader sees how far training went (from uniformly random
actions) and how far it could go (a scripted policy that solves the task).

Each point plays every group that would learn with one player (`random`, or a scripted policy
`package.module:callable` called as a spec's scripted group is) and is scored as the cell's
runs' final evaluation is: `train.eval_episodes` episodes per seed on each seed's evaluation
seed, with the spec's own opponents, and the mean over seeds of the cell's metric. It runs on
the CPU: a few hundred episodes of a policy that does not learn take seconds.
"""

from __future__ import annotations

import statistics

from marlctl.report.references import Point
from marlctl.spec.sections import RANDOM_PLAYER

# The metric families a point has a value for: the evaluation's (a policy that does not learn
# acts the same way in both).
EVALUATED = ("eval/", "eval_sampled/")
BATCHED = ("native", "vmas")  # the backends that batch seeds in one env


def refusal(metric: str) -> str | None:
    """Why a cell judged on `metric` can have no reference points, or None."""
    if metric.startswith(EVALUATED):
        return None
    return (
        f"reference points are scored by evaluation: the cell's metric '{metric}' is not an "
        "eval/ or eval_sampled/ metric"
    )


class _Players:
    """Every learning group played by a player of its own, as a trainer would act."""

    def __init__(self, players: dict):
        self.players = players

    def act(self, ob, deterministic: bool = True, first=None) -> dict:
        return {name: p.act(ob, first, deterministic) for name, p in self.players.items()}


def measure(loaded, plan, points: dict[str, str], metric: str) -> tuple[Point, ...]:
    """Each of `points` (name -> player) scored on the cell's `metric` for its planned seeds;
    a point whose episodes give no value for the metric (a win rate in an env that names no
    winner) is left out."""
    import torch

    from marlctl import tracking
    from marlctl.plan import learner_info
    from marlctl.train.opponents import RandomPlayer, ScriptedPlayer, import_policy
    from marlctl.train.runner import make_eval_env
    from marlctl.train.scores import eval_seed, evaluate

    spec, info = loaded.spec, plan.env
    seeds = [run.seed for run in plan.runs]
    episodes, device = spec.train.eval_episodes, torch.device("cpu")
    learners = learner_info(info, spec).groups
    key = metric.partition("/")[2]
    client = tracking.client_for(spec.tracking.uri) if spec.opponents else None
    folder = loaded.provenance.spec.path.parent
    # The seeds in one batch where the backend batches them, as the runs evaluate them.
    batches = [seeds] if spec.env.backend in BATCHED else [[seed] for seed in seeds]
    out = []
    for name, player in points.items():
        fn = None if player == RANDOM_PLAYER else import_policy(player, [folder])
        values = []
        for batch in batches:
            if fn is None:
                players = {g.name: RandomPlayer(g, batch, device) for g in learners}
            else:
                players = {g.name: ScriptedPlayer(g, fn, player) for g in learners}
            env = make_eval_env(spec, info, client, batch, device)
            try:
                played = _Players(players)
                results = evaluate(played, env, episodes, [eval_seed(s) for s in batch])
            finally:
                env.close()
            values += [r[key] for r in results if key in r]
        if values:
            out.append(Point(name, statistics.fmean(values), player))
    return tuple(out)
