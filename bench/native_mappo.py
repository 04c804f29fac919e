"""Benchmark: the native MPE backend and MAPPO training on it, against mpe2.

Measures (1) one mpe2 simple_spread env with random actions, the reference; (2) native
simple_spread env-only throughput over num_envs at 1 and 2 threads (`marlctl bench
--env-only`); (3) every native MPE task at 4,096 envs; (4) MAPPO training throughput over
num_envs for `specs/spread_mappo_native.yaml` (`marlctl bench`); (5) a full
`marlctl run specs/spread_mappo_native.yaml`: throughput, eval curve and the wall-clock time
to a per-agent eval return better than -15; (6) 8 seeds trained as one batch
(`hardware.batch_seeds`) against one seed, per seed, over num_envs. Writes
`bench/results/native_mappo.md`.

    .venv/bin/python bench/native_mappo.py          # about 10 minutes on 2 cores
"""

from __future__ import annotations

import argparse
from datetime import date
from pathlib import Path

from common import machine, marlctl_json, table
from pettingzoo_mappo import env_only

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "spread_mappo_native.yaml"
OUT = ROOT / "bench" / "results" / "native_mappo.md"
WORKDIR = ROOT / "bench" / "runs"  # the MLflow store of benchmark runs (not committed)
ENV_SWEEP = "16,64,256,1024,4096,16384"
TRAIN_SWEEP = "128,256,512,1024,2048"
SEED_SWEEP = "8,16,32,64,256"
# The tables below were measured with 2 threads; the spec's auto gives as many on an idle
# 2-core machine, fewer where other processes keep cores busy.
TWO_THREADS = ("hardware.threads_per_run=2",)


def marlctl(*args: str) -> dict:
    return marlctl_json(list(args), WORKDIR, f"marlctl {args[0]}")[0]


def env_sweep(threads: int) -> dict:
    return marlctl(
        "bench", str(SPEC), "--env-only", "--num-envs", ENV_SWEEP, "--seconds", "2",
        f"hardware.threads_per_run={threads}", "hardware.device=cpu",
    )  # fmt: skip


def every_task() -> list[tuple[str, float]]:
    from marlctl.envs.native import NATIVE

    rows = []
    for env_id in NATIVE:
        data = marlctl(
            "bench", str(SPEC), "--env-only", "--num-envs", "4096", "--seconds", "1",
            f"env.id={env_id}", "~env.params", "hardware.device=cpu", *TWO_THREADS,
        )  # fmt: skip
        rows.append((env_id, data["points"][0]["env_steps_per_s"]))
    return rows


def train_sweep() -> dict:
    return marlctl(
        "bench", str(SPEC), "--num-envs", TRAIN_SWEEP, "--seconds", "5", "hardware.device=cpu",
        *TWO_THREADS,
    )  # fmt: skip


def seed_batches() -> dict[int, dict]:
    return {
        seeds: marlctl(
            "bench",
            str(SPEC),
            "--num-envs",
            SEED_SWEEP,
            "--seconds",
            "4",
            f"seeds=[{','.join(map(str, range(seeds)))}]",
            "hardware.batch_seeds=true",
            "hardware.device=cpu",
            *TWO_THREADS,
        )  # fmt: skip
        for seeds in (1, 8)
    }


