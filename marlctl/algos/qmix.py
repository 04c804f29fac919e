"""QMIX, VDN and IQL hyperparameters: per-agent Q-learning, mixed or not.

QMIX: Rashid et al. 2018, "QMIX: Monotonic Value Function Factorisation for Deep Multi-Agent
Reinforcement Learning". VDN: Sunehag et al. 2017, "Value-Decomposition Networks For
Cooperative Multi-Agent Learning". IQL: Tan 1993, independent Q-learners (here DQN-style,
Mnih et al. 2015). Defaults follow EPyMARL's MPE settings (Papoudakis et al. 2021) where they
apply to transition batches.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from marlctl.algos import AlgoConfig, register_algo


class OffPolicyConfig(AlgoConfig):
    """What every replay-based algorithm has."""

    lr: float = Field(5e-4, gt=0, le=1, description="Adam learning rate.")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    buffer_size: int = Field(
        200_000,
        ge=1,
        le=100_000_000,
        description="Transitions kept per seed (one transition = one env step of every agent). "
        "Stored on the run's device, or in CPU memory when it does not fit there.",
    )
    batch_size: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="Samples per gradient step: transitions, or windows of `sequence_length` "
        "steps with recurrent agents.",
    )
    learning_starts: int = Field(
        2_000, ge=0, description="Transitions collected (per seed) before the first update."
    )
    rollout_steps: int = Field(
        1, ge=1, le=100_000, description="Steps per environment between update rounds."
    )
    updates: int = Field(1, ge=1, le=100_000, description="Gradient steps per update round.")
    tau: float = Field(
        0.005, gt=0, le=1, description="Polyak rate of the target networks per gradient step."
    )
    max_grad_norm: float = Field(10.0, gt=0, description="Global gradient-norm clip.")
    checkpoint_replay: bool = Field(
        True,
        description="Save the replay buffer with each checkpoint, so a resumed run samples "
        "what it would have; false = small checkpoints, and a resumed run refills the buffer.",
    )


class QLearningConfig(OffPolicyConfig):
    double_q: bool = Field(
        True, description="Pick next actions with the online network, value them with the target."
    )
    epsilon_start: float = Field(1.0, ge=0, le=1, description="Exploration rate at the start.")
    epsilon_end: float = Field(0.05, ge=0, le=1, description="Exploration rate after annealing.")
    epsilon_anneal_steps: int = Field(
        50_000, ge=0, description="Env steps over which epsilon falls linearly to its end value."
    )
    sequence_length: int = Field(
        25, ge=2, le=10_000, description="Steps per training window of recurrent agents."
    )


_COMMON = dict(
    trainer="marlctl.train.qmix:QLearningTrainer",
    discrete_actions=True,
    continuous_actions=False,
    on_policy=False,
    recurrent=True,
)


@register_algo(
    "qmix",
    summary="per-agent Q mixed monotonically by hypernetworks on the global state",
    centralised_critic=True,
    **_COMMON,
)
class QMIXConfig(QLearningConfig):
    name: Literal["qmix"] = "qmix"
    mixer_embed: int = Field(32, ge=1, le=4096, description="Width of the mixing network.")
    hypernet_hidden: int = Field(
        64, ge=1, le=4096, description="Hidden width of the hypernetworks that emit its weights."
    )


@register_algo(
    "vdn",
    summary="per-agent Q summed into the joint value",
    centralised_critic=False,
    **_COMMON,
)
class VDNConfig(QLearningConfig):
    name: Literal["vdn"] = "vdn"


@register_algo(
    "iql",
    summary="independent Q-learning: each agent learns its own Q from its own reward",
    centralised_critic=False,
    **_COMMON,
)
class IQLConfig(QLearningConfig):
    name: Literal["iql"] = "iql"
