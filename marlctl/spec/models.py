"""The typed spec. Every field is typed, bounded and described."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from marlctl.algos import AlgoConfig, registered_algos
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

    def for_algo(self, algo: AlgoConfig) -> ModelSpec:
        """This model with the fields left null set to the algorithm's reference values."""
        defaults = type(algo).model_defaults
        unset = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        return self.model_copy(update=unset) if unset else self


# Training metric points per run when `train.log_every` is not set: a smooth curve, and a
# host read of the losses no more often than that.
LOG_POINTS = 200


class TrainSpec(Strict):
    total_env_steps: int = Field(
        1_000_000,
        ge=1,
        le=10**13,
        description="Joint env steps per run (one step moves every agent).",
    )
    eval_every: int = Field(
        100_000, ge=0, description="Env steps between evaluations; 0 = end only."
    )
    eval_episodes: int = Field(32, ge=1, le=100_000, description="Episodes per evaluation.")
    checkpoint_every: int = Field(
        250_000, ge=0, description="Env steps between checkpoints; 0 = only the final one."
    )
    log_every: int | None = Field(
        None,
        ge=1,
        description="Env steps between training metric points (losses, training returns, "
        f"speed); null = the budget over {LOG_POINTS} (at least one point per iteration).",
    )

    @property
    def log_interval(self) -> int:
        """`log_every`, or the budget spread over `LOG_POINTS` points."""
        return self.log_every or max(1, self.total_env_steps // LOG_POINTS)


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
        "networks and the native env's step, on any device (seconds of compilation first, "
        "fused kernels after). auto = capture on a GPU where the run allows it, eager on a "
        "CPU; false = eager everywhere. Compare with `marlctl bench SPEC`.",
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


Condition = dict[str, Any]


MAX_SEED = 2**31 - 1  # every generator the runs seed (torch, numpy, PettingZoo) takes it
MAX_GRID_VALUES = 100_000  # values one search dimension may enumerate


class Range(Strict):
    """A numeric range. Integer bounds (and step) make an integer parameter unless `type`
    says float, as in Hydra's `interval(1, 10)`."""

    low: int | float
    high: int | float
    log: bool = Field(False, description="Sample on a log scale (low > 0).")
    step: int | float | None = Field(None, gt=0, description="Quantisation step.")
    type: Literal["int", "float"] | None = Field(
        None, description="int or float; default: int when low, high and step are integers."
    )
    when: Condition | None = Field(
        None, description="Sample only when these other space parameters take these values."
    )

    @model_validator(mode="after")
    def _bounds(self) -> Range:
        if self.low >= self.high:
            raise ValueError("low must be below high")
        if self.log and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("a log range cannot have a step")
        if self.step is not None and (self.high - self.low) / self.step >= MAX_GRID_VALUES:
            raise ValueError(f"the step gives more than {MAX_GRID_VALUES:,} values")
        if self.type == "int" and not all(
            float(v).is_integer() for v in (self.low, self.high, self.step or 1)
        ):
            raise ValueError("an int range needs integer low, high and step")
        return self

    @property
    def is_int(self) -> bool:
        if self.type is not None:
            return self.type == "int"
        return all(isinstance(v, int) for v in (self.low, self.high, self.step or 1))


class Choices(Strict):
    choices: list[Any] = Field(min_length=1, description="Values to choose from (any YAML).")
    when: Condition | None = Field(
        None, description="Sample only when these other space parameters take these values."
    )


def _search_kind(value: Any) -> str:
    """A search parameter is a list of choices or a numeric range (also when serialising)."""
    if isinstance(value, Choices) or (isinstance(value, dict) and "choices" in value):
        return "choices"
    return "range"


SearchParam = Annotated[
    Union[Annotated[Range, Tag("range")], Annotated[Choices, Tag("choices")]],  # noqa: UP007
    Discriminator(_search_kind),
]


class SweepSpec(Strict):
    metric: str = Field("eval/return_mean", description="Metric the objective reads.")
    direction: Literal["maximize", "minimize"] = "maximize"
    trials: int = Field(20, ge=1, description="Trials in the whole study, over all workers.")
    sampler: Literal["tpe", "random", "grid", "cmaes"] = "tpe"
    pruner: Literal["median", "hyperband", "none"] = "median"
    storage: str | None = Field(
        None, description="null = local journal file ./optuna.journal; or postgresql://..."
    )
    study: str | None = Field(None, description="Optuna study name; default: the experiment.")
    objective: Literal["mean", "iqm"] = Field(
        "mean", description="How a trial's seeds combine: mean, or interquartile mean."
    )
    startup_trials: int = Field(
        5, ge=0, description="Trials before the sampler models and the pruner prunes."
    )
    retries: int = Field(
        1, ge=0, description="Times a trial lost with its worker (or interrupted) is re-run."
    )
    heartbeat_s: float = Field(
        30.0, gt=0, description="Running trials beat this often; 4 missed beats = lost."
    )
    seed: int | None = Field(None, description="Sampler seed (worker i uses seed + i).")
    space: dict[str, SearchParam] = Field(default_factory=dict)


def _algo_union() -> Any:
    configs = tuple(info.config for info in registered_algos().values())
    return Annotated[Union[configs], Field(discriminator="name")]  # noqa: UP007


AlgoUnion = _algo_union()


def check_run_ref(key: str, ref: str) -> None:
    """ValueError unless `ref` reads RUN_ID[:CHECKPOINT]."""
    run_id, _, checkpoint = ref.partition(":")
    if not re.fullmatch(r"[0-9a-f]{4,32}", run_id):
        raise ValueError(
            f"{key}: '{ref}' must be RUN_ID[:CHECKPOINT], RUN_ID being a run id or the start "
            "of one (4 to 32 hexadecimal digits)"
        )
    if ":" in ref and not checkpoint.strip():
        raise ValueError(f"{key}: '{ref}' names no checkpoint after ':'")


def run_ref(ref: str) -> tuple[str, str | None]:
    """(run id or prefix, checkpoint or None) of RUN_ID[:CHECKPOINT]."""
    run_id, _, checkpoint = ref.partition(":")
    return run_id, checkpoint or None


class PoolSpec(Strict):
    """Past snapshots of a learning group's policy that play the group in a share of the
    episodes: self-play (a symmetric game's one group against its own past) and population
    training (the other groups learn against a pool, not one co-learner)."""

    size: int = Field(
        8, ge=1, le=64, description="Snapshots kept; the oldest leaves when a new one comes."
    )
    every: int = Field(
        100_000,
        ge=1,
        description="Env steps (per seed) between snapshots of the group's policy; the first "
        "is taken when training starts (the untrained policy).",
    )
    share: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="The share of episodes a snapshot plays, drawn in each env as its episode "
        "starts; the learner plays the rest.",
    )
    sample: Literal["latest", "uniform", "prioritised"] = Field(
        "uniform",
        description="Which snapshot plays an episode: latest = the newest; uniform = any kept "
        "one; prioritised = weight (1 - x)^power, x being the learners' win rate against it "
        "(prioritised fictitious self-play, AlphaStar's PFSP).",
    )
    power: float = Field(
        2.0,
        ge=0.0,
        le=16.0,
        description="prioritised: the exponent of (1 - x); 0 = uniform, larger = the "
        "snapshots the learners beat least are drawn more.",
    )
    seats: Literal["all", "one"] = Field(
        "all",
        description="all = a snapshot plays every agent of the group; one = it plays one of "
        "them, drawn per episode, and the learner the others (self-play in a symmetric game, "
        "whose one group holds every seat).",
    )
    include: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="RUN_ID[:CHECKPOINT] of finished seed runs whose policy for this group "
        "joins the pool for the whole run beside the snapshots, never evicted or updated, "
        "drawn like them (latest: the newest snapshot and these): a league of policies "
        "trained elsewhere, as PSRO's and AlphaStar's populations. Each run trained this "
        "group on the same env, with the same agents and spaces; CHECKPOINT as in `frozen`.",
    )

    @field_validator("include")
    @classmethod
    def _run_refs(cls, value: list[str]) -> list[str]:
        for ref in value:
            check_run_ref("include", ref)
        if len(set(value)) < len(value):
            raise ValueError("names a run twice")
        return value


