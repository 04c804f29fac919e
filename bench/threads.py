"""Benchmark: torch threads of a run on a machine other processes use (threads_per_run).

Short `marlctl run`s of MAPPO on native simple_spread, 256 envs
(`specs/spread_mappo_native.yaml`, 8 iterations of 25,600 env steps) and of QMIX on it
(`algos=qmix`, 16 envs, 30,000 env steps), each with `hardware.threads_per_run` auto, 1 and 2:

- alone;
- beside a busy loop (`while True: pass` in a Python subprocess: one core);
- beside another marlctl training run (the other algorithm, threads auto, started first).

Besides: MAPPO with 2 threads and `OMP_WAIT_POLICY=PASSIVE` alone (what waiting passively
costs where no other process needs the cores), MAPPO with 2 threads spinning as libgomp does
by default beside the busy loop (as it ran before marlctl chose the wait), and QMIX beside a
MAPPO run with a fixed 2 threads started on an idle machine. For each run: its env steps/s
(`perf/env_steps_per_s_mean`), the threads it started with and used (param
`hardware.threads_per_run`, metric `perf/threads`), how its OpenMP threads waited, and how
the neighbour fared meanwhile: the busy loop's CPU time, or the other run's env steps/s from
its own metrics against its rate alone. The cores other processes kept busy (one second of
/proc/stat) before each group, and the load average before and after, go in the notes:
other users' processes may share the machine. Writes `bench/results/threads.md` and
`bench/results/threads.jsonl` (one line per run).

    .venv/bin/python bench/threads.py      # about 12 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from common import machine, marlctl_json, table

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "spread_mappo_native.yaml"
OUT = ROOT / "bench" / "results" / "threads.md"
JSONL = ROOT / "bench" / "results" / "threads.jsonl"
WORKDIR = ROOT / "bench" / "runs" / "threads"
COMMON = ["hardware.device=cpu", "train.eval_every=0", "train.eval_episodes=2"]
QMIX = ["algos=qmix", "~algo.epochs", "~algo.minibatches"]
WORKLOADS = {
    "MAPPO": ["hardware.num_envs=256", "train.total_env_steps=204800", *COMMON],
    "QMIX": [*QMIX, "hardware.num_envs=16", "train.total_env_steps=30000", *COMMON],
}
# The other run, trained for as long as the measurements beside it take.
NEIGHBOURS = {
    "MAPPO": ["hardware.num_envs=256", "train.log_every=1", *COMMON],
    "QMIX": [*QMIX, "hardware.num_envs=16", "train.log_every=2000", *COMMON],
}
THREADS = ("auto", "1", "2")
WARMUP_S = 30.0  # a neighbour run's start-up, then its rate alone over the last 10 s


def client(folder: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def background() -> float:
    """Cores other processes keep busy, over one second."""
    from marlctl.cores import measure

    return measure(1.0).busy


def measured_run(workload: str, threads: str, by_hand: dict[str, str]) -> dict:
    """One run; `by_hand`: OpenMP settings put in its environment."""
    folder = WORKDIR / "cells"
    start = time.time()
    args = ["run", str(SPEC), *WORKLOADS[workload], f"hardware.threads_per_run={threads}"]
    summary, _ = marlctl_json(
        [*args, f"name=threads-{workload.lower()}"], folder, f"run {workload}",
        env={**os.environ, **by_hand},
    )  # fmt: skip
    end = time.time()
    run = summary["runs"][0]
    store = client(folder)
    data = store.get_run(run["run_id"]).data
    first = int(data.params["hardware.threads_per_run"])
    used = sorted({int(m.value) for m in store.get_metric_history(run["run_id"], "perf/threads")})
    if by_hand:
        wait = ", ".join(f"{k}={v}" for k, v in by_hand.items()) + " by hand"
    elif "OMP_WAIT_POLICY=PASSIVE" in data.tags.get("marlctl.threads", ""):
        wait = "passive (marlctl)"
    else:
        wait = "spins (OpenMP's default)" if max(used or [first]) > 1 else "–"
    return {
        "workload": workload,
        "threads_per_run": threads,
        "by_hand": by_hand,
        "wait": wait,
        "started_with": first,
        "used": used or [first],
        "steps_per_s": run["steps_per_s"],
        "start": start,
        "end": end,
    }


class BusyLoop:
    name = "a busy loop"

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(1.0)
        return self

    def mark(self, cell: dict) -> None:
        cell["_cpu0"] = cpu_seconds(self.proc.pid)

    def settle(self, cell: dict) -> None:
        used = cpu_seconds(self.proc.pid) - cell.pop("_cpu0")
        cell["neighbour"] = {"cpu_cores": used / (cell["end"] - cell["start"])}

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


class NeighbourRun:
    """Another algorithm's `marlctl run`, threads auto, started first; its env steps/s come
    from its own `perf/env_steps_per_s` points, stamped as it logged them."""

    def __init__(self, workload: str, threads: str = "auto"):
        self.workload, self.threads = workload, threads
        self.name = f"a {workload} run (threads {threads})"
        self.tag = f"{workload.lower()}-{threads}"
        self.folder = WORKDIR / f"neighbour-{self.tag}"

    def __enter__(self):
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        args = [
            sys.executable, "-m", "marlctl", "run", str(SPEC), *NEIGHBOURS[self.workload],
            "train.total_env_steps=1000000000", "train.checkpoint_every=0",
            f"hardware.threads_per_run={self.threads}", f"name=neighbour-{self.tag}", "--json",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args, cwd=self.folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.started = time.time()
        time.sleep(WARMUP_S)
        self.alone = (self.started + WARMUP_S - 10, time.time())
        self.cells: list[dict] = []
        return self

    def mark(self, cell: dict) -> None:
        self.cells.append(cell)

    def settle(self, cell: dict) -> None:
        pass

    def __exit__(self, *exc):
        # SIGTERM stops it as Ctrl-C does: its last metrics are sent before it exits.
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        store = client(self.folder)
        runs = store.search_runs(
            [store.get_experiment_by_name(f"neighbour-{self.tag}").experiment_id],
            "tags.`marlctl.role` = 'seed'",
        )
        run_id = runs[0].info.run_id
        points = sorted(
            (m.timestamp / 1000, m.step, m.value)
            for m in store.get_metric_history(run_id, "perf/env_steps_per_s")
        )
        threads = {
            m.timestamp / 1000: int(m.value)
            for m in store.get_metric_history(run_id, "perf/threads")
        }
        self.alone_rate = window(points, *self.alone)["rate"]
        for cell in self.cells:
            seen = window(points, cell["start"], cell["end"])
            inside = [t for t, _, _ in points if cell["start"] <= t <= cell["end"]]
            used = sorted({threads[t] for t in inside if t in threads})
            cell["neighbour"] = {**seen, "alone": self.alone_rate, "threads": used}


def window(points: list[tuple[float, int, float]], start: float, end: float) -> dict:
    """The env steps/s between the first and the last point logged in [start, end], and
    the slowest and fastest of the rates logged there."""
    inside = [p for p in points if start <= p[0] <= end]
    if len(inside) < 2:
        return {"rate": None, "low": None, "high": None}
    (t0, s0, _), (t1, s1, _) = inside[0], inside[-1]
    rates = [v for _, _, v in inside[1:]]
    return {"rate": (s1 - s0) / (t1 - t0), "low": min(rates), "high": max(rates)}


def group(workload: str, beside, cells: list[tuple[str, dict[str, str]]]) -> list[dict]:
    busy = background()
    done = []
    with beside as neighbour:
        for threads, by_hand in cells:
            cell: dict = {"beside": neighbour.name, "background_cores": busy}
            neighbour.mark(cell)
            cell.update(measured_run(workload, threads, by_hand))
            neighbour.settle(cell)
            done.append(cell)
            print(describe(cell), flush=True)
    return done


class Alone:
    name = "nothing"

    def __enter__(self):
        return self

    def mark(self, cell: dict) -> None:
        pass

    def settle(self, cell: dict) -> None:
        pass

    def __exit__(self, *exc):
        pass


PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
# libgomp's own default spin, set by hand so that marlctl leaves it: a run with 2 threads
# beside a busy loop as it ran before marlctl chose the wait.
SPINS = {"GOMP_SPINCOUNT": "300000"}


def describe(cell: dict) -> str:
    return (
        f"{cell['workload']} threads={cell['threads_per_run']} ({cell['wait']}) beside "
        f"{cell['beside']}: {cell['steps_per_s']:,.0f} env steps/s, threads {cell['used']}"
    )


def neighbour_text(cell: dict) -> str:
    seen = cell.get("neighbour")
    if not seen:
        return ""
    if "cpu_cores" in seen:
        return f"busy loop: {seen['cpu_cores']:.2f} of a core"
    if seen["rate"] is None:
        return "no point logged"
    threads = ", ".join(map(str, seen["threads"]))
    text = (
        f"{seen['rate']:,.0f} env steps/s ({seen['rate'] / seen['alone']:.2f} of its "
        f"{seen['alone']:,.0f} alone; log windows {seen['low']:,.0f}–{seen['high']:,.0f})"
    )
    return text + (f", threads {threads}" if threads else "")


def write(cells: list[dict], load_before, load_after, started: float) -> None:
    JSONL.write_text("".join(json.dumps(c) + "\n" for c in cells))
    alone = {
        c["workload"]: c["steps_per_s"]
        for c in cells
        if c["beside"] == "nothing" and c["threads_per_run"] == "auto" and not c["by_hand"]
    }
    rows = []
    for c in cells:
        used = "–".join(map(str, sorted({c["used"][0], c["used"][-1]})))
        rows.append(
            [
                c["workload"],
                c["beside"],
                c["threads_per_run"],
                f"{c['started_with']} ({used})" if used != str(c["started_with"]) else used,
                c["wait"],
                f"{c['steps_per_s']:,.0f}",
                f"{c['steps_per_s'] / alone[c['workload']]:.2f}",
                neighbour_text(c),
            ]
        )
    busy_mappo = next(
        c
        for c in cells
        if c["workload"] == "MAPPO" and c["beside"] == BusyLoop.name
        if c["threads_per_run"] == "auto" and not c["by_hand"]
    )
    kept = busy_mappo["steps_per_s"] / alone["MAPPO"]
    backgrounds = sorted({f"{c['background_cores']:.2f}" for c in cells})
    lines = [
        "# Threads on a machine other processes use",
        "",
        f"Measured {date.today().isoformat()} with `python bench/threads.py` "
        f"({(time.time() - started) / 60:.1f} minutes).",
        "",
        f"Machine: {machine()}.",
        "",
        "Each row is one short `marlctl run specs/spread_mappo_native.yaml` on the CPU: MAPPO "
        "at 256 envs for 204,800 env steps (8 iterations), QMIX (`algos=qmix`) at 16 envs for "
        "30,000 env steps, no evaluation until the end. env steps/s: the run's "
        "`perf/env_steps_per_s_mean`; of alone: against the same algorithm alone with "
        "threads_per_run auto. Threads: those the run started with (the param "
        "`hardware.threads_per_run`) and, in brackets, the range it used (`perf/threads`). "
        "A busy loop is `while True: pass` in a Python process; another run is the other "
        "algorithm's `marlctl run` with threads auto, started "
        f"{WARMUP_S:.0f} s before the first row beside it, its rate alone measured over the "
        "10 s before that, its rate beside a row from its own logged points while the row "
        "ran (start-up included). OpenMP wait: how the run's second thread waits between "
        "parallel regions: spinning for libgomp's default 300,000 spins (about 3 ms), or "
        "passively, set by marlctl (the spec's threads outnumber the free cores) or by hand "
        "in the environment.",
        "",
        *table(
            rows,
            [
                "run",
                "beside",
                "threads_per_run",
                "threads",
                "OpenMP wait",
                "env steps/s",
                "of alone",
                "the neighbour meanwhile",
            ],
        ),
        "",
        f"MAPPO with the default threads (auto) beside a busy loop kept {kept:.0%} of its "
        "speed alone (target: at least 70%).",
        "",
        "Load: other processes kept "
        f"{', '.join(backgrounds)} cores busy in the second before each group of rows "
        f"(/proc/stat); load average {load_before} before, {load_after} after. Other users' "
        "tests may have run on the machine meanwhile.",
        "",
    ]
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    started = time.time()
    shutil.rmtree(WORKDIR, ignore_errors=True)
    (WORKDIR / "cells").mkdir(parents=True)
    load_before = " ".join(f"{v:.2f}" for v in os.getloadavg())
    plain: list[tuple[str, dict[str, str]]] = [(t, {}) for t in THREADS]
    cells = []
    cells += group("MAPPO", Alone(), [*plain, ("2", PASSIVE)])
    cells += group("MAPPO", BusyLoop(), [*plain, ("2", SPINS)])
    cells += group("MAPPO", NeighbourRun("QMIX"), plain)
    cells += group("QMIX", Alone(), plain)
    cells += group("QMIX", BusyLoop(), plain)
    cells += group("QMIX", NeighbourRun("MAPPO"), plain)
    # The report's case: a run with a fixed 2 threads, started on an idle machine, spins.
    cells += group("QMIX", NeighbourRun("MAPPO", "2"), [("auto", {})])
    load_after = " ".join(f"{v:.2f}" for v in os.getloadavg())
    write(cells, load_before, load_after, started)


if __name__ == "__main__":
    main()
