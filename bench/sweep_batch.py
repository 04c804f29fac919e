"""Benchmark: a sweep's trials trained one at a time against trained as one batch.

Each case runs the same study twice through `marlctl sweep`, one worker, the same sampler
seed and budget, no pruner (every trial trains its whole budget, so completed trials per hour
compare like with like): once with `sweep.batch: 1`, once with `sweep.batch: K`. Reports the
wall-clock, completed trials per hour and their ratio, and the best trial's objective with
its seeds' final returns. The `pbt` case trains MAPPO's space as one population
(`sweep.sampler: pbt`) of 8 members x 2 seeds for 4x a trial's steps: the env steps of the
32-trial mappo study, in `--repeats` studies of their own sampler seeds. Writes
`bench/results/sweep_batch.md`.

    .venv/bin/python bench/sweep_batch.py --cases mappo,qmix      # batched against not
    .venv/bin/python bench/sweep_batch.py --cases pbt --repeats 3
    .venv/bin/python bench/sweep_batch.py --cases mappo --trials 8 --steps 20000

`--scaling` first measures what a batch's size does to its throughput: one trainer of each
case's algorithm, hyperparameters of its own per row, 2 to 16 rows, env steps per second
of all rows together on the machine's threads (no sweep, no evaluation, no store).
`--ceiling` measures what batching could give at best on the machine: per algorithm and row
count, a training iteration's matrix-product arithmetic per env step, its env steps per
second whole, and those of its matrix products alone (replayed on the same operands with
nothing between them), beside the machine's matrix-product peak:

    .venv/bin/python bench/sweep_batch.py --cases mappo,qmix,pbt --repeats 3 \
        --reuse bench/results/sweep_batch.jsonl --jsonl bench/results/sweep_batch.jsonl --ceiling

Measurements are kept in the `--jsonl` with their date and machine; without `--scaling` or
`--ceiling` the page shows the latest kept ones.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from datetime import date
from pathlib import Path

import yaml
from common import machine, marlctl_json, measured_on

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "sweep_batch.md"
WORKDIR = ROOT / "bench" / "runs" / "sweep_batch"  # studies and MLflow stores (not committed)
SPREAD = {"N": 3, "max_cycles": 25, "local_ratio": 0.5}

# specs/spread_mappo_sweep.yaml's run, searched over the values a row may have of its own.
MAPPO = {
    "what": "MAPPO on native simple_spread (specs/spread_mappo_sweep.yaml's settings: 2 seeds, "
    "128 envs per seed, evaluation every 50k steps on 32 episodes)",
    "trials": 32,
    "steps": 200_000,
    "batch": 4,  # 8 rows: what `sweep.batch: auto` takes on a CPU
    "body": {
        "defaults": [{"envs": "simple_spread"}, {"algos": "mappo"}, "_self_"],
        "env": {"backend": "native"},
        "seeds": [0, 1],
        "train": {"eval_every": 50_000, "eval_episodes": 32, "checkpoint_every": 0},
        "hardware": {"device": "cpu", "num_envs": 128, "batch_seeds": True},
        "space": {
            "algo.lr": {"low": 1.0e-4, "high": 3.0e-3, "log": True},
            "algo.entropy_coef": {"low": 1.0e-4, "high": 5.0e-2, "log": True},
            "algo.clip": {"low": 0.05, "high": 0.3},
            "algo.gae_lambda": {"low": 0.8, "high": 1.0},
        },
    },
}
# The baseline-mpe suite's QMIX cell, with Polyak targets so that tau matters.
QMIX = {
    "what": "QMIX on native simple_spread (the baseline-mpe suite's settings with Polyak "
    "targets: 2 seeds, 32 envs per seed, 2 updates of 256 per step, evaluation every 25k "
    "steps on 32 episodes)",
    "trials": 16,
    "steps": 100_000,
    "batch": 8,
    "body": {
        "env": {"id": "mpe/simple_spread", "backend": "native", "params": SPREAD},
        "algo": {
            "name": "qmix",
            "gamma": 0.9,
            "buffer_size": 200_000,
            "batch_size": 256,
            "learning_starts": 2000,
            "updates": 2,
            "target_update_every": 0,
            "reward_scaling": "standardise",
            "double_q": True,
        },
        "seeds": [0, 1],
        "train": {"eval_every": 25_000, "eval_episodes": 32, "checkpoint_every": 0},
        "hardware": {"device": "cpu", "num_envs": 32, "batch_seeds": True},
        "space": {
            "algo.lr": {"low": 1.0e-4, "high": 3.0e-3, "log": True},
            "algo.tau": {"low": 1.0e-3, "high": 5.0e-2, "log": True},
            "algo.epsilon_anneal_steps": {"low": 5_000, "high": 50_000},
            "algo.epsilon_end": {"low": 0.01, "high": 0.2},
        },
    },
}
PBT = {
    **MAPPO,
    "what": "MAPPO's case trained as one population: 8 members x 2 seeds, each for 4x a "
    "trial's env steps (the 32 trials' total), exploit/explore every 100k env steps",
    "trials": 8,
    "steps": 800_000,
    "batch": 1,
}
CASES = {"mappo": MAPPO, "qmix": QMIX, "pbt": PBT}


def batched_trainer(name: str, rows: int):
    """One trainer of `name`'s case (mappo or qmix) with `rows` rows, each with a learning
    rate of its own, on the CPU, and its env and first observation; QMIX takes gradient
    steps from the start."""
    import tempfile

    import torch

    from marlctl.envs.native import native_class
    from marlctl.spec import load_spec
    from marlctl.train.build import build_trainer

    body = spec_for(CASES[name], "scaling", 2, 200_000, 1)
    del body["sweep"]
    if name == "qmix":
        body["algo"]["learning_starts"] = 0
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.yaml"
        path.write_text(yaml.safe_dump(body, sort_keys=False))
        spec = load_spec(str(path), []).spec
    envs = spec.hardware.num_envs
    env = native_class(spec.env.id)(dict(spec.env.params), envs * rows, "cpu", seeds=rows)
    own = [{"lr": 1e-4 * (i + 1)} for i in range(rows)]
    trainer = build_trainer(spec, env.info, envs, torch.device("cpu"), 100, tuple(range(rows)), own)
    ob = env.reset(list(range(rows)))
    trainer.restart_episodes()
    for _ in range(3 if name == "mappo" else 50):  # warm-up
        ob, _ = trainer.train_iteration(env, ob)
    return trainer, env, ob


def timed(step, seconds: float, windows: int = 1) -> float:
    """Seconds per call of `step` on the CPU, timed as `marlctl bench` times (for about
    `seconds`) in each of `windows` windows: the fastest window's."""
    import torch

    from marlctl.train import timing

    cpu = torch.device("cpu")
    best = float("inf")
    for _ in range(windows):
        calls, elapsed, _, _ = timing.timed(step, seconds, cpu, warmup=0)
        best = min(best, elapsed / calls)
    return best


