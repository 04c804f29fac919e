"""Benchmark: every registered algorithm on MPE simple_spread and simple_speaker_listener.

For each algorithm × task: 5 seeds trained as one batch on the native backend (discrete
actions, N=3 and 25 steps for simple_spread), through `marlctl run`. Reports the final
per-agent eval return (mean over seeds and its 95% confidence interval, Student t), the env
steps used per seed and the wall-clock time of the batch. Writes `bench/results/algorithms.md`.

    .venv/bin/python bench/algorithms.py                        # every algorithm, both tasks
    .venv/bin/python bench/algorithms.py --algos qmix,vdn --envs simple_spread
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import date
from pathlib import Path

import yaml
from pettingzoo_mappo import machine, marlctl_json

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "algorithms.md"
WORKDIR = ROOT / "bench" / "runs"  # the MLflow store of benchmark runs (not committed)
# Every finished cell, raw (the seeds' returns); an interrupted benchmark resumes from here.
DONE = ROOT / "bench" / "results" / "algorithms.jsonl"

TASKS = {
    "simple_spread": {"N": 3, "max_cycles": 25, "local_ratio": 0.5},
    "simple_speaker_listener": {"max_cycles": 25},
}
# Per family: env steps per seed, parallel envs per seed and algorithm settings.
ON_POLICY = {"num_envs": 128, "algo": {"epochs": 4, "minibatches": 4, "lr": 1e-3}}
OFF_POLICY = {"num_envs": 32, "algo": {"batch_size": 256, "updates": 2}}


def spec_for(algo: str, task: str, steps: int, seeds: int, on_policy: bool) -> dict:
    family = ON_POLICY if on_policy else OFF_POLICY
    return {
        "name": f"bench-{algo}-{task}",
        "seeds": list(range(seeds)),
        "env": {"id": f"mpe/{task}", "backend": "native", "params": TASKS[task]},
        "algo": {"name": algo, **family["algo"]},
        "train": {
            "total_env_steps": steps,
            "eval_every": max(steps // 10, 1),
            "eval_episodes": 100,
            "checkpoint_every": 0,
        },
        "hardware": {
            "device": "cpu",
            "num_envs": family["num_envs"],
            "batch_seeds": True,
            "threads_per_run": 2,
        },
    }


def t_interval(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of its 95% Student-t confidence interval."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)


def run(algo: str, task: str, steps: int, seeds: int, on_policy: bool) -> dict:
    WORKDIR.mkdir(parents=True, exist_ok=True)
    path = WORKDIR / f"{algo}-{task}.yaml"
    path.write_text(yaml.safe_dump(spec_for(algo, task, steps, seeds, on_policy)))
    summary, wall = marlctl_json(["run", str(path)], WORKDIR, f"{algo} on {task}")
    returns = [r["final_return"] for r in summary["runs"] if r["final_return"] is not None]
    mean, half = t_interval(returns)
    return {
        "algo": algo,
        "task": task,
        "mean": mean,
        "ci": half,
        "returns": returns,
        "budget": steps,
        "env_steps": max(r["env_steps"] for r in summary["runs"]),
        "wall_s": wall,
        "ok": summary["ok"],
    }


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from marlctl.algos import registered_algos

    algos = registered_algos()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default=",".join(algos))
    parser.add_argument("--envs", default=",".join(TASKS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--on-policy-steps", type=int, default=1_000_000)
    parser.add_argument("--off-policy-steps", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--note", default="", help="a sentence for the table's header")
    parser.add_argument(
        "--table", action="store_true", help="only write the table of the cells recorded so far"
    )
    args = parser.parse_args()
    done = load_done()
    rows = []
    shown = [a for a in sys.argv[1:] if a not in ("--note", args.note, "--table")]
    command = " ".join([".venv/bin/python bench/algorithms.py", *shown])
    for task in args.envs.split(","):
        for algo in args.algos.split(","):
            on = algos[algo].on_policy
            steps = args.on_policy_steps if on else args.off_policy_steps
            key = (algo, task, steps, args.seeds)
            row = done.get(key)
            if row is None and args.table:
                continue
            if row is None:
                row = run(algo, task, steps, args.seeds, on)
                with DONE.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
            rows.append(row)
            write_table(args.out, rows, command, args.seeds, args.note)


def load_done() -> dict[tuple, dict]:
    """Cells finished by an earlier invocation, keyed by (algo, task, env steps, seeds)."""
    if not DONE.exists():
        return {}
    rows = [json.loads(line) for line in DONE.read_text().splitlines() if line.strip()]
    return {(r["algo"], r["task"], r["budget"], len(r["returns"])): r for r in rows if r["ok"]}


def write_table(out: Path, rows: list[dict], command: str, seeds: int, note: str) -> None:
    lines = [
        "# Algorithms on MPE (native backend, discrete actions)",
        "",
        f"Measured {date.today()} with `{command}` on {machine()}.",
        "",
        f"{seeds} seeds per cell, trained as one batch (`hardware.batch_seeds`); final eval "
        "return = mean over 100 deterministic episodes of the per-agent episode return; "
        "± is the 95% Student-t interval over seeds. Settings: on-policy "
        f"{ON_POLICY}, off-policy {OFF_POLICY} (the rest are each algorithm's defaults).",
        "For scale on simple_spread (DESIGN.md §6): a uniform random policy scores about "
        "-26.6, a scripted nearest-landmark assignment about -9.3. Published MPE tables train "
        "for 10-20M env steps; these budgets are what 2 CPU cores do in minutes.",
        *([note] if note else []),
        "",
        "| task | algo | final eval return | 95% CI | env steps per seed | wall-clock, all seeds |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['algo']} | {r['mean']:.2f} | ± {r['ci']:.2f} | "
            f"{r['env_steps']:,} | {r['wall_s'] / 60:.1f} min |"
        )
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
