"""Benchmark: a TPE sweep of MAPPO on MPE simple_spread, with median pruning and without.

Both sweeps search the same space (`sweeps/mappo_core.yaml`: lr, epochs, clip, entropy
bonus) with the same sampler seed and trial budget, through `marlctl sweep`, one worker each.
Reports the best objective found, the env steps spent over all trials, the trial counts and
the wall-clock time. Writes `bench/results/sweep.md`.

    .venv/bin/python bench/sweep.py                      # 40 trials each
    .venv/bin/python bench/sweep.py --trials 10 --steps 50000
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from datetime import date
from pathlib import Path

import yaml
from common import machine, marlctl_json

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "sweep.md"
WORKDIR = ROOT / "bench" / "runs" / "sweep"  # studies and MLflow store (not committed)


def spec_for(pruner: str, trials: int, steps: int, seeds: int) -> dict:
    return {
        "name": f"sweep-bench-{pruner}",
        "defaults": [
            {"envs": "simple_spread"},
            {"algos": "mappo"},
            {"sweeps": "mappo_core"},
            "_self_",
        ],
        "seeds": list(range(seeds)),
        "env": {"backend": "native", "params": {"N": 3, "max_cycles": 25, "local_ratio": 0.5}},
        "train": {
            "total_env_steps": steps,
            "eval_every": steps // 5,
            "eval_episodes": 32,
            "checkpoint_every": 0,
        },
        "hardware": {"device": "cpu", "num_envs": 64, "threads_per_run": 2, "batch_seeds": True},
        "sweep": {
            "trials": trials,
            "sampler": "tpe",
            "pruner": pruner,
            "seed": 0,
            "startup_trials": 5,
        },
    }


def run(pruner: str, trials: int, steps: int, seeds: int) -> dict:
    folder = WORKDIR / pruner
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_for(pruner, trials, steps, seeds), sort_keys=False))
    summary, wall = marlctl_json(["sweep", str(path)], folder, f"sweep with pruner {pruner}")
    return {
        "pruner": pruner,
        "best": summary["best"]["value"] if summary["best"] else None,
        "best_params": summary["best"]["params"] if summary["best"] else None,
        "env_steps": summary["env_steps"],
        "counts": summary["counts"],
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per trial")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = []
    for pruner in ("median", "none"):
        row = run(pruner, args.trials, args.steps, args.seeds)
        print(json.dumps(row), flush=True)
        rows.append(row)
    command = " ".join([".venv/bin/python bench/sweep.py", *sys.argv[1:]])
    unpruned = next(r for r in rows if r["pruner"] == "none")
    per_trial = unpruned["env_steps"] // max(sum(unpruned["counts"].values()), 1)
    lines = [
        "# Sweep: TPE over MAPPO on simple_spread, median pruning vs none",
        "",
        f"Measured {date.today()} with `{command}` on {machine()}.",
        "",
        f"Each sweep: {args.trials} trials of MAPPO on native MPE simple_spread (N=3, 25 steps), "
        f"{args.steps:,} env steps per trial and seed, {args.seeds} seed(s) per trial, space "
        "`sweeps/mappo_core.yaml` (lr, epochs, clip, entropy bonus), TPE with seed 0 and 5 "
        "startup trials, one worker. Objective: final per-agent eval return (32 episodes). "
        f"Without pruning every trial runs its whole budget, {per_trial:,} env steps over its "
        "seeds (whole training iterations).",
        "",
        "| pruner | best objective | env steps, all trials | complete | pruned | failed | "
        "wall-clock |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["counts"]
        best = "-" if r["best"] is None else f"{r['best']:.2f}"
        lines.append(
            f"| {r['pruner']} | {best} | {r['env_steps']:,} | {c.get('COMPLETE', 0)} | "
            f"{c.get('PRUNED', 0)} | {c.get('FAIL', 0)} | {r['wall_s'] / 60:.1f} min |"
        )
    lines += ["", "Best parameters found:", ""]
    for r in rows:
        lines.append(f"- {r['pruner']}: `{json.dumps(r['best_params'])}`")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
