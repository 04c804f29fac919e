"""Benchmark: self-play and population training (the spec's `groups.NAME.pool`).

tictactoe: MAPPO self-play on tic-tac-toe (`specs/tictactoe_selfplay.yaml`): one policy in
both seats, and in a share of the games one seat played by a past snapshot (drawn as the
spec's pool says). Each seed's final policy then plays GAMES games against a player of
uniformly random legal moves and GAMES against a perfect (minimax) player, half of them
moving first, acting deterministically: its non-loss rate against random and its draw rate
against minimax, per seed, with their mean and 95% interval.

tag: simple_tag (native; 3 predators `adversary`, 1 prey `agent`, 2 obstacles) with MAPPO
(`specs/tag_population.yaml`) or, with `--spec tag_population_maddpg.yaml`, MADDPG.
Predators trained against a population of prey snapshots (the spec) and predators trained
against one co-learning prey (the same spec without the pool), 3 seeds each. Held-out prey,
from experiments with seeds of their own that neither team saw, of three kinds
(`held_out_prey`): co-learning prey of the spec's algorithm at the full budget, the same
stopped early (a weaker, less settled prey), and prey of a related learner (`OTHER`: another
learner's habits). Beside that, each predator team's final return against the prey it
trained with (its own evaluation): the gap between the two is what co-learning overfits.
With `--league N`, a co-learning experiment of N seeds of its own trains first and its
final prey join the population's pool for the whole run (`groups.agent.pool.include`): a
population of independently trained prey lineages beside the prey's own snapshots.
`marlctl eval RUN --vs HELD_OUT,...` plays every predator team against every held-out prey
(cross-play, stored with the runs); the table gives the predators' return against them, over
all of them and per kind.

Each experiment runs in its own MLflow store under `bench/runs/selfplay/`; the raw results
go to `bench/results/selfplay.jsonl` and the tables to `bench/results/selfplay.md`.

    .venv/bin/python bench/selfplay.py tictactoe
    .venv/bin/python bench/selfplay.py tag [--league 3] [--spec tag_population_maddpg.yaml]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from datetime import date
from pathlib import Path

import numpy as np
import yaml
from common import machine, marlctl_json, t_interval

ROOT = Path(__file__).resolve().parent.parent
WORKDIR = ROOT / "bench" / "runs" / "selfplay"
DONE = ROOT / "bench" / "results" / "selfplay.jsonl"
OUT = ROOT / "bench" / "results" / "selfplay.md"
GAMES = 1000
TAG_SPEC = "tag_population.yaml"
# The related learner whose prey `tag` also holds out, per algorithm of the spec: MAPPO's
# critic without the global state, MADDPG's with TD3's twin critics.
OTHER = {"mappo": "ippo", "maddpg": "matd3"}


def held_out_prey(algo: str) -> dict[str, tuple[str, dict]]:
    """The held-out prey of `tag` with `algo`: key -> (label, how its experiment differs from
    the co-learning one). Each trains seeds of its own (100 + 10 k + the spec's), so no
    predator team met its prey."""
    if algo not in OTHER:
        raise SystemExit(f"tag: no held-out learner for {algo}; one of {sorted(OTHER)}")
    name, other = algo.upper(), OTHER[algo]
    return {
        "held_out": (f"{name}, full budget", {}),
        "held_out_early": (
            f"{name}, 300k steps",
            {"train": {"total_env_steps": 300_000, "eval_every": 100_000, "checkpoint_every": 0}},
        ),
        f"held_out_{other}": (f"{other.upper()}, full budget", {"algo": {"name": other}}),
    }


def fresh(name: str) -> Path:
    """An empty folder for one part's MLflow store."""
    folder = WORKDIR / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def run_in(folder: Path, name: str, body: dict) -> tuple[dict, float]:
    """`marlctl run` of `body` (as `name`.yaml) in `folder`: its JSON summary, wall-clock s."""
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    summary, wall = marlctl_json(["run", str(path)], folder, name)
    if not summary.get("ok"):
        raise SystemExit(f"{name} failed: {json.dumps(summary)[:3000]}")
    return summary, wall


def composed(name: str, overrides: list[str]):
    """The spec file as `marlctl run` reads it, defaults composed: the Spec, and the same as
    plain data."""
    from marlctl.spec import load_spec

    spec = load_spec(ROOT / "specs" / name, overrides).spec
    return spec, spec.model_dump(mode="json", exclude_none=True)


def cell(part: str, args, body: dict) -> dict:
    """What every result of a part records: the invocation, the day, the machine, the spec
    as run and its budget."""
    return {
        "part": part,
        "overrides": args.override,
        "date": date.today().isoformat(),
        "machine": machine("cpu"),
        "spec": body,
        "env_steps": body["train"]["total_env_steps"],
    }


# ---------------------------------------------------------------- tic-tac-toe


class Learner:
    """A seed run's final policy, moving in tic-tac-toe from either seat."""

    def __init__(self, folder: Path, run_id: str, spec):
        import torch
        from mlflow.tracking import MlflowClient

        from marlctl.envs.probe import probe
        from marlctl.plan import learner_info
        from marlctl.train.opponents import frozen_player

        client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
        info = learner_info(probe(spec.env.id, dict(spec.env.params)), spec)
        (self.group,) = info.groups
        cpu = torch.device("cpu")
        self.player = frozen_player(client, spec, info, self.group.name, run_id, cpu, 1)

    def move(self, observation, seat: int) -> int:
        """The move of the player in `seat` (0 moves first), shown `observation`."""
        import torch

        from marlctl.envs.batch import Observation

        g = self.group
        obs = torch.as_tensor(np.asarray(observation["observation"]), dtype=torch.float32)
        obs = obs.expand(1, g.n_agents, *obs.shape).clone()
        mask = torch.as_tensor(np.asarray(observation["action_mask"], bool))
        mask = mask.expand(1, g.n_agents, -1).clone()
        active = torch.zeros(1, g.n_agents, dtype=torch.bool)
        active[0, seat] = True
        state = obs.reshape(1, -1)
        ob = Observation({g.name: obs}, state, {g.name: mask}, {g.name: active})
        return int(self.player.act(ob, None, True)[0, seat])


def play(learner: Learner, opponent: str, games: int, seed: int) -> dict[str, int]:
    """Games against `opponent` (random or minimax), the learner first in half of them."""
    from pettingzoo.classic import tictactoe_v3

    from marlctl.envs.turns import best_moves, tictactoe_board

    rng = np.random.default_rng(seed)
    tally = {"win": 0, "draw": 0, "loss": 0}
    env = tictactoe_v3.env()
    for game in range(games):
        env.reset(seed=seed + game)
        seat = game % 2
        mine = env.possible_agents[seat]
        score = 0.0
        for agent in env.agent_iter():
            observation, reward, term, trunc, _ = env.last()
            if agent == mine:
                score += reward
            if term or trunc:
                env.step(None)
                continue
            if agent == mine:
                action = learner.move(observation, seat)
            elif opponent == "minimax":
                action = int(rng.choice(best_moves(*tictactoe_board(observation["observation"]))))
            else:
                action = int(rng.choice(np.flatnonzero(observation["action_mask"])))
            env.step(action)
        tally["win" if score > 0 else "loss" if score < 0 else "draw"] += 1
    return tally


def tictactoe(args) -> dict:
    spec, body = composed("tictactoe_selfplay.yaml", args.override)
    folder = fresh("tictactoe-selfplay")
    summary, wall = run_in(folder, "spec", body)
    seeds = []
    for run in summary["runs"]:
        learner = Learner(folder, run["run_id"], spec)
        seeds.append(
            {
                "seed": run["seed"],
                "run_id": run["run_id"],
                "random": play(learner, "random", args.games, 10_000),
                "minimax": play(learner, "minimax", args.games, 20_000),
            }
        )
    return {
        **cell("tictactoe", args, body),
        "wall_s": wall,
        "games": args.games,
        "seeds": seeds,
    }


def command(part: str, cell: dict) -> str:
    given = "".join(f" --override {o}" for o in cell.get("overrides", []))
    league = cell.get("cells", {}).get("league")
    given += f" --league {len(league['run_ids'])}" if league else ""
    spec = cell.get("spec_file", TAG_SPEC)
    given += f" --spec {spec}" if spec != TAG_SPEC else ""
    return f".venv/bin/python bench/selfplay.py {part}{given}"


def _rate(tally: dict, keys: tuple[str, ...]) -> float:
    return sum(tally[k] for k in keys) / sum(tally.values())


def tictactoe_rates(cell: dict) -> tuple[list[float], list[float]]:
    """Per seed: the non-loss rate against random, the draw rate against minimax."""
    non_loss = [_rate(s["random"], ("win", "draw")) for s in cell["seeds"]]
    draws = [_rate(s["minimax"], ("draw",)) for s in cell["seeds"]]
    return non_loss, draws


def tictactoe_table(cell: dict, earlier: list[dict]) -> list[str]:
    rows = []
    non_loss, draws = tictactoe_rates(cell)
    for s, a, b in zip(cell["seeds"], non_loss, draws, strict=True):
        r, m = s["random"], s["minimax"]
        rows.append(
            f"| {s['seed']} | {a:.1%} | {r['win']} / {r['draw']} / {r['loss']} | {b:.1%} | "
            f"{m['win']} / {m['draw']} / {m['loss']} |"
        )
    (mean_a, ci_a), (mean_b, ci_b) = t_interval(non_loss), t_interval(draws)
    pool = cell["spec"]["groups"]["player"]["pool"]
    algo, hardware = cell["spec"]["algo"], cell["spec"]["hardware"]
    together = (
        "trained as one batch"
        if hardware.get("batch_seeds")
        else f"{hardware['parallel_runs']} at once"
    )
    lines = [
        "## Tic-tac-toe self-play",
        "",
        f"`{command('tictactoe', cell)}`, {cell['date']}, on {cell['machine']}.",
        "",
        f"MAPPO self-play (`specs/tictactoe_selfplay.yaml`, backend {_backend(cell)}): one "
        f"policy plays both seats; in {pool['share']:.0%} of the games a snapshot plays one "
        f"seat ({pool['sample']}, {pool['size']} kept, one per {pool['every']:,} steps). "
        f"Budget: {cell['env_steps']:,} env steps (moves) per seed, {algo['rollout_steps']}-"
        f"step rollouts of {hardware['num_envs']} envs"
        f"{', the learning rate annealed to zero' if algo.get('anneal_lr') else ''}; "
        f"{cell['wall_s'] / 60:.1f} min for {len(cell['seeds'])} seeds ({together}). Each "
        f"final policy then played {cell['games']} "
        "games against each player, first to move in half of them, acting deterministically.",
        "",
        "| seed | non-loss vs random | win / draw / loss | draws vs minimax | win / draw / loss |",
        "|---|---|---|---|---|",
        *rows,
        f"| mean (95% CI) | {mean_a:.1%} ± {ci_a:.1%} | | {mean_b:.1%} ± {ci_b:.1%} | |",
        "",
        "Targets: ≥ 95% non-loss against random, ≥ 50% draws against minimax "
        f"(worst seed: {min(non_loss):.1%} and {min(draws):.1%}).",
        "",
    ]
    if earlier:
        lines += ["Earlier runs (`bench/results/selfplay.jsonl`), mean over seeds:", ""]
        for old in earlier:
            a, b = (float(np.mean(x)) for x in tictactoe_rates(old))
            lines.append(
                f"- {old['date']}: {old['env_steps']:,} steps per seed, backend "
                f"{_backend(old)}, {old['wall_s'] / 60:.1f} min: non-loss vs random {a:.1%}, "
                f"draws vs minimax {b:.1%}."
            )
        lines.append("")
    return lines


def _backend(cell: dict) -> str:
    return cell["spec"]["env"].get("backend", "pettingzoo")


# ---------------------------------------------------------------- simple_tag


def tag_bodies(overrides: list[str], league: int = 0, spec: str = TAG_SPEC) -> dict[str, dict]:
    """The experiments of `tag`, as specs, in the order they run: the league's (with
    `league` seeds), the population's, the co-learning one's and each held-out kind's."""
    _, base = composed(spec, overrides)
    co = {**base, "groups": {}, "name": "tag-co-learning"}
    bodies = {}
    if league:
        bodies["league"] = {**co, "name": "tag-league", "seeds": [200 + s for s in range(league)]}
    bodies.update(population=base, co_learning=co)
    for k, (key, (_, changes)) in enumerate(held_out_prey(base["algo"]["name"]).items()):
        body = {**co, "name": f"tag-{key.replace('_', '-')}"}
        body["seeds"] = [100 + 10 * k + s for s in base["seeds"]]
        for section, values in changes.items():
            body[section] = {**body[section], **values}
        bodies[key] = body
    return bodies


def tag(args) -> dict:
    """Population-trained and co-learning predators against held-out prey: the experiments
    share one store, so that cross-play can name runs of each."""
    bodies = tag_bodies(args.override, args.league, args.spec)
    base = bodies["population"]
    kinds = held_out_prey(base["algo"]["name"])
    folder = fresh(store(args.spec))
    cells = {}
    for key, body in bodies.items():
        if key == "population" and "league" in cells:
            # The league's prey join the population's pool beside its own snapshots.
            league = [r["run_id"] for r in cells["league"]["summary"]["runs"]]
            body["groups"]["agent"]["pool"]["include"] = league
        summary, wall = run_in(folder, key, body)
        cells[key] = {"summary": summary, "wall_s": wall}
    held = ",".join(cells[key]["summary"]["parent_run_id"] for key in kinds)
    for key in ("population", "co_learning"):
        ours = cells[key]["summary"]
        out, wall = marlctl_json(
            ["eval", ours["parent_run_id"], "--vs", held], folder, f"cross-play {key}"
        )
        mine = {r["run_id"] for r in ours["runs"]}
        cells[key]["matches"] = [
            m for m in out["matches"] if m["seat"] == "adversary" and m["run_id"] in mine
        ]
        cells[key]["eval_s"] = wall
        cells[key]["own"] = own_curve(folder, [r["run_id"] for r in ours["runs"]])
    return {
        **cell("tag", args, base),
        "spec_file": args.spec,
        "held_out": {key: label for key, (label, _) in kinds.items()},
        "cells": {
            key: {
                "wall_s": c["wall_s"],
                "finals": [r["final_return"] for r in c["summary"]["runs"]],
                "run_ids": [r["run_id"] for r in c["summary"]["runs"]],
                "parent": c["summary"]["parent_run_id"],
                "matches": c.get("matches", []),
                **({"own": c["own"]} if "own" in c else {}),
            }
            for key, c in cells.items()
        },
    }


def store(spec: str) -> str:
    """The folder under `WORKDIR` of `tag`'s MLflow store with `spec`: `tag` for the MAPPO
    spec, `tag_maddpg` for `tag_population_maddpg.yaml`."""
    return "tag" + Path(spec).stem.removeprefix(Path(TAG_SPEC).stem)


def own_curve(folder: Path, run_ids: list[str]) -> dict[str, list]:
    """The predators' evaluations in their own runs (`eval/return/adversary`, against the
    prey they trained with): the env steps of each, and per seed run its returns."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    runs = [
        sorted(client.get_metric_history(r, "eval/return/adversary"), key=lambda m: m.step)
        for r in run_ids
    ]
    return {"steps": [m.step for m in runs[0]], "returns": [[m.value for m in h] for h in runs]}


def held_out_kinds(cell: dict) -> dict[str, str]:
    """The kinds of held-out prey of a recorded `tag` result and their labels (results from
    before kinds were recorded held out MAPPO prey at the full budget only)."""
    return cell.get("held_out", {"held_out": "MAPPO, full budget"})


def tag_scores(cell: dict) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
    """Per predator team (population, co-learning): each seed's mean return against every
    held-out prey, and the same against each kind of held-out prey."""
    kinds = held_out_kinds(cell)
    kind_of = {run: key for key in kinds for run in cell["cells"][key]["run_ids"]}
    means, by_kind = {}, {}
    for key in ("population", "co_learning"):
        c = cell["cells"][key]
        means[key], by_kind[key] = [], {k: [] for k in kinds}
        for run_id in c["run_ids"]:
            mine = [m for m in c["matches"] if m["run_id"] == run_id]
            means[key].append(sum(m["score"] for m in mine) / len(mine))
            for k in kinds:
                scores = [m["score"] for m in mine if kind_of.get(m["opponent"]) == k]
                by_kind[key][k].append(sum(scores) / len(scores))
    return means, by_kind


def _mean_ci(values: list[float]) -> str:
    mean, ci = t_interval(values)
    return f"{mean:.2f} ± {ci:.2f}"


def _pool(cell: dict) -> str:
    pool = cell["spec"]["groups"]["agent"]["pool"]
    league = len(pool.get("include", []))
    return f"{pool['sample']}, {pool['size']} kept, one per {pool['every']:,} steps" + (
        f", and {league} league prey" if league else ""
    )


def _league(cell: dict) -> str:
    """How the population's league prey were trained, where it had them."""
    league = cell["cells"].get("league")
    if not league:
        return ""
    return (
        f"; the league prey are the final prey of a co-learning experiment of "
        f"{len(league['run_ids'])} seeds of their own ({league['parent'][:8]}), trained first "
        f"and included in the pool for the whole run (`groups.agent.pool.include`)"
    )


def own_finals(cell: dict) -> dict[str, list[float]] | None:
    """Per team (population, co-learning), each seed's last return against its own prey; None
    for a result recorded before `tag` kept those curves."""
    curves = {k: cell["cells"][k].get("own") for k in ("population", "co_learning")}
    if not all(curves.values()):
        return None
    return {k: [r[-1] for r in c["returns"]] for k, c in curves.items()}


def _compared(means: dict[str, list[float]]):
    """Population against co-learning: Welch's t-test of population above co-learning, and
    the number of seeds whose population team scores above the co-learning team."""
    from scipy import stats

    pop, co = means["population"], means["co_learning"]
    welch = stats.ttest_ind(pop, co, equal_var=False, alternative="greater")
    return welch, sum(a > b for a, b in zip(pop, co, strict=True))


def tag_table(cell: dict, earlier: list[dict]) -> list[str]:
    """The section of `cell`'s spec: `cell` as the table (a result with its own-prey curves),
    `earlier` results of the same spec a line each."""
    pool = cell["spec"]["groups"]["agent"]["pool"]
    kinds = held_out_kinds(cell)
    means, by_kind = tag_scores(cell)
    curves = {k: cell["cells"][k]["own"] for k in ("population", "co_learning")}
    own = own_finals(cell)
    mine = float(np.mean(own["co_learning"]))
    rows = []
    for key, label in (("population", "prey population"), ("co_learning", "one co-learning prey")):
        seeds = ", ".join(f"{v:.2f}" for v in means[key])
        kind_cells = "".join(f" {_mean_ci(by_kind[key][k])} |" for k in kinds)
        by = kind_cells if len(kinds) > 1 else ""
        parent = cell["cells"][key]["parent"][:8]
        rows.append(
            f"| {label} | {_mean_ci(means[key])} | {seeds} |{by} {_mean_ci(own[key])} | "
            f"`{parent}` |"
        )
    (pop, pop_ci), (co, co_ci) = t_interval(means["population"]), t_interval(means["co_learning"])
    gap, apart = pop - co, pop - pop_ci > co + co_ci
    welch, better = _compared(means)
    held = {k: cell["cells"][k] for k in kinds}
    prey = sum(len(h["run_ids"]) for h in held.values())
    parents = ",".join(h["parent"][:8] for h in held.values())
    described = "; ".join(
        f"{kinds[k]} ({h['parent'][:8]}, {len(h['run_ids'])} seeds)" for k, h in held.items()
    )
    header = "| predators trained against | return vs held-out prey (95% CI) | per seed |"
    if len(kinds) > 1:
        header += "".join(f" vs {label} |" for label in kinds.values())
    header += " vs its own prey |"
    algo = cell["spec"]["algo"]["name"].upper()
    lines = [
        f"## simple_tag: {algo} predators trained against a prey population",
        "",
        f"`{command('tag', cell)}`, {cell['date']}, on {cell['machine']}.",
        "",
        f"{algo} on native simple_tag (3 predators, 1 prey, 2 obstacles), "
        f"{cell['env_steps']:,} env steps per seed, seeds {cell['spec']['seeds']} "
        f"(`specs/{cell.get('spec_file', TAG_SPEC)}`). Population: in {pool['share']:.0%} of "
        "the episodes a "
        f"snapshot of the prey plays it ({_pool(cell)}), so the predators learn against past "
        f"prey as well as the current one{_league(cell)}. Co-learning: the same spec without "
        "the pool. Held "
        f"out: prey from experiments with seeds of their own, which neither team saw: "
        f"{described}. The return is the predators' mean per-agent return against each "
        f"held-out prey, {prey} prey per predator team, from `marlctl eval RUN --vs {parents}` "
        "(cross-play, stored with the runs), then averaged per seed. 'vs its own prey': the "
        "team's last evaluation in its own run, against the current prey it trained with "
        f"({cell['spec']['train']['eval_episodes']} episodes).",
        "",
        header + " run |",
        "|---|---|---|" + "---|" * ((len(kinds) if len(kinds) > 1 else 0) + 1) + "---|",
        *rows,
        "",
        f"Target: the population-trained predators beat the co-learning ones against held-out "
        f"prey (seed by seed: {better} of {len(means['population'])}; the means differ by "
        f"{gap:+.2f}, {'beyond' if apart else 'inside'} their 95% intervals; Welch's t-test, "
        f"population above co-learning: t = {welch.statistic:.2f}, one-sided p = "
        f"{welch.pvalue:.3f}; median seeds {np.median(means['population']):.2f} and "
        f"{np.median(means['co_learning']):.2f}).",
        "",
        f"Against the prey they trained with, the co-learning predators return {mine:.2f}, "
        f"{mine - co:+.2f} beside their return against held-out prey (a positive gap is "
        "what they fit to that one prey and no other). Each team's return against its own "
        "prey over training, mean over seeds (env steps: population, co-learning):",
        "",
        *(
            f"- {step:,}: {a:.2f}, {b:.2f}"
            for step, a, b in zip(
                curves["co_learning"]["steps"],
                np.mean(curves["population"]["returns"], axis=0),
                np.mean(curves["co_learning"]["returns"], axis=0),
                strict=True,
            )
        ),
        "",
    ]
    if earlier:
        lines += ["Earlier runs (`bench/results/selfplay.jsonl`):", ""]
        for old in earlier:
            m, _ = tag_scores(old)
            welch, better = _compared(m)
            held_out = held_out_kinds(old)
            n_prey = sum(len(old["cells"][k]["run_ids"]) for k in held_out)
            lines.append(
                f"- {old['date']}, `{command('tag', old)}`: {len(old['spec']['seeds'])} seeds "
                f"of {old['env_steps']:,} steps, pool {_pool(old)}, {n_prey} held-out prey "
                f"({len(held_out)} {'kinds' if len(held_out) > 1 else 'kind'}): "
                f"population {_mean_ci(m['population'])}, co-learning "
                f"{_mean_ci(m['co_learning'])}; {better} of {len(m['population'])} seeds "
                f"better, Welch's one-sided p = {welch.pvalue:.3f}; median seeds "
                f"{np.median(m['population']):.2f} and {np.median(m['co_learning']):.2f}"
                + (
                    f"; against their own prey {_mean_ci(own['population'])} and "
                    f"{_mean_ci(own['co_learning'])}."
                    if (own := own_finals(old))
                    else "."
                )
            )
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=["tictactoe", "tag"])
    parser.add_argument("--games", type=int, default=GAMES)
    parser.add_argument("--override", action="append", default=[], help="spec override")
    parser.add_argument(
        "--spec", default=TAG_SPEC, help="tag: the population's spec, a file of specs/"
    )
    parser.add_argument("--table", action="store_true", help="rewrite the table only")
    parser.add_argument(
        "--league",
        type=int,
        default=0,
        help="tag: prey of this many co-learning seeds of their own, trained first, join the "
        "population's pool for the whole run",
    )
    args = parser.parse_args()
    if not args.table:
        cell = tictactoe(args) if args.part == "tictactoe" else tag(args)
        DONE.parent.mkdir(parents=True, exist_ok=True)
        with DONE.open("a") as f:
            f.write(json.dumps(cell) + "\n")
    write_table()


def write_table() -> None:
    cells: dict[str, list[dict]] = {}
    if DONE.exists():
        for line in DONE.read_text().splitlines():
            cell = json.loads(line)
            cells.setdefault(cell["part"], []).append(cell)
    lines = ["# Self-play and population training", ""]
    if "tictactoe" in cells:
        *earlier, latest = cells["tictactoe"]
        lines += tictactoe_table(latest, earlier)
    by_spec: dict[str, list[dict]] = {}
    for cell in cells.get("tag", []):
        by_spec.setdefault(cell.get("spec_file", TAG_SPEC), []).append(cell)
    for runs in by_spec.values():
        *earlier, latest = runs
        lines += tag_table(latest, earlier)
    OUT.write_text("\n".join(lines))
    print(OUT.read_text())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
