"""Benchmark: marlctl on one GPU, eager and captured as CUDA graphs, beside JaxMARL.

Measures on the first CUDA device, in one run:
1. env-only native simple_spread (N=3), random actions drawn on the device each step:
   eager and captured (`marlctl bench --env-only`), and JaxMARL's `MPE_simple_spread_v3`
   stepped in a jitted scan (`bench/gpu_jaxmarl.py --work env_only`);
2. IPPO with JaxMARL's hyperparameters (its `baselines/IPPO/ippo_ff_mpe.py`, translated
   field by field in `JAXMARL_IPPO`): eager and captured (`marlctl bench`), compiled, and
   compiled in TF32 (`hardware.tf32=true`, JAX's default precision for float32 matrix
   products on these GPUs), and JaxMARL's own (`bench/gpu_jaxmarl.py --work ippo`), whose
   compile time is reported apart;
3. the replay-based algorithms at 1,024 envs with the reproduction benchmark's
   update-to-data ratio (`suites/baseline-mpe.yaml`: 2 gradient steps per 32 env steps): eager,
   captured as a CUDA graph (`hardware.compile: auto`), and captured with their gradient
   steps' losses compiled (`hardware.compile: true`);
4. start-up: a tiny run (`marlctl run specs/spread_mappo_native.yaml hardware.device=cuda
   hardware.num_envs=4096 train.total_env_steps=4096 train.eval_every=0`), its wall-clock
   seconds and the seconds from the command to its first env step (`perf/startup_s`);
5. `marlctl run specs/spread_mappo_native.yaml hardware.device=cuda
   hardware.num_envs=4096`: seconds from the command's start to the first evaluation at
   -15 or better (`first_eval_tf32`: the same in TF32);
6. offline: the offline algorithms' gradient steps on a dataset recorded from a short MAPPO
   run of the same spec (`train.record`, at least 102,400 transitions), eager and captured, at the
   replay-based section's batch and gradient steps per iteration, beside the gradient steps
   per second of the online learner each extends (its captured row in section 3).
Each measurement is kept in the results file with its date and machine; the table shows the
latest of each (per algorithm and mode for the replay-based section), saying which is from
where. Start-up figures need Python's bytecode compiled ahead: where the interpreter does not
write it (`PYTHONDONTWRITEBYTECODE`), compile it first (`python -m compileall`).
Writes `bench/results/gpu.md` and `bench/results/gpu.jsonl`. JaxMARL's rows need `jax` and
the `jaxmarl` package importable (see `bench/gpu_jaxmarl.py`); without them they are left
out and the table says so.

`--device cpu --sections offpolicy startup` measures the same replay-based and start-up rows
on the CPU, the baseline a GPU run must beat, into `bench/results/cpu_offpolicy.md`.

    python bench/gpu.py                       # about 8 minutes on an H100
    python bench/gpu.py --sections env ippo   # a part
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from common import machine, marlctl_json, table

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "spread_mappo_native.yaml"
OUT = ROOT / "bench" / "results" / "gpu.md"
JSONL = ROOT / "bench" / "results" / "gpu.jsonl"
WORKDIR = ROOT / "bench" / "runs"
SIZES = (1024, 4096, 65536)
# JaxMARL's ippo_ff_mpe.yaml in marlctl's terms: 64x64 separate actor and critic as the
# preset's model, without the input LayerNorm JaxMARL's networks do not have; the env is
# simple_spread with 25-step episodes (JaxMARL's run 26 steps).
JAXMARL_IPPO = (
    "algos=ippo", "algo.rollout_steps=128", "algo.epochs=4", "algo.minibatches=4",
    "algo.lr=2.5e-4", "algo.anneal_lr=true", "algo.max_grad_norm=0.5", "algo.value_coef=0.5",
    "algo.entropy_coef=0.01", "algo.clip=0.2", "algo.gamma=0.99", "algo.gae_lambda=0.95",
    "algo.huber_delta=null", "algo.value_norm=false", "model.activation=tanh",
    "model.layer_norm=false", "algo.bootstrap_time_limit=false",
)  # fmt: skip
# What records measured before their settings were kept with them ran: the above but the time
# limit, which JaxMARL's GAE treats as a termination and marlctl then bootstrapped through.
EARLIER_IPPO = JAXMARL_IPPO[:-1]
OFF_POLICY = ("qmix", "masac", "maddpg", "iql", "vdn", "matd3")
# The offline algorithms, each with the online learner whose gradient steps it takes on a
# dataset instead of a replay buffer (behaviour cloning: none).
OFFLINE = {"qmix_cql": "qmix", "iql_cql": "iql", "maicq": "qmix", "bc": None}
# Section 3's ratio: 64 gradient steps per iteration of 1,024 env steps.
UPDATES_PER_ENV_STEP = 64 / 1024


def marlctl(*args: str) -> dict:
    """`marlctl ARGS --json`'s summary; a failure is recorded, not raised, so that one
    failing measurement leaves the others of the run (and their GPU minutes) standing."""
    try:
        data = marlctl_json(list(args), WORKDIR, args[0])[0]
    except SystemExit as failure:
        return {"error": str(failure)[-2000:]}
    if data.get("ok") is False:
        return {"error": "; ".join(map(str, data.get("errors", [])))[-2000:]}
    return data


def jaxmarl(work: str, sizes: tuple[int, ...]) -> list[dict]:
    args = ["--work", work, "--num-envs", *map(str, sizes), "--repeats", "3"]
    args += ["--updates", "10"] if work == "ippo" else ["--env-steps", "128"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_jaxmarl.py"), *args],
        capture_output=True,
        text=True,
    )
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if not rows:
        return [{"impl": "jaxmarl", "work": work, "error": done.stderr.strip()[-2000:]}]
    return rows


def points(data: dict, kind: str) -> dict[tuple[int, str], dict]:
    return {(p["num_envs"], p["mode"]): p for p in data.get("points", []) if p["kind"] == kind}


def merged(results: dict, key: str, kind: str) -> dict[tuple[int, str], dict]:
    """Points of the eager-and-graph bench and of the compiled one (its eager points are a
    second measurement of the first's; the first's are kept)."""
    return points(results.get(f"{key}_compiled", {}), kind) | points(results[key], kind)


def offpolicy(algo: str, device: str, seconds: str, compile_mode: str) -> dict:
    """`marlctl bench` of one replay-based algorithm at 1,024 envs with the reproduction
    benchmark's ratio: 2 gradient steps of 256 per 32 env steps."""
    return marlctl(
        "bench", str(SPEC), f"algos={algo}", "~algo.epochs", "~algo.minibatches", "~algo.lr",
        "~model.activation", "algo.batch_size=256", "algo.updates=64", "algo.gamma=0.9",
        "--num-envs", "1024", "--seconds", seconds, f"hardware.device={device}",
        *(("hardware.compile=true", "hardware.tf32=true") if compile_mode == "tf32"
          else (f"hardware.compile={compile_mode}",)),
    )  # fmt: skip