def iteration_seconds(trainer, env, ob, seconds: float, windows: int = 1) -> float:
    """Seconds per training iteration of `trainer`, iterated for about `seconds` in each of
    `windows` windows (the fastest window's)."""
    state = {"ob": ob}

    def step():
        state["ob"], _ = trainer.train_iteration(env, state["ob"])

    return timed(step, seconds, windows)


def scaling(rows_list=(2, 4, 8, 16)) -> list[dict]:
    """Env steps per second of one trainer with `rows` rows, all rows together, for MAPPO and
    QMIX at the cases' settings (their `num_envs` per row)."""
    found = []
    for name in ("mappo", "qmix"):
        for rows in rows_list:
            trainer, env, ob = batched_trainer(name, rows)
            rate = trainer.steps_per_iteration * rows / iteration_seconds(trainer, env, ob, 10.0)
            found.append({"algo": name, "rows": rows, "env_steps_per_s": rate})
            print(json.dumps(found[-1]), flush=True)
    return found


MATRIX_PRODUCTS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")


def Products():  # noqa: N802 (a class made on first use: torch is imported late here)
    """A dispatch mode that keeps every matrix product dispatched under it, with copies of
    its operands, to be replayed alone (`replay`)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Products(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func.overloadpacket) in MATRIX_PRODUCTS:
                operands = [a.clone() if torch.is_tensor(a) else a for a in args]
                self.calls.append((func, operands, dict(kwargs or {})))
            return func(*args, **(kwargs or {}))

        def replay(self):
            for func, operands, kwargs in self.calls:
                func(*operands, **kwargs)

    return _Products()


def ceiling(rows_list=(2, 8, 16)) -> list[dict]:
    """What batching could give at best on this machine, per algorithm and rows: a training
    iteration's arithmetic (floating-point operations per env step, torch's FLOP counter),
    its env steps per second whole, and the env steps per second of its matrix products
    alone (every product it dispatched, replayed on the same operands with nothing between
    them); beside the machine's matrix-product peak (1024x1024 float32 products on the
    same threads). A batch cannot step faster than its products alone, and no trainer
    does more arithmetic per second than the peak."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    square = torch.randn(1024, 1024), torch.randn(1024, 1024)
    timed(lambda: torch.mm(*square), 1.0)  # the thread pool started, the clock up
    peak = 2 * 1024**3 / timed(lambda: torch.mm(*square), 2.0, windows=3)
    found = []
    for name in ("mappo", "qmix"):
        for rows in rows_list:
            trainer, env, ob = batched_trainer(name, rows)
            steps = trainer.steps_per_iteration * rows
            counter, record = FlopCounterMode(display=False), Products()
            with counter, record:
                ob, _ = trainer.train_iteration(env, ob)
            whole = iteration_seconds(trainer, env, ob, 4.0, windows=3)
            alone = timed(record.replay, 4.0, windows=3)
            found.append(
                {
                    "algo": name,
                    "rows": rows,
                    "flop_per_env_step": counter.get_total_flops() / steps,
                    "env_steps_per_s": steps / whole,
                    "products": len(record.calls),
                    "products_env_steps_per_s": steps / alone,
                    "peak_flop_per_s": peak,
                    "threads": torch.get_num_threads(),
                }
            )
            print(json.dumps(found[-1]), flush=True)
    return found


