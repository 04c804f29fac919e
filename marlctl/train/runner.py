"""Train one seed (or a batch of seeds): build env and algorithm, train, evaluate,
checkpoint, and log metrics and artifacts into the seed's MLflow run.

The run's lifecycle is not this module's: `launch` creates the run, and ends it with the
status of the `RunResult` returned here. A training that raises gives FAILED with the
reason and traceback; Ctrl-C checkpoints and gives KILLED; a killed process leaves the run
RUNNING with its last checkpoint, which `run --resume` continues.
"""

from __future__ import annotations

import importlib
import math
import os
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marlctl.algos import registered_algos
from marlctl.atomic import staging
from marlctl.envs.batch import BatchedEnv
from marlctl.envs.registry import EnvInfo
from marlctl.plan import RunPlan, learner_info
from marlctl.spec.models import Spec
from marlctl.stored import CHECKPOINT, POLICY, PRUNED_TAG, load_tensors
from marlctl.train.core import EpisodeStats, per_seed_outcomes
from marlctl.train.opponents import with_opponents
from marlctl.train.pool import WithPool, with_pool

EVAL_ENVS = 32
RESUMED_TAG = "marlctl.resumed_from_step"
COMPILE_TAG = "marlctl.compile"  # how training iterations ran: eager, CUDA graph, ...


@dataclass
class RunRequest:
    resolved: dict[str, Any]
    env_info: EnvInfo
    run: RunPlan
    tracking_uri: str | None
    run_id: str
    resume: bool = False
    # Resumed: the last env step whose metrics the run holds (none are logged twice).
    logged_until: int = -1
    # Set by a sweep's pruner: the run stops after its current iteration, without a final
    # evaluation, and is recorded FINISHED with `marlctl.pruned_at_step`.
    stop: Any = None


@dataclass
class RunResult:
    index: int
    seed: int
    run_id: str
    status: str  # FINISHED | FAILED | KILLED | PRUNED
    env_steps: int = 0
    final_return: float | None = None
    steps_per_s: float | None = None
    error: str | None = None
    trace: str | None = None  # the traceback of a failure
    trace_file: str | None = None  # where the run's store keeps it
    tags: dict[str, str] = field(default_factory=dict)  # for the run, set as it ends


Progress = Callable[[dict[str, Any]], None]


class NonFiniteLoss(RuntimeError):
    pass


def build_trainer(
    spec: Spec,
    info: EnvInfo,
    num_envs: int,
    device: torch.device,
    total_iterations: int,
    seeds: tuple[int, ...] = (0,),
):
    """The spec's algorithm for `seeds` (one, or several trained as one batch); where groups
    learn with algorithms or models of their own, every team's trainer as one."""
    if spec.teams:
        trainer = _teams(spec, info, num_envs, device, total_iterations, tuple(seeds))
    else:
        trainer = _trainer(spec.algo, spec.model, info, num_envs, device, total_iterations, seeds)
    if spec.hardware.compile is True:
        trainer.compile()
    return trainer


def _trainer(algo_config, model, info: EnvInfo, num_envs, device, total_iterations, seeds):
    algo = registered_algos()[algo_config.name]
    module, _, name = algo.trainer.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(
        algo_config,
        model,
        info,
        num_envs,
        device,
        total_iterations,
        centralised=algo.centralised_critic,
        seeds=tuple(seeds),
    )


def _teams(spec: Spec, info: EnvInfo, num_envs, device, total_iterations, seeds):
    """A trainer per team (`marlctl.train.teams`); `total_iterations` counts rounds."""
    import dataclasses

    from marlctl.plan import learning_teams
    from marlctl.train.teams import Team, TeamsTrainer

    found = list(learning_teams(spec, info))
    longest = max(getattr(cfg, "rollout_steps", 1) for _, _, cfg, _, _ in found)
    teams = []
    for name, _, cfg, model, groups in found:
        sub = dataclasses.replace(
            info, groups=tuple(groups), agents=tuple(a for g in groups for a in g.agents)
        )
        per_round = longest // getattr(cfg, "rollout_steps", 1)
        trainer = _trainer(cfg, model, sub, num_envs, device, total_iterations * per_round, seeds)
        teams.append(Team(name, [g.name for g in groups], trainer))
    return TeamsTrainer(teams, info, num_envs, device, seeds)


