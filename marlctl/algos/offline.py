"""Offline algorithms: trained from a recorded dataset (the spec's `data`), never from the env,
which they play only to be evaluated. A run counts gradient steps (`train.total_updates`).

Behaviour cloning, and IQL and QMIX with Conservative Q-Learning's penalty (Kumar et al.
2020, "Conservative Q-Learning for Offline Reinforcement Learning"), as Off-the-Grid MARL
(Formanek et al. 2023) runs them: its `discrete_bc`, `iql_cql` and `qmix_cql` systems and
configs (instadeepai/og-marl, `og_marl/tf2/systems/`): feed-forward agents on transitions,
or, for `bc`, `iql_cql`, `qmix_cql` and `maicq`, recurrent ones on sequences as OG-MARL
trains them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from marlctl.algos import AlgoConfig, register_algo
from marlctl.algos.maddpg import DDPGFamilyConfig
from marlctl.algos.qmix import QLearningConfig, QMIXConfig

UPDATES = Field(
    100,
    ge=1,
    le=100_000,
    description="Gradient steps per iteration: the grain at which a run counts its budget, "
    "logs and is stopped.",
)
BATCH = Field(
    256, ge=1, le=1_000_000, description="Transitions sampled from the dataset per gradient step."
)
SEQUENCE = Field(
    20,
    ge=2,
    le=10_000,
    description="Recurrent agents (`model.recurrent`): consecutive steps per sampled window "
    "(OG-MARL: 20), its state starting at zeros and reset where an episode starts.",
)
StateScaling = Literal["standardise", "clipped", "range", "none"]


def state_scaling_field(default: StateScaling) -> Any:
    return Field(
        default,
        description="How the centralised networks (mixer, critics) read the global state, by "
        "statistics of the dataset's recorded states computed when it is loaded: standardise "
        "= each feature less its mean, divided by its standard deviation; clipped = "
        "standardised, then bounded to 5 standard deviations either side (the rare states "
        "far out in a feature's tail read as 5); range = each "
        "feature mapped linearly from its minimum and maximum to -1 and 1 (bounded, as "
        "SMAC's env-normalised state is; a next state past an episode's last recorded step "
        "may fall outside); a feature constant in the dataset reads 0; none = as recorded. "
        "An env's state whose features span tens of units (SMAX's positions and cooldowns) "
        "can otherwise drive a mixer's hypernetworks to diverge.",
    )


class OwnNetworksConfig(AlgoConfig):
    """What the offline learners with networks of their own (not a replay learner's) share:
    relu without LayerNorm, as OG-MARL's networks, and Adam with a gradient-norm clip."""

    model_defaults: ClassVar[dict[str, Any]] = {
        **AlgoConfig.model_defaults,
        "activation": "relu",
        "layer_norm": False,
    }
    adam_eps: float = Field(1e-8, gt=0, le=1, description="Adam's epsilon.")
    batch_size: int = BATCH
    updates: int = UPDATES
    max_grad_norm: float = Field(10.0, gt=0, description="Global gradient-norm clip.")


@register_algo(
    "bc",
    trainer="marlctl.train.offline:BCTrainer",
    summary="behaviour cloning: each agent's policy learns the dataset's actions",
    discrete_actions=True,
    continuous_actions=True,
    centralised_critic=False,
    on_policy=False,
    recurrent=True,
    offline=True,
)
class BCConfig(OwnNetworksConfig):
    """Off-the-Grid MARL's `discrete_bc.yaml`: Adam at 1e-3, the actions of the dataset's
    agents as labels."""

    name: Literal["bc"] = "bc"
    lr: float = Field(1e-3, gt=0, le=1, description="Adam learning rate (OG-MARL: 1e-3).")
    sequence_length: int = SEQUENCE


class OfflineQConfig(QLearningConfig):
    """The Q-learners' fields with Off-the-Grid MARL's offline values: Adam at 3e-4, discount
    0.99, targets copied every 200 gradient steps, a conservative penalty weighted 3. The
    exploration schedule plays no part (no env is explored); `epsilon_end` is the rate of
    evaluation with sampled actions."""

    lr: float = Field(3e-4, gt=0, le=1, description="Adam learning rate (OG-MARL: 3e-4).")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor (OG-MARL: 0.99).")
    batch_size: int = BATCH
    updates: int = UPDATES
    learning_starts: int = Field(0, ge=0, description="Unused offline: the dataset is whole.")
    cql_weight: float = Field(
        3.0,
        ge=0,
        le=1_000,
        description="Weight of the conservative penalty logsumexp Q - Q(dataset action) in "
        "the loss (OG-MARL's `cql_weight`: 3); 0 = plain offline Q-learning.",
    )


_COMMON = dict(
    trainer="marlctl.train.offline:CQLTrainer",
    discrete_actions=True,
    continuous_actions=False,
    on_policy=False,
    recurrent=True,
    offline=True,
)


@register_algo(
    "iql_cql",
    summary="independent Q-learners with a conservative penalty on each agent's Q",
    centralised_critic=False,
    **_COMMON,
)
class IQLCQLConfig(OfflineQConfig):
    mixing: ClassVar[str] = "none"
    name: Literal["iql_cql"] = "iql_cql"


@register_algo(
    "qmix_cql",
    summary="QMIX with a conservative penalty on the mixed Q of sampled joint actions",
    centralised_critic=True,
    **_COMMON,
)
class QMIXCQLConfig(OfflineQConfig, QMIXConfig):
    name: Literal["qmix_cql"] = "qmix_cql"
    state_scaling: StateScaling = state_scaling_field("standardise")
    ood_actions: int = Field(
        20,
        ge=1,
        le=1_000,
        description="Random joint actions whose mixed Q enters the penalty's logsumexp beside "
        "the dataset's (OG-MARL's `num_ood_actions`: 20).",
    )


@register_algo(
    "maddpg_cql",
    trainer="marlctl.train.offline:MADDPGCQLTrainer",
    summary="MADDPG with twin critics and a conservative penalty on sampled joint actions",
    discrete_actions=False,
    continuous_actions=True,
    centralised_critic=True,
    on_policy=False,
    recurrent=False,
    offline=True,
)
class MADDPGCQLConfig(DDPGFamilyConfig):
    """Off-the-Grid MARL's `maddpg_cql.yaml`: Adam at 1e-3 for actors and critics, Polyak
    rate 0.01, discount 0.99, twin critics, and CQL(H)'s penalty weighted 5 over 10 samples
    of each kind of joint action, the policy's perturbed by noise of std 0.2."""

    twin: ClassVar[bool] = True
    name: Literal["maddpg_cql"] = "maddpg_cql"
    state_scaling: StateScaling = state_scaling_field("standardise")
    lr: float = Field(1e-3, gt=0, le=1, description="Adam learning rate of the actors.")
    critic_lr: float = Field(1e-3, gt=0, le=1, description="Adam learning rate of the critics.")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor (OG-MARL: 0.99).")
    batch_size: int = BATCH
    updates: int = UPDATES
    learning_starts: int = Field(0, ge=0, description="Unused offline: the dataset is whole.")
    target_noise: float = Field(
        0.0, ge=0, le=10, description="Target policy smoothing's noise std; 0 = none (OG-MARL)."
    )
    target_noise_clip: float = Field(0.5, ge=0, le=10, description="The smoothing's clip.")
    cql_weight: float = Field(
        5.0,
        ge=0,
        le=1_000,
        description="Weight of the conservative penalty in each critic's loss (OG-MARL: 5); "
        "0 = plain offline MADDPG with twin critics.",
    )
    ood_actions: int = Field(
        10,
        ge=1,
        le=1_000,
        description="Samples of each kind of joint action in the penalty's logsumexp: uniform "
        "random ones, the policy's at the state and the policy's at the next state, both "
        "perturbed (OG-MARL's `num_ood_actions`: 10).",
    )
    cql_sigma: float = Field(
        0.2, gt=0, le=10, description="Std of the noise on the policy's joint actions (OG-MARL)."
    )


@register_algo(
    "maicq",
    trainer="marlctl.train.maicq:MAICQTrainer",
    summary="implicit constraint Q-learning: in-sample QMIX targets, advantage-weighted actors",
    discrete_actions=True,
    continuous_actions=False,
    centralised_critic=True,
    on_policy=False,
    recurrent=True,
    offline=True,
)
class MAICQConfig(OwnNetworksConfig):
    """Off-the-Grid MARL's `maicq.yaml` (Yang et al. 2021, "Believe What You See: Implicit
    Constraint Approach for Offline Multi-Agent Reinforcement Learning"): Adam at 3e-4,
    discount 0.99, targets copied every 200 gradient steps, a QMIX mixer of width 32 with
    hypernetworks of 64, advantage temperature 0.1 and target temperature 1000."""

    name: Literal["maicq"] = "maicq"
    # Its in-sample target weights each Q_tot by a batch softmax of Q_tot itself, so a mixer
    # output inflated on a state feature far out in its tail feeds on itself; a standardised
    # state keeps such tails (SMAX 3m's Medium-Replay: features 10 to 20 standard deviations
    # out, and there the critic diverged), a clipped one bounds them and keeps the resolution
    # that range scaling gives up where most states crowd one end of a feature's range.
    state_scaling: StateScaling = state_scaling_field("clipped")
    sequence_length: int = SEQUENCE
    lr: float = Field(3e-4, gt=0, le=1, description="Adam learning rate of every network.")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    target_update_every: int = Field(
        200, ge=1, le=1_000_000, description="Gradient steps between copies into the targets."
    )
    mixer_embed: int = Field(32, ge=1, le=4096, description="Width of the mixing network.")
    hypernet_hidden: int = Field(
        64, ge=1, le=4096, description="Hidden width of the mixer's hypernetworks."
    )
    advantage_beta: float = Field(
        0.1,
        gt=0,
        le=1_000,
        description="Temperature of the actors' weights: each agent's dataset action is "
        "cloned with weight softmax over the batch of advantage / advantage_beta (OG-MARL's "
        "`icq_advantages_beta`).",
    )
    target_beta: float = Field(
        1000.0,
        gt=0,
        le=1e9,
        description="Temperature of the in-sample target's weights: softmax over the batch of "
        "the next joint action's Q_tot / target_beta (OG-MARL's `icq_target_q_taken_beta`).",
    )
