"""Pieces shared by algorithms: batched MLPs, running normalisers, advantage estimation."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"tanh": torch.tanh, "relu": F.relu, "elu": F.elu, "gelu": F.gelu, "silu": F.silu}


class BatchedMLP(nn.Module):
    """`copies` independent MLPs applied to `[B, copies, in]` in one batched matmul per layer.

    copies == 1 is one network shared by every agent of the group (input `[B, n, in]`);
    copies == n gives each agent its own weights without a Python loop over agents.
    """

    def __init__(
        self,
        copies: int,
        n_in: int,
        hidden: list[int],
        n_out: int,
        activation: str,
        layer_norm: bool,
        out_gain: float,
    ):
        super().__init__()
        self.copies, self.activation = copies, ACTIVATIONS[activation]
        sizes = [n_in, *hidden, n_out]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for index, (a, b) in enumerate(itertools.pairwise(sizes)):
            gain = out_gain if index == len(sizes) - 2 else math.sqrt(2)
            weight = torch.empty(copies, b, a)
            for k in range(copies):
                nn.init.orthogonal_(weight[k], gain)
            self.weights.append(nn.Parameter(weight.transpose(1, 2).contiguous()))
            self.biases.append(nn.Parameter(torch.zeros(copies, b)))
        self.norm = nn.Parameter(torch.ones(copies, n_in)) if layer_norm else None
        self.norm_bias = nn.Parameter(torch.zeros(copies, n_in)) if layer_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., n, in] -> [..., n, out]."""
        if self.norm is not None:
            x = F.layer_norm(x, x.shape[-1:]) * self.norm + self.norm_bias
        last = len(self.weights) - 1
        for index, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            if self.copies == 1:  # one fused multiply-add over every row
                x = torch.addmm(b[0], x.reshape(-1, x.shape[-1]), w[0]).view(*x.shape[:-1], -1)
            else:
                x = torch.einsum("...ni,nio->...no", x, w) + b
            if index < last:
                x = self.activation(x)
        return x


class RunningMeanStd(nn.Module):
    """Mean and variance over everything seen (Chan et al. parallel update), kept as buffers."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(epsilon))

    @torch.no_grad()
    def update(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        w = torch.ones_like(x) if weight is None else weight.to(x.dtype)
        count = w.sum().clamp_min(1.0)
        mean = (x * w).sum() / count
        var = ((x - mean) ** 2 * w).sum() / count
        delta, total = mean - self.mean, self.count + count
        self.mean += delta * count / total
        self.var.copy_(
            (self.var * self.count + var * count + delta**2 * self.count * count / total) / total
        )
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / torch.sqrt(self.var + 1e-8)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sqrt(self.var + 1e-8) + self.mean


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
        running = delta + gamma * lam * keep * running
        advantages[t] = running
        next_value = values[t]
    return advantages, advantages + values


def one_hot_ids(n: int, device: torch.device) -> torch.Tensor:
    return torch.eye(n, device=device)


class EpisodeStats:
    """Per-agent episode returns accumulated on the device; read once per iteration."""

    def __init__(self, group_sizes: dict[str, int], num_envs: int, device: torch.device):
        self.groups = group_sizes
        self.running = {g: torch.zeros(num_envs, n, device=device) for g, n in group_sizes.items()}
        self.sums = torch.zeros(len(group_sizes) + 1, device=device)  # per group, then all agents
        self.count = torch.zeros((), device=device)

    def record(self, rewards: dict[str, torch.Tensor], done: torch.Tensor) -> None:
        finished = done.to(torch.float32)
        total_agents = sum(self.groups.values())
        all_agents = torch.zeros_like(finished)
        for index, (group, running) in enumerate(self.running.items()):
            running += rewards[group]
            per_env = running.sum(-1)
            self.sums[index] += (per_env / running.shape[-1] * finished).sum()
            all_agents += per_env
            running.mul_(1.0 - finished.unsqueeze(-1))
        self.sums[-1] += (all_agents / total_agents * finished).sum()
        self.count += finished.sum()

    def reset_running(self) -> None:
        for running in self.running.values():
            running.zero_()

    def take(self) -> dict[str, float] | None:
        """Mean per-agent return of episodes finished since the last call, or None."""
        values = torch.cat([self.sums, self.count.unsqueeze(0)]).tolist()
        self.sums.zero_()
        self.count.zero_()
        count = values[-1]
        if count == 0:
            return None
        out = {f"return/{g}": values[i] / count for i, g in enumerate(self.groups)}
        out["return_mean"] = values[len(self.groups)] / count
        out["episodes"] = count
        return out
