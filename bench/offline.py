"""Offline MARL on datasets of rising quality, as Off-the-Grid MARL builds them: a behaviour
policy trained online, datasets recorded from its checkpoints, offline algorithms trained on
each, through the CLI (`marlctl run`, `eval --record`, `data`).

Per task:
1. MAPPO trains one seed with `train.keep_policies` (a policy every fortieth of its budget).
2. Poor, Medium and Good: `eval --record --sampled` of the kept policies whose return,
   acting as in training (sampled actions, 128 episodes each), stands nearest 25% and 60%
   of the way from random play's return to the final policy's, and of the final policy (an
   early policy acting greedily can score below random play while its sampled actions, the
   ones its dataset holds, score above it). Medium-Replay: `train.record` of a second MAPPO
   run of the same seed up to the Medium policy's step.
3. Every offline algorithm (3 seeds, trained as one batch) on every dataset; random play
   (uniform over the allowed actions) on the side. A seed whose loss stops being finite
   fails its run, and the batch's other seeds with it: the cell says "failed".

The targets: behaviour cloning on Good reaches 90% of the dataset's return, normalised
between random play (0) and the dataset (1); on Medium-Replay a conservative Q-learner
beats behaviour cloning; on Poor every offline algorithm beats random play. `--overhead`
times MAPPO with and without `train.record`, back to back (the target: at most 10% slower).
Writes `bench/results/offline.md`; raw rows go to `bench/results/offline.jsonl`.

    .venv/bin/python bench/offline.py --tasks simple_spread
    .venv/bin/python bench/offline.py --tasks 3m --updates 20000
    .venv/bin/python bench/offline.py --overhead

With `--work DIR` the datasets and each offline result are kept in DIR as they are made, and
a rerun with the same DIR goes on from the first one missing. Each row goes to the raw
results as it is measured, with whether other work shared the cores (`--busy`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml
from common import machine, random_play

ROOT = Path(__file__).resolve().parent.parent
MARLCTL = ROOT / ".venv" / "bin" / "marlctl"
OUT = ROOT / "bench" / "results" / "offline.md"
RAW = ROOT / "bench" / "results" / "offline.jsonl"
ALGOS = ("bc", "iql_cql", "qmix_cql", "maicq")
READS_STATE = ("qmix_cql", "maicq")  # their mixers read the global state


def default_scaling(algo: str) -> str | None:
    """How `algo`'s centralised networks read the state by default (None: they read none)."""
    from marlctl.algos import registered_algos

    field = registered_algos()[algo].config.model_fields.get("state_scaling")
    return None if field is None else field.default


LEVELS = ("poor", "medium", "good", "medium-replay")

TASKS = {
    "simple_spread": {
        "env": {"id": "mpe/simple_spread", "backend": "native"},
        "algo": {"name": "mappo", "anneal_lr": False},
        "budget": 2_000_000,
        "episodes": 2_000,
    },
    "3m": {
        "env": {"id": "smax/3m", "backend": "native"},
        "algo": {"name": "mappo", "lr": 0.001, "epochs": 4, "minibatches": 4, "anneal_lr": False},
        "model": {"hidden": [128, 128], "activation": "relu"},
        "budget": 2_000_000,
        "episodes": 1_000,
    },
}


