"""Benchmark: operators dispatched per gradient step of every replay-based algorithm.

Counts the ATen operators the torch profiler records for one gradient step (a sampled batch,
its losses, backward, gradient clipping, the optimiser step and the target update), on the
CPU, where every operator the Python code dispatches shows as one event: on a GPU each
non-view operator is at least one kernel launch, which is what limits small networks there.
'dispatched' counts the operators called from Python (top-level events); 'all' adds those
they call in turn. Native simple_spread (N=3), batch 256, one seed.

    python bench/ops.py                         # this checkout: eager and compiled
    python bench/ops.py --label 3ba90aa --modes eager   # run from another checkout
    python bench/ops.py --table                 # rewrite bench/results/ops.md

Rows accumulate in `bench/results/ops.jsonl` (one per checkout, algorithm and mode); the
table compares each algorithm with the row labelled `--baseline`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "spread_mappo_native.yaml"
JSONL = ROOT / "bench" / "results" / "ops.jsonl"
OUT = ROOT / "bench" / "results" / "ops.md"
ALGOS = ("qmix", "vdn", "iql", "maddpg", "matd3", "masac", "hasac")
STEPS = 10


def _built(overrides: list[str]):
    """The spec's trainer and env with `overrides`, 64 envs, one seed, on one CPU thread."""
    import torch

    from marlctl.plan import compile_plan, learner_info
    from marlctl.spec import load_spec
    from marlctl.train.runner import build_trainer, make_env

    fixed = ["hardware.num_envs=64", "hardware.device=cpu", "seeds=[0]"]
    loaded = load_spec(SPEC, [*overrides, *fixed])
    plan = compile_plan(loaded)
    spec, info = loaded.spec, plan.env
    torch.set_num_threads(1)
    device = torch.device("cpu")
    trainer = build_trainer(spec, learner_info(info, spec), 64, device, 1_000, (0,))
    return spec, trainer, make_env(spec, info, 64, device)


def _per_step(prof, steps: int) -> dict:
    """ATen operators per step: called from Python ('dispatched'), and all."""
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    return {"dispatched": len(top) / steps, "all": len(events) / steps}


def count(algo: str, compiled: bool) -> dict:
    from torch.profiler import ProfilerActivity, profile

    overrides = [
        f"algos={algo}", "~algo.epochs", "~algo.minibatches", "~algo.lr", "~model.activation",
        "algo.batch_size=256", "algo.updates=8", "algo.gamma=0.9",
    ]  # fmt: skip
    _, trainer, env = _built(overrides)
    if compiled:
        trainer.compile()
    ob = env.reset(0)
    while not trainer.ready():
        ob, _ = trainer.train_iteration(env, ob)
    ob, _ = trainer.train_iteration(env, ob)  # gradient steps begin: regions compile

    def batch():
        if hasattr(trainer, "sampled_batch"):
            return trainer.sampled_batch()
        return trainer.prepare(trainer.buffer.sample(trainer.cfg.batch_size, trainer.window))

    def step():
        trainer.update(batch())
        trainer.after_update()

    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            step()
    return _per_step(prof, STEPS)


