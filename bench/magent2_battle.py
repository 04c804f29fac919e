"""Benchmark: MAgent2 battle's training throughput against the env's own stepping cost, from
20 to 484 agents per army.

For each map size, the env alone: one `magent2.environments.battle_v4` stepped with random
actions (numpy, no learner), env steps per second. Then training: `marlctl run` of IPPO with
a small cnn encoder, the red army learning against random blue agents
(`groups: {blue: {scripted: random}}`), 8 env copies stepped in turn in the process, its
`perf/env_steps_per_s_mean`. The ratio is training's rate over the env's: 0.5 means training
costs twice the env's own steps.
Writes `bench/results/magent2_battle.md`.

`--learn` runs `specs/magent2_battle_mappo.yaml` instead (MAPPO, the red army learning
against random blue agents on a 25x25 map, 3 seeds) at `--steps` env steps per seed, and
reads each seed's evaluation win rate and return before its first update and at the end, and
the share of its training battles won at its first and last logging; beside them, the red
army's win rate when both armies act at random (`--episodes` battles, the same rule: more
agents left on the map at the end).
Each measurement is kept in `bench/results/magent2_battle_learning.jsonl` with its date and
machine; writes `bench/results/magent2_battle_learning.md`.

    .venv/bin/python bench/magent2_battle.py                    # every map size
    .venv/bin/python bench/magent2_battle.py --maps 50 --seconds 20
    .venv/bin/python bench/magent2_battle.py --learn            # 100k env steps per seed, 25 min
    .venv/bin/python bench/magent2_battle.py --learn --env-param attack_penalty=0.0
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import date
from pathlib import Path

import numpy as np
import yaml
from common import machine, marlctl_json, measured_on

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "magent2_battle.md"
WORKDIR = ROOT / "bench" / "runs" / "magent2"
LEARN_SPEC = ROOT / "specs" / "magent2_battle_mappo.yaml"
LEARN_OUT = ROOT / "bench" / "results" / "magent2_battle_learning.md"
LEARN_JSONL = ROOT / "bench" / "results" / "magent2_battle_learning.jsonl"
MAPS = (25, 50, 70, 100, 112)  # 20, 100, 196, 400 and 484 agents per army
TRAIN = {
    "algo": {"name": "ippo", "rollout_steps": 32, "epochs": 2, "minibatches": 2},
    "model": {"hidden": [64], "encoder": "cnn",
              "cnn": {"channels": [16, 32], "kernels": [3, 3], "strides": [2, 1]}},
    "groups": {"blue": {"scripted": "random"}},
    "hardware": {"device": "cpu", "num_envs": 8},
}  # fmt: skip


def env_rate(map_size: int, seconds: float) -> tuple[int, float]:
    """Agents per army, and env steps per second of the env alone with random actions."""
    from magent2.environments import battle_v4

    env = battle_v4.parallel_env(map_size=map_size, max_cycles=1000)
    env.reset(seed=0)
    agents = len(env.agents) // 2
    rng = np.random.default_rng(0)
    n = env.action_space(env.agents[0]).n
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step({a: int(rng.integers(n)) for a in env.agents})
        steps += 1
        if not env.agents:
            env.reset()
    rate = steps / (time.perf_counter() - start)
    env.close()
    return agents, rate


def train_rate(map_size: int, steps: int) -> float:
    """Training's mean env steps per second over `steps` env steps."""
    folder = WORKDIR / f"battle-{map_size}"
    folder.mkdir(parents=True, exist_ok=True)
    body = {
        "name": f"magent2-battle-{map_size}",
        "env": {"id": "magent2/battle", "params": {"map_size": map_size, "max_cycles": 1000}},
        **TRAIN,
        "train": {
            "total_env_steps": steps,
            "eval_every": 0,
            "eval_episodes": 1,
            "checkpoint_every": 0,
        },  # fmt: skip
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    summary, _ = marlctl_json(["run", str(path)], folder, f"battle-{map_size}")
    return float(summary["runs"][0]["steps_per_s"])


def random_wins(params: dict, episodes: int, seed: int = 0) -> float:
    """The red army's win rate when both armies act uniformly at random, by the rule a run's
    `win_rate` uses (marlctl's env slice, `wins_for="red"`)."""
    from marlctl.envs.pettingzoo import EnvSlice
    from marlctl.envs.probe import probe

    info = probe("magent2/battle", params)
    envs = EnvSlice("magent2/battle", params, info, 1, wins_for="red")
    rng = np.random.default_rng(seed)
    envs.reset(seed)
    won = ended = 0
    while ended < episodes:
        actions = {g.name: rng.integers(g.n_actions, size=(1, g.n_agents)) for g in info.groups}
        _, rew, _ = envs.step(actions)
        if rew["terminated"][0] or rew["truncated"][0]:
            ended += 1
            won += int(rew["won"][0])
    envs.close()
    return won / episodes


def curves(client, run_ids: list[str]) -> dict[str, list[float]]:
    """Per seed run: its evaluations' win rate and return per agent before the first update
    and at the end (the most probable actions), and the share of its training battles won
    (sampled actions) at the first and the last logging."""
    ends = {
        "win_rates": ("eval/win_rate", -1), "untrained_win_rates": ("eval/win_rate", 0),
        "returns": ("eval/return_mean", -1), "untrained_returns": ("eval/return_mean", 0),
        "train_win_rates": ("train/win_rate", -1),
        "first_train_win_rates": ("train/win_rate", 0),
    }  # fmt: skip
    out: dict[str, list[float]] = {name: [] for name in ends}
    for run_id in run_ids:
        histories = {}
        for name, (key, at) in ends.items():
            if key not in histories:
                histories[key] = sorted(
                    client.get_metric_history(run_id, key), key=lambda m: m.step
                )
            out[name].append(histories[key][at].value)
    return out


def learn(steps: int, episodes: int, env_params: list[str]) -> dict:
    """MAPPO's red army against random blue agents (the env's parameters changed by
    `env_params`, KEY=VALUE): each seed's run id, its `curves` and env steps per second; and
    random play's win rate."""
    from mlflow.tracking import MlflowClient

    from marlctl.spec import load_spec

    folder = WORKDIR / "learn"
    folder.mkdir(parents=True, exist_ok=True)
    # Two seeds at once, one core each: the env steps on the core of its run's process.
    overrides = [f"train.total_env_steps={steps}", "hardware.parallel_runs=2"]
    overrides += [f"+env.params.{item}" for item in env_params]
    if steps < load_spec(str(LEARN_SPEC), []).spec.train.eval_every:  # a short check
        overrides.append(f"train.eval_every={steps}")
    spec = load_spec(str(LEARN_SPEC), overrides).spec
    summary, wall = marlctl_json(["run", str(LEARN_SPEC), *overrides], folder, "battle-learn")
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    runs = summary["runs"]
    failed = [f"seed {r['seed']}: {r.get('error')}" for r in runs if r["status"] != "FINISHED"]
    if failed:
        raise SystemExit("battle-learn: a run did not finish: " + "; ".join(failed))

    return {
        "overrides": overrides,
        "steps": steps,
        "map_size": spec.env.params["map_size"],
        "seeds": [r["seed"] for r in runs],
        "run_ids": [r["run_id"] for r in runs],
        "env_params": env_params,
        **curves(client, [r["run_id"] for r in runs]),
        "eval_episodes": spec.train.eval_episodes,
        "steps_per_s": [float(r["steps_per_s"]) for r in runs],
        "wall_s": wall,
        "random_win_rate": random_wins(dict(spec.env.params), episodes),
        "random_episodes": episodes,
    }


def learn_page(rows: list[dict]) -> list[str]:
    """The latest row of each set of env parameters, the default rewards first."""
    latest = {tuple(r["env_params"]): r for r in rows}
    rows = sorted(latest.values(), key=lambda r: len(r["env_params"]))
    r = rows[0]
    lines = [
        "# MAgent2 battle: MAPPO against a random army",
        "",
        "Written by `.venv/bin/python bench/magent2_battle.py --learn [--env-param KEY=VALUE]`"
        f" (`--table` rewrites it from the kept rows); measured {measured_on(rows)}.",
        "",
        "`marlctl run specs/magent2_battle_mappo.yaml` with each row's overrides: "
        f"MAPPO, the red army of 20 learning on a {r['map_size']}x{r['map_size']} map against "
        "20 blue agents that act uniformly at random; each agent's 13x13 view through a cnn "
        "encoder (16 and 32 channels of 3x3), the critic convolving the map; two seeds at "
        "once, one core each. An army wins a battle that ends with more of its agents left "
        "on the map than the other's (an army wiped out, or the 1,000-step time limit). "
        f"Evaluations: {r['eval_episodes']} battles with each agent's most probable action, "
        "before the first update (untrained) and at the end (final); the return is per red "
        "agent, summed over the battle. Training battles: the share of the battles that "
        "ended since the previous logging that the army won, acting with sampled actions as "
        "it trains, at the first logging (after about 8k env steps) and the last. Random "
        f"play: both armies at random, {r['random_episodes']} battles. The env's rewards "
        "(battle_v4's defaults): 5 for a kill, 0.2 for attacking an opponent, -0.1 for any "
        "attack, -0.1 for dying, -0.005 a step; a row's `env.params` change them.",
        "",
        "| red army | overrides | evaluation win rate per seed, untrained → final | mean "
        "final | evaluation return, untrained → final (mean) | training battles won, first "
        "→ last (per seed) | env steps/s per seed | random play |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def per_seed(first: list[float], last: list[float]) -> str:
        return ", ".join(f"{a:.2f} → {b:.2f}" for a, b in zip(first, last, strict=True))

    mean = statistics.fmean
    for r in rows:
        lines.append(
            f"| MAPPO | `{' '.join(r['overrides'])}` | "
            f"{per_seed(r['untrained_win_rates'], r['win_rates'])} | "
            f"{mean(r['win_rates']):.2f} | "
            f"{mean(r['untrained_returns']):.2f} → {mean(r['returns']):.2f} | "
            f"{per_seed(r['first_train_win_rates'], r['train_win_rates'])} | "
            f"{mean(r['steps_per_s']):,.0f} | {r['random_win_rate']:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--maps", default=",".join(map(str, MAPS)))
    parser.add_argument("--seconds", type=float, default=10.0, help="the env alone, per map")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--learn", action="store_true", help="MAPPO against a random army")
    parser.add_argument("--steps", type=int, default=100_000, help="--learn: per seed")
    parser.add_argument("--episodes", type=int, default=200, help="--learn: random battles")
    parser.add_argument("--table", action="store_true", help="--learn: rewrite the page only")
    parser.add_argument(
        "--env-param", action="append", default=[], help="--learn: KEY=VALUE, an env parameter"
    )
    args = parser.parse_args()
    if args.learn:
        rows = [json.loads(line) for line in LEARN_JSONL.read_text().splitlines()] if (
            LEARN_JSONL.exists()) else []  # fmt: skip
        if not args.table:
            row = learn(args.steps, args.episodes, args.env_param)
            row |= {"date": str(date.today()), "machine": machine("cpu")}
            print(json.dumps(row), flush=True)
            with LEARN_JSONL.open("a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
        LEARN_OUT.write_text("\n".join(learn_page(rows)) + "\n")
        print(f"wrote {LEARN_OUT}")
        return
    rows = []
    for map_size in (int(m) for m in args.maps.split(",")):
        agents, alone = env_rate(map_size, args.seconds)
        # About the env alone's number of steps in `seconds`, in whole rollouts (at least 4)
        steps = max(4, round(alone * args.seconds / 32)) * 32
        trained = train_rate(map_size, steps)
        rows.append({"map_size": map_size, "agents": agents, "env_alone": alone,
                     "training": trained, "steps": steps})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    command = " ".join(["bench/magent2_battle.py", *(f"--{k} {v}" for k, v in vars(args).items()
                                               if k != "out")])  # fmt: skip
    lines = [
        "# MAgent2 battle: training throughput against the env's own stepping cost",
        "",
        f"Measured {date.today()} with `.venv/bin/python {command}` on {machine('cpu')}.",
        "",
        "The env alone: one `battle_v4` env stepped with random actions by numpy. Training: "
        "`marlctl run` of IPPO with a cnn encoder (16 and 32 channels of 3x3, a hidden layer "
        "of 64; rollouts of 32 steps, 2 epochs of 2 minibatches), the red army learning "
        "against random blue agents, 8 env copies stepped in turn; its mean env steps per "
        "second, start-up excluded. Ratio: training over the env alone (0.5 = training costs "
        "twice the env).",
        "",
        "| map | agents per army | env alone (steps/s) | training (steps/s) | ratio | "
        "training steps |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['map_size']}x{r['map_size']} | {r['agents']} | {r['env_alone']:,.0f} | "
            f"{r['training']:,.0f} | {r['training'] / r['env_alone']:.2f} | {r['steps']:,} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
