"""`marlctl list`: the registered algorithms and environments."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from marlctl.cli import output
from marlctl.cli.app import JsonOpt
from marlctl.cli.output import emit_json, print_rows


class ListWhat(StrEnum):
    algos = "algos"
    envs = "envs"


MatchOpt = Annotated[
    str | None, typer.Option("--match", help="envs: only ids containing this text.")
]
DescribeOpt = Annotated[
    bool,
    typer.Option(
        "--describe",
        help="envs: build each installed env at its preset's params and show its agent "
        "groups, spaces and global state.",
    ),
]


def list_(
    what: Annotated[ListWhat, typer.Argument(help="algos or envs")] = ListWhat.algos,
    match: MatchOpt = None,
    describe: DescribeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Show registered algorithms or environments with their capabilities."""
    if what is ListWhat.algos:
        _list_algos(as_json)
    else:
        _list_envs(match, describe, as_json)


def _list_algos(as_json: bool) -> None:
    from marlctl.algos import registered_algos

    rows = [
        {
            "name": a.name,
            "actions": a.action_kinds,
            "on_policy": a.on_policy,
            "centralised_critic": a.centralised_critic,
            "needs_global_state": a.centralised_critic,
            "recurrent": a.recurrent,
            "replay": a.replay,
            "offline": a.offline,
            "summary": a.summary,
            "params": {
                k: {"default": f.default, "description": f.description}
                for k, f in a.config.model_fields.items()
                if k != "name"
            },
        }
        for a in registered_algos().values()
    ]
    if as_json:
        emit_json({"algos": rows})
        return
    cells = [
        [
            row["name"],
            ", ".join(row["actions"]),
            "on" if row["on_policy"] else "offline" if row["offline"] else "off",
            "yes" if row["needs_global_state"] else "no",
            "gru" if row["recurrent"] else "no",
            row["summary"],
        ]
        for row in rows
    ]
    print_rows(["algo", "actions", "policy", "state", "rnn", "summary"], cells, whole=1)


def _list_envs(match: str | None, describe: bool, as_json: bool) -> None:
    from marlctl.envs.registry import lookup, registered_ids

    rows = [
        _env_row(lookup(env_id)) for env_id in registered_ids() if match is None or match in env_id
    ]
    if describe:
        for row in rows:
            row["description"] = _describe_env(row) if row["installed"] else None
    if as_json:
        emit_json({"envs": rows})
        return
    header = ["env", "backends", "installed", "preset", "summary"]
    cells = [
        [
            row["id"],
            ", ".join(row["backends"]),
            "yes" if row["installed"] else f"no: {row['install']}",
            row["preset"],
            row["summary"],
            *([_describe_text(row.get("description"))] if describe else []),
        ]
        for row in rows
    ]
    header += ["agents and spaces"] if describe else []
    if output.out.is_terminal and output.out.width < _natural_width(header, cells):
        _print_stacked(cells)
    else:
        print_rows(header, cells, whole=(0, 3))
    if output.out.is_terminal:
        output.out.print(
            "A spec picks an env's preset with envs=NAME (envs/NAME.yaml). Any PettingZoo "
            "ParallelEnv also works as env.id: package.module:factory"
        )


def _natural_width(header: list[str], cells: list[list[str]]) -> int:
    """The width a table of these cells takes without wrapping any: each column as wide as its
    longest cell, a space either side, a rule between."""
    widest = [max([len(h), *(len(row[j]) for row in cells)]) for j, h in enumerate(header)]
    return sum(widest) + 3 * len(widest) + 1


def _print_stacked(cells: list[list[str]]) -> None:
    """Envs in a terminal too narrow for one line each: the id and its preset whole, one over
    the other, beside the rest, which wraps."""
    from rich import box

    width = max(max(len(row[0]), len(f"envs={row[3]}")) for row in cells) if cells else 3
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("env / preset", no_wrap=True, min_width=width)
    table.add_column("backends · installed · summary", overflow="fold")
    for row in cells:
        first = Text(f"{row[0]}\nenvs={row[3]}")
        installed = "installed" if row[2] == "yes" else f"not installed{row[2][2:]}"
        rest = Text(" · ".join([row[1], installed, row[4], *row[5:]]))  # no markup: [sisl]
        table.add_row(first, rest)
    output.out.print(table)


def _env_row(entry) -> dict:
    from marlctl.envs.registry import backends, preset_name

    return {
        "id": entry.id,
        "suite": entry.suite,
        "backends": backends(entry.id),
        "factory": entry.factory,
        "installed": entry.installed,
        "missing": list(entry.missing),  # modules not installed
        "install": entry.install_hint,  # the command that installs them, or null
        "preset": preset_name(entry.id),  # envs=NAME
        "summary": entry.summary,
    }


def _describe_env(row: dict) -> dict:
    """An env's groups, spaces and global state, built at its preset's params."""
    from marlctl.envs.probe import probe
    from marlctl.spec import preset_roots

    params: dict = {}
    for root in preset_roots():
        path = root / "envs" / f"{row['preset']}.yaml"
        if path.is_file():
            import yaml

            params = dict(
                (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("params") or {}
            )
            break
    try:
        info = probe(row["id"], params)
    except Exception as err:  # an env that does not build here: say so, list the rest
        return {"error": f"{type(err).__name__}: {err}"}
    return {
        "groups": [
            {
                "name": g.name,
                "agents": list(g.agents),
                "obs_shape": list(g.obs_shape),
                "actions": f"Discrete({g.n_actions})" if g.discrete else f"Box({g.n_actions},)",
                "action_mask": g.mask_source is not None,
            }
            for g in info.groups
        ],
        "state_dim": info.state_dim,
        "state_frame": list(info.state_frame) if info.state_frame else None,
        "state_from_env": info.state_from_env,
        "turn_based": info.turn_based,
        "objectives": info.objectives,
        "schedulable": list(info.schedulable),
    }


def _describe_text(description: dict | None) -> str:
    if description is None:
        return "not installed"
    if "error" in description:
        return description["error"]
    parts = [
        f"{g['name']} ×{len(g['agents'])}: obs {tuple(g['obs_shape'])}, {g['actions']}"
        + (", masked" if g["action_mask"] else "")
        for g in description["groups"]
    ]
    state = "env state" if description["state_from_env"] else "observations"
    frame = description.get("state_frame")
    shape = f"a {'x'.join(map(str, frame))} frame, " if frame else ""
    parts.append(f"state {description['state_dim']} ({shape}{state})")
    if description["turn_based"]:
        parts.append("turn-based")
    if description["objectives"]:
        parts.append(f"{description['objectives']} objectives")
    if description["schedulable"]:
        parts.append(f"train.schedule may change {', '.join(description['schedulable'])}")
    return "; ".join(parts)
