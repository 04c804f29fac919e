"""`hardware.threads_per_run`: auto takes the cores this process may use (affinity, cgroup
quota) less those other processes keep busy, shares them between the runs at once, follows
them while it trains, and is recorded as the number used. The readings are faked: nothing
here depends on how busy the machine is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from marlctl import cores
from marlctl.cli import app
from marlctl.cores import CoreWatch, Limits, Reading, Sample

REPO_ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

# Gradient steps big enough for `auto` to want every core: 10 steps × 400 envs per
# minibatch × 2 agents.
BIG = {
    "env": {"id": "mpe/simple_spread", "backend": "native", "params": {"N": 2, "max_cycles": 10}},
    "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 1, "minibatches": 1},
    "train": {"total_env_steps": 8000, "eval_every": 0, "eval_episodes": 2},
    "hardware": {"num_envs": 400, "threads_per_run": "auto"},
}


def write_spec(folder: Path, body: dict, **hardware) -> Path:
    body = {**body, "hardware": {**body["hardware"], **hardware}}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def fake_machine(monkeypatch, cpus: int, busy: float, quota: float | None = None) -> None:
    """This process may use `cpus` CPUs (and a `quota`), other processes keep `busy` cores
    busy."""
    found = Limits(tuple(range(cpus)), quota)
    free = max(0, found.usable - cores.busy_count(busy))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cores, "limits", lambda root=None: found)
    monkeypatch.setattr(cores, "free_cores", lambda: Reading(found.usable, busy, free, "faked"))


def dry_run(spec: Path, *overrides: str) -> dict:
    result = runner.invoke(app, ["run", str(spec), *overrides, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["plan"]


# ---------------------------------------------------------------- readings


def cgroup_tree(root: Path, cgroup: str, files: dict[str, str]) -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    for name, text in files.items():
        path = root / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_cgroup_v2_quota_is_the_tightest_on_the_path(tmp_path: Path) -> None:
    root = cgroup_tree(
        tmp_path / "a",
        "0::/batch/job\n",
        {"batch/cpu.max": "300000 100000\n", "batch/job/cpu.max": "150000 100000\n"},
    )
    quota, where = cores.cpu_quota(root)
    assert quota == 1.5 and where == root / "sys/fs/cgroup/batch/job"
    assert Limits((0, 1, 2, 3), quota).usable == 1  # 1.5 cores: one thread is never throttled
    root = cgroup_tree(
        tmp_path / "b",
        "0::/batch/job\n",
        {"batch/cpu.max": "200000 100000\n", "batch/job/cpu.max": "max 100000\n"},
    )
    assert cores.cpu_quota(root) == (2.0, root / "sys/fs/cgroup/batch")
    root = cgroup_tree(tmp_path / "c", "0::/\n", {"cpu.max": "max 100000\n"})
    assert cores.cpu_quota(root) == (None, None)
    assert Limits((0, 1, 2, 3), None).usable == 4


def test_cgroup_v1_quota_in_a_container(tmp_path: Path) -> None:
    # A container sees its own cgroup as the mount's root; the host's path is not there.
    root = cgroup_tree(
        tmp_path,
        "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
        {"cpu,cpuacct/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
    )
    assert cores.cpu_quota(root) == (2.0, root / "sys/fs/cgroup/cpu,cpuacct")
    (root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us").write_text("-1\n")
    assert cores.cpu_quota(root) == (None, None)
    assert Limits(tuple(range(8)), 2.0).usable == 2


def test_proc_stat_counts_the_cpus_of_the_affinity_mask(tmp_path: Path) -> None:
    stat = tmp_path / "proc/stat"
    stat.parent.mkdir(parents=True)
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(
        "cpu  900 0 0 900 0 0 0 0 0 0\n"
        "cpu0 100 0 50 300 40 5 5 10 99 0\n"
        "cpu1 200 0 0 300 0 0 0 0 0 0\n"
        "cpu2 600 0 0 300 0 0 0 0 0 0\n"
        "intr 12345\n"
    )
    tick = cores._TICK
    assert cores._cpu_busy((0, 1), tmp_path) == pytest.approx((170 + 200) / tick)
    assert cores._cpu_busy((3,), tmp_path) is None


def test_busy_cores_are_the_others_use_less_this_process_own() -> None:
    found = Limits((0, 1))

    def reading(busy: float, own: float) -> Reading | None:
        after = Sample(2.0, 10.0 + busy * 2, None, 5.0 + own * 2)
        return cores.between(found, Sample(0.0, 10.0, None, 5.0), after)

    # This process alone on both cores: all free.
    assert reading(busy=2.0, own=2.0).free == 2
    # A busy loop beside it: one core taken, whatever this process spins.
    assert reading(busy=2.0, own=1.0).free == 1
    assert reading(busy=1.0, own=0.0).free == 1
    # An editor or a shell is not a busy core; two busy processes leave none.
    assert reading(busy=0.3, own=0.0).free == 2
    assert reading(busy=2.0, own=0.0).free == 0
    assert cores.between(found, Sample(0.0, None, None, 0.0), Sample(1.0, None, None, 0.0)) is None


def test_the_quota_cgroup_use_by_other_processes_takes_its_cores() -> None:
    # 8 CPUs of a host, a quota of 2 cores; another process of the same container uses 1.
    found = Limits(tuple(range(8)), 2.0, Path("/"))
    reading = cores.between(found, Sample(0.0, 0.0, 0.0, 0.0), Sample(1.0, 1.0, 1.0, 0.0))
    assert (reading.usable, reading.free) == (2, 1)


def test_the_load_average_stands_in_where_proc_stat_is_unreadable(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 3.0, 3.0))
    monkeypatch.setattr(cores, "limits", lambda root=None: Limits((0, 1, 2, 3)))
    reading = cores.measure(0.0, tmp_path)  # no proc/stat there
    assert (reading.free, reading.source) == (3, "1-minute load average")


# ---------------------------------------------------------------- plans


def test_auto_takes_the_free_cores_and_shares_them_between_the_runs(tmp_path, monkeypatch):
    spec = write_spec(tmp_path, BIG)
    fake_machine(monkeypatch, cpus=4, busy=1.0)
    plan = dry_run(spec)
    assert [(r["threads"], r["max_threads"]) for r in plan["runs"]] == [(3, 4)]
    assert plan["threads_note"].startswith("auto: 3, 3 of 4 cores free")
    # Two runs at once share the 3 free cores: one thread each, and neither follows the
    # free cores while it trains (each would count the other's threads as another's).
    plan = dry_run(spec, "seeds=[0,1]", "hardware.parallel_runs=2")
    assert [(r["threads"], r["max_threads"]) for r in plan["runs"]] == [(1, 0), (1, 0)]
    # A cgroup quota of 2 cores on 8 CPUs.
    fake_machine(monkeypatch, cpus=8, busy=0.0, quota=2.0)
    plan = dry_run(spec)
    assert (plan["cores"], plan["runs"][0]["threads"]) == (2, 2)


def test_auto_never_takes_more_threads_than_cores_are_free(tmp_path, monkeypatch):
    from marlctl.plan import compile_plan, resolve_threads
    from marlctl.spec import load_spec

    fake_machine(monkeypatch, cpus=2, busy=0.0)
    loaded = load_spec(str(write_spec(tmp_path, BIG)))
    info = compile_plan(loaded).env
    for cpus in (1, 2, 3, 4, 8, 16):
        for busy in (0.0, 0.5, 1.0, 2.0, 3.0, 7.5, 20.0):
            fake_machine(monkeypatch, cpus=cpus, busy=busy)
            free = max(0, cpus - cores.busy_count(busy))
            for concurrent in (1, 2, 3, 5):
                threads, most, _, _ = resolve_threads(loaded.spec, info, cpus, concurrent)
                case = (cpus, busy, concurrent, threads)
                assert threads >= 1, case
                assert threads * concurrent <= max(free, concurrent), case
                assert threads <= most or most == 0, case


def test_dry_run_prints_the_threads_auto_chose(tmp_path, monkeypatch):
    spec = write_spec(tmp_path, BIG)
    fake_machine(monkeypatch, cpus=2, busy=1.0)
    result = runner.invoke(app, ["run", str(spec), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert (
        "threads: auto: 1, 1 of 2 cores free (other processes use 1.0, faked); 1 run at "
        "once; follows the free cores from 1 to 2 while it trains"
    ) in " ".join(result.output.split())
    row = next(line for line in result.output.splitlines() if "cpu" in line)
    assert [cell.strip() for cell in row.split("│")][4] == "1"  # the threads column


def test_a_fixed_number_beside_busy_cores_waits_passively(tmp_path, monkeypatch):
    spec = write_spec(tmp_path, BIG, threads_per_run=2)
    fake_machine(monkeypatch, cpus=2, busy=1.0)
    for var in cores.WAIT_VARS:
        monkeypatch.delenv(var, raising=False)
    plan = dry_run(spec)
    assert plan["passive_wait"] is True and plan["runs"][0]["threads"] == 2
    assert "OMP_WAIT_POLICY=PASSIVE" in plan["threads_note"]
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")  # the user's choice stands
    plan = dry_run(spec)
    assert plan["passive_wait"] is False and "GOMP_SPINCOUNT=10000" in plan["threads_note"]
    fake_machine(monkeypatch, cpus=2, busy=0.0)
    assert dry_run(spec)["passive_wait"] is False


def test_passive_wait_leaves_the_users_setting(monkeypatch):
    for var in cores.WAIT_VARS:
        monkeypatch.delenv(var, raising=False)
    with cores.passive_wait():
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    with cores.passive_wait():
        assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


# ---------------------------------------------------------------- while it trains


def test_core_watch_gives_cores_back_at_once_and_takes_them_after_two_samples() -> None:
    found = Limits((0, 1))
    # (seconds, cores busy on the CPUs, this process's own use) per sample window.
    windows = iter([(1.0, 2.0, 2.0), (2.0, 2.0, 1.0), (2.0, 1.0, 1.0), (2.0, 1.0, 1.0)])
    state = {"wall": 0.0, "busy": 0.0, "own": 0.0}

    def read(_found: Limits) -> Sample:
        return Sample(state["wall"], state["busy"], None, state["own"])

    def advance() -> None:
        span, busy, own = next(windows)
        state["wall"] += span
        state["busy"] += busy * span
        state["own"] += own * span

    watch = CoreWatch(2, 2, every=2.0, found=found, read=read, clock=lambda: state["wall"])
    advance()
    assert watch.poll() is None  # 1 s: not due
    state["wall"] += 1.0
    state["busy"] += 2.0
    state["own"] += 2.0
    assert watch.poll() is None  # alone: keeps 2
    advance()
    assert watch.poll() == 1  # another process took a core
    advance()
    assert watch.poll() is None  # free again, once
    advance()
    assert watch.poll() == 2  # free twice in a row


# ---------------------------------------------------------------- runs


def test_mlflow_records_the_threads_used(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    spec = write_spec(tmp_path, BIG)
    fake_machine(monkeypatch, cpus=2, busy=1.0)
    monkeypatch.setattr(CoreWatch, "poll", lambda self: None)
    result = runner.invoke(app, ["run", str(spec), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    client = MlflowClient(summary["tracking_uri"])
    for run_id in (summary["parent_run_id"], summary["runs"][0]["run_id"]):
        run = client.get_run(run_id)
        assert run.data.params["hardware.threads_per_run"] == "1"
        assert run.data.tags["marlctl.threads"].startswith("auto: 1, 1 of 2 cores free")
    history = client.get_metric_history(summary["runs"][0]["run_id"], "perf/threads")
    assert history and {m.value for m in history} == {1.0}
    spec = write_spec(tmp_path, BIG, threads_per_run=1)
    summary = json.loads(runner.invoke(app, ["run", str(spec), "--json"]).stdout)
    run = client.get_run(summary["runs"][0]["run_id"])
    assert run.data.params["hardware.threads_per_run"] == "1"
    assert "marlctl.threads" not in run.data.tags


def test_openmp_waits_passively_from_the_start_of_every_run_process(tmp_path):
    """libgomp prints the settings it started with (OMP_DISPLAY_ENV): the CLI process and
    the spawned run processes start with GOMP_SPINCOUNT 0 where the spec's threads outnumber
    the free cores, as OMP_WAIT_POLICY=PASSIVE set before torch loads makes it."""
    spec = write_spec(tmp_path, BIG, threads_per_run=2, parallel_runs=2)
    script = (
        "import sys\n"
        "from marlctl import cores\n"
        "cores.limits = lambda root=None: cores.Limits((0, 1, 2, 3))\n"
        "cores.free_cores = lambda: cores.Reading(4, 3.0, 1, 'faked')\n"
        "from marlctl.cli import main\n"
        f"sys.argv = ['marlctl', 'run', {str(spec)!r}, 'seeds=[0,1]', "
        "'train.total_env_steps=4000', '--json']\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (*cores.WAIT_VARS, "OMP_NUM_THREADS")}
    env |= {"OMP_DISPLAY_ENV": "VERBOSE", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if "OPENMP DISPLAY ENVIRONMENT" not in done.stderr + done.stdout:
        pytest.skip("torch's OpenMP runtime does not print its settings")
    printed = (done.stderr + done.stdout).count
    # The CLI process loads torch, and so does each of the 2 run processes.
    assert printed("GOMP_SPINCOUNT = '0'") == 3, done.stderr[-3000:]
    assert printed("GOMP_SPINCOUNT = '300000'") == 0
