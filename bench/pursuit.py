"""Benchmark: pursuit, natively batched, against PettingZoo's own; MAPPO with a cnn encoder
against an MLP on the flattened views, and against random play.

Sections (each kept in `bench/results/pursuit.jsonl` with its date and machine; the table
shows the latest of each):
- env: PettingZoo's `pursuit_v5.parallel_env()` stepped with random actions, one env, and
  the native env (`env.backend: native`) at 64, 256 and 1,024 envs, one thread each;
- random: the mean per-pursuer episode return of uniformly random moves (512 episodes);
- train: `marlctl run specs/pursuit_mappo_native.yaml` (3 seeds as one batch) as it is (cnn)
  and with `model.encoder=mlp` (the same hidden layer on the 147 flattened values of each
  view, the critic an MLP on the flat map), each seed's final evaluation and the run's
  training env steps per second, whose ratio is the cost of the convolutions. Each encoder
  is its own record (`--encoders` picks them), so one may be run at a time;
- eval: each encoder's latest run in its store (`bench/runs/pursuit/ENCODER`) evaluated
  again, 64 episodes per seed, with its most probable actions and with sampled ones, as it
  acts in training (`marlctl eval RUN [--sampled] --episodes 64`); train runs it after
  each training.

    .venv/bin/python bench/pursuit.py              # every section: about 1.6 h (cnn 54 min, mlp 37)
    .venv/bin/python bench/pursuit.py --sections env random
    .venv/bin/python bench/pursuit.py --sections train --encoders cnn
    .venv/bin/python bench/pursuit.py --sections eval     # about a minute
    .venv/bin/python bench/pursuit.py --sections train --steps 200000 --busy
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import date
from pathlib import Path

from common import machine, marlctl_json, newest_parent_run, random_play, table

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "pursuit_mappo_native.yaml"
OUT = ROOT / "bench" / "results" / "pursuit.md"
JSONL = ROOT / "bench" / "results" / "pursuit.jsonl"
WORKDIR = ROOT / "bench" / "runs" / "pursuit"
SIZES = (64, 256, 1024)
ENCODERS = ("cnn", "mlp")
EVAL_EPISODES = 64


def pettingzoo_speed(seconds: float) -> float:
    """Env steps per second of PettingZoo's pursuit, one env, random actions."""
    from marlctl.envs.registry import make_env

    env = make_env("sisl/pursuit", {})
    env.reset(seed=0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        actions = {a: env.action_space(a).sample() for a in env.agents}
        _, _, terms, truncs, _ = env.step(actions)
        steps += 1
        if any(terms.values()) or any(truncs.values()):
            env.reset(seed=steps)
    return steps / (time.perf_counter() - start)


def native_speed(num_envs: int, seconds: float) -> float:
    import torch

    from marlctl.envs.native import native_class

    env = native_class("sisl/pursuit")({}, num_envs, "cpu")
    env.reset(0)
    draws = torch.Generator().manual_seed(0)

    def step() -> None:
        env.step({"pursuer": torch.randint(5, (num_envs, 8), generator=draws)})

    for _ in range(3):
        step()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    return steps * num_envs / (time.perf_counter() - start)


def env_section(seconds: float) -> dict:
    import torch

    torch.set_num_threads(1)
    return {
        "pettingzoo": pettingzoo_speed(seconds),
        "native": {str(n): native_speed(n, seconds) for n in SIZES},
    }


def train(encoder: str, steps: int) -> dict:
    folder = WORKDIR / encoder
    folder.mkdir(parents=True, exist_ok=True)
    overrides = [f"name=pursuit-{encoder}", f"train.total_env_steps={steps}",
                 f"train.eval_every={max(steps // 10, 1)}", f"model.encoder={encoder}"]  # fmt: skip
    summary, wall = marlctl_json(["run", str(SPEC), *overrides], folder, encoder)
    return {
        "finals": [r["final_return"] for r in summary["runs"]],
        "rate": statistics.mean(r["steps_per_s"] for r in summary["runs"]),
        "wall_s": wall,
        "steps": steps,
        "run": summary["parent_run_id"],
    }


def evaluate(encoder: str) -> dict:
    """Each seed of the encoder's latest run, most probable and sampled actions."""
    found = newest_parent_run(WORKDIR / encoder, f"attributes.run_name = 'pursuit-{encoder}'")
    if found is None:
        raise SystemExit(f"no finished pursuit-{encoder} run in {WORKDIR / encoder}")
    run = found.info.run_id
    out: dict = {"run": run, "episodes": EVAL_EPISODES}
    for mode, extra in (("greedy", []), ("sampled", ["--sampled"])):
        args = ["eval", run, "--episodes", str(EVAL_EPISODES), *extra]
        summary, _ = marlctl_json(args, WORKDIR / encoder, f"eval {encoder} {mode}")
        out[mode] = [r["return_mean"] for r in summary["runs"]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", default=["env", "random", "train", "eval"])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--encoders", nargs="+", choices=ENCODERS, default=list(ENCODERS))
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--busy", action="store_true", help="other work shares the cores")
    parser.add_argument("--table", action="store_true", help="only rewrite the table")
    args = parser.parse_args()
    if not args.table:
        where = {"date": date.today().isoformat(), "machine": machine("cpu"), "busy": args.busy}
        sections: dict = {}
        if "env" in args.sections:
            sections["env"] = env_section(args.seconds)
        if "random" in args.sections:
            sections["random"] = random_play("sisl/pursuit", 512, seed=1)
        with JSONL.open("a") as sink:
            if sections:
                sink.write(json.dumps({**where, **sections}) + "\n")
            for encoder in args.encoders:
                if "train" in args.sections:
                    run = {**where, "train": {encoder: train(encoder, args.steps)}}
                    sink.write(json.dumps(run) + "\n")
                    sink.flush()
                if "eval" in args.sections:
                    sink.write(json.dumps({**where, "eval": {encoder: evaluate(encoder)}}) + "\n")
                    sink.flush()
    OUT.write_text(render([json.loads(line) for line in JSONL.read_text().splitlines()]))
    print(OUT.read_text())


def render(records: list[dict]) -> str:
    latest: dict[str, dict] = {}  # each section's latest record; each encoder's own
    for record in records:
        for key in ("env", "random"):
            if key in record:
                latest[key] = record
        for encoder in record.get("train", {}):
            latest[f"train/{encoder}"] = record
            latest.pop(f"eval/{encoder}", None)  # an evaluation is of the training before it
        for encoder, found in record.get("eval", {}).items():
            trained = latest.get(f"train/{encoder}", {}).get("train", {}).get(encoder, {})
            if trained.get("run", found["run"]) == found["run"]:
                latest[f"eval/{encoder}"] = record
    lines = [
        "# Pursuit: the native env, and MAPPO with a cnn encoder",
        "",
        "Written by `.venv/bin/python bench/pursuit.py` (raw records: "
        "`bench/results/pursuit.jsonl`; each section from its latest record).",
        "",
    ]

    def where(record: dict) -> str:
        busy = " (beside other work on the same cores)" if record.get("busy") else ""
        return f"Measured {record['date']} on {record['machine']}{busy}."

    if "env" in latest:
        data = latest["env"]["env"]
        rows = [
            ["PettingZoo `pursuit_v5.parallel_env()`", "1", f"{data['pettingzoo']:,.0f}", "1.0"]
        ]
        for n, rate in data["native"].items():
            rows.append(["native", f"{int(n):,}", f"{rate:,.0f}",
                         f"{rate / data['pettingzoo']:,.0f}"])  # fmt: skip
        lines += ["## Env steps per second, random actions, one thread", "",
                  where(latest["env"]), "",
                  *table(rows, ["env", "envs", "env steps/s", "x PettingZoo"]), ""]  # fmt: skip
    runs = {enc: latest[f"train/{enc}"] for enc in ENCODERS if f"train/{enc}" in latest}
    if runs:
        chance = latest["random"]["random"] if "random" in latest else None
        rows = []
        for encoder, record in runs.items():
            run = record["train"][encoder]
            mean = statistics.mean(run["finals"])
            spread = statistics.stdev(run["finals"]) if len(run["finals"]) > 1 else 0.0
            rows.append([encoder, f"{run['steps']:,}", ", ".join(f"{v:.2f}" for v in run["finals"]),
                         f"{mean:.2f} ± {spread:.2f}", f"{run['rate']:,.0f}",
                         f"{run['wall_s'] / 60:.1f}"])  # fmt: skip
        if chance is not None:
            rows.append(["random play", "", "", f"{chance:.2f}", "", ""])
        measured = [f"- {enc}: {where(record)}" for enc, record in runs.items()]
        alike = {(r["machine"], r.get("busy"), r["train"][e]["steps"]) for e, r in runs.items()}
        if len(alike) > 1:
            measured.append("- The encoders ran at other budgets, on other machines or "
                            "under other load: their rates do not give the convolutions' "
                            "cost.")  # fmt: skip
        lines += ["## MAPPO, cnn against mlp", "", *measured, "",
                  "`marlctl run specs/pursuit_mappo_native.yaml train.total_env_steps=STEPS` "
                  "(3 seeds as one batch, 64 envs each) with `model.encoder` cnn and mlp: "
                  "each seed's final evaluation (32 greedy episodes, the mean per-pursuer "
                  "return), their mean ± standard deviation, each seed's training env steps per "
                  "second (their ratio: the cost of the convolutions, forward and backward) and "
                  "the run's wall-clock.", "",
                  *table(rows, ["encoder", "env steps", "per seed", "mean", "env steps/s per seed",
                                "minutes"]),
                  ""]  # fmt: skip
    evals = {enc: latest[f"eval/{enc}"] for enc in ENCODERS if f"eval/{enc}" in latest}
    if evals:
        rows = []
        for encoder, record in evals.items():
            found = record["eval"][encoder]
            row = [encoder, f"`{found['run'][:8]}`"]
            for mode in ("greedy", "sampled"):
                values = found[mode]
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                row += [", ".join(f"{v:.2f}" for v in values),
                        f"{statistics.mean(values):.2f} ± {spread:.2f}"]  # fmt: skip
            rows.append(row)
        episodes = {record["eval"][enc]["episodes"] for enc, record in evals.items()}
        lines += ["## The final policies, most probable against sampled actions", "",
                  *[f"- {enc}: {where(record)}" for enc, record in evals.items()], "",
                  "`marlctl eval RUN --episodes N` and `marlctl eval RUN --sampled --episodes N` "
                  f"(N = {', '.join(map(str, sorted(episodes)))}) of each encoder's run above: "
                  "each seed's mean per-pursuer return acting on its most probable actions "
                  "(greedy, as the training's evaluation does) and sampling them as in "
                  "training, their mean ± standard deviation.", "",
                  *table(rows, ["encoder", "run", "greedy, per seed", "greedy", "sampled, per seed",
                                "sampled"]),
                  ""]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
