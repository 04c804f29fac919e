"""What every replay-based algorithm shares: buffer, batches, targets, reward scaling.

The trainer side is `marlctl.train.offpolicy.OffPolicyTrainer`; an algorithm's config
subclasses `OffPolicyConfig` and adds its own fields.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from marlctl.algos import AlgoConfig


class OffPolicyConfig(AlgoConfig):
    """What every replay-based algorithm has. Defaults are EPyMARL's (`src/config/default.yaml`
    and `src/config/algs/*.yaml` of uoe-agents/epymarl) translated from episode batches to
    transition batches."""

    model_defaults: ClassVar[dict[str, Any]] = {
        **AlgoConfig.model_defaults,
        "activation": "relu",
        "layer_norm": False,
    }
    lr: float = Field(5e-4, gt=0, le=1, description="Adam learning rate (EPyMARL: 5e-4).")
    adam_eps: float = Field(1e-8, gt=0, le=1, description="Adam's epsilon (PyTorch's default).")
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
        "steps with recurrent agents. 256 as SAC; EPyMARL samples 32 whole episodes (800 "
        "transitions on MPE) once per episode collected.",
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
    target_update_every: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Gradient steps between hard copies of the networks into their targets "
        "(EPyMARL's QMIX: 200); 0 = Polyak averaging with `tau` after every gradient step.",
    )
    reward_scaling: Literal["standardise", "scale", "none"] = Field(
        "standardise",
        description="How sampled rewards are normalised, per agent group and seed, by running "
        "statistics of the collected rewards: standardise = subtract the mean and divide by "
        "the standard deviation (EPyMARL's `standardise_rewards`); scale = divide only, which "
        "keeps the optimal policy of tasks whose episodes can terminate early; none = raw.",
    )
    max_grad_norm: float = Field(10.0, gt=0, description="Global gradient-norm clip (EPyMARL: 10).")
    bootstrap_time_limit: bool = Field(
        True,
        description="Bootstrap targets through an episode cut by the env's time limit (the "
        "value of its final state counts); false = a time limit ends the return like a "
        "termination, as EPyMARL and JaxMARL do, which keeps values within the episode.",
    )
    n_step: int = Field(
        1,
        ge=1,
        le=100,
        description="Rewards summed into each target: r_t + ... + gamma^(m-1) r_(t+m-1) + "
        "gamma^m (value after step t+m-1), m = n_step or fewer where the episode ends first "
        "(HARL's `n_step`: 20 for HASAC on MPE). Feed-forward agents only.",
    )
    checkpoint_replay: bool = Field(
        True,
        description="Save the replay buffer with each checkpoint, so a resumed run samples "
        "what it would have; false = small checkpoints, and a resumed run refills the buffer.",
    )