def marlctl(args: list[str], cwd: Path, failed_runs: bool = False) -> dict:
    """The command's JSON; `failed_runs`: also where runs failed (exit 1), which say why."""
    done = subprocess.run([str(MARLCTL), *args, "--json"], cwd=cwd, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0 and not (
        failed_runs and done.returncode == 1 and '"runs"' in done.stdout
    ):
        raise SystemExit(f"marlctl {' '.join(args)}: {done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(done.stdout[done.stdout.index("{") :])


def write(cwd: Path, name: str, body: dict) -> str:
    (cwd / name).write_text(yaml.safe_dump(body, sort_keys=False))
    return name


def behaviour(task: str, cwd: Path, budget: int, record: str | None = None) -> dict:
    """MAPPO, one seed, a policy kept and evaluated every fortieth of `budget`; `record`: its
    replay too."""
    cfg = TASKS[task]
    every = budget // 40
    train = {"total_env_steps": budget, "eval_every": every, "eval_episodes": 128,
             "checkpoint_every": every, "keep_policies": True}  # fmt: skip
    if record:
        train["record"] = record
    body = {"seeds": [0], "env": cfg["env"], "algo": cfg["algo"], "model": cfg.get("model", {}),
            "train": train, "hardware": {"num_envs": 128, "device": "cpu"}}  # fmt: skip
    return marlctl(["run", write(cwd, f"{task}-mappo-{budget}.yaml", body)], cwd)


def eval_curve(cwd: Path, run_id: str) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    return {m.step: m.value for m in client.get_metric_history(run_id, "eval/return_mean")}


def sampled_returns(cwd: Path, run_id: str, steps: list[int], episodes: int = 128) -> dict:
    """Each kept policy's return acting as in training (sampled actions), as a dataset it
    recorded would score: `eval --record --sampled` into a scratch folder. None: the final
    policy."""
    out, scratch = {}, cwd / "scratch"
    for n in steps:
        shutil.rmtree(scratch, ignore_errors=True)
        args = ["eval", run_id, "--record", str(scratch), "--sampled", "--episodes", str(episodes)]
        result = marlctl(args + (["--checkpoint", f"policy/step-{n}.pt"] if n else []), cwd)
        out[n] = result["return_mean"]
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def levels(score: dict, random: float) -> dict[str, int]:
    """The kept policies (`score`: step -> sampled return, None the final policy) whose
    sampled return stands nearest 25% and 60% of the way from random play's (`random`) to the
    final policy's; Poor before Medium. Sampled, as the datasets are recorded: early in
    training a policy acting greedily can score below random play while its sampled actions
    score above it."""
    start, end = random, score[None]
    kept = sorted(n for n in score if n is not None)

    def nearest(share: float, steps) -> int:
        return min(steps, key=lambda n: abs(score[n] - (start + share * (end - start))))

    medium = nearest(0.6, kept[1:])
    return {"poor": nearest(0.25, [n for n in kept if n < medium]), "medium": medium}


def datasets(task: str, cwd: Path, random: float, busy: bool) -> tuple[dict[str, dict], bool]:
    """The four datasets of `task` in `cwd`, with their mean returns, sources and whether
    other work shared the cores as they were recorded; kept in `cwd` (`datasets.json`) once
    all are recorded, for a rerun with the same `--work`. And whether they were recorded now."""
    kept = cwd / "datasets.json"
    if kept.exists():
        return json.loads(kept.read_text()), False
    cfg = TASKS[task]
    budget, episodes = cfg["budget"], str(cfg["episodes"])
    run = behaviour(task, cwd, budget)["runs"][0]
    curve = eval_curve(cwd, run["run_id"])
    every = budget // 40
    score = sampled_returns(cwd, run["run_id"], [*range(every, budget, every), None])
    steps = levels(score, random)
    sources = {"poor": f"policy/step-{steps['poor']}.pt",
               "medium": f"policy/step-{steps['medium']}.pt", "good": None}  # fmt: skip
    out = {}
    for level, checkpoint in sources.items():
        args = ["eval", run["run_id"], "--record", level, "--sampled", "--episodes", episodes]
        marlctl(args + (["--checkpoint", checkpoint] if checkpoint else []), cwd)
        step = steps.get(level, budget)
        evaluated = curve[min(s for s in curve if s >= step)]
        out[level] = {"policy_step": step, "policy_eval": evaluated,
                      "policy_sampled": score[steps.get(level)]}  # fmt: skip
    behaviour(task, cwd, steps["medium"], record="replay")
    (cwd / "replay" / "seed-0").rename(cwd / "medium-replay")
    out["medium-replay"] = {"policy_step": steps["medium"], "policy_eval": None}
    for level, row in out.items():
        described = marlctl(["data", "describe", level], cwd)
        row |= {"return": described["return_mean"], "episodes": described["episodes"],
                "transitions": described["transitions"], "busy": busy}  # fmt: skip
    kept.write_text(json.dumps(out))
    return out, True


def offline(task: str, cwd: Path, algo: str, level: str, updates: int) -> tuple[dict, bool]:
    """Its final returns and wall-clock, kept in `cwd` as they end: a rerun with the same
    `--work` goes on from the first one missing. And whether it was trained now."""
    kept = cwd / f"{task}-{algo}-{level}-{updates}.json"
    if kept.exists():
        return json.loads(kept.read_text()), False
    cfg = TASKS[task]
    body = {"seeds": [0, 1, 2], "env": cfg["env"], "algo": {"name": algo},
            "model": cfg.get("model", {}), "data": level,
            "train": {"total_updates": updates, "eval_every": updates // 10,
                      "eval_episodes": 128, "checkpoint_every": 0},
            "hardware": {"num_envs": 16, "device": "cpu", "batch_seeds": True}}  # fmt: skip
    start = time.perf_counter()
    out = marlctl(["run", write(cwd, f"{task}-{algo}-{level}.yaml", body)], cwd, failed_runs=True)
    finals = [r["final_return"] for r in out["runs"]]
    result = {"finals": finals, "wall_s": time.perf_counter() - start}
    if default_scaling(algo) is not None:  # how the mixer or critic read the state
        result["state_scaling"] = default_scaling(algo)
    failed = [r for r in out["runs"] if r["status"] != "FINISHED"]
    if failed:  # the seeds train as one batch: a seed's non-finite loss stops them all
        result |= {"failed": failed[0]["error"], "env_steps": failed[0]["env_steps"]}
    kept.write_text(json.dumps(result))
    return result, True


def overhead(cwd: Path) -> dict:
    """MAPPO on native simple_spread, 500k env steps, without and with `train.record`,
    back to back: training throughput as the runs log it."""
    rates = {}
    for name, record in (("plain", None), ("recorded", "overhead-replay")):
        body = {"seeds": [0], "env": TASKS["simple_spread"]["env"], "algo": {"name": "mappo"},
                "train": {"total_env_steps": 500_000, "eval_every": 0, "eval_episodes": 8,
                          "checkpoint_every": 0, **({"record": record} if record else {})},
                "hardware": {"num_envs": 128, "device": "cpu", "threads_per_run": 1}}  # fmt: skip
        start = time.perf_counter()
        marlctl(["run", write(cwd, f"overhead-{name}.yaml", body)], cwd)
        rates[name] = 500_000 / (time.perf_counter() - start)
    return {"kind": "overhead", "plain": rates["plain"], "recorded": rates["recorded"],
            "ratio": rates["recorded"] / rates["plain"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="simple_spread")
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--overhead", action="store_true")
    parser.add_argument("--work", type=Path, help="keep the stores and datasets here")
    parser.add_argument("--budget", type=int, help="the behaviour's env steps (a smoke run)")
    parser.add_argument("--episodes", type=int, help="episodes per recorded dataset")
    parser.add_argument("--dry", action="store_true", help="write no results (a smoke run)")
    parser.add_argument("--render", action="store_true", help="only rewrite the page")
    parser.add_argument("--busy", action="store_true", help="other work shares the cores")
    args = parser.parse_args()
    if args.render:
        OUT.write_text(render([json.loads(line) for line in RAW.read_text().splitlines()]))
        return
    for cfg in TASKS.values():
        cfg["budget"] = args.budget or cfg["budget"]
        cfg["episodes"] = args.episodes or cfg["episodes"]
    if args.dry and args.work:
        parser.error("--dry keeps nothing: leave out --work")
    work = args.work or Path(tempfile.mkdtemp(prefix="offline-"))
    work.mkdir(parents=True, exist_ok=True)
    stamp = {"measured": date.today().isoformat(), "machine": machine(), "busy": args.busy}

    def keep(row: dict) -> None:
        """Append a row measured in this call as soon as it is, so a call stopped part way
        loses none (what the work folder kept from an earlier call was appended then)."""
        print(json.dumps(row), flush=True)
        if not args.dry:
            with RAW.open("a") as handle:
                handle.write(json.dumps(row | stamp) + "\n")

    if args.overhead:
        keep(overhead(work))
    for task in [t for t in args.tasks.split(",") if t and not args.overhead]:
        cwd = work / task
        cwd.mkdir(exist_ok=True)
        random = random_play(TASKS[task]["env"]["id"])
        keep({"kind": "random", "task": task, "return": random})
        found, recorded = datasets(task, cwd, random, args.busy)
        for level in LEVELS:
            if recorded:
                keep({"kind": "dataset", "task": task, "level": level, **found[level]})
        for level in LEVELS:
            for algo in ALGOS:
                result, trained = offline(task, cwd, algo, level, args.updates)
                if trained:
                    keep({"kind": "offline", "task": task, "level": level, "algo": algo,
                          "updates": args.updates, **result})  # fmt: skip
    if not args.dry:
        OUT.write_text(render([json.loads(line) for line in RAW.read_text().splitlines()]))


def render(rows: list[dict]) -> str:
    """The latest rows of each kind, task, level and algorithm, as the results page."""
    latest: dict[tuple, dict] = {}
    for row in rows:
        latest[(row["kind"], row.get("task"), row.get("level"), row.get("algo"))] = row
    machines = sorted({r["machine"] for r in latest.values()})
    lines = ["# Offline MARL on datasets of rising quality", "",
             f"Written {date.today().isoformat()} by `.venv/bin/python bench/offline.py`. "
             "Machines: " + "; ".join(f"({i + 1}) {m}" for i, m in enumerate(machines)) + ".",
             "", __doc__.split("\n\n")[1], ""]  # fmt: skip
    for task in sorted({k[1] for k in latest if k[0] == "dataset"}):
        lines += _task_table(task, latest, machines)
    over = latest.get(("overhead", None, None, None))
    if over:
        lines += ["## Recording's cost", "",
                  "MAPPO on native simple_spread, 500k env steps, one thread, back to back: "
                  f"{over['plain']:,.0f} env steps/s plain, {over['recorded']:,.0f} with "
                  f"`train.record` ({over['ratio']:.2f} of it; the bar: 0.90), machine "
                  f"({machines.index(over['machine']) + 1}).", ""]  # fmt: skip
    return "\n".join(lines) + "\n"


def _task_table(task: str, latest: dict, machines: list[str]) -> list[str]:
    random = latest[("random", task, None, None)]["return"]
    head = ["dataset", "episodes", "dataset return", *ALGOS, "verdict"]
    lines = [f"## {task}", "",
             f"Final eval return, mean over 3 seeds (each 128 deterministic episodes) ± the "
             f"seeds' standard deviation, and in brackets normalised between random play "
             f"({random:.2f}) and the dataset's return (a dataset hardly better than random "
             "play makes that ratio large).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    unscaled = False
    for level in LEVELS:
        data = latest.get(("dataset", task, level, None))
        if data is None:
            continue
        scores = {}
        cells = [level, f"{data['episodes']:,}", f"{data['return']:.2f}"]
        for algo in ALGOS:
            row = latest.get(("offline", task, level, algo))
            if row is None:
                cells.append("—")
                continue
            # A mixer's cell measured with another state scaling than its default now: marked.
            scaling = row.get("state_scaling", "none")
            mark = " †" if algo in READS_STATE and scaling != default_scaling(algo) else ""
            unscaled |= bool(mark)
            if row.get("failed"):  # "... (seed S): loss/a, loss/b"
                losses = row["failed"].rsplit(": ", 1)[-1]
                cells.append(f"failed: {losses} not finite by update {row['env_steps']:,}{mark}")
                continue
            mean = statistics.mean(row["finals"])
            scores[algo] = mean
            spread = statistics.stdev(row["finals"]) if len(row["finals"]) > 1 else 0.0
            norm = (mean - random) / (data["return"] - random)
            cells.append(f"{mean:.2f} ± {spread:.2f} ({norm:.2f}){mark}")
        cells.append(_verdict(level, scores, data["return"], random))
        lines.append("| " + " | ".join(cells) + " |")
    made = {lv: latest[("dataset", task, lv, None)] for lv in LEVELS
            if ("dataset", task, lv, None) in latest}  # fmt: skip
    where = "; ".join(
        f"{lv}: the policy at {row['policy_step']:,} env steps ({_scores(row)})"
        if lv != "medium-replay" else
        f"{lv}: every transition of a run of the same seed to {row['policy_step']:,} env steps"
        for lv, row in made.items()
    )  # fmt: skip
    budget = TASKS[task]["budget"]
    load = "with other training on its cores" if made["good"].get("busy", True) else "quiet"
    at = machines.index(made["good"]["machine"]) + 1
    lines += ["", f"The behaviour: MAPPO, {budget:,} env steps. The datasets (sampled actions): "
              f"{where}. Recorded on machine ({at}), {load}."]  # fmt: skip
    if unscaled:
        lines += ["", "†: measured with the mixer reading the global state otherwise than "
                  "its default now (`algo.state_scaling`)."]  # fmt: skip
    return [*lines, ""]


def _scores(row: dict) -> str:
    deterministic = f"deterministic eval {row['policy_eval']:.2f}"
    if row.get("policy_sampled") is None:
        return deterministic
    return f"sampled {row['policy_sampled']:.2f}, {deterministic}"


def _verdict(level: str, scores: dict[str, float], data: float, random: float) -> str:
    """The target of `level`, on the algorithms that finished (a failed one: not met where
    every algorithm must pass)."""
    if "bc" not in scores:
        return "—"
    if level == "good":
        norm = (scores["bc"] - random) / (data - random)
        return f"BC {norm:.2f} of the way: {'met' if norm >= 0.9 else 'not met'} (bar 0.90)"
    if level == "medium-replay":
        best = max((s for a, s in scores.items() if a != "bc"), default=float("-inf"))
        return f"best Q-learner {'beats' if best > scores['bc'] else 'does not beat'} BC"
    if level == "poor":
        below = [a for a in ALGOS if scores.get(a, float("-inf")) <= random]
        if not below:
            return "every algorithm beats random play: met"
        return f"{', '.join(below)} at or below random play: not met"
    return ""


if __name__ == "__main__":
    main()