def ceiling_lines(rows: list[dict]) -> list[str]:
    """The ceiling's table and what it says of each algorithm's batched ratio."""
    head = rows[0]
    lines = [
        f"What batching can give at best (`--ceiling`), measured {measured_on(rows)}, "
        f"{head['threads']} threads: one trainer per row count, as in `--scaling`; each rate "
        "the fastest of three 4-second windows. A row's arithmetic is torch's FLOP count (its "
        'matrix products) of one training iteration over its env steps; "products alone" '
        "replays every matrix product the iteration dispatched, on the same operands, with "
        "nothing between them. The machine's "
        f"matrix-product peak: {head['peak_flop_per_s'] / 1e9:.0f} GFLOP/s (1024x1024 "
        "float32 products, the fastest of three 2-second windows).",
        "",
        "| algorithm | rows | MFLOP per env step | env steps/s | GFLOP/s | "
        "products alone, env steps/s | products alone against 2 rows whole |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = [""]
    for algo in dict.fromkeys(r["algo"] for r in rows):
        mine = [r for r in rows if r["algo"] == algo]
        base = min(mine, key=lambda r: r["rows"])  # a trial alone
        for r in mine:
            lines.append(
                f"| {algo} | {r['rows']} | {r['flop_per_env_step'] / 1e6:.2f} | "
                f"{r['env_steps_per_s']:,.0f} | "
                f"{r['flop_per_env_step'] * r['env_steps_per_s'] / 1e9:.1f} | "
                f"{r['products_env_steps_per_s']:,.0f} | "
                f"{r['products_env_steps_per_s'] / base['env_steps_per_s']:.1f}x |"
            )
        best = max(mine, key=lambda r: r["products_env_steps_per_s"])
        rate = base["flop_per_env_step"] * base["env_steps_per_s"]
        share, most = rate / base["peak_flop_per_s"], base["peak_flop_per_s"] / rate
        alone = best["products_env_steps_per_s"]
        verdicts.append(
            f"- **{algo}**: a trial alone ({base['rows']} rows) already computes at "
            f"{rate / 1e9:.1f} GFLOP/s in its matrix products, {share:.0%} of the peak: were "
            "a batch's products to run at the peak and nothing else to take any time, it "
            f"would step {most:.1f}x as fast. Its matrix products alone, at their best "
            f"({best['rows']} rows), step {alone:,.0f} env steps/s, "
            f"{alone / base['env_steps_per_s']:.1f}x the trial alone whole: the most a "
            "batch's training can gain while its products run as torch's CPU kernels run "
            "them, before its other operations and the sweep's evaluations are counted."
        )
    return [*lines, *verdicts, ""]


def spec_for(
    case: dict, name: str, trials: int, steps: int, batch: int, seed: int = 0, device: str = "cpu"
) -> dict:
    body = {k: v for k, v in case["body"].items() if k != "space"}
    body = json.loads(json.dumps(body))  # a copy
    body["name"] = name
    body["train"]["total_env_steps"] = steps
    body["train"]["eval_every"] = min(body["train"]["eval_every"], steps)
    body["hardware"]["device"] = device
    body["sweep"] = {
        "trials": trials,
        "sampler": "tpe",
        "pruner": "none",
        "seed": seed,
        "startup_trials": 5,
        "batch": batch,
        "space": case["body"]["space"],
    }
    if case is PBT:
        body["sweep"] |= {"sampler": "pbt", "pbt": {"interval": 100_000}}
        del body["sweep"]["startup_trials"], body["sweep"]["batch"]
    return body


def seed_returns(folder: Path, trial: int, study: str) -> list[float]:
    """The final eval returns of trial `trial`'s seeds."""
    import optuna
    from mlflow.tracking import MlflowClient

    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(folder / "optuna.journal"))
    )
    found = optuna.load_study(study_name=study, storage=storage).trials[trial]
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    run_id = found.user_attrs["marlctl.mlflow_run_id"]
    experiment = client.get_run(run_id).info.experiment_id
    seeds = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{run_id}'")
    return sorted(r.data.metrics["eval/return_mean"] for r in seeds)


