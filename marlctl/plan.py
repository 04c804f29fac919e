"""Compile a validated spec into runs placed on devices: what `run --dry-run` prints.

Pure: probes the environment through PettingZoo (numpy only) and never imports torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from marlctl.algos import registered_algos
from marlctl.envs.registry import EnvInfo, probe
from marlctl.errors import SpecError
from marlctl.spec import LoadedSpec, env_problem, native_params_problem
from marlctl.spec.models import Spec


@dataclass(frozen=True)
class RunPlan:
    index: int
    seed: int
    device: str
    threads: int
    num_envs: int
    total_env_steps: int
    iterations: int
    est_memory_mb: float
    # `threads_per_run: auto`: the most threads the run may take while it trains, as cores
    # come free (`marlctl.cores.CoreWatch`); 0 where the spec fixes the number.
    max_threads: int = 0


@dataclass(frozen=True)
class Plan:
    experiment: str
    algo: str
    env: EnvInfo
    runs: tuple[RunPlan, ...]
    parallel_runs: int
    cores: int
    steps_per_iteration: int
    batch_seeds: bool = False
    # Who plays each group: `algo: NAME`, `scripted: random`, `frozen: RUN_ID`.
    players: dict[str, str] = field(default_factory=dict)
    # How the threads were chosen: `auto` with the cores it found free, or the spec's
    # number where other processes leave fewer cores free than it takes.
    threads_note: str = ""
    # OpenMP threads wait for work without spinning (OMP_WAIT_POLICY=PASSIVE): the spec's
    # threads outnumber the cores other processes leave free.
    passive_wait: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "algo": self.algo,
            "batch_seeds": self.batch_seeds,
            "env": {
                "id": self.env.id,
                "agents": self.env.n_agents,
                "state_dim": self.env.state_dim,
                "state_from_env": self.env.state_from_env,
                "groups": [
                    {
                        "name": g.name,
                        "agents": list(g.agents),
                        "obs_shape": list(g.obs_shape),
                        "actions": ("discrete" if g.discrete else "continuous"),
                        "n_actions": g.n_actions,
                        "action_mask": g.mask_source is not None,
                        "played_by": self.players.get(g.name, f"algo: {self.algo}"),
                    }
                    for g in self.env.groups
                ],
            },
            "parallel_runs": self.parallel_runs,
            "cores": self.cores,
            "threads_note": self.threads_note,
            "passive_wait": self.passive_wait,
            "steps_per_iteration": self.steps_per_iteration,
            "runs": [asdict(r) for r in self.runs],
        }


def visible_cuda_devices() -> int:
    """GPUs this process may use, read from the driver without importing torch."""
    gpus = Path("/proc/driver/nvidia/gpus")
    count = len(list(gpus.iterdir())) if gpus.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
    return count


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, at most its cgroup's CPU quota."""
    from marlctl.cores import limits

    return limits().usable


