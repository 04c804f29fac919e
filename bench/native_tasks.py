"""Benchmark: env-only throughput of every native env, eager and compiled.

For each native env at its default parameters, `marlctl bench --env-only` at 4,096 envs
(random actions drawn on the device every step): eager, and with `hardware.compile=true`
(the env's random-free step methods compiled with `torch.compile`), on the CPU with the
machine's cores; on a GPU as well when one is present (eager, CUDA graph, and CUDA graph
with the compiled step). Writes `bench/results/native_tasks.md`.

    .venv/bin/python bench/native_tasks.py          # about 4 minutes on 2 cores
"""

from __future__ import annotations

import argparse
from datetime import date
from pathlib import Path

from common import machine, marlctl_json, table

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "spread_mappo_native.yaml"
OUT = ROOT / "bench" / "results" / "native_tasks.md"
WORKDIR = ROOT / "bench" / "runs"


def env_rates(env_id: str, device: str, num_envs: int, compiled: bool) -> dict[str, float]:
    """Env steps/s by mode ("eager", "torch.compile", "CUDA graph", ...)."""
    data, _ = marlctl_json(
        [
            "bench", str(SPEC), "--env-only", "--num-envs", str(num_envs), "--seconds", "2",
            f"env.id={env_id}", "~env.params", f"hardware.device={device}",
            f"hardware.compile={str(compiled).lower()}", "hardware.threads_per_run=auto",
        ],
        WORKDIR,
        f"bench of {env_id}",
    )  # fmt: skip
    return {p["mode"]: p["env_steps_per_s"] for p in data["points"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=4096)
    args = parser.parse_args()
    import torch

    from marlctl.envs.native import NATIVE

    WORKDIR.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available()
    header = ["env", "CPU eager", "CPU compiled", "× from compiling"]
    if gpu:
        header += ["GPU eager", "GPU CUDA graph", "GPU CUDA graph + compiled"]
    rows = []
    for env_id in sorted(NATIVE):
        eager = env_rates(env_id, "cpu", args.num_envs, False)["eager"]
        fused = env_rates(env_id, "cpu", args.num_envs, True)["torch.compile"]
        row = [env_id, f"{eager:,.0f}", f"{fused:,.0f}", f"{fused / eager:.2f}"]
        if gpu:
            plain = env_rates(env_id, "cuda", args.num_envs, False)
            both = env_rates(env_id, "cuda", args.num_envs, True)
            row += [
                f"{plain['eager']:,.0f}",
                f"{plain['CUDA graph']:,.0f}",
                f"{both['CUDA graph, torch.compile']:,.0f}",
            ]
        rows.append(row)
        print(" | ".join(row), flush=True)
    lines = [
        "# Every native env, eager and compiled",
        "",
        f"Measured {date.today().isoformat()} with `python bench/native_tasks.py` on "
        f"{machine('cuda' if gpu else 'cpu')}.",
        "",
        f"Env steps per second at {args.num_envs:,} envs, default parameters, random actions "
        "drawn every step (`marlctl bench --env-only`, 2 s per point after warm-up, "
        "`hardware.threads_per_run=auto`). Compiled: `hardware.compile=true`, which compiles "
        "the step's methods that draw no random numbers; start states stay eager, one "
        "generator per seed block. `tests/test_capture.py` checks that every compiled env "
        "steps like its eager self.",
        "",
        *table(rows, header),
        "",
    ]
    OUT.write_text("\n".join(lines))
    print(OUT.read_text())


if __name__ == "__main__":
    main()
