"""Run one seed: build env and algorithm, train, evaluate, checkpoint, log to its MLflow run.

A run that raises is marked FAILED with the reason; Ctrl-C checkpoints and marks it KILLED;
a killed process leaves it RUNNING with its last checkpoint, which `run --resume` continues.
"""

from __future__ import annotations

import importlib
import math
import random
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marlctl.algos import registered_algos
from marlctl.envs.batch import BatchedEnv
from marlctl.envs.registry import EnvInfo
from marlctl.plan import RunPlan
from marlctl.spec.models import Spec
from marlctl.train.core import EpisodeStats

CHECKPOINT = "checkpoints/latest.pt"
POLICY = "policy/final.pt"
EVAL_ENVS = 32
LOGGED_EVERY_ITERATION = ("loss/policy", "eval/return_mean")


@dataclass
class RunRequest:
    resolved: dict[str, Any]
    env_info: EnvInfo
    run: RunPlan
    tracking_uri: str | None
    run_id: str
    resume: bool = False


@dataclass
class RunResult:
    index: int
    seed: int
    run_id: str
    status: str  # FINISHED | FAILED | KILLED
    env_steps: int = 0
    final_return: float | None = None
    steps_per_s: float | None = None
    error: str | None = None


Progress = Callable[[dict[str, Any]], None]


class NonFiniteLoss(RuntimeError):
    pass


def build_trainer(
    spec: Spec, info: EnvInfo, num_envs: int, device: torch.device, total_iterations: int
):
    algo = registered_algos()[spec.algo.name]
    module, _, name = algo.trainer.partition(":")
    cls = getattr(importlib.import_module(module), name)
    trainer = cls(
        spec.algo,
        spec.model,
        info,
        num_envs,
        device,
        total_iterations,
        centralised=algo.centralised_critic,
    )
    if spec.hardware.compile:
        trainer.compile()
    return trainer


def make_env(
    spec: Spec, info: EnvInfo, num_envs: int, device: torch.device, workers: int = 0
) -> BatchedEnv:
    return open_env(
        spec.env.backend, spec.env.id, dict(spec.env.params), info, num_envs, device, workers
    )


def open_env(
    backend: str,
    env_id: str,
    params: dict[str, Any],
    info: EnvInfo,
    num_envs: int,
    device: torch.device,
    workers: int = 0,
) -> BatchedEnv:
    """A batched env of `backend`; a native one must present the same spaces as `info`."""
    if backend == "native":
        from marlctl.envs.native import native_class

        env = native_class(info.id)(params, num_envs, device)
        if env.info.groups != info.groups or env.info.state_dim != info.state_dim:
            raise RuntimeError(f"native '{info.id}' does not match its PettingZoo original")
        return env
    from marlctl.envs.pettingzoo import PettingZooEnv

    return PettingZooEnv(env_id, params, info, num_envs, device, workers)


