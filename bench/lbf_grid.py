"""Benchmark: MAPPO on level-based foraging with the package's grid observations (read by a
cnn encoder) against its vector observations.

Both runs are `specs/lbf_mappo_native.yaml` (Foraging-8x8-2p-2f-coop, native, 3 seeds trained
as one batch, a shared team reward) at `--steps` env steps; the grid run adds
`env.params.grid_observation=true` and `model.encoder=cnn` (16 and 32 channels of 3x3, stride
2, on each player's three 17x17 layers: 8x8, then 3x3). Reports each seed's final evaluation
(64 episodes) and the mean, and the runs' mean env steps per second. Writes
`bench/results/lbf_grid.md`.

    .venv/bin/python bench/lbf_grid.py                   # 1M env steps per seed
    .venv/bin/python bench/lbf_grid.py --busy            # beside other work: no speed figures
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import date
from pathlib import Path

from common import machine, marlctl_json

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "lbf_grid.md"
WORKDIR = ROOT / "bench" / "runs" / "lbf_grid"
SPEC = ROOT / "specs" / "lbf_mappo_native.yaml"
GRID = [
    "env.params.grid_observation=true",
    "model.encoder=cnn",
    "model.cnn.channels=[16,32]",
    "model.cnn.kernels=[3,3]",
    "model.cnn.strides=[2,2]",
]


def run(name: str, steps: int, extra: list[str]) -> dict:
    folder = WORKDIR / name
    folder.mkdir(parents=True, exist_ok=True)
    overrides = [f"name=lbf-{name}", f"train.total_env_steps={steps}", "hardware.device=cpu"]
    summary, wall = marlctl_json(["run", str(SPEC), *overrides, *extra], folder, name)
    finals = [r["final_return"] for r in summary["runs"]]
    rates = [r["steps_per_s"] for r in summary["runs"]]
    return {"name": name, "finals": finals, "rate": statistics.mean(rates), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--busy", action="store_true", help="other work shares the machine: no speed figure"
    )
    args = parser.parse_args()
    rows = [run("vector", args.steps, []), run("grid", args.steps, GRID)]
    for row in rows:
        print(json.dumps(row), flush=True)
    lines = [
        "# Level-based foraging: grid observations against vector observations",
        "",
        f"Measured {date.today()} with `.venv/bin/python bench/lbf_grid.py --steps "
        f"{args.steps}{' --busy' if args.busy else ''}` on {machine('cpu')}.",
        "",
        "MAPPO on native Foraging-8x8-2p-2f-coop (`specs/lbf_mappo_native.yaml`: 3 seeds as "
        "one batch, a shared team reward, so a solved episode returns 1.0 per agent), "
        f"{args.steps:,} env steps per seed. vector: the package's observations (foods and "
        "players as (row, col, level)); grid: its grid observations (three 17x17 layers "
        "per player: players' levels, foods' levels, free cells) through a cnn encoder of "
        "16 and 32 channels of 3x3 at stride 2. Final evaluation: 64 greedy episodes per seed.",
        *(
            [
                "",
                "Run beside other training on the same cores: the speeds are not figures of "
                "either run alone.",
            ]
            if args.busy
            else []
        ),
        "",
        "| observations | seeds' final returns | mean | env steps/s (mean of seeds) | wall-clock |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        finals = ", ".join(f"{v:.3f}" for v in r["finals"])
        lines.append(
            f"| {r['name']} | {finals} | {statistics.mean(r['finals']):.3f} | "
            f"{r['rate']:,.0f} | {r['wall_s'] / 60:.1f} min |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
