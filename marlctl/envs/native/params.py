"""Native env params read with their types: a wrong one raises a ValueError whose message
starts with the param's name, which validation places on `env.params.NAME`
(`marlctl.spec.env_problem`).

YAML hands a spec's values over as they are written: `true` where a number goes, `.nan`,
`.inf`, a string or a list. Python would take a bool as 1, and a NaN passes every `<` check
and then poisons the env's state; so each reader names the type it wants and refuses the rest.

Pure (no torch import): validation reads the lbf/ params with these before any env is built.
"""

from __future__ import annotations

import math
from typing import Any


def _show(value: Any) -> str:
    """A value as the spec writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def integer(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """`value` as a whole number in [low, high] (a float with no fraction counts)."""
    bounds = (
        f" from {low:,} to {high:,}"
        if low is not None and high is not None
        else f" of at least {low:,}"
        if low is not None
        else ""
    )
    whole = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value == int(value)
    )
    if not whole or (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be a whole number{bounds}, not {_show(value)}")
    return int(value)


def number(name: str, value: Any, above: float | None = None) -> float:
    """`value` as a finite number, greater than `above` where given."""
    finite = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not finite or (above is not None and value <= above):
        bound = f" above {above:g}" if above is not None else ""
        raise ValueError(f"{name} must be a finite number{bound}, not {_show(value)}")
    return float(value)


def flag(name: str, value: Any) -> bool:
    """`value` as true or false (not a string or number that Python would call truthy)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, not {_show(value)}")
    return value


def choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    """`value`, one of `options`."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be {' or '.join(options)}, not {_show(value)}")
    return value
