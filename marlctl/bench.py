"""`marlctl bench`: env-only and end-to-end training throughput of a spec over `num_envs`.

Nothing is tracked: the measurements run in this process on the plan's first run's device
and threads, for a fixed wall-clock budget per point after a warm-up. A point whose single
call (an env step, a training iteration) takes longer than the budget is measured on one
call, and the larger sizes after it are skipped: each would take longer still.

On a GPU, unless `hardware.compile=false`, every point is measured twice: as the call runs
without capture, and captured as a CUDA graph (`marlctl.train.capture`). With
`hardware.compile=true` the networks and the env's step are compiled in both. The time spent
compiling and capturing is reported apart from the throughput.

An eager training point also counts its arithmetic, in its untimed warm-up iteration: the
floating-point operations of its matrix products and convolutions per env step (torch's FLOP
counter), and so the rate it reached in them. Beside the device's peak, that says whether a
run is bound by its arithmetic (a larger batch or a GPU helps) or by everything around it.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from marlctl.plan import Plan
from marlctl.spec import LoadedSpec
from marlctl.train import timing

CPU_SWEEP = (16, 64, 256, 1024, 4096, 16384)
CUDA_SWEEP = (256, 1024, 4096, 16384, 65536, 262144)
PETTINGZOO_SWEEP = (1, 4, 16, 64)


@dataclass
class Point:
    kind: str  # "env" | "train"
    num_envs: int  # per seed
    env_steps_per_s: float  # all seeds together
    agent_steps_per_s: float
    peak_memory_mb: float
    seconds: float
    seeds: int = 1  # trained as one batch (`hardware.batch_seeds`)
    slow: bool = False  # one call took longer than the budget: larger sizes were skipped
    mode: str = "eager"  # "torch.compile", "CUDA graph", "CUDA graph, torch.compile"
    compile_s: float = 0.0  # compiling and capturing, not counted in `seconds`
    # Iterations run before timing (collecting up to `learning_starts`, capturing), and
    # their seconds: not counted in `seconds` either.
    fill_iterations: int = 0
    fill_s: float = 0.0
    # A training point's arithmetic: floating-point operations per env step (an offline
    # spec's: per gradient step) in matrix products and convolutions, forward and backward,
    # as torch counts them over the untimed warm-up iteration. None for env points and for
    # compiled or captured iterations, whose operations torch does not dispatch one by one.
    flop_per_step: float | None = None

    @property
    def flop_per_s(self) -> float | None:
        """The arithmetic rate the point reached: what its cores or device did per second
        in matrix products and convolutions."""
        return None if self.flop_per_step is None else self.flop_per_step * self.env_steps_per_s

    @property
    def per_seed(self) -> float:
        return self.env_steps_per_s / self.seeds


@dataclass
class BenchResult:
    env_id: str
    backend: str
    algo: str
    device: str
    threads: int
    compile: bool | str
    points: list[Point]
    skipped: list[str] = field(default_factory=list)  # "train num_envs=N" not measured
    # What a point's `env_steps_per_s` counts: an offline algorithm's training (a spec
    # with `data`) takes gradient steps and no env step.
    unit: str = "env steps"

    def best(self, kind: str) -> Point | None:
        rows = [p for p in self.points if p.kind == kind]
        return max(rows, key=lambda p: p.env_steps_per_s) if rows else None

    def to_dict(self) -> dict:
        data = asdict(self)
        best_env, best_train = self.best("env"), self.best("train")
        data["best_env_num_envs"] = best_env.num_envs if best_env else None
        data["suggested_num_envs"] = best_train.num_envs if best_train else None
        for point, row in zip(self.points, data["points"], strict=True):
            row["env_steps_per_s_per_seed"] = point.per_seed
            row["flop_per_s"] = point.flop_per_s
        return data


def default_sweep(backend: str, device: str) -> tuple[int, ...]:
    if backend == "pettingzoo":
        return PETTINGZOO_SWEEP
    return CUDA_SWEEP if device.startswith("cuda") else CPU_SWEEP


def run_bench(
    loaded: LoadedSpec,
    plan: Plan,
    sweep: tuple[int, ...] | None,
    seconds: float,
    train: bool = True,
    report: Callable[[Point], None] | None = None,
) -> BenchResult:
    import torch

    from marlctl.train.build import set_float32_precision

    spec, info, run = loaded.spec, plan.env, plan.runs[0]
    device = torch.device(run.device)
    torch.set_num_threads(run.threads)
    set_float32_precision(spec)
    torch.manual_seed(run.seed)
    sizes = sweep or default_sweep(spec.env.backend, run.device)
    dataset = _dataset(spec) if spec.data is not None else None
    if dataset is not None:  # gradient steps only: the envs are evaluation's, not timed
        sizes, train = (spec.hardware.num_envs,), True
    result = BenchResult(
        info.id,
        spec.env.backend,
        spec.algo.name,
        run.device,
        run.threads,
        spec.hardware.compile,
        [],
        unit="gradient steps" if dataset is not None else "env steps",
    )

    def record(point: Point) -> None:
        result.points.append(point)
        if report is not None:
            report(point)

    def measure(kind: str, point_at: Callable[[int], Point | None]) -> None:
        for index, num_envs in enumerate(sizes):
            point = point_at(num_envs)
            if point is None:  # cannot be captured: no size can
                return
            record(point)
            if point.slow:
                result.skipped += [f"{kind} num_envs={n}" for n in sizes[index + 1 :]]
                return

    graphs = [False]
    if device.type == "cuda" and spec.hardware.compile is not False:
        graphs.append(True)
    seeds = tuple(spec.seeds) if spec.hardware.batch_seeds else (run.seed,)
    for graph in graphs:
        label = " (CUDA graph)" if graph else ""
        if dataset is None:
            measure(
                f"env{label}",
                lambda n, graph=graph: _env_point(spec, info, n, run.seed, device, seconds, graph),
            )
        if train:
            measure(
                f"train{label}",
                lambda n, graph=graph: _train_point(
                    spec, info, n, seeds, device, seconds, graph, dataset
                ),
            )
    return result


def _dataset(spec) -> dict:
    """The transitions of the dataset an offline spec names, read once for every point."""
    from marlctl import tracking
    from marlctl.data import artifacts
    from marlctl.data.reader import load_named

    named = artifacts.is_artifact(spec.data)
    client = tracking.client_for(spec.tracking.uri) if named else None
    return load_named(spec.data, client)[1]


def _env_point(
    spec, info, num_envs: int, seed: int, device, seconds: float, graph: bool
) -> Point | None:
    """Random actions, drawn on the device each step, and one env step."""
    from marlctl.train.runner import make_env

    _reset_peak(device)
    env = make_env(spec, info, num_envs, device, min(spec.hardware.env_workers, num_envs))
    try:
        env.reset(seed)
        if spec.hardware.compile is True and hasattr(env, "compile"):
            env.compile()

        def step():
            return env.step(_random_actions(info, num_envs, device))

        timed = step
        if graph:
            if not hasattr(env, "make_graph_safe"):
                return None
            from marlctl.train.capture import IterationGraph

            env.make_graph_safe()
            captured = IterationGraph([env], list(env.generators), [])

            def timed():
                return captured.run(step)

        steps, elapsed, slow, warm = timing.timed(timed, seconds, device, warmup=3)
    finally:
        env.close()
    rate = steps * num_envs / elapsed
    compiled = ", torch.compile" if spec.hardware.compile is True else ""
    mode = f"CUDA graph{compiled}" if graph else ("torch.compile" if compiled else "eager")
    compile_s = _compile_seconds(warm, 3, steps, elapsed) if mode != "eager" else 0.0
    return Point(
        "env", num_envs, rate, rate * info.n_agents, _peak_mb(device), elapsed, 1, slow, mode,
        compile_s,
    )  # fmt: skip


def _train_point(
    spec, info, num_envs: int, seeds: tuple[int, ...], device, seconds, graph: bool,
    dataset: dict | None = None,
) -> Point | None:  # fmt: skip
    from marlctl import tracking
    from marlctl.plan import learner_info
    from marlctl.train.build import build_trainer
    from marlctl.train.opponents import with_opponents
    from marlctl.train.runner import make_env, prepare_iterations

    _reset_peak(device)
    trainer = build_trainer(spec, learner_info(info, spec), num_envs, device, 1_000, seeds)
    if dataset is not None:
        trainer.load_dataset(dataset)
    env = make_env(
        spec, info, num_envs, device, min(spec.hardware.env_workers, num_envs), len(seeds)
    )
    try:
        if spec.opponents:  # groups played by scripts or trained runs act as in training
            client = tracking.client_for(spec.tracking.uri)
            env = with_opponents(env, spec, info, client, list(seeds), deterministic=False)
        mode = prepare_iterations(spec, trainer, env, capture=graph)
        if graph and trainer.graph is None:  # this run is not captured: no size is
            return None
        state = {"ob": env.reset(seeds[0] if len(seeds) == 1 else list(seeds))}

        def iteration() -> None:
            state["ob"], _ = trainer.train_iteration(env, state["ob"])
            trainer.stats.take()

        # Timed iterations are the steady state: a replay-based trainer's gradient steps have
        # begun (iterations before `learning_starts` only collect), and a captured run's
        # graph is replaying (its first iteration with updates runs eagerly, its second is
        # captured).
        start = time.perf_counter()
        filling = 0
        while not timing.steady(trainer, graph) and filling < timing.MAX_FILL_ITERATIONS:
            iteration()
            filling += 1
        timing.sync(device)
        filled = time.perf_counter() - start
        if graph and trainer.graph.failed:
            mode = f"eager (capture failed: {trainer.graph.failed})"
        counted: list[float] = []

        def counted_first() -> None:
            # The warm-up call, untimed, counts an eager iteration's arithmetic.
            if mode == "eager" and not counted:
                counted.append(_iteration_flop(iteration))
            else:
                iteration()

        iters, elapsed, slow, warm = timing.timed(counted_first, seconds, device, warmup=1)
        flop = counted[0] if counted else None
    finally:
        env.close()
    steps = trainer.steps_per_iteration * len(seeds)
    rate = iters * steps / elapsed
    compile_s = _compile_seconds(warm, 1, iters, elapsed) if mode != "eager" else 0.0
    capture_s = trainer.graph.capture_seconds if graph else 0.0
    return Point(
        "train", num_envs, rate, rate * info.n_agents, _peak_mb(device), elapsed, len(seeds),
        slow, mode, compile_s + capture_s, filling, filled,
        None if flop is None else flop / steps,
    )  # fmt: skip


def _iteration_flop(iteration: Callable[[], None]) -> float:
    """Floating-point operations of one call of `iteration`, in matrix products and
    convolutions (torch's FLOP counter: what it has formulas for)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        iteration()
    return float(counter.get_total_flops())


def _compile_seconds(warm: float, warmup: int, calls: int, elapsed: float) -> float:
    """What the warm-up took beyond its calls' steady-state time: compiling and capturing."""
    return max(0.0, warm - warmup * elapsed / calls)


def _random_actions(info, num_envs: int, device) -> dict:
    import torch

    actions = {}
    for g in info.groups:
        if g.discrete:
            actions[g.name] = torch.randint(0, g.n_actions, (num_envs, g.n_agents), device=device)
        else:
            actions[g.name] = torch.rand(num_envs, g.n_agents, g.n_actions, device=device)
    return actions


def _reset_peak(device) -> None:
    import torch

    if device.type == "cuda":
        torch.empty(0, device=device)  # peak statistics need CUDA initialised
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_mb(device) -> float:
    """Peak CUDA memory of this measurement, or this process's peak resident set on CPU."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def learning_note(spec, num_envs: int) -> str:
    """What training with `num_envs` envs changes for learning, beside its speed."""
    from marlctl.algos import registered_algos

    algo, now = spec.algo, spec.hardware.num_envs
    if num_envs == now:
        return "the spec's own num_envs: nothing changes for learning"
    ratio = num_envs / now
    if registered_algos()[algo.name].on_policy:  # the batch of each update follows num_envs
        batch, new = algo.rollout_steps * now, algo.rollout_steps * num_envs
        return (
            f"each update then learns from {new:,} samples instead of {batch:,} "
            f"({ratio:g}x; minibatches of {new // algo.minibatches:,}), and there are "
            f"{ratio:g}x fewer updates per env step: learning rate, epochs and minibatches "
            "were tuned for the old batch"
        )
    per_step, new = (
        algo.updates / (algo.rollout_steps * now),
        algo.updates / (algo.rollout_steps * num_envs),
    )
    return (
        f"gradient steps per env step fall from {per_step:.3g} to {new:.3g} ({ratio:g}x "
        "fewer): raise algo.updates to keep the replay ratio, or expect slower learning "
        "per env step"
    )
