"""The parts of a training run that act around its iterations, like Stable-Baselines3's
callbacks: metric logging, evaluation, checkpoints, progress events and pruning.

`marlctl.train.runner` owns the loop and calls every part's hooks in order: `on_start`
before the first episodes reset, `on_training_start` once they have, `on_iteration` after
each training iteration, `on_interrupt` on Ctrl-C / SIGTERM and `on_end` when the budget is
spent. Every part reads and updates the one `RunState` of the run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from marlctl import tracking
from marlctl.algos import registered_algos
from marlctl.atomic import staging
from marlctl.spec.models import Spec
from marlctl.stored import CHECKPOINT, CHECKPOINT_STEP_TAG, POLICY, load_tensors
from marlctl.train.scores import eval_metrics, eval_seed

Progress = Callable[[dict[str, Any]], None]
COMPILE_TAG = "marlctl.compile"  # how training iterations ran: eager, CUDA graph, ...


class Clock:
    """Training time: started once the first episodes reset; evaluations and checkpoints
    are `paused()` out of the throughput between two logs, not out of the run's mean.
    `before`: the seconds earlier processes trained the run (resumed), None where unknown."""

    def __init__(self) -> None:
        self.started = self.tick = time.perf_counter()
        self.start_steps, self.elapsed = 0, 0.0
        self.before: float | None = 0.0

    def trained_s(self) -> float | None:
        """Seconds of training, evaluations and checkpoints included, over every process
        that trained the run: the time it lay stopped between them is not counted."""
        return None if self.before is None else self.before + time.perf_counter() - self.started

    def start(self, env_steps: int) -> None:
        self.started = self.tick = time.perf_counter()
        self.start_steps = env_steps

    def mean_rate(self, env_steps: int) -> float:
        """Env steps per second since `start`, evaluations and checkpoints included."""
        self.elapsed = time.perf_counter() - self.started
        return (env_steps - self.start_steps) / max(self.elapsed, 1e-9)

    @contextmanager
    def paused(self) -> Iterator[None]:
        paused = time.perf_counter()
        try:
            yield
        finally:
            self.tick += time.perf_counter() - paused


@dataclass(frozen=True)
class RowEnd:
    """A row of the batch that stopped before the budget, while the others train on: PRUNED
    by its sweep's pruner at `step`, or FAILED with `error` (a non-finite loss of its own)."""

    status: str
    step: int
    error: str | None = None


@dataclass
class RunState:
    """What the parts of a run share: its spec, runs, env, trainer and where training is.

    Each request is a row of the batch: a seed, or a seed of one of several sweep trials
    whose hyperparameters differ. A row that ends early (`ended`) logs, evaluates,
    checkpoints and reports nothing more; it leaves the batch after the iteration
    (`marlctl.train.compact`) where the trainer and envs allow it (`compacts`), and goes on
    computing with the others where they do not."""

    spec: Spec
    requests: list  # the `RunRequest`s of the batch, one per seed
    results: list  # their `RunResult`s, filled in as the run ends
    client: Any
    sinks: list  # a `tracking.MetricSink` per seed
    trainer: Any
    env: Any
    eval_env: Any
    pool: Any  # the pools' wrapper of `env` (`marlctl.train.pool.WithPool`), or None
    progress: Progress | None = None
    env_steps: int = 0  # per seed
    next_eval: int = 0
    next_checkpoint: int = 0
    clock: Clock = field(default_factory=Clock)
    threads: int | None = None  # as `threads_per_run: auto` last set them
    last_return: list[float | None] = field(default_factory=list)
    # The rows that ended, by their index in the batch as it started (`origin`).
    ended: dict[int, RowEnd] = field(default_factory=dict)
    scores: list[dict] = field(default_factory=list)  # each row's last evaluation
    scored_at: int = -1  # the env step of that evaluation
    compacts: bool = False  # ended rows leave the batch
    origin: list[int] = field(default_factory=list)  # each row's index as the batch started

    def __post_init__(self) -> None:
        self.origin = self.origin or list(range(len(self.requests)))

    @property
    def live(self) -> list[int]:
        """The rows still training, in order."""
        return [i for i, first in enumerate(self.origin) if first not in self.ended]

    def has_ended(self, index: int) -> bool:
        return self.origin[index] in self.ended

    def end_row(self, index: int, end: RowEnd) -> None:
        """Row `index` stops here: what it logged so far goes to its run, nothing more."""
        self.ended[self.origin[index]] = end
        sink, self.sinks[index] = self.sinks[index], None
        try:
            sink.close()
        except RuntimeError:  # its metrics could not be logged; the row has ended anyway
            pass

    def fail_trial(self, index: int, error: str) -> None:
        """Row `index` failed: it ends, and so do the live rows of its trial (a trial with a
        failed seed has failed), each with the reason."""
        self.end_row(index, RowEnd("FAILED", self.env_steps, error))
        trial = self.requests[index].trial
        for other in self.live:
            if self.requests[other].trial == trial:
                seed = self.seeds[index]
                self.end_row(other, RowEnd("FAILED", self.env_steps, f"seed {seed}: {error}"))

    def keep(self, keep: list[int]) -> None:
        """Only rows `keep` stay in the batch (`marlctl.train.compact`); the others' results
        stay with the batch's owner, as they ended."""
        self.requests = [self.requests[i] for i in keep]
        self.results = [self.results[i] for i in keep]
        self.sinks[:] = [self.sinks[i] for i in keep]  # in place: its owner closes them
        self.origin = [self.origin[i] for i in keep]
        if self.last_return:
            self.last_return = [self.last_return[i] for i in keep]
        if self.scores:
            self.scores = [self.scores[i] for i in keep]

    @property
    def seeds(self) -> list[int]:
        return [r.run.seed for r in self.requests]

    @property
    def eval_seeds(self) -> list[int]:
        # Separate seed streams for training (re-drawn on resume) and evaluation: env
        # copies of the two never replay the same episodes.
        return [eval_seed(seed) for seed in self.seeds]

    @property
    def total_env_steps(self) -> int:
        return self.requests[0].run.total_env_steps

    def flush(self) -> None:
        for index in self.live:
            self.sinks[index].flush()


