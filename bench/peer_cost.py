"""Where a peer cell's wall-clock goes: BenchMARL's and marlctl's seconds per iteration in
collection and in training, and how much of marlctl's training is matrix products.

BenchMARL's figures are its own timers (`timers_collection_time`, `timers_training_time`:
seconds per iteration) from the CSV logs of the cell's runs under `bench/runs/peer/`.
marlctl's come from its half's translated spec (`bench/peer_benchmarl.py` writes it): seed 0
on this machine, one warm-up iteration, then `--iterations` iterations, each split into
collection (rollout and advantages) and update; one more update runs under torch's profiler
for the time spent in matmul kernels. With the same env package in both tools, collection
plus matmul time is about the least any implementation needs for the cell's work on this
CPU; its share of BenchMARL's time bounds the wall-clock ratio from below. On-policy cells.

    .venv/bin/python bench/peer_cost.py --algo mappo --task navigation

Writes `bench/results/peer_cost.md` (cells kept in `bench/results/peer_cost.jsonl`).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from datetime import date
from pathlib import Path

import torch
from common import machine
from peer_benchmarl import ON_POLICY, WORKDIR

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "peer_cost.md"
DONE = ROOT / "bench" / "results" / "peer_cost.jsonl"
MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def benchmarl_timers(algo: str, task: str) -> dict[str, float]:
    """Mean seconds per iteration over every iteration of each seed's latest run."""
    latest = [
        max(runs, key=lambda p: p.stat().st_mtime)
        for seed in WORKDIR.glob(f"benchmarl-{algo}-{task}-*")
        if (runs := list(seed.glob("*/*/scalars")))
    ]
    out = {}
    for timer in ("collection", "training"):
        values = []
        for scalars in latest:
            with (scalars / f"timers_{timer}_time.csv").open() as f:
                values += [float(row[1]) for row in csv.reader(f) if row]
        if not values:
            raise SystemExit(f"no BenchMARL run of {algo} on {task}: run peer_benchmarl.py first")
        out[timer] = statistics.fmean(values)
    return out


def marlctl_timers(algo: str, task: str, iterations: int, threads: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    from marlctl.envs.probe import probe
    from marlctl.spec import load_spec
    from marlctl.train.runner import build_trainer, make_env

    torch.set_num_threads(threads)
    path = WORKDIR / f"marlctl-{algo}-{task}" / "spec.yaml"
    if not path.exists():
        raise SystemExit(f"no {path}: run peer_benchmarl.py for {algo} on {task} first")
    spec = load_spec(path).spec
    info = probe(spec.env.id, dict(spec.env.params))
    envs, device = spec.hardware.num_envs, torch.device("cpu")
    env = make_env(spec, info, envs, device)
    trainer = build_trainer(spec, info, envs, device, iterations + 2, (0,))
    ob = env.reset(0)
    trainer.restart_episodes()
    collect, update = [], []
    for index in range(iterations + 1):
        start = time.perf_counter()
        rollouts, ob, dones = trainer.collect(env, ob)
        data = trainer.advantages(rollouts, ob, dones)
        middle = time.perf_counter()
        trainer.update(data)
        if index:  # the first iteration warms up
            collect.append(middle - start)
            update.append(time.perf_counter() - middle)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.update(data)
    matmul = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in MATMUL) / 1e6
    cfg = trainer.cfg
    return {
        "collection": statistics.fmean(collect),
        "training": statistics.fmean(update),
        "matmul": matmul,
        "steps": cfg.epochs * cfg.minibatches,
    }


def table(cells: list[dict]) -> str:
    lines = [
        "# Where a peer cell's time goes",
        "",
        "Measured with `python bench/peer_cost.py` on the machine each row names. Seconds per "
        "training iteration (one batch of collected frames and the updates on it). BenchMARL's "
        "figures are its own timers from the runs of `bench/peer_benchmarl.py`; marlctl's are "
        "seed 0 of its translated spec, mean of the iterations after a warm-up. Matmul: the "
        "time of one marlctl update spent in matrix-product kernels (torch profiler). Floor: "
        "(marlctl collection + matmul) / (BenchMARL collection + training), about the least "
        "wall-clock ratio the same work allows on this CPU with the same env package.",
        "",
        "| algorithm | task | gradient steps | BenchMARL collection | BenchMARL training | "
        "marlctl collection | marlctl training | marlctl matmul | marlctl / BenchMARL | floor "
        "| machine | measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        peer, ours = c["benchmarl"], c["marlctl"]
        total = peer["collection"] + peer["training"]
        ratio = (ours["collection"] + ours["training"]) / total
        floor = (ours["collection"] + ours["matmul"]) / total
        lines.append(
            f"| {c['algo']} | {c['task']} | {ours['steps']} | {peer['collection']:.2f} s | "
            f"{peer['training']:.2f} s | {ours['collection']:.2f} s | {ours['training']:.2f} s "
            f"| {ours['matmul']:.2f} s | {ratio:.2f} | {floor:.2f} | {c['machine']} | "
            f"{c['measured']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="mappo", choices=ON_POLICY)
    parser.add_argument("--task", default="navigation")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    cell = {
        "algo": args.algo,
        "task": args.task,
        "benchmarl": benchmarl_timers(args.algo, args.task),
        "marlctl": marlctl_timers(args.algo, args.task, args.iterations, args.threads),
        "machine": machine(),
        "measured": date.today().isoformat(),
    }
    done = [json.loads(line) for line in DONE.read_text().splitlines()] if DONE.exists() else []
    done = [c for c in done if (c["algo"], c["task"]) != (args.algo, args.task)] + [cell]
    DONE.write_text("".join(json.dumps(c) + "\n" for c in done))
    OUT.write_text(table(done))
    print(table([cell]))


if __name__ == "__main__":
    main()
