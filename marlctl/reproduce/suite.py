"""A suite file: named cells, each a spec (a path, or a base spec plus overrides) with its seeds,
its budget and the reference result it should reproduce, with where that result comes from and
the conventions it was measured under. Read like a spec: YAML or TOML, every problem at once as
`FILE:LINE: key: message`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from marlctl.callables import standard_library_refusal
from marlctl.errors import Problem, SpecError
from marlctl.spec.sections import CALLABLE, RANDOM_PLAYER
from marlctl.spec.source import load_source
from marlctl.strict import Strict

POINTS_DESCRIPTION = (
    "Reference points drawn beside the cell's results, each the score of a policy that does "
    "not learn, measured in the cell's env with its evaluation: name -> random (uniformly "
    "random allowed actions) or package.module:callable (a scripted policy, called as a "
    "spec's scripted group is: fn(obs, mask, group) -> actions) played by every group that "
    "would learn."
)


def _check_points(points: dict[str, str]) -> dict[str, str]:
    for name, player in points.items():
        if not name.strip():
            raise ValueError("a point needs a name")
        if player == RANDOM_PLAYER:
            continue
        if not CALLABLE.match(player):
            raise ValueError(f"{name}: '{player}' must be random or package.module:callable")
        refusal = standard_library_refusal(player, "scripted policy")
        if refusal is not None:
            raise ValueError(f"{name}: {refusal}")
    return points


class Source(Strict):
    """Where a reference comes from. `paper`: a publication's table; `peer`: another tool's own
    code run on a stated machine; `baseline`: marlctl's own earlier result, a regression
    baseline, never a reproduction."""

    kind: Literal["paper", "peer", "baseline"]
    citation: str = Field(
        min_length=1, description="Authors, title, year and arXiv id, or a repository."
    )
    table: str | None = Field(None, description="Where in the paper: `Table 3`, `Figure 4`.")
    code: str | None = Field(None, description="The peer's or marlctl's version or commit.")
    machine: str | None = Field(None, description="The machine a peer or baseline ran on.")

    @model_validator(mode="after")
    def _traceable(self) -> Source:
        if self.kind == "paper" and self.table is None:
            raise ValueError("a paper's result needs `table`: where in the paper it is")
        if self.kind != "paper" and (self.code is None or self.machine is None):
            raise ValueError(f"a {self.kind} result needs `code` and `machine`: what ran, where")
        return self


class Conventions(Strict):
    """How the reference measured its result; `marlctl.reproduce.conventions` translates it to
    marlctl's metric or refuses."""

    metric: str = Field("eval/return_mean", description="marlctl's metric the value compares to.")
    aggregation: Literal["mean", "sum"] = Field(
        description="The episode return over agents: their mean (marlctl's) or their sum."
    )
    agents: int | None = Field(None, ge=1, description="Agents summed over, where `sum`.")
    evaluation: Literal["deterministic", "stochastic"] = Field(
        description="The policy evaluated: its most probable action (marlctl's) or samples."
    )
    episodes: int = Field(ge=1, description="Episodes per evaluation.")
    step: Literal["env", "agent"] = Field(
        description="What the budget counts: joint env steps (marlctl's) or agent steps."
    )
    episode_length: int | None = Field(None, ge=1, description="Steps per episode, where fixed.")
    statistic: Literal["final", "maximum", "average"] = Field(
        "final",
        description="What of a run's evaluations the value is: the last one, the best of the "
        "mean over seeds (each seed's value there), or each seed's average over training.",
    )


class EnvPackage(Strict):
    name: str = Field(min_length=1, description="The distribution: `mpe2`, `vmas`, `jaxmarl`.")
    version: str = Field(min_length=1)


class Reference(Strict):
    """The result a cell should reproduce: a value with its interval, or per-seed values."""

    value: float | None = None
    interval: tuple[float, float] | None = Field(None, description="[low, high], e.g. a 95% CI.")
    per_seed: list[float] | None = Field(None, min_length=1)
    precision: float | None = Field(
        None,
        gt=0,
        description="The unit the numbers are rounded to (0.0001: four decimals): the interval "
        "is widened by half of it, as a rounded number stands for all that round to it.",
    )
    budget: int = Field(ge=1, description="Steps trained, counted as `conventions.step` says.")
    source: Source
    conventions: Conventions
    env_package: EnvPackage

    @model_validator(mode="after")
    def _a_value(self) -> Reference:
        if (self.value is None) == (self.per_seed is None):
            raise ValueError("give `value` (with an optional `interval`) or `per_seed`")
        if self.interval is not None:
            if self.value is None:
                raise ValueError("an `interval` goes with a `value`")
            low, high = self.interval
            if not low <= self.value <= high:
                raise ValueError(f"the interval [{low}, {high}] must hold the value {self.value}")
        return self


