"""Train one seed (or a batch of seeds): build env and algorithm, then run the training
loop, whose parts (`marlctl.train.lifecycle`) log metrics, evaluate, checkpoint, report
progress and prune; every result goes into the seed's MLflow run.

The MLflow run's lifecycle is not this module's: `launch` creates the run, and ends it with
the status of the `RunResult` returned here. A training that raises gives FAILED with the
reason and traceback; Ctrl-C checkpoints and gives KILLED; a killed process leaves the run
RUNNING with its last checkpoint, which `run --resume` continues.
"""

from __future__ import annotations

import random
import signal
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from marlctl import processes
from marlctl.envs.batch import BatchedEnv
from marlctl.envs.info import EnvInfo
from marlctl.errors import one_line
from marlctl.plan import RunPlan, learner_info
from marlctl.spec.models import Spec
from marlctl.stored import CHECKPOINT, PRUNED_TAG
from marlctl.train.build import batch_rows, build_trainer, set_float32_precision
from marlctl.train.compact import compact, compact_blocker
from marlctl.train.lifecycle import (
    COMPILE_TAG,
    Part,
    Progress,
    RowEnd,
    RunState,
    load_checkpoint,
    parts_for,
    process_age,
)
from marlctl.train.opponents import with_opponents
from marlctl.train.pool import WithPool, with_pool
from marlctl.train.population import Population, Schedule
from marlctl.train.scores import EVAL_ENVS, derive_seed, eval_seed, evaluate, reset_seed

# Their paths before the trainer's parts and scores had modules of their own.
__all__ = [
    "COMPILE_TAG",
    "EVAL_ENVS",
    "build_trainer",
    "eval_seed",
    "evaluate",
    "process_age",
]

RESUMED_TAG = "marlctl.resumed_from_step"
# The runs trained as one batch with this one, itself included: its seeds, or the seeds of
# several sweep trials.
ROWS_TAG = "marlctl.batch_rows"


@dataclass
class RunRequest:
    # Validated once, where the spec was loaded; it pickles into a run's process. The
    # requests of one batch share it, or differ only in hyperparameters a row may have of
    # its own (`marlctl.train.build.batch_rows`): several sweep trials' seeds.
    spec: Spec
    env_info: EnvInfo
    run: RunPlan
    tracking_uri: str | None
    run_id: str
    resume: bool = False
    # Resumed: the last env step whose metrics the run holds (none are logged twice).
    logged_until: int = -1
    # The run this one's seeds share (its experiment's, or its sweep trial's): a seed that
    # fails ends the others of its trial; the rows of a population-based training's member.
    trial: str | None = None
    # A member of a population (`sweep.sampler: pbt`), trained by its sweep's worker: its
    # batch exploits and explores (`marlctl.train.population`).
    population: bool = False
    # Set by a sweep's pruner: the run stops after its current iteration, without a final
    # evaluation, and is recorded FINISHED with `marlctl.pruned_at_step`; the batch's other
    # rows train on.
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


def execute_batch(requests: list[RunRequest], progress: Progress | None = None) -> list[RunResult]:
    """Train one run, or several as one batch (seeds of one spec, or of several specs that
    differ only in per-row hyperparameters), to completion.

    Never raises for a training failure: every result of the batch says FAILED with the
    reason (or KILLED on Ctrl-C / SIGTERM, after a checkpoint); a row whose own loss turns
    non-finite fails alone, a pruned row ends alone. The caller ends the runs.
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
    sinks: list = []  # a row's is None once it has ended
    ended: dict[int, RowEnd] = {}  # the rows that ended before the budget, as they did

    def finish(status: str, error: str, trace: str | None) -> None:
        for sink in sinks:
            _close_quietly(sink)
        for index, result in enumerate(results):
            if index in ended:  # pruned or failed before: it stays so
                _ended_as(result, ended[index])
            else:
                result.status, result.error, result.trace = status, error, trace

    try:
        spec = requests[0].spec
        torch.set_num_threads(plan.threads)
        set_float32_precision(spec)
        random.seed(plan.seed)
        np.random.seed(plan.seed % 2**32)
        torch.manual_seed(plan.seed)
        device = torch.device(plan.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {plan.device} requested but CUDA is not available")
        every = spec.tracking.flush_every_s
        trainer_process = processes.identity()
        for request in requests:
            client.set_tag(request.run_id, processes.PROCESS_TAG, trainer_process)
            sinks.append(tracking.MetricSink(client, request.run_id, every, request.logged_until))
        _train(spec, requests, client, sinks, device, results, progress, ended)
        for sink in sinks:
            if sink is not None:
                sink.close()
        sinks = []
        for index, result in enumerate(results):
            _ended_as(result, ended.get(index))
    except KeyboardInterrupt:
        finish("KILLED", "interrupted by the user", None)
    except Exception as err:  # recorded, not raised: other runs go on
        finish("FAILED", f"{type(err).__name__}: {err}", traceback.format_exc())
    finally:
        if main_thread:  # the caller's handlers again (a run may be one of several)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return results


def _ended_as(result: RunResult, end: RowEnd | None) -> None:
    """`result` as its row ended: at the budget, or early (pruned, failed)."""
    if end is None:
        result.status = "FINISHED"
        return
    result.status, result.env_steps = end.status, end.step
    if end.status == "PRUNED":
        result.tags[PRUNED_TAG] = str(end.step)
    else:
        result.error = result.trace = end.error


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _close_quietly(sink) -> None:
    if sink is not None:
        try:
            sink.close()
        except RuntimeError:
            pass


@dataclass
class _Resumed:
    """Where a resumed batch stands: its step, its schedules and its pools' state."""

    env_steps: int = 0
    next_eval: int = 0
    next_checkpoint: int = 0
    pool_states: list | None = None
    trained_s: float | None = 0.0  # None: a checkpoint that does not say