def full_run() -> dict:
    from mlflow.tracking import MlflowClient

    summary = marlctl("run", str(SPEC), "hardware.device=cpu", *TWO_THREADS)
    run_id = summary["runs"][0]["run_id"]
    client = MlflowClient(summary["tracking_uri"])
    run = client.get_run(run_id)
    history = sorted(client.get_metric_history(run_id, "eval/return_mean"), key=lambda m: m.step)
    first = next((m for m in history if m.value > -15), None)
    return {
        "run_id": run_id,
        "steps_per_s": run.data.metrics["perf/env_steps_per_s_mean"],
        "wall_s": (run.info.end_time - run.info.start_time) / 1000,
        "evals": [(m.step, m.value) for m in history],
        "first_below": None
        if first is None
        else (first.step, (first.timestamp - run.info.start_time) / 1000),
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    WORKDIR.mkdir(parents=True, exist_ok=True)
    mpe2_rate, _ = env_only()
    sweeps = {threads: env_sweep(threads) for threads in (1, 2)}
    tasks = every_task()
    training = train_sweep()
    batches = seed_batches()
    run = full_run()

    env_rows = []
    for index, point in enumerate(sweeps[1]["points"]):
        other = sweeps[2]["points"][index]
        env_rows.append(
            [
                f"{point['num_envs']:,}",
                f"{point['env_steps_per_s']:,.0f}",
                f"{other['env_steps_per_s']:,.0f}",
                f"{other['agent_steps_per_s']:,.0f}",
                f"{max(point['env_steps_per_s'], other['env_steps_per_s']) / mpe2_rate:,.0f}×",
            ]
        )
    best = max(p["env_steps_per_s"] for s in sweeps.values() for p in s["points"])
    train_rows = [
        [
            f"{p['num_envs']:,}",
            f"{p['env_steps_per_s']:,.0f}",
            f"{p['agent_steps_per_s']:,.0f}",
            f"{p['peak_memory_mb']:,.0f}",
        ]
        for p in training["points"]
        if p["kind"] == "train"
    ]
    seed_rows = []
    alone = [p for p in batches[1]["points"] if p["kind"] == "train"]
    together = [p for p in batches[8]["points"] if p["kind"] == "train"]
    for one, eight in zip(alone, together, strict=True):
        share = eight["env_steps_per_s_per_seed"] / one["env_steps_per_s"]
        seed_rows.append(
            [
                f"{one['num_envs']:,}",
                f"{one['env_steps_per_s']:,.0f}",
                f"{eight['env_steps_per_s']:,.0f}",
                f"{eight['env_steps_per_s_per_seed']:,.0f}",
                f"{share:.0%}",
            ]
        )
    if run["first_below"]:
        step, seconds = run["first_below"]
        reached = f"{step:,} env steps, {seconds / 60:.1f} min after the run started"
    else:
        reached = "not reached"
    evals = run["evals"]
    lines = [
        "# Native MPE backend and MAPPO on it",
        "",
        f"Measured {date.today().isoformat()} with `python bench/native_mappo.py`.",
        "",
        f"Machine: {machine()}.",
        "",
        "## Env only: simple_spread (N=3, 25 steps), random actions",
        "",
        f"mpe2 `simple_spread_v3`, one env: {mpe2_rate:,.0f} env steps/s. Native, best: "
        f"{best:,.0f} env steps/s ({best / mpe2_rate:,.0f}× mpe2).",
        "",
        *table(
            env_rows,
            [
                "num_envs",
                "env steps/s, 1 thread",
                "env steps/s, 2 threads",
                "agent steps/s, 2 threads",
                "× mpe2",
            ],
        ),
        "",
        "## Env only: every native task, default parameters, 4,096 envs, 2 threads",
        "",
        *table([[e, f"{r:,.0f}"] for e, r in tasks], ["task", "env steps/s"]),
        "",
        "## MAPPO training throughput over num_envs (`marlctl bench`, spec "
        "`specs/spread_mappo_native.yaml`, 2 threads)",
        "",
        *table(train_rows, ["num_envs", "env steps/s", "agent steps/s", "peak RSS MB"]),
        "",
        f"Suggested num_envs: {training['suggested_num_envs']:,}.",
        "",
        "## 8 seeds as one batch (`hardware.batch_seeds: true`) against one seed, 2 threads",
        "",
        *table(
            seed_rows,
            [
                "num_envs per seed",
                "1 seed: env steps/s",
                "8 seeds: env steps/s, all",
                "8 seeds: per seed",
                "per seed vs alone",
            ],
        ),
        "",
        "## MAPPO end to end: `marlctl run specs/spread_mappo_native.yaml`",
        "",
        "| what | figure |",
        "|---|---|",
        f"| training throughput, whole run (rollout + update + eval) | "
        f"{run['steps_per_s']:,.0f} env steps/s |",
        f"| env steps trained | {evals[-1][0]:,} |",
        f"| per-agent eval return at the end (128 episodes, deterministic) | {evals[-1][1]:.2f} |",
        f"| first evaluation better than -15 | {reached} |",
        f"| wall-clock of the run | {run['wall_s'] / 60:.1f} min |",
        "",
        "Eval curve (env steps → per-agent return):",
        "",
        *table(
            [["return", *(f"{v:.1f}" for _, v in evals)]],
            ["env steps", *(f"{s / 1e6:.1f}M" for s, _ in evals)],
        ),
        "",
        f"MLflow run `{run['run_id']}` (store: `bench/runs/mlflow.db` on the machine that ran it).",
        "",
    ]
    text = "\n".join(lines)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
