"""MAPPO and IPPO hyperparameters.

MAPPO: Yu et al. 2021, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games"
(centralised critic on the global state). IPPO: de Witt et al. 2020, "Is Independent Learning
All You Need in the StarCraft Multi-Agent Challenge?" (each agent's critic sees its own
observation). Defaults are the MAPPO paper's MPE settings (its Table 13/14).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from marlctl.algos import AlgoConfig, register_algo


class PPOConfig(AlgoConfig):
    lr: float = Field(7e-4, gt=0, le=1, description="Adam learning rate of the actors.")
    critic_lr: float | None = Field(
        None, gt=0, le=1, description="Adam learning rate of the critics; null = `lr`."
    )
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (Schulman et al. 2016).")
    clip: float = Field(0.2, gt=0, le=1, description="PPO ratio clipping epsilon.")
    value_clip: bool = Field(True, description="Clip the value update around the old value.")
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


_COMMON = dict(
    trainer="marlctl.train.ppo:PPOTrainer",
    discrete_actions=True,
    continuous_actions=True,
    on_policy=True,
    recurrent=True,
)


@register_algo(
    "mappo",
    summary="PPO with a centralised critic on the global state",
    centralised_critic=True,
    **_COMMON,
)
class MAPPOConfig(PPOConfig):
    name: Literal["mappo"] = "mappo"


@register_algo(
    "ippo",
    summary="independent PPO: each critic sees its agent's observation",
    centralised_critic=False,
    **_COMMON,
)
class IPPOConfig(PPOConfig):
    name: Literal["ippo"] = "ippo"