def _train(
    spec: Spec,
    requests: list[RunRequest],
    client,
    sinks: list,
    device: torch.device,
    results: list[RunResult],
    progress: Progress | None,
    ended: dict[int, RowEnd],
) -> None:
    """Train to the budget; the rows that end before it go into `ended`, by index."""
    plan, info = requests[0].run, requests[0].env_info
    seeds = [r.run.seed for r in requests]
    pbt = _population(spec) if requests[0].population else ()
    scheduled = tuple(k.split(".", 1)[1] for k in spec.train.schedule if k.startswith("algo."))
    rows = batch_rows([r.spec for r in requests], always=pbt + scheduled)
    learners = learner_info(info, spec)  # the groups `spec.groups` leaves to the algorithm
    num_envs = spec.hardware.num_envs
    trainer = build_trainer(spec, learners, num_envs, device, plan.iterations, seeds, rows)
    dataset = {}  # an offline algorithm's dataset, read whole and checked, and its return
    if spec.data is not None:
        from marlctl.data.reader import load_named
        from marlctl.tracking import DATA_RETURN

        manifest, transitions = load_named(spec.data, client)
        trainer.load_dataset(transitions)
        dataset = {DATA_RETURN: sum(manifest.returns) / len(manifest.returns)}
    start = _Resumed(0, spec.train.eval_every, spec.train.checkpoint_every)
    if requests[0].resume:
        start = _resume(spec, requests, client, trainer, device) or start
    record = spec.train.record is not None  # the datasets hold the global state
    env, eval_env = _envs(spec, requests, client, learners, device, trainer.reads_state or record)
    recorder = None
    try:
        pool = _load_pools(env, start.pool_states)
        if record:
            from marlctl.train.recording import TrainingRecorder

            recorder = TrainingRecorder(spec, requests, env, learners)
            env = recorder.env
        _tag_iterations(spec, requests, client, trainer, env, device)
        run = RunState(spec, requests, results, client, sinks, trainer, env, eval_env, pool)
        run.ended = ended
        run.progress, run.last_return = progress, [None] * len(seeds)
        run.env_steps = start.env_steps
        run.next_eval, run.next_checkpoint = start.next_eval, start.next_checkpoint
        run.clock.before = start.trained_s
        run.compacts = compact_blocker(run) is None
        for sink in sinks if dataset else ():  # the behaviour's score, beside the learner's
            sink.log(dataset, run.env_steps)
        parts = parts_for(run)
        if spec.train.schedule:
            parts.append(Schedule(run))
        if pbt:
            parts.append(Population(run))
        _loop(run, parts)
        if recorder is not None:
            recorder.close()
    except BaseException:
        if recorder is not None:  # a dataset is written whole or not at all
            recorder.abort()
        raise
    finally:
        env.close()
        eval_env.close()


def _population(spec: Spec) -> tuple[str, ...]:
    """The algorithm fields a population-based training searches (every row has its own,
    which exploit and explore change), or none."""
    if spec.sweep is None or spec.sweep.sampler != "pbt":
        return ()
    return tuple(key.split(".", 1)[1] for key in spec.sweep.space)


def _loop(run: RunState, parts: list[Part]) -> None:
    """The training iterations, and the parts' hooks around them."""
    for part in parts:
        part.on_start(run)
    entropy = [derive_seed(seed, 0, run.env_steps) for seed in run.seeds]
    ob = run.env.reset(reset_seed(entropy))
    run.trainer.restart_episodes()
    run.clock.start(run.env_steps)
    for part in parts:
        part.on_training_start(run)
    per_iteration = run.trainer.steps_per_iteration  # per seed
    try:
        while run.env_steps < run.total_env_steps:
            ob, losses = run.trainer.train_iteration(run.env, ob)
            run.env_steps += per_iteration
            for part in parts:
                part.on_iteration(run, losses)
            if not run.live:
                return
            if run.compacts and len(run.live) < len(run.requests):
                ob = compact(run, parts, ob)  # the rows that ended leave the batch
    except KeyboardInterrupt:
        for part in parts:
            part.on_interrupt(run)
        raise
    for part in parts:
        part.on_end(run)


