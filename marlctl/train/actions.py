"""What every algorithm does with actions and observations, written once.

Action masks (a masked action is never chosen and has probability zero), means over the
agents that act, continuous actions between the env's bounds and [-1, 1], uniform random
actions over the allowed ones, and observations flattened for the networks. Each guard
(an agent with no allowed action left, an unbounded action dimension) lives here, so every
algorithm has it.

Tensors are seed first, `[S, ..., n, ...]`; masks are bool, True where an action is allowed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.distributions import Normal

from marlctl.envs.info import GroupInfo


def flat_obs(obs: torch.Tensor, group: GroupInfo) -> torch.Tensor:
    """`[..., *obs_shape]` -> `[..., obs_dim]`: what the networks take."""
    return obs.flatten(start_dim=obs.dim() - len(group.obs_shape))


def mask_logits(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Logits (or Q values) with masked actions at the lowest finite value: never the argmax,
    probability zero under a softmax, and no inf to turn into NaN."""
    if mask is None:
        return logits
    return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)


def masked_log_softmax(
    logits: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities and log-probabilities; a masked action has probability 0 and log 0,
    so `probs * log_probs` is 0 there rather than 0 * -inf = NaN."""
    log_probs = F.log_softmax(mask_logits(logits, mask), -1)
    if mask is None:
        return log_probs.exp(), log_probs
    log_probs = torch.where(mask, log_probs, torch.zeros_like(log_probs))
    return log_probs.exp() * mask, log_probs


def masked_mean(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Per-seed mean of x `[S, ...]` over the entries where `weight` (0 or 1, x's shape) is
    1: agents that act, samples that count. A seed with none gives 0, not NaN."""
    dims = tuple(range(1, x.dim()))
    return (x * weight).sum(dims) / weight.sum(dims).clamp_min(1.0)


def uniform_probs(mask: torch.Tensor | None, shape: torch.Size, device) -> torch.Tensor:
    """Uniform probabilities over the allowed actions, `shape` = `[..., n_actions]`. An agent
    with no allowed action (one that has left) gets all zeros; sampling then picks the last."""
    allowed = torch.ones(shape, device=device) if mask is None else mask.to(torch.float32)
    return allowed / allowed.sum(-1, keepdim=True).clamp_min(1.0)


def one_hot(action: torch.Tensor, group: GroupInfo) -> torch.Tensor:
    return F.one_hot(action, group.n_actions).to(torch.float32)


class ActionBounds:
    """A continuous group's action box, and the map between it and [-1, 1] (what tanh
    policies output and centralised critics take). An unbounded dimension acts in [-1, 1]."""

    def __init__(self, group: GroupInfo, device: torch.device):
        low = torch.tensor(group.action_low, dtype=torch.float32, device=device)
        high = torch.tensor(group.action_high, dtype=torch.float32, device=device)
        finite = low.isfinite() & high.isfinite() & (high > low)
        self.low, self.high = low.where(finite, -1.0), high.where(finite, 1.0)
        # log of the box's half widths: the Jacobian of the map from [-1, 1] onto it.
        self.log_half_range = torch.log(0.5 * (self.high - self.low))

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """[-1, 1] -> the env's bounds."""
        return self.low + (action + 1.0) * 0.5 * (self.high - self.low)

    def squash(self, u: torch.Tensor) -> torch.Tensor:
        """An unbounded sample -> the env's bounds, through tanh (a TanhNormal's action)."""
        return self.to_env(torch.tanh(u))

    def from_env(self, action: torch.Tensor) -> torch.Tensor:
        """The env's bounds -> [-1, 1] (clamped: a stored action may sit on the bound)."""
        return (2.0 * (action - self.low) / (self.high - self.low) - 1.0).clamp(-1.0, 1.0)


def action_bounds(groups, device: torch.device) -> dict[str, ActionBounds]:
    """The bounds of every continuous group, by name."""
    return {g.name: ActionBounds(g, device) for g in groups if not g.discrete}


def tanh_log_det(u: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh(u)^2), elementwise: the log-Jacobian of tanh, written so it stays finite
    where tanh(u) rounds to +-1 (SAC's appendix C)."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


# TorchRL's `biased_softplus_1.0`: softplus(x + b) + 0.01, with b such that x = 0 gives 1.
_MIN_SCALE = 0.01
_SCALE_BIAS = math.log(math.expm1(1.0 - _MIN_SCALE))


def softplus_scale(raw: torch.Tensor) -> torch.Tensor:
    """A network's raw output -> a positive scale, 1.0 at 0 and never below 0.01."""
    return F.softplus(raw + _SCALE_BIAS) + _MIN_SCALE


class TanhNormal:
    """N(loc, scale) squashed by tanh into [-1, 1], then mapped onto the action box
    (TorchRL's TanhNormal). A sample is kept before the squash, `u`, so that its
    log-probability is exact (no atanh of a value that rounded to +-1): the env receives
    `bounds.squash(u)`. `mean` and `stddev` are the Gaussian's, in u."""

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, bounds: ActionBounds):
        self.base, self.bounds = Normal(loc, scale), bounds

    @property
    def mean(self) -> torch.Tensor:
        return self.base.mean

    @property
    def stddev(self) -> torch.Tensor:
        return self.base.stddev

    def log_prob(self, u: torch.Tensor) -> torch.Tensor:
        """Per dimension, of the action `bounds.squash(u)` (sum over the last dim for the
        joint)."""
        return self.base.log_prob(u) - tanh_log_det(u) - self.bounds.log_half_range

    def entropy(self, noise: torch.Tensor) -> torch.Tensor:
        """Per dimension, estimated with one reparameterised sample (`noise` ~ N(0, 1) of the
        loc's shape): there is no closed form after the squash. Differentiable in loc and
        scale."""
        u = self.base.mean + self.base.stddev * noise
        return self.base.entropy() + tanh_log_det(u) + self.bounds.log_half_range
