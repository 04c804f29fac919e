"""Compile a checked spec into runs placed on devices, threads and memory: what
`run --dry-run` prints.

Pure: probes the environment through PettingZoo (numpy only) and never imports torch.
`learner_info`, `learning_teams`, `unused_fields` and `vmas_problem` live in `marlctl.spec`
and are imported from here too.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from marlctl.algos import registered_algos
from marlctl.envs.info import EnvInfo
from marlctl.errors import SpecError
from marlctl.spec import LoadedSpec, check_spec
from marlctl.spec.checks import resolve_device, vmas_problem
from marlctl.spec.models import Spec
from marlctl.spec.teams import learner_info, learning_teams, team_rollouts, unused_fields


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
    # What a run's steps count: env steps, or an offline algorithm's gradient steps.
    step_unit: str = "env steps"

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
            "step_unit": self.step_unit,
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
    """Check the spec against the environment and the machine (`marlctl.spec.check_spec`),
    then place every seed."""
    spec, prov = loaded.spec, loaded.provenance
    gpus = visible_cuda_devices() if cuda_devices is None else cuda_devices
    env_info = check_spec(loaded, env_info, gpus)
    hw, train = spec.hardware, spec.train
    pool = list(hw.devices) if hw.devices else [resolve_device(hw.device, gpus)]
    cores = available_cores()
    # Batched seeds share one process per device.
    processes = min(len(pool), len(spec.seeds)) if hw.batch_seeds else len(spec.seeds)
    concurrent = min(hw.parallel_runs, processes)
    if hw.threads_per_run != "auto" and hw.threads_per_run * concurrent > cores:
        message = (
            f"{hw.threads_per_run} threads × {concurrent} concurrent run processes "
            f"(hardware.parallel_runs={hw.parallel_runs}) oversubscribe this machine's "
            f"{cores} cores"
        )
        raise SpecError([prov.problem("hardware.threads_per_run", message)])
    seeds_per_process = len(spec.seeds) // processes if hw.batch_seeds else 1
    threads, most, note, passive = resolve_threads(
        spec, env_info, cores, concurrent, seeds_per_process
    )
    rollout = max((steps for _, steps in team_rollouts(spec, env_info)), default=1)
    per_iter = rollout * hw.num_envs  # a round of every team's iterations
    if registered_algos()[spec.algo.name].offline:
        per_iter = spec.algo.updates  # gradient steps, with no env step
    iterations = -(-train.budget // per_iter)
    memory = _estimate_memory_mb(loaded, env_info, rollout)
    _check_memory(loaded, env_info, pool, memory, seeds_per_process)
    runs = tuple(
        RunPlan(
            i,
            seed,
            pool[i % len(pool)],
            threads,
            hw.num_envs,
            train.budget,
            iterations,
            memory,
            most,
        )
        for i, seed in enumerate(spec.seeds)
    )
    return Plan(
        loaded.experiment,
        registered_algos()[spec.algo.name].name,
        env_info,
        runs,
        concurrent,
        cores,
        per_iter,
        hw.batch_seeds,
        _players(spec, env_info),
        note,
        passive,
        "gradient steps" if registered_algos()[spec.algo.name].offline else "env steps",
    )


def _check_memory(loaded: LoadedSpec, info: EnvInfo, pool, memory: float, seeds: int) -> None:
    """SpecError where the estimate alone exceeds this machine's memory: it leaves out
    activations and the env itself, so such a run would be killed, or take the machine down
    with it, once it fills up."""
    spec, prov = loaded.spec, loaded.provenance
    ram = physical_memory_mb()
    if "cpu" not in pool[: len(spec.seeds)] or not ram or memory * seeds <= ram:
        return
    need = f"{memory * seeds:,.0f} MiB per run process"
    if _buffer_mb(spec, info) * 2 > memory:  # the replay buffer is most of it
        key = "algo.buffer_size"
        what = f"a replay buffer of {spec.algo.buffer_size:,} transitions"
    else:
        key, what = "hardware.num_envs", f"{spec.hardware.num_envs:,} envs"
    message = (
        f"{what} need(s) an estimated {need} for rollouts, replay and networks, "
        f"more than this machine's {ram:,.0f} MiB of memory; lower {key}"
    )
    raise SpecError([prov.problem(key, message)])


def _players(spec: Spec, info: EnvInfo) -> dict[str, str]:
    """Who plays each group, as `run --dry-run` shows it."""
    players = {
        g.name: f"algo: {cfg.name}"
        for _, _, cfg, _, groups in learning_teams(spec, info)
        for g in groups
    }
    for name, g in spec.opponents.items():
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
    return players


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


def _estimate_memory_mb(loaded: LoadedSpec, env: EnvInfo, rollout: int) -> float:
    """Networks with Adam state plus rollout buffers, in MiB (envs themselves excluded)."""
    spec = loaded.spec
    hidden = list(spec.model.hidden)

    def mlp(n_in: int, n_out: int) -> int:
        sizes = [n_in, *hidden, n_out]
        return sum(a * b + b for a, b in itertools.pairwise(sizes))

    algo = registered_algos()[spec.algo.name]
    centralised = algo.centralised_critic
    params, floats = 0, 0
    for g in env.groups:
        sharing = spec.model.sharing
        mode = sharing.get(g.name, "shared") if isinstance(sharing, dict) else sharing
        copies = 1 if mode == "shared" else g.n_agents
        extra = g.n_agents if mode == "shared" and g.n_agents > 1 else 0
        conv, obs_in = 0, g.obs_dim
        state_conv, state_in = 0, env.state_dim
        if spec.model.encoder_for(g.name) == "cnn":
            if g.frame_shape is not None:
                conv, obs_in = spec.model.cnn.parameters(g.frame_shape)
            if algo.on_policy and env.state_frame is not None:  # the critic convolves it
                state_conv, state_in = spec.model.cnn.for_state().parameters(env.state_frame)
        actor = conv + mlp(obs_in + extra, g.n_actions)
        critic = (
            state_conv + mlp(state_in + extra, 1) if centralised else conv + mlp(obs_in + extra, 1)
        )
        params += copies * (actor + critic)
        # A rollout stores each agent's observation (uint8 frames: a quarter of a float each)
        # and the global state once per env (a decentralised critic reads the observation).
        obs = g.obs_dim / 4 if g.obs_storage == "uint8" else g.obs_dim
        # (an on-policy rollout keeps a uint8 frame state as bytes; replay holds floats)
        small = algo.on_policy and env.state_storage == "uint8"
        state = env.state_dim / 4 if small else env.state_dim
        per_env = g.n_agents * (obs + g.n_actions + 8) + (state if centralised else 0)
        floats += rollout * spec.hardware.num_envs * per_env
    return round((params * 4 + floats) * 4 / 2**20 + _buffer_mb(spec, env), 2)


def _buffer_mb(spec: Spec, env: EnvInfo) -> float:
    """A replay buffer's floats in MiB (0 for on-policy algorithms): per stored transition
    the observations, next observations, state and next state."""
    buffer = getattr(spec.algo, "buffer_size", 0)
    per_step = 2 * env.state_dim + sum(
        g.n_agents * (2 * g.obs_dim / (4 if g.obs_storage == "uint8" else 1) + g.n_actions + 4)
        for g in env.groups
    )
    return buffer * per_step * 4 / 2**20


__all__ = [
    "Plan",
    "RunPlan",
    "auto_threads",
    "available_cores",
    "compile_plan",
    "learner_info",
    "learning_teams",
    "physical_memory_mb",
    "resolve_threads",
    "unused_fields",
    "visible_cuda_devices",
    "vmas_problem",
]
