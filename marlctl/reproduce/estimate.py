"""What a plan will cost before it trains: a short measurement of its first run process.

The process is built as a run builds it (trainer, training and evaluation envs, opponents),
timed on `seconds` of steady training (a replay-based learner past `learning_starts`) and one
evaluation of its untrained policy; the run's wall-clock is then its set-up, its budget at the
measured rate and its evaluations (every `train.eval_every` env steps, at step 0 and at the
end), and the plan's is that times the waves of run processes `hardware.parallel_runs` allows.
A seed resumed from a checkpoint is priced at the steps it has left, not its whole budget.
An untrained policy's episodes may last longer or shorter than a trained one's, and a replay
buffer fills faster than it trains: the estimate is for planning, not a measurement.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

# A run process's own start (Python, torch, MLflow, the run's records), on top of the set-up
# measured here: what `marlctl run` spends before a run's first step on a CPU machine.
PROCESS_START_S = 4.0


@dataclass(frozen=True)
class CostEstimate:
    setup_s: float  # building the trainer and envs of one run process, measured
    env_steps_per_s: float  # one process's training rate, all its seeds together, measured
    eval_s: float  # one evaluation of every seed of a process, measured
    evals: int  # evaluations per run process
    processes: int  # run processes the plan starts
    waves: int  # processes one after another, `hardware.parallel_runs` at a time
    total_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def estimate(
    loaded, plan, seconds: float = 2.0, trained: dict[int, int] | None = None
) -> CostEstimate:
    """`trained`: the env steps seeds of the plan have trained already, by seed (a stopped
    run's checkpoint, which it resumes from); the other seeds train their whole budget."""
    import torch

    from marlctl import tracking
    from marlctl.plan import learner_info
    from marlctl.train.build import build_trainer, set_float32_precision
    from marlctl.train.opponents import with_opponents
    from marlctl.train.runner import make_env, make_eval_env, prepare_iterations
    from marlctl.train.scores import eval_metrics

    spec, info, run = loaded.spec, plan.env, plan.runs[0]
    hw, train = spec.hardware, spec.train
    processes = (
        min(len(hw.devices or [run.device]), len(plan.runs)) if plan.batch_seeds else len(plan.runs)
    )
    seeds = [r.seed for r in plan.runs[: len(plan.runs) // processes]]
    device = torch.device(run.device)
    torch.set_num_threads(run.threads)
    set_float32_precision(spec)
    torch.manual_seed(run.seed)
    began = time.perf_counter()
    trainer = build_trainer(spec, learner_info(info, spec), hw.num_envs, device, 1_000, seeds)
    client = tracking.client_for(spec.tracking.uri) if spec.opponents else None
    env = make_env(spec, info, hw.num_envs, device, min(hw.env_workers, hw.num_envs), len(seeds))
    eval_env = None
    try:
        env = with_opponents(env, spec, info, client, seeds, deterministic=False)
        eval_env = make_eval_env(spec, info, client, seeds, device)
        prepare_iterations(spec, trainer, env)
        setup = time.perf_counter() - began
        began = time.perf_counter()
        eval_metrics(trainer, eval_env, train.eval_episodes, seeds)
        eval_s = time.perf_counter() - began
        rate = _training_rate(trainer, env, seeds, device, seconds)
    finally:
        env.close()
        if eval_env is not None:
            eval_env.close()
    trained = trained or {}
    left = [max(train.budget - trained.get(r.seed, 0), 0) for r in plan.runs]
    mean = sum(left) / len(left)  # a seed's env steps to train, on average
    evals = (math.ceil(mean / train.eval_every) + 1) if train.eval_every else 1
    one = PROCESS_START_S + setup + mean * len(seeds) / rate + evals * eval_s
    waves = math.ceil(processes / max(plan.parallel_runs, 1))
    return CostEstimate(setup, rate, eval_s, evals, processes, waves, waves * one)


def _training_rate(trainer, env, seeds: list[int], device, seconds: float) -> float:
    """Env steps per second over about `seconds` of iterations, once they run as they will
    for the rest of training (`train.timing`), timed as `marlctl bench` times them."""
    from marlctl.train.timing import MAX_FILL_ITERATIONS, steady, timed

    state = {"ob": env.reset(seeds[0] if len(seeds) == 1 else list(seeds))}

    def iteration() -> None:
        state["ob"], _ = trainer.train_iteration(env, state["ob"])
        trainer.stats.take()

    graph, filling = getattr(trainer, "graph", None) is not None, 0
    while not steady(trainer, graph) and filling < MAX_FILL_ITERATIONS:
        iteration()
        filling += 1
    count, elapsed, _, _ = timed(iteration, seconds, device, warmup=1)
    return count * trainer.steps_per_iteration * len(seeds) / elapsed
