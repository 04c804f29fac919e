"""Peer reference: JaxMARL's own IPPO baseline on MPE simple_spread, run here, as a suite.

JaxMARL ships its baselines beside its package, not in it: `--repo` is a checkout of
FLAIROx/JaxMARL (its commit is recorded; `--commit` names it where the folder is not a git
checkout). In `.venv-jaxmarl` (`--setup` makes it: the jaxmarl release and what the baseline
imports), the script runs `baselines/IPPO/ippo_ff_mpe.py`'s own `make_train` with its own
`config/ippo_ff_mpe.yaml`, its `NUM_SEEDS` seeds from its `SEED` vmapped as its `main` does,
wandb disabled as the config's `WANDB_MODE` says; only `TOTAL_TIMESTEPS` is set (`--steps`).

A seed's result is JaxMARL's own metric at its last update, the one its `main` reports:
`returned_episode_returns`, the return of each env's last finished episode averaged over the
update's 128 steps and every actor. Its `MPELogWrapper` multiplies each agent's reward by the
number of agents, so the value is a return summed over the agents, of the policy as it acts
in training (sampled actions); episodes last 26 steps (`done` once the step counter reaches
`max_steps` 25). The suite's conventions say so, and `marlctl reproduce` compares marlctl's
`eval_sampled/return_mean` on 26-step episodes with the value divided by the agents.

Writes `suites/jaxmarl-mpe.yaml`: one cell per budget recorded, its spec the config
translated to marlctl (`suites/jaxmarl-mpe/ippo-simple_spread.yaml`), its reference the
per-seed values; each peer run is appended to `bench/results/peer_jaxmarl.jsonl`.

    .venv/bin/python bench/peer_jaxmarl.py --setup
    .venv/bin/python bench/peer_jaxmarl.py --repo PATH/TO/JaxMARL --steps 2000000
    .venv/bin/marlctl reproduce suites/jaxmarl-mpe.yaml
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

import yaml
from common import machine, per_seed_values

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-jaxmarl"
DONE = ROOT / "bench" / "results" / "peer_jaxmarl.jsonl"
SUITE = ROOT / "suites" / "jaxmarl-mpe.yaml"
SPEC = "jaxmarl-mpe/ippo-simple_spread.yaml"
BASELINE = "baselines/IPPO/ippo_ff_mpe.py"
# The jaxmarl release and the baseline's own imports (its `algs` extra, less what it does not
# import): the versions measured are recorded with each run.
PINS = ["jaxmarl==0.2.0", "distrax", "wandb", "hydra-core>=1.3.2", "optax"]
AGENTS = 3  # MPE_simple_spread_v3's default
EPISODE_LENGTH = 26

# Runs inside .venv-jaxmarl: argv = baseline folder, TOTAL_TIMESTEPS. Prints one JSON line.
DRIVER = """
import importlib.metadata as md, json, sys, time
sys.path.insert(0, sys.argv[1])
import jax, numpy as np, wandb
from omegaconf import OmegaConf
import ippo_ff_mpe as baseline
config = OmegaConf.to_container(OmegaConf.load(sys.argv[1] + "/config/ippo_ff_mpe.yaml"))
config["TOTAL_TIMESTEPS"] = float(sys.argv[2])
wandb.init(mode=config["WANDB_MODE"], config=config)
start = time.perf_counter()
rngs = jax.random.split(jax.random.PRNGKey(config["SEED"]), config["NUM_SEEDS"])
out = jax.vmap(jax.jit(baseline.make_train(config)))(rngs)
returns = np.asarray(out["metrics"]["returned_episode_returns"])  # (seeds, updates)
seconds = time.perf_counter() - start
every = max(1, returns.shape[1] // 50)
print(json.dumps({
    "config": config,
    "final": returns[:, -1].tolist(),
    "curve_updates": list(range(0, returns.shape[1], every)),
    "curve": returns[:, ::every].tolist(),
    "steps_per_update": config["NUM_ENVS"] * config["NUM_STEPS"],
    "wall_s": seconds,
    "versions": {p: md.version(p) for p in ("jaxmarl", "jax", "jaxlib", "flax", "optax",
                                             "distrax", "wandb")},
}))
"""


def setup() -> None:
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *PINS], check=True)


def commit_of(repo: Path, given: str | None) -> str:
    if given:
        return given
    found = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if found.returncode != 0:
        raise SystemExit(f"{repo} is not a git checkout: name its commit with --commit")
    return found.stdout.strip()


def peer_run(repo: Path, steps: int, commit: str) -> dict:
    folder = repo / Path(BASELINE).parent
    if not (repo / BASELINE).exists():
        raise SystemExit(f"{repo / BASELINE}: not found; --repo is a JaxMARL checkout")
    done = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", DRIVER, str(folder), str(steps)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"JaxMARL's baseline failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "steps": steps,
        "commit": commit,
        "machine": machine(),
        "measured": date.today().isoformat(),
        **result,
    }


def cell_name(steps: int) -> str:
    return f"ippo-simple_spread-{steps / 1e6:g}m"


def write_suite(runs: list[dict]) -> None:
    """The recorded peer runs as a suite: a cell per budget, the latest run of each."""
    latest = {run["steps"]: run for run in runs}
    body: dict = {
        "name": SUITE.stem,
        "description": (
            "JaxMARL's IPPO baseline (baselines/IPPO/ippo_ff_mpe.py with its "
            "config/ippo_ff_mpe.yaml) on MPE simple_spread, run with JaxMARL's own code here "
            "(bench/peer_jaxmarl.py); the cell's spec is that config translated to marlctl. "
            "The reference is JaxMARL's own metric at the last update: the return of the "
            "sampled policy's last finished episode per env, averaged over the update's 128 "
            "steps (about 5 episodes per env, 16 envs), summed over the 3 agents."
        ),
        "points": {
            "random": "random",
            "scripted": "marlctl.envs.native.simple_spread:scripted_policy",
        },
        "cells": {},
    }
    for steps, run in sorted(latest.items()):
        versions = run["versions"]
        body["cells"][cell_name(steps)] = {
            "spec": SPEC,
            "seeds": 5,
            "reference": {
                **per_seed_values(run["final"]),
                "budget": steps,
                "source": {
                    "kind": "peer",
                    "citation": "JaxMARL (Rutherford et al., NeurIPS 2024 Datasets and "
                    "Benchmarks, arXiv:2311.10090), baselines/IPPO/ippo_ff_mpe.py with "
                    f"config/ippo_ff_mpe.yaml, TOTAL_TIMESTEPS {steps:g}, its "
                    f"{run['config']['NUM_SEEDS']} seeds from SEED {run['config']['SEED']}",
                    "code": f"FLAIROx/JaxMARL {run['commit'][:7]}, "
                    + ", ".join(f"{k} {v}" for k, v in versions.items()),
                    "machine": f"{run['machine']}; measured {run['measured']}",
                },
                "conventions": {
                    "metric": "eval_sampled/return_mean",
                    "aggregation": "sum",
                    "agents": AGENTS,
                    "evaluation": "stochastic",
                    "episodes": round(
                        run["config"]["NUM_ENVS"] * run["config"]["NUM_STEPS"] / EPISODE_LENGTH
                    ),
                    "step": "env",
                    "episode_length": EPISODE_LENGTH,
                },
                "env_package": {"name": "jaxmarl", "version": versions["jaxmarl"]},
            },
        }
    SUITE.write_text(yaml.safe_dump(body, sort_keys=False, width=100, allow_unicode=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="store_true", help=f"make {VENV.name} and stop")
    parser.add_argument("--repo", type=Path, help="a checkout of FLAIROx/JaxMARL")
    parser.add_argument("--commit", help="the checkout's commit, where it is not a git one")
    parser.add_argument("--steps", type=int, default=2_000_000, help="TOTAL_TIMESTEPS")
    parser.add_argument("--suite", action="store_true", help="only write the suite")
    args = parser.parse_args()
    if args.setup:
        setup()
        return
    runs = [json.loads(line) for line in DONE.read_text().splitlines()] if DONE.exists() else []
    if not args.suite:
        if args.repo is None:
            raise SystemExit("--repo is needed to run the baseline")
        if not (VENV / "bin" / "python").exists():
            raise SystemExit(f"no {VENV.name}: run with --setup first")
        run = peer_run(args.repo, args.steps, commit_of(args.repo, args.commit))
        runs.append(run)
        with DONE.open("a") as out:
            out.write(json.dumps(run) + "\n")
        print(f"{cell_name(args.steps)}: {[round(v, 2) for v in run['final']]}, "
              f"{run['wall_s']:.0f} s")  # fmt: skip
    write_suite(runs)


if __name__ == "__main__":
    main()