def run(
    case_name: str, trials: int, steps: int, batch: int, seed: int = 0, device: str = "cpu"
) -> dict:
    case = CASES[case_name]
    name = f"sweep-batch-{case_name}-{batch}-{seed}"
    folder = WORKDIR / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / "spec.yaml"
    body = spec_for(case, name, trials, steps, batch, seed, device)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    summary, wall = marlctl_json(["sweep", str(path)], folder, f"{name}")
    best = summary["best"]
    return {
        "case": case_name,
        "batch": batch,
        "seed": seed,
        "trials": trials,
        "steps": steps,
        "complete": summary["counts"].get("COMPLETE", 0),
        "failed": summary["counts"].get("FAIL", 0),
        "wall_s": wall,
        "best": best["value"] if best else None,
        "best_params": best["params"] if best else None,
        "best_seeds": seed_returns(folder, best["trial"], name) if best else [],
    }


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| case | sweep.batch | trials complete | wall-clock | trials per hour | ratio | "
        "best objective | its seeds' final returns |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base: dict[str, float] = {}
    for r in rows:
        per_hour = r["complete"] / (r["wall_s"] / 3600)
        if r["batch"] == 1 and r["case"] != "pbt":
            base[r["case"]] = per_hour
        ratio = per_hour / base[r["case"]] if r["case"] in base else float("nan")
        seeds = ", ".join(f"{v:.2f}" for v in r["best_seeds"])
        best = "-" if r["best"] is None else f"{r['best']:.2f}"
        batch = "population" if r["case"] == "pbt" else r["batch"]
        # A population's members train 4x a trial's steps: its trials per hour compare with
        # nothing, and its wall-clock is not a speed figure (see population_summary).
        speed = "- | -" if r["case"] == "pbt" else f"{per_hour:.0f} | {ratio:.1f}x"
        lines.append(
            f"| {r['case']} (seed {r.get('seed', 0)}) | {batch} | "
            f"{r['complete']} of {r['trials']} | "
            f"{r['wall_s'] / 60:.1f} min | {speed} | {best} | {seeds} |"
        )
    return lines


