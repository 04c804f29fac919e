"""Training through the CLI on real PettingZoo envs: learning, heterogeneity, failure, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import foreground_job
from typer.testing import CliRunner

from marlctl.cli import app

runner = CliRunner()
TESTS = Path(__file__).resolve().parent


def write_spec(folder: Path, body: dict, name: str = "spec.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def run_cli(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def run_json(*args: str) -> dict:
    result = run_cli(*args, "--json")
    start = result.stdout.index("{")
    return json.loads(result.stdout[start:]) | {"exit_code": result.exit_code}


def client():
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{Path.cwd() / 'mlflow.db'}")


def history(run_id: str, key: str) -> list[tuple[int, float]]:
    return [
        (m.step, m.value)
        for m in sorted(client().get_metric_history(run_id, key), key=lambda m: m.step)
    ]


def store_has_runs(store: Path) -> bool:
    """Whether another process has created the MLflow store and a run in it.

    Read with plain sqlite: an MlflowClient opened while the other process is still creating
    the schema would run the migrations a second time, concurrently.
    """
    import sqlite3

    if not store.exists():
        return False
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5) as db:
            return db.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def random_policy_return(params: dict, episodes: int = 300) -> float:
    """Per-agent episode return of uniform random actions on the real PettingZoo env."""
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(**params)
    totals = []
    for episode in range(episodes):
        env.reset(seed=10_000 + episode)
        total = 0.0
        while env.agents:
            _, rewards, _, _, _ = env.step({a: env.action_space(a).sample() for a in env.agents})
            total += sum(rewards.values()) / len(rewards)
        totals.append(total)
    return float(np.mean(totals))


SPREAD = {"N": 2, "max_cycles": 10}


def relay_random_return(episodes: int = 300) -> float:
    """Per-agent return of uniform random (mask-respecting) actions on MaskedRelay."""
    import toy_envs

    env = toy_envs.MaskedRelay()
    rng = np.random.default_rng(0)
    totals = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        total = 0.0
        while env.agents:
            actions = {
                a: rng.choice(np.flatnonzero(obs[a]["action_mask"])) for a in ("scout_0", "scout_1")
            }
            actions["carrier_0"] = rng.uniform(-1, 1, 2).astype(np.float32)
            obs, rewards, _, _, _ = env.step(actions)
            total += sum(rewards.values()) / len(rewards)
        totals.append(total)
    return float(np.mean(totals))


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_policy_improves_on_heterogeneous_relay(algo, tmp_path, monkeypatch):
    """Discrete masked scouts and a continuous carrier: both groups must learn."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(TESTS))
    spec = write_spec(
        tmp_path,
        {
            "seeds": [0],
            "env": {"id": "toy_envs:masked_relay", "params": {"max_cycles": 8}},
            "algo": {"name": algo, "rollout_steps": 8, "epochs": 4, "lr": 3e-3},
            "train": {"total_env_steps": 6_144, "eval_every": 0, "eval_episodes": 64},
            "hardware": {"num_envs": 16},
        },
    )
    out = run_json("run", str(spec))
    assert out["exit_code"] == 0, out
    baseline = relay_random_return()  # about -1.8; the best policy scores about +5
    metrics = client().get_run(out["runs"][0]["run_id"]).data.metrics
    assert out["runs"][0]["final_return"] > baseline + 2.5, (out["runs"][0], baseline)
    assert metrics["eval/return/scout"] > 4.0  # most targets matched (random: about 2.7)
    assert metrics["eval/return/carrier"] > -8.0  # pushes toward its goal (random: about -10.7)


