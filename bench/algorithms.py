"""Benchmark: every registered algorithm, and A2C's preset, on MPE simple_spread and
simple_speaker_listener, on SMAX 3m and 2s3z (2s3z: a heterogeneous team), and on VMAS
het_mass (two agents of different masses).

For each algorithm × task: several seeds trained as one batch on the native backend (on
`vmas` for VMAS; discrete actions, N=3 and 25 steps for simple_spread), through
`marlctl run`, each cell in
its own MLflow store under `bench/runs/`. Reports the final per-agent eval return (mean over
seeds, its 95% Student-t interval and the worst seed), on SMAX the final eval win rate, the
env steps per seed, the wall-clock time of the batch, and the eval curves
(`algorithms_curves.png`). Reference points beside them: uniform random (allowed) actions
and, on simple_spread, a scripted policy.
Writes `bench/results/algorithms.md`; every finished cell is appended to
`bench/results/algorithms.jsonl`, and a re-run skips the cells recorded with the same
budget, seeds and settings.

    .venv/bin/python bench/algorithms.py                        # every algorithm, both tasks
    .venv/bin/python bench/algorithms.py --algos qmix,vdn --envs simple_spread
    .venv/bin/python bench/algorithms.py --algos mappo,happo --envs 2s3z --seeds 3 \
        --out bench/results/algorithms_smax.md
    .venv/bin/python bench/algorithms.py --algos mappo,mappo-independent,happo --envs het_mass \
        --on-policy-steps 500000 --off-policy-steps 300000 --out bench/results/algorithms_het.md
    .venv/bin/python bench/algorithms.py --device cuda --jobs 4  # cells side by side on a GPU
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import yaml
from common import machine, marlctl_json, per_seed_values, t_interval

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "algorithms.md"
WORKDIR = ROOT / "bench" / "runs"  # the MLflow stores of benchmark runs (not committed)
# Every finished cell, raw (the seeds' returns and curves); an interrupted benchmark resumes.
DONE = ROOT / "bench" / "results" / "algorithms.jsonl"

TASKS = {
    "simple_spread": {"N": 3, "max_cycles": 25, "local_ratio": 0.5},
    "simple_speaker_listener": {"max_cycles": 25},
    # SMAX's scenarios at their defaults (the heuristic enemies): 3m (3 marines a side) and
    # 2s3z (2 stalkers and 3 zealots, a heterogeneous team)
    "3m": {},
    "2s3z": {},
    # VMAS het_mass, 100 steps, masses 4 and 2: both agents earn the larger of their speeds
    # less what both spend on force, so the light agent should run and the heavy one rest.
    # Without the mass noise: VMAS draws one mass per agent for the whole batch at each
    # reset, so with it an evaluation of 100 episodes would be a single draw.
    "het_mass": {"max_steps": 100, "mass_noise": 0},
}
SMAX = ("3m", "2s3z")  # `smax/TASK`
VMAS = ("het_mass",)  # `vmas/TASK` on the vmas backend; the rest are `mpe/TASK`
# On SMAX, beyond the family's settings, for every algorithm whose config has the field:
# JaxMARL's MAPPO SMAX config (baselines/MAPPO/config/mappo_homogenous_rnn_smax.yaml,
# as `specs/smax_3m_mappo.yaml`): 128-step rollouts of 128 envs, 4 epochs of 4 minibatches,
# clip 0.05, lr 4e-3 annealed, entropy 0.01, value coef 0.5, gradient clip 0.25, GAE 0.95,
# GRU agents of width 128 (where the algorithm is recurrent); HATRPO still takes one step per
# rollout (its KL-bounded step). Replay-based algorithms keep their family's settings but
# gamma 0.99: SMAX's episodes run to 100 steps.
SMAX_SETTINGS = {
    "on_policy": {
        "lr": 4e-3,
        "anneal_lr": True,
        "rollout_steps": 128,
        "epochs": 4,
        "minibatches": 4,
        "critic_epochs": 4,
        "clip": 0.05,
        "entropy_coef": 0.01,
        "value_coef": 0.5,
        "max_grad_norm": 0.25,
        "gae_lambda": 0.95,
        "huber_delta": None,
        "value_norm": False,
    },
    "hatrpo": {"epochs": 1},
    "off_policy": {"gamma": 0.99},
    "model": {"hidden": [128, 128], "activation": "relu", "recurrent": "gru"},
}
# Per family: parallel envs per seed and algorithm settings (the rest are the defaults).
ON_POLICY = {"num_envs": 128, "algo": {"epochs": 4, "minibatches": 4, "lr": 1e-3}}
# Two updates of 256 transitions per 32 env steps. gamma 0.9 as JaxMARL's MPE Q-learning
# configs, for every replay-based algorithm alike (the Q-learning family's default; MADDPG,
# MATD3 and MASAC default to 0.99): bootstrapping through MPE's 25-step time limit with 0.99
# makes values span four episodes.
OFF_POLICY = {"num_envs": 32, "algo": {"batch_size": 256, "updates": 2, "gamma": 0.9}}


# Per algorithm, beyond its family's settings: the heterogeneous-agent algorithms train at
# MAPPO's rollout length and passes over it, so that a cell differs from MAPPO's by the
# sequential update alone (HARL's own defaults are 200-step rollouts and 5 epochs).
EXTRA = {
    "happo": {"rollout_steps": 25, "critic_epochs": 4},
    "hatrpo": {"rollout_steps": 25, "epochs": 1, "critic_epochs": 4},
}
# Presets benchmarked as algorithms (`algos/NAME.yaml`): their values replace the family's.
PRESETS = ("a2c", "ia2c")
# Variants benchmarked as rows of their own: (algorithm or preset, settings beyond its own;
# a "model" entry holds model settings, a "num_envs" entry the parallel envs per seed).
# HARL trains HASAC (and its MASAC baseline) on MPE with 20-step returns. A2C's learning rate
# is searched in its paper (log-uniform over 1e-4..1e-2); the presets keep SB3's 7e-4, tuned
# for 16 Atari envs, and lr 4e-3 is the step that suits 640-transition batches here.
VARIANTS = {
    "masac-n20": ("masac", {"n_step": 20}),
    # HASAC's actor reads the other agents' current actions; this MASAC does too, so that
    # it differs from HASAC by the sequential update alone.
    "masac-current": ("masac", {"actor_joint_action": "current"}),
    "hasac-n20": ("hasac", {"n_step": 20}),
    # The heterogeneous-agent algorithms train a network per agent (HARL's choice); these
    # baselines do too, where agents of one group would otherwise share one.
    "mappo-independent": ("mappo", {"model": {"sharing": "independent"}}),
    "masac-current-independent": (
        "masac",
        {"actor_joint_action": "current", "model": {"sharing": "independent"}},
    ),
    "a2c-lr4e-3": ("a2c", {"lr": 4e-3}),
    "ia2c-lr4e-3": ("ia2c", {"lr": 4e-3}),
    # JaxMARL's QMIX SMAX config (baselines/QLearning/config/alg/qmix_rnn_smax.yaml) on the
    # SMAX GRU agents of width 128 (JaxMARL: 512): rounds of 128 steps of 16 envs, 8 updates
    # of 32 stored 128-step trajectories (a buffer of 5000 of them), lr 5e-5, learning from
    # 10k steps, targets copied every 10 rounds (80 updates), a mixer of width 64 with
    # hypernetworks of 256 initialised at scale 0.001, epsilon annealed over a tenth of the
    # budget (here 2M steps), raw rewards.
    "qmix-smax": (
        "qmix",
        {
            "num_envs": 16,
            "rollout_steps": 128,
            "updates": 8,
            "batch_size": 32,
            "sequence_length": 128,
            "buffer_size": 640_000,
            "learning_starts": 10_000,
            "lr": 5e-5,
            "target_update_every": 80,
            "mixer_embed": 64,
            "hypernet_hidden": 256,
            "mixer_init_scale": 0.001,
            "epsilon_anneal_steps": 200_000,
            "reward_scaling": "none",
        },
    ),
}


@functools.cache
def preset(name: str) -> dict:
    """A preset's values as a spec that pulls it in gets them (its own defaults composed)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(ROOT), version_base=None):
        return OmegaConf.to_container(compose(overrides=[f"+algos={name}"]).algo)


