"""Benchmark: env-only throughput of native SMAX against JaxMARL's SMAX, side by side.

Both step `HeuristicEnemySMAX` (the allies act, the enemies follow SMAX's heuristic) with
uniformly random ally actions drawn on the device each step, every env resetting when its
episode ends, for the same scenarios and numbers of envs, on this machine's CPU (or a GPU
with `--device cuda`), one after the other. JaxMARL runs as its authors benchmark it: a
jitted `lax.scan` of the vmapped step (compilation excluded); marlctl as its trainers call
the env (`marlctl.envs.native`), eager and compiled (`hardware.compile: true`: the step's
random-free methods through torch.compile, compilation excluded). Env steps/s count one
step of one env. Writes
`bench/results/smax.md` (and `.jsonl`).

    .venv/bin/python bench/smax.py                          # 3m and 27m_vs_30m, CPU
    .venv/bin/python bench/smax.py --scenarios 2s3z --num-envs 64,1024 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

from pettingzoo_mappo import machine

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "smax.md"
DONE = ROOT / "bench" / "results" / "smax.jsonl"
SCAN = 16  # steps per jitted call on the JAX side


def ours(scenario: str, num_envs: int, seconds: float, device: str, compiled: bool) -> float:
    import torch

    from marlctl.envs.native import native_class

    env = native_class(f"smax/{scenario}")({}, num_envs, device)
    if compiled:  # as `hardware.compile: true` runs it (compilation in the warm-up)
        env.compile()
    env.reset(0)
    (group,) = env.info.groups
    shape = (num_envs, group.n_agents)

    def step():
        env.step({group.name: torch.randint(0, group.n_actions, shape, device=device)})

    for _ in range(5):  # warm-up
        step()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return steps * num_envs / (time.perf_counter() - start)


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
    key, state = run(key, state)  # compile
    jax.block_until_ready(state)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        # Waited for call by call: dispatched asynchronously, calls would queue past the
        # time limit (at 27m_vs_30m with 4,096 envs a call takes seconds).
        key, state = jax.block_until_ready(run(key, state))
        calls += 1
    return calls * SCAN * num_envs / (time.perf_counter() - start)


def table(cells: list[dict]) -> str:
    lines = [
        "# Native SMAX and JaxMARL's SMAX: env-only throughput",
        "",
        "`python bench/smax.py`: `HeuristicEnemySMAX` with uniformly random ally actions, "
        "auto-reset, each tool one after the other on the same machine: JaxMARL 0.2.0 (JAX "
        f"on the same device, a jitted scan of {SCAN} vmapped steps, compilation excluded) "
        "and marlctl's native env stepped as its trainers step it: eager, and compiled as "
        "`hardware.compile: true` compiles it (the step's random-free methods through "
        "torch.compile; compilation excluded). Env steps/s: steps of one env (each moves "
        "every unit, 8 world steps). The ratio takes marlctl's faster mode.",
        "",
        "| scenario | device | envs | marlctl eager | marlctl compiled | JaxMARL | "
        "marlctl / JaxMARL | measured | machine |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        best = max(c["marlctl"], c["marlctl_compiled"])
        lines.append(
            f"| {c['scenario']} | {c['device']} | {c['num_envs']:,} | {c['marlctl']:,.0f} | "
            f"{c['marlctl_compiled']:,.0f} | {c['jaxmarl']:,.0f} | "
            f"{best / c['jaxmarl']:.2f} | {c['measured']} | {c['machine']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="3m,27m_vs_30m")
    parser.add_argument("--num-envs", default="64,256,1024,4096")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    import jax
    import torch

    torch.set_num_threads(args.threads)
    if args.device == "cpu":
        jax.config.update("jax_platforms", "cpu")
    done = [json.loads(line) for line in DONE.read_text().splitlines()] if DONE.exists() else []
    here = machine(args.device)
    for scenario in args.scenarios.split(","):
        for n in (int(x) for x in args.num_envs.split(",")):
            cell = {
                "scenario": scenario,
                "device": args.device,
                "num_envs": n,
                "marlctl": ours(scenario, n, args.seconds, args.device, False),
                "marlctl_compiled": ours(scenario, n, args.seconds, args.device, True),
                "jaxmarl": theirs(scenario, n, args.seconds),
                "measured": date.today().isoformat(),
                "machine": here,
            }
            print(json.dumps(cell))
            key = (scenario, args.device, n, here)
            done = [c for c in done if (c["scenario"], c["device"], c["num_envs"],
                                        c["machine"]) != key] + [cell]  # fmt: skip
            DONE.write_text("".join(json.dumps(c) + "\n" for c in done))
            OUT.write_text(table(done))


if __name__ == "__main__":
    main()