def offline_dataset(device: str) -> dict:
    """A dataset of the spec's env, as a short MAPPO run's training writes it: the replay of
    its first 102,400 env steps or more (whole iterations of 1,024 envs)."""
    name = f"offline-{time.strftime('%Y%m%d-%H%M%S')}"
    summary = marlctl("run", str(SPEC), f"hardware.device={device}", "hardware.num_envs=1024",
                      "algo.epochs=1", "algo.minibatches=1", "train.total_env_steps=102400",
                      "train.eval_every=0", "train.checkpoint_every=0",
                      f"train.record={name}")  # fmt: skip
    if "error" in summary:
        return summary
    data = str(WORKDIR / name / "seed-0")
    described = marlctl("data", "describe", data)
    if "error" in described:
        return described
    return {"data": data, "transitions": described.get("transitions"), **described}


def offline(algo: str, device: str, seconds: str, data: str) -> dict:
    """`marlctl bench` of an offline algorithm on `data`: 64 gradient steps of 256 per
    iteration, as section 3's replay-based rows."""
    return marlctl(
        "bench", str(SPEC), f"algos={algo}", f"+data={data}", "~algo.epochs",
        "~algo.minibatches", "~algo.lr", "~train.total_env_steps", "+train.total_updates=100000",
        "train.eval_every=50000", "train.checkpoint_every=0", "algo.batch_size=256",
        "algo.updates=64", "--seconds", seconds, f"hardware.device={device}",
    )  # fmt: skip


