"""The pydantic base of every spec section and algorithm config."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Strict(BaseModel):
    """Unknown keys are errors, values are frozen, and `true`/`false` is never a number
    (pydantic alone reads `total_env_steps: true` as 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            field = cls.model_fields.get(name) if isinstance(name, str) else None
            if isinstance(value, bool) and field is not None and _numeric(field.annotation):
                # As text the value fails the field's own check, located at the field.
                data = {**data, name: "true" if value else "false"}
        return data


def _numeric(annotation: Any) -> bool:
    """Whether a field takes numbers (and maybe None) and nothing else."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
    else:
        options = [annotation]
    return bool(options) and all(a in (int, float) for a in options)
