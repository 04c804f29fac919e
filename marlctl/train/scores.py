"""A policy's score: deterministic episodes on seeds of their own, per seed of a batch; and,
where a spec asks (`train.eval_sampled`), the same episodes with the actions the policy takes
in training, as `eval_sampled/` metrics.

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


def episode_quota(episodes: int, seeds: int, num_envs: int, device) -> torch.Tensor:
    """How many of a seed's `episodes` each of its `num_envs // seeds` envs plays, `[S, n]`:
    as even as they come, the first envs one more."""
    n = num_envs // seeds
    quota = torch.full((seeds, n), episodes // n, device=device)
    quota[:, : episodes % n] += 1
    return quota


@torch.no_grad()
def evaluate(
    trainer, env: BatchedEnv, episodes: int, seeds: list[int], deterministic: bool = True
) -> list[dict[str, float]]:
    """Per seed: mean per-agent return over exactly `episodes` episodes, deterministic (the
    most probable action) or as the policy acts in training."""
    S = len(seeds)
    n = env.num_envs // S
    quota = episode_quota(episodes, S, env.num_envs, env.device)
    finished = torch.zeros(S, n, dtype=torch.long, device=env.device)
    stats = EpisodeStats({g.name: g.n_agents for g in env.info.groups}, n, env.device, S)
    ob = env.reset(reset_seed(seeds))
    first = None  # every episode starts now
    while bool((finished < quota).any()):
        tr = env.step(trainer.act(ob, deterministic=deterministic, first=first))
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


def eval_metrics(
    trainer, env: BatchedEnv, episodes: int, seeds: list[int], sampled: bool = False
) -> list[dict]:
    """`evaluate`'s scores as the `eval/` metrics a run logs; with `sampled`, the sampled
    policy's as `eval_sampled/` metrics too. The random states the sampled episodes draw from
    are put back after them: asking for them leaves training's random streams as they were."""
    out = [
        {f"eval/{k}": v for k, v in result.items()}
        for result in evaluate(trainer, env, episodes, seeds)
    ]
    if sampled:
        # The trainer's own per-seed generators draw its actions: put them back as well.
        generators = list(getattr(trainer, "generators", []))
        states = [g.get_state() for g in generators]
        cuda = [env.device] if torch.device(env.device).type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            drawn = evaluate(trainer, env, episodes, seeds, deterministic=False)
        for generator, state in zip(generators, states, strict=True):
            generator.set_state(state)
        for metrics, result in zip(out, drawn, strict=True):
            metrics.update({f"eval_sampled/{k}": v for k, v in result.items()})
    return out
