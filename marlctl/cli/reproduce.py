"""`marlctl reproduce`: a suite's cells trained and judged against their references."""

from __future__ import annotations

from typing import Annotated

import typer

from marlctl.cli.app import JsonOpt, Overrides
from marlctl.cli.output import emit_json, exit_codes, print_rows, stop_on_sigterm

CellsOpt = Annotated[
    str | None,
    typer.Option("--cells", help="Only these cells: names or shell patterns, comma-separated."),
]
SeedsOpt = Annotated[
    int | None, typer.Option("--seeds", min=1, help="Seeds per cell (default: each cell's own).")
]
ScaleOpt = Annotated[
    float,
    typer.Option(
        "--budget-scale",
        min=0.001,
        max=1.0,
        help="Train each cell for this fraction of its budget; its verdict is then inconclusive.",
    ),
]


RerunOpt = Annotated[
    bool,
    typer.Option("--rerun", help="Train every seed, also those the store holds finished."),
]


def reproduce(
    suite: Annotated[str, typer.Argument(help="Suite file (.yaml or .toml).")],
    overrides: Overrides = None,
    cells: CellsOpt = None,
    seeds: SeedsOpt = None,
    scale: ScaleOpt = 1.0,
    rerun: RerunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Train a suite's cells and judge each against its published reference; seeds already
    finished with the same spec and versions are not trained again."""
    stop_on_sigterm()
    with exit_codes(as_json):
        from marlctl.reproduce.runner import reproduce as run_suite

        outcomes = run_suite(suite, overrides or [], cells, seeds, scale, rerun)
    failed = any(o.kind == "failed" for o in outcomes)
    if as_json:
        emit_json({"ok": not failed, "cells": [o.to_dict() for o in outcomes]})
    else:
        print_rows(
            ["cell", "verdict", "ours", "reference", "env steps", "seeds", "wall-clock", "run"],
            [_row(o) for o in outcomes],
            whole=(0, 7),
        )
    if failed:
        raise typer.Exit(1)


def _row(o) -> list[str]:
    ours = "—" if o.ours is None else f"{o.ours.value:.2f} [{o.ours.low:.2f}, {o.ours.high:.2f}]"
    ref = "—" if o.reference is None else f"[{o.reference[0]:.2f}, {o.reference[1]:.2f}]"
    verdict = f"{o.kind}: {o.reason}" if o.reason else o.kind
    seeds = f"{o.seeds} ({o.reused} done before)" if o.reused else str(o.seeds)
    return [o.name, verdict, ours, ref, f"{o.budget:,}", seeds, f"{o.wall_s:.0f} s",
            o.run_id or "—"]  # fmt: skip