class GroupSpec(Strict):
    """Who plays an agent group. Neither field set: the group learns with `algo` and `model`."""

    scripted: str | None = Field(
        None,
        description="random = uniformly random allowed actions (uniform over the action box "
        "for continuous actions); package.module:callable = a policy you name, imported like "
        "an env factory and called as fn(obs, mask, group) with the group's observations "
        "[envs, agents, ...], action mask (or None) and GroupInfo; it returns the actions "
        "[envs, agents] (discrete) or [envs, agents, dim] (continuous, in the env's bounds).",
    )
    algo: AlgoUnion | None = Field(  # type: ignore[valid-type]
        None,
        description="This group learns with its own algorithm (any registered one, its "
        "fields as under the top-level `algo`), in a team of its own beside the other "
        "learning groups; null = the top-level `algo`.",
    )
    model: ModelSpec | None = Field(
        None,
        description="This group's networks (fields as under the top-level `model`; those "
        "left null take its algorithm's reference values); null = the top-level `model`.",
    )
    frozen: str | None = Field(
        None,
        description="RUN_ID[:CHECKPOINT]: this group's trained policy from a finished seed run "
        "of the tracking store, never updated; CHECKPOINT = latest (the last checkpoint) or "
        "an artifact path of the run; without it, its final policy. It acts as in its own run: "
        "sampling while this run trains, deterministically in evaluations.",
    )
    pool: PoolSpec | None = Field(
        None,
        description="Past snapshots of this learning group's policy play it in a share of "
        "the episodes (self-play, population training); its agents learn only from the "
        "episodes they play themselves. Evaluations play the learners against each other.",
    )

    @field_validator("scripted")
    @classmethod
    def _not_standard_library(cls, value: str | None) -> str | None:
        if value is not None and ":" in value:
            refusal = standard_library_refusal(value, "scripted policy")
            if refusal is not None:
                raise ValueError(refusal)
        return value

    @model_validator(mode="after")
    def _one_player(self) -> GroupSpec:
        if self.scripted is not None and self.frozen is not None:
            raise ValueError("a group is scripted or frozen, not both")
        if not self.learns and (self.algo is not None or self.model is not None):
            raise ValueError("a scripted or frozen group does not learn: it takes no algo or model")
        if self.scripted is not None and self.scripted != RANDOM_PLAYER:
            if not CALLABLE.match(self.scripted):
                raise ValueError(
                    f"scripted: '{self.scripted}' must be random or package.module:callable"
                )
        if self.frozen is not None:
            check_run_ref("frozen", self.frozen)
        if not self.learns and self.pool is not None:
            raise ValueError("a scripted or frozen group does not learn: it keeps no pool")
        return self

    @property
    def learns(self) -> bool:
        return self.scripted is None and self.frozen is None

    @property
    def own_team(self) -> bool:
        """Learns with an algorithm or model of its own."""
        return self.learns and (self.algo is not None or self.model is not None)

    @property
    def frozen_run(self) -> tuple[str, str | None]:
        """(run id or prefix, checkpoint or None) of a frozen group."""
        return run_ref(self.frozen or "")


