"""Where a captured training iteration's GPU time goes: kernels per iteration, device time
beside wall-clock time, and each kernel's share (torch profiler, CUPTI).

Profiles, on the first CUDA device: IPPO with JaxMARL's hyperparameters (`bench/gpu.py`'s
`JAXMARL_IPPO`) at 4,096 and 65,536 envs, captured, eager and captured with torch.compile;
QMIX at 1,024 envs with 64 gradient steps of 256 per iteration (`bench/gpu.py`'s replay-based
setting), captured, and captured with compiled losses. Each case fills and warms up, times 5
iterations, then profiles 3. A device time close to the wall-clock time means the GPU is
busy throughout: fewer or faster kernels, not less Python, make the iteration faster.

Writes `bench/results/gpu_profile.jsonl` (a row per case), `gpu_profile.txt` (each case's
kernels by device time) and `gpu_profile.md` (the rows as a table).

    python bench/gpu_profile.py              # about 3 minutes on an H100
    python bench/gpu_profile.py --table      # gpu_profile.md from the results file
    python bench/gpu_profile.py --device cpu # the same cases, small, on the CPU (a check)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date
from pathlib import Path

from common import machine, table
from gpu import JAXMARL_IPPO, SPEC

RESULTS = Path(__file__).resolve().parent / "results"
OFF_POLICY = ("~algo.epochs", "~algo.minibatches", "~algo.lr", "~model.activation",
              "algo.batch_size=256", "algo.updates=64", "algo.gamma=0.9")  # fmt: skip


def profile_case(label, overrides, num_envs, device_name, out: Path, capture=True, iters=3):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from marlctl.cli.app import load
    from marlctl.plan import learner_info
    from marlctl.train import timing
    from marlctl.train.build import build_trainer, set_float32_precision
    from marlctl.train.runner import make_env, prepare_iterations

    start = time.perf_counter()
    loaded, plan = load(str(SPEC), [*overrides, f"hardware.device={device_name}"])
    spec, info = loaded.spec, plan.env
    set_float32_precision(spec)
    device = torch.device(device_name)
    trainer = build_trainer(spec, learner_info(info, spec), num_envs, device, 1000, (0,))
    env = make_env(spec, info, num_envs, device, 0, 1)
    on_gpu = device.type == "cuda"
    mode = prepare_iterations(spec, trainer, env, capture=capture and on_gpu)
    graph = trainer.graph is not None and on_gpu
    state = {"ob": env.reset(0)}

    def iteration():
        state["ob"], _ = trainer.train_iteration(env, state["ob"])
        trainer.stats.take()

    fills = 0
    while not timing.steady(trainer, graph) and fills < timing.MAX_FILL_ITERATIONS:
        iteration()
        fills += 1
    for _ in range(2):
        iteration()
    timing.sync(device)
    ready = time.perf_counter() - start
    began, timed = time.perf_counter(), 5
    for _ in range(timed):
        iteration()
    timing.sync(device)
    wall = (time.perf_counter() - began) / timed
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(iters):
            iteration()
        timing.sync(device)
    events = prof.key_averages()
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    busy_us = sum(getattr(e, key) for e in events) / iters
    kernels = sum(e.count for e in events if getattr(e, key) > 0) / iters
    row = {
        "label": label, "mode": mode, "num_envs": num_envs,
        "steps_per_iteration": trainer.steps_per_iteration,
        "wall_ms_per_iteration": wall * 1e3,
        "env_steps_per_s": trainer.steps_per_iteration / wall,
        "device_ms_per_iteration": busy_us / 1e3, "kernels_per_iteration": kernels,
        "setup_s": ready, "machine": machine(device_name), "date": date.today().isoformat(),
        "overrides": list(overrides),
    }  # fmt: skip
    print(json.dumps(row), flush=True)
    with (out / "gpu_profile.jsonl").open("a") as sink:
        sink.write(json.dumps(row) + "\n")
    with (out / "gpu_profile.txt").open("a") as sink:
        sink.write(f"\n\n===== {label} {json.dumps(row)}\n")
        sink.write(events.table(sort_by=key, row_limit=45, max_name_column_width=90))
    env.close()


def write_table(out: Path) -> None:
    rows = [json.loads(line) for line in (out / "gpu_profile.jsonl").read_text().splitlines()]
    where = sorted({f"{r['date']} on {r['machine']}" for r in rows})
    body = [
        [
            r["label"], r["mode"], f"{r['num_envs']:,}", f"{r['wall_ms_per_iteration']:.1f}",
            f"{r['device_ms_per_iteration']:.1f}",
            f"{r['device_ms_per_iteration'] / r['wall_ms_per_iteration']:.2f}",
            f"{r['kernels_per_iteration']:,.0f}", f"{r['env_steps_per_s'] / 1e3:,.1f}k",
        ]
        for r in rows
    ]  # fmt: skip
    lines = [
        "# Where a training iteration's GPU time goes",
        "",
        "Written by `python bench/gpu_profile.py`: per case, the wall-clock milliseconds of "
        "an iteration (5 timed), the milliseconds the GPU spent in kernels during it and "
        "how many kernels ran (torch profiler over 3 iterations), and env steps/s. Each "
        "case's kernels by device time: `bench/results/gpu_profile.txt`.",
        "",
        "Measured " + "; ".join(where) + ".",
        "",
        *(
            [
                "Rows without their overrides recorded ran IPPO with `bench/gpu.py`'s "
                "`EARLIER_IPPO`: bootstrapping through MPE's time limit, which JaxMARL "
                "does not.",
                "",
            ]
            if any("overrides" not in r and r["label"].startswith("ippo") for r in rows)
            else []
        ),
        *table(
            body,
            ["case", "mode", "num_envs", "wall ms", "device ms", "busy", "kernels", "env steps/s"],
        ),  # fmt: skip
        "",
    ]
    (out / "gpu_profile.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    if not args.table:
        args.out.mkdir(parents=True, exist_ok=True)
        small = args.device == "cpu"
        sizes = (256,) if small else (4096, 65536)
        ippo = ["algos=ippo", *JAXMARL_IPPO]
        for n in sizes:
            profile_case(f"ippo graph n={n}", ippo, n, args.device, args.out)
        profile_case(f"ippo eager n={sizes[0]}", ippo, sizes[0], args.device, args.out, False)
        for n in sizes:
            compiled = [*ippo, "hardware.compile=true"]
            profile_case(f"ippo graph+compile n={n}", compiled, n, args.device, args.out)
        off = 64 if small else 1024
        qmix = ["algos=qmix", *OFF_POLICY]
        profile_case("qmix graph", qmix, off, args.device, args.out)
        compiled = [*qmix, "hardware.compile=true"]
        profile_case("qmix graph+compile", compiled, off, args.device, args.out)
    write_table(args.out)
    print((args.out / "gpu_profile.md").read_text())


if __name__ == "__main__":
    sys.exit(main())
