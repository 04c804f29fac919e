"""`marlctl eval`: evaluate a trained policy, or play runs against each other (`--vs`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from rich.table import Table

from marlctl.cli import output
from marlctl.cli.app import JsonOpt, TrustOpt, trust
from marlctl.cli.output import emit_json, exit_codes, print_table, say, stop_on_sigterm


class Backend(StrEnum):
    native = "native"
    pettingzoo = "pettingzoo"


class Seats(StrEnum):
    auto = "auto"
    groups = "groups"
    agents = "agents"


BackendOpt = Annotated[
    Backend | None,
    typer.Option("--backend", help="Env backend to evaluate on (default: the run's)."),
]
EpisodesOpt = Annotated[
    int | None,
    typer.Option("--episodes", min=1, help="Episodes per run (default: the run's eval)."),
]
SeedOpt = Annotated[
    int | None,
    typer.Option("--seed", help="Seed of the episodes (default: the run's own eval seed)."),
]
CheckpointOpt = Annotated[
    str | None,
    typer.Option(
        "--checkpoint",
        help="'latest', an artifact path of the run, or a file (default: the final policy).",
    ),
]
RenderOpt = Annotated[
    str | None,
    typer.Option("--render", help="Render episodes to this .gif (or .mp4 with ffmpeg)."),
]
RenderEpisodesOpt = Annotated[
    int, typer.Option("--render-episodes", min=1, help="Episodes in the video.")
]
DeviceOpt = Annotated[
    str | None,
    typer.Option(
        "--device",
        help="auto | cpu | cuda | cuda:N (default: the run's GPU if here, else cpu)",
    ),
]
TrackingUriOpt = Annotated[
    str | None,
    typer.Option("--tracking-uri", help="MLflow store holding the run (default: ./mlflow.db)."),
]
VsOpt = Annotated[
    str | None,
    typer.Option(
        "--vs",
        metavar="RUN_ID,...",
        help="Cross-play: each group this run learned against the other runs' policies in "
        "the other groups, and theirs against this run's (naming this run too pairs its own "
        "seeds); stored with the runs for the report.",
    ),
]
SeatsOpt = Annotated[
    Seats,
    typer.Option(
        "--seats",
        help="With --vs: groups (a run plays one group, the other run the others), agents (a "
        "run plays one agent of a group, the other run its other agents: zero-shot "
        "coordination) or auto (groups where the runs have groups to play against).",
    ),
]
ScenarioOpt = Annotated[
    str | None,
    typer.Option(
        "--scenario",
        help="Melting Pot: play this scenario of the run's substrate as its focal players, "
        "beside the scenario's background population; logs the focal per-capita return to "
        "each seed run as scenario/NAME.",
    ),
]
RecordOpt = Annotated[
    str | None,
    typer.Option(
        "--record",
        metavar="DIR",
        help="Write the episodes played to a new dataset folder, for offline training "
        "(`marlctl data`); every seed run of a parent run goes into the one dataset.",
    ),
]
SampledOpt = Annotated[
    bool,
    typer.Option(
        "--sampled",
        help="Act as the policy does in training (sampled actions; epsilon-greedy for "
        "Q-learners) instead of its most probable actions; 'in training' then shows the "
        "run's sampled evaluation (train.eval_sampled) where it made one.",
    ),
]


def eval_(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="A seed's run or a parent run.")],
    backend: BackendOpt = None,
    episodes: EpisodesOpt = None,
    seed: SeedOpt = None,
    checkpoint: CheckpointOpt = None,
    render: RenderOpt = None,
    render_episodes: RenderEpisodesOpt = 1,
    fps: Annotated[int, typer.Option("--fps", min=1, max=120, help="Video frame rate.")] = 10,
    device: DeviceOpt = None,
    tracking_uri: TrackingUriOpt = None,
    vs: VsOpt = None,
    seats: SeatsOpt = Seats.auto,
    scenario: ScenarioOpt = None,
    record: RecordOpt = None,
    sampled: SampledOpt = False,
    trust_factory: TrustOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a trained policy (deterministic actions, or sampled) on either env backend.

    Without --episodes and --seed it repeats the run's final evaluation.
    """
    stop_on_sigterm()
    trust(trust_factory)
    with exit_codes(as_json):
        recording = _recording(record, sampled, scenario, vs, seats)
    if vs is not None:
        _cross_play(run_id, vs, backend, seed, checkpoint, render, tracking_uri, episodes,
                    device, seats, sampled, as_json)  # fmt: skip
        return
    with exit_codes(as_json):
        from marlctl.evaluation import Render, check_render, evaluate_runs

        video = None
        if render is not None:
            video = Render(check_render(render), render_episodes, fps)
        backend_name = backend.value if backend else None
        summary = evaluate_runs(run_id, tracking_uri, backend_name, episodes, seed, device,
                                checkpoint, video, scenario, recording, sampled)  # fmt: skip
    if as_json:
        emit_json(summary.to_dict())
        return
    table = Table("seed", "backend", "episodes", "eval return", "in training", "groups", "run")
    for r in summary.runs:
        groups = ", ".join(f"{g} {v:.2f}" for g, v in r.returns.items())
        logged = "—" if r.logged_return is None else f"{r.logged_return:.2f}"
        table.add_row(
            str(r.seed),
            r.backend,
            str(r.episodes),
            f"{r.return_mean:.2f}",
            logged,
            groups,
            r.run_id,
        )
    print_table(table, whole=("run",))
    if sampled:
        say(output.out, "actions sampled as in training")
    if scenario is not None:
        say(output.out, f"scenario {scenario}: eval return is the focal players' per-capita "
                        f"return, logged to each seed run as scenario/{scenario}")  # fmt: skip
    for r in summary.runs:
        if r.checkpoint != "policy/final.pt":
            say(output.out, f"weights: {r.checkpoint}")
        if r.video:
            say(output.out, f"wrote {r.video}")
    if summary.dataset:
        d = summary.dataset
        say(output.out, f"recorded {d['episodes']:,} episodes ({d['transitions']:,} "
                        f"transitions) to {d['path']}")  # fmt: skip


