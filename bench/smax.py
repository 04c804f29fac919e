"""Benchmark: env-only throughput of native SMAX against JaxMARL's SMAX, side by side.

Both step `HeuristicEnemySMAX` (the allies act, the enemies follow SMAX's heuristic) with
uniformly random ally actions drawn on the device each step, every env resetting when its
episode ends, for the same scenarios and numbers of envs, on this machine's CPU (or a GPU
with `--device cuda`), one after the other. JaxMARL runs as its authors benchmark it: a
jitted `lax.scan` of the vmapped step (compilation excluded); marlctl as its trainers call
the env (`marlctl.envs.native`), eager and compiled (`hardware.compile: true`: the step's
random-free methods through torch.compile, compilation excluded), and on a GPU captured as a
CUDA graph as a captured training iteration steps it (alone and compiled). JAX allocates
GPU memory as it needs it (`XLA_PYTHON_CLIENT_PREALLOCATE=false`), beside torch's. Env
steps/s count one step of one env. Writes `bench/results/smax.md` (and `.jsonl`).

    .venv/bin/python bench/smax.py                          # 3m and 27m_vs_30m, CPU
    .venv/bin/python bench/smax.py --scenarios 2s3z --num-envs 64,1024 --seconds 5
    python bench/smax.py --device cuda --num-envs 1024,16384   # eager, CUDA graph, compiled
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import date
from pathlib import Path

from common import machine

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "smax.md"
DONE = ROOT / "bench" / "results" / "smax.jsonl"
SCAN = 16  # steps per jitted call on the JAX side


MODES = {  # how marlctl's env steps: compiled (torch.compile), captured (CUDA graph)
    "eager": (False, False),
    "compiled": (True, False),
    "graph": (False, True),
    "graph_compiled": (True, True),
}


def ours(scenario: str, num_envs: int, seconds: float, device: str, mode: str) -> float | None:
    """Env steps/s of marlctl's native env in `mode`; None where a CUDA graph cannot be
    captured. Captured: `SCAN` steps per graph, as JaxMARL's jitted scan."""
    import torch

    from marlctl.envs.native import native_class

    compiled, graph = MODES[mode]
    env = native_class(f"smax/{scenario}")({}, num_envs, device)
    if compiled:  # as `hardware.compile: true` runs it (compilation in the warm-up)
        env.compile()
    (group,) = env.info.groups
    shape = (num_envs, group.n_agents)

    def step():
        env.step({group.name: torch.randint(0, group.n_actions, shape, device=device)})

    call, per_call = step, 1
    if graph:  # as a captured training iteration steps it
        from marlctl.train.capture import IterationGraph

        env.make_graph_safe()
        captured = IterationGraph([env], list(env.generators), [])

        def steps():
            for _ in range(SCAN):
                step()

        call, per_call = (lambda: captured.run(steps)), SCAN
    env.reset(0)
    for _ in range(5):  # warm-up (and capture)
        call()
    if graph and (captured.graph is None or captured.failed):
        return None
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        calls += 1
        if calls % 8 == 0:  # queued asynchronous calls must not run past the time limit
            sync()
    sync()
    return calls * per_call * num_envs / (time.perf_counter() - start)


def theirs(scenario: str, num_envs: int, seconds: float) -> float:
    import jax
    from jaxmarl.environments.smax import HeuristicEnemySMAX, map_name_to_scenario

    env = HeuristicEnemySMAX(scenario=map_name_to_scenario(scenario))
    n_actions = env.action_space(env.agents[0]).n
    keys = jax.random.split(jax.random.PRNGKey(0), num_envs)
    _, state = jax.vmap(env.reset)(keys)

    def one(carry, _):
        key, state = carry
        key, act_key, step_key = jax.random.split(key, 3)
        actions = jax.random.randint(act_key, (len(env.agents), num_envs), 0, n_actions)
        joint = {a: actions[i] for i, a in enumerate(env.agents)}
        _, state, _, _, _ = jax.vmap(env.step)(jax.random.split(step_key, num_envs), state, joint)
        return (key, state), None

    @jax.jit
    def run(key, state):
        (key, state), _ = jax.lax.scan(one, (key, state), None, length=SCAN)
        return key, state

    key = jax.random.PRNGKey(1)
    # Two warm-up calls: the first compiles for `reset`'s state, the second once more for the
    # state `step` returns (its arrays' weak types differ), after which calls reuse the code.
    for _ in range(2):
        key, state = jax.block_until_ready(run(key, state))
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        # Waited for call by call: dispatched asynchronously, calls would queue past the
        # time limit (at 27m_vs_30m with 4,096 envs a call takes seconds).
        key, state = jax.block_until_ready(run(key, state))
        calls += 1
    return calls * SCAN * num_envs / (time.perf_counter() - start)