class Part:
    """A hook does nothing unless a part overrides it."""

    def on_start(self, run: RunState) -> None: ...

    def on_training_start(self, run: RunState) -> None: ...

    def on_iteration(self, run: RunState, losses: dict[str, torch.Tensor]) -> None: ...

    def on_interrupt(self, run: RunState) -> None: ...

    def on_end(self, run: RunState) -> None: ...

    def on_compact(self, run: RunState, keep: list[int]) -> None:
        """Only rows `keep` of the batch go on (`marlctl.train.compact`)."""


class ThreadWatch(Part):
    """`threads_per_run: auto` follows the cores that other work leaves free."""

    def __init__(self, max_threads: int):
        self.max_threads = max_threads

    def on_training_start(self, run: RunState) -> None:
        from marlctl.cores import CoreWatch

        self.watch = CoreWatch(torch.get_num_threads(), self.max_threads)

    def on_iteration(self, run: RunState, losses: dict[str, torch.Tensor]) -> None:
        if (threads := self.watch.poll()) is not None:
            torch.set_num_threads(threads)
        run.threads = self.watch.threads


class PoolSnapshots(Part):
    """The opponent pools' snapshots of the learning policy, on their schedule."""

    def on_start(self, run: RunState) -> None:
        run.pool.snapshot_due(run.trainer.policies, run.env_steps)  # the policy as it starts

    def on_iteration(self, run: RunState, losses: dict[str, torch.Tensor]) -> None:
        run.pool.snapshot_due(run.trainer.policies, run.env_steps)


