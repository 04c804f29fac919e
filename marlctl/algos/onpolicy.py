"""What every on-policy algorithm shares: rollouts, GAE, advantage normalisation, the
optimiser and its schedule.

The trainer side is `marlctl.train.onpolicy.OnPolicyTrainer`; an on-policy algorithm's
config subclasses `OnPolicyConfig` and adds the fields of its own update.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from marlctl.algos import AlgoConfig


class OnPolicyConfig(AlgoConfig):
    """Defaults are the MAPPO paper's MPE settings (Yu et al. 2021, Table 13/14)."""

    model_defaults: ClassVar[dict[str, Any]] = {
        **AlgoConfig.model_defaults,
        "action_dist": "normal",
    }

    lr: float = Field(7e-4, gt=0, le=1, description="Adam learning rate of the actors.")
    critic_lr: float | None = Field(
        None, gt=0, le=1, description="Adam learning rate of the critics; null = `lr`."
    )
    adam_eps: float = Field(1e-5, gt=0, le=1, description="Adam's epsilon (MAPPO: 1e-5).")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (Schulman et al. 2016).")
    epochs: int = Field(10, ge=1, le=100, description="Passes over each rollout.")
    minibatches: int = Field(1, ge=1, le=1024, description="Minibatches per epoch.")
    rollout_steps: int = Field(
        25, ge=1, le=100_000, description="Steps per environment between updates."
    )
    entropy_coef: float = Field(0.01, ge=0, le=1, description="Entropy bonus weight.")
    value_coef: float = Field(1.0, ge=0, le=100, description="Value loss weight.")
    max_grad_norm: float = Field(10.0, gt=0, description="Global gradient-norm clip.")
    huber_delta: float | None = Field(
        10.0, gt=0, description="Huber loss delta for the critic; null = squared error."
    )
    value_norm: bool = Field(True, description="Normalise value targets by running statistics.")
    normalize_advantages: bool = Field(
        True, description="Standardise advantages over each rollout, per agent group."
    )
    anneal_lr: bool = Field(False, description="Decay learning rates linearly to zero.")
    bootstrap_time_limit: bool = Field(
        True,
        description="Bootstrap GAE through an episode cut by the env's time limit (the value of "
        "its final observation counts; HARL's `use_proper_time_limits`); false = a time limit "
        "ends the return like a termination, as the MAPPO code's default and TorchRL's VMAS "
        "envs (BenchMARL) do.",
    )
