"""MASAC hyperparameters: multi-agent soft actor-critic with centralised twin critics.

SAC: Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications" (maximum-entropy
RL, clipped double Q, automatic temperature tuning towards a target entropy). Discrete
actions: Christodoulou 2019, "Soft Actor-Critic for Discrete Action Settings" (the critic
values every action, expectations over the policy replace sampling, the target entropy is a
fraction of the maximum, log |A|). The critics are centralised as in MADDPG (Lowe et al.
2017): each agent's critic sees the global state and every agent's action. Defaults are the
SAC paper's (tau 0.005, batch 256, two critics, initial temperature 0.2), EPyMARL's learning
rate (5e-4) and reward standardisation, and BenchMARL's discrete entropy target
(`benchmarl/conf/algorithm/masac.yaml`: `discrete_target_entropy_weight: 0.2`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from marlctl.algos import register_algo
from marlctl.algos.offpolicy import OffPolicyConfig


@register_algo(
    "masac",
    trainer="marlctl.train.masac:MASACTrainer",
    summary="soft actor-critic: stochastic actors, centralised twin critics, tuned entropy",
    discrete_actions=True,
    continuous_actions=True,
    centralised_critic=True,
    on_policy=False,
    recurrent=False,
    action_dists=("tanh_normal",),
)
class MASACConfig(OffPolicyConfig):
    name: Literal["masac"] = "masac"
    lr: float = Field(5e-4, gt=0, le=1, description="Adam learning rate of the actors.")
    critic_lr: float = Field(5e-4, gt=0, le=1, description="Adam learning rate of the critics.")
    alpha_lr: float = Field(
        5e-4, gt=0, le=1, description="Adam learning rate of the log-temperatures."
    )
    initial_alpha: float = Field(
        0.2, gt=0, le=100, description="Entropy temperature at the start (each group's own)."
    )
    autotune: bool = Field(
        True,
        description="Tune each group's temperature towards the target entropy (SAC v2); "
        "false = keep `initial_alpha`.",
    )
    share_critic: bool = Field(
        False,
        description="Agents of a group share one critic (their agent id appended), as "
        "`model.sharing` lets actors share; false = a critic per agent, as in MADDPG (Lowe et "
        "al. 2017). A critic that values each of its agent's own actions must then tell the "
        "agents apart by id alone: shared, it did not learn MPE simple_spread (-20.5 per "
        "agent at 250k env steps, 3 seeds, as `bench/results/algorithms.jsonl` records); a "
        "critic per agent reaches -12.8 at 1M (5 seeds, `bench/results/baseline-mpe.md`).",
    )
    actor_joint_action: Literal["sampled", "current"] = Field(
        "sampled",
        description="The other agents' actions in each actor's Q: sampled = as stored in the "
        "replay batch (MADDPG's actor update); current = drawn from every agent's current "
        "policy, continuous samples reparameterised so that each actor's gradient runs "
        "through all of them (TorchRL's SACLoss on a group, as BenchMARL trains MASAC).",
    )
    # Christodoulou's 0.98 keeps a 5-action policy almost uniform (max entropy 1.609, target
    # 1.577) and its temperature grows without bound; BenchMARL's 0.2 lets the policy commit.
    target_entropy_scale: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Discrete actions: target entropy as a fraction of the maximum, "
        "log(allowed actions) (BenchMARL: 0.2; Christodoulou 2019: 0.98). Continuous: the "
        "target is -action_dim.",
    )
