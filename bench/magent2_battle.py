"""Benchmark: MAgent2 battle's training throughput against the env's own stepping cost, from
20 to 484 agents per army.

For each map size, the env alone: one `magent2.environments.battle_v4` stepped with random
actions (numpy, no learner), env steps per second. Then training: `marlctl run` of IPPO with
a small cnn encoder, the red army learning against random blue agents
(`groups: {blue: {scripted: random}}`), 8 env copies stepped in turn in the process, its
`perf/env_steps_per_s_mean`. The ratio is training's rate over the env's: 0.5 means training
costs twice the env's own steps.
Writes `bench/results/magent2_battle.md`.

    .venv/bin/python bench/magent2_battle.py                    # every map size
    .venv/bin/python bench/magent2_battle.py --maps 50 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

import numpy as np
import yaml
from common import machine, marlctl_json

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "magent2_battle.md"
WORKDIR = ROOT / "bench" / "runs" / "magent2"
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--maps", default=",".join(map(str, MAPS)))
    parser.add_argument("--seconds", type=float, default=10.0, help="the env alone, per map")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
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