def prepare_iterations(spec: Spec, trainer, env: BatchedEnv, capture: bool = True) -> str:
    """Compile the env's step (`hardware.compile: true`; `build_trainer` compiled the
    networks) and capture the trainer's iterations as a CUDA graph where `hardware.compile`
    asks for it, the run allows it and `capture` does not forbid it; how iterations run, as
    the `compile` tag says it: eager, torch.compile, CUDA graph (with the reason it is not)."""
    compiled = spec.hardware.compile is True
    if compiled and hasattr(env, "compile"):
        env.compile()
    plain = "torch.compile" if compiled else "eager"
    if not capture or spec.hardware.compile is False or trainer.device.type != "cuda":
        return plain
    if not (compiled or trainer.captured_by_default):
        return f"{plain} (this algorithm's iterations are captured with hardware.compile=true)"
    reason = trainer.capture(env)
    if reason is not None:
        return f"{plain} ({reason})"
    return "CUDA graph, torch.compile" if compiled else "CUDA graph"


def make_env(
    spec: Spec,
    info: EnvInfo,
    num_envs: int,
    device: torch.device,
    workers: int = 0,
    seeds: int = 1,
) -> BatchedEnv:
    """`num_envs` envs for each of `seeds` seeds, seed-major, on the spec's backend (native
    or vmas for several); a native env must present the same spaces as its PettingZoo
    original (`info`)."""
    params = dict(spec.env.params)
    if spec.env.backend == "native":
        from marlctl.envs.native import native_class

        env = native_class(info.id)(params, num_envs * seeds, device, seeds=seeds)
        if env.info.groups != info.groups or env.info.state_dim != info.state_dim:
            raise RuntimeError(f"native '{info.id}' does not match its PettingZoo original")
        return env
    if spec.env.backend == "vmas":
        from marlctl.envs.registry import lookup
        from marlctl.envs.vmas import VmasEnv, VmasSeeds

        scenario = dict(lookup(spec.env.id).kwargs)["scenario"]
        if seeds != 1:
            return VmasSeeds(spec.env.id, scenario, params, num_envs, device, seeds)
        return VmasEnv(spec.env.id, scenario, params, num_envs, device)
    if seeds != 1:
        raise ValueError("seeds are batched on the native and vmas backends only")
    from marlctl.envs.pettingzoo import PettingZooEnv

    return PettingZooEnv(
        spec.env.id, params, info, num_envs, device, workers, reward_weights=spec.env.reward_weights
    )


def _reset_seed(seeds: list[int]) -> int | list[int]:
    return seeds[0] if len(seeds) == 1 else seeds