class MetricLogger(Part):
    """Losses (summed on the device, read once per `train.log_interval`: reading them every
    iteration would make the device wait for the host at each off-policy env step),
    throughput, training episodes and the pools' figures, per seed; a non-finite loss ends
    the run."""

    def __init__(self, run: RunState):
        self.loss_sum: torch.Tensor | None = None
        self.loss_iterations = 0
        self.next_log = run.env_steps
        self.log_steps = run.env_steps

    def on_training_start(self, run: RunState) -> None:
        self.log_steps = run.env_steps
        age = process_age()
        if age is not None and not run.requests[0].resume:
            for index in run.live:  # how long the command took to reach its first env step
                run.sinks[index].log({"perf/startup_s": age}, run.env_steps)

    def on_iteration(self, run: RunState, losses: dict[str, torch.Tensor]) -> None:
        graph = run.trainer.graph
        if graph is not None and graph.calls == 2:
            _report_capture(run, graph)
        stacked = torch.stack([v.float() for v in losses.values()])
        self.loss_sum = stacked if self.loss_sum is None else self.loss_sum + stacked
        self.loss_iterations += 1
        if run.env_steps >= self.next_log or run.env_steps >= run.total_env_steps:
            self._log(run, list(losses))
            self.next_log = run.env_steps + run.spec.train.log_interval

    def on_compact(self, run: RunState, keep: list[int]) -> None:
        if self.loss_sum is not None:  # [loss][row]
            self.loss_sum = self.loss_sum[:, keep]

    def _log(self, run: RunState, keys: list[str]) -> None:
        values = (self.loss_sum / self.loss_iterations).tolist()  # [loss][seed]
        self.loss_sum, self.loss_iterations = None, 0
        for index in run.live:  # a row whose loss is not finite fails, with its trial's
            bad = [k for k, v in zip(keys, values, strict=True) if not math.isfinite(v[index])]
            if bad and index in run.live:  # not ended with a seed of its trial already
                seed, steps = run.seeds[index], run.env_steps
                offline = registered_algos()[run.spec.algo.name].offline  # counts updates
                unit = "gradient step" if offline else "env step"
                error = f"non-finite loss by {unit} {steps} (seed {seed}): {', '.join(bad)}"
                run.fail_trial(index, error)
        now = time.perf_counter()
        rate = (run.env_steps - self.log_steps) / max(now - run.clock.tick, 1e-9)
        run.clock.tick, self.log_steps = now, run.env_steps
        episodes = run.trainer.stats.take()
        pooled = run.pool.metrics() if run.pool is not None else [{}] * len(run.seeds)
        agents = run.requests[0].env_info.n_agents
        for index in run.live:
            sink = run.sinks[index]
            if episodes[index] is not None:
                run.last_return[index] = episodes[index]["return_mean"]
            metrics = {k: v[index] for k, v in zip(keys, values, strict=True)}
            metrics["perf/env_steps_per_s"] = rate
            metrics["perf/batch_rows"] = len(run.requests)  # the rows trained together now
            metrics["perf/agent_steps_per_s"] = rate * agents
            if run.threads is not None:
                metrics["perf/threads"] = run.threads
            metrics.update(pooled[index])
            if episodes[index] is not None:
                trained = episodes[index].items()
                metrics.update({f"train/{k}": v for k, v in trained if k != "episodes"})
            sink.log(metrics, run.env_steps)


def _report_capture(run: RunState, graph) -> None:
    """Once, at the iteration that was captured: its capture time, or why it ran eagerly."""
    if graph.failed:
        for request in run.requests:
            tag = f"eager (capture failed: {graph.failed})"
            run.client.set_tag(request.run_id, COMPILE_TAG, tag)
        return
    for index in run.live:
        run.sinks[index].log({"perf/capture_s": graph.capture_seconds}, run.env_steps)


