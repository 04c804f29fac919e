"""What the benchmark scripts share: the machine line of every results table (and when and
where kept rows were measured), the run of
`marlctl ... --json`, the newest finished run in a kept store, the suites' per-seed
reference values, a Markdown table and a Student-t interval."""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path


def machine(device: str = "cpu") -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import os

    import torch

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}, {len(os.sched_getaffinity(0))} cores, {memory:.0f} GiB RAM, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}, "
        + (
            f"{torch.cuda.get_device_name(device)} used"
            if device.startswith("cuda") and torch.cuda.is_available()
            else "no GPU used"
        )
    )


def measured_on(rows: list[dict]) -> str:
    """When and where kept rows (each with its `date` and `machine`) were measured: "D1 and
    D2 on M1; D3 on M2", machines in the order the rows name them."""
    dates: dict[str, dict[str, None]] = {}
    for r in rows:
        dates.setdefault(r["machine"], {})[r["date"]] = None
    return "; ".join(f"{' and '.join(d)} on {m}" for m, d in dates.items())


def per_seed_values(values: list[float]) -> dict:
    """A suite reference's per-seed values as the bench scripts write them: rounded to four
    decimals, with the `precision` that says so (the verdict widens the interval by half)."""
    return {"per_seed": [round(v, 4) for v in values], "precision": 0.0001}


def marlctl_json(
    args: list[str], cwd: Path, what: str, env: dict | None = None
) -> tuple[dict, float]:
    """Run `marlctl ARGS --json` in `cwd` (with environment `env`, or this process's): its JSON
    summary and the wall-clock seconds."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "marlctl", *args, "--json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - start
    if "{" not in done.stdout:
        raise SystemExit(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout[done.stdout.index("{") :]), wall


def newest_parent_run(cwd: Path, query: str):
    """The newest finished parent run (an `mlflow.entities.Run`) matching the MLflow filter
    `query` in `cwd`'s store, or None."""
    from mlflow.tracking import MlflowClient

    if not (cwd / "mlflow.db").exists():
        return None
    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    found = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"{query} and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
    )
    return next((r for r in found if "mlflow.parentRunId" not in r.data.tags), None)


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    """A Markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def t_interval(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of its 95% Student-t confidence interval."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)


def random_play(env_id: str, episodes: int = 1024, seed: int = 0) -> float:
    """Uniform random actions of native `env_id` at its defaults, among the allowed ones: the
    mean per-agent episode return over `episodes` episodes."""
    import torch

    from marlctl.envs.native import native_class

    env = native_class(env_id)({}, episodes, "cpu")
    draws = torch.Generator().manual_seed(seed)
    ob, agents = env.reset(0), env.info.n_agents
    total, running = torch.zeros(episodes), torch.ones(episodes, dtype=torch.bool)
    while running.any():
        actions = {}
        for g in env.info.groups:
            mask = ob.masks.get(g.name)
            if mask is None:
                mask = torch.ones(episodes, g.n_agents, g.n_actions, dtype=torch.bool)
            weights = mask.reshape(-1, g.n_actions).float()
            actions[g.name] = torch.multinomial(weights, 1, generator=draws).view(mask.shape[:-1])
        step = env.step(actions)
        total += torch.where(running, sum(r.sum(-1) for r in step.rewards.values()) / agents, 0)
        running &= ~(step.terminated | step.truncated)
        ob = step.next
    return float(total.mean())