def field(mode: str) -> str:
    """A cell's field for marlctl's figure in `mode` (eager's is plain `marlctl`)."""
    return "marlctl" if mode == "eager" else f"marlctl_{mode}"


def table(cells: list[dict]) -> str:
    def rate(cell: dict, mode: str) -> str:
        value = cell.get(field(mode))
        return "—" if value is None else f"{value:,.0f}"

    lines = [
        "# Native SMAX and JaxMARL's SMAX: env-only throughput",
        "",
        "`python bench/smax.py`: `HeuristicEnemySMAX` with uniformly random ally actions, "
        "auto-reset, each tool one after the other on the same machine: JaxMARL 0.2.0 (JAX "
        f"on the same device, a jitted scan of {SCAN} vmapped steps, compilation excluded: two "
        "warm-up calls, as the second compiles again for the state `step` returns) "
        "and marlctl's native env stepped as its trainers step it: eager, compiled as "
        "`hardware.compile: true` compiles it (the step's random-free methods through "
        "torch.compile), and on a GPU captured as a CUDA graph of "
        f"{SCAN} steps as a captured training iteration runs it, alone and compiled; "
        "compilation and capture excluded, '—' not measured. Env steps/s: steps of one env "
        "(each moves every unit, 8 world steps). The ratio takes marlctl's fastest mode.",
        "",
        "| scenario | device | envs | marlctl eager | marlctl compiled | CUDA graph | "
        "CUDA graph, compiled | JaxMARL | marlctl / JaxMARL | measured | machine |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        best = max(c[field(m)] for m in MODES if c.get(field(m)) is not None)
        lines.append(
            f"| {c['scenario']} | {c['device']} | {c['num_envs']:,} | "
            + " | ".join(rate(c, mode) for mode in MODES)
            + f" | {c['jaxmarl']:,.0f} | {best / c['jaxmarl']:.2f} | {c['measured']} | "
            f"{c['machine']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="3m,27m_vs_30m")
    parser.add_argument("--num-envs", default="64,256,1024,4096")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--modes",
        help=f"marlctl's modes, of {', '.join(MODES)} (default: eager,compiled on a CPU, "
        "eager,graph,graph_compiled on a GPU)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--table", action="store_true", help="only write the table")
    args = parser.parse_args()
    done = [json.loads(line) for line in DONE.read_text().splitlines()] if DONE.exists() else []
    if args.table:
        OUT.write_text(table(done))
        return
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import torch

    torch.set_num_threads(args.threads)
    if args.device == "cpu":
        jax.config.update("jax_platforms", "cpu")
    default = "eager,compiled" if args.device == "cpu" else "eager,graph,graph_compiled"
    modes = (args.modes or default).split(",")
    if unknown := set(modes) - set(MODES):
        parser.error(f"--modes: unknown {', '.join(sorted(unknown))}")
    here = machine(args.device)
    for scenario in args.scenarios.split(","):
        for n in (int(x) for x in args.num_envs.split(",")):
            cell = {"scenario": scenario, "device": args.device, "num_envs": n}
            for mode in modes:
                cell[field(mode)] = ours(scenario, n, args.seconds, args.device, mode)
            if args.device.startswith("cuda"):  # JAX's memory beside torch's
                torch.cuda.empty_cache()
            cell |= {
                "jaxmarl": theirs(scenario, n, args.seconds),
                "measured": date.today().isoformat(),
                "machine": here,
            }
            print(json.dumps(cell), flush=True)
            key = (scenario, args.device, n, here)
            done = [c for c in done if (c["scenario"], c["device"], c["num_envs"],
                                        c["machine"]) != key] + [cell]  # fmt: skip
            DONE.write_text("".join(json.dumps(c) + "\n" for c in done))
            OUT.write_text(table(done))


if __name__ == "__main__":
    main()