@torch.no_grad()
def evaluate(trainer, env: BatchedEnv, episodes: int, seed: int) -> dict[str, float]:
    """Mean per-agent return over exactly `episodes` deterministic episodes."""
    n = env.num_envs
    quota = torch.full((n,), episodes // n, device=env.device)
    quota[: episodes % n] += 1
    finished = torch.zeros(n, dtype=torch.long, device=env.device)
    stats = EpisodeStats({g.name: g.n_agents for g in env.info.groups}, n, env.device)
    ob = env.reset(seed)
    while bool((finished < quota).any()):
        tr = env.step(trainer.act(ob, deterministic=True))
        done = tr.terminated | tr.truncated
        stats.record(tr.rewards, done & (finished < quota))
        finished += done.long()
        ob = tr.next
    result = stats.take() or {}
    result.pop("episodes", None)
    return result


def execute(request: RunRequest, progress: Progress | None = None) -> RunResult:
    """Train one run to completion; never raises for a training failure (returns FAILED)."""
    from marlctl import tracking

    client = tracking.client_for(request.tracking_uri)
    plan = request.run
    if threading.current_thread() is threading.main_thread():
        # A scheduler's SIGTERM (SLURM, `kill`) stops a run the way Ctrl-C does.
        signal.signal(signal.SIGTERM, _raise_interrupt)
    result = RunResult(plan.index, plan.seed, request.run_id, "RUNNING")
    sink = None
    try:
        skip_until = -1
        if request.resume:
            client.update_run(request.run_id, status="RUNNING")
            if tracking.ERROR_TAG in client.get_run(request.run_id).data.tags:
                client.delete_tag(request.run_id, tracking.ERROR_TAG)
            skip_until = tracking.last_logged_step(client, request.run_id, LOGGED_EVERY_ITERATION)
        spec = Spec.model_validate(request.resolved)
        torch.set_num_threads(plan.threads)
        random.seed(plan.seed)
        np.random.seed(plan.seed % 2**32)
        torch.manual_seed(plan.seed)
        device = torch.device(plan.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {plan.device} requested but CUDA is not available")
        sink = tracking.MetricSink(client, request.run_id, spec.tracking.flush_every_s, skip_until)
        _train(spec, request, client, sink, device, result, progress)
        sink.close()
        sink = None
        client.set_terminated(request.run_id, "FINISHED")
        result.status = "FINISHED"
    except KeyboardInterrupt:
        result.status = "KILLED"
        result.error = "interrupted"
        _close_quietly(sink)
        client.set_tag(request.run_id, tracking.ERROR_TAG, "interrupted by the user")
        client.set_terminated(request.run_id, "KILLED")
    except Exception as err:  # recorded, not raised: other seeds go on
        result.status = "FAILED"
        result.error = f"{type(err).__name__}: {err}"
        _close_quietly(sink)
        client.set_tag(request.run_id, tracking.ERROR_TAG, result.error[:5000])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "error.txt"
            path.write_text(traceback.format_exc())
            client.log_artifact(request.run_id, str(path))
        client.set_terminated(request.run_id, "FAILED")
    return result


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
    request: RunRequest,
    client,
    sink,
    device: torch.device,
    result: RunResult,
    progress: Progress | None,
) -> None:
    plan, info = request.run, request.env_info
    hw, train = spec.hardware, spec.train
    iterations = plan.iterations
    trainer = build_trainer(spec, info, hw.num_envs, device, iterations)
    per_iter = trainer.steps_per_iteration
    agents = info.n_agents

    env_steps, next_eval, next_ckpt, next_log = 0, train.eval_every, train.checkpoint_every, 0
    if request.resume:
        state = _load_checkpoint(client, request.run_id)
        if state is not None:
            trainer.load_state_dict(state["trainer"])
            env_steps = int(state["env_steps"])
            next_eval, next_ckpt = int(state["next_eval"]), int(state["next_checkpoint"])
            torch.set_rng_state(state["torch_rng"])
            client.set_tag(request.run_id, "marlctl.resumed_from_step", str(env_steps))
            if device.type == "cuda" and "cuda_rng" in state:
                torch.cuda.set_rng_state_all(list(state["cuda_rng"]))
        next_log = env_steps

    env = make_env(spec, info, hw.num_envs, device, hw.env_workers)
    eval_env = make_env(spec, info, min(train.eval_episodes, EVAL_ENVS), device)
    # Separate seed streams for training (re-drawn on resume) and evaluation: env copies of
    # the two never replay the same episodes.
    eval_seed = _derive_seed(plan.seed, 1)
    try:
        ob = env.reset(_derive_seed(plan.seed, 0, env_steps))
        trainer.stats.reset_running()
        started, start_steps = time.perf_counter(), env_steps
        last_return = None
        try:
            while env_steps < plan.total_env_steps:
                tick = time.perf_counter()
                ob, losses = trainer.train_iteration(env, ob)
                env_steps += per_iter
                values = torch.stack(list(losses.values())).tolist()
                if not all(math.isfinite(v) for v in values):
                    bad = [k for k, v in zip(losses, values, strict=True) if not math.isfinite(v)]
                    raise NonFiniteLoss(
                        f"non-finite loss at env step {env_steps}: {', '.join(bad)}"
                    )
                rate = per_iter / max(time.perf_counter() - tick, 1e-9)
                episodes = trainer.stats.take()
                if episodes is not None:
                    last_return = episodes["return_mean"]
                if env_steps >= next_log:
                    metrics = dict(zip(losses, values, strict=True))
                    metrics["perf/env_steps_per_s"] = rate
                    metrics["perf/agent_steps_per_s"] = rate * agents
                    if episodes is not None:
                        metrics.update(
                            {f"train/{k}": v for k, v in episodes.items() if k != "episodes"}
                        )
                    sink.log(metrics, env_steps)
                    next_log = env_steps + train.log_every
                if train.eval_every and env_steps >= next_eval and env_steps < plan.total_env_steps:
                    sink.log(
                        _eval_metrics(trainer, eval_env, train.eval_episodes, eval_seed), env_steps
                    )
                    next_eval = (env_steps // train.eval_every + 1) * train.eval_every
                if train.checkpoint_every and env_steps >= next_ckpt:
                    next_ckpt = (env_steps // train.checkpoint_every + 1) * train.checkpoint_every
                    sink.flush()  # a checkpoint never gets ahead of the metrics before it
                    _save_checkpoint(
                        client, request.run_id, trainer, env_steps, next_eval, next_ckpt
                    )
                if progress is not None:
                    progress(
                        {
                            "index": plan.index,
                            "seed": plan.seed,
                            "step": env_steps,
                            "total": plan.total_env_steps,
                            "return": last_return,
                        }
                    )
        except KeyboardInterrupt:
            # A second Ctrl-C or SIGTERM must not cut the checkpoint short.
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            sink.flush()
            _save_checkpoint(client, request.run_id, trainer, env_steps, next_eval, next_ckpt)
            raise
        elapsed = time.perf_counter() - started
        final = _eval_metrics(trainer, eval_env, train.eval_episodes, eval_seed)
        result.steps_per_s = (env_steps - start_steps) / max(elapsed, 1e-9)
        final["perf/env_steps_per_s_mean"] = result.steps_per_s
        sink.log(final, env_steps)
        result.final_return = final.get("eval/return_mean")
        result.env_steps = env_steps
        _save_checkpoint(client, request.run_id, trainer, env_steps, next_eval, next_ckpt)
        _save_policy(client, request.run_id, trainer)
    finally:
        env.close()
        eval_env.close()


def _derive_seed(*entropy: int) -> int:
    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0] % 2**31)


def _eval_metrics(trainer, env: BatchedEnv, episodes: int, seed: int) -> dict[str, float]:
    return {f"eval/{k}": v for k, v in evaluate(trainer, env, episodes, seed).items()}


def _save_checkpoint(
    client, run_id: str, trainer, env_steps: int, next_eval: int, next_ckpt: int
) -> None:
    state = {
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "trainer": trainer.state_dict(),
        "env_steps": env_steps,
        "next_eval": next_eval,
        "next_checkpoint": next_ckpt,
        "torch_rng": torch.get_rng_state(),
    }
    _log_torch(client, run_id, state, CHECKPOINT)


def _save_policy(client, run_id: str, trainer) -> None:
    _log_torch(client, run_id, {"policies": trainer.policies.state_dict()}, POLICY)


def _log_torch(client, run_id: str, state: dict, artifact: str) -> None:
    folder, name = artifact.rsplit("/", 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        torch.save(state, path)
        client.log_artifact(run_id, str(path), artifact_path=folder)


def _load_checkpoint(client, run_id: str) -> dict | None:
    folder = CHECKPOINT.rsplit("/", 1)[0]
    if not any(f.path == CHECKPOINT for f in client.list_artifacts(run_id, folder)):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, CHECKPOINT, tmp)
        return torch.load(path, weights_only=True, map_location="cpu")
