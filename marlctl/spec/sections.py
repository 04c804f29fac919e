"""The spec's sections that stand alone: the env, the model, training, the hardware and
tracking. Every field is typed, bounded and described."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from marlctl.algos import AlgoConfig
from marlctl.callables import standard_library_refusal
from marlctl.strict import Strict

_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
# `package.module:callable`, the form of an env factory.
CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
RANDOM_PLAYER = "random"
# MLflow's SQLAlchemy dialects (`postgresql+psycopg2://` counts as postgresql) and servers.
_TRACKING_SCHEMES = {"sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks"}


class EnvSpec(Strict):
    id: str = Field(description="Registered id (`marlctl list envs`) or `package.module:factory`.")
    backend: Literal["pettingzoo", "native", "vmas"] = Field(
        "pettingzoo",
        description="pettingzoo = the real PettingZoo env; native = batched torch; "
        "vmas = a VMAS scenario (`vmas/...` ids), batched by VMAS on the run's device.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the env factory."
    )
    reward_weights: list[float] | None = Field(
        None,
        description="A multi-objective env's (MOMAland's) weight of each objective: training "
        "maximises the weighted sum of an agent's reward vector; null = equal weights summing "
        "to 1. Every objective's return is logged either way.",
    )

    @field_validator("id")
    @classmethod
    def _not_standard_library(cls, value: str) -> str:
        if ":" in value:
            refusal = standard_library_refusal(value, "env factory")
            if refusal is not None:
                raise ValueError(refusal)
        return value


Sharing = Literal["shared", "independent", "federated"]
Encoder = Literal["mlp", "cnn"]


class CnnSpec(Strict):
    """The convolutions `model.encoder: cnn` runs on a group's frames before the hidden
    layers, and an on-policy centralised critic on a global state that is a frame (weights
    of its own); the defaults are the Nature DQN's (Mnih et al. 2015)."""

    style: Literal["plain", "impala"] = Field(
        "plain",
        description="plain: a convolution per entry of `channels`, `kernels` and `strides`, "
        "a ReLU after each; impala: the IMPALA network's residual stacks (Espeholt et al. "
        "2018), one per entry of `channels` (a 3x3 convolution, a 3x3 max-pool of stride 2, "
        "two residual blocks of two 3x3 convolutions), `kernels` and `strides` unused.",
    )
    channels: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [32, 64, 64],
        min_length=1,
        max_length=16,
        description="Output channels of each convolution (impala: of each stack).",
    )
    kernels: list[Annotated[int, Field(ge=1, le=64)]] = Field(
        default_factory=lambda: [8, 4, 3], description="Square kernel size of each convolution."
    )
    strides: list[Annotated[int, Field(ge=1, le=64)]] = Field(
        default_factory=lambda: [4, 2, 1], description="Stride of each convolution."
    )
    downsample: int = Field(
        1,
        ge=1,
        le=64,
        description="Average-pool the frames by this factor on the device before the first "
        "convolution (a 457x120 pistonball frame by 4: 114x30).",
    )
    state_downsample: int | None = Field(
        None,
        ge=1,
        le=64,
        description="`downsample` for the global state where it is a frame (pistonball's "
        "screen, Melting Pot's map), which an on-policy centralised critic reads through "
        "these convolutions (its own weights); null = `downsample`. 1 for a state the env "
        "already gives small (Melting Pot's, one value per cell).",
    )

    def for_state(self) -> CnnSpec:
        """These convolutions as a centralised critic runs them on a frame state."""
        pool = self.downsample if self.state_downsample is None else self.state_downsample
        return self.model_copy(update={"downsample": pool})

    def sizes(self, frames: tuple[int, int, int]) -> list[tuple[int, int, int]]:
        """`(channels, height, width)` after the pooling and after each convolution (impala:
        each stack), on frames `(H, W, C)`."""
        height, width, channels = frames
        found = [(channels, height // self.downsample, width // self.downsample)]
        for index, out in enumerate(self.channels):
            _, height, width = found[-1]
            if self.style == "impala":  # same-size convolutions, a pool halving (rounding up)
                found.append((out, (height + 1) // 2, (width + 1) // 2))
                continue
            kernel, stride = self.kernels[index], self.strides[index]
            found.append((out, (height - kernel) // stride + 1, (width - kernel) // stride + 1))
        return found

    def emptied(self, frames: tuple[int, int, int]) -> str | None:
        """The sizes the frames pass through (`"12x12 -> 2x2 -> 0x0"`) where the convolutions
        leave nothing of them; None where something is left."""
        sizes = self.sizes(frames)
        if min(min(h, w) for _, h, w in sizes) >= 1:
            return None
        return " -> ".join(f"{h}x{w}" for _, h, w in sizes)

    def parameters(self, frames: tuple[int, int, int]) -> tuple[int, int]:
        """The convolutions' weights and biases, and the features they give, on `frames`."""
        sizes = self.sizes(frames)
        weights = 0
        for index, ((c_in, _, _), (out, _, _)) in enumerate(zip(sizes, sizes[1:], strict=False)):
            if self.style == "impala":  # the stack's convolution and 4 in its residual blocks
                weights += out * (c_in * 9 + 1) + 4 * out * (out * 9 + 1)
            else:
                weights += out * (c_in * self.kernels[index] ** 2 + 1)
        channels, height, width = sizes[-1]
        return weights, channels * height * width

    @model_validator(mode="after")
    def _one_per_layer(self) -> CnnSpec:
        if self.style == "plain" and not len(self.channels) == len(self.kernels) == len(
            self.strides
        ):
            raise ValueError("channels, kernels and strides need one entry per convolution")
        return self


class ModelSpec(Strict):
    hidden: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [64, 64],
        min_length=1,
        max_length=16,
        description="Hidden layer widths of actors and critics.",
    )
    activation: Literal["tanh", "relu", "elu", "gelu", "silu"] | None = Field(
        None,
        description="Hidden activation; null = the algorithm's reference choice (tanh for "
        "MAPPO/IPPO as in the MAPPO paper, relu for the replay-based ones as in EPyMARL).",
    )
    layer_norm: bool | None = Field(
        None,
        description="LayerNorm on network inputs (MAPPO's feature norm); null = the "
        "algorithm's reference choice (on for MAPPO/IPPO, off for the replay-based ones, "
        "whose critics take one-hot actions as input).",
    )
    action_dist: Literal["normal", "tanh_normal"] | None = Field(
        None,
        description="Policy distribution of continuous actions (on-policy algorithms): "
        "normal = a Gaussian with a state-independent log-std whose samples the env clips "
        "(the MAPPO paper's); tanh_normal = a Gaussian with a state-dependent scale squashed "
        "by tanh into the action bounds (TorchRL's TanhNormal, BenchMARL's default); "
        "null = the algorithm's reference choice.",
    )
    init: Literal["orthogonal", "torch"] = Field(
        "orthogonal",
        description="Weight initialisation of actors and critics: orthogonal (gain sqrt 2, a "
        "small last layer for actors, zero biases; the PPO implementations') or torch "
        "(`nn.Linear`'s default, uniform in ±1/sqrt(fan_in); TorchRL's and BenchMARL's).",
    )
    agent_ids: bool = Field(
        True,
        description="Append a one-hot agent id to the input of a network that agents share "
        "(`sharing: shared`), so shared parameters can still act per agent.",
    )
    sharing: Sharing | dict[str, Sharing] | None = Field(
        None,
        description="Parameters per agent group: shared (one network; see `agent_ids`), "
        "independent (one per agent) or federated (one per agent, averaged every "
        "`federated_every` updates); a mapping sets it per group name, others stay shared; "
        "null = the algorithm's reference choice (shared; a network per agent for the "
        "heterogeneous-agent algorithms, as in HARL).",
    )
    federated_every: int = Field(
        10, ge=1, le=1_000_000, description="Updates between federated averaging rounds."
    )
    recurrent: Literal["gru"] | None = Field(
        None,
        description="gru = a GRU cell after the hidden layers, trained on sequences with the "
        "state reset at episode starts (algorithms whose `list algos` says recurrent); "
        "null = feed-forward.",
    )
    encoder: Encoder | dict[str, Encoder] = Field(
        "mlp",
        description="What reads a group's observations before the hidden layers: mlp (the "
        "observation flattened) or cnn (`model.cnn`'s convolutions over its frames: "
        "observations of shape [H, W, C] or [H, W]); a mapping sets it per group name, "
        "others stay mlp. Under cnn an on-policy centralised critic reads a global state "
        "that is a frame ([H, W, C]) through convolutions of its own too. Frames of uint8 "
        "stay uint8 in rollouts and replay and are scaled to [0, 1] on the device, with "
        "either encoder.",
    )
    cnn: CnnSpec = Field(default_factory=CnnSpec, description="The convolutions of `cnn`.")

    def encoder_for(self, group: str) -> str:
        """`encoder` for agent group `group`."""
        if isinstance(self.encoder, dict):
            return self.encoder.get(group, "mlp")
        return self.encoder

    def for_algo(self, algo: AlgoConfig) -> ModelSpec:
        """This model with the fields left null set to the algorithm's reference values."""
        defaults = type(algo).model_defaults
        unset = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        return self.model_copy(update=unset) if unset else self


# Training metric points per run when `train.log_every` is not set: a smooth curve, and a
# host read of the losses no more often than that.
LOG_POINTS = 200


# An env step (from 0) and the value a hyperparameter takes from it on.
SchedulePoint = tuple[Annotated[int, Field(ge=0, le=10**13)], float]


class LinearSchedule(Strict):
    """A value interpolated linearly between points, taken at every iteration."""

    linear: list[SchedulePoint] = Field(
        min_length=2,
        description="[env step, value] points: between two, the value at each iteration's "
        "first env step is interpolated linearly; before the first and after the last it is "
        "theirs.",
    )


def _schedule_form(value: Any) -> str:
    return "schedule-linear" if isinstance(value, dict | LinearSchedule) else "schedule-points"


# A `train.schedule` entry: [step, value] points, or `{linear: [...]}` (the tag picks the form
# to check, so an error names what is wrong with the form given, not with both).
ScheduleEntry = Annotated[
    Annotated[list[SchedulePoint], Tag("schedule-points")]
    | Annotated[LinearSchedule, Tag("schedule-linear")],
    Discriminator(_schedule_form),
]


def schedule_points(value: list | LinearSchedule) -> tuple[list, bool]:
    """(the [step, value] points of a `train.schedule` entry, whether it interpolates)."""
    if isinstance(value, LinearSchedule):
        return value.linear, True
    return value, False


class TrainSpec(Strict):
    total_env_steps: int = Field(
        1_000_000,
        ge=1,
        le=10**13,
        description="Joint env steps per run (one step moves every agent).",
    )
    total_updates: int | None = Field(
        None,
        ge=1,
        le=10**10,
        description="Offline algorithms (trained from `data`): gradient steps per run, the "
        "budget in place of `total_env_steps`; `eval_every`, `checkpoint_every`, `log_every` "
        "and the metrics' steps then count gradient steps.",
    )
    eval_every: int = Field(
        100_000, ge=0, description="Env steps between evaluations; 0 = end only."
    )
    eval_episodes: int = Field(32, ge=1, le=100_000, description="Episodes per evaluation.")
    eval_sampled: bool = Field(
        False,
        description="Also evaluate the policy as it acts in training (sampled actions; "
        "epsilon-greedy for Q-learners), as `eval_sampled/` metrics beside `eval/`.",
    )
    checkpoint_every: int = Field(
        250_000, ge=0, description="Env steps between checkpoints; 0 = only the final one."
    )
    record: str | None = Field(
        None,
        min_length=1,
        description="Write every transition the run's training collects, as datasets for "
        "offline training (`marlctl data`): one per seed, `RECORD/seed-N`, a new folder "
        "relative to the working directory, written whole when the run finishes (removed "
        "if it fails). The replay of a run from scratch to its end: OG-MARL's "
        "Medium-Replay.",
    )
    keep_policies: bool = Field(
        False,
        description="Also keep the policy of every checkpoint as the artifact "
        "`policy/step-N.pt` (N: the multiple of `checkpoint_every` it was due at; the first "
        "iteration to reach it saves it), beside `checkpoints/latest.pt`, which each "
        "checkpoint replaces: `marlctl eval RUN --checkpoint policy/step-N.pt --record DIR` "
        "records datasets of a policy at several levels of skill.",
    )
    log_every: int | None = Field(
        None,
        ge=1,
        description="Env steps between training metric points (losses, training returns, "
        f"speed); null = the budget over {LOG_POINTS} (at least one point per iteration).",
    )
    schedule: dict[str, ScheduleEntry] = Field(
        default_factory=dict,
        max_length=64,
        description="Hyperparameters that change during training, by `algo.FIELD`, and the "
        "training env's params an env lets change, by `env.PARAM` (Overcooked's "
        "`shaped_reward_scale`; evaluation plays `env.params`): the value from each env "
        "step on, `[[0, 3.0e-4], [400000, 2.4e-4]]`, taken at the first iteration that "
        "reaches the step (a point at 0 replaces the `algo` or `env.params` value), or "
        "`{linear: [[0, 1.0], [2500000, 0.0]]}`, interpolated at every iteration. Of `algo`, "
        "only what a row of a batch may have of its own (`algo.lr`, ...); the schedule a "
        "population-based training's best member followed is written in the first form.",
    )

    @field_validator("schedule")
    @classmethod
    def _ordered_steps(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, entry in value.items():
            points, _ = schedule_points(entry)
            steps = [step for step, _ in points]
            if not points or steps != sorted(set(steps)):
                raise ValueError(f"{key}: give [step, value] points at increasing env steps")
        return value

    @property
    def budget(self) -> int:
        """The steps a run counts to: gradient steps where `total_updates` is set (offline),
        else env steps."""
        return self.total_updates or self.total_env_steps

    @property
    def log_interval(self) -> int:
        """`log_every`, or the budget spread over `LOG_POINTS` points."""
        return self.log_every or max(1, self.budget // LOG_POINTS)


MAX_THREADS = 1024


class HardwareSpec(Strict):
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    num_envs: int = Field(16, ge=1, le=1_000_000, description="Parallel environments per run.")
    env_workers: int = Field(
        0,
        ge=0,
        le=256,
        description="Worker processes stepping the envs (pettingzoo backend); 0 = in-process.",
    )
    parallel_runs: int = Field(1, ge=1, le=1024, description="Runs (seeds, trials) at once.")
    threads_per_run: int | Literal["auto"] = Field(
        "auto",
        description="torch intra-op threads per run. auto = the cores this process may use "
        "(CPU affinity, cgroup quota) less those other processes keep busy, split between "
        "the run processes at once (at most OMP_NUM_THREADS where that is set), or one thread "
        "where a gradient step computes fewer than 1,000 agent rows (a replay batch of 256 on "
        "three agents), which a second thread slows down; a run alone in its process follows "
        "the free cores while it trains.",
    )
    devices: list[str] | None = Field(
        None, min_length=1, description="Placement pool; runs are spread over it round-robin."
    )
    batch_seeds: bool = Field(
        False,
        description="Train the seeds together in one process as one batched model set per "
        "device (native and vmas backends): far higher total throughput when one seed leaves "
        "the device idle. Each seed keeps its own MLflow run and computes what it would alone.",
    )
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="On a GPU: capture each training iteration (rollout, advantages, every "
        "minibatch update) as one CUDA graph and replay it, for on-policy algorithms on the "
        "native backend; capturing takes a second or two. true also torch.compiles the "
        "networks, the native env's step, an on-policy rollout step's acting and a "
        "replay-based gradient step's losses, on any device (seconds of compilation first, "
        "fused kernels after). auto = capture on a GPU where the run allows it, eager on a "
        "CPU; false = eager everywhere. Compare with `marlctl bench SPEC`.",
    )

    tf32: bool = Field(
        False,
        description="On a GPU: float32 matrix products and convolutions in TensorFloat-32 "
        "(10-bit mantissa, float32 range) on the tensor cores, as JAX does by default; several "
        "times faster matrix products at large batches. false = full float32 (IEEE) "
        "everywhere. No effect on a CPU.",
    )

    @field_validator("threads_per_run", mode="before")
    @classmethod
    def _threads(cls, value: Any) -> Any:
        if value == "auto" or (type(value) is int and 1 <= value <= MAX_THREADS):
            return value
        raise ValueError(f"must be a whole number from 1 to {MAX_THREADS}, or auto")

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError("must be auto, cpu, cuda or cuda:N")
        return value

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            if not _DEVICE.match(item) or item == "auto":
                raise ValueError(f"'{item}' must be cpu, cuda or cuda:N")
        return value


class TrackingSpec(Strict):
    uri: str | None = Field(
        None, description="MLflow tracking URI; null = local SQLite `mlflow.db` in the working dir."
    )
    flush_every_s: float = Field(
        5.0, gt=0, le=3600, description="Seconds between batched metric uploads."
    )

    @field_validator("uri")
    @classmethod
    def _known_store(cls, value: str | None) -> str | None:
        if value is None:
            return value
        scheme = value.split("://", 1)[0].split("+", 1)[0] if "://" in value else ""
        if scheme not in _TRACKING_SCHEMES and value != "databricks":
            raise ValueError(
                "must be an MLflow database or server URI: sqlite:///PATH, "
                "postgresql://HOST/DB, mysql://HOST/DB or http(s)://SERVER (MLflow's "
                "file store is not supported)"
            )
        return value
