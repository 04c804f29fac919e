"""Benchmark of the shipped suites (`suites/`): how long each takes at a glance, and how well
`marlctl reproduce --dry-run` estimates a cell's cost.

`--smoke`: every suite at `--budget-scale 0.01 --seeds 2` (a verdict for every cell, each
`inconclusive` as the scale says), one after another in a fresh MLflow store, with its
wall-clock: the bar is 30 minutes a suite on 2 CPU cores. `--estimates`: each suite's dry run
at its full budget, beside the wall-clock its cells measured at that budget when they were
last trained in full (the `marlctl run` of BenchMARL's cells in
`bench/results/peer_benchmarl.jsonl`; the LBF cells' in `bench/results/lbf.jsonl`; with
`--store DIR`, what a full `marlctl reproduce SUITE` took in DIR), on the machine each row
names. `--verdicts`: each
BenchMARL cell's verdict at its full budget from those same recorded runs, or with
`--store DIR` each cell's that a full `marlctl reproduce SUITE` finished in DIR. Writes
`bench/results/suites.md`; the raw rows go to `bench/results/suites.jsonl`.

    .venv/bin/python bench/suites.py --smoke
    .venv/bin/python bench/suites.py --verdicts --suites benchmarl-vmas
    .venv/bin/python bench/suites.py --estimates --suites benchmarl-vmas
    .venv/bin/python bench/suites.py --estimates --suites benchmarl-vmas --dry-run-json dry.json
    .venv/bin/python bench/suites.py --estimates --suites baseline-vmas-het --store DIR
    .venv/bin/python bench/suites.py --verdicts --estimates --suites baseline-mpe --store DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path

from common import machine

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "suites"
OUT = ROOT / "bench" / "results" / "suites.md"
DONE = ROOT / "bench" / "results" / "suites.jsonl"
PEER = ROOT / "bench" / "results" / "peer_benchmarl.jsonl"
LBF = ROOT / "bench" / "results" / "lbf.jsonl"
MARLCTL = ROOT / ".venv" / "bin" / "marlctl"


def reproduce(args: list[str], cwd: Path) -> tuple[dict, float]:
    start = time.perf_counter()
    done = subprocess.run(
        [str(MARLCTL), "reproduce", *args, "--json"], cwd=cwd, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"marlctl reproduce {' '.join(args)}: {done.stderr[-2000:]}")
    return json.loads(done.stdout), wall


def smoke(suite: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="suite-"))
    try:
        document, wall = reproduce([str(suite), "--budget-scale", "0.01", "--seeds", "2"], work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kinds: dict[str, int] = {}
    for cell in document["cells"]:
        kinds[cell["kind"]] = kinds.get(cell["kind"], 0) + 1
    return {"kind": "smoke", "suite": suite.stem, "cells": len(document["cells"]),
            "verdicts": kinds, "wall_s": wall}  # fmt: skip


def measured_walls() -> dict[tuple[str, str], tuple[float, str]]:
    """(suite, cell) → the wall-clock its spec's `marlctl run` measured in full, and where:
    marlctl's half of the peer benchmark, and the LBF benchmark's cells at the settings
    `suites/baseline-lbf.yaml` holds (64 envs, 1M env steps)."""
    out = {}
    for line in PEER.read_text().splitlines():
        row = json.loads(line)
        ours = row["marlctl"]
        out[("benchmarl-vmas", f"{row['algo']}-{row['task']}")] = (ours["wall_s"], ours["machine"])
    for line in LBF.read_text().splitlines():
        row = json.loads(line)
        if row.get("num_envs") == 64 and row["steps"] == 1_000_000:
            out[("baseline-lbf", f"{row['algo']}-{row['backend']}")] = (
                row["wall_s"],
                row["machine"],
            )
    return out


def store_client(store: Path):
    """An MLflow client of the store `marlctl reproduce` keeps in folder `store`."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{store.resolve() / 'mlflow.db'}")


def store_walls(suite: str, store: Path) -> dict[tuple[str, str], tuple[float, str]]:
    """(suite, cell) → the wall-clock `marlctl reproduce` took to train the cell's seeds in
    the MLflow store of folder `store` (the duration of the cell's parent run), on this
    machine."""
    client = store_client(store)
    experiments = [e.experiment_id for e in client.search_experiments()]
    query = (
        f"tags.`marlctl.suite` = '{suite}' and tags.`marlctl.role` = 'experiment' "
        "and status = 'FINISHED'"
    )
    out: dict[tuple[str, str], tuple[float, str]] = {}
    for run in client.search_runs(experiments, query, order_by=["attributes.start_time DESC"]):
        seconds = (run.info.end_time - run.info.start_time) / 1000
        out.setdefault((suite, run.data.tags["marlctl.cell"]), (seconds, machine()))
    return out


