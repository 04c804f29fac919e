"""`marlctl validate`."""

from __future__ import annotations

from typing import Annotated

import typer

from marlctl.cli import output
from marlctl.cli.app import JsonOpt, Overrides, load
from marlctl.cli.output import emit_json, fail, say
from marlctl.errors import MarlctlError


def validate(
    spec: Annotated[str, typer.Argument(help="Spec file (.yaml or .toml).")],
    overrides: Overrides = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a spec and its overrides; print every problem (exit 2) or nothing wrong (exit 0)."""
    try:
        loaded, plan = load(spec, overrides, tracked=True)
    except MarlctlError as error:
        fail(error, as_json)
    if as_json:
        emit_json({"ok": True, "spec": loaded.resolved, "runs": len(plan.runs)})
    else:
        say(
            output.err,
            f"{spec}: {plan.algo} on {plan.env.id}, {len(plan.runs)} run(s)",
            "ok",
            "green",
        )