def physical_memory_mb() -> float | None:
    """This machine's memory in MiB, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
        return None


# Agent rows one gradient step computes, from which a second torch thread pays. Measured on
# 2 cores: QMIX at its batch of 256 (768 rows on simple_spread) ran 9% slower with two
# threads, MAPPO at 16 envs (1,200 rows) 7% faster, QMIX at a batch of 2,048 45% faster.
THREADED_ROWS = 1_000


def auto_threads(spec, info: EnvInfo, share: int, seeds: int = 1) -> int:
    """The most threads `hardware.threads_per_run: auto` gives a run: its `share` of the
    cores (at most `OMP_NUM_THREADS` where that is set, as on a machine shared with other
    jobs), or one thread where a gradient step is too small for a second thread to pay.
    `resolve_threads` takes the cores other processes keep busy off it."""
    cap = os.environ.get("OMP_NUM_THREADS", "")
    if cap.isdigit() and int(cap) > 0:
        share = min(share, int(cap))
    algo = spec.algo
    if hasattr(algo, "minibatches"):  # on-policy: a minibatch of the rollout
        samples = algo.rollout_steps * spec.hardware.num_envs // max(algo.minibatches, 1)
    else:
        length = getattr(algo, "sequence_length", 1) if spec.model.recurrent else 1
        samples = algo.batch_size * length
    rows = samples * info.n_agents * seeds
    return max(1, share) if rows >= THREADED_ROWS else 1


def compile_plan(
    loaded: LoadedSpec, env_info: EnvInfo | None = None, cuda_devices: int | None = None
) -> Plan:
    """Check what needs the environment and the machine, then place every seed."""
    spec, prov = loaded.spec, loaded.provenance
    problems = []
    if env_info is None:
        params = dict(spec.env.params)
        problem = native_params_problem(spec.env.id, spec.env.backend, params, prov)
        if problem is not None:
            raise SpecError([problem])
        try:
            env_info = probe(spec.env.id, params)
        except Exception as err:
            raise SpecError([env_problem(spec.env.id, err, prov, params)]) from None
    algo = registered_algos()[spec.algo.name]
    from marlctl.envs.native import native_only_problem, native_problem

    problem = native_only_problem(env_info.id, spec.env.backend) or vmas_problem(
        spec.env.id, spec.env.backend, spec.hardware.env_workers
    )
    if problem is not None:
        problems.append(prov.problem(*problem))
    elif spec.env.backend == "native":
        problem = native_problem(env_info.id, dict(spec.env.params))
        if problem is not None:
            problems.append(prov.problem(*problem))
        if spec.hardware.env_workers:
            problems.append(
                prov.problem(
                    "hardware.env_workers",
                    "worker processes step PettingZoo envs only; backend: native steps every "
                    "env in one batch on the run's device (set env_workers: 0)",
                )
            )
    names = [g.name for g in env_info.groups]
    for key in spec.groups:
        if key not in names:
            problems.append(
                prov.problem(
                    f"groups.{key}",
                    f"no agent group '{key}' in env '{spec.env.id}'; groups: {', '.join(names)}",
                )
            )
    opponents = spec.opponents
    if names and set(names) <= set(opponents):
        problems.append(
            prov.problem(
                "groups",
                f"every agent group of env '{spec.env.id}' is scripted or frozen: leave at "
                "least one to learn",
            )
        )
    problems += _pool_problems(prov, spec, env_info)
    for _, keys, algo_cfg, model, groups in learning_teams(spec, env_info):
        problems += _algo_problems(prov, spec.env.id, env_info, keys, algo_cfg, model, groups)
    weights, k = spec.env.reward_weights, env_info.objectives
    if weights is not None and not k:
        problems.append(
            prov.problem(
                "env.reward_weights",
                f"env '{spec.env.id}' has a scalar reward: there are no objectives to weigh",
            )
        )
    elif weights is not None and len(weights) != k:
        problems.append(
            prov.problem(
                "env.reward_weights",
                f"env '{spec.env.id}' has {k} objectives; give {k} weights, not {len(weights)}",
            )
        )
    elif k and spec.env.backend != "pettingzoo":
        problems.append(
            prov.problem("env.backend", "multi-objective envs run on backend pettingzoo")
        )
    sharing = spec.model.sharing
    if isinstance(sharing, dict):
        for key in sharing:
            if key not in names:
                problems.append(
                    prov.problem(
                        f"model.sharing.{key}",
                        f"no agent group '{key}' in env '{spec.env.id}'; "
                        f"groups: {', '.join(sorted(names))}",
                    )
                )
    rounds = [
        (keys[0], getattr(algo_cfg, "rollout_steps", 1))
        for _, keys, algo_cfg, _, _ in learning_teams(spec, env_info)
    ]
    longest = max((steps for _, steps in rounds), default=1)
    for key, steps in rounds:
        if longest % steps:
            problems.append(
                prov.problem(
                    f"{key}.rollout_steps",
                    f"{steps} rollout steps do not divide the longest team's {longest}: the "
                    "teams step one env together, so each team's rollout_steps must divide "
                    "every longer one's",
                )
            )

    hw, train = spec.hardware, spec.train
    gpus = visible_cuda_devices() if cuda_devices is None else cuda_devices
    pool = list(hw.devices) if hw.devices else [_resolve_device(hw.device, gpus)]
    for index, device in enumerate(pool):
        if device.startswith("cuda"):
            ordinal = int(device.split(":")[1]) if ":" in device else 0
            key = f"hardware.devices.{index}" if hw.devices else "hardware.device"
            if ordinal >= gpus:
                asked = hw.devices[index] if hw.devices else hw.device
                problems.append(
                    prov.problem(
                        key, f"{asked} requested but this machine has {gpus} visible CUDA device(s)"
                    )
                )
    if hw.devices and hw.device not in ("auto", *hw.devices):
        problems.append(
            prov.problem(
                "hardware.device",
                f"'{hw.device}' conflicts with hardware.devices {hw.devices}; "
                "set device: auto or list it in hardware.devices",
            )
        )
    if hw.batch_seeds and spec.env.backend not in ("native", "vmas"):
        problems.append(
            prov.problem(
                "hardware.batch_seeds",
                "seeds are batched on env.backend: native or vmas only (PettingZoo envs step "
                "one at a time in Python)",
            )
        )
    if hw.env_workers > hw.num_envs:
        problems.append(
            prov.problem(
                "hardware.env_workers",
                f"{hw.env_workers} workers for hardware.num_envs={hw.num_envs} environments; "
                "use at most one worker per environment",
            )
        )
    if train.eval_every > train.total_env_steps:
        problems.append(
            prov.problem(
                "train.eval_every",
                f"{train.eval_every} exceeds train.total_env_steps="
                f"{train.total_env_steps}; no evaluation would run before the end",
            )
        )
    if problems:
        from marlctl.spec import sort_problems

        raise SpecError(sort_problems(problems))

    cores = available_cores()
    # Batched seeds share one process per device.
    processes = min(len(pool), len(spec.seeds)) if hw.batch_seeds else len(spec.seeds)
    concurrent = min(hw.parallel_runs, processes)
    if hw.threads_per_run != "auto" and hw.threads_per_run * concurrent > cores:
        problems.append(
            prov.problem(
                "hardware.threads_per_run",
                f"{hw.threads_per_run} threads × {concurrent} concurrent run processes "
                f"(hardware.parallel_runs={hw.parallel_runs}) oversubscribe this machine's "
                f"{cores} cores",
            )
        )
    if problems:
        from marlctl.spec import sort_problems

        raise SpecError(sort_problems(problems))
    seeds_per_process = len(spec.seeds) // processes if hw.batch_seeds else 1
    threads, most, note, passive = resolve_threads(
        spec, env_info, cores, concurrent, seeds_per_process
    )
    rollout = longest  # a round of every team's iterations
    per_iter = rollout * hw.num_envs
    iterations = -(-train.total_env_steps // per_iter)
    memory = _estimate_memory_mb(loaded, env_info, rollout)
    # The estimate leaves out activations and the env itself: a run whose estimate alone
    # exceeds the memory would be killed, or take the machine down with it, once it fills up.
    ram = physical_memory_mb()
    if "cpu" in pool[: len(spec.seeds)] and ram and memory * seeds_per_process > ram:
        need = f"{memory * seeds_per_process:,.0f} MiB per run process"
        if _buffer_mb(spec, env_info) * 2 > memory:  # the replay buffer is most of it
            key = "algo.buffer_size"
            what = f"a replay buffer of {spec.algo.buffer_size:,} transitions"
        else:
            key, what = "hardware.num_envs", f"{hw.num_envs:,} envs"
        raise SpecError(
            [
                prov.problem(
                    key,
                    f"{what} need(s) an estimated {need} for rollouts, replay and networks, "
                    f"more than this machine's {ram:,.0f} MiB of memory; lower {key}",
                )
            ]
        )
    runs = tuple(
        RunPlan(
            i,
            seed,
            pool[i % len(pool)],
            threads,
            hw.num_envs,
            train.total_env_steps,
            iterations,
            memory,
            most,
        )
        for i, seed in enumerate(spec.seeds)
    )
    players = {
        g.name: f"algo: {cfg.name}"
        for _, _, cfg, _, groups in learning_teams(spec, env_info)
        for g in groups
    }
    for name, g in opponents.items():
        players[name] = f"scripted: {g.scripted}" if g.scripted else f"frozen: {g.frozen}"
    for name, pool in spec.pools.items():
        if name in players:
            seats = "" if pool.seats == "all" else ", one seat"
            n = len(pool.include)
            league = f", and {n} included run{'s' * (n != 1)}" if n else ""
            players[name] += (
                f"; {pool.share:.0%} of episodes by a snapshot ({pool.sample}, {pool.size} "
                f"kept, one per {pool.every} steps{seats}{league})"
            )
    return Plan(
        loaded.experiment,
        algo.name,
        env_info,
        runs,
        concurrent,
        cores,
        per_iter,
        hw.batch_seeds,
        players,
        note,
        passive,
    )


def resolve_threads(
    spec, info: EnvInfo, cores: int, concurrent: int, seeds: int = 1
) -> tuple[int, int, str, bool]:
    """(threads each run process starts with, the most `auto` may raise them to while it
    trains or 0 where the spec fixes them, why, whether OpenMP should wait passively).

    `auto` takes the cores other processes keep busy now (`marlctl.cores`) off its share,
    and the run processes at once share the rest: together they never take more threads
    than there are cores free, one each at least. On 2 cores beside a busy loop MAPPO ran
    at 1,330 env steps/s with 2 threads and 22,148 with one (bench/results/threads.md): its
    OpenMP threads spin-wait for each other, and one of them is always waiting for the core
    the other process holds.
    """
    from marlctl.cores import WAIT_VARS, free_cores, plural

    asked = spec.hardware.threads_per_run
    runs = plural(concurrent, "run") + " at once"
    if asked != "auto":
        if asked <= 1:  # one thread per process never spin-waits
            return asked, 0, "", False
        reading = free_cores()
        if asked * concurrent <= max(reading.free, 1):
            return asked, 0, "", False
        # The user's own setting of the wait stands (`marlctl.cores.WAIT_VARS`).
        mine = next((f"{v}={os.environ[v]}" for v in WAIT_VARS if v in os.environ), None)
        wait = mine or "OMP_WAIT_POLICY=PASSIVE, OpenMP threads wait without spinning"
        note = (
            f"{plural(asked, 'thread')} × {runs}, {reading.describe()}: {wait}; "
            "threads_per_run: auto would take the free cores only"
        )
        return asked, 0, note, mine is None
    share = max(1, cores // concurrent)
    most = auto_threads(spec, info, share, seeds)
    if most <= 1:
        cap = os.environ.get("OMP_NUM_THREADS", "")
        if share <= 1:
            why = f"{plural(cores, 'core')} for {runs}"
        elif cap.isdigit() and int(cap) == 1:
            why = "OMP_NUM_THREADS=1"
        else:
            why = "a gradient step too small for a second thread to pay"
        return 1, 0, f"auto: 1, {why}", False
    reading = free_cores()
    threads = max(1, min(most, reading.free // concurrent))
    # One run process at a time watches the cores while it trains; several would each see
    # the others' threads as another process's and take turns giving cores back.
    watches = concurrent == 1 and not spec.hardware.env_workers
    note = f"auto: {threads}, {reading.describe()}; {runs}"
    if watches:
        note += f"; follows the free cores from 1 to {most} while it trains"
    return threads, most if watches else 0, note, False


def _pool_problems(prov, spec, info: EnvInfo) -> list:
    """What keeps a group's pool of snapshots from leaving anyone to learn."""
    problems = []
    sizes = {g.name: g.n_agents for g in info.groups}
    learning = [name for name in sizes if name not in spec.opponents]
    for name, pool in spec.pools.items():
        if name not in sizes:
            continue  # reported as an unknown group
        where = f"groups.{name}.pool"
        if pool.seats == "one":
            if sizes[name] < 2:
                problems.append(
                    prov.problem(
                        f"{where}.seats",
                        f"seats: one leaves the learner the other agents of group '{name}', "
                        f"which has only one; use seats: all",
                    )
                )
            continue
        if pool.share >= 1.0:
            problems.append(
                prov.problem(
                    f"{where}.share",
                    f"share: 1 with seats: all has snapshots play group '{name}' in every "
                    "episode: it would never learn; lower share or use seats: one",
                )
            )
        elif learning == [name]:
            problems.append(
                prov.problem(
                    where,
                    f"group '{name}' is the only one that learns: with seats: all a snapshot "
                    "plays every learner in its episodes; use seats: one for self-play",
                )
            )
    return problems