def registered(algo: str) -> str:
    """The registered algorithm a benchmark row trains (a preset or a variant names one)."""
    base = VARIANTS[algo][0] if algo in VARIANTS else algo
    return preset(base)["name"] if base in PRESETS else base


def settings(algo: str, on_policy: bool, task: str | None = None) -> dict:
    """The row's settings on `task`: its family's (or preset's), the algorithm's EXTRA, on
    SMAX `SMAX_SETTINGS` (the fields the algorithm has), then the variant's own values."""
    base, changed = VARIANTS.get(algo, (algo, {}))
    changed = dict(changed)
    own_model = changed.pop("model", None)
    own_envs = changed.pop("num_envs", None)
    if base in PRESETS:
        family = {"num_envs": ON_POLICY["num_envs"], "algo": preset(base)}
    else:
        family = ON_POLICY if on_policy else OFF_POLICY
        family = {**family, "algo": {**family["algo"], **EXTRA.get(registered(algo), {})}}
    if task in SMAX:
        info = algo_info(algo)
        ours = SMAX_SETTINGS["on_policy" if on_policy else "off_policy"]
        ours = {k: v for k, v in ours.items() if k in info.config.model_fields}
        ours.update(SMAX_SETTINGS.get(registered(algo), {}))
        family = {**family, "algo": {**family["algo"], **ours}}
        model = SMAX_SETTINGS["model"]
        family["model"] = (
            model if info.recurrent else {k: v for k, v in model.items() if k != "recurrent"}
        )
    if own_model:
        family = {**family, "model": {**family.get("model", {}), **own_model}}
    if own_envs:
        family = {**family, "num_envs": own_envs}
    return {**family, "algo": {**family["algo"], **changed}}