def _recording(record: str | None, sampled: bool, scenario: str | None, vs: str | None, seats: str):
    """`--record` as the evaluation takes it, or exit 2 where it, `--sampled` or `--seats`
    conflict with the other options."""
    from marlctl.errors import SpecError
    from marlctl.evaluation import Record, check_record

    if vs is None and seats != "auto":
        raise SpecError.at("--seats", "it chooses the seats of cross-play: add --vs")
    if vs is not None and scenario is not None:
        raise SpecError.at(
            "--scenario", "cross-play plays the runs' own env: leave it out with --vs"
        )
    if vs is not None and record is not None:
        raise SpecError.at("--record", "cross-play is not recorded: leave it out with --vs")
    if record is not None and scenario is not None:
        raise SpecError.at("--record", "a scenario's episodes are not recorded")
    if sampled and scenario is not None:
        raise SpecError.at(
            "--sampled", "a scenario's score, logged to the run, is its most probable actions'"
        )
    return None if record is None else Record(check_record(record))


def _cross_play(
    run_id, vs, backend, seed, checkpoint, render, tracking_uri, episodes, device, seats,
    sampled, as_json,
) -> None:  # fmt: skip
    with exit_codes(as_json):
        from marlctl.errors import SpecError

        given = {"--backend": backend, "--seed": seed, "--checkpoint": checkpoint,
                 "--render": render}  # fmt: skip
        for option, value in given.items():
            if value is not None:
                raise SpecError.at(
                    option,
                    "cross-play plays each run's final policy on its own backend and "
                    "eval episodes; leave it out with --vs",
                )
        others = list(dict.fromkeys(part.strip() for part in vs.split(",") if part.strip()))
        if not others:
            raise SpecError.at("--vs", "name one or more run ids, separated by commas")
        from marlctl.crossplay import cross_play

        result = cross_play(run_id, others, tracking_uri, episodes, device, str(seats), sampled)
    if as_json:
        emit_json(result.to_dict())
        return
    table = Table("seat", "run", "seed", "against", "seed", "seat return", "win rate")
    for m in result.matches:
        win = "—" if m.win_rate is None else f"{m.win_rate:.2f}"
        against = "itself" if m.self_play else m.opponent[:8]
        table.add_row(
            m.label, m.run_id[:8], str(m.seed), against, str(m.opponent_seed),
            f"{m.score:.2f}", win,
        )  # fmt: skip
    print_table(table)
    from marlctl.crossplay import coordination

    for found in coordination(result.matches):
        shown = "—" if found.cross_play is None else f"{found.cross_play:.2f}"
        say(
            output.out,
            f"zero-shot coordination, group {found.seat}"
            f"{' (sampled actions)' if found.sampled else ''}: self-play {found.self_play:.2f}, "
            f"cross-play {shown} (runs {len(found.runs)})",
        )