def learning_teams(spec, info: EnvInfo):
    """(team name, (spec key of its algorithm, of its model), algorithm config, model,
    groups) of every team that learns: each group with an algorithm or model of its own is a
    team named after it; the other learning groups are the default team, named "", with the
    top-level `algo` and `model`."""
    own, others = spec.teams, spec.opponents
    rest = [g for g in info.groups if g.name not in own and g.name not in others]
    if rest or not own:
        yield "", ("algo", "model"), spec.algo, spec.model, rest
    for g in info.groups:
        if g.name in own:
            group = own[g.name]
            key = f"groups.{g.name}.algo" if group.algo is not None else "algo"
            keys = (key, f"groups.{g.name}.model")
            yield g.name, keys, group.algo or spec.algo, group.model, [g]


def unused_fields(spec: Spec, info: EnvInfo) -> list[str]:
    """The spec's fields that take no part in this run, by dotted key: a report leaves them
    out of its hyperparameters. A key shared by several teams (`algo` of groups with a model
    of their own) is unused only where every one of them leaves it unused."""
    unused: dict[str, bool] = {}

    def mark(key: str, is_unused: bool) -> None:
        unused[key] = unused.get(key, True) and is_unused

    for _, (algo_key, model_key), cfg, model, groups in learning_teams(spec, info):
        algo = registered_algos()[cfg.name]
        continuous = any(not g.discrete for g in groups)
        # The actor's distribution of continuous actions (on-policy trainers').
        mark(f"{model_key}.action_dist", not (algo.action_dists and continuous))
        sharing = model.sharing
        if isinstance(sharing, dict):
            modes = {sharing.get(g.name, "shared") for g in groups}
        else:
            modes = {sharing}
        mark(f"{model_key}.federated_every", "federated" not in modes)
        mark(f"{model_key}.agent_ids", "shared" not in modes)  # ids go to shared networks
        if hasattr(cfg, "sequence_length"):  # the Q-learners' windows of recurrent agents
            for name in ("sequence_length", "burn_in"):
                mark(f"{algo_key}.{name}", model.recurrent is None)
        if hasattr(cfg, "tau") and hasattr(cfg, "target_update_every"):
            mark(f"{algo_key}.tau", cfg.target_update_every > 0)  # hard copies instead
    mark("env.reward_weights", not info.objectives)
    return sorted(key for key, is_unused in unused.items() if is_unused)


