"""Pieces shared by algorithms: batched MLPs, running normalisers, advantage estimation."""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.adam import adam as adam_step

ACTIVATIONS = {"tanh": torch.tanh, "relu": F.relu, "elu": F.elu, "gelu": F.gelu, "silu": F.silu}


class BatchedMLP(nn.Module):
    """`seeds` × `copies` independent MLPs in one batched matmul per layer.

    Input `[S, ..., n, in]` -> `[S, ..., n, out]`, seed first. copies == 1 is one network
    shared by every agent of the group; copies == n gives each agent its own weights. Seeds
    trained together (`hardware.batch_seeds`) each own a slice of every parameter; a seed's
    slice is computed exactly as it would be alone.
    """

    def __init__(
        self,
        seeds: int,
        copies: int,
        n_in: int,
        hidden: list[int],
        n_out: int,
        activation: str,
        layer_norm: bool,
        out_gain: float,
        generators: list[torch.Generator],
        init: str = "orthogonal",
        hidden_gain: float = math.sqrt(2),
    ):
        """init: orthogonal (gain `hidden_gain`, `out_gain` on the last layer, zero biases;
        the PPO implementations' choice) or torch (`nn.Linear`'s default: weights and biases
        uniform in ±1/sqrt(fan_in), as in the pymarl/EPyMARL networks)."""
        super().__init__()
        self.seeds, self.copies, self.activation = seeds, copies, ACTIVATIONS[activation]
        sizes = [n_in, *hidden, n_out]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for index, (a, b) in enumerate(itertools.pairwise(sizes)):
            gain = out_gain if index == len(sizes) - 2 else hidden_gain
            weight = torch.empty(seeds, copies, b, a)
            bias = torch.zeros(seeds, copies, b)
            for s in range(seeds):
                for k in range(copies):
                    if init == "torch":
                        bound = 1 / math.sqrt(a)
                        nn.init.uniform_(weight[s, k], -bound, bound, generator=generators[s])
                        nn.init.uniform_(bias[s, k], -bound, bound, generator=generators[s])
                    else:
                        nn.init.orthogonal_(weight[s, k], gain, generator=generators[s])
            self.weights.append(nn.Parameter(weight.transpose(-1, -2).contiguous()))
            self.biases.append(nn.Parameter(bias))
        self.norm = nn.Parameter(torch.ones(seeds, copies, n_in)) if layer_norm else None
        self.norm_bias = nn.Parameter(torch.zeros(seeds, copies, n_in)) if layer_norm else None

    def forward(self, x: torch.Tensor, copy: torch.Tensor | None = None) -> torch.Tensor:
        """`copy` `[S]`: run only that copy of each seed's networks (`select_copy`), on x
        `[S, ..., m, in]` (the rows of the agents it serves)."""
        S, lead, n = x.shape[0], x.shape[1:-2], x.shape[-2]
        pick = (lambda p: p) if copy is None else (lambda p: select_copy(p, copy))
        copies = self.copies if copy is None else 1
        if self.norm is not None:
            shape = (S, *([1] * len(lead)), copies, x.shape[-1])
            x = layer_norm(x) * pick(self.norm).view(shape) + pick(self.norm_bias).view(shape)
        last = len(self.weights) - 1
        h = x.reshape(S, -1, x.shape[-1]) if copies == 1 else x.reshape(S, -1, n, x.shape[-1])
        for index, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = batched_linear(h, pick(w), pick(b))
            if index < last:
                h = self.activation(h)
        return h.view(S, *lead, n, -1)