@pytest.mark.slow
def test_mappo_improves_on_small_spread(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(
        tmp_path,
        {
            "seeds": [0],
            "env": {"id": "mpe/simple_spread", "params": SPREAD},
            "algo": {
                "name": "mappo",
                "rollout_steps": 10,
                "epochs": 10,
                "lr": 2e-3,
                "minibatches": 2,
            },
            "train": {
                "total_env_steps": 40_000,
                "eval_every": 20_000,
                "eval_episodes": 128,
                "checkpoint_every": 0,
            },
            "hardware": {"num_envs": 32},
        },
    )
    out = run_json("run", str(spec))
    assert out["exit_code"] == 0, out
    run = out["runs"][0]
    baseline = random_policy_return(SPREAD)  # about -7.8 per agent
    # Episode returns spread with a std of about 2.9, so 0.6 is over two standard errors of
    # a 128-episode mean; with 10 steps per episode even a good policy stays near -6.
    assert run["final_return"] > baseline + 0.6, (run["final_return"], baseline)
    evals = history(run["run_id"], "eval/return_mean")
    # The untrained policy at step 0, then every eval_every, the final one at the end.
    steps = [step for step, _ in evals]  # evaluations land on whole iterations
    assert steps[0] == 0 and steps[-1] == 40_000 and len(steps) == 3
    assert evals[-1][1] > evals[0][1]


def test_heterogeneous_groups_and_masks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(TESTS))
    import toy_envs

    toy_envs.MaskedRelay.violations = 0
    spec = write_spec(
        tmp_path,
        {
            "env": {"id": "toy_envs:masked_relay", "params": {"max_cycles": 8}},
            "algo": {"name": "mappo", "rollout_steps": 8, "epochs": 2},
            "train": {"total_env_steps": 1_024, "eval_every": 0, "eval_episodes": 8},
            "hardware": {"num_envs": 8},
        },
    )
    plan = run_json("run", str(spec), "--dry-run")["plan"]
    groups = {g["name"]: g for g in plan["env"]["groups"]}
    assert groups["scout"]["agents"] == ["scout_0", "scout_1"] and groups["scout"]["action_mask"]
    assert groups["carrier"]["actions"] == "continuous" and groups["carrier"]["n_actions"] == 2
    out = run_json("run", str(spec))
    assert out["exit_code"] == 0, out
    assert out["runs"][0]["env_steps"] >= 1_024
    assert "eval/return/scout" in client().get_run(out["runs"][0]["run_id"]).data.metrics
    assert toy_envs.MaskedRelay.violations == 0  # masked actions are never taken


def test_agents_that_leave_early_are_inactive_until_the_episode_ends(monkeypatch):
    import torch

    from marlctl.envs.pettingzoo import PettingZooEnv
    from marlctl.envs.probe import probe

    monkeypatch.syspath_prepend(str(TESTS))
    params = {"max_cycles": 6, "leave_at": 2}
    info = probe("toy_envs:masked_relay", params)
    env = PettingZooEnv("toy_envs:masked_relay", params, info, 3, torch.device("cpu"))
    ob = env.reset(0)
    active = []
    for step in range(6):
        actions = {"scout": torch.zeros(3, 2, dtype=torch.long), "carrier": torch.zeros(3, 1, 2)}
        actions["scout"][:] = ob.masks["scout"].float().argmax(-1)
        tr = env.step(actions)
        active.append(tr.next.active["scout"][:, 1].tolist())
        if 2 <= step <= 4:  # after its last observation, a departed agent is blank
            assert (tr.next.obs["scout"][:, 1] == 0).all()
        ob = tr.next
    # scout_1 acts for two steps, sits out the rest, and is back after the auto-reset.
    assert active == [[True] * 3, [False] * 3, [False] * 3, [False] * 3, [False] * 3, [True] * 3]
    env.close()


def test_training_with_agents_leaving_early(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(TESTS))
    spec = write_spec(
        tmp_path,
        {
            "env": {"id": "toy_envs:masked_relay", "params": {"max_cycles": 8, "leave_at": 3}},
            "algo": {"name": "mappo", "rollout_steps": 8, "epochs": 2},
            "train": {"total_env_steps": 512, "eval_every": 0, "eval_episodes": 4},
            "hardware": {"num_envs": 4},
        },
    )
    out = run_json("run", str(spec))
    assert out["exit_code"] == 0, out