def estimates(
    suite: Path, saved: Path | None, store: Path | None = None, cells: list[str] | None = None
) -> list[dict]:
    """The suite's dry run (or the `--json` output of one saved in `saved`) beside the
    measured wall-clocks (also those of a full `marlctl reproduce` in `store`)."""
    if saved is not None:
        document = json.loads(saved.read_text())
    else:
        work = Path(tempfile.mkdtemp(prefix="suite-"))
        try:
            document, _ = reproduce([str(suite), "--dry-run"], work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    known = measured_walls() | (store_walls(suite.stem, store) if store else {})
    rows = []
    for cell in document["cells"]:
        found = known.get((suite.stem, cell["name"]))
        if cell["cost"] is None or found is None or (cells and cell["name"] not in cells):
            continue
        rows.append({
            "kind": "estimate", "suite": suite.stem, "cell": cell["name"],
            "estimated_s": cell["cost"]["total_s"], "measured_s": found[0],
            "measured_on": found[1],
        })  # fmt: skip
    return rows


def recorded_verdicts(suite: Path) -> list[dict]:
    """Each cell's verdict at its full budget from the seeds its spec trained in full when the
    peer benchmark ran it (the suite's cell specs are those runs' specs), judged as
    `marlctl reproduce` judges: `report.reproduction.decide` on the reference's interval."""
    import sys

    sys.path.insert(0, str(ROOT))
    from marlctl.report.reproduction import decide
    from marlctl.reproduce.runner import plan_suite

    recorded = {}
    for line in PEER.read_text().splitlines():
        row = json.loads(line)
        recorded[f"{row['algo']}-{row['task']}"] = row
    rows = []
    for cp in plan_suite(str(suite), []):  # each reference translated as `reproduce` does
        row = recorded.get(cp.name)
        if row is None or cp.translated is None or row["frames"] != cp.translated.budget:
            continue
        bounds = cp.translated.bounds
        verdict = decide(row["marlctl"]["final"], bounds)
        rows.append({
            "kind": "verdict", "suite": suite.stem, "cell": cp.name, "verdict": verdict.kind,
            "ours": [verdict.ours.value, verdict.ours.low, verdict.ours.high],
            "reference": list(bounds), "seeds": len(row["marlctl"]["final"]),
            "budget": cp.translated.budget, "trained": row["marlctl"]["measured"],
            "trained_on": row["marlctl"]["machine"], "note": cp.cell.note,
        })  # fmt: skip
    return rows


def ended(client, run_ids: list[str]) -> str:
    """The UTC date the last of runs `run_ids` in `client`'s store ended."""
    last = max(client.get_run(run_id).info.end_time for run_id in run_ids)
    return str(datetime.fromtimestamp(last / 1000, tz=UTC).date())


def store_verdicts(suite: Path, store: Path, cells: list[str] | None = None) -> list[dict]:
    """Each cell's verdict from a full `marlctl reproduce SUITE` in the MLflow store of folder
    `store` (the cells it finished: `marlctl reproduce` judges their runs again and trains
    nothing, as it would for a second identical command); `cells`: those only."""
    import sys

    sys.path.insert(0, str(ROOT))
    from marlctl.reproduce.runner import plan_suite

    finished = sorted(cell for (_, cell) in store_walls(suite.stem, store))
    finished = [c for c in finished if cells is None or c in cells]
    if not finished:
        return []
    document, _ = reproduce([str(suite), "--cells", ",".join(finished)], store)
    notes = {cp.name: cp.cell.note for cp in plan_suite(str(suite), [])}
    client = store_client(store)
    rows = []
    for cell in document["cells"]:
        if cell["ours"] is None or cell["reference"] is None:
            continue
        ours = cell["ours"]
        rows.append({
            "kind": "verdict", "suite": suite.stem, "cell": cell["name"], "verdict": cell["kind"],
            "ours": [ours["value"], ours["low"], ours["high"]], "reference": cell["reference"],
            "seeds": cell["seeds"], "budget": cell["budget"],
            "trained": ended(client, cell["run_ids"]), "trained_on": machine(),
            "note": notes.get(cell["name"]),
        })  # fmt: skip
    return rows


def section(title: str, text: str, columns: list[str]) -> list[str]:
    """A section's heading, its explanation and its table's header."""
    return [f"## {title}", "", text, "", "| " + " | ".join(columns) + " |",
            "|" + "---|" * len(columns)]  # fmt: skip


def table(rows: list[dict]) -> str:
    machines: list[str] = []
    for r in rows:
        for m in (r.get("machine"), r.get("measured_on"), r.get("trained_on")):
            if m and m not in machines:
                machines.append(m)

    def at(m: str) -> str:
        return f"({machines.index(m) + 1})"

    named = "; ".join(f"{at(m)} {m}" for m in machines)
    lines = [
        "# Shipped suites: cost at a glance and the dry run's estimates",
        "",
        f"Written {date.today()} by `.venv/bin/python bench/suites.py` (`--smoke`, "
        f"`--verdicts`, `--estimates`). Machines: {named}.",
        "",
    ]
    smokes = [r for r in rows if r["kind"] == "smoke"]
    if smokes:
        lines += section(
            "Every suite at `--budget-scale 0.01 --seeds 2`",
            "`marlctl reproduce SUITE --budget-scale 0.01 --seeds 2` in a fresh store, one "
            "suite at a time, nothing else running; the bar: under 30 minutes a suite on 2 "
            "CPU cores, with a verdict for every cell.",
            ["suite", "cells", "verdicts", "wall-clock", "measured", "machine"],
        )
        for r in smokes:
            verdicts = ", ".join(f"{n} {k}" for k, n in sorted(r["verdicts"].items()))
            lines.append(
                f"| {r['suite']} | {r['cells']} | {verdicts} | {r['wall_s'] / 60:.1f} min | "
                f"{r['measured']} | {at(r['machine'])} |"
            )
        lines.append("")
    judged = [r for r in rows if r["kind"] == "verdict"]
    if judged:
        lines += section(
            "Verdicts at the full budget",
            "Each cell's seeds trained in full with the cell's spec (the peer benchmark's runs, "
            "or a full `marlctl reproduce` of the suite), judged as `marlctl reproduce` judges "
            "them: ours the mean of the final returns with "
            "its 95% percentile-bootstrap interval, against the reference's interval (the same "
            "bootstrap over its per-seed values). A `below` is explained in the suite's `note`.",
            ["suite", "cell", "verdict", "ours", "reference", "seeds", "env steps", "trained",
             "note"],
        )  # fmt: skip
        for r in judged:
            value, low, high = r["ours"]
            lines.append(
                f"| {r['suite']} | {r['cell']} | {r['verdict']} | {value:.3f} [{low:.3f}, "
                f"{high:.3f}] | [{r['reference'][0]:.3f}, {r['reference'][1]:.3f}] | "
                f"{r['seeds']} | {r['budget']:,} | {r['trained']} {at(r['trained_on'])} | "
                f"{r['note'] or ''} |"
            )
        counts = Counter(r["verdict"] for r in judged)
        lines += ["", ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + ".", ""]
    found = [r for r in rows if r["kind"] == "estimate"]
    if found:
        lines += section(
            "The dry run's estimate against the measured cost",
            "`marlctl reproduce SUITE --dry-run` at the full budget (each cell's first run "
            "process timed on 2 s of steady training and one evaluation), beside the "
            "wall-clock the same cell measured in full (its `marlctl run` in the peer "
            "benchmark, or a full `marlctl reproduce` of the suite), on the machine named. "
            "The bar: within a factor of 2 either way.",
            ["suite", "cell", "estimated", "measured", "measured / estimated", "estimated on",
             "measured on"],
        )  # fmt: skip
        for r in found:
            lines.append(
                f"| {r['suite']} | {r['cell']} | {r['estimated_s'] / 60:.1f} min | "
                f"{r['measured_s'] / 60:.1f} min | {r['measured_s'] / r['estimated_s']:.2f} | "
                f"{at(r['machine'])}, {r['measured']} | {at(r['measured_on'])} |"
            )
        ratios = [r["measured_s"] / r["estimated_s"] for r in found]
        lines += ["", f"Ratios from {min(ratios):.2f} to {max(ratios):.2f}.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(p.stem for p in sorted(SUITES.glob("*.yaml"))))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--estimates", action="store_true")
    parser.add_argument(
        "--verdicts",
        action="store_true",
        help="each cell's verdict from its recorded full-budget runs (benchmarl-vmas), or "
        "with --store from the cells a full `marlctl reproduce SUITE` finished there",
    )
    parser.add_argument(
        "--dry-run-json",
        type=Path,
        help="with --estimates and one suite: the saved `--dry-run --json` output of it",
    )
    parser.add_argument(
        "--store",
        type=Path,
        help="with --estimates and one suite: a folder where `marlctl reproduce SUITE` trained "
        "it in full; each cell's wall-clock there is its measured cost",
    )
    parser.add_argument("--cells", help="with --verdicts --store: these cells only (by name)")
    args = parser.parse_args()
    rows = [json.loads(line) for line in DONE.read_text().splitlines()] if DONE.exists() else []
    where, today = machine(), str(date.today())
    for name in args.suites.split(","):
        suite = SUITES / f"{name}.yaml"
        new = [smoke(suite)] if args.smoke else []
        if args.verdicts:
            cells = args.cells.split(",") if args.cells else None
            new += (store_verdicts(suite, args.store, cells) if args.store
                    else recorded_verdicts(suite))  # fmt: skip
        if args.estimates:
            cells = args.cells.split(",") if args.cells else None
            new += estimates(suite, args.dry_run_json, args.store, cells)
        for row in new:
            row.update(machine=where, measured=today)
            same = ("suite", "cell", "kind")
            rows = [r for r in rows if any(r.get(k) != row.get(k) for k in same)] + [row]
        DONE.write_text("".join(json.dumps(r) + "\n" for r in rows))
        OUT.write_text(table(rows))


if __name__ == "__main__":
    main()
