"""Peer reference: JaxMARL's own IPPO baselines, run here, as suites: on MPE simple_spread
(`--work mpe`), on SMAX against its heuristic enemies (`--work smax`) and on Overcooked
(`--work overcooked`).

JaxMARL ships its baselines beside its package, not in it: `--repo` is a checkout of
FLAIROx/JaxMARL (its commit is recorded; `--commit` names it where the folder is not a git
checkout). In `.venv-jaxmarl` (`--setup` makes it: the jaxmarl release and what the baselines
import) the script runs the baseline's own `make_train` with its own config; wandb stays
disabled as the config's `WANDB_MODE` says; only `TOTAL_TIMESTEPS` (`--steps`) and, on SMAX,
`MAP_NAME` (`--map`) are set.

MPE: `baselines/IPPO/ippo_ff_mpe.py` with `config/ippo_ff_mpe.yaml`, its `NUM_SEEDS` seeds
from its `SEED` vmapped as its `main` does. A seed's result is JaxMARL's own metric at its
last update, the one its `main` reports: `returned_episode_returns`, the return of each env's
last finished episode averaged over the update's 128 steps and every actor. Its
`MPELogWrapper` multiplies each agent's reward by the number of agents, so the value is a
return summed over the agents, of the policy as it acts in training (sampled actions);
episodes last 26 steps (`done` once the step counter reaches `max_steps` 25). The suite's
conventions say so, and `marlctl reproduce` compares marlctl's `eval_sampled/return_mean` on
26-step episodes with the value divided by the agents.

SMAX: `baselines/IPPO/ippo_rnn_smax.py` with `config/ippo_rnn_smax.yaml` (GRU agents, 128
envs, 10M env steps, map 2s3z), `--seeds` seeds from its `SEED` one after another (its `main`
trains one), the jitted `make_train` compiled once. The baseline reports what it measures
through `wandb.log` inside a host callback; the driver records what that callback logs: the
win rate of the episodes that ended in each update (128 steps of 128 envs, the sampled
policy), and counts those episodes. A seed's result is the win rate of its last update; the
suite compares marlctl's `eval_sampled/win_rate`.

Overcooked: `baselines/IPPO/ippo_ff_overcooked.py` with `config/ippo_ff_overcooked.yaml`
(16 envs of 128 steps per update, separate 64x64 tanh actor and critic on the flattened grid,
the shaped reward annealed to zero over `REW_SHAPING_HORIZON`), `ENV_KWARGS.layout` set to
`--layout` as its `main` sets it, `--seeds` seeds from its `SEED` vmapped as its `main` does.
A seed's result is the metric its `wandb.log` receives at the last update:
`returned_episode_returns`, the sparse return (20 per soup delivered; both cooks receive it) of
each env's last finished 400-step episode, the policy acting as it trains, averaged over the
update's 128 steps, the 16 envs and the two cooks. The config's `WANDB_MODE` (online) is set
to disabled: nothing leaves the machine.

Writes `suites/jaxmarl-mpe.yaml`, `suites/jaxmarl-smax.yaml` and
`suites/jaxmarl-overcooked.yaml`: one cell per budget (and map or layout) recorded, its spec
the config translated to marlctl (`suites/jaxmarl-*/`), its reference the per-seed values;
each peer run is appended to `bench/results/peer_jaxmarl.jsonl`.

    .venv/bin/python bench/peer_jaxmarl.py --setup
    .venv/bin/python bench/peer_jaxmarl.py --repo PATH/TO/JaxMARL --steps 2000000
    .venv/bin/python bench/peer_jaxmarl.py --work smax --repo PATH/TO/JaxMARL --seeds 3
    .venv/bin/python bench/peer_jaxmarl.py --work overcooked --repo PATH/TO/JaxMARL --seeds 3 \
        --steps 5000000
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
SMAX_SUITE = ROOT / "suites" / "jaxmarl-smax.yaml"
SMAX_BASELINE = "baselines/IPPO/ippo_rnn_smax.py"
OVERCOOKED_SUITE = ROOT / "suites" / "jaxmarl-overcooked.yaml"
OVERCOOKED_BASELINE = "baselines/IPPO/ippo_ff_overcooked.py"
OVERCOOKED_EPISODE = 400  # Overcooked's max_steps
# The jaxmarl release and the baseline's own imports (its `algs` extra, less what it does not
# import): the versions measured are recorded with each run.
PINS = ["jaxmarl==0.2.0", "distrax", "wandb", "hydra-core>=1.3.2", "optax"]
AGENTS = 3  # MPE_simple_spread_v3's default
EPISODE_LENGTH = 26

VERSIONS = ("jaxmarl", "jax", "jaxlib", "flax", "optax", "distrax", "wandb")

# Runs inside .venv-jaxmarl, before a baseline's own driver: argv = baseline folder, its module,
# TOTAL_TIMESTEPS, then the driver's own. Loads the baseline and its config; `report` prints
# one JSON line with the config and the versions measured.
HEAD = """
import importlib, importlib.metadata as md, json, sys, time
folder, module = sys.argv[1], sys.argv[2]
sys.path.insert(0, folder)
import jax, numpy as np, wandb
from omegaconf import OmegaConf
baseline = importlib.import_module(module)
config = OmegaConf.to_container(OmegaConf.load(f"{folder}/config/{module}.yaml"))
config["TOTAL_TIMESTEPS"] = float(sys.argv[3])