def startup(device: str, runs: int = 3) -> dict:
    """A tiny run, `runs` times in a fresh folder each (the first also creates the MLflow
    store): wall-clock seconds and seconds from the command to the first env step."""
    import shutil
    import tempfile

    from mlflow.tracking import MlflowClient

    args = ["run", str(SPEC), f"hardware.device={device}", "train.total_env_steps=4096",
            "train.eval_every=0", "train.checkpoint_every=0"]  # fmt: skip
    if device.startswith("cuda"):
        args.append("hardware.num_envs=4096")
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="marlctl-startup-"))
    try:
        for index in range(runs):
            try:
                summary, wall = marlctl_json(args, folder, "the start-up run")
            except SystemExit as failure:
                return {"error": str(failure)[-2000:]}
            run_id = summary["runs"][0]["run_id"]
            client = MlflowClient(summary["tracking_uri"])
            history = client.get_metric_history(run_id, "perf/startup_s")
            first = history[0].value if history else None
            rows.append({"fresh_store": index == 0, "wall_s": wall, "first_step_s": first})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "command": "marlctl " + " ".join(args).replace(str(ROOT) + "/", ""),
        "runs": rows,
        "pycache_prefix": os.environ.get("PYTHONPYCACHEPREFIX"),
    }


def first_eval_under(limit: float = -15.0, extra: tuple[str, ...] = ()) -> dict:
    from mlflow.tracking import MlflowClient

    start = time.time()
    summary = marlctl("run", str(SPEC), "hardware.device=cuda", "hardware.num_envs=4096", *extra)
    if "error" in summary:
        return summary
    run_id = summary["runs"][0]["run_id"]
    client = MlflowClient(summary["tracking_uri"])
    history = sorted(client.get_metric_history(run_id, "eval/return_mean"), key=lambda m: m.step)
    tags = client.get_run(run_id).data.tags
    first = next((m for m in history if m.value >= limit), None)
    return {
        "run_id": run_id,
        "compile": tags.get("marlctl.compile"),
        "evals": [
            (m.step, round(m.value, 2), round(m.timestamp / 1000 - start, 1)) for m in history
        ],
        "first": None if first is None else (first.step, first.timestamp / 1000 - start),
        "wall_s": time.time() - start,
    }


