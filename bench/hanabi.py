"""Benchmark: IPPO and MAPPO on two-player Hanabi (the native port of JaxMARL's) against random
play.

Both train `specs/hanabi_2p_mappo.yaml` (JaxMARL's IPPO Hanabi hyperparameters: 128 steps per
update, 4 epochs of 4 minibatches, lr 5e-4, clip 0.2, entropy 0.01, one 512x512 actor the
players share; MAPPO adds a critic of both players' observations), IPPO with `algos=ippo`, 3
seeds as one batch, `--envs` envs per seed (the spec's 1,024 by default) for `--steps` env
steps per seed. Each seed's final evaluation plays 256 greedy games (the spec's
`eval_episodes`). Random play: uniformly random legal moves, scored as the runs' final
evaluation is (the same seeds' evaluation deals, 256 games each; `marlctl reproduce`'s
reference points). The score is the game's: 0 to 25, 0 for a game lost to the life tokens.
Writes `bench/results/hanabi.md`.

    .venv/bin/python bench/hanabi.py --steps 5000000
    .venv/bin/python bench/hanabi.py --steps 2000000 --envs 128   # more updates per step
    .venv/bin/python bench/hanabi.py --steps 20000000 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
from datetime import date
from pathlib import Path

from common import machine, marlctl_json, table

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "hanabi_2p_mappo.yaml"
OUT = ROOT / "bench" / "results" / "hanabi.md"
WORKDIR = ROOT / "bench" / "runs" / "hanabi"
SEEDS = "[0,1,2]"


def overrides(steps: int, envs: int, device: str = "cpu") -> list[str]:
    return [
        f"seeds={SEEDS}",
        f"train.total_env_steps={steps}",
        f"train.eval_every={max(steps // 5, 1)}",
        f"hardware.num_envs={envs}",
        f"hardware.device={device}",
        "hardware.batch_seeds=true",
    ]


def train(algo: str, steps: int, envs: int, device: str) -> dict:
    folder = WORKDIR / algo
    folder.mkdir(parents=True, exist_ok=True)
    args = [
        "run",
        str(SPEC),
        f"algos={algo}",
        f"name=hanabi-{algo}",
        *overrides(steps, envs, device),
    ]
    summary, wall = marlctl_json(args, folder, algo)
    runs = summary["runs"]
    failed = [r for r in runs if r["status"] != "FINISHED"]
    if failed:
        raise SystemExit(f"{algo}: {failed[0]['error']}")
    return {
        "algo": algo,
        "finals": [r["final_return"] for r in runs],
        "rate": statistics.mean(r["steps_per_s"] for r in runs),
        "wall_s": wall,
    }


def random_play(steps: int, envs: int) -> float:
    """Random legal moves, scored as the runs' final evaluation (on the CPU, as `marlctl
    reproduce`'s reference points are): the mean over the seeds."""
    from marlctl.plan import compile_plan
    from marlctl.reproduce.points import measure
    from marlctl.spec import load_spec

    loaded = load_spec(str(SPEC), overrides(steps, envs))
    (point,) = measure(loaded, compile_plan(loaded), {"random": "random"}, "eval/return_mean")
    return point.value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5_000_000, help="env steps per seed")
    parser.add_argument("--envs", type=int, default=1024, help="envs per seed")
    parser.add_argument("--algos", default="ippo,mappo")
    parser.add_argument("--device", default="cpu", help="the runs' hardware.device")
    parser.add_argument("--busy", action="store_true", help="other work shares the machine")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = [train(algo, args.steps, args.envs, args.device) for algo in args.algos.split(",")]
    rand = random_play(args.steps, args.envs)
    body = [
        [
            r["algo"],
            ", ".join(f"{v:.2f}" for v in r["finals"]),
            f"{statistics.mean(r['finals']):.2f}",
            f"{rand:.2f}",
            "—" if args.busy else f"{r['rate']:,.0f}",
            f"{r['wall_s'] / 60:.1f} min",
        ]
        for r in rows
    ]
    lines = [
        "# Hanabi, two players: IPPO and MAPPO against random play",
        "",
        f"Measured {date.today()} with `.venv/bin/python bench/hanabi.py --steps {args.steps} "
        f"--envs {args.envs} --algos {args.algos} --device {args.device}"
        f"{' --busy' if args.busy else ''}` on {machine(args.device)}.",
        "",
        f"`specs/hanabi_2p_mappo.yaml` (JaxMARL's IPPO Hanabi hyperparameters), IPPO with "
        f"`algos=ippo`: 3 seeds as one batch, {args.envs:,} envs per seed, {args.steps:,} env "
        "steps per seed. Final evaluation: 256 greedy games per seed. Random: uniformly random "
        "legal moves on the same seeds' evaluation deals, 256 games each. The score is the "
        "game's, 0 to 25 (0 for a game lost to the life tokens).",
        *(["", "Run beside other work on the same cores: no speed figures."] if args.busy else []),
        "",
        *table(
            body,
            [
                "algorithm",
                "seeds' final scores",
                "mean",
                "random play",
                "env steps/s per seed",
                "wall-clock",
            ],
        ),
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
