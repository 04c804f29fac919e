"""`marlctl data`: the datasets offline algorithms train from: list, describe, split, merge,
import, and log one as a run's artifact."""

from __future__ import annotations

from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from marlctl.cli import output
from marlctl.cli.app import JsonOpt
from marlctl.cli.output import emit_json, exit_codes, print_table, say


class DataAction(StrEnum):
    list = "list"
    describe = "describe"
    split = "split"
    merge = "merge"
    import_ = "import"
    log = "log"


OutOpt = Annotated[
    str | None,
    typer.Option("--out", help="split: the folder for the levels; merge: the new dataset."),
]
EnvOpt = Annotated[
    str | None,
    typer.Option("--env", help="import: the registered env id the Vault's episodes are of."),
]
RunOpt = Annotated[
    str | None,
    typer.Option("--run", help="log: the run (its id, or the start of it) to keep it."),
]
ArtifactPathOpt = Annotated[
    str, typer.Option("--path", help="log: the folder in the run's artifacts.")
]
TrackingUriOpt = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri", help="log: MLflow store holding the run (default: ./mlflow.db)."
    ),
]
LevelsOpt = Annotated[
    str,
    typer.Option(
        "--levels",
        help="split: the level names, lowest returns first; the episodes are cut at the "
        "return quantiles that divide them evenly (three levels: thirds).",
    ),
]


