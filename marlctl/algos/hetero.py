"""HAPPO, HATRPO and HASAC hyperparameters: heterogeneous-agent trust-region and
maximum-entropy learning.

Zhong et al. 2024, "Heterogeneous-Agent Reinforcement Learning" (JMLR 25): agents update
one after another in a random order, each against the policies the agents before it have
just taken, through the compounded importance weight of their ratios. HAPPO clips each
agent's surrogate as PPO does; HATRPO takes each agent's natural-gradient step inside a KL
ball, with a backtracking line search. Defaults are HARL's (`harl/configs/algos_cfgs/
happo.yaml`, `hatrpo.yaml`): 200-step rollouts, 5 actor and 5 critic epochs on one
minibatch, learning rates 5e-4, Adam's epsilon 1e-5, relu, feature normalisation, and a
network per agent (`share_param: False`), which the guarantee is about. HASAC (Liu et al.
2024) is the maximum-entropy counterpart on MASAC's critics.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from marlctl.algos import register_algo
from marlctl.algos.masac import MASACConfig
from marlctl.algos.onpolicy import OnPolicyConfig
from marlctl.algos.ppo import PPOConfig


class HeteroConfig(OnPolicyConfig):
    """What HAPPO and HATRPO share: the update order and the critic's passes."""

    # HARL: relu, feature normalisation, one network per agent.
    model_defaults: ClassVar[dict[str, Any]] = {
        **OnPolicyConfig.model_defaults,
        "activation": "relu",
        "sharing": "independent",
    }

    lr: float = Field(5e-4, gt=0, le=1, description="Adam learning rate of the actors.")
    rollout_steps: int = Field(
        200, ge=1, le=100_000, description="Steps per environment between updates."
    )
    epochs: int = Field(5, ge=1, le=100, description="Passes of each actor over each rollout.")
    critic_epochs: int = Field(
        5, ge=1, le=100, description="Passes of the critic over each rollout, after the actors."
    )
    fixed_order: bool = Field(
        False,
        description="Update the agents in their env order every iteration; false = a random "
        "order drawn each iteration (the paper's), each seed its own.",
    )


_COMMON = dict(
    discrete_actions=True,
    continuous_actions=True,
    centralised_critic=True,
    on_policy=True,
    recurrent=True,
)


@register_algo(
    "happo",
    trainer="marlctl.train.hetero:HAPPOTrainer",
    summary="heterogeneous-agent PPO: agents update in turn, weighted by those before",
    **_COMMON,
)
class HAPPOConfig(HeteroConfig, PPOConfig):
    name: Literal["happo"] = "happo"


@register_algo(
    "hatrpo",
    trainer="marlctl.train.hetero:HATRPOTrainer",
    summary="heterogeneous-agent TRPO: a KL-bounded natural-gradient step per agent in turn",
    **_COMMON,
)
class HATRPOConfig(HeteroConfig):
    name: Literal["hatrpo"] = "hatrpo"
    lr: float = Field(
        5e-4,
        gt=0,
        le=1,
        description="Adam learning rate of the critics where `critic_lr` is null; the actors' "
        "steps are sized by `kl_threshold`.",
    )
    epochs: Literal[1] = Field(
        1,
        description="One natural-gradient step per agent per rollout (the critic's passes: "
        "`critic_epochs`).",
    )
    entropy_coef: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Entropy bonus in the surrogate (HARL: none; OpenAI Baselines' TRPO: "
        "`entcoeff`).",
    )
    kl_threshold: float = Field(
        0.01, gt=0, le=10, description="Bound on the mean KL between an agent's old and new "
        "policy.",
    )  # fmt: skip
    line_search_steps: int = Field(
        10, ge=1, le=100, description="Backtracking steps before the update is dropped."
    )
    accept_ratio: float = Field(
        0.5,
        ge=0,
        le=1,
        description="A step is taken when the surrogate improves by at least this fraction of "
        "the linear prediction.",
    )
    backtrack_coef: float = Field(
        0.8, gt=0, lt=1, description="Step shrink factor per line-search step."
    )
    cg_steps: int = Field(
        10, ge=1, le=100, description="Conjugate-gradient iterations for the natural gradient."
    )
    cg_damping: float = Field(
        0.1, ge=0, le=10, description="Damping added to the Fisher-vector product."
    )
    value_clip: bool = Field(True, description="Clip the value update around the old value.")
    clip: float = Field(
        0.2, gt=0, le=1, description="Half-width of the value clipping window (`value_clip`)."
    )


@register_algo(
    "hasac",
    trainer="marlctl.train.hasac:HASACTrainer",
    summary="heterogeneous-agent soft actor-critic: agents' soft policy steps in turn",
    discrete_actions=True,
    continuous_actions=True,
    centralised_critic=True,
    on_policy=False,
    recurrent=False,
    action_dists=("tanh_normal",),
)
class HASACConfig(MASACConfig):
    """HASAC (Liu et al. 2024, "Maximum Entropy Heterogeneous-Agent Reinforcement Learning",
    ICLR): MASAC's twin centralised critics and tuned temperatures, with the actors' soft
    policy steps taken one agent after another in a random order, each against the actions
    the agents before it now take. Defaults are MASAC's but for the other agents' actions
    in each actor's Q: always their current policies' (`actor_joint_action: current`, as in
    HARL), where MASAC's default reads them from the replay batch; set MASAC's
    `actor_joint_action: current` for a baseline that differs by the sequential update
    alone. HARL's tuned MPE configurations also take 20-step returns (`algo.n_step: 20`),
    batches of 1,000 and one gradient step per 20 transitions (50 steps of 20 envs, then
    50 gradient steps: `rollout_steps: 50`, `hardware.num_envs: 20`, `updates: 50`)."""

    model_defaults: ClassVar[dict[str, Any]] = {
        **MASACConfig.model_defaults,
        "sharing": "independent",
    }
    name: Literal["hasac"] = "hasac"  # type: ignore[assignment]
    fixed_order: bool = Field(
        False,
        description="Update the agents in their env order every step; false = a random order "
        "drawn for every gradient step (the paper's), each seed its own.",
    )
    actor_joint_action: Literal["current"] = Field(  # type: ignore[assignment]
        "current",
        description="HASAC: always the other agents' current actions, as the sequential "
        "update leaves them (resampled after each agent's step).",
    )
