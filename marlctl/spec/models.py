"""The typed spec: the whole document, from its sections (`sections`, `groups`, `search`).
Every field is typed, bounded and described."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator, model_validator

from marlctl.algos import AlgoConfig, registered_algos
from marlctl.spec.groups import AlgoUnion, GroupSpec, PoolSpec, check_run_ref, run_ref
from marlctl.spec.search import MAX_GRID_VALUES, Choices, Condition, Range, SearchParam, SweepSpec
from marlctl.spec.sections import (
    CALLABLE,
    LOG_POINTS,
    MAX_THREADS,
    RANDOM_PLAYER,
    EnvSpec,
    HardwareSpec,
    ModelSpec,
    Sharing,
    TrackingSpec,
    TrainSpec,
)
from marlctl.strict import Strict

MAX_SEED = 2**31 - 1  # every generator the runs seed (torch, numpy, PettingZoo) takes it


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
    data: str | None = Field(
        None,
        min_length=1,
        description="An offline algorithm's dataset: the folder `marlctl eval RUN --record` "
        "(or `marlctl data split` / `merge`) wrote, relative to the working directory, or a "
        "run's artifact `runs:/RUN_ID/PATH` in the tracking store (`marlctl data log`). Its "
        "env and agent groups must be the spec's; an online algorithm takes none.",
    )
    groups: dict[str, GroupSpec] = Field(
        default_factory=dict,
        description="What plays each agent group, by group name (`marlctl list envs` names "
        "them): a scripted or frozen policy, an algorithm or model of its own, a pool of its "
        "past snapshots in some episodes. Groups not listed learn with `algo` and `model`.",
    )

    @field_validator("data")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        """A relative dataset path is the working directory's: the resolved spec holds it
        whole, so the run processes, a resumed run and `marlctl eval` read the same one. A
        run's artifact (`runs:/RUN_ID/PATH`) is kept as written."""
        if value is None or value.startswith("runs:/"):
            return value
        return str(Path(value).expanduser().absolute())

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

    @property
    def row_fields(self) -> tuple[str, ...]:
        """The algorithm hyperparameters a row of this spec's batch may have of its own (none
        with learning teams; no discount with n-step returns, which fold it in on the host)."""
        if self.teams:
            return ()
        fields = type(self.algo).row_fields
        if getattr(self.algo, "n_step", 1) > 1:
            fields = tuple(name for name in fields if name != "gamma")
        return fields

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
    "CALLABLE",
    "LOG_POINTS",
    "MAX_GRID_VALUES",
    "MAX_SEED",
    "MAX_THREADS",
    "RANDOM_PLAYER",
    "AlgoConfig",
    "AlgoUnion",
    "Choices",
    "Condition",
    "EnvSpec",
    "GroupSpec",
    "HardwareSpec",
    "ModelSpec",
    "PoolSpec",
    "Range",
    "SearchParam",
    "Sharing",
    "Spec",
    "SweepSpec",
    "TrackingSpec",
    "TrainSpec",
    "check_run_ref",
    "model_fields_at",
    "run_ref",
]
