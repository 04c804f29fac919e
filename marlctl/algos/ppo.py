"""MAPPO and IPPO hyperparameters.

MAPPO: Yu et al. 2021, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games"
(centralised critic on the global state). IPPO: de Witt et al. 2020, "Is Independent Learning
All You Need in the StarCraft Multi-Agent Challenge?" (each agent's critic sees its own
observation). Defaults are the MAPPO paper's MPE settings (its Table 13/14).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from marlctl.algos import register_algo
from marlctl.algos.onpolicy import OnPolicyConfig


class PPOConfig(OnPolicyConfig):
    """The clipped surrogate objective (Schulman et al. 2017) and MAPPO's value clipping."""

    row_fields: ClassVar[tuple[str, ...]] = (
        "lr", "critic_lr", "gamma", "gae_lambda", "entropy_coef", "value_coef", "clip",
        "max_grad_norm",
    )  # fmt: skip
    clip: float = Field(0.2, gt=0, le=1, description="PPO ratio clipping epsilon.")
    value_clip: bool = Field(True, description="Clip the value update around the old value.")


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