def select_copy(p: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
    """Each seed's copy `copy[s]` of a parameter `[S, copies, ...]`, as `[S, 1, ...]`: one
    agent's network where agents update one at a time (a gradient reaches that copy only)."""
    if p.shape[1] == 1:
        return p
    return p[torch.arange(p.shape[0], device=p.device), copy].unsqueeze(1)


def layer_norm(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """`F.layer_norm` over the last dim, without affine parameters. On CUDA it is written out:
    PyTorch's kernel computes row statistics at about a tenth of memory bandwidth on the
    narrow rows of MARL inputs (18 features × millions of rows: 3.3 ms per call on average on
    an H100, half of an IPPO iteration's GPU time at 65,536 envs); four elementwise passes
    take a fraction of that."""
    if not x.is_cuda:
        return F.layer_norm(x, x.shape[-1:], eps=eps)
    centred = x - x.mean(-1, keepdim=True)
    return centred * torch.rsqrt(centred.square().mean(-1, keepdim=True) + eps)


def inclusive_cumsum(probs: torch.Tensor) -> torch.Tensor:
    """`probs.cumsum(-1)`; on CUDA as a product with a triangular matrix of ones, which for
    the handful of actions of a MARL policy is many times faster than the scan kernel."""
    if not probs.is_cuda:
        return probs.cumsum(-1)
    return probs @ _upper_ones(probs.shape[-1], probs.dtype, probs.device)


@functools.lru_cache
def _upper_ones(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=dtype, device=device).triu()


def adam(params, lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam as every replay-based algorithm uses it: one fused kernel over all parameters (per
    element, so a seed's update does not depend on the seeds batched with it, up to the
    rounding of a vector lane against the scalar tail on some CPUs)."""
    return Adam(params, lr=lr, eps=eps, fused=True)


class Adam(torch.optim.Adam):
    """torch's Adam, stepped without `Adam.step`'s wrapper.

    The wrapper imports `torch._dynamo` on its first call, for the graph breaks a compiled
    optimiser step needs, and so do the bookkeeping methods torch marks as not compilable:
    about a second of every run's start-up, for nothing, since no optimiser call is compiled
    here (`hardware.compile` compiles networks and losses). The step is torch's own, on the
    same state: the same numbers, and checkpoints either optimiser loads.
    """

    def __init__(self, *args, **kwargs):
        _plain_optimizer_methods()
        super().__init__(*args, **kwargs)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("marlctl's Adam takes no closure")
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = [], [], [], [], [], []
            has_complex = self._init_group(
                group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps
            )
            beta1, beta2 = group["betas"]
            adam_step(
                params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps,
                amsgrad=group["amsgrad"], has_complex=has_complex, beta1=beta1, beta2=beta2,
                lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                maximize=group["maximize"], foreach=group["foreach"],
                capturable=group["capturable"], differentiable=False, fused=group["fused"],
                decoupled_weight_decay=group.get("decoupled_weight_decay", False),
            )  # fmt: skip


@functools.cache
def _plain_optimizer_methods() -> None:
    """Let the functions torch wraps so that `torch.compile` skips them (`Optimizer`'s
    `add_param_group`, `zero_grad`, `state_dict`, `load_state_dict`, and the functional
    `adam`) run without importing the compiler: the wrapper imports it on the first call to
    make the skipping version, and caches that on the function as `__dynamo_disable`
    (`torch._compile._disable_dynamo`). Caching the plain function instead is what it would
    call outside a compilation anyway. Where torch's wrappers are not as expected, nothing
    changes."""
    wrapped = [getattr(torch.optim.Optimizer, name) for name in (
        "add_param_group", "zero_grad", "state_dict", "load_state_dict"
    )] + [adam_step]  # fmt: skip
    for function in wrapped:
        plain = getattr(function, "__wrapped__", None)
        if plain is not None and not hasattr(plain, "__dynamo_disable"):
            setattr(plain, "__dynamo_disable", plain)


class AgentAdam(torch.optim.Optimizer):
    """Adam (Kingma & Ba 2015) for networks whose agents update one at a time: the moments
    and the step count of every parameter `[S, copies, ...]` are kept per seed and per copy
    (an agent's network, or a group's shared one), and `step(moved)` advances only the
    copies that `moved[p]` `[S, copies]` marks. torch's Adam would move every copy on every
    step, one whose gradient is zero by its momentum alone."""

    def __init__(self, params, lr: float, eps: float, betas: tuple[float, float] = (0.9, 0.999)):
        super().__init__(params, {"lr": lr, "eps": eps, "betas": betas})

    @torch.no_grad()
    def step(self, moved: dict[torch.Tensor, torch.Tensor]) -> None:  # type: ignore[override]
        # One foreach operation per formula over every parameter, the moved copies weighting
        # each update (0: the copy keeps its weights and moments exactly).
        for group in self.param_groups:
            lr, eps, (b1, b2) = group["lr"], group["eps"], group["betas"]
            params = [p for p in group["params"] if p.grad is not None and p in moved]
            if not params:
                continue
            for p in params:
                if not self.state[p]:
                    self.state[p].update(
                        step=torch.zeros(p.shape[:2], device=p.device),
                        exp_avg=torch.zeros_like(p),
                        exp_avg_sq=torch.zeros_like(p),
                    )
            states = [self.state[p] for p in params]
            grads = [p.grad for p in params]
            shapes = [(*p.shape[:2], *([1] * (p.dim() - 2))) for p in params]
            move = [
                moved[p].to(p.dtype).view(shape) for p, shape in zip(params, shapes, strict=True)
            ]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, [moved[p].to(torch.float32) for p in params])
            m, v = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
            torch._foreach_lerp_(m, grads, torch._foreach_mul(move, 1 - b1))
            torch._foreach_lerp_(
                v, torch._foreach_mul(grads, grads), torch._foreach_mul(move, 1 - b2)
            )
            t = torch._foreach_clamp_min(
                [s.view(shape) for s, shape in zip(steps, shapes, strict=True)], 1
            )
            # 1 - beta^t, the bias corrections
            first = torch._foreach_add(torch._foreach_neg(torch._foreach_pow(b1, t)), 1)
            second = torch._foreach_add(torch._foreach_neg(torch._foreach_pow(b2, t)), 1)
            denom = torch._foreach_add(torch._foreach_sqrt(torch._foreach_div(v, second)), eps)
            update = torch._foreach_div(torch._foreach_div(m, first), denom)
            torch._foreach_mul_(update, torch._foreach_mul(move, lr))
            torch._foreach_sub_(params, update)


def batched_linear(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One layer of `seeds` × `copies` linear maps: w `[S, copies, in, out]`, b `[S, copies, out]`.

    h is `[S, rows, in]` when copies == 1 (one fused multiply-add per seed over every row),
    else `[S, rows, copies, in]`.
    """
    if h.dim() == 3:
        if w.shape[-1] == 1:  # a matrix-vector product takes a batch-dependent path
            return (h * w[:, 0, :, 0].unsqueeze(1)).sum(-1, keepdim=True) + b[:, :1]
        return torch.baddbmm(b[:, :1], h, w[:, 0])
    if w.shape[-1] == 1:
        return (h * w[:, :, :, 0].unsqueeze(1)).sum(-1, keepdim=True) + b[:, None]
    return torch.einsum("sbni,snio->sbno", h, w) + b[:, None]


def per_seed(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[S] values shaped to broadcast against a seed-first tensor."""
    return values.view(-1, *([1] * (like.dim() - 1)))


class RunningMeanStd(nn.Module):
    """Per-seed mean and variance of everything seen (Chan et al. parallel update)."""

    def __init__(self, seeds: int = 1, epsilon: float = 1e-4):
        super().__init__()
        self.register_buffer("mean", torch.zeros(seeds))
        self.register_buffer("var", torch.ones(seeds))
        self.register_buffer("count", torch.full((seeds,), epsilon))

    @torch.no_grad()
    def update(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        """x, weight: seed first, `[S, ...]`."""
        w = torch.ones_like(x) if weight is None else weight.to(x.dtype)
        x, w = x.flatten(1), w.flatten(1)
        count = w.sum(1).clamp_min(1.0)
        mean = (x * w).sum(1) / count
        var = ((x - mean[:, None]) ** 2 * w).sum(1) / count
        delta, total = mean - self.mean, self.count + count
        self.mean += delta * count / total
        self.var.copy_(
            (self.var * self.count + var * count + delta**2 * self.count * count / total) / total
        )
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - per_seed(self.mean, x)) / torch.sqrt(per_seed(self.var, x) + 1e-8)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sqrt(per_seed(self.var, x) + 1e-8) + per_seed(self.mean, x)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    last_value: torch.Tensor,
    continues: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over the time axis.

    rewards, values, continues: [T, E, n]; last_value: [E, n]. `continues[t]` is false where
    the agent's episode ended after step t: the whole env's, or the agent's own when it left
    early. Returns (advantages, returns) shaped like rewards.
    """
    steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    next_value = last_value
    for t in reversed(range(steps)):
        keep = continues[t].to(rewards.dtype)
        delta = rewards[t] + gamma * next_value * keep - values[t]
        # gamma * (lam * ...): rounds alike whether gamma and lam are floats or per-row
        # tensors (a float product gamma * lam is taken in double first).
        running = delta + gamma * (lam * keep) * running
        advantages[t] = running
        next_value = values[t]
    return advantages, advantages + values


def turn_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    last_value: torch.Tensor,
    active: torch.Tensor,
    last_active: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GAE for turn-based games, where an agent acts on some steps only.

    An agent's transition runs from one of its turns to its next: the rewards it receives on
    the other players' moves in between (a loss on the winner's move) are added to its
    turn's reward, and it bootstraps from its value at its next turn, discounted once per
    turn. Steps it does not act on get no advantage. Its last turn before the rollout's end
    counts only if it acts at the first step after the rollout (`last_active`): otherwise
    the rest of that turn's return is not seen yet, and the step is left out.

    rewards, values, active: [T, ..., n]; last_value, last_active: [..., n]; dones: [T, ...],
    true where the env's episode ended after step t. Returns (advantages, returns, counted),
    `counted` true at the steps that enter the loss.
    """
    zero = torch.zeros_like(last_value)
    advantages = torch.zeros_like(rewards)
    counted = torch.zeros_like(active)
    running, pending = zero, zero
    next_value = torch.where(last_active, last_value, zero)
    unknown = ~last_active
    for t in reversed(range(rewards.shape[0])):
        ended = dones[t].unsqueeze(-1).expand_as(unknown)  # what follows is another episode
        next_value = torch.where(ended, zero, next_value)
        running = torch.where(ended, zero, running)
        pending = torch.where(ended, zero, pending)
        unknown = unknown & ~ended
        acts = active[t]
        delta = rewards[t] + pending + gamma * next_value - values[t]
        step = delta + gamma * (lam * running)  # rounds as `gae` does
        use = acts & ~unknown
        advantages[t] = torch.where(use, step, zero)
        counted[t] = use
        running = torch.where(acts, torch.where(unknown, zero, step), running)
        next_value = torch.where(acts, values[t], next_value)
        pending = torch.where(acts, zero, pending + rewards[t])
        unknown = unknown & ~acts
    return advantages, advantages + values, counted


def one_hot_ids(n: int, device: torch.device) -> torch.Tensor:
    return torch.eye(n, device=device)


def per_seed_outcomes(transition, seeds: int) -> dict[str, Any]:
    """What a transition tells of its episodes besides rewards, laid out seed first: a
    multi-objective env's reward vectors `[S, E/S, k]` (`objectives`), the ended episodes
    the learners won `[S, E/S]` (`won`) and the agents the learners play where a pool of
    snapshots plays some (`played`: group -> `[S, E/S, n]`); None where the env or the run
    has no such thing."""
    objectives, won, played = transition.objectives, transition.won, transition.played
    if objectives is not None:
        objectives = objectives.view(seeds, -1, objectives.shape[-1])
    if played is not None:
        played = {k: v.view(seeds, -1, v.shape[-1]) for k, v in played.items()}
    return {
        "objectives": objectives,
        "won": None if won is None else won.view(seeds, -1),
        "played": played,
    }


class EpisodeStats:
    """Per-agent episode returns of each seed, accumulated on the device; read once per
    iteration. Rewards `[S, E, n]` per group, done `[S, E]`.

    Where a pool of snapshots plays some of a group's agents in an episode (`played`), the
    group's return is its learners' mean return over the episodes they played, and the
    snapshots' returns count nowhere."""

    def __init__(
        self, group_sizes: dict[str, int], num_envs: int, device: torch.device, seeds: int = 1
    ):
        self.groups = group_sizes
        self.running = {
            g: torch.zeros(seeds, num_envs, n, device=device) for g, n in group_sizes.items()
        }
        # Per seed, per group and for all agents (last): the sum of episode returns (mean
        # over the learners' agents) and the episodes in it.
        self.sums = torch.zeros(seeds, len(group_sizes) + 1, device=device)
        self.counts = torch.zeros(seeds, len(group_sizes) + 1, device=device)
        self.count = torch.zeros(seeds, device=device)  # ended episodes
        self.seeds, self.num_envs, self.device = seeds, num_envs, device
        self.objectives: tuple[torch.Tensor, torch.Tensor] | None = None  # running, sums
        self.wins: torch.Tensor | None = None  # [S]: won episodes, for envs that report wins

    def record(
        self,
        rewards: dict[str, torch.Tensor],
        done: torch.Tensor,
        objectives: torch.Tensor | None = None,
        won: torch.Tensor | None = None,
        played: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """objectives: a multi-objective env's reward vectors, the mean over all agents,
        `[S, E, k]`: each objective's episode return is kept too. won `[S, E]`: the episodes
        the learners won, of those that ended (`win_rate`). played: group -> `[S, E, n]`,
        the agents the learners play in this step's episode (a group not named: all)."""
        finished = done.to(torch.float32)
        if won is not None:
            if self.wins is None:
                self.wins = torch.zeros(self.seeds, device=self.device)
            self.wins += (won.to(torch.float32) * finished).sum(-1)
        if objectives is not None:
            if self.objectives is None:
                k = objectives.shape[-1]
                self.objectives = (
                    torch.zeros(self.seeds, self.num_envs, k, device=self.device),
                    torch.zeros(self.seeds, k, device=self.device),
                )
            running, sums = self.objectives
            running += objectives
            sums += (running * finished.unsqueeze(-1)).sum(1)
            running.mul_(1.0 - finished.unsqueeze(-1))
        total = torch.zeros_like(finished)  # the learners' returns, summed over agents
        agents = torch.zeros_like(finished)  # and their number
        for index, (group, running) in enumerate(self.running.items()):
            running += rewards[group]
            mine = None if played is None else played.get(group)
            if mine is None:
                per_env, n = running.sum(-1), float(running.shape[-1])
                self.sums[:, index] += (per_env / n * finished).sum(-1)
                self.counts[:, index] += finished.sum(-1)
            else:
                weight = mine.to(torch.float32)
                per_env, n = (running * weight).sum(-1), weight.sum(-1)
                counted = finished * (n > 0)
                self.sums[:, index] += (per_env / n.clamp_min(1.0) * counted).sum(-1)
                self.counts[:, index] += counted.sum(-1)
            total += per_env
            agents += n
            running.mul_(1.0 - finished.unsqueeze(-1))
        counted = finished * (agents > 0)
        self.sums[:, -1] += (total / agents.clamp_min(1.0) * counted).sum(-1)
        self.counts[:, -1] += counted.sum(-1)
        self.count += finished.sum(-1)

    def keep(self, index: torch.Tensor) -> None:
        """Only seed rows `index` go on (`marlctl.train.compact`)."""
        self.running = {g: r.index_select(0, index) for g, r in self.running.items()}
        self.sums = self.sums.index_select(0, index)
        self.counts = self.counts.index_select(0, index)
        self.count = self.count.index_select(0, index)
        if self.wins is not None:
            self.wins = self.wins.index_select(0, index)
        if self.objectives is not None:
            self.objectives = tuple(t.index_select(0, index) for t in self.objectives)
        self.seeds = len(index)

    def reset_running(self) -> None:
        for running in self.running.values():
            running.zero_()
        if self.objectives is not None:
            self.objectives[0].zero_()

    def take(self) -> list[dict[str, float] | None]:
        """Per seed: mean per-agent return of episodes finished since the last call, or None."""
        objectives = None
        if self.objectives is not None:
            objectives = self.objectives[1].tolist()
            self.objectives[1].zero_()
        wins = None
        if self.wins is not None:
            wins = self.wins.tolist()
            self.wins.zero_()
        values = torch.cat([self.sums, self.counts, self.count.unsqueeze(-1)], -1).tolist()
        self.sums.zero_()
        self.counts.zero_()
        self.count.zero_()
        keys = [f"return/{g}" for g in self.groups] + ["return_mean"]
        out: list[dict[str, float] | None] = []
        for row in values:
            count = row[-1]
            if count == 0:
                out.append(None)
                continue
            sums, seen = row[: len(keys)], row[len(keys) : 2 * len(keys)]
            result = {k: v / n for k, v, n in zip(keys, sums, seen, strict=True) if n > 0}
            if objectives is not None:
                for k, total in enumerate(objectives[len(out)]):
                    result[f"objective/{k}"] = total / count
            if wins is not None:
                result["win_rate"] = wins[len(out)] / count
            result["episodes"] = count
            out.append(result)
        return out
