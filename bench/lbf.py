"""Benchmark: MAPPO and QMIX on level-based foraging, Foraging-8x8-2p-2f-coop-v3.

Through the `lbforaging` package (`--backend pettingzoo`) or the native batched env
(`--backend native`, with the seeds trained as one batch), with EPyMARL's common reward
(the team's sum, so a solved episode returns 1.0 per agent), each algorithm at its defaults,
3 seeds, 16 envs per seed unless `--num-envs` says otherwise, `marlctl run
specs/lbf_mappo.yaml` (QMIX: the same spec with `algos=qmix`). Reports the final per-agent
eval return (mean, 95% Student-t interval, every seed), the first eval at 0.9 of the
maximum or more, and the wall-clock of the command; where both backends ran an algorithm
for the same steps and envs on this machine, the ratio of their wall-clocks. Writes
`bench/results/lbf.md`; each finished cell is appended to `bench/results/lbf.jsonl` and
skipped on a re-run.

    .venv/bin/python bench/lbf.py                       # both algorithms, 1M env steps each
    .venv/bin/python bench/lbf.py --backend native
    .venv/bin/python bench/lbf.py --algos qmix --steps 2000000
    .venv/bin/python bench/lbf.py --backend native --num-envs 64
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from datetime import date
from pathlib import Path

import yaml
from algorithms import curves, t_interval
from pettingzoo_mappo import machine, marlctl_json

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "lbf_mappo.yaml"
OUT = ROOT / "bench" / "results" / "lbf.md"
DONE = ROOT / "bench" / "results" / "lbf.jsonl"
WORKDIR = ROOT / "bench" / "runs"
TASK = "lbf/Foraging-8x8-2p-2f-coop-v3"
MAXIMUM = 1.0  # every food collected, rewards normalised and summed over the team


def envs(cell: dict) -> int:
    """Envs per seed of a cell (cells from before the option ran 16)."""
    return cell.get("num_envs", 16)


def run(algo: str, steps: int, seeds: int, backend: str, num_envs: int) -> dict:
    folder = WORKDIR / f"lbf-{algo}-{backend}-{steps}-{num_envs}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    native = ["env.backend=native", "hardware.batch_seeds=true"] if backend == "native" else []
    args = [
        "run",
        str(SPEC),
        f"algos={algo}",
        f"seeds=[{','.join(map(str, range(seeds)))}]",
        f"train.total_env_steps={steps}",
        f"train.eval_every={max(steps // 20, 1)}",
        "train.checkpoint_every=0",
        f"hardware.num_envs={num_envs}",
        *native,
    ]
    summary, wall = marlctl_json(args, folder, f"{algo} on {TASK}")
    runs = summary["runs"]
    returns = [r["final_return"] for r in runs if r["final_return"] is not None]
    mean, half = t_interval(returns)
    return {
        "algo": algo,
        "backend": backend,
        "machine": machine(),
        "measured": date.today().isoformat(),
        "steps": steps,
        "num_envs": num_envs,
        "seeds": seeds,
        "mean": mean,
        "ci": half,
        "returns": returns,
        "throughput": [r["steps_per_s"] for r in runs],
        "wall_s": wall,
        "curves": curves(folder, [r["run_id"] for r in runs]),
        "ok": summary["ok"],
    }


def first_solved(curve: list[list[float]]) -> float | None:
    for step, value in zip(*curve, strict=True):
        if value >= 0.9 * MAXIMUM:
            return step
    return None


def table(cells: list[dict]) -> str:
    lines = [
        "# Level-based foraging: MAPPO and QMIX on Foraging-8x8-2p-2f-coop-v3",
        "",
        "`python bench/lbf.py` (spec `specs/lbf_mappo.yaml`; QMIX with `algos=qmix`): the "
        "`lbforaging` package through the PettingZoo backend (2 seeds side by side), or the "
        "native batched env (`env.backend=native`, the 3 seeds as one batch), each "
        "algorithm at its defaults, EPyMARL's common reward (summed: a solved episode "
        "returns 1.0 per agent), 64 deterministic eval episodes per point. "
        "Wall-clock: the whole `marlctl run` command, every seed, nothing else running.",
        "",
        "| algorithm | backend | envs per seed | env steps per seed | "
        "final return (mean ± 95% CI) | seeds | of the maximum | first eval ≥ 0.9 (per seed) "
        "| wall-clock | measured | machine |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        solved = [first_solved(curve) for curve in c["curves"]]
        lines.append(
            f"| {c['algo']} | {c['backend']} | {envs(c)} | {c['steps']:,} | "
            f"{c['mean']:.3f} ± {c['ci']:.3f} | "
            + ", ".join(f"{r:.3f}" for r in c["returns"])
            + f" | {c['mean'] / MAXIMUM:.0%} | "
            + ", ".join("never" if s is None else f"{s:,.0f}" for s in solved)
            + f" | {c['wall_s'] / 60:.1f} min | {c['measured']} | "
            + f"{c['machine']} |"
        )
    ratios = [
        (a, b)
        for a in cells
        for b in cells
        if a["backend"] == "native"
        and b["backend"] == "pettingzoo"
        and (a["algo"], a["steps"], envs(a), a["seeds"], a["machine"])
        == (b["algo"], b["steps"], envs(b), b["seeds"], b["machine"])
    ]
    if ratios:
        lines += ["", "Native against the package, same algorithm, steps, envs and machine:", ""]
        for a, b in ratios:
            lines.append(
                f"- {a['algo']}, {a['steps']:,} env steps per seed, {envs(a)} envs: native "
                f"{a['wall_s'] / 60:.1f} min, package {b['wall_s'] / 60:.1f} min, "
                f"{a['wall_s'] / b['wall_s']:.2f} of the package's wall-clock"
            )
    lines += ["", "Eval curves (env steps → per-agent return, mean over seeds):", ""]
    for c in cells:
        if len(c["curves"][0][0]) < 3:
            continue
        steps = c["curves"][0][0]
        means = [
            sum(curve[1][i] for curve in c["curves"]) / len(c["curves"])
            for i in range(min(len(curve[1]) for curve in c["curves"]))
        ]
        label = f"- {c['algo']}, {c['backend']}, {envs(c)} envs, {c['steps']:,} steps: "
        lines.append(label + ", ".join(
            f"{s / 1e3:.0f}k {m:.2f}" for s, m in zip(steps, means, strict=False)
        ))  # fmt: skip
    return "\n".join(lines) + "\n"


SUITE = ROOT / "suites" / "baseline-lbf.yaml"


def write_suite(done: list[dict]) -> None:
    """The recorded cells (of an algorithm on a backend, the newest at the largest budget) as
    a suite of regression baselines: `specs/lbf_mappo.yaml` with the cell's overrides, its
    reference the seeds' final returns."""
    from importlib import metadata

    chosen: dict[tuple[str, str], dict] = {}
    for c in done:
        key = (c["algo"], c["backend"])
        if c["ok"] and (key not in chosen or (c["steps"], c["measured"]) >= (
            chosen[key]["steps"], chosen[key]["measured"])):  # fmt: skip
            chosen[key] = c
    cells = {}
    for (algo, backend), c in sorted(chosen.items()):
        overrides = [
            f"algos={algo}",
            f"train.total_env_steps={c['steps']}",
            f"train.eval_every={max(c['steps'] // 20, 1)}",
            "train.checkpoint_every=0",
            f"hardware.num_envs={envs(c)}",
        ]
        if backend == "native":
            overrides += ["env.backend=native", "hardware.batch_seeds=true"]
        package = "lbforaging" if backend == "pettingzoo" else "marlctl"
        cells[f"{algo}-{backend}"] = {
            "spec": f"../{SPEC.relative_to(ROOT)}",
            "overrides": overrides,
            "seeds": c["seeds"],
            "reference": {
                "per_seed": [round(v, 4) for v in c["returns"]],
                "budget": c["steps"],
                "source": {
                    "kind": "baseline",
                    "citation": "marlctl's own earlier result, a regression baseline "
                    "(bench/results/lbf.jsonl)",
                    "code": f"marlctl {metadata.version('marlctl')}, measured {c['measured']}",
                    "machine": c["machine"],
                },
                "conventions": {
                    "metric": "eval/return_mean",
                    "aggregation": "mean",
                    "evaluation": "deterministic",
                    "episodes": 64,
                    "step": "env",
                    "episode_length": 50,
                },
                "env_package": {"name": package, "version": metadata.version(package)},
            },
        }
    body = {
        "name": SUITE.stem,
        "description": (
            "MAPPO and QMIX on level-based foraging, Foraging-8x8-2p-2f-coop-v3, with EPyMARL's "
            "common reward (each agent is paid the team's sum: a solved episode returns 1.0 per "
            "agent), through the lbforaging package and the native env (bench/lbf.py): "
            "marlctl's own results, regression baselines."
        ),
        "cells": cells,
    }
    SUITE.write_text(yaml.safe_dump(body, sort_keys=False, width=100, allow_unicode=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="mappo,qmix")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--backend", choices=("pettingzoo", "native"), default="pettingzoo")
    parser.add_argument("--num-envs", type=int, default=16, help="envs per seed")
    parser.add_argument("--suite", action="store_true", help=f"write {SUITE.name} and stop")
    args = parser.parse_args()
    done = [json.loads(line) for line in DONE.read_text().splitlines()] if DONE.exists() else []
    if args.suite:
        write_suite(done)
        return
    here = machine()
    for algo in args.algos.split(","):
        key = (algo, args.steps, args.num_envs, args.seeds, args.backend, here)
        if any((c["algo"], c["steps"], envs(c), c["seeds"], c["backend"], c["machine"]) == key
               for c in done):  # fmt: skip
            continue
        cell = run(algo, args.steps, args.seeds, args.backend, args.num_envs)
        done.append(cell)
        with DONE.open("a") as f:
            f.write(json.dumps(cell) + "\n")
        print(f"{algo}: {cell['mean']:.3f} ± {cell['ci']:.3f}", file=sys.stderr)
    OUT.write_text(table(done))


if __name__ == "__main__":
    main()