def algo_info(algo: str):
    from marlctl.algos import registered_algos

    return registered_algos()[registered(algo)]


def defaults(algo: str) -> dict:
    """The algorithm's default hyperparameters: a recorded cell is reused only while they hold."""
    return algo_info(algo).config().model_dump(mode="json")


def env_id(task: str) -> str:
    return f"smax/{task}" if task in SMAX else f"vmas/{task}" if task in VMAS else f"mpe/{task}"


def backend(task: str) -> str:
    return "vmas" if task in VMAS else "native"


def reports_wins(task: str) -> bool:
    """Whether the task's env says who won an episode (`eval/win_rate` is logged)."""
    from marlctl.envs.native import native_class

    if task in VMAS:
        return False
    return getattr(native_class(env_id(task)), "reports_wins", False)


def spec_for(algo: str, task: str, steps: int, seeds: int, on_policy: bool, hw: dict) -> dict:
    family = settings(algo, on_policy, task)
    spec = {
        "name": f"bench-{algo}-{task}",
        "seeds": list(range(seeds)),
        "env": {"id": env_id(task), "backend": backend(task), "params": TASKS[task]},
        "algo": {"name": registered(algo), **family["algo"]},
        "train": {
            "total_env_steps": steps,
            "eval_every": max(steps // 20, 1),
            "eval_episodes": 100,
            "checkpoint_every": 0,
        },
        "hardware": {"num_envs": family["num_envs"], "batch_seeds": True, **hw},
    }
    if "model" in family:
        spec["model"] = family["model"]
    return spec


# The recorded cells as suites `marlctl reproduce` runs, by env family: marlctl's own earlier
# results, regression baselines.
SUITES = {
    "baseline-mpe": ("simple_spread", "simple_speaker_listener"),
    "baseline-smax": SMAX,
    "baseline-vmas-het": VMAS,
}


# Reference points beyond uniformly random play: a scripted policy of the task.
SCRIPTED = {"simple_spread": "marlctl.envs.native.simple_spread:scripted_policy"}


def write_suites(done: list[dict]) -> None:
    """Each family's recorded cells (of an algorithm on a task, the one of the largest
    budget) as a suite of regression baselines: the cell's spec from its recorded settings,
    its reference the seeds' final returns, with the commit that recorded them."""
    import subprocess
    from importlib import metadata

    commit = subprocess.run(
        ["git", "log", "-1", "--format=%h", "--", str(DONE)],
        capture_output=True, text=True, cwd=ROOT, check=True,
    ).stdout.strip()  # fmt: skip
    version = metadata.version("marlctl")
    for name, tasks in SUITES.items():
        chosen: dict[tuple[str, str], dict] = {}
        for row in done:
            key = (row["algo"], row["task"])
            if row["task"] in tasks and row.get("ok") and len(row["returns"]) >= 2:
                if key not in chosen or row["budget"] > chosen[key]["budget"]:
                    chosen[key] = row
        folder = ROOT / "suites" / name
        folder.mkdir(parents=True, exist_ok=True)
        cells = {}
        for (algo, task), row in sorted(chosen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            cell = f"{algo}-{task}"
            spec = suite_spec(algo, task, row)
            (folder / f"{cell}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
            length = TASKS[task].get("max_cycles", TASKS[task].get("max_steps"))
            cells[cell] = {
                "spec": f"{name}/{cell}.yaml",
                "seeds": len(row["returns"]),
                **({"points": {"scripted": SCRIPTED[task]}} if task in SCRIPTED else {}),
                "reference": {
                    **per_seed_values(row["returns"]),
                    "budget": row["budget"],
                    "source": {
                        "kind": "baseline",
                        "citation": "marlctl's own earlier result, a regression baseline "
                        "(bench/results/algorithms.jsonl)",
                        "code": f"marlctl {commit} or earlier",
                        "machine": row["machine"],
                    },
                    "conventions": {
                        "metric": "eval/return_mean",
                        "aggregation": "mean",
                        "evaluation": "deterministic",
                        "episodes": 100,
                        "step": "env",
                        "episode_length": length,
                    },
                    "env_package": (
                        {"name": "vmas", "version": metadata.version("vmas")}
                        if task in VMAS
                        else {"name": "marlctl", "version": version}
                    ),
                },
            }
        body = {
            "name": name,
            "description": (
                "marlctl's own recorded results (bench/algorithms.py): regression baselines, "
                "not reproductions of a published result."
            ),
            "points": {"random": "random"},
            "cells": cells,
        }
        (ROOT / "suites" / f"{name}.yaml").write_text(
            yaml.safe_dump(body, sort_keys=False, width=100)
        )


def suite_spec(algo: str, task: str, row: dict) -> dict:
    """The cell's spec from its recorded settings over the algorithm's defaults when it ran,
    every field pinned (seeds and name come from the suite)."""
    family, steps = row["settings"], row["budget"]
    spec = {
        "env": {"id": env_id(task), "backend": backend(task), "params": TASKS[task]},
        "algo": {**row["defaults"], "name": registered(algo), **family["algo"]},
        "train": {
            "total_env_steps": steps,
            "eval_every": max(steps // 20, 1),
            "eval_episodes": 100,
            "checkpoint_every": 0,
        },
        "hardware": {"num_envs": family["num_envs"], "batch_seeds": True, "threads_per_run": 2},
    }
    if "model" in family:
        spec["model"] = family["model"]
    return spec


def curves(
    folder: Path, run_ids: list[str], metric: str = "eval/return_mean"
) -> list[list[list[float]]]:
    """Per seed: [[env steps...], [metric...]] from the cell's MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    out = []
    for run_id in run_ids:
        history = client.get_metric_history(run_id, metric)
        history = sorted(history, key=lambda m: m.step)
        out.append([[m.step for m in history], [m.value for m in history]])
    return out


def run(algo: str, task: str, steps: int, seeds: int, on_policy: bool, hw: dict) -> dict:
    folder = WORKDIR / f"{algo}-{task}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_for(algo, task, steps, seeds, on_policy, hw)))
    summary, wall = marlctl_json(["run", str(path)], folder, f"{algo} on {task}")
    returns = [r["final_return"] for r in summary["runs"] if r["final_return"] is not None]
    run_ids = [r["run_id"] for r in summary["runs"]]
    where = machine(hw["device"])
    row = cell_row(algo, task, steps, on_policy, hw["device"], where, folder, run_ids, returns)
    return row | {
        "env_steps": max(r["env_steps"] for r in summary["runs"]),
        "wall_s": wall,
        "ok": summary["ok"],
    }


def cell_row(
    algo: str,
    task: str,
    steps: int,
    on_policy: bool,
    device: str,
    where: str,
    folder: Path,
    run_ids: list[str],
    returns: list[float],
) -> dict:
    """A cell's record, less how far and how long it ran: returns, settings, curves."""
    mean, half = t_interval(returns)
    row = {
        "algo": algo,
        "task": task,
        "mean": mean,
        "ci": half,
        "returns": returns,
        "budget": steps,
        "settings": settings(algo, on_policy, task),
        "defaults": defaults(algo),
        "device": device,
        "machine": where,
        "curves": curves(folder, run_ids),
    }
    if reports_wins(task):
        row["win_curves"] = curves(folder, run_ids, "eval/win_rate")
        row["win_rates"] = [c[1][-1] for c in row["win_curves"] if c[1]]
    return row


def stopped(algo: str, task: str, steps: int, on_policy: bool, folder: Path, where: str) -> dict:
    """The cell of a run stopped before its budget (interrupted, or out of time on a machine
    held for a limited time), from its MLflow store in `folder`: each seed's last evaluation
    stands as its final one, the env steps are those of that evaluation, and the wall-clock
    is the experiment run's. `where` describes the machine it ran on. The row says it
    stopped."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    (experiment,) = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        f"tags.`marlctl.role` = 'experiment' and attributes.run_name = 'bench-{algo}-{task}'",
    )
    seeds = client.search_runs(
        [experiment.info.experiment_id],
        f"tags.`mlflow.parentRunId` = '{experiment.info.run_id}'",
    )
    seeds = sorted(seeds, key=lambda r: int(r.data.tags["marlctl.seed"]))
    run_ids = [r.info.run_id for r in seeds]
    last = [c[1][-1] for c in curves(folder, run_ids)]
    device = experiment.data.params.get("hardware.device", "cpu")
    row = cell_row(algo, task, steps, on_policy, device, where, folder, run_ids, last)
    reasons = sorted({r.data.tags.get("marlctl.error", r.info.status) for r in seeds})
    return row | {
        "env_steps": min(c[0][-1] for c in row["curves"]),
        "wall_s": (experiment.info.end_time - experiment.info.start_time) / 1000,
        "ok": True,
        "stopped": "; ".join(reasons),
    }


# ---------------------------------------------------------------- reference points


def task_env(task: str, episodes: int):
    """The task's batched env on the CPU, `episodes` envs (VMAS's own on the vmas backend)."""
    if task in VMAS:
        import torch

        from marlctl.envs.vmas import VmasEnv

        return VmasEnv(env_id(task), task, TASKS[task], episodes, torch.device("cpu"))
    from marlctl.envs.native import native_class

    return native_class(env_id(task))(TASKS[task], episodes, "cpu")


def play(env, act, seed: int):
    """One episode in each of `env`'s envs, `act(observation)` choosing every step's actions:
    the per-agent episode return of each env and whether its episode was won."""
    import torch

    ob = env.reset(seed)
    agents = sum(g.n_agents for g in env.info.groups)
    n = next(iter(ob.obs.values())).shape[0]
    total = torch.zeros(n)
    running = torch.ones(n, dtype=torch.bool)  # the first episode has not ended
    won = torch.zeros(n, dtype=torch.bool)
    while running.any():
        step = env.step(act(ob))
        reward = sum(r.sum(-1) for r in step.rewards.values()) / agents
        total += torch.where(running, reward, 0.0)
        done = step.terminated | step.truncated
        if step.won is not None:
            won |= running & done & step.won
        running &= ~done
        ob = step.next
    return total, won


def random_play(task: str, episodes: int = 1024, seed: int = 0) -> dict[str, float]:
    """Uniform random actions (among the allowed ones where the env masks them) on the
    task, one episode per env: the mean per-agent episode return and, where the env says
    who won, the win rate."""
    import torch

    env = task_env(task, episodes)
    generator = torch.Generator().manual_seed(seed)

    def act(ob) -> dict:
        actions = {}
        for g in env.info.groups:
            mask = ob.masks.get(g.name)
            if mask is None:
                draw = torch.randint(g.n_actions, (episodes, g.n_agents), generator=generator)
            else:
                weights = mask.reshape(-1, g.n_actions).to(torch.float32)
                draw = torch.multinomial(weights, 1, generator=generator).view(mask.shape[:-1])
            actions[g.name] = draw
        return actions

    total, won = play(env, act, seed)
    out = {"random": float(total.mean())}
    if reports_wins(task):
        out["random win rate"] = float(won.float().mean())
    return out


def best_constant_play(task: str, episodes: int = 64, seed: int = 0) -> tuple[float, tuple]:
    """Every joint action held for a whole episode, `episodes` episodes each, all in one
    batch: the best mean per-agent episode return and the joint action (one per agent, in
    group order) that earns it. On het_mass: the light agent pushing and the heavy one at
    rest, the behaviour the task rewards, fixed."""
    import torch

    groups = task_env(task, 1).info.groups
    counts = [g.n_actions for g in groups for _ in range(g.n_agents)]
    joint = list(itertools.product(*(range(n) for n in counts)))
    table = torch.tensor(joint).repeat_interleave(episodes, 0)  # [envs, agents]
    actions = dict(
        zip([g.name for g in groups], table.split([g.n_agents for g in groups], 1), strict=True)
    )
    total, _ = play(task_env(task, len(table)), lambda ob: actions, seed)
    means = total.view(len(joint), episodes).mean(1)
    best = int(means.argmax())
    return float(means[best]), joint[best]


def scripted_spread_return(episodes: int = 1024, seed: int = 0, lookahead: float = 0.1) -> float:
    """A scripted simple_spread policy with full state: each step, agents take the
    assignment to landmarks of least total distance (all N! of them compared) and each picks
    the move that brings its position `lookahead` seconds past the next step closest to its
    landmark. Per-agent episode return."""
    import torch

    from marlctl.envs.native import native_class

    params = TASKS["simple_spread"]
    N = params["N"]
    env = native_class("mpe/simple_spread")(params, episodes, "cpu")
    env.reset(seed)
    assignments = torch.tensor(list(itertools.permutations(range(N))))
    moves = env.moves.to(torch.float32)  # [5, 2]: the discrete actions' forces
    total = torch.zeros(episodes)
    for _ in range(params["max_cycles"]):
        pos, landmarks, vel = env.agent_pos(), env.landmark_pos(), env.vel[:, :N]
        distance = (pos[:, :, None] - landmarks[:, None]).norm(dim=-1)  # [E, agent, landmark]
        cost = distance[:, torch.arange(N), assignments].sum(-1)  # [E, assignments]
        goal = assignments[cost.argmin(-1)]  # [E, N]
        target = landmarks.gather(1, goal[..., None].expand(-1, -1, 2))
        after = vel[:, :, None] * (1 - env.damping) + moves * env.accel[0] * env.dt
        future = pos[:, :, None] + env.dt * vel[:, :, None] + lookahead * after
        action = (future - target[:, :, None]).norm(dim=-1).argmin(-1)
        total += env.step({"agent": action}).rewards["agent"].mean(-1)
    return float(total.mean())


# ---------------------------------------------------------------- main


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from marlctl.algos import registered_algos

    algos = registered_algos()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default=",".join([*algos, *PRESETS, *VARIANTS]))
    parser.add_argument("--envs", default=",".join(t for t in TASKS if t not in SMAX))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--on-policy-steps", type=int, default=2_000_000)
    parser.add_argument("--off-policy-steps", type=int, default=1_000_000)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per cell")
    parser.add_argument("--jobs", type=int, default=1, help="cells trained side by side")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--note", default="", help="a sentence for the table's header")
    parser.add_argument(
        "--table", action="store_true", help="only write the table of the cells recorded so far"
    )
    parser.add_argument(
        "--from-store",
        type=Path,
        help="record the one cell asked for from this MLflow store folder, of a run stopped "
        "before its budget (on a machine held for a limited time), instead of training it",
    )
    parser.add_argument("--machine", help="with --from-store: the machine the run ran on")
    parser.add_argument(
        "--suites",
        action="store_true",
        help="write the recorded cells as regression-baseline suites in suites/ and stop",
    )
    args = parser.parse_args()
    if args.suites:
        write_suites(list(load_done().values()))
        return
    hw = {"device": args.device, "threads_per_run": args.threads}
    done = load_done()
    shown = [a for a in sys.argv[1:] if a not in ("--note", args.note, "--table")]
    for option in ("--from-store", "--machine"):  # the table names the training command
        if option in shown:
            at = shown.index(option)
            del shown[at : at + 2]
    command = " ".join([".venv/bin/python bench/algorithms.py", *shown])
    if args.from_store and not args.machine:
        parser.error("--from-store needs --machine: the machine the stored run ran on")
    cells = []
    for task in args.envs.split(","):
        for algo in args.algos.split(","):
            on = algos[registered(algo)].on_policy
            steps = args.on_policy_steps if on else args.off_policy_steps
            cells.append((algo, task, steps, on))

    def cell(item: tuple) -> dict | None:
        algo, task, steps, on = item
        config = settings(algo, on, task)
        row = done.get(key(algo, task, steps, args.seeds, config, defaults(algo)))
        if row is not None or args.table:
            return row
        if args.from_store:
            row = stopped(algo, task, steps, on, args.from_store, args.machine)
            if len(row["returns"]) != args.seeds:
                raise SystemExit(
                    f"{args.from_store}: {len(row['returns'])} seeds, not {args.seeds}"
                )
        else:
            row = run(algo, task, steps, args.seeds, on, hw)
        with DONE.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if "curves" not in k}), flush=True)
        return row

    if args.from_store and len(cells) != 1:
        parser.error("--from-store records one cell: name one algorithm and one task")
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = [row for row in pool.map(cell, cells) if row is not None]
    references = {task: random_play(task) for task in args.envs.split(",")}
    if "simple_spread" in references:
        references["simple_spread"]["scripted"] = scripted_spread_return()
    if "het_mass" in references:
        references["het_mass"]["best constant"] = best_constant_play("het_mass")[0]
    write_table(args.out, rows, references, command, args.seeds, args.note)
    write_curves(args.out.with_name(args.out.stem + "_curves.png"), rows, references)


def key(algo: str, task: str, steps: int, seeds: int, family: dict, config: dict) -> str:
    return json.dumps([algo, task, steps, seeds, family, config], sort_keys=True)


def load_done() -> dict[str, dict]:
    """Cells finished by an earlier invocation, keyed by algo, task, budget, seeds, settings
    and the algorithm's defaults (cells measured under others are not reused)."""
    if not DONE.exists():
        return {}
    rows = [json.loads(line) for line in DONE.read_text().splitlines() if line.strip()]
    return {
        key(r["algo"], r["task"], r["budget"], len(r["returns"]), r["settings"], r["defaults"]): r
        for r in rows
        if r["ok"] and "defaults" in r
    }


def write_table(
    out: Path,
    rows: list[dict],
    references: dict,
    command: str,
    seeds: int,
    note: str,
) -> None:
    machines: list[str] = []
    for r in rows:
        if r["machine"] not in machines:
            machines.append(r["machine"])
    families = sorted({env_id(task).split("/")[0].upper() for task in references})
    wins = any("win_rates" in r for r in rows)
    smax = [task for task in references if task in SMAX]
    lines = [
        f"# Algorithms on {' and '.join(families)} "
        + (
            "(discrete actions)"
            if any(t in VMAS for t in references)
            else "(native backend, discrete actions)"
        ),
        "",
        f"Written {date.today()} by `{command}`. Machines (the last column): "
        + "; ".join(f"({i}) {m}" for i, m in enumerate(machines, 1))
        + ". Compare wall-clock figures only between rows of the same machine.",
        "",
        f"{seeds} seeds per cell, trained as one batch (`hardware.batch_seeds`); final eval "
        "return = mean over 100 deterministic episodes of the per-agent episode return; "
        "± is the 95% Student-t interval over seeds; 'worst' is the lowest seed. Settings: "
        f"on-policy {ON_POLICY}, off-policy {OFF_POLICY}, and beyond them {EXTRA}"
        + (
            f"; on {' and '.join(smax)}, for the algorithms that have the field, {SMAX_SETTINGS}"
            if smax
            else ""
        )
        + f"; a preset row ({', '.join(PRESETS)}) is the on-policy trainer with "
        "`algos/NAME.yaml`'s values alone (the rest are each algorithm's defaults); a variant "
        "row is its base with these values changed: "
        + "; ".join(f"{name} = {base} with {changed}" for name, (base, changed) in VARIANTS.items())
        + f". Curves: `{out.stem}_curves.png`.",
        *([note] if note else []),
        "",
        "| task | algo | final eval return | 95% CI | worst seed | "
        + ("final win rate (per seed) | " if wins else "")
        + "env steps per seed | wall-clock, all seeds | machine |",
        "|---|---|---|---|---|" + ("---|" if wins else "") + "---|---|---|",
    ]
    for r in rows:
        win = ""
        if wins:
            rates = r.get("win_rates")
            win = (
                f"{sum(rates) / len(rates):.0%} ({', '.join(f'{x:.0%}' for x in rates)}) | "
                if rates
                else "| "
            )
        steps = f"{r['env_steps']:,}" + (" (stopped)" if r.get("stopped") else "")
        lines.append(
            f"| {r['task']} | {r['algo']} | {r['mean']:.2f} | ± {r['ci']:.2f} | "
            f"{min(r['returns']):.2f} | {win}{steps} | {r['wall_s'] / 60:.1f} min | "
            f"({machines.index(r['machine']) + 1}) |"
        )
    for task, points in references.items():
        for name, value in points.items():
            if name.endswith("win rate"):
                continue
            win = f"{points[name + ' win rate']:.0%} | " if name + " win rate" in points else ""
            blank = "| " if wins and not win else ""
            lines.append(f"| {task} | *{name}* | {value:.2f} | | | {win}{blank}| | |")
    explained = {
        "random": "uniform random actions (among the allowed ones), 1,024 episodes",
        "scripted": "agents take the assignment to landmarks of least total distance each "
        "step and the move that brings them closest to their landmark (full state; "
        "`scripted_spread_return`)",
        "best constant": "the best joint action held for whole episodes, every one tried on "
        "64 episodes (`best_constant_play`)",
    }
    shown = {name for points in references.values() for name in points}
    lines += [
        "",
        " ".join(f"*{name}*: {text}." for name, text in explained.items() if name in shown)
        + (
            " A win rate is the fraction of battles won in the episodes of the return beside it."
            if wins
            else ""
        )
        + "".join(
            f" {r['task']} {r['algo']} (stopped): stopped before its budget of "
            f"{r['budget']:,} env steps per seed ({r['stopped']}); each seed's last "
            "evaluation stands as its final one."
            for r in rows
            if r.get("stopped")
        ),
    ]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", flush=True)


def write_curves(out: Path, rows: list[dict], references: dict) -> None:
    """Mean eval curve over seeds per algorithm, with its 95% t band: one panel per task,
    and one of the win rate per task whose env says who won."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from scipy import stats

    panels = [(task, "curves", "eval return per agent") for task in references]
    panels += [
        (task, "win_curves", "eval win rate")
        for task in references
        if any(r["task"] == task and r.get("win_curves") for r in rows)
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (task, field, label) in zip(axes[0], panels, strict=True):
        for r in (r for r in rows if r["task"] == task and r.get(field)):
            common = sorted(set.intersection(*(set(c[0]) for c in r[field])))
            if not common:
                continue
            values = np.array([[dict(zip(*c, strict=True))[s] for s in common] for c in r[field]])
            mean = values.mean(0)
            ax.plot(common, mean, label=r["algo"])
            if len(values) > 1:
                half = stats.t.ppf(0.975, len(values) - 1) * values.std(0, ddof=1)
                half /= math.sqrt(len(values))
                ax.fill_between(common, mean - half, mean + half, alpha=0.2)
        for name, value in references[task].items():
            if name.endswith("win rate") != (field == "win_curves"):
                continue
            ax.axhline(value, linestyle="--", color="grey", linewidth=0.8)
            ax.annotate(name, (0, value), fontsize=8, color="grey", va="bottom")
        ax.set_title(task)
        ax.set_xlabel("env steps per seed")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