def population_summary(rows: list[dict]) -> list[str]:
    """PBT's best final returns against the unbatched MAPPO sweep's best, where both ran."""
    import statistics

    pbt = [r for r in rows if r["case"] == "pbt" and r["best"] is not None]
    sweep = [r for r in rows if r["case"] == "mappo" and r["batch"] == 1]
    if not pbt or not sweep:
        return []
    bests = [r["best"] for r in pbt]
    base = sweep[0]
    spread = ", ".join(f"{v:.2f}" for v in base["best_seeds"])
    better = sum(value >= base["best"] for value in bests)
    return [
        f"PBT against the sweep: the best member's final objective in {len(bests)} "
        f"populations of their own sampler seeds, median {statistics.median(bests):.2f} "
        f"({', '.join(f'{v:.2f}' for v in bests)}), against {base['best']:.2f} for the best "
        f"trial of the unbatched {base['trials']}-trial MAPPO sweep (its seeds {spread}); "
        f"{better} of {len(bests)} populations at least as good. Each population trained "
        f"{pbt[0]['trials']} members x 2 seeds for {pbt[0]['steps']:,} env steps per seed, "
        f"the sweep's {base['trials']} trials x 2 seeds x {base['steps']:,} in all."
        + (
            " The populations' wall-clock is not a speed figure: they shared the machine "
            "with other work (`--busy`)."
            if any(r.get("busy") for r in pbt)
            else ""
        ),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="mappo,qmix")
    parser.add_argument("--trials", type=int, help="trials per study (default: each case's)")
    parser.add_argument("--steps", type=int, help="env steps per trial and seed")
    parser.add_argument("--batch", type=int, help="sweep.batch of the batched study")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--repeats", type=int, default=1, help="studies per case (pbt)")
    parser.add_argument("--device", default="cpu", help="hardware.device of every study")
    parser.add_argument("--jsonl", type=Path, help="append each study's row here")
    parser.add_argument(
        "--busy", action="store_true", help="other work shares the machine: no speed figure"
    )
    parser.add_argument("--scaling", action="store_true", help="measure rows' throughput first")
    parser.add_argument(
        "--ceiling", action="store_true", help="measure what batching can give at best first"
    )
    parser.add_argument(
        "--reuse", type=Path, help="a --jsonl of earlier studies: the same studies are not rerun"
    )
    args = parser.parse_args()
    earlier = []
    if args.reuse and args.reuse.exists():
        earlier = [json.loads(line) for line in args.reuse.read_text().splitlines() if line]
    # Measured now, or read back: the --jsonl keeps the scaling and ceiling measurements'
    # rows too, each with its date and machine.
    here = {"date": str(date.today()), "machine": machine(args.device)}
    kept = {}  # the latest measurement of each algorithm and row count
    for key, measure, wanted in (("scaling", scaling, args.scaling),
                                 ("ceiling", ceiling, args.ceiling)):  # fmt: skip
        kept[key] = list({(r["algo"], r["rows"]): r for r in earlier if r.get(key)}.values())
        if wanted:
            kept[key] = [{**r, key: True, **here} for r in measure()]
            if args.jsonl:
                with args.jsonl.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in kept[key])
    scaled, capped = kept["scaling"], kept["ceiling"]
    earlier = [r for r in earlier if not r.get("scaling") and not r.get("ceiling")]
    rows = []
    for case_name in args.cases.split(","):
        case = CASES[case_name]
        trials, steps = args.trials or case["trials"], args.steps or case["steps"]
        batches = [1] if case is PBT else [1, args.batch or case["batch"]]
        repeats = args.repeats if case is PBT else 1
        studies = [(batch, seed) for seed in range(repeats) for batch in batches]
        for batch, seed in studies:
            same = [
                r for r in earlier
                if (r["case"], r["batch"], r.get("seed", 0), r["trials"], r["steps"])
                == (case_name, batch, seed, trials, steps) and r["failed"] == 0
            ]  # fmt: skip
            if same:
                rows.append(same[-1])
                continue
            row = run(case_name, trials, steps, batch, seed, args.device)
            row |= {"busy": args.busy, **here}
            print(json.dumps(row), flush=True)
            rows.append(row)
            if args.jsonl:
                with args.jsonl.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    command = " ".join([".venv/bin/python bench/sweep_batch.py", *sys.argv[1:]])
    lines = [
        "# Sweep: trials one at a time against trials trained as one batch",
        "",
        f"Written by `{command}`. The studies"
        + (" and the scaling" if scaled else "")
        + f" were measured {measured_on(rows + scaled)}.",
        "",
        "Each study runs through `marlctl sweep`, one worker, TPE (seed 0, 5 startup trials, "
        "constant liar), no pruner, so that every trial trains its whole budget; the two "
        "studies of a case differ only in `sweep.batch`. The ratio is completed trials per "
        "hour against `sweep.batch: 1`. Objective: the mean over the seeds of the final "
        "evaluation's `eval/return_mean`.",
        "",
    ]
    for case_name in dict.fromkeys(r["case"] for r in rows):
        case = CASES[case_name]
        mine = [r for r in rows if r["case"] == case_name]
        lines.append(
            f"- **{case_name}**: {case['what']}; {mine[0]['trials']} trials of "
            f"{mine[0]['steps']:,} env steps per seed; space "
            f"{', '.join(f'`{k}`' for k in case['body']['space'])}."
        )
    lines += ["", *table(rows), "", *population_summary(rows)]
    if scaled:
        lines += [
            "Throughput against the batch's size (`--scaling`): one trainer, each row with its "
            "own learning rate, 10 s of training after a warm-up, env steps per second of all "
            "rows together (a row alone trains at the rate divided by the rows):",
            "",
            "| algorithm | " + " | ".join(f"{r} rows" for r in dict.fromkeys(
                s["rows"] for s in scaled)) + " |",
            "|---|" + "---|" * len(dict.fromkeys(s["rows"] for s in scaled)),
        ]  # fmt: skip
        for algo in dict.fromkeys(s["algo"] for s in scaled):
            rates = [f"{s['env_steps_per_s']:,.0f}" for s in scaled if s["algo"] == algo]
            lines.append(f"| {algo} | " + " | ".join(rates) + " |")
        lines.append("")
    if capped:
        lines += ceiling_lines(capped)
    lines += ["Best parameters found:", ""]
    for r in rows:
        lines.append(f"- {r['case']}, batch {r['batch']}: `{json.dumps(r['best_params'])}`")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
