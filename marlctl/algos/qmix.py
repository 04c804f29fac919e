"""QMIX, VDN and IQL hyperparameters: per-agent Q-learning, mixed or not.

QMIX: Rashid et al. 2018, "QMIX: Monotonic Value Function Factorisation for Deep Multi-Agent
Reinforcement Learning". VDN: Sunehag et al. 2017, "Value-Decomposition Networks For
Cooperative Multi-Agent Learning". IQL: Tan 1993, independent Q-learners (here DQN-style,
Mnih et al. 2015). Defaults follow EPyMARL's MPE settings (Papoudakis et al. 2021) where they
apply to transition batches.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from marlctl.algos import register_algo
from marlctl.algos.offpolicy import OffPolicyConfig


class QLearningConfig(OffPolicyConfig):
    """EPyMARL's `qmix.yaml`, `vdn.yaml` and `iql.yaml`: double Q, epsilon from 1 to 0.05
    over 50k env steps, targets copied every 200 updates, standardised rewards; the discount
    of JaxMARL's MPE Q-learning configs (`baselines/QLearning/config/alg/*_mpe.yaml`)."""

    row_fields: ClassVar[tuple[str, ...]] = (
        "lr", "gamma", "tau", "epsilon_start", "epsilon_end", "epsilon_anneal_steps",
        "max_grad_norm",
    )  # fmt: skip
    # How the agents' Q values make the joint one: `qmix` mixes them by hypernetworks on the
    # global state, `vdn` sums them, `none` trains each agent's Q on its own reward.
    mixing: ClassVar[str] = "none"
    gamma: float = Field(
        0.9,
        ge=0,
        le=1,
        description="Discount factor. 0.9 as JaxMARL's MPE configs: on short time-limited "
        "tasks, 0.99 with bootstrapping through the time limit makes values span several "
        "episodes, and QMIX's mixer diverges on MPE simple_spread; raise it for long tasks.",
    )

    target_update_every: int = Field(
        200,
        ge=0,
        le=1_000_000,
        description="Gradient steps between hard copies of the networks into their targets "
        "(EPyMARL: 200); 0 = Polyak averaging with `tau` after every gradient step.",
    )
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
    burn_in: int | None = Field(
        None,
        ge=0,
        le=10_000,
        description="Recurrent agents: first steps of each window that only rebuild the online "
        "and target networks' hidden states from the stored one, without a loss (R2D2, "
        "Kapturowski et al. 2019); below `sequence_length`. null = a fifth of it.",
    )

    @field_validator("burn_in")
    @classmethod
    def _burn_in_below_window(cls, value: int | None, info: ValidationInfo) -> int | None:
        window = info.data.get("sequence_length")
        if value is not None and window is not None and value >= window:
            raise ValueError(f"must be below algo.sequence_length={window}")
        return value

    @property
    def burn_in_steps(self) -> int:
        return self.sequence_length // 5 if self.burn_in is None else self.burn_in


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
    mixing: ClassVar[str] = "qmix"
    name: Literal["qmix"] = "qmix"
    mixer_embed: int = Field(32, ge=1, le=4096, description="Width of the mixing network.")
    hypernet_layers: Literal[1, 2] = Field(
        2,
        description="Layers of each hypernetwork that emits a mixing weight: 1 = one linear "
        "map of the state (the QMIX paper, pymarl, TorchRL's QMixer); 2 = a ReLU hidden layer "
        "of `hypernet_hidden` units first (EPyMARL's and pymarl2's `hypernet_layers: 2`).",
    )
    hypernet_hidden: int = Field(
        64,
        ge=1,
        le=4096,
        description="Hidden width of the hypernetworks that emit its weights "
        "(`hypernet_layers: 2`).",
    )
    mixer_init_scale: float | None = Field(
        None,
        gt=0,
        le=10,
        description="null = the mixer's layers start as `nn.Linear` does (EPyMARL); a number "
        "= orthogonal weights of that gain and zero biases in every layer (JaxMARL's "
        "`MIXER_INIT_SCALE`, 0.001 on SMAX), so that Q_tot starts near zero on a global state "
        "of any scale: SMAX's holds raw positions (up to 32) and cooldowns.",
    )


@register_algo(
    "vdn",
    summary="per-agent Q summed into the joint value",
    centralised_critic=False,
    **_COMMON,
)
class VDNConfig(QLearningConfig):
    mixing: ClassVar[str] = "vdn"
    name: Literal["vdn"] = "vdn"


@register_algo(
    "iql",
    summary="independent Q-learning: each agent learns its own Q from its own reward",
    centralised_critic=False,
    **_COMMON,
)
class IQLConfig(QLearningConfig):
    name: Literal["iql"] = "iql"
