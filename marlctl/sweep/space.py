"""The search space: `sweep.space` in the spec plus Hydra sweep overrides, checked before a run.

A parameter is a spec path (`algo.lr`, `model.hidden`, `env.params.N`) or a preset group
(`algos`: the algorithm preset to compose). A sampled point becomes Hydra overrides on the
spec, so every trial's spec is composed and validated exactly as `marlctl run` would.
Pure: no torch, no mlflow, no optuna.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from marlctl.errors import Problem, SpecError
from marlctl.spec import OVERRIDES, PRESET_GROUPS, LoadedSpec, load_spec, sort_problems
from marlctl.spec.models import MAX_GRID_VALUES, Choices, Range

PRIMITIVE = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Param:
    """One search dimension, with where it was declared (for errors)."""

    key: str
    file: str
    line: int | None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    is_int: bool = False
    choices: tuple[Any, ...] = ()
    when: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    @property
    def categorical(self) -> bool:
        return bool(self.choices)

    def problem(self, message: str) -> Problem:
        where = "sweep.space." + self.key if self.file != OVERRIDES else self.key
        return Problem(self.file, self.line, where, message)

    def probe_values(self) -> list[Any]:
        """Values that decide whether the whole dimension is valid: every choice, or the ends."""
        if self.categorical:
            return list(self.choices)
        ends = [self.low, self.high]
        if self.step is not None:  # the largest value on the grid, not `high` itself
            count = int((self.high - self.low) / self.step + 1e-9)
            ends[1] = self.low + count * self.step
        return [int(v) if self.is_int else float(v) for v in ends]

    def grid(self) -> list[Any]:
        """Every value, for the grid sampler (ranges need a step)."""
        if self.categorical:
            return list(self.choices)
        count = int((self.high - self.low) / self.step + 1e-9) + 1  # never past `high`
        values = [self.low + i * self.step for i in range(count)]
        return [int(v) if self.is_int else float(v) for v in values]


def encode_choice(value: Any) -> Any:
    """Optuna stores str/int/float/bool/None choices; lists and mappings travel as JSON."""
    return value if isinstance(value, PRIMITIVE) else json.dumps(value)


def decode_choice(param: Param, value: Any) -> Any:
    for choice in param.choices:
        if encode_choice(choice) == value:
            return choice
    return value


def space_of(loaded: LoadedSpec, sweep_overrides: list[Param]) -> list[Param]:
    """The spec's `sweep.space`, then the command line's sweep overrides (which win)."""
    space = loaded.spec.sweep.space if loaded.spec.sweep else {}
    params: dict[str, Param] = {}
    for key, entry in space.items():
        file, line = loaded.provenance.locate(f"sweep.space.{key}")
        when = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in (entry.when or {}).items()}
        if isinstance(entry, Choices):
            params[key] = Param(key, file, line, choices=tuple(entry.choices), when=when)
        else:
            assert isinstance(entry, Range)
            params[key] = Param(
                key,
                file,
                line,
                low=entry.low,
                high=entry.high,
                log=entry.log,
                step=entry.step,
                is_int=entry.is_int,
                when=when,
            )
    for param in sweep_overrides:
        params[param.key] = param
    explicit = {k for k, v in space.items() if isinstance(v, Range) and v.type is not None}
    return _ordered(
        [p if p.key in explicit else _typed(p, loaded.resolved) for p in params.values()]
    )


def _typed(param: Param, resolved: dict[str, Any]) -> Param:
    """A range takes the type of the field it sets: `{low: 1, high: 10}` on a float field
    samples floats, `interval(1, 8)` on an int field samples ints."""
    if param.categorical:
        return param
    current: Any = resolved
    for part in param.key.split("."):
        if not isinstance(current, dict) or part not in current:
            return param
        current = current[part]
    if isinstance(current, bool) or not isinstance(current, (int, float)):
        return param
    integral = all(float(v).is_integer() for v in (param.low, param.high, param.step or 1))
    wants_int = isinstance(current, int) and integral
    if wants_int == param.is_int:
        return param
    return replace(param, is_int=wants_int)


def _ordered(params: list[Param]) -> list[Param]:
    """Conditions refer to other parameters; sample those first. Cycles are an error."""
    by_key = {p.key: p for p in params}
    problems = []
    for p in params:
        for key, values in p.when.items():
            if key not in by_key:
                problems.append(p.problem(f"when: '{key}' is not a parameter of sweep.space"))
            elif by_key[key].categorical:
                missing = [v for v in values if v not in by_key[key].choices]
                if missing:
                    problems.append(
                        p.problem(f"when: {key} never takes {', '.join(map(str, missing))}")
                    )
    if problems:
        raise SpecError(sort_problems(problems))
    done: list[Param] = []
    pending = list(params)
    while pending:
        ready = [p for p in pending if all(k in {d.key for d in done} for k in p.when)]
        if not ready:
            raise SpecError([pending[0].problem("when: the conditions form a cycle")])
        done += ready
        pending = [p for p in pending if p not in ready]
    return done


def split_overrides(overrides: list[str]) -> tuple[list[str], list[Param]]:
    """Plain overrides, and Hydra sweep overrides (`a=1,2`, `choice()`, `range()`,
    `interval()`, `tag(log, interval())`) as search parameters."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    plain: list[str] = []
    params: list[Param] = []
    problems = []
    for index, text in enumerate(overrides, start=1):
        try:
            override = parser.parse_override(text)
        except HydraException:
            plain.append(text)  # load_spec reports it with its position
            continue
        if not override.is_sweep_override():
            plain.append(text)
            continue
        key = override.get_key_element().lstrip("+~")
        value = override.value()
        tags = set(getattr(value, "tags", ()) or ())
        if isinstance(value, IntervalSweep):
            low, high = value.start, value.end
            is_int = isinstance(low, int) and isinstance(high, int)
            if low >= high or ("log" in tags and low <= 0):
                problems.append(
                    Problem(
                        OVERRIDES, index, key, "interval needs low < high (and low > 0 for log)"
                    )
                )
                continue
            params.append(
                Param(key, OVERRIDES, index, low=low, high=high, log="log" in tags, is_int=is_int)
            )
        elif isinstance(value, (ChoiceSweep, RangeSweep)):
            if "log" in tags:
                problems.append(Problem(OVERRIDES, index, key, "log applies to interval() only"))
                continue
            if isinstance(value, RangeSweep):
                step = value.step if value.step is not None else 1
                if step == 0:
                    problems.append(Problem(OVERRIDES, index, key, "range() step must not be 0"))
                    continue
                if (value.stop - value.start) / step > MAX_GRID_VALUES:
                    message = f"range() gives more than {MAX_GRID_VALUES:,} values"
                    problems.append(Problem(OVERRIDES, index, key, message))
                    continue
            choices = tuple(override.sweep_iterator())
            if not choices:
                problems.append(Problem(OVERRIDES, index, key, "the sweep has no values"))
                continue
            params.append(Param(key, OVERRIDES, index, choices=choices))
        else:  # pragma: no cover - Hydra has no other sweep types
            problems.append(Problem(OVERRIDES, index, key, f"unsupported sweep {text}"))
    if problems:
        raise SpecError(problems)
    return plain, params