def _resume(spec: Spec, requests, client, trainer, device) -> _Resumed | None:
    """Load the batch's checkpoints into `trainer` and the random streams; None where no
    seed has one yet."""
    states = [load_checkpoint(client, r.run_id) for r in requests]
    if all(state is None for state in states):
        return None
    steps = {None if st is None else int(st["env_steps"]) for st in states}
    if len(steps) != 1:
        raise RuntimeError(
            "the seeds of this batch have checkpoints at different steps "
            f"({sorted(map(str, steps))}); resume them with hardware.batch_seeds: false"
        )
    state = states[0]
    try:
        trainer.load_seed_states([st["trainer"] for st in states])
    except (RuntimeError, KeyError, ValueError) as err:
        raise RuntimeError(
            "its checkpoint does not fit this run's networks, which have changed since it "
            f"was written (another marlctl version?): {one_line(str(err))}"
        ) from None
    pool_states = None
    if spec.pools and all("pool" in st for st in states):
        pool_states = [st["pool"] for st in states]
    env_steps = int(state["env_steps"])
    torch.set_rng_state(state["torch_rng"])
    for request in requests:
        client.set_tag(request.run_id, RESUMED_TAG, str(env_steps))
    if device.type == "cuda" and state.get("cuda_rng"):
        torch.cuda.set_rng_state_all(list(state["cuda_rng"]))
    next_eval, next_checkpoint = int(state["next_eval"]), int(state["next_checkpoint"])
    trained = state.get("trained_s")
    return _Resumed(env_steps, next_eval, next_checkpoint, pool_states,
                    None if trained is None else float(trained))  # fmt: skip


def _envs(
    spec: Spec, requests, client, learners: EnvInfo, device, state: bool = True
) -> tuple[BatchedEnv, Any]:
    """The training env (with its opponents and pools) and the evaluation env; `state`: the
    trainer reads the global state (training's env computes it; evaluation reads none)."""
    info, seeds = requests[0].env_info, [r.run.seed for r in requests]
    hw, S = spec.hardware, len(seeds)
    env = make_env(spec, info, hw.num_envs, device, hw.env_workers, S, state)
    eval_env = None
    try:
        env = with_opponents(env, spec, info, client, seeds, deterministic=False)
        eval_env = make_eval_env(spec, info, client, seeds, device)
        env = with_pool(env, spec, learners, seeds, device, client)
    except Exception:
        env.close()
        if eval_env is not None:
            eval_env.close()
        raise
    return env, eval_env


def make_eval_env(spec: Spec, info: EnvInfo, client, seeds: list[int], device) -> Any:
    """The evaluation env of a batch of `seeds`: `train.eval_episodes` envs per seed, at most
    `EVAL_ENVS`, with the spec's opponents acting deterministically (`client` reads frozen
    ones' runs; None where the spec has no opponents)."""
    episodes = min(spec.train.eval_episodes, EVAL_ENVS)
    env = make_env(spec, info, episodes, device, 0, len(seeds), state=False)
    try:
        return with_opponents(env, spec, info, client, seeds, deterministic=True)
    except Exception:
        env.close()
        raise


def _load_pools(env, pool_states: list | None) -> WithPool | None:
    """The pools' wrapper of `env`, with a resumed run's pools' state loaded into it."""
    pool = env if isinstance(env, WithPool) else None
    if pool is not None and pool_states is not None:
        try:
            pool.load_seed_states(pool_states)
        except (KeyError, TypeError, AttributeError, IndexError, RuntimeError) as err:
            message = f"the pools' state in {CHECKPOINT} does not fit this run's pools: {err}"
            raise ValueError(message) from err
    return pool


def _tag_iterations(spec: Spec, requests, client, trainer, env, device) -> None:
    """Prepare the iterations (compile, capture) and tag how they run and on what."""
    from marlctl import tracking

    mode = prepare_iterations(spec, trainer, env)
    hardware = tracking.hardware_name(str(device))
    for request in requests:
        client.set_tag(request.run_id, COMPILE_TAG, mode)
        client.set_tag(request.run_id, tracking.HARDWARE_TAG, hardware)
        client.set_tag(request.run_id, ROWS_TAG, str(len(requests)))


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
    state: bool = True,
) -> BatchedEnv:
    """`num_envs` envs for each of `seeds` seeds, seed-major, on the spec's backend (native
    or vmas for several); a native env must present the same spaces as its PettingZoo
    original (`info`). Without `state` a PettingZoo env leaves the global state zeros."""
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
    from marlctl.envs.registry import lookup

    wins_for = None
    if lookup(spec.env.id).teams_by_name:  # armies: the first learning one's wins
        learners = learner_info(info, spec).groups
        wins_for = learners[0].name if learners else None
    return PettingZooEnv(
        spec.env.id, params, info, num_envs, device, workers,
        reward_weights=spec.env.reward_weights, state=state, wins_for=wins_for,
    )  # fmt: skip