class Evaluator(Part):
    """The untrained policy's score, one every `train.eval_every` env steps (a sweep's
    objective, sent as progress events too) and the final one, which the run's result
    reports."""

    def __init__(self, run: RunState):
        self.every, self.episodes = run.spec.train.eval_every, run.spec.train.eval_episodes

    def scores(self, run: RunState) -> list[dict]:
        sampled = run.spec.train.eval_sampled
        return eval_metrics(run.trainer, run.eval_env, self.episodes, run.eval_seeds, sampled)

    def on_start(self, run: RunState) -> None:
        if self.every and run.env_steps == 0:
            # The untrained policy's score is where every learning curve starts. Logged
            # only: a sweep's pruner is not shown a score no training has produced yet.
            for sink, scores in zip(run.sinks, self.scores(run), strict=True):
                sink.log(scores, 0)

    def on_iteration(self, run: RunState, losses: dict[str, torch.Tensor]) -> None:
        steps = run.env_steps
        if not self.every or steps < run.next_eval or steps >= run.total_env_steps:
            return
        with run.clock.paused():  # throughput counts training only
            scored = self.scores(run)
            run.scores, run.scored_at = scored, steps
            for index in run.live:
                run.sinks[index].log(scored[index], steps)
                if run.progress is not None:
                    event = {"kind": "eval", "step": steps, "metrics": scored[index]}
                    run.progress(event | _row(run, index))
            run.next_eval = (steps // self.every + 1) * self.every

    def on_end(self, run: RunState) -> None:
        rate, trained = run.clock.mean_rate(run.env_steps), run.clock.trained_s()
        scored = self.scores(run)
        for index in run.live:
            final = scored[index]
            final["perf/env_steps_per_s_mean"] = rate
            if trained is not None:
                final[tracking.TRAINED_S] = trained
            run.sinks[index].log(final, run.env_steps)
            result = run.results[index]
            result.steps_per_s = rate
            result.final_return = final.get("eval/return_mean")
            result.env_steps = run.env_steps


class Checkpointer(Part):
    """A checkpoint every `train.checkpoint_every` env steps, on Ctrl-C and at the end, and
    the final policy; a checkpoint never gets ahead of the metrics logged before it."""

    def on_iteration(self, run: RunState, losses: dict[str, torch.Tensor]) -> None:
        every = run.spec.train.checkpoint_every
        if every and run.env_steps >= run.next_checkpoint:
            due = run.next_checkpoint  # the step named: the first iteration reaching it saves
            run.next_checkpoint = (run.env_steps // every + 1) * every
            with run.clock.paused():
                run.flush()
                save_checkpoints(run)
                if run.spec.train.keep_policies:
                    save_policies(run, f"policy/step-{due}.pt")

    def on_interrupt(self, run: RunState) -> None:
        import signal
        import threading

        # A second Ctrl-C or SIGTERM must not cut the checkpoint short.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        run.flush()
        save_checkpoints(run)

    def on_end(self, run: RunState) -> None:
        save_checkpoints(run)
        save_policies(run, POLICY)


def save_policies(run: RunState, artifact: str) -> None:
    """Every live seed's policy weights, alone, as `artifact` of its run."""
    for index in run.live:
        policies = run.trainer.seed_state(index)["policies"]
        _log_torch(run.client, run.requests[index].run_id, {"policies": policies}, artifact)


class ProgressEvents(Part):
    """Where each seed stands, after every iteration, for the live display."""

    def on_iteration(self, run: RunState, losses: dict[str, torch.Tensor]) -> None:
        for index in run.live:
            p = run.requests[index].run
            event = {"index": p.index, "step": run.env_steps, "total": p.total_env_steps}
            run.progress(event | _row(run, index) | {"return": run.last_return[index]})


def _row(run: RunState, index: int) -> dict[str, Any]:
    """What names row `index` in a progress event: its seed and its run (the batch's rows may
    be several trials' seeds)."""
    return {"seed": run.seeds[index], "run": run.requests[index].run_id}


class Pruning(Part):
    """A sweep's pruner sets a trial's `stop`: its rows end after this iteration, without a
    final evaluation or checkpoint."""

    def on_iteration(self, run: RunState, losses: dict[str, torch.Tensor]) -> None:
        for index in run.live:
            stop = run.requests[index].stop
            if stop is not None and stop.is_set():
                run.end_row(index, RowEnd("PRUNED", run.env_steps))


def parts_for(run: RunState) -> list[Part]:
    """The run's parts, in the order their hooks run."""
    plan = run.requests[0].run
    parts: list[Part] = []
    if plan.max_threads > 1:  # threads_per_run: auto follows the cores left free
        parts.append(ThreadWatch(plan.max_threads))
    if run.pool is not None:
        parts.append(PoolSnapshots())
    parts += [MetricLogger(run), Evaluator(run), Checkpointer()]
    if run.progress is not None:
        parts.append(ProgressEvents())
    if any(request.stop is not None for request in run.requests):
        parts.append(Pruning())
    return parts


def process_age() -> float | None:
    """Seconds since this process started (Linux's /proc), or None where it cannot be read.
    In a run's own process (`hardware.parallel_runs` > 1) it counts from that process."""
    import os
    from pathlib import Path

    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


# ---- checkpoints: one file per seed, in the single-seed layout


def save_checkpoints(run: RunState) -> None:
    for index in run.live:
        request = run.requests[index]
        state = {
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
            "trainer": run.trainer.seed_state(index),
            "env_steps": run.env_steps,
            "next_eval": run.next_eval,
            "next_checkpoint": run.next_checkpoint,
            "torch_rng": torch.get_rng_state(),
        }
        if (trained := run.clock.trained_s()) is not None:
            state["trained_s"] = trained
        if run.pool is not None:  # the snapshots, their win rates, the schedule
            state["pool"] = run.pool.seed_state(index)
        _log_torch(run.client, request.run_id, state, CHECKPOINT)
        run.client.set_tag(request.run_id, CHECKPOINT_STEP_TAG, str(run.env_steps))


def load_checkpoint(client, run_id: str) -> dict | None:
    folder = CHECKPOINT.rsplit("/", 1)[0]
    if not any(f.path == CHECKPOINT for f in client.list_artifacts(run_id, folder)):
        return None
    with staging() as tmp:
        path = client.download_artifacts(run_id, CHECKPOINT, str(tmp))
        return load_tensors(path, CHECKPOINT)


def _log_torch(client, run_id: str, state: dict, artifact: str) -> None:
    folder, name = artifact.rsplit("/", 1)
    with staging() as tmp:
        path = tmp / name
        torch.save(state, path)
        client.log_artifact(run_id, str(path), artifact_path=folder)
