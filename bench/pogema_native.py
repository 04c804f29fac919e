"""Benchmark: the native POGEMA against pogema 1.4.0, env alone, and MAPPO against random play.

pogema pins pydantic 1, so the original runs in a virtualenv of its own (`--pogema-python`,
made as `scripts/pogema_record.py` says) and this script calls it for its figures.

- env only: env steps per second with uniformly random actions, 4 agents on an 8x8 random
  map of density 0.3 (`pogema/random`'s defaults), 64-step episodes: pogema's own env
  stepped in a loop (one copy; it has no batch), and the native env at 1, 64 and 1,024 envs
  on one CPU thread.
- learning (`--train`): `specs/pogema_mappo.yaml` (MAPPO, 3 seeds as one batch) at
  `--steps` env steps per seed, its final evaluation (64 greedy episodes per seed): the
  agents' mean arrival (ISR) and the share of episodes where all arrived (CSR), beside
  uniformly random actions over the same number of episodes.

    .venv/bin/python bench/pogema_native.py --pogema-python .venv-pogema/bin/python
    .venv/bin/python bench/pogema_native.py --pogema-python .venv-pogema/bin/python --train
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

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "pogema.md"
WORKDIR = ROOT / "bench" / "runs" / "pogema"
SPEC = ROOT / "specs" / "pogema_mappo.yaml"
STEPS = 20_000  # env steps timed per figure


def original(steps: int) -> dict:
    """pogema's own env (run in its virtualenv): env steps/s and random play's ISR/CSR."""
    import numpy as np
    from pogema import GridConfig, pogema_v0

    config = GridConfig(num_agents=4, size=8, density=0.3, obs_radius=5, max_episode_steps=64,
                        seed=0)  # fmt: skip
    env = pogema_v0(grid_config=config)
    env.reset()
    rng = np.random.default_rng(0)
    done = 0
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terms, truncs, _ = env.step(list(rng.integers(0, 5, 4)))
        if all(terms) or all(truncs):
            done += 1
            env.reset()
    return {"steps_per_s": steps / (time.perf_counter() - start), "episodes": done}


def native(envs: int, steps: int) -> dict:
    import torch

    from marlctl.envs.native import native_class

    torch.set_num_threads(1)
    env = native_class("pogema/random")({}, envs, "cpu")
    env.reset(0)
    g = torch.Generator().manual_seed(0)
    rounds = max(1, steps // envs)
    start = time.perf_counter()
    for _ in range(rounds):
        env.step({"agent": torch.randint(0, 5, (envs, 4), generator=g)})
    return {"envs": envs, "steps_per_s": envs * rounds / (time.perf_counter() - start)}


def random_play(episodes: int) -> dict:
    """ISR and CSR of uniformly random actions on the native env, `episodes` episodes."""
    import torch

    from marlctl.envs.native import native_class

    env = native_class("pogema/random")({}, episodes, "cpu")
    env.reset(12345)
    g = torch.Generator().manual_seed(0)
    arrived = torch.zeros(episodes)
    ended = torch.zeros(episodes, dtype=torch.bool)
    solved = torch.zeros(episodes, dtype=torch.bool)
    while not bool(ended.all()):
        tr = env.step({"agent": torch.randint(0, 5, (episodes, 4), generator=g)})
        arrived += torch.where(ended, 0.0, tr.rewards["agent"].sum(1))
        solved |= tr.won & ~ended
        ended |= tr.terminated | tr.truncated
    return {"isr": float(arrived.mean() / 4), "csr": float(solved.float().mean())}


def train(steps: int) -> dict:
    from common import marlctl_json

    folder = WORKDIR / "mappo"
    folder.mkdir(parents=True, exist_ok=True)
    overrides = [f"train.total_env_steps={steps}", "hardware.device=cpu"]
    summary, wall = marlctl_json(["run", str(SPEC), *overrides], folder, "mappo")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    isr, csr = [], []
    for r in summary["runs"]:
        metrics = client.get_run(r["run_id"]).data.metrics
        isr.append(metrics["eval/return_mean"])
        csr.append(metrics["eval/win_rate"])
    return {"isr": isr, "csr": csr, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pogema-python", help="python of a virtualenv with pogema 1.4.0")
    parser.add_argument("--original", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed")
    parser.add_argument("--busy", action="store_true", help="other work shares the machine")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.original:  # inside pogema's virtualenv
        print(json.dumps(original(STEPS)))
        return
    sys.path.insert(0, str(ROOT / "bench"))
    from common import machine

    theirs = None
    if args.pogema_python:
        out = subprocess.run([args.pogema_python, __file__, "--original"], check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
        theirs = json.loads(out.strip().splitlines()[-1])
    ours = [native(n, STEPS if n == 1 else STEPS * 10) for n in (1, 64, 1024)]
    lines = [
        "# POGEMA: the native env against pogema 1.4.0",
        "",
        f"Measured {date.today()} with `.venv/bin/python bench/pogema_native.py"
        f"{' --pogema-python PYTHON' if theirs else ''}{' --train' if args.train else ''}"
        f"{' --busy' if args.busy else ''}` on "
        f"{machine('cpu')}; pogema 1.4.0 in its own virtualenv (pydantic 1.9.1).",
        *(
            ["", "Other work shared the cores: the speeds are not figures of either alone."]
            if args.busy
            else []
        ),  # fmt: skip
        "",
        "Env alone, uniformly random actions, 4 agents on an 8x8 random map (density 0.3), "
        "64-step episodes, one CPU thread:",
        "",
        "| env | envs | env steps/s |",
        "|---|---|---|",
    ]
    if theirs is not None:
        lines.append(f"| pogema 1.4.0 | 1 | {theirs['steps_per_s']:,.0f} |")
    lines += [f"| native | {r['envs']:,} | {r['steps_per_s']:,.0f} |" for r in ours]
    if args.train:
        learned, rand = train(args.steps), random_play(64 * 3)
        lines += [
            "",
            f"MAPPO (`specs/pogema_mappo.yaml`, 3 seeds) at {args.steps:,} env steps per seed: "
            "final evaluation, 64 greedy episodes per seed; random: uniformly random actions "
            "over 192 episodes. ISR: the agents' mean arrival; CSR: episodes where all arrived.",
            "",
            "| policy | ISR per seed | ISR | CSR per seed | CSR | wall-clock |",
            "|---|---|---|---|---|---|",
            f"| MAPPO | {', '.join(f'{v:.3f}' for v in learned['isr'])} | "
            f"{statistics.mean(learned['isr']):.3f} | "
            f"{', '.join(f'{v:.3f}' for v in learned['csr'])} | "
            f"{statistics.mean(learned['csr']):.3f} | {learned['wall_s'] / 60:.1f} min |",
            f"| random | — | {rand['isr']:.3f} | — | {rand['csr']:.3f} | — |",
        ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
