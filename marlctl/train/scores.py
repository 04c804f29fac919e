"""A policy's score: deterministic episodes on seeds of their own, per seed of a batch.

Training evaluates with these (`marlctl.train.lifecycle.Evaluator`) and so does
`marlctl eval`, which repeats a run's evaluation episodes through `eval_seed`.
"""

from __future__ import annotations

import numpy as np
import torch

from marlctl.envs.batch import BatchedEnv
from marlctl.train.core import EpisodeStats, per_seed_outcomes

EVAL_ENVS = 32


def derive_seed(*entropy: int) -> int:
    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0] % 2**31)


def eval_seed(seed: int) -> int:
    """The seed of a run's evaluation episodes; `marlctl eval` uses it to repeat them."""
    return derive_seed(seed, 1)


def reset_seed(seeds: list[int]) -> int | list[int]:
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
    ob = env.reset(reset_seed(seeds))
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


def eval_metrics(trainer, env: BatchedEnv, episodes: int, seeds: list[int]) -> list[dict]:
    """`evaluate`'s scores as the `eval/` metrics a run logs."""
    return [
        {f"eval/{k}": v for k, v in result.items()}
        for result in evaluate(trainer, env, episodes, seeds)
    ]