def _algo_problems(prov, env_id: str, info: EnvInfo, keys, cfg, model, groups) -> list:
    """What keeps algorithm `cfg` with `model` (at spec `keys`) from training `groups`."""
    algo = registered_algos()[cfg.name]
    key, model_key = keys
    problems = []
    for group in groups:
        kind = "discrete" if group.discrete else "continuous"
        if kind not in algo.action_kinds:
            problems.append(
                prov.problem(
                    f"{key}.name",
                    f"algorithm '{algo.name}' does not support {kind} actions, which env "
                    f"'{env_id}' group '{group.name}' has (env.id)",
                )
            )
    if info.turn_based and not algo.turn_based:
        able = ", ".join(name for name, a in registered_algos().items() if a.turn_based)
        problems.append(
            prov.problem(
                f"{key}.name",
                f"algorithm '{algo.name}' does not train on turn-based envs like "
                f"'{env_id}' (one player moves per step): its transitions are single "
                f"steps; use one of {able}",
            )
        )
    dist = model.action_dist
    if dist is not None and dist not in algo.action_dists:
        able = ", ".join(name for name, a in registered_algos().items() if dist in a.action_dists)
        problems.append(
            prov.problem(
                f"{model_key}.action_dist",
                f"algorithm '{algo.name}' has no '{dist}' policy"
                + (
                    f" (its continuous policies: {', '.join(algo.action_dists)})"
                    if algo.action_dists
                    else " (its continuous actions are deterministic or it has none)"
                )
                + f"; set {model_key}.action_dist: null or use one of {able}",
            )
        )
    if model.recurrent is not None and not algo.recurrent:
        able = ", ".join(name for name, a in registered_algos().items() if a.recurrent)
        problems.append(
            prov.problem(
                f"{model_key}.recurrent",
                f"algorithm '{algo.name}' has no recurrent agents (env '{env_id}'): it "
                f"trains on single transitions; set {model_key}.recurrent: null or use one "
                f"of {able}",
            )
        )
    elif model.recurrent is not None and getattr(cfg, "n_step", 1) > 1:
        problems.append(
            prov.problem(
                f"{key}.n_step",
                f"n-step returns ({cfg.n_step}) need feed-forward agents: recurrent ones "
                f"train on sequences; set {key}.n_step: 1 or {model_key}.recurrent: null",
            )
        )
    return problems


