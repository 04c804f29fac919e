"""Template: the typed config of a new algorithm (copy to `marlctl/algos/<name>.py`).

A policy gradient with a learned baseline: one gradient step per rollout on every sample
of it, no ratio and no clipping (Williams 1992; with a critic as baseline, the A2C update
of Mnih et al. 2016). Its trainer is `algo_trainer.py`.

The config module imports no torch: `marlctl validate` and `--dry-run` read it to check
a spec without loading any training code.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from marlctl.algos import register_algo
from marlctl.algos.onpolicy import OnPolicyConfig


@register_algo(
    "pg",
    # In the package: "marlctl.train.<name>:PGTrainer".
    trainer="algo_trainer:PGTrainer",
    summary="policy gradient with a learned baseline, one step per rollout",
    discrete_actions=True,
    continuous_actions=True,
    centralised_critic=True,  # the critic sees the global state
    on_policy=True,
    recurrent=True,
)
class PGConfig(OnPolicyConfig):
    # The fields every on-policy algorithm has (rollout_steps, gamma, gae_lambda, lr,
    # entropy_coef, ...) come from OnPolicyConfig; change a default by declaring it again.
    name: Literal["pg"] = "pg"
    rollout_steps: int = Field(
        5, ge=1, le=100_000, description="Steps per environment between updates."
    )
    gae_lambda: float = Field(
        1.0, ge=0, le=1, description="GAE lambda; 1 = n-step returns as in A2C."
    )
