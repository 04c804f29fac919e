"""Benchmark: MAPPO on MPE simple_spread (N=3, 25 steps) through the PettingZoo backend.

Measures (1) the raw mpe2 env with random actions, one env, as the reference ceiling, and
(2) `marlctl run specs/spread_mappo_2m.yaml`: training env steps/s and the per-agent eval
return after 2M env steps. Writes `bench/results/pettingzoo_mappo.md`.

    .venv/bin/python bench/pettingzoo_mappo.py                 # full run, about 25 minutes
    .venv/bin/python bench/pettingzoo_mappo.py --run-id ID --tracking-uri sqlite:///x.db
                                                               # tabulate a finished run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from common import machine

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "spread_mappo_2m.yaml"
OUT = ROOT / "bench" / "results" / "pettingzoo_mappo.md"
WORKDIR = ROOT / "bench" / "runs"  # the MLflow store of benchmark runs (not committed)


def env_only(seconds: float = 10.0) -> tuple[float, float]:
    """Random-action steps/s and per-agent episode return of one mpe2 simple_spread env."""
    import numpy as np
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(N=3, max_cycles=25)
    steps, returns, episode = 0, [], 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.reset(seed=episode)
        total = 0.0
        while env.agents:
            _, rewards, _, _, _ = env.step({a: env.action_space(a).sample() for a in env.agents})
            total += sum(rewards.values()) / len(rewards)
            steps += 1
        returns.append(total)
        episode += 1
    return steps / (time.perf_counter() - start), float(np.mean(returns))


def train(workdir: Path) -> tuple[str, str, float]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "marlctl", "run", str(SPEC), "--json"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=True,
    )
    summary = json.loads(done.stdout)
    return summary["runs"][0]["run_id"], summary["tracking_uri"], time.perf_counter() - start


def tabulate(run_id: str, uri: str, wall: float | None) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(run_id)

    def series(key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))

    evals = series("eval/return_mean")
    rates = [v for _, v in series("perf/env_steps_per_s")]
    mean_rate = run.data.metrics.get("perf/env_steps_per_s_mean")
    if wall is None:
        wall = (run.info.end_time - run.info.start_time) / 1000
    below = next((s for s, v in evals if v > -15), None)
    reached = f"{below:,} env steps" if below else "not reached"
    env_rate, random_return = env_only()
    lines = [
        "# MAPPO on MPE simple_spread through the PettingZoo backend",
        "",
        f"Measured {date.today().isoformat()} with `python bench/pettingzoo_mappo.py` "
        f"(spec `specs/spread_mappo_2m.yaml`: N=3, max_cycles=25, MAPPO paper defaults, "
        f"num_envs=32, one seed).",
        "",
        f"Machine: {machine()}.",
        "",
        "| what | figure |",
        "|---|---|",
        f"| mpe2 env alone, one env, random actions | {env_rate:,.0f} env steps/s |",
        f"| per-agent episode return, uniform random policy | {random_return:.2f} |",
        f"| training throughput, whole run (rollout + update + eval) | {mean_rate:,.0f} "
        "env steps/s |",
        f"| training throughput, median of logged iterations | {statistics.median(rates):,.0f} "
        "env steps/s |",
        f"| env steps trained | {int(evals[-1][0]):,} |",
        "| per-agent eval return after 2M env steps (64 episodes, deterministic) | "
        f"{evals[-1][1]:.2f} |",
        f"| first evaluation better than -15 | {reached} |",
        f"| wall-clock | {wall / 60:.1f} min |",
        "",
        "Eval curve (env steps → per-agent return):",
        "",
        "| env steps | " + " | ".join(f"{s // 1000}k" for s, _ in evals) + " |",
        "|---" * (len(evals) + 1) + "|",
        "| return | " + " | ".join(f"{v:.1f}" for _, v in evals) + " |",
        "",
        f"MLflow run `{run_id}` (store: `bench/runs/mlflow.db` on the machine that ran it).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-id", help="tabulate this finished run instead of training")
    parser.add_argument("--tracking-uri", help="MLflow store of --run-id")
    args = parser.parse_args()
    if args.run_id:
        table = tabulate(
            args.run_id, args.tracking_uri or f"sqlite:///{Path.cwd()}/mlflow.db", None
        )
    else:
        WORKDIR.mkdir(parents=True, exist_ok=True)
        run_id, uri, wall = train(WORKDIR)
        table = tabulate(run_id, uri, wall)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(table)
    print(table)


if __name__ == "__main__":
    main()
