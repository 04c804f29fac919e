"""Zero-shot coordination on Overcooked: independently trained IPPO seeds cooking together.

Per layout, IPPO at JaxMARL's baseline settings (the jaxmarl-overcooked suite's cell,
`suites/jaxmarl-overcooked/ippo-cramped_room.yaml`: the flattened grid) with
`envs=<layout>`, seeds 0, 1 and 2 trained as one batch, 5M env steps each, in
`--work DIR/<layout>`, or the finished runs already there; then `marlctl eval PARENT --vs
PARENT`, which pairs every two of its seeds with one cook each (both cooks, both ways) and
plays each seed's self-play over the same episodes: greedy, and with `--sampled` as the
policies act in training. Writes `bench/results/overcooked_zsc.md`; the raw matches go to
`bench/results/overcooked_zsc.jsonl`.

    .venv/bin/python bench/overcooked_zsc.py --layouts cramped_room coord_ring --work DIR

A finished run already in `DIR/<layout>/mlflow.db` (e.g. the jaxmarl-overcooked suite's,
copied there) is played as it is; `--budget` sets the env steps of a run trained here.
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

from common import machine, marlctl_json, newest_parent_run, table

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "suites" / "jaxmarl-overcooked" / "ippo-cramped_room.yaml"
OUT = ROOT / "bench" / "results" / "overcooked_zsc.md"
RAW = ROOT / "bench" / "results" / "overcooked_zsc.jsonl"


def trained(cwd: Path, layout: str) -> tuple[str, dict] | None:
    """The newest finished parent run on `layout` in `cwd`'s store: (id, its parameters and
    name)."""
    run = newest_parent_run(cwd, f"params.`env.id` = 'overcooked/{layout}'")
    if run is None:
        return None
    return run.info.run_id, {**run.data.params, "name": run.data.tags.get("mlflow.runName")}


def train(cwd: Path, layout: str, budget: int | None) -> tuple[str, dict]:
    cwd.mkdir(parents=True, exist_ok=True)
    overrides = [f"envs={layout}", f"name=overcooked-zsc-{layout}", "seeds=[0,1,2]"]
    if budget is not None:
        overrides.append(f"train.total_env_steps={budget}")
    print(f"training IPPO on {layout} ...", flush=True)
    summary, wall = marlctl_json(["run", str(SPEC), *overrides], cwd, f"run on {layout}")
    print(f"  {wall / 60:.1f} min", flush=True)
    return trained(cwd, layout)


def play(cwd: Path, parent: str, sampled: bool) -> tuple[dict, float]:
    args = ["eval", parent, "--vs", parent, "--seats", "agents"]
    return marlctl_json(args + (["--sampled"] if sampled else []), cwd, "cross-play")


def section(layout: str, parent: str, params: dict, results: dict) -> list[str]:
    lines = [f"## {layout}", ""]
    steps = int(params.get("train.total_env_steps", 0))
    lines.append(
        f"Parent run `{parent[:8]}` ({params['name']}): IPPO, {steps:,} env steps per seed, "
        f"{params.get('train.eval_episodes')} evaluation episodes per match."
    )
    for mode, (out, _) in results.items():
        (found,) = out["coordination"]
        seeds = {m["run_id"]: m["seed"] for m in out["matches"]}
        runs = sorted(found["runs"], key=lambda r: seeds[r])
        cells = {(c["run"], c["with"]): c["score"] for c in found["cells"]}
        rows = [[f"seed {seeds[a]}", *(f"{cells[(a, b)]:.2f}" for b in runs)] for a in runs]
        lines += ["", f"### {mode.capitalize()} actions", ""]
        lines += table(rows, ["one cook ↓ with the other →", *(f"seed {seeds[r]}" for r in runs)])
        sp, xp = found["self_play"], found["cross_play"]
        ratio = f"{xp / sp:.2f}" if sp and sp > 0 else "—"
        lines += ["", f"Self-play {sp:.2f}, cross-play {xp:.2f}: cross-play / self-play {ratio}."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", default=["cramped_room"])
    parser.add_argument("--work", type=Path, required=True, help="a store per layout here")
    parser.add_argument("--budget", type=int, help="env steps of a run trained here")
    args = parser.parse_args()
    body, raw = [], []
    for layout in args.layouts:
        cwd = args.work / layout
        found = trained(cwd, layout) or train(cwd, layout, args.budget)
        parent, params = found
        results = {}
        for mode, sampled in (("greedy", False), ("sampled", True)):
            results[mode] = play(cwd, parent, sampled)
            for m in results[mode][0]["matches"]:
                raw.append({"layout": layout, "mode": mode, **m})
        body += ["", *section(layout, parent, params, results)]
        coordination = {m: r[0]["coordination"][0] for m, r in results.items()}
        print(layout, {m: (c["self_play"], c["cross_play"]) for m, c in coordination.items()})
    head = [
        "# Zero-shot coordination on Overcooked",
        "",
        f"Written {date.today()} by `.venv/bin/python bench/overcooked_zsc.py --layouts "
        f"{' '.join(args.layouts)}`. Machine: {machine()}.",
        "",
        "IPPO at JaxMARL's baseline Overcooked settings "
        "(`suites/jaxmarl-overcooked/ippo-cramped_room.yaml`, `envs=<layout>`, seeds 0, 1 "
        "and 2: one network shared by both cooks on the flattened grid, each seed trained "
        "independently of the others). "
        "`marlctl eval PARENT --vs PARENT --seats agents` pairs every two of its seeds: one "
        "seed's policy plays one cook and the other seed's the other cook, for both cooks and "
        "both ways round, over the seat seed's evaluation episodes; the diagonal is each "
        "seed's self-play over the same episodes. A cell is the sparse return (20 per soup "
        "delivered), the mean over those matches. Greedy: each policy's most probable action; "
        "sampled: actions drawn as in training. Every episode starts the cooks on the same "
        "cells (`random_reset: false`, as JaxMARL's baseline trains), only facing random "
        "ways, so greedy episodes differ little and the sampled matrix is the fuller test.",
    ]
    OUT.write_text("\n".join(head + body) + "\n")
    with RAW.open("w") as f:
        for row in raw:
            f.write(json.dumps(row) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