class Spec(Strict):
    name: str | None = Field(None, description="MLflow experiment name; default: the file stem.")
    label: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="How `marlctl report` names these runs' group in its tables, legends and "
        "appendix (`MAPPO (ours)`), instead of its group-by values; it changes nothing the "
        "runs learn. `marlctl report --label GROUP=TEXT` overrides it.",
    )
    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field(
        default_factory=lambda: [0],
        min_length=1,
        max_length=1024,
        description="One run per seed (0 to 2**31 - 1).",
    )
    env: EnvSpec
    algo: AlgoUnion  # type: ignore[valid-type]
    model: ModelSpec = Field(default_factory=ModelSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    hardware: HardwareSpec = Field(default_factory=HardwareSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    sweep: SweepSpec | None = None
    groups: dict[str, GroupSpec] = Field(
        default_factory=dict,
        description="What plays each agent group, by group name (`marlctl list envs` names "
        "them): a scripted or frozen policy, an algorithm or model of its own, a pool of its "
        "past snapshots in some episodes. Groups not listed learn with `algo` and `model`.",
    )

    @property
    def opponents(self) -> dict[str, GroupSpec]:
        """The groups that do not learn, by name."""
        return {name: g for name, g in self.groups.items() if not g.learns}

    @property
    def pools(self) -> dict[str, PoolSpec]:
        """The learning groups whose past snapshots play them in some episodes, by name."""
        return {name: g.pool for name, g in self.groups.items() if g.pool is not None}

    @property
    def teams(self) -> dict[str, GroupSpec]:
        """The groups that learn with an algorithm or model of their own, by name."""
        return {name: g for name, g in self.groups.items() if g.own_team}

    @model_validator(mode="after")
    def _algorithm_model_defaults(self) -> Spec:
        """Model fields left null take the algorithm's reference values: a group with its
        own algorithm or model takes its algorithm's, from its model or the top-level one."""
        raw = self.model
        for group in self.teams.values():
            filled = (group.model or raw).for_algo(group.algo or self.algo)
            object.__setattr__(group, "model", filled)  # frozen: filled in place
        model = raw.for_algo(self.algo)
        if model is not self.model:
            object.__setattr__(self, "model", model)
        return self

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError("seeds must be distinct")
        return value


def model_fields_at(path: list[str]) -> list[str]:
    """Field names valid at a dotted location (for did-you-mean); [] if unknown."""
    model: Any = Spec
    keyed = False  # the part is a key of a mapping field (a group's name)
    for part in path:
        if keyed:
            keyed = False
            continue
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            if part in registered_algos():
                model = registered_algos()[part].config
                continue
            return []
        annotation = fields[part].annotation
        keyed = getattr(annotation, "__origin__", None) is dict
        model = _model_in(annotation)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


__all__ = [
    "AlgoConfig",
    "Spec",
    "EnvSpec",
    "ModelSpec",
    "TrainSpec",
    "HardwareSpec",
    "TrackingSpec",
    "SweepSpec",
    "GroupSpec",
    "model_fields_at",
]