@pytest.mark.parametrize("env_id", ["mpe/simple_speaker_listener", "mpe/simple_adversary"])
def test_mpe_envs_with_distinct_groups_train(env_id, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(
        tmp_path,
        {
            "env": {"id": env_id, "params": {"max_cycles": 10}},
            "algo": {"name": "ippo", "rollout_steps": 10, "epochs": 1},
            "model": {"sharing": "independent"},
            "train": {"total_env_steps": 400, "eval_every": 0, "eval_episodes": 4},
            "hardware": {"num_envs": 4, "env_workers": 2},
        },
    )
    out = run_json("run", str(spec))
    assert out["exit_code"] == 0, out
    metrics = client().get_run(out["runs"][0]["run_id"]).data.metrics
    assert len([k for k in metrics if k.startswith("eval/return/")]) == 2


def test_failing_run_is_recorded_failed_and_other_seeds_finish(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(TESTS))
    spec = write_spec(
        tmp_path,
        {
            "seeds": [0],
            "env": {
                "id": "toy_envs:crashing_spread",
                "params": {"N": 2, "max_cycles": 10, "crash_at": 60},
            },
            "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 1},
            "train": {"total_env_steps": 2_000, "eval_every": 0, "eval_episodes": 2},
            "hardware": {"num_envs": 2},
        },
    )
    out = run_json("run", str(spec))
    assert out["exit_code"] == 1
    run = out["runs"][0]
    assert run["status"] == "FAILED" and "simulated env failure" in run["error"]
    stored = client().get_run(run["run_id"])
    assert stored.info.status == "FAILED"
    assert "simulated env failure" in stored.data.tags["marlctl.error"]
    parent = client().get_run(out["parent_run_id"])
    assert parent.info.status == "FAILED"
    # The summary says where the traceback is, a path a user can open from here.
    trace = Path(run["trace_file"])
    assert not trace.is_absolute() and "simulated env failure" in trace.read_text()
    assert "trace" not in run  # the traceback itself is not printed
    text = CliRunner().invoke(app, ["run", str(spec)], env={"COLUMNS": "80"}).output
    assert f"(traceback: {Path('mlruns')}" in text and "error.txt)" in text


def test_nan_loss_fails_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(
        tmp_path,
        {
            "env": {"id": "mpe/simple_spread", "params": SPREAD},
            "algo": {
                "name": "mappo",
                "rollout_steps": 10,
                "epochs": 1,
                "lr": 1.0,
                "max_grad_norm": 1e30,
                "value_norm": False,
                "huber_delta": None,
            },
            "train": {"total_env_steps": 400, "eval_every": 0, "eval_episodes": 2},
            "hardware": {"num_envs": 4},
        },
    )
    # Rewards near float32's limit overflow the returns and the value loss on the first update.
    import marlctl.envs.pettingzoo as backend

    original = backend.EnvSlice.step

    def scaled(self, actions):
        nxt, rew, final = original(self, actions)
        for key in rew:
            if key.startswith("rew/"):
                rew[key] = rew[key] * np.float32(3e38)
        return nxt, rew, final

    monkeypatch.setattr(backend.EnvSlice, "step", scaled)
    out = run_json("run", str(spec))
    assert out["exit_code"] == 1
    assert out["runs"][0]["status"] == "FAILED"
    assert "non-finite loss" in out["runs"][0]["error"]


def test_resume_after_kill_continues_the_same_run(tmp_path):
    marker = tmp_path / "killed-once"
    spec = write_spec(
        tmp_path,
        {
            "seeds": [0],
            "env": {
                "id": "toy_envs:dying_spread",
                "params": {**SPREAD, "die_at": 500, "marker": str(marker)},
            },
            "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 1},
            "train": {
                "total_env_steps": 8_000,
                "eval_every": 2_000,
                "eval_episodes": 8,
                "checkpoint_every": 1_000,
                "log_every": 200,
            },
            "hardware": {"num_envs": 8},
            "tracking": {"flush_every_s": 0.1},
        },
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    # The env kills the whole process at about 4,000 env steps (500 steps of each of 8 envs).
    crashed = subprocess.run(
        [sys.executable, "-m", "marlctl", "run", str(spec)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert crashed.returncode == -signal.SIGKILL and marker.exists()
    crashed_at = time.time() * 1000
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = [r for e in mlflow.search_experiments() for r in mlflow.search_runs([e.experiment_id])]
    seed_run = next(r for r in runs if r.data.tags.get("marlctl.role") == "seed")
    assert seed_run.info.status == "RUNNING"
    steps_before = max(
        m.step for m in mlflow.get_metric_history(seed_run.info.run_id, "loss/policy")
    )
    assert 2_000 <= steps_before < 8_000

    parent_id = seed_run.data.tags["mlflow.parentRunId"]
    # The stored spec names a factory: resuming imports it only when this machine trusts it.
    refused = subprocess.run(
        [sys.executable, "-m", "marlctl", "run", "--resume", parent_id, "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    (message,) = json.loads(refused.stdout)["errors"]
    assert message.startswith(f"run {parent_id}: env.id: the spec stored with run {parent_id}")
    assert "--trust-factory toy_envs:dying_spread" in message
    assert mlflow.get_run(seed_run.info.run_id).info.status == "RUNNING"
    trust = ["--trust-factory", "toy_envs:dying_spread"]
    resumed_at = time.time() * 1000
    done = subprocess.run(
        [sys.executable, "-m", "marlctl", "run", "--resume", parent_id, *trust, "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert [r["run_id"] for r in summary["runs"]] == [seed_run.info.run_id]
    assert mlflow.get_run(seed_run.info.run_id).info.status == "FINISHED"
    assert mlflow.get_run(parent_id).info.status == "FINISHED"
    resumed = mlflow.get_run(seed_run.info.run_id)
    # Training went on from the last checkpoint before the crash (one every 1,000 steps),
    # not from the start, and ran to the end of the budget.
    resumed_from = int(resumed.data.tags["marlctl.resumed_from_step"])
    assert steps_before - 1_000 - 80 <= resumed_from <= steps_before
    history = mlflow.get_metric_history(seed_run.info.run_id, "loss/policy")
    after = [m.step for m in history if m.timestamp > crashed_at]
    # Steps the store already held are not logged twice.
    assert min(after) > steps_before and max(after) > 7_500
    assert len({m.step for m in history}) == len(history)
    evals = sorted(
        m.step for m in mlflow.get_metric_history(seed_run.info.run_id, "eval/return_mean")
    )
    assert evals[-1] >= 8_000 and len(set(evals)) >= 4
    # Its training time is both processes' training, not the time it lay stopped between.
    span = (resumed.info.end_time - resumed.info.start_time) / 1000
    stopped = (resumed_at - crashed_at) / 1000
    assert 0 < resumed.data.metrics["perf/trained_s"] < span - stopped


def test_parallel_seeds_log_child_runs_under_one_parent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(
        tmp_path,
        {
            "name": "parallel-check",
            "seeds": [3, 4],
            "env": {"id": "mpe/simple_spread", "params": SPREAD},
            "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 1},
            "train": {"total_env_steps": 400, "eval_every": 0, "eval_episodes": 2},
            "hardware": {"num_envs": 4, "parallel_runs": 2},
        },
    )
    out = run_json("run", str(spec))
    assert out["exit_code"] == 0, out
    mlflow = client()
    experiment = mlflow.get_experiment_by_name("parallel-check")
    runs = mlflow.search_runs([experiment.experiment_id])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == out["parent_run_id"]]
    assert sorted(r.data.tags["marlctl.seed"] for r in children) == ["3", "4"]
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.params["algo.lr"] == "0.0007"
        assert child.data.tags["marlctl.spec_hash"] == children[0].data.tags["marlctl.spec_hash"]
        assert "eval/return_mean" in child.data.metrics
        assert "perf/env_steps_per_s" in child.data.metrics
        # seconds from the run's process start to its first env step
        assert 0 < child.data.metrics["perf/startup_s"] < 600
        names = {a.path for a in mlflow.list_artifacts(child.info.run_id)}
        assert {"spec.yaml", "checkpoints", "policy"} <= names


def test_same_seed_gives_same_numbers_on_cpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    body = {
        "seeds": [7],
        "env": {"id": "mpe/simple_spread", "params": SPREAD},
        "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 2},
        "train": {"total_env_steps": 800, "eval_every": 0, "eval_episodes": 4},
        "hardware": {"num_envs": 4},
    }
    first = run_json("run", str(write_spec(tmp_path, body, "a.yaml")))
    second = run_json("run", str(write_spec(tmp_path, body, "b.yaml")))
    assert first["runs"][0]["final_return"] == second["runs"][0]["final_return"]
    a = history(first["runs"][0]["run_id"], "loss/value")
    b = history(second["runs"][0]["run_id"], "loss/value")
    assert a == b and len(a) > 0


def test_checkpoint_loads_with_weights_only(tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    spec = write_spec(
        tmp_path,
        {
            "env": {"id": "mpe/simple_spread", "params": SPREAD},
            "algo": {"name": "ippo", "rollout_steps": 10, "epochs": 1},
            "train": {"total_env_steps": 400, "eval_every": 0, "eval_episodes": 2},
            "hardware": {"num_envs": 4},
        },
    )
    out = run_json("run", str(spec))
    path = client().download_artifacts(
        out["runs"][0]["run_id"], "checkpoints/latest.pt", str(tmp_path)
    )
    state = torch.load(path, weights_only=True)
    assert state["env_steps"] == out["runs"][0]["env_steps"]
    assert any(k.endswith("actor.mlp.weights.0") for k in state["trainer"]["policies"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("parallel", "how"),
    [(1, "ctrl-c"), (2, "ctrl-c"), (2, "sigterm")],
)
def test_interrupt_checkpoints_marks_killed_and_exits_130(parallel, how, tmp_path):
    """Ctrl-C reaches the whole job; a scheduler's SIGTERM only the marlctl process."""
    seeds = [0, 1, 2] if parallel > 1 else [0, 1]  # one seed more than runs at once
    spec = write_spec(
        tmp_path,
        {
            "seeds": seeds,
            "env": {"id": "mpe/simple_spread", "params": SPREAD},
            "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 1},
            "train": {
                "total_env_steps": 500_000,
                "eval_every": 0,
                "eval_episodes": 4,
                "checkpoint_every": 0,
                "log_every": 200,
            },
            "hardware": {"num_envs": 4, "parallel_runs": parallel},
            "tracking": {"flush_every_s": 0.2},
        },
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "marlctl", "run", str(spec), "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "stderr.txt").open("w"),
        text=True,
        start_new_session=True,
        preexec_fn=foreground_job,
    )
    try:
        from mlflow.tracking import MlflowClient

        store = tmp_path / "mlflow.db"
        deadline = time.monotonic() + 120
        started = []
        while time.monotonic() < deadline and len(started) < parallel:
            time.sleep(1.0)
            if store_has_runs(store):
                mlflow = MlflowClient(f"sqlite:///{store}")
                started = [
                    r
                    for e in mlflow.search_experiments()
                    for r in mlflow.search_runs([e.experiment_id])
                    if r.data.tags.get("marlctl.role") == "seed" and "loss/policy" in r.data.metrics
                ]
        assert len(started) == parallel, "training did not start"
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # a terminal sends SIGINT to the whole job
        else:
            proc.send_signal(signal.SIGTERM)
        try:
            stdout, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGUSR1)  # every process prints its threads' stacks
            time.sleep(2)
            pytest.fail(
                "no exit 120 s after the interrupt:\n"
                + (tmp_path / "stderr.txt").read_text()[-12000:]
            )
    finally:
        if proc.poll() is None:  # never leave a training process behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (tmp_path / "stderr.txt").read_text()[-3000:]
    summary = json.loads(stdout)
    assert sorted(r["seed"] for r in summary["runs"]) == seeds
    assert {r["status"] for r in summary["runs"]} == {"KILLED"}
    mlflow = MlflowClient(f"sqlite:///{store}")
    started_ids = {r.info.run_id for r in started}
    for result in summary["runs"]:
        run = mlflow.get_run(result["run_id"])
        assert run.info.status == "KILLED"
        artifacts = {a.path for a in mlflow.list_artifacts(run.info.run_id, "checkpoints")}
        if result["run_id"] in started_ids:
            assert "checkpoints/latest.pt" in artifacts
        else:  # queued behind the running seeds: never trained, resumable from scratch
            assert run.data.tags["marlctl.error"] == "interrupted before it started"
            assert "loss/policy" not in run.data.metrics
    assert mlflow.get_run(summary["parent_run_id"]).info.status == "KILLED"


@pytest.mark.slow
def test_a_crashed_run_process_leaves_the_other_seeds_running(tmp_path):
    marker = tmp_path / "one-died"
    spec = write_spec(
        tmp_path,
        {
            "seeds": [0, 1],
            "env": {
                "id": "toy_envs:dying_spread",
                "params": {**SPREAD, "die_at": 300, "marker": str(marker)},
            },
            "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 1},
            "train": {
                "total_env_steps": 6_000,
                "eval_every": 0,
                "eval_episodes": 4,
                "checkpoint_every": 0,
            },
            "hardware": {"num_envs": 4, "parallel_runs": 2},
        },
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    done = subprocess.run(
        [sys.executable, "-m", "marlctl", "run", str(spec), "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    runs = json.loads(done.stdout)["runs"]
    assert sorted(r["status"] for r in runs) == ["FAILED", "FINISHED"]
    failed = next(r for r in runs if r["status"] == "FAILED")
    assert "exit code -9" in failed["error"]
    finished = next(r for r in runs if r["status"] == "FINISHED")
    assert finished["env_steps"] >= 6_000


def test_a_run_that_compiles_nothing_never_imports_the_compiler():
    """`torch._dynamo` costs about a second of start-up: a run without `hardware.compile:
    true` trains, checkpoints and resumes with every algorithm's optimiser without it."""
    script = """
import sys, torch
from marlctl.envs.native import native_class
from marlctl.spec.models import Spec
from marlctl.train.runner import build_trainer
for name in ("mappo", "qmix", "masac", "hasac"):
    env = native_class("mpe/simple_spread")({"N": 2}, 4, "cpu")
    spec = Spec.model_validate({"env": {"id": "mpe/simple_spread", "params": {"N": 2}},
        "algo": {"name": name, **({"rollout_steps": 8} if name == "mappo" else
                 {"learning_starts": 8, "batch_size": 8})}})
    trainer = build_trainer(spec, env.info, 4, torch.device("cpu"), 10, (0,))
    ob = env.reset(0)
    for _ in range(4):
        ob, _ = trainer.train_iteration(env, ob)
    trainer.load_seed_states([trainer.seed_state(0)])
    assert trainer.updates > 0, name
print("torch._dynamo" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_an_interrupted_run_says_how_to_continue_it(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from marlctl import cli
    from marlctl.launch import Summary
    from marlctl.train.runner import RunResult

    monkeypatch.chdir(tmp_path)
    runs = [RunResult(0, 0, "a" * 32, "FINISHED"), RunResult(1, 1, "b" * 32, "KILLED")]
    buffer = io.StringIO()
    monkeypatch.setattr(cli.output, "out", Console(file=buffer, width=80))
    default = Summary("spread", f"sqlite:///{tmp_path / 'mlflow.db'}", "c" * 32, runs)
    cli.run._print_summary(default)
    text = buffer.getvalue()
    assert "interrupted" in text and "failed" not in text
    assert f"to continue: marlctl run --resume {'c' * 32}\n" in text
    elsewhere = Summary("spread", "sqlite:////data/runs.db", "c" * 32, runs)
    assert cli.run.resume_command(elsewhere).endswith("--tracking-uri sqlite:////data/runs.db")


def test_progress_and_summary_fit_80_columns_without_cutting_a_value(monkeypatch):
    """Piped output is 80 columns wide: nothing the user reads may end in '…'."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from marlctl import cli
    from marlctl.launch import Summary
    from marlctl.train.runner import RunResult

    buffer = io.StringIO()
    monkeypatch.setattr(cli.output, "err", Console(file=buffer, width=80))
    monkeypatch.setattr(cli.output, "out", Console(file=buffer, width=80))
    plan = SimpleNamespace(
        runs=[SimpleNamespace(seed=s, total_env_steps=6_000_000) for s in (0, 1)]
    )

    def work(make):
        update = make(plan)
        for step in (3_000_000, 4_500_000):
            update({"seed": 1, "step": step, "total": 6_000_000, "return": -126.49})
        update({"kind": "eval", "seed": 1, "metrics": {"eval/return_mean": -114.1}})

    cli.progress.with_progress(work, as_json=False)
    runs = [RunResult(0, 10, "d" * 32, "FINISHED", 6_000_000, -14.82, 123_456.7)]
    cli.run._print_summary(
        Summary("spread-mappo-native-a-long-name", "sqlite:///x.db", "e" * 32, runs)
    )
    text = buffer.getvalue()
    assert "4.50M/6.00M" in text and "-126.49" in text and "-114.10" in text, text
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_training_metrics_are_logged_about_200_times_per_run_unless_told():
    from marlctl.spec.models import TrainSpec

    assert TrainSpec(total_env_steps=150_000).log_interval == 750
    assert TrainSpec(total_env_steps=150).log_interval == 1  # every iteration
    assert TrainSpec(total_env_steps=150_000, log_every=10_000).log_interval == 10_000
