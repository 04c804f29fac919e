"""The typer app every command registers with, the options they share, and the first step of every
command that reads a spec: load it, check it, plan it."""

from __future__ import annotations

from typing import Annotated

import typer

from marlctl.cli import output
from marlctl.cli.output import say
from marlctl.errors import SpecError

app = typer.Typer(
    name="marlctl",
    help="Declarative experiments for multi-agent reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
TrustOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--trust-factory",
        metavar="MODULE:FACTORY",
        help="Let a spec read from the tracking store import and call this env factory or "
        "scripted policy (repeatable; or list them in MARLCTL_TRUSTED_FACTORIES).",
    ),
]


def trust(factories: list[str] | None) -> None:
    """Trusted env factories for this command and the run processes it starts."""
    import os

    from marlctl.envs.registry import TRUSTED_FACTORIES_VAR

    if factories:
        known = [f for f in os.environ.get(TRUSTED_FACTORIES_VAR, "").split(",") if f]
        os.environ[TRUSTED_FACTORIES_VAR] = ",".join([*known, *factories])


Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Hydra overrides, e.g. algo.lr=3e-4 seeds=[0,1] +env.params.N=4", show_default=False
    ),
]


def load(spec_path: str, overrides: list[str] | None, tracked: bool = False):
    """The spec and its plan; with `tracked`, its tracking server answering too (the
    commands that log to it)."""
    from marlctl.plan import compile_plan
    from marlctl.spec import load_spec, tracking_problem

    loaded = load_spec(spec_path, overrides or [])
    for note in loaded.notes:  # what composition changed for the user, e.g. dropped params
        say(output.err, note, "note", "yellow")
    problem = tracking_problem(loaded) if tracked else None
    try:
        plan = compile_plan(loaded)
    except SpecError as error:
        if problem is not None:
            from marlctl.spec import sort_problems

            raise SpecError(sort_problems([*error.problems, problem])) from None
        raise
    if problem is not None:
        raise SpecError([problem])
    return loaded, plan