def count_rollout(compiled: bool) -> dict:
    """Operators per step of an on-policy rollout: IPPO with `bench/gpu.py`'s JaxMARL
    settings, each group's acting, the env step and the episode statistics."""
    from gpu import JAXMARL_IPPO
    from torch.profiler import ProfilerActivity, profile

    overrides = [*JAXMARL_IPPO, "algo.rollout_steps=8"]
    spec, trainer, env = _built(overrides + ["hardware.compile=true"] * compiled)
    if compiled:
        env.compile()
    ob = env.reset(0)
    for _ in range(2):  # the first compiles
        _, ob, _ = trainer.collect(env, ob)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.collect(env, ob)
    return _per_step(prof, spec.algo.rollout_steps)


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=list(ALGOS))
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"])
    parser.add_argument("--label", help="the rows' label (default: this checkout's commit)")
    parser.add_argument("--baseline", default="3ba90aa", help="the label to compare with")
    parser.add_argument("--table", action="store_true", help="only rewrite the table")
    parser.add_argument(
        "--rollout", action="store_true", help="IPPO's rollout steps instead of gradient steps"
    )
    parser.add_argument(
        "--rollout-baseline", default="b6f3769", help="the label to compare rollout steps with"
    )
    args = parser.parse_args()
    if not args.table:
        label = args.label or commit()
        with JSONL.open("a") as sink:
            for algo in ["ippo"] if args.rollout else args.algos:
                for mode in args.modes:
                    row = {"label": label, "algo": algo, "mode": mode}
                    if args.rollout:
                        row |= {"kind": "rollout"} | count_rollout(mode == "compiled")
                    else:
                        row |= count(algo, mode == "compiled")
                    print(json.dumps(row), flush=True)
                    sink.write(json.dumps(row) + "\n")
    write_table(args.baseline, args.rollout_baseline)
    print(OUT.read_text())


def write_table(baseline: str, rollout_baseline: str) -> None:
    rows: dict[tuple[str, str, str], dict] = {}
    rollout: dict[tuple[str, str], dict] = {}
    for line in JSONL.read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "rollout":
            rollout[(row["label"], row["mode"])] = row
            continue
        rows[(row["label"], row["algo"], row["mode"])] = row  # the latest of each
    labels = list(dict.fromkeys(label for label, _, _ in rows if label != baseline))
    latest = labels[-1] if labels else baseline
    lines = [
        "# Operators dispatched per gradient step",
        "",
        "Written by `python bench/ops.py`: ATen operators per gradient step of native "
        "simple_spread (N=3), batch 256, one seed, counted by the torch profiler on the CPU "
        "(sampled batch, losses, backward, clipping, optimiser and target update). "
        "'dispatched': called from Python (on a GPU each non-view one launches at least one "
        "kernel); 'all': with the operators they call. 'compiled': `hardware.compile: true`, "
        f"the losses as compiled regions. Baseline: commit {baseline}; now: {latest}.",
        "",
        "| algorithm | dispatched, baseline | eager | compiled | compiled / baseline "
        "| all, baseline | eager | compiled |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(row: dict, key: str) -> str:
        return f"{row[key]:,.0f}" if row else "—"

    for algo in ALGOS:
        base = rows.get((baseline, algo, "eager"), {})
        eager = rows.get((latest, algo, "eager"), {})
        comp = rows.get((latest, algo, "compiled"), {})
        if not (base or eager or comp):
            continue
        share = f"{comp['dispatched'] / base['dispatched']:.2f}" if base and comp else "—"
        lines.append(
            f"| {algo} | {cell(base, 'dispatched')} | {cell(eager, 'dispatched')} "
            f"| {cell(comp, 'dispatched')} | {share} | {cell(base, 'all')} "
            f"| {cell(eager, 'all')} | {cell(comp, 'all')} |"
        )
    if rollout:
        now = [label for label, _ in rollout if label != rollout_baseline][-1:] or [""]
        lines += [
            "",
            "## Operators dispatched per on-policy rollout step",
            "",
            "`python bench/ops.py --rollout`: IPPO with `bench/gpu.py`'s JaxMARL settings, 64 "
            "envs, one seed, per step of a rollout (each group's acting, the env step, the "
            "episode statistics). 'compiled': `hardware.compile: true`, which compiles the "
            "networks and the env step, and since " + now[0] + " each group's acting and the "
            "episode statistics as regions of their own.",
            "",
            "| checkout | dispatched, eager | compiled | all, eager | compiled |",
            "|---|---|---|---|---|",
        ]
        for label in dict.fromkeys(label for label, _ in rollout):
            eager, comp = rollout.get((label, "eager"), {}), rollout.get((label, "compiled"), {})
            lines.append(
                f"| {label} | {cell(eager, 'dispatched')} | {cell(comp, 'dispatched')} "
                f"| {cell(eager, 'all')} | {cell(comp, 'all')} |"
            )
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