def hydra_value(value: Any) -> str:
    """A Python value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as an override")


def listed_groups(spec_path: str | Path) -> set[str]:
    """Preset groups the spec's `defaults:` list already names."""
    from marlctl.spec.source import load_source

    found = set()
    for item in load_source(Path(spec_path)).data.get("defaults") or []:
        if isinstance(item, dict):
            found.update(str(k) for k in item)
    return found


def overrides_for(values: dict[str, Any], listed: set[str] | frozenset = frozenset()) -> list[str]:
    """Sampled values as overrides: `algos=qmix` picks a preset (`+algos=qmix` when the spec's
    defaults do not list the group), `++algo.lr=0.001` sets a key."""
    out = []
    for key, value in values.items():
        if key in PRESET_GROUPS:
            out.append(f"{'' if key in listed else '+'}{key}={value}")
        else:
            out.append(f"++{key}={hydra_value(value)}")
    return out


def active(param: Param, values: dict[str, Any]) -> bool:
    """Whether a conditional parameter is sampled, given the values sampled before it."""
    return all(key in values and values[key] in allowed for key, allowed in param.when.items())


def check_space(spec_path: str | Path, plain: list[str], params: list[Param], sampler: str) -> None:
    """Raise SpecError (exit 2) unless every value the space can produce gives a valid run.

    Each choice and each end of each range is composed, validated and planned on top of the
    spec; a problem is reported at the parameter's own line.
    """
    from marlctl.plan import compile_plan

    problems: list[Problem] = []
    if not params:
        raise SpecError(
            [Problem(str(spec_path), None, "sweep.space", "is empty: nothing to search")]
        )
    for param in params:
        if sampler == "grid" and not param.categorical and param.step is None:
            problems.append(param.problem("the grid sampler needs choices or a range with a step"))
            continue
        base = _condition_values(param, params)
        for value in param.probe_values():
            chosen = overrides_for({**base, param.key: value}, listed_groups(spec_path))
            try:
                loaded = load_spec(spec_path, [*plain, *chosen])
                compile_plan(loaded)
            except SpecError as error:
                inner = "; ".join(
                    f"{p.path}: {p.message}" if p.path else p.message for p in error.problems
                )
                problems.append(param.problem(f"{_show(value)} gives an invalid spec: {inner}"))
                break
    if problems:
        raise SpecError(sort_problems(problems))


def _condition_values(param: Param, params: list[Param]) -> dict[str, Any]:
    """Values of the parameters `param` depends on that make it active (recursively)."""
    by_key = {p.key: p for p in params}
    values: dict[str, Any] = {}
    for key, allowed in param.when.items():
        values.update(_condition_values(by_key[key], params))
        values[key] = allowed[0]
    return values


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else f"'{value}'"