@torch.no_grad()
def evaluate(trainer, env: BatchedEnv, episodes: int, seeds: list[int]) -> list[dict[str, float]]:
    """Per seed: mean per-agent return over exactly `episodes` deterministic episodes."""
    S = len(seeds)
    n = env.num_envs // S
    quota = torch.full((S, n), episodes // n, device=env.device)
    quota[:, : episodes % n] += 1
    finished = torch.zeros(S, n, dtype=torch.long, device=env.device)
    stats = EpisodeStats({g.name: g.n_agents for g in env.info.groups}, n, env.device, S)
    ob = env.reset(_reset_seed(seeds))
    first = None  # every episode starts now
    while bool((finished < quota).any()):
        tr = env.step(trainer.act(ob, deterministic=True, first=first))
        first = tr.terminated | tr.truncated
        done = first.view(S, n)
        rewards = {k: v.view(S, n, *v.shape[1:]) for k, v in tr.rewards.items()}
        stats.record(rewards, done & (finished < quota), **per_seed_outcomes(tr, S))
        finished += done.long()
        ob = tr.next
    results = []
    for result in stats.take():
        result = result or {}
        result.pop("episodes", None)
        results.append(result)
    return results


def execute_batch(requests: list[RunRequest], progress: Progress | None = None) -> list[RunResult]:
    """Train one run, or several seeds of one spec as one batch, to completion.

    Never raises for a training failure: every result of the batch says FAILED with the
    reason (or KILLED on Ctrl-C / SIGTERM, after a checkpoint); the caller ends the runs.
    """
    from marlctl import tracking

    client = tracking.client_for(requests[0].tracking_uri)
    plan = requests[0].run
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if main_thread:
        # A scheduler's SIGTERM (SLURM, `kill`) stops a run the way Ctrl-C does.
        signal.signal(signal.SIGTERM, _raise_interrupt)
    results = [RunResult(r.run.index, r.run.seed, r.run_id, "RUNNING") for r in requests]
    sinks: list = []

    def finish(status: str, error: str, trace: str | None) -> None:
        for sink in sinks:
            _close_quietly(sink)
        for result in results:
            result.status, result.error, result.trace = status, error, trace

    try:
        spec = Spec.model_validate(requests[0].resolved)
        torch.set_num_threads(plan.threads)
        random.seed(plan.seed)
        np.random.seed(plan.seed % 2**32)
        torch.manual_seed(plan.seed)
        device = torch.device(plan.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {plan.device} requested but CUDA is not available")
        every = spec.tracking.flush_every_s
        for request in requests:
            sinks.append(tracking.MetricSink(client, request.run_id, every, request.logged_until))
        pruned_at = _train(spec, requests, client, sinks, device, results, progress)
        for sink in sinks:
            sink.close()
        sinks = []
        for result in results:
            result.status = "FINISHED" if pruned_at is None else "PRUNED"
            if pruned_at is not None:
                result.tags[PRUNED_TAG] = str(pruned_at)
            result.env_steps = result.env_steps or (pruned_at or 0)
    except KeyboardInterrupt:
        finish("KILLED", "interrupted by the user", None)
    except Exception as err:  # recorded, not raised: other runs go on
        finish("FAILED", f"{type(err).__name__}: {err}", traceback.format_exc())
    finally:
        if main_thread:  # the caller's handlers again (a run may be one of several)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return results


def _report_capture(client, requests, sinks, graph, env_steps: int) -> None:
    """Once, at the iteration that was captured: its capture time, or why it ran eagerly."""
    if graph.failed:
        for request in requests:
            client.set_tag(request.run_id, COMPILE_TAG, f"eager (capture failed: {graph.failed})")
        return
    for sink in sinks:
        sink.log({"perf/capture_s": graph.capture_seconds}, env_steps)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _close_quietly(sink) -> None:
    if sink is not None:
        try:
            sink.close()
        except RuntimeError:
            pass


def _train(
    spec: Spec,
    requests: list[RunRequest],
    client,
    sinks: list,
    device: torch.device,
    results: list[RunResult],
    progress: Progress | None,
) -> int | None:
    """Train to the budget; the env step where a sweep's pruner stopped it, or None."""
    plans, info = [r.run for r in requests], requests[0].env_info
    stop = requests[0].stop
    seeds = [p.seed for p in plans]
    hw, train = spec.hardware, spec.train
    plan = plans[0]
    learners = learner_info(info, spec)  # the groups `spec.groups` leaves to the algorithm
    trainer = build_trainer(spec, learners, hw.num_envs, device, plan.iterations, tuple(seeds))
    per_iter = trainer.steps_per_iteration  # per seed
    agents = info.n_agents

    env_steps, next_eval, next_ckpt, next_log = 0, train.eval_every, train.checkpoint_every, 0
    pool_states = None
    if requests[0].resume:
        states = [_load_checkpoint(client, r.run_id) for r in requests]
        if any(state is not None for state in states):
            steps = {None if st is None else int(st["env_steps"]) for st in states}
            if len(steps) != 1:
                raise RuntimeError(
                    "the seeds of this batch have checkpoints at different steps "
                    f"({sorted(map(str, steps))}); resume them with hardware.batch_seeds: false"
                )
            state = states[0]
            trainer.load_seed_states([st["trainer"] for st in states])
            if spec.pools and all("pool" in st for st in states):
                pool_states = [st["pool"] for st in states]
            env_steps = int(state["env_steps"])
            next_eval, next_ckpt = int(state["next_eval"]), int(state["next_checkpoint"])
            torch.set_rng_state(state["torch_rng"])
            for request in requests:
                client.set_tag(request.run_id, RESUMED_TAG, str(env_steps))
            if device.type == "cuda" and state.get("cuda_rng"):
                torch.cuda.set_rng_state_all(list(state["cuda_rng"]))
        next_log = env_steps

    S = len(seeds)
    env = make_env(spec, info, hw.num_envs, device, hw.env_workers, S)
    eval_env = make_env(spec, info, min(train.eval_episodes, EVAL_ENVS), device, 0, S)
    try:
        env = with_opponents(env, spec, info, client, seeds, deterministic=False)
        eval_env = with_opponents(eval_env, spec, info, client, seeds, deterministic=True)
        env = with_pool(env, spec, learners, seeds, device, client)
    except Exception:
        env.close()
        eval_env.close()
        raise
    pool = env if isinstance(env, WithPool) else None
    if pool is not None and pool_states is not None:
        try:
            pool.load_seed_states(pool_states)
        except (KeyError, TypeError, AttributeError, IndexError, RuntimeError) as err:
            env.close()
            eval_env.close()
            message = f"the pools' state in {CHECKPOINT} does not fit this run's pools: {err}"
            raise ValueError(message) from err
    # Separate seed streams for training (re-drawn on resume) and evaluation: env copies of
    # the two never replay the same episodes.
    eval_seeds = [eval_seed(seed) for seed in seeds]

    from marlctl import tracking

    mode = prepare_iterations(spec, trainer, env)
    hardware = tracking.hardware_name(str(device))
    for request in requests:
        client.set_tag(request.run_id, COMPILE_TAG, mode)
        client.set_tag(request.run_id, tracking.HARDWARE_TAG, hardware)

    def save() -> None:
        for index, request in enumerate(requests):
            _save_checkpoint(
                client, request.run_id, trainer, index, env_steps, next_eval, next_ckpt, pool
            )

    try:
        if train.eval_every and env_steps == 0:
            # The untrained policy's score is where every learning curve starts. Logged only:
            # a sweep's pruner is not shown a score no training has produced yet.
            untrained = _eval_metrics(trainer, eval_env, train.eval_episodes, eval_seeds)
            for index in range(S):
                sinks[index].log(untrained[index], 0)
        if pool is not None:
            pool.snapshot_due(trainer.policies, env_steps)  # the first: the policy as it starts
        ob = env.reset(_reset_seed([_derive_seed(seed, 0, env_steps) for seed in seeds]))
        trainer.restart_episodes()
        started, start_steps = time.perf_counter(), env_steps
        age = process_age()
        if age is not None and not requests[0].resume:
            for sink in sinks:  # how long the command took to reach its first env step
                sink.log({"perf/startup_s": age}, env_steps)
        last_return: list[float | None] = [None] * S
        watch = None
        if plan.max_threads > 1:  # threads_per_run: auto follows the cores left free
            from marlctl.cores import CoreWatch

            watch = CoreWatch(torch.get_num_threads(), plan.max_threads)
        # Losses add up on the device and are read once per `log_interval`: reading them each
        # iteration would make the device wait for the host at every (off-policy) env step.
        loss_sum, loss_iterations = None, 0
        log_tick, log_steps = time.perf_counter(), env_steps
        try:
            while env_steps < plan.total_env_steps:
                ob, losses = trainer.train_iteration(env, ob)
                env_steps += per_iter
                if watch is not None and (threads := watch.poll()) is not None:
                    torch.set_num_threads(threads)
                if pool is not None:
                    pool.snapshot_due(trainer.policies, env_steps)
                if trainer.graph is not None and trainer.graph.calls == 2:
                    _report_capture(client, requests, sinks, trainer.graph, env_steps)
                stacked = torch.stack([v.float() for v in losses.values()])
                loss_sum = stacked if loss_sum is None else loss_sum + stacked
                loss_iterations += 1
                log_now = env_steps >= next_log or env_steps >= plan.total_env_steps
                if log_now:
                    values = (loss_sum / loss_iterations).tolist()  # [loss][seed]
                    loss_sum, loss_iterations = None, 0
                    for index, seed in enumerate(seeds):
                        bad = [
                            k
                            for k, v in zip(losses, values, strict=True)
                            if not math.isfinite(v[index])
                        ]
                        if bad:
                            raise NonFiniteLoss(
                                f"non-finite loss by env step {env_steps} (seed {seed}): "
                                f"{', '.join(bad)}"
                            )
                    now = time.perf_counter()
                    rate = (env_steps - log_steps) / max(now - log_tick, 1e-9)
                    log_tick, log_steps = now, env_steps
                    episodes = trainer.stats.take()
                    pooled = pool.metrics() if pool is not None else [{}] * S
                    for index in range(S):
                        if episodes[index] is not None:
                            last_return[index] = episodes[index]["return_mean"]
                        metrics = {k: v[index] for k, v in zip(losses, values, strict=True)}
                        metrics["perf/env_steps_per_s"] = rate
                        metrics["perf/agent_steps_per_s"] = rate * agents
                        if watch is not None:
                            metrics["perf/threads"] = watch.threads
                        metrics.update(pooled[index])
                        if episodes[index] is not None:
                            metrics.update(
                                {
                                    f"train/{k}": v
                                    for k, v in episodes[index].items()
                                    if k != "episodes"
                                }
                            )
                        sinks[index].log(metrics, env_steps)
                    next_log = env_steps + train.log_interval
                if train.eval_every and env_steps >= next_eval and env_steps < plan.total_env_steps:
                    paused = time.perf_counter()
                    scores = _eval_metrics(trainer, eval_env, train.eval_episodes, eval_seeds)
                    for index in range(S):
                        sinks[index].log(scores[index], env_steps)
                        if progress is not None:
                            progress(
                                {
                                    "kind": "eval",
                                    "seed": seeds[index],
                                    "step": env_steps,
                                    "metrics": scores[index],
                                }
                            )
                    next_eval = (env_steps // train.eval_every + 1) * train.eval_every
                    log_tick += time.perf_counter() - paused  # throughput counts training only
                if train.checkpoint_every and env_steps >= next_ckpt:
                    next_ckpt = (env_steps // train.checkpoint_every + 1) * train.checkpoint_every
                    paused = time.perf_counter()
                    for sink in sinks:
                        sink.flush()  # a checkpoint never gets ahead of the metrics before it
                    save()
                    log_tick += time.perf_counter() - paused
                if progress is not None:
                    for index, p in enumerate(plans):
                        progress(
                            {
                                "index": p.index,
                                "seed": p.seed,
                                "step": env_steps,
                                "total": p.total_env_steps,
                                "return": last_return[index],
                            }
                        )
                if stop is not None and stop.is_set():
                    return env_steps
        except KeyboardInterrupt:
            # A second Ctrl-C or SIGTERM must not cut the checkpoint short.
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for sink in sinks:
                sink.flush()
            save()
            raise
        elapsed = time.perf_counter() - started
        finals = _eval_metrics(trainer, eval_env, train.eval_episodes, eval_seeds)
        rate = (env_steps - start_steps) / max(elapsed, 1e-9)
        for index, result in enumerate(results):
            final = finals[index]
            final["perf/env_steps_per_s_mean"] = rate
            sinks[index].log(final, env_steps)
            result.steps_per_s = rate
            result.final_return = final.get("eval/return_mean")
            result.env_steps = env_steps
        save()
        for index, request in enumerate(requests):
            _save_policy(client, request.run_id, trainer, index)
    finally:
        env.close()
        eval_env.close()


def process_age() -> float | None:
    """Seconds since this process started (Linux's /proc), or None where it cannot be read.
    In a run's own process (`hardware.parallel_runs` > 1) it counts from that process."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


def _derive_seed(*entropy: int) -> int:
    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0] % 2**31)


def eval_seed(seed: int) -> int:
    """The seed of a run's evaluation episodes; `marlctl eval` uses it to repeat them."""
    return _derive_seed(seed, 1)


def _eval_metrics(trainer, env: BatchedEnv, episodes: int, seeds: list[int]) -> list[dict]:
    return [
        {f"eval/{k}": v for k, v in result.items()}
        for result in evaluate(trainer, env, episodes, seeds)
    ]


def _save_checkpoint(
    client,
    run_id: str,
    trainer,
    index: int,
    env_steps: int,
    next_eval: int,
    next_ckpt: int,
    pool=None,
) -> None:
    state = {
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "trainer": trainer.seed_state(index),
        "env_steps": env_steps,
        "next_eval": next_eval,
        "next_checkpoint": next_ckpt,
        "torch_rng": torch.get_rng_state(),
    }
    if pool is not None:
        state["pool"] = pool.seed_state(index)  # the snapshots, their win rates, the schedule
    _log_torch(client, run_id, state, CHECKPOINT)


def _save_policy(client, run_id: str, trainer, index: int) -> None:
    _log_torch(client, run_id, {"policies": trainer.seed_state(index)["policies"]}, POLICY)


def _log_torch(client, run_id: str, state: dict, artifact: str) -> None:
    folder, name = artifact.rsplit("/", 1)
    with staging() as tmp:
        path = tmp / name
        torch.save(state, path)
        client.log_artifact(run_id, str(path), artifact_path=folder)


def _load_checkpoint(client, run_id: str) -> dict | None:
    folder = CHECKPOINT.rsplit("/", 1)[0]
    if not any(f.path == CHECKPOINT for f in client.list_artifacts(run_id, folder)):
        return None
    with staging() as tmp:
        path = client.download_artifacts(run_id, CHECKPOINT, str(tmp))
        return load_tensors(path, CHECKPOINT)