def learner_info(info: EnvInfo, spec) -> EnvInfo:
    """The env as its learners see it: the groups that learn, with every agent's state (the
    spec's `groups` play the others)."""
    others = spec.opponents
    if not others:
        return info
    groups = tuple(g for g in info.groups if g.name not in others)
    agents = tuple(a for g in groups for a in g.agents)
    return dataclasses.replace(info, groups=groups, agents=agents)


def vmas_problem(env_id: str, backend: str, workers: int) -> tuple[str, str] | None:
    """(key, message) when a VMAS scenario and the vmas backend are not asked for together."""
    from marlctl.envs.registry import lookup

    vmas = lookup(env_id).suite == "vmas"
    if vmas and backend != "vmas":
        return "env.backend", f"'{env_id}' is a VMAS scenario; set env.backend: vmas"
    if backend == "vmas" and not vmas:
        return (
            "env.backend",
            f"'{env_id}' is not a VMAS scenario (vmas/...): backend vmas runs those",
        )
    if backend == "vmas" and workers:
        return (
            "hardware.env_workers",
            "VMAS steps every env in one batch on the run's device (set env_workers: 0)",
        )
    return None


def _resolve_device(device: str, gpus: int) -> str:
    if device == "auto":
        return "cuda:0" if gpus > 0 else "cpu"
    return "cuda:0" if device == "cuda" else device


