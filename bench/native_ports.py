"""Benchmark: env-only throughput of the native ports of JaxMARL's envs beside JaxMARL's own:
Overcooked (every layout) and Hanabi (2 to 5 players), on the CPU.

marlctl: `marlctl bench SPEC --env-only` (random allowed actions drawn on the device every
step, 2 s per point after warm-up, `hardware.threads_per_run=auto`), eager and with
`hardware.compile=true`. JaxMARL (the jaxmarl package installed beside marlctl, JAX on the
CPU with all its threads): each env stepped as its own training loops step it, `jax.jit` of a
`jax.lax.scan` over 128 steps of `jax.vmap(env.step)` (its automatic reset included), the
random allowed actions drawn inside the scan (Hanabi: uniform over `get_legal_moves`), each
step's observations and rewards summed into the scan's carry as a training loop reads them
(else the compiler drops the observation's computation); timed after the compiling call,
the best of three scans. Writes `bench/results/native_ports.md`.

    .venv/bin/python bench/native_ports.py                 # about 10 minutes on 2 cores
    .venv/bin/python bench/native_ports.py --envs overcooked/cramped_room --num-envs 1024
"""

from __future__ import annotations

import argparse
import time
import warnings
from datetime import date
from importlib.metadata import version
from pathlib import Path

from common import machine, marlctl_json, table

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "spread_mappo_native.yaml"
OUT = ROOT / "bench" / "results" / "native_ports.md"
WORKDIR = ROOT / "bench" / "runs"
SCAN = 128  # steps per compiled scan, as JaxMARL's baselines' NUM_STEPS
ENVS = [
    *(f"overcooked/{layout}" for layout in ("cramped_room", "asymm_advantages",
                                            "coord_ring", "forced_coord", "counter_circuit")),
    *(f"hanabi/{players}p" for players in (2, 3, 4, 5)),
]  # fmt: skip


def ours(env_id: str, num_envs: int, compiled: bool) -> float:
    data, _ = marlctl_json(
        [
            "bench", str(SPEC), "--env-only", "--num-envs", str(num_envs), "--seconds", "2",
            f"env.id={env_id}", "~env.params", "hardware.device=cpu",
            f"hardware.compile={str(compiled).lower()}", "hardware.threads_per_run=auto",
        ],
        WORKDIR,
        f"bench of {env_id}",
    )  # fmt: skip
    (point,) = [p for p in data["points"] if p["kind"] == "env"]
    return point["env_steps_per_s"]


def _jaxmarl_env(env_id: str):
    family, name = env_id.split("/")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if family == "overcooked":
            from jaxmarl.environments.overcooked import Overcooked, overcooked_layouts

            return Overcooked(overcooked_layouts[name])
        from jaxmarl.environments.hanabi.hanabi import HanabiEnv

        return HanabiEnv(num_agents=int(name.rstrip("p")))


def theirs(env_id: str, num_envs: int, repeats: int = 3) -> float:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_platforms", "cpu")
    env = _jaxmarl_env(env_id)
    agents = list(env.agents)

    def allowed(state) -> dict:
        if hasattr(env, "get_legal_moves"):
            return env.get_legal_moves(state)
        return {a: jnp.ones(env.action_space(a).n, bool) for a in agents}

    def one(carry, _):
        key, states, total = carry
        key, draw, step = jax.random.split(key, 3)
        masks = jax.vmap(allowed)(states)
        keys = jax.random.split(draw, len(agents))
        actions = {
            a: jax.random.categorical(k, jnp.where(masks[a], 0.0, -jnp.inf))
            for a, k in zip(agents, keys, strict=True)
        }
        obs, states, rewards, _, _ = jax.vmap(env.step)(
            jax.random.split(step, num_envs), states, actions
        )
        # What a training loop reads, summed so that the compiler keeps computing it.
        for a in agents:
            total = total + obs[a].sum(dtype=jnp.float32) + rewards[a].sum()
        return (key, states, total), None

    @jax.jit
    def scan(carry):
        return jax.lax.scan(one, carry, None, SCAN)[0]

    key = jax.random.PRNGKey(0)
    _, states = jax.jit(jax.vmap(env.reset))(jax.random.split(key, num_envs))
    carry = jax.block_until_ready(scan((key, states, jnp.float32(0))))  # compiles
    best = 0.0
    for _ in range(repeats):
        began = time.perf_counter()
        carry = jax.block_until_ready(scan(carry))
        best = max(best, num_envs * SCAN / (time.perf_counter() - began))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default=",".join(ENVS))
    parser.add_argument("--num-envs", default="256,4096", help="comma-separated")
    args = parser.parse_args()
    WORKDIR.mkdir(parents=True, exist_ok=True)
    header = ["env", "envs", "JaxMARL", "marlctl eager", "marlctl compiled", "marlctl / JaxMARL"]
    rows = []
    for env_id in args.envs.split(","):
        for num_envs in map(int, args.num_envs.split(",")):
            peer = theirs(env_id, num_envs)
            eager, fused = ours(env_id, num_envs, False), ours(env_id, num_envs, True)
            best = max(eager, fused)
            rows.append([env_id, f"{num_envs:,}", f"{peer:,.0f}", f"{eager:,.0f}",
                         f"{fused:,.0f}", f"{best / peer:.2f}"])  # fmt: skip
            print(" | ".join(rows[-1]), flush=True)
    lines = [
        "# The native ports beside JaxMARL's envs: env-only throughput",
        "",
        f"Measured {date.today().isoformat()} with `python bench/native_ports.py "
        f"--envs {args.envs} --num-envs {args.num_envs}` on {machine('cpu')}; "
        f"jaxmarl {version('jaxmarl')}, jax {version('jax')}.",
        "",
        "Env steps per second (every env of the batch one step), random allowed actions. "
        f"JaxMARL: `jax.jit` of a `jax.lax.scan` over {SCAN} steps of `jax.vmap(env.step)` "
        "(its automatic reset included), the actions drawn inside the scan, every step's "
        "observations and rewards summed into the carry (read, as a training loop reads them), "
        "the best of three scans after the compiling one. marlctl: `marlctl bench "
        "--env-only` (2 s after warm-up), eager and with `hardware.compile=true`; the ratio "
        "takes the faster.",
        "",
        *table(rows, header),
        "",
    ]
    OUT.write_text("\n".join(lines))
    print(OUT.read_text())


if __name__ == "__main__":
    main()