class Cell(Strict):
    spec: str = Field(min_length=1, description="A spec file, relative to the suite file.")
    overrides: list[str] = Field(default_factory=list, description="Overrides on the spec.")
    seeds: int = Field(5, ge=1, le=1024, description="Seeds to train.")
    reference: Reference
    note: str | None = Field(
        None, description="What a reader should know about the cell: a known gap and its evidence."
    )
    points: dict[str, str] = Field(default_factory=dict, description=POINTS_DESCRIPTION)

    _points = field_validator("points")(_check_points)


class Suite(Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    compare: list[str] = Field(
        default_factory=list,
        description="Algorithm presets run through every cell beside its own (`algos=NAME`).",
    )
    points: dict[str, str] = Field(
        default_factory=dict,
        description="Reference points of every cell, as a cell's `points`; a cell's own add "
        "to them, or replace one of the same name.",
    )
    cells: dict[str, Cell] = Field(min_length=1)

    _points = field_validator("points")(_check_points)

    def points_of(self, name: str) -> dict[str, str]:
        """Cell `name`'s reference points: the suite's, then its own."""
        return {**self.points, **self.cells[name].points}


def load_suite(path: str | Path) -> tuple[Suite, Path]:
    """The suite at `path` and the folder its cells' specs are relative to; a SpecError lists
    every problem, each at its line."""
    path = Path(path)
    source = load_source(path)  # unreadable, malformed or hostile input: SpecError
    shown = str(path)
    try:
        suite = Suite.model_validate(source.data)
    except ValidationError as err:
        problems = []
        for item in err.errors(include_url=False):
            dotted = ".".join(str(p) for p in item["loc"])
            message = item["msg"].removeprefix("Value error, ")
            if item["type"] == "extra_forbidden":
                message = "unknown key"
            problems.append(Problem(shown, source.line_of(dotted), dotted, message))
        raise SpecError(problems) from None
    missing = [
        Problem(
            shown,
            source.line_of(f"cells.{name}.spec"),
            f"cells.{name}.spec",
            f"no spec file '{cell.spec}' beside the suite",
        )  # fmt: skip
        for name, cell in suite.cells.items()
        if not (path.parent / cell.spec).is_file()
    ]
    if missing:
        raise SpecError(missing)
    problems = [
        Problem(shown, source.line_of(key), key, message)
        for key, message in _points_problems(suite, path.parent)
    ]
    if problems:
        raise SpecError(problems)
    return suite, path.parent


def _points_problems(suite: Suite, folder: Path) -> list[tuple[str, str]]:
    """`(key, message)` for each reference point that cannot be scored: a cell judged on a
    metric no evaluation gives, a scripted policy that does not import."""
    from marlctl.reproduce.points import refusal

    out, imported = [], {}
    for name, cell in suite.cells.items():
        points = suite.points_of(name)
        if not points:
            continue
        where = "points" if not cell.points else f"cells.{name}.points"
        why = refusal(cell.reference.conventions.metric)
        if why is not None:
            out.append((where, why))
            continue
        for point, player in points.items():
            if player == RANDOM_PLAYER:
                continue
            if player not in imported:
                imported[player] = _import_problem(player, folder)
            if imported[player] is not None:
                at = f"cells.{name}.points.{point}" if point in cell.points else f"points.{point}"
                out.append((at, imported[player]))
    return list(dict.fromkeys(out))  # a suite-wide point's problem once


def _import_problem(player: str, folder: Path) -> str | None:
    """Why the scripted policy `player` does not import, or None."""
    from marlctl.train.opponents import import_policy  # torch: only for a suite that needs it

    try:
        import_policy(player, [folder])
    except ValueError as err:
        return str(err)
    return None