def rate(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1e3:
        return f"{value:,.0f}"
    return f"{value / 1e6:,.2f}M" if value >= 1e6 else f"{value / 1e3:,.1f}k"


def ratio(ours: float | None, theirs: float | None) -> str:
    return "—" if not ours or not theirs else f"{ours / theirs:.2f}"


GRAPH, COMPILED = "CUDA graph", "CUDA graph, torch.compile"


def compare(ours: dict, theirs: list[dict], sizes, tf32: dict | None = None) -> list[list[str]]:
    """Rows of eager, graph and graph + compile beside JaxMARL; with `tf32` (the points of the
    same bench in TF32), its graph + compile too."""
    peer = {r["num_envs"]: r for r in theirs if "env_steps_per_s" in r}
    rows = []
    for n in sizes:
        eager, graph, both = (ours.get((n, mode), {}) for mode in ("eager", GRAPH, COMPILED))
        modes = [eager, graph, both]
        jax = peer.get(n, {}).get("env_steps_per_s")
        row = [
            f"{n:,}",
            rate(eager.get("env_steps_per_s")),
            rate(graph.get("env_steps_per_s")),
            f"{graph['compile_s']:.1f}" if graph else "—",
            rate(both.get("env_steps_per_s")),
            f"{both['compile_s']:.1f}" if both else "—",
        ]
        if tf32 is not None:
            fast = tf32.get((n, COMPILED), {})
            row.append(rate(fast.get("env_steps_per_s")))
            modes.append(fast)
        row += [
            rate(jax),
            f"{peer[n]['compile_s']:.1f}" if n in peer else "—",
            " / ".join(ratio(p.get("env_steps_per_s"), jax) for p in modes),
        ]
        rows.append(row)
    return rows


HEADER = [
    "num_envs", "marlctl eager", "CUDA graph", "its capture s", "CUDA graph + torch.compile",
    "its compile s", "JaxMARL", "JaxMARL compile s", "× JaxMARL (eager / graph / + compile)",
]  # fmt: skip
TF32_HEADER = [
    *HEADER[:6], "graph + compile, TF32", *HEADER[6:8],
    "× JaxMARL (eager / graph / + compile / + TF32)",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sections",
        nargs="+",
        default=["env", "ippo", "offpolicy", "offline", "startup", "first_eval"],
    )
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--seconds", default="3")
    parser.add_argument("--offpolicy-algos", nargs="+", default=list(OFF_POLICY))
    parser.add_argument(
        "--ippo-modes",
        nargs="+",
        default=["ippo", "ippo_compiled", "ippo_tf32"],
        choices=["ippo", "ippo_compiled", "ippo_tf32"],
        help="ippo: eager and graph; ippo_compiled: + torch.compile; ippo_tf32: + TF32",
    )
    parser.add_argument(
        "--offpolicy-modes",
        nargs="+",
        default=["auto", "true"],
        choices=["auto", "true", "tf32"],
        help="tf32: compiled, in TF32 (hardware.tf32=true)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other sections of the last record in gpu.jsonl (same machine)",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        help="cpu: the replay-based and start-up sections on the CPU (their baseline)",
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="rewrite the table from the results file, each section from its latest record",
    )
    args = parser.parse_args()
    on_cpu = args.device == "cpu"
    out = OUT.with_name("cpu_offpolicy.md") if on_cpu else OUT
    jsonl = JSONL.with_name("cpu_offpolicy.jsonl") if on_cpu else JSONL
    if args.table:
        write_table(latest_sections(jsonl), tuple(args.sizes), out)
        print(out.read_text())
        return
    import torch

    if not on_cpu and not torch.cuda.is_available():
        sys.exit("bench/gpu.py needs a CUDA device")
    if on_cpu:
        args.sections = [s for s in args.sections if s in ("offpolicy", "offline", "startup")]
    WORKDIR.mkdir(parents=True, exist_ok=True)
    sizes = tuple(args.sizes)
    listed = ",".join(map(str, sizes))
    results: dict = {"machine": machine(args.device), "date": date.today().isoformat()}
    if args.merge and jsonl.exists():
        last = json.loads(jsonl.read_text().splitlines()[-1])
        if last["machine"] == results["machine"]:
            results = last | {"date": results["date"]}
    cuda = "hardware.device=cuda"
    timing = ("--num-envs", listed, "--seconds", args.seconds, cuda)
    compiled = "hardware.compile=true"
    if "env" in args.sections:
        results["env"] = marlctl("bench", str(SPEC), "--env-only", *timing)
        results["env_compiled"] = marlctl("bench", str(SPEC), "--env-only", *timing, compiled)
        results["env_jaxmarl"] = jaxmarl("env_only", sizes)
    if "ippo" in args.sections:
        modes = {
            "ippo": (),
            "ippo_compiled": (compiled,),
            "ippo_tf32": (compiled, "hardware.tf32=true"),
        }
        for key in args.ippo_modes:
            results[key] = marlctl("bench", str(SPEC), *JAXMARL_IPPO, *timing, *modes[key])
            results[key]["settings"] = list(JAXMARL_IPPO)
        results["ippo_jaxmarl"] = jaxmarl("ippo", sizes)
    if "startup" in args.sections:
        results["startup"] = startup(args.device)
    if "offpolicy" in args.sections:
        done = results.setdefault("offpolicy", {})
        # auto: eager and captured, every algorithm; then true: both again with compiled
        # gradient steps (on a CPU, compiled alone), which takes longer to start.
        for mode in args.offpolicy_modes:
            for algo in args.offpolicy_algos:
                done.setdefault(algo, {})[mode] = offpolicy(algo, args.device, args.seconds, mode)
                write_table(results, sizes, out)  # what is measured stays if the rest cannot finish
    if "offline" in args.sections:
        made = offline_dataset(args.device)
        results["offline"] = {"dataset": made}
        for algo in OFFLINE if "data" in made else ():
            results["offline"][algo] = offline(algo, args.device, args.seconds, made["data"])
            write_table(results, sizes, out)  # what is measured stays if the rest cannot finish
    if "first_eval" in args.sections:
        results["first_eval"] = first_eval_under()
    if "first_eval_tf32" in args.sections:
        results["first_eval_tf32"] = first_eval_under(extra=("hardware.tf32=true",))
    with jsonl.open("a") as sink:
        sink.write(json.dumps(results) + "\n")
    write_table(latest_sections(jsonl), sizes, out)  # with what this run did not measure
    print(out.read_text())


# The sections of a record, each with the keys that hold it.
SECTIONS = {
    "env": ("env", "env_compiled", "env_jaxmarl"),
    "ippo": ("ippo", "ippo_compiled", "ippo_tf32", "ippo_jaxmarl"),
    "offpolicy": ("offpolicy",),
    "offline": ("offline",),
    "startup": ("startup",),
    "first_eval": ("first_eval",),
    "first_eval_tf32": ("first_eval_tf32",),
}


def latest_sections(jsonl: Path) -> dict:
    """Each measurement from the latest record of `jsonl` that holds it (a section's keys one
    by one, the replay-based section per algorithm and mode), with where and when it was
    measured (`provenance`). Failed measurements are passed over."""
    merged: dict = {"provenance": {}}
    for line in jsonl.read_text().splitlines():
        record = json.loads(line)
        where = f"{record['date']} on {record['machine']}"
        found = False
        for section, keys in SECTIONS.items():
            for key in keys:
                value = record.get(key)
                if value is None or _failed(value):
                    continue
                if isinstance(value, list):  # JaxMARL's rows: the latest of each size
                    sizes = {row.get("num_envs") for row in value}
                    kept = [r for r in merged.get(key, []) if r.get("num_envs") not in sizes]
                    value = sorted(kept + value, key=lambda row: row.get("num_envs") or 0)
                if key != "offpolicy":
                    merged[key] = value
                    merged["provenance"][f"{section} {key}"] = where
                    found = True
                    continue
                for algo, modes in value.items():
                    if "points" in modes or "error" in modes:  # an earlier layout: one mode
                        continue
                    for mode, data in modes.items():
                        if "error" not in data:
                            merged.setdefault(key, {}).setdefault(algo, {})[mode] = data
                            merged["provenance"][f"{section} {algo} {mode}"] = where
                            found = True
        if found:
            merged["machine"], merged["date"] = record["machine"], record["date"]
    return merged


def _failed(section) -> bool:
    """Nothing measured: an error, or a dict or list of nothing but errors."""
    if isinstance(section, dict):
        values = [section] if "error" in section else list(section.values())
    elif isinstance(section, list):
        values = section
    else:
        return False
    return bool(values) and all(isinstance(v, dict) and "error" in v for v in values)


def write_table(results: dict, sizes: tuple[int, ...], out: Path) -> None:
    provenance = results.get("provenance", {})
    where = f"{results['date']} on {results['machine']}"

    def measured(section: str) -> list[str]:
        places: dict[str, list[str]] = {}
        for key, place in provenance.items():  # offpolicy: per algorithm and mode
            if key.startswith(f"{section} "):
                places.setdefault(place, []).append(key.split(" ", 1)[1])
        if len(places) > 1:
            parts = [f"{place} ({', '.join(sorted(keys))})" for place, keys in places.items()]
            return ["Measured " + "; ".join(parts) + ".", ""]
        return [f"Measured {provenance.get(section, next(iter(places), where))}.", ""]

    lines = [
        "# marlctl on the CPU: the baseline of the GPU table"
        if results["machine"].endswith("no GPU used")
        else "# marlctl on one GPU, beside JaxMARL",
        "",
        "Written by `python bench/gpu.py` (`--table` rewrites it from the results file, each "
        "section from its latest measurement). Env steps per second (one env step = every "
        "agent acts once), after warm-up; 'capture s' is the one-off time to capture the CUDA "
        "graph, JaxMARL's compile time is its `jit` compilation, both outside the throughput. "
        f"Raw numbers: `bench/results/{out.with_suffix('.jsonl').name}`.",
        "",
    ]
    if "env" in results:
        lines += [
            "## Env only: simple_spread (N=3), random actions drawn on the device",
            "",
            *measured("env"),
            *table(compare(merged(results, "env", "env"), results["env_jaxmarl"], sizes), HEADER),
            "",
        ]
    if "ippo" in results:
        tf32 = points(results["ippo_tf32"], "train") if "ippo_tf32" in results else None
        lines += [
            "## IPPO with JaxMARL's hyperparameters (its `ippo_ff_mpe.py`)",
            "",
            *measured("ippo"),
            f"marlctl: {_ippo_settings(results)}. JaxMARL: `bench/gpu_jaxmarl.py --work ippo`, "
            "10 updates per timed call."
            + (
                " JAX multiplies float32 matrices in TF32 on this GPU by default (its default "
                "matmul precision); marlctl in full float32 unless `hardware.tf32=true` (the "
                "TF32 column)."
                if tf32 is not None
                else ""
            ),
            "",
            *table(
                compare(merged(results, "ippo", "train"), results["ippo_jaxmarl"], sizes, tf32),
                HEADER if tf32 is None else TF32_HEADER,
            ),
            "",
        ]
    if "offpolicy" in results:
        cpu = _cpu_baseline() if not results["machine"].endswith("no GPU used") else {}
        any_tf32 = any("tf32" in modes for modes in results["offpolicy"].values())
        rows = []
        for algo, modes in results["offpolicy"].items():
            auto = points(modes.get("auto", {}), "train")
            compiled = points(modes.get("true", {}), "train")
            fast = points(modes.get("tf32", {}), "train")
            cells = [
                auto.get((1024, "eager"), {}),
                auto.get((1024, "CUDA graph"), {}),
                compiled.get((1024, "torch.compile"), {}),
                compiled.get((1024, "CUDA graph, torch.compile"), {}),
                fast.get((1024, "CUDA graph, torch.compile"), {}),
            ]
            errors = [m["error"] for m in modes.values() if "error" in m]
            failed = [
                p["mode"]
                for p in (*auto.values(), *compiled.values(), *fast.values())
                if "failed" in p["mode"]
            ]
            best = max((c.get("env_steps_per_s", 0) for c in cells), default=0)
            row = [algo, *(rate(c.get("env_steps_per_s")) for c in cells[: 5 if any_tf32 else 4])]
            row += [
                f"{cells[1]['compile_s']:.1f}" if cells[1] else "—",
                f"{cells[2]['fill_s']:.1f}" if cells[2].get("fill_s") else "—",
            ]
            if cpu:
                row += [rate(cpu.get(algo)), ratio(best, cpu.get(algo))]
            rows.append(row + ["; ".join(e[-200:] for e in errors + failed)])
        header = ["algorithm", "eager", "CUDA graph", "compiled", "CUDA graph + compiled",
                  *(["same, TF32"] if any_tf32 else []), "capture s", "compile s"]  # fmt: skip
        if cpu:
            header += ["2 CPU cores", "best / CPU"]
        lines += [
            "## Replay-based algorithms, 1,024 envs, 64 gradient steps of 256 per iteration",
            "",
            *measured("offpolicy"),
            "The reproduction benchmark's update-to-data ratio (2 gradient steps per 32 env "
            "steps), one seed, native simple_spread: `python bench/gpu.py --sections "
            "offpolicy` (`marlctl bench ... algos=ALGO algo.batch_size=256 algo.updates=64 "
            "--num-envs 1024` with `hardware.compile` auto, then true). Timed after the "
            "buffer holds `learning_starts` transitions and the iteration is captured. "
            "'compiled': the gradient steps' losses as compiled regions "
            "(`marlctl.train.regions`); "
            + (
                "'same, TF32': with `hardware.tf32=true` too (`--offpolicy-modes ... tf32`); "
                if any_tf32
                else ""
            )
            + "'compile s': the iterations before timing with them, compiling included; "
            "'—': not measured."
            + (
                " '2 CPU cores': the same command on the CPU (`bench/results/"
                "cpu_offpolicy.md`), its best mode."
                if cpu
                else ""
            ),
            "",
            *table(rows, [*header, "note"]),
            "",
        ]
    if "offline" in results:
        lines += _offline_lines(results, measured("offline"))
    if "startup" in results:
        data = results["startup"]
        if "error" in data:
            text = [f"failed: {data['error'][-300:]}"]
        else:
            text = [
                f"`{data['command']}`, three times in a new folder (the first creates its "
                "MLflow store)"
                + (
                    ", Python's bytecode compiled ahead into `PYTHONPYCACHEPREFIX` (the "
                    "installed packages' folders are read-only on this machine)"
                    if data.get("pycache_prefix")
                    else ""
                )
                + ":",
                "",
                *table(
                    [
                        [
                            "yes" if r["fresh_store"] else "no",
                            f"{r['wall_s']:.1f}",
                            "—" if r["first_step_s"] is None else f"{r['first_step_s']:.1f}",
                        ]
                        for r in data["runs"]
                    ],
                    ["new store", "wall s", "command to first env step s"],
                ),
            ]
        lines += ["## Start-up", "", *measured("startup"), *text, ""]
    if "first_eval" in results:
        lines += ["## Time to a good policy", "", *measured("first_eval")]
        lines += [
            "`marlctl run specs/spread_mappo_native.yaml hardware.device=cuda "
            f"hardware.num_envs=4096`: first evaluation at -15 or better "
            f"{_first_eval(results['first_eval'])}.",
            "",
        ]
        if "first_eval_tf32" in results:
            lines += [
                *measured("first_eval_tf32"),
                f"The same with `hardware.tf32=true`: {_first_eval(results['first_eval_tf32'])}.",
                "",
            ]
    out.write_text("\n".join(lines))


def _offline_lines(results: dict, measured: list[str]) -> list[str]:
    """The offline section: each algorithm's gradient steps per second, eager and captured,
    and the captured ones against its online learner's in section 3."""
    section = results["offline"]
    if "error" in section.get("dataset", {}):
        return ["## Offline algorithms", "", *measured,
                f"failed: {section['dataset']['error'][-300:]}", ""]  # fmt: skip
    online = {}
    for algo, modes in results.get("offpolicy", {}).items():
        point = points(modes.get("auto", {}), "train").get((1024, GRAPH))
        if point:
            online[algo] = point["env_steps_per_s"] * UPDATES_PER_ENV_STEP
    rows = []
    for algo, learner in OFFLINE.items():
        data = section.get(algo)
        if data is None:
            continue
        if "error" in data:
            rows.append([algo, "—", "—", "—", learner or "—", "—", "—", data["error"][-200:]])
            continue
        by_mode = {p["mode"]: p for p in data.get("points", [])}
        eager, graph = by_mode.get("eager", {}), by_mode.get(GRAPH, {})
        theirs = online.get(learner) if learner else None
        failed = [m for m in by_mode if "failed" in m]
        rows.append([
            algo, rate(eager.get("env_steps_per_s")), rate(graph.get("env_steps_per_s")),
            f"{graph['compile_s']:.1f}" if graph else "—", learner or "—", rate(theirs),
            ratio(graph.get("env_steps_per_s"), theirs), "; ".join(failed),
        ])  # fmt: skip
    header = ["algorithm", "eager", "CUDA graph", "capture s", "online learner",
              "its captured gradient steps/s", "captured / online", "note"]  # fmt: skip
    return [
        "## Offline algorithms: gradient steps per second",
        "",
        *measured,
        "`python bench/gpu.py --sections offline`: a dataset of native simple_spread "
        f"({section['dataset'].get('transitions') or 0:,} transitions, the replay of a short "
        "MAPPO run of the spec, `train.record`), then `marlctl bench ... algos=ALGO "
        "+data=DATASET algo.batch_size=256 algo.updates=64` with `hardware.compile` auto, one "
        "seed. Gradient steps per second, each of a batch of 256; the online learner's: its "
        "captured row of the replay-based section times 64 gradient steps per 1,024 env "
        "steps (its iterations also step the envs and store their transitions).",
        "",
        *table(rows, header),
        "",
    ]


def _ippo_settings(results: dict) -> str:
    """The `marlctl bench` command of the IPPO columns, each group of columns with its own
    where their records ran with different settings."""
    by: dict[tuple[str, ...], list[str]] = {}
    for key in ("ippo", "ippo_compiled", "ippo_tf32"):
        if key in results:
            by.setdefault(tuple(results[key].get("settings", EARLIER_IPPO)), []).append(key)
    commands = {s: f"`marlctl bench specs/spread_mappo_native.yaml {' '.join(s)}`" for s in by}
    if len(by) == 1:
        return next(iter(commands.values()))
    return "; ".join(f"{commands[s]} ({', '.join(keys)})" for s, keys in by.items())


def _first_eval(first: dict) -> str:
    if "error" in first:
        return f"failed: {first['error'][-300:]}"
    if first["first"] is None:
        return f"no evaluation reached -15 (evaluations: {first['evals']})"
    step, seconds = first["first"]
    return (
        f"{seconds:.1f} s after the command started, at {step:,} env steps "
        f"(iterations: {first['compile']}; step, return, seconds: {first['evals']})"
    )


def _cpu_baseline() -> dict[str, float]:
    """Each algorithm's fastest training on the CPU, from the CPU table's latest record."""
    jsonl = JSONL.with_name("cpu_offpolicy.jsonl")
    if not jsonl.exists():
        return {}
    found = {}
    for algo, modes in latest_sections(jsonl).get("offpolicy", {}).items():
        rates = [
            p["env_steps_per_s"]
            for m in modes.values()
            if isinstance(m, dict)
            for p in m.get("points", [])
            if p["kind"] == "train"
        ]
        if rates:
            found[algo] = max(rates)
    return found


if __name__ == "__main__":
    main()
