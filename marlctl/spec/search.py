"""The spec's `sweep:` section: the search space and how Optuna searches it."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, model_validator

from marlctl.strict import Strict

Condition = dict[str, Any]


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


class PbtSpec(Strict):
    """Population-based training (Jaderberg et al. 2017): its exploit and explore steps."""

    interval: int | None = Field(
        None,
        gt=0,
        description="Env steps between two exploit/explore steps, a multiple of "
        "train.eval_every; default: train.eval_every.",
    )
    quantile: float = Field(
        0.2,
        gt=0,
        le=0.5,
        description="The worst members that copy a member of the best, as a fraction of the "
        "population (truncation selection; at least one, at most half).",
    )
    perturb: list[float] = Field(
        default_factory=lambda: [0.8, 1.2],
        min_length=1,
        description="Factors one of which multiplies each searched value when a member "
        "explores (a choice moves to an adjacent one instead).",
    )
    resample_probability: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Chance that an explored value is drawn from its range afresh instead.",
    )


class SweepSpec(Strict):
    metric: str = Field("eval/return_mean", description="Metric the objective reads.")
    direction: Literal["maximize", "minimize"] = "maximize"
    trials: int = Field(20, ge=1, description="Trials in the whole study, over all workers.")
    sampler: Literal["tpe", "random", "grid", "cmaes", "pbt"] = Field(
        "tpe",
        description="pbt: population-based training: the trials are one population, trained "
        "as one batch (see sweep.pbt).",
    )
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
    batch: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        1,
        description="Trials a worker takes at once and trains as one batch of trials x seeds "
        "(with hardware.batch_seeds), each row with its own hyperparameters; trials whose "
        "structural settings differ train in batches of their own. auto: as many as the "
        "memory estimate fits, at most a quarter of the trials.",
    )
    pbt: PbtSpec = Field(
        default_factory=PbtSpec, description="sampler: pbt's exploit and explore steps."
    )
    space: dict[str, SearchParam] = Field(default_factory=dict)
