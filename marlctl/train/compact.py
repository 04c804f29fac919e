"""The rows of a batch that ended leave it.

Several sweep trials train as the rows of one batch (`marlctl.train.rows`). A trial that its
pruner stops, or that fails, ends its rows (`RunState.end_row`) while the others train on;
left in the batch, they would go on costing what they cost. `compact` takes them out of
every tensor with a leading row dimension: the networks (online and target), the optimisers'
moments and per-row rates, the per-row hyperparameters, the random streams, the replay
buffer, running statistics, recurrent and episode state, and the envs' seed blocks (their
states, step counts and random streams). Nothing of a row depends on the others, so the
rows that remain go on exactly as they would have in the full batch.

A trainer takes part where it says so (`Trainer.compacts`; `Trainer.keep_rows` takes its
own state), an env where it has `keep_blocks` (the native envs and VMAS's seed blocks). A
batch on any other env (opponents, pools) keeps its ended rows computing, unlogged.
"""

from __future__ import annotations

import torch
from torch import nn

from marlctl.envs.batch import Observation
from marlctl.train.lifecycle import Part, RunState


def compact_blocker(run: RunState) -> str | None:
    """Why the rows that end in this run cannot leave its batch, or None."""
    if not getattr(run.trainer, "compacts", False):  # a teams trainer keeps its rows
        return f"{type(run.trainer).__name__} keeps every row"
    for env in (run.env, run.eval_env):
        if not hasattr(env, "keep_blocks"):
            return f"{type(env).__name__} keeps every seed block"
    return None


def compact(run: RunState, parts: list[Part], ob: Observation) -> Observation:
    """The rows of `run` that ended leave its trainer, its envs, its state and its parts;
    the current observation `ob` of its env, with only the rows that stay."""
    keep = run.live
    if not keep or len(keep) == len(run.requests):
        return ob
    ob = keep_observation(ob, keep, len(run.requests))
    keep_rows(run.trainer, keep)
    for env in (run.env, run.eval_env):
        env.keep_blocks(keep)
    run.keep(keep)
    for part in parts:
        part.on_compact(run, keep)
    trainer = run.trainer
    if trainer.graph is not None:  # captured at the old shapes: captured anew
        trainer.graph = None
        trainer.capture(run.env)
    return ob


def keep_observation(ob: Observation, keep: list[int], blocks: int) -> Observation:
    """Env rows `[blocks * E, ...]` of observation `ob`: only those of blocks `keep`."""
    rows = ob.state.shape[0] // blocks
    index = (torch.tensor(keep).unsqueeze(1) * rows + torch.arange(rows)).flatten()
    index = index.to(ob.state.device)

    def cut(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x.index_select(0, index)

    return Observation(
        {k: cut(v) for k, v in ob.obs.items()},
        cut(ob.state),
        {k: cut(v) for k, v in ob.masks.items()},
        {k: cut(v) for k, v in ob.active.items()},
    )


def keep_rows(trainer, keep: list[int]) -> None:
    """Only rows `keep` (in that order) of the trainer's networks, optimisers and own state
    (`Trainer.keep_rows`) go on."""
    S = len(trainer.seeds)
    index = torch.tensor(keep, device=trainer.device)
    done: set[int] = set()  # a tensor two modules hold is cut once

    def cut(tensor: torch.Tensor, where: str) -> torch.Tensor:
        if tensor.shape[0] != S:
            raise ValueError(f"{where}: {tuple(tensor.shape)} has no leading row of {S}")
        return tensor.index_select(0, index.to(tensor.device))

    with torch.no_grad():
        for name, module in networks_of(trainer):
            for key, tensor in module.state_dict(keep_vars=True).items():
                if tensor.dim() and id(tensor) not in done:
                    done.add(id(tensor))
                    tensor.data = cut(tensor.data, f"{name}.{key}")
                    tensor.grad = None
            for sub in module.modules():
                if type(getattr(sub, "seeds", None)) is int:
                    sub.seeds = len(keep)
        for name, optimizer in trainer.optimizers.items():
            for state in optimizer.state.values():
                for key, value in state.items():
                    if torch.is_tensor(value) and value.dim():
                        state[key] = cut(value, f"optimizer {name}: {key}")
            if hasattr(optimizer, "keep"):  # rates of its own per row (`RowAdam`)
                optimizer.keep(index)
        trainer.keep_rows(index)


def networks_of(trainer) -> list[tuple[str, nn.Module]]:
    """The trainer's networks: every module it holds as an attribute, each once."""
    seen: set[int] = set()
    found = []
    for name, value in vars(trainer).items():
        if isinstance(value, nn.Module) and id(value) not in seen:
            seen.add(id(value))
            found.append((name, value))
    return found
