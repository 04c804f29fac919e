"""Record seeded POGEMA episodes for the native port's parity test.

pogema 1.4.0 pins pydantic 1.9.1, which cannot share an environment with marlctl's pydantic 2,
so this script runs in a virtualenv of its own and writes plain arrays:

    python3 -m venv .venv-pogema && .venv-pogema/bin/pip install pogema==1.4.0
    .venv-pogema/bin/python scripts/pogema_record.py     # tests/fixtures/pogema_episodes.npz

Each episode is one grid configuration (map kind, size, agents, collision system, target
rule, seed) played with seeded uniformly random actions until POGEMA ends it. Recorded: the
map with its border as POGEMA builds it, the agents' starts and targets, every step's
actions, observations (of the agents still active before the step), rewards, terminations
and truncations, and POGEMA's metrics at the end. `tests/test_native_pogema.py` replays them.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "pogema_episodes.npz"
# The maze of `pogema/maze`, read from the native env's source: that module imports torch,
# which this virtualenv does not have.
NATIVE = Path(__file__).resolve().parent.parent / "marlctl" / "envs" / "native" / "pogema.py"
MAZE = next(
    node.value.func.value.value  # `"""..."""`.strip()
    for node in ast.parse(NATIVE.read_text()).body
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MAZE"
).strip()
# (map kind, grid settings): random maps of two densities and sizes, and the maze; every
# kind with both collision systems and both target rules the native port implements.
KINDS = {
    "random": {"size": 8, "density": 0.3, "num_agents": 4, "obs_radius": 3},
    "random_large": {"size": 16, "density": 0.2, "num_agents": 8, "obs_radius": 3},
    "maze": {"map": MAZE, "num_agents": 6, "obs_radius": 3},
}
RULES = [("priority", "finish"), ("block_both", "finish"), ("priority", "nothing")]


def record(kind: str, settings: dict, collision: str, on_target: str, seed: int) -> dict:
    from pogema import GridConfig, pogema_v0

    config = GridConfig(
        **settings, seed=seed, max_episode_steps=48, collision_system=collision,
        on_target=on_target,
    )  # fmt: skip
    env = pogema_v0(grid_config=config)
    obs, _ = env.reset()
    grid = env.unwrapped.grid
    n = config.num_agents
    rng = np.random.default_rng(seed)
    steps = {k: [] for k in ("actions", "obs", "active", "rewards", "terminated", "truncated")}
    steps["obs"].append(np.stack(obs))
    steps["active"].append([grid.is_active[i] for i in range(n)])
    metrics: dict = {}
    for _ in range(config.max_episode_steps):
        actions = rng.integers(0, 5, n)
        obs, rewards, terms, truncs, infos = env.step(list(actions))
        for key, value in zip(
            ("actions", "obs", "rewards", "terminated", "truncated"),
            (actions, np.stack(obs), rewards, terms, truncs),
            strict=True,
        ):
            steps[key].append(value)
        steps["active"].append([grid.is_active[i] for i in range(n)])
        if all(terms) or all(truncs):
            metrics = infos[0].get("metrics", {})
            break
    return {
        "kind": kind,
        "collision": collision,
        "on_target": on_target,
        "seed": seed,
        "obs_radius": config.obs_radius,
        "max_steps": config.max_episode_steps,
        "obstacles": grid.obstacles.astype(np.uint8),
        "starts": np.array(grid._initial_xy, np.int16),
        "targets": np.array(grid.finishes_xy, np.int16),
        "actions": np.array(steps["actions"], np.int8),
        "obs": np.packbits(np.array(steps["obs"], np.uint8)),
        "obs_shape": np.array(np.array(steps["obs"]).shape),
        "active": np.array(steps["active"], bool),
        "rewards": np.array(steps["rewards"], np.float32),
        "terminated": np.array(steps["terminated"], bool),
        "truncated": np.array(steps["truncated"], bool),
        "metrics": np.array([metrics.get(k, np.nan) for k in ("ISR", "CSR", "SoC")]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=12, help="per kind and rule")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    arrays: dict[str, np.ndarray] = {}
    index = 0
    for kind, settings in KINDS.items():
        for collision, on_target in RULES:
            for seed in range(args.episodes):
                episode = record(kind, settings, collision, on_target, seed)
                for key, value in episode.items():
                    arrays[f"{index}/{key}"] = np.asarray(value)
                index += 1
    arrays["episodes"] = np.array(index)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {index} episodes to {args.out}")


if __name__ == "__main__":
    main()
