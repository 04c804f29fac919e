"""`marlctl bench`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from marlctl.cli import output
from marlctl.cli.app import JsonOpt, Overrides, load
from marlctl.cli.output import arg_problem, emit_json, exit_codes, stop_on_sigterm
from marlctl.errors import SpecError

NumEnvsOpt = Annotated[
    str | None,
    typer.Option(
        "--num-envs",
        metavar="N,N,...",
        help="num_envs values to measure (default: a sweep for the backend and device).",
    ),
]
SecondsOpt = Annotated[
    float, typer.Option("--seconds", min=0.1, max=600, help="Measured time per point.")
]
EnvOnlyOpt = Annotated[
    bool, typer.Option("--env-only", help="Measure env stepping only, no training.")
]


def bench(
    spec: Annotated[str, typer.Argument(help="Spec file (.yaml or .toml).")],
    overrides: Overrides = None,
    num_envs: NumEnvsOpt = None,
    seconds: SecondsOpt = 2.0,
    env_only: EnvOnlyOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Measure env-only and training throughput of the spec's env and algorithm."""
    stop_on_sigterm()
    with exit_codes(as_json):
        sweep = _parse_sizes(num_envs)
        loaded, plan = load(spec, overrides)
        if loaded.spec.data is not None and (env_only or sweep):
            flag = "--env-only" if env_only else "--num-envs"
            raise SpecError([arg_problem(f"{flag}: an offline spec's training steps no env; "
                                         "bench times its gradient steps alone")])  # fmt: skip
        from marlctl.bench import learning_note, run_bench

        console = output.err if as_json else output.out
        console.print(
            f"[bold]{plan.env.id}[/bold] ({loaded.spec.env.backend}) · {plan.algo} · "
            f"{plan.runs[0].device} · {plan.runs[0].threads} thread(s)",
            highlight=False,
            soft_wrap=True,
        )
        # Progress on one transient line; the figures are printed once, in the table.
        with output.err.status("measuring env num_envs=…", spinner="dots") as status:

            def show(point) -> None:
                status.update(f"measured {point.kind} num_envs={point.num_envs}; measuring on…")

            from marlctl.cores import passive_wait

            with passive_wait(plan.passive_wait):  # as `run` would train it
                result = run_bench(loaded, plan, sweep, seconds, train=not env_only, report=show)
    data = result.to_dict()
    best = result.best("train")
    if best is not None:
        data["suggestion_note"] = learning_note(loaded.spec, best.num_envs)
    if as_json:
        emit_json(data)
    else:
        _print(result, data, seconds)


def _print(result, data: dict, seconds: float) -> None:
    """The measurements as a table, the sizes not measured, the fastest training size and
    what the arithmetic columns count."""
    best = result.best("train")
    batched = any(p.seeds > 1 for p in result.points)
    graphs = any(p.mode != "eager" for p in result.points)
    counted = any(p.flop_per_step is not None for p in result.points)
    unit, offline = result.unit, result.unit != "env steps"
    step = unit.removesuffix("s")  # "env step", "gradient step"
    columns = ["measure", "num_envs", f"{unit}/s",
               *([] if offline else ["agent steps/s"]), "peak memory MB"]  # fmt: skip
    table = Table(
        *columns,
        *(["seeds", f"{unit}/s per seed"] if batched else []),
        *([f"MFLOP per {step}", "GFLOP/s"] if counted else []),
        *(["mode", "compile s"] if graphs else []),
    )
    for p in result.points:
        extra = [p.mode, f"{p.compile_s:.2f}" if p.compile_s else ""] if graphs else []
        if counted:
            arithmetic = ["", ""]
            if p.flop_per_step is not None:
                arithmetic = [f"{p.flop_per_step / 1e6:,.2f}", f"{p.flop_per_s / 1e9:,.1f}"]
            extra = arithmetic + extra
        row = [
            p.kind,
            str(p.num_envs),
            f"{p.env_steps_per_s:,.0f}",
            *([] if offline else [f"{p.agent_steps_per_s:,.0f}"]),
            f"{p.peak_memory_mb:,.0f}",
        ]
        table.add_row(*row, *([str(p.seeds), f"{p.per_seed:,.0f}"] if batched else []), *extra)
    output.out.print(table)
    if result.skipped:
        output.out.print(
            f"not measured: {', '.join(result.skipped)} (one call of a smaller size took "
            f"longer than --seconds {seconds:g}; pass --num-envs to measure them)",
            highlight=False,
            soft_wrap=True,
        )
    if best is not None and not offline:
        output.out.print(
            f"fastest training: hardware.num_envs={best.num_envs} "
            f"({best.env_steps_per_s:,.0f} env steps/s); {data['suggestion_note']}",
            highlight=False,
            soft_wrap=True,
        )
    if counted:
        output.out.print(
            "MFLOP per step: matrix products and convolutions, forward and backward, of "
            "one eager training iteration over its steps (torch's FLOP counter); GFLOP/s: "
            "the rate the training reached in them",
            highlight=False,
            soft_wrap=True,
        )


def _parse_sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise SpecError([arg_problem(f"--num-envs: '{text}' is not a list of positive integers")])
    return sizes
