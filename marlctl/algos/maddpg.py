"""MADDPG and MATD3 hyperparameters.

MADDPG: Lowe et al. 2017, "Multi-Agent Actor-Critic for Mixed Cooperative-Competitive
Environments" (deterministic actors, one centralised critic per agent over every agent's
observation and action, Gumbel-softmax for discrete actions, optional policy ensembles).
MATD3: Ackermann et al. 2019, "Reducing Overestimation Bias in Multi-Agent Domains Using
Double Centralized Critics" (TD3's twin critics, target policy smoothing and delayed actor
updates, Fujimoto et al. 2018, applied to MADDPG).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from marlctl.algos import register_algo
from marlctl.algos.offpolicy import OffPolicyConfig


class DDPGFamilyConfig(OffPolicyConfig):
    """Defaults: EPyMARL's `maddpg.yaml` (uoe-agents/epymarl): learning rate 5e-4 for actors
    and critics, Polyak rate 0.01, actor regularisation 1e-3, standardised rewards."""

    # Two critics per agent, the smaller of their targets taken (MATD3's, TD3's).
    twin: ClassVar[bool] = False

    lr: float = Field(5e-4, gt=0, le=1, description="Adam learning rate of the actors.")
    critic_lr: float = Field(5e-4, gt=0, le=1, description="Adam learning rate of the critics.")
    tau: float = Field(
        0.01, gt=0, le=1, description="Polyak rate of the target networks per gradient step."
    )
    exploration_noise: float = Field(
        0.1,
        ge=0,
        le=10,
        description="Continuous actions: std of the Gaussian noise added while collecting, "
        "relative to half the action range.",
    )
    exploration_noise_end: float | None = Field(
        None,
        ge=0,
        le=10,
        description="Continuous actions: the noise std reached after `noise_anneal_steps`, "
        "annealed linearly from `exploration_noise` (TorchRL's AdditiveGaussianModule, as "
        "BenchMARL uses it); null = constant `exploration_noise`.",
    )
    noise_anneal_steps: int = Field(
        0, ge=0, description="Env steps over which the exploration noise is annealed."
    )
    gumbel_temperature: float = Field(
        1.0, gt=0, le=100, description="Discrete actions: Gumbel-softmax temperature."
    )
    policy_regularization: float = Field(
        1e-3,
        ge=0,
        le=10,
        description="Weight of the squared actor outputs in the actor loss (as in the MADDPG "
        "code): keeps logits and pre-tanh means from saturating.",
    )
    actor_joint_action: Literal["sampled", "current"] = Field(
        "sampled",
        description="The other agents' actions in each actor's Q: sampled = as stored in the "
        "replay batch, each actor's gradient through its own action only (the MADDPG paper, "
        "eq. 5); current = every agent's action from its current actor, each actor's gradient "
        "through all of them (TorchRL's DDPGLoss, as BenchMARL trains MADDPG).",
    )
    target_actor: bool = Field(
        True,
        description="The next action in the critics' TD target from a Polyak-averaged copy of "
        "the actors (the MADDPG paper); false = from the current actors (TorchRL's DDPGLoss "
        "with delay_actor false, as BenchMARL trains MADDPG).",
    )
    ensemble: int = Field(
        1,
        ge=1,
        le=64,
        description="Sub-policies per agent (MADDPG §4.3): one is drawn at random for each "
        "episode, and each trains on the transitions it collected.",
    )


_COMMON = dict(
    discrete_actions=True,
    continuous_actions=True,
    centralised_critic=True,
    on_policy=False,
    recurrent=False,
)


@register_algo(
    "maddpg",
    trainer="marlctl.train.maddpg:MADDPGTrainer",
    summary="deterministic actors, a centralised critic per agent on all actions",
    **_COMMON,
)
class MADDPGConfig(DDPGFamilyConfig):
    name: Literal["maddpg"] = "maddpg"


@register_algo(
    "matd3",
    trainer="marlctl.train.maddpg:MADDPGTrainer",
    summary="MADDPG with twin critics, target smoothing and delayed actor updates",
    **_COMMON,
)
class MATD3Config(DDPGFamilyConfig):
    twin: ClassVar[bool] = True
    name: Literal["matd3"] = "matd3"
    policy_delay: int = Field(2, ge=1, le=100, description="Critic updates per actor update.")
    target_noise: float = Field(
        0.2,
        ge=0,
        le=10,
        description="Target policy smoothing: std of the Gaussian noise on continuous target "
        "actions; discrete target actions are sampled from softmax(logits / target_noise).",
    )
    target_noise_clip: float = Field(
        0.5, ge=0, le=10, description="The smoothing noise is clipped to ± this."
    )