def data(
    action: Annotated[
        DataAction, typer.Argument(help="list, describe, split, merge, import or log")
    ],
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[PATH]...",
            help="list: folders to search (default: .); describe, split: one dataset; "
            "merge: the datasets to join; import: an Off-the-Grid MARL Vault's folder; log: "
            "one dataset.",
        ),
    ] = None,
    out: OutOpt = None,
    levels: LevelsOpt = "poor,medium,good",
    env: EnvOpt = None,
    run: RunOpt = None,
    path: ArtifactPathOpt = "dataset",
    tracking_uri: TrackingUriOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Datasets recorded with `marlctl eval RUN --record DIR`: list them, describe one
    (episodes, size, returns), split one by episode quality, merge several, import an
    Off-the-Grid MARL dataset (a flashbax Vault), or log one as a run's artifact, which a
    spec then names as `data: runs:/RUN_ID/PATH`."""
    paths = paths or []
    with exit_codes(as_json):
        from marlctl.data import ops
        from marlctl.errors import SpecError

        if action is DataAction.list:
            found = [d for root in paths or ["."] for d in ops.find(Path(root))]
            _print_list(found, as_json)
            return
        one = (DataAction.describe, DataAction.split, DataAction.import_, DataAction.log)
        if action in one and len(paths) != 1:
            raise SpecError.at("PATH", f"{action.value}: name one dataset")
        if action is DataAction.describe:
            _print_description(ops.describe(Path(paths[0])), as_json)
            return
        if action is DataAction.log:
            _log(Path(paths[0]), run, path, tracking_uri, as_json)
            return
        if out is None:
            raise SpecError.at("--out", f"{action.value}: name the folder to write")
        if action is DataAction.split:
            names = tuple(n.strip() for n in levels.split(",") if n.strip())
            if len(names) < 2 or len(set(names)) != len(names):
                raise SpecError.at("--levels", "two or more distinct level names")
            cuts = tuple(i / len(names) for i in range(1, len(names)))
            written = ops.split(Path(paths[0]), Path(out), cuts, names)
            _print_written({name: str(Path(out) / name) for name in written}, written, as_json)
            return
        if action is DataAction.import_:
            _import_vault(Path(paths[0]), Path(out), env, as_json)
            return
        if len(paths) < 2:
            raise SpecError.at("PATH", "merge: name two or more datasets")
        merged = ops.merge([Path(p) for p in paths], Path(out))
        _print_written({"merged": out}, {"merged": merged}, as_json)


def _log(folder: Path, run: str | None, path: str, uri: str | None, as_json: bool) -> None:
    from marlctl import tracking
    from marlctl.data.artifacts import log_dataset
    from marlctl.errors import SpecError

    if run is None:
        raise SpecError.at("--run", "log: name the run to keep the dataset")
    path = path.strip("/")
    if not path:
        raise SpecError.at("--path", "log: name a folder in the run's artifacts")
    tracking.check_store(uri)
    client = tracking.client_for(uri)
    uri_of = log_dataset(client, tracking.resolve_run_id(client, run, "--run"), folder, path)
    if as_json:
        emit_json({"dataset": str(folder), "uri": uri_of})
        return
    say(output.out, f"logged {folder} as {uri_of}: name it in a spec as `data: {uri_of}`")


def _import_vault(folder: Path, out: Path, env: str | None, as_json: bool) -> None:
    from marlctl.data.vault import convert_vault
    from marlctl.envs.probe import probe
    from marlctl.errors import SpecError

    if env is None:
        raise SpecError.at("--env", "import: name the env the Vault's episodes are of")
    try:
        info = probe(env, {})
    except Exception as err:
        raise SpecError.at("--env", f"{env}: {err}") from None
    manifest = convert_vault(folder, out, info)
    _print_written({"imported": str(out)}, {"imported": manifest}, as_json)


def _print_list(found: list, as_json: bool) -> None:
    if as_json:
        emit_json({"datasets": [asdict(d) for d in found]})
        return
    from marlctl.data.ops import size_text

    table = Table("dataset", "env", "episodes", "transitions", "size", "return mean", "note")
    for d in found:
        table.add_row(d.path, d.env_id, f"{d.episodes:,}", f"{d.transitions:,}",
                      size_text(d.bytes), f"{d.return_mean:.3f}", d.note)  # fmt: skip
    print_table(table, whole=("dataset",))
    if not found:
        say(output.out, "no datasets found")


def _print_description(d, as_json: bool) -> None:
    if as_json:
        emit_json(asdict(d))
        return
    from marlctl.data.ops import size_text

    say(output.out, f"{d.path}: {d.env_id} ({d.backend}, {d.env_package})")
    groups = ", ".join(f"{g['name']} x{len(g['agents'])}" for g in d.groups)
    say(output.out, f"groups: {groups}")
    say(output.out, f"{d.episodes:,} episodes, {d.transitions:,} transitions, "
                    f"{size_text(d.bytes)} in {d.chunks} chunk(s)")  # fmt: skip
    q = d.quantiles
    say(output.out, f"return: mean {d.return_mean:.3f}, std {d.return_std:.3f}, min "
                    f"{d.return_min:.3f}, quartiles {q['q25']:.3f} / {q['q50']:.3f} / "
                    f"{q['q75']:.3f}, max {d.return_max:.3f}")  # fmt: skip
    table = Table("return from", "to", "episodes", "")
    most = max(b["episodes"] for b in d.histogram) or 1
    for b in d.histogram:
        bar = "#" * round(30 * b["episodes"] / most)
        table.add_row(f"{b['low']:.3f}", f"{b['high']:.3f}", f"{b['episodes']:,}", bar)
    print_table(table)
    for s in d.sources:
        who = "random" if s["run_id"] is None else f"run {s['run_id']} (seed {s['seed']})"
        say(output.out, f"source: {who}, {s['mode']} actions")
    if d.note:
        say(output.out, f"note: {d.note}")


def _print_written(paths: dict[str, str], manifests: dict, as_json: bool) -> None:
    rows = [
        {"name": name, "path": paths[name], "episodes": m.episodes, "transitions": m.transitions,
         "return_mean": sum(m.returns) / len(m.returns)}
        for name, m in manifests.items()
    ]  # fmt: skip
    if as_json:
        emit_json({"datasets": rows})
        return
    table = Table("level", "dataset", "episodes", "transitions", "return mean")
    for r in rows:
        table.add_row(r["name"], r["path"], f"{r['episodes']:,}", f"{r['transitions']:,}",
                      f"{r['return_mean']:.3f}")  # fmt: skip
    print_table(table, whole=("dataset",))