def report(result):
    versions = {p: md.version(p) for p in VERSIONS}
    steps_per_update = config["NUM_ENVS"] * config["NUM_STEPS"]
    print(json.dumps({"config": config, **result, "steps_per_update": steps_per_update,
                      "versions": versions}))
"""

# MPE: the seeds vmapped, as the baseline's `main` runs them.
DRIVER = """
wandb.init(mode=config["WANDB_MODE"], config=config)
start = time.perf_counter()
rngs = jax.random.split(jax.random.PRNGKey(config["SEED"]), config["NUM_SEEDS"])
out = jax.vmap(jax.jit(baseline.make_train(config)))(rngs)
returns = np.asarray(out["metrics"]["returned_episode_returns"])  # (seeds, updates)
seconds = time.perf_counter() - start
every = max(1, returns.shape[1] // 50)
report({
    "final": returns[:, -1].tolist(),
    "curve_updates": list(range(0, returns.shape[1], every)),
    "curve": returns[:, ::every].tolist(),
    "wall_s": seconds,
})
"""

# SMAX: argv adds MAP_NAME and the seeds. The baseline logs each update through `wandb.log` in a
# host callback (`io_callback`): the driver keeps what it logs, and beside it counts the
# episodes that ended in the update, read from the same metrics the callback receives.
SMAX_DRIVER = """
config["MAP_NAME"] = sys.argv[4]
wandb.init(mode=config["WANDB_MODE"], config=config)
logged, ended = [], {}
baseline.wandb.log = lambda row: logged.append({k: float(v) for k, v in row.items()})
io_callback = jax.experimental.io_callback

def counting(callback, result_shape, metric, *args, **kwargs):
    def both(m):
        ended[int(m["update_steps"])] = int(np.asarray(m["returned_episode"])[:, :, 0].sum())
        return callback(m)
    return io_callback(both, result_shape, metric, *args, **kwargs)

jax.experimental.io_callback = counting
train = jax.jit(baseline.make_train(config))
seeds = []
for seed in range(config["SEED"], config["SEED"] + int(sys.argv[5])):
    logged.clear(); ended.clear()
    start = time.perf_counter()
    jax.block_until_ready(train(jax.random.PRNGKey(seed)))
    seconds = time.perf_counter() - start
    rows = sorted(logged, key=lambda row: row["env_step"])
    every = max(1, len(rows) // 50)
    seeds.append({
        "seed": seed,
        "final": rows[-1]["win_rate"],
        "final_returns": rows[-1]["returns"],
        "episodes": ended[max(ended)],
        "curve_steps": [row["env_step"] for row in rows[::every]],
        "curve": [row["win_rate"] for row in rows[::every]],
        "wall_s": seconds,
    })
report({
    "final": [s["final"] for s in seeds],
    "seeds": seeds,
    "wall_s": sum(s["wall_s"] for s in seeds),
})
"""

# Overcooked: argv adds the layout's name and the seeds, vmapped as the baseline's `main` runs
# them (the MPE driver). Its `main` puts the layout itself in ENV_KWARGS, which `make_train`
# reads when called; the name goes back for the record.
OVERCOOKED_DRIVER = (
    """
from jaxmarl.environments.overcooked import overcooked_layouts
layout = sys.argv[4]
config["ENV_KWARGS"]["layout"] = overcooked_layouts[layout]
config["NUM_SEEDS"] = int(sys.argv[5])
config["WANDB_MODE"] = "disabled"
make_train = baseline.make_train

def made(config):
    train = make_train(config)
    config["ENV_KWARGS"]["layout"] = layout
    return train

baseline.make_train = made
"""
    + DRIVER
)


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


# Each work's baseline and the driver that runs it; the option that names a SMAX map or an
# Overcooked layout, recorded under its name.
PLACE = {"smax": "map", "overcooked": "layout"}
WORKS = {
    "mpe": (BASELINE, DRIVER),
    "smax": (SMAX_BASELINE, SMAX_DRIVER),
    "overcooked": (OVERCOOKED_BASELINE, OVERCOOKED_DRIVER),
}


def peer_run(repo: Path, steps: int, commit: str, work: str, where: tuple[str, int]) -> dict:
    """JaxMARL's baseline of `work` at `steps`; SMAX and Overcooked: `where` is the map or
    layout, and the seeds."""
    baseline, body = WORKS[work]
    folder = repo / Path(baseline).parent
    if not (repo / baseline).exists():
        raise SystemExit(f"{repo / baseline}: not found; --repo is a JaxMARL checkout")
    driver = f"VERSIONS = {VERSIONS!r}\n" + HEAD + body
    extra = [where[0], str(where[1])] if work in PLACE else []
    module = Path(baseline).stem
    done = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", driver, str(folder), module, str(steps), *extra],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"JaxMARL's baseline failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        **({"work": work, PLACE[work]: where[0]} if work in PLACE else {}),
        "steps": steps,
        "commit": commit,
        "machine": machine(),
        "measured": date.today().isoformat(),
        **result,
    }


def cell_name(steps: int) -> str:
    return f"ippo-simple_spread-{steps / 1e6:g}m"


def source(run: dict, baseline: str, seeds: str) -> dict:
    return {
        "kind": "peer",
        "citation": "JaxMARL (Rutherford et al., NeurIPS 2024 Datasets and Benchmarks, "
        f"arXiv:2311.10090), {baseline} with config/{Path(baseline).stem}.yaml, "
        f"TOTAL_TIMESTEPS {run['steps']:g}, {seeds}",
        "code": f"FLAIROx/JaxMARL {run['commit'][:7]}, "
        + ", ".join(f"{k} {v}" for k, v in run["versions"].items()),
        "machine": f"{run['machine']}; measured {run['measured']}",
    }


def write_suite(runs: list[dict]) -> None:
    """The recorded MPE peer runs as a suite: a cell per budget, the latest run of each."""
    latest = {run["steps"]: run for run in runs if run.get("work", "mpe") == "mpe"}
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
        body["cells"][cell_name(steps)] = {
            "spec": SPEC,
            "seeds": 5,
            "reference": {
                **per_seed_values(run["final"]),
                "budget": steps,
                "source": source(
                    run,
                    BASELINE,
                    f"its {run['config']['NUM_SEEDS']} seeds from SEED {run['config']['SEED']}",
                ),
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
                "env_package": {"name": "jaxmarl", "version": run["versions"]["jaxmarl"]},
            },
        }
    SUITE.write_text(yaml.safe_dump(body, sort_keys=False, width=100, allow_unicode=True))


def smax_cell_name(run: dict) -> str:
    return f"ippo-{run['map']}-{run['steps'] / 1e6:g}m"


def overcooked_cell_name(run: dict) -> str:
    return f"ippo-{run['layout']}-{run['steps'] / 1e6:g}m"


def peer_cell(run: dict, spec: str, baseline: str, seeds: str, conventions: dict) -> dict:
    """A suite cell of 3 seeds of `spec` against a recorded peer run's per-seed values."""
    return {
        "spec": spec,
        "seeds": 3,
        "reference": {
            **per_seed_values(run["final"]),
            # what it trained: whole updates (TOTAL_TIMESTEPS // NUM_STEPS // NUM_ENVS)
            "budget": int(run["config"]["NUM_UPDATES"]) * run["steps_per_update"],
            "source": source(run, baseline, seeds),
            "conventions": conventions,
            "env_package": {"name": "jaxmarl", "version": run["versions"]["jaxmarl"]},
        },
    }


def write_peer_suite(runs: list[dict], work: str, path: Path, description: str) -> None:
    """The recorded peer runs of `work` as a suite: a cell per map or layout and budget, the
    latest run of each; random play its reference point. No run: nothing written."""
    name_of, parts_of = CELLS[work]
    latest = {name_of(run): run for run in runs if run.get("work") == work}
    if not latest:
        return
    cells = {name: peer_cell(run, *parts_of(run)) for name, run in sorted(latest.items())}
    body = {"name": path.stem, "description": description, "points": {"random": "random"},
            "cells": cells}  # fmt: skip
    path.write_text(yaml.safe_dump(body, sort_keys=False, width=100, allow_unicode=True))


def sampled_conventions(metric: str, episodes: int, **extra) -> dict:
    """The conventions of a value the baseline logs in training: the policy's sampled actions,
    averaged over the agents, env steps."""
    conventions = {"metric": metric, "aggregation": "mean", "evaluation": "stochastic"}
    return {**conventions, "episodes": episodes, "step": "env", **extra}


def smax_parts(run: dict) -> tuple[str, str, str, dict]:
    """A SMAX cell's spec, baseline, seeds and conventions."""
    seeds = run["seeds"]
    episodes = round(sum(s["episodes"] for s in seeds) / len(seeds))
    conventions = sampled_conventions("eval_sampled/win_rate", episodes)
    seeds_text = (
        f"MAP_NAME {run['map']}, seeds {seeds[0]['seed']} to {seeds[-1]['seed']} "
        "(one process, one after another)"
    )
    return f"jaxmarl-smax/ippo-{run['map']}.yaml", SMAX_BASELINE, seeds_text, conventions


def episodes_read(config: dict) -> int:
    """The episodes the last update's `returned_episode_returns` averages: at each of the
    update's steps every env holds its last finished episode's return, and the envs' episodes
    end together (fixed length), so each env counts the episode held at the update's first step
    and every one that ends later in the update."""
    updates, steps = int(config["NUM_UPDATES"]), config["NUM_STEPS"]
    first, last = (updates - 1) * steps + 1, updates * steps  # each env's steps at the reads
    held = last // OVERCOOKED_EPISODE - first // OVERCOOKED_EPISODE + 1
    return config["NUM_ENVS"] * held


def overcooked_parts(run: dict) -> tuple[str, str, str, dict]:
    """An Overcooked cell's spec, baseline, seeds and conventions."""
    config = run["config"]
    conventions = sampled_conventions(
        "eval_sampled/return_mean", episodes_read(config), episode_length=OVERCOOKED_EPISODE
    )
    seeds_text = (
        f"layout {run['layout']}, its {config['NUM_SEEDS']} seeds from SEED "
        f"{config['SEED']} vmapped"
    )
    spec = f"jaxmarl-overcooked/ippo-{run['layout']}.yaml"
    return spec, OVERCOOKED_BASELINE, seeds_text, conventions


# Each work's cell name and cell parts.
CELLS = {
    "smax": (smax_cell_name, smax_parts),
    "overcooked": (overcooked_cell_name, overcooked_parts),
}

SMAX_DESCRIPTION = (
    "JaxMARL's IPPO baseline on SMAX (baselines/IPPO/ippo_rnn_smax.py with its "
    "config/ippo_rnn_smax.yaml: GRU agents, 128 envs of 128 steps per update, the "
    "heuristic enemies), run with JaxMARL's own code here (bench/peer_jaxmarl.py --work "
    "smax); each cell's spec is that config translated to marlctl, and its comment says "
    "what does not translate (JaxMARL's actor and critic share a trunk; gradient "
    "clipping, advantage standardisation, GRU resets and minibatches differ in detail). "
    "The reference is the win rate the baseline logs at its last update: the battles "
    "that ended in the update's 128 steps of 128 envs, the policy acting as it trains "
    "(sampled actions, the learning rate annealed almost to zero). marlctl's value is "
    "the final policy's win rate over fresh evaluation battles with sampled actions."
)
OVERCOOKED_DESCRIPTION = (
    "JaxMARL's IPPO baseline on Overcooked (baselines/IPPO/ippo_ff_overcooked.py with "
    "its config/ippo_ff_overcooked.yaml: 16 envs of 128 steps per update, separate "
    "64x64 tanh actor and critic on the flattened grid, the shaped reward annealed to "
    "zero over the first 2.5M env steps), run with JaxMARL's own code here "
    "(bench/peer_jaxmarl.py --work overcooked); each cell's spec is that config "
    "translated to marlctl. The reference is the return the baseline logs at its last "
    "update: the sparse return (20 per soup delivered, received by both cooks) of each "
    "env's last finished 400-step episode, the policy acting as it trains (sampled "
    "actions), averaged over the update's steps, envs and cooks. marlctl's value is the "
    "final policy's sampled return over fresh evaluation episodes, the sparse reward "
    "alone."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="store_true", help=f"make {VENV.name} and stop")
    parser.add_argument("--repo", type=Path, help="a checkout of FLAIROx/JaxMARL")
    parser.add_argument("--commit", help="the checkout's commit, where it is not a git one")
    parser.add_argument("--work", choices=tuple(WORKS), default="mpe")
    parser.add_argument("--steps", type=int, default=2_000_000, help="TOTAL_TIMESTEPS")
    parser.add_argument("--map", default="2s3z", help="SMAX's MAP_NAME")
    parser.add_argument("--layout", default="cramped_room", help="Overcooked's layout")
    parser.add_argument(
        "--seeds", type=int, default=3, help="SMAX's seeds (one after another), Overcooked's"
    )
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
        where = (getattr(args, PLACE.get(args.work, "map")), args.seeds)
        run = peer_run(args.repo, args.steps, commit_of(args.repo, args.commit), args.work, where)
        runs.append(run)
        with DONE.open("a") as out:
            out.write(json.dumps(run) + "\n")
        name = CELLS[args.work][0](run) if args.work in CELLS else cell_name(args.steps)
        print(f"{name}: {[round(v, 2) for v in run['final']]}, {run['wall_s']:.0f} s")
    write_suite(runs)
    write_peer_suite(runs, "smax", SMAX_SUITE, SMAX_DESCRIPTION)
    write_peer_suite(runs, "overcooked", OVERCOOKED_SUITE, OVERCOOKED_DESCRIPTION)


if __name__ == "__main__":
    main()