def _estimate_memory_mb(loaded: LoadedSpec, env: EnvInfo, rollout: int) -> float:
    """Networks with Adam state plus rollout buffers, in MiB (envs themselves excluded)."""
    spec = loaded.spec
    hidden = list(spec.model.hidden)

    def mlp(n_in: int, n_out: int) -> int:
        sizes = [n_in, *hidden, n_out]
        return sum(a * b + b for a, b in itertools.pairwise(sizes))

    params, floats = 0, 0
    for g in env.groups:
        sharing = spec.model.sharing
        mode = sharing.get(g.name, "shared") if isinstance(sharing, dict) else sharing
        copies = 1 if mode == "shared" else g.n_agents
        extra = g.n_agents if mode == "shared" and g.n_agents > 1 else 0
        centralised = registered_algos()[spec.algo.name].centralised_critic
        critic_in = env.state_dim if centralised else g.obs_dim
        params += copies * (mlp(g.obs_dim + extra, g.n_actions) + mlp(critic_in + extra, 1))
        # A rollout stores each agent's observation and the global state once per env (a
        # decentralised critic reads the observation).
        per_env = g.n_agents * (g.obs_dim + g.n_actions + 8) + (env.state_dim if centralised else 0)
        floats += rollout * spec.hardware.num_envs * per_env
    return round((params * 4 + floats) * 4 / 2**20 + _buffer_mb(spec, env), 2)


def _buffer_mb(spec: Spec, env: EnvInfo) -> float:
    """A replay buffer's floats in MiB (0 for on-policy algorithms): per stored transition
    the observations, next observations, state and next state."""
    buffer = getattr(spec.algo, "buffer_size", 0)
    per_step = 2 * env.state_dim + sum(
        g.n_agents * (2 * g.obs_dim + g.n_actions + 4) for g in env.groups
    )
    return buffer * per_step * 4 / 2**20
