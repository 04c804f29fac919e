"""Training on the native backend, evaluating across backends, and `marlctl bench`."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys

import pytest
import torch
from test_training import client, random_policy_return, run_cli, run_json, write_spec

from marlctl.spec.models import Spec

SPREAD = {"N": 2, "max_cycles": 10}


@contextlib.contextmanager
def no_host_sync():
    """Any CUDA operation in the block that makes the host wait for the device raises."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def native_spec(folder, **sections) -> dict:
    body = {
        "seeds": [0],
        "env": {"id": "mpe/simple_spread", "backend": "native", "params": SPREAD},
        "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 5, "minibatches": 4, "lr": 2e-3},
        "train": {
            "total_env_steps": 120_000,
            "eval_every": 60_000,
            "eval_episodes": 256,
            "checkpoint_every": 0,
        },
        "hardware": {"num_envs": 256, "device": "cpu"},
    }
    for key, value in sections.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return body


def test_native_policy_learns_and_scores_the_same_on_pettingzoo(tmp_path):
    spec = write_spec(tmp_path, native_spec(tmp_path))
    out = run_json("run", str(spec))
    assert out["exit_code"] == 0, out
    run_id = out["runs"][0]["run_id"]
    baseline = random_policy_return(SPREAD)  # about -7.8 per agent
    assert out["runs"][0]["final_return"] > baseline + 0.6, (out["runs"][0], baseline)

    scores = {}
    for backend in ("native", "pettingzoo"):
        result = run_json("eval", run_id, "--backend", backend, "--episodes", "400")
        assert result["exit_code"] == 0, result
        (row,) = result["runs"]
        assert row["backend"] == backend and row["episodes"] == 400
        scores[backend] = row["return_mean"]
    # Per-episode returns have a std of about 2.5: the two 400-episode means of the same
    # policy differ by less than 4 standard errors of their difference.
    assert abs(scores["native"] - scores["pettingzoo"]) < 4 * 2.5 * math.sqrt(2 / 400), scores
    assert scores["pettingzoo"] > baseline + 0.6, scores


def test_eval_of_a_parent_run_covers_every_seed(tmp_path):
    body = native_spec(tmp_path, seeds=[0, 1])
    body["train"] = {"total_env_steps": 5_000, "eval_every": 0, "eval_episodes": 8}
    body["hardware"] = {"num_envs": 50, "parallel_runs": 2}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    result = run_json("eval", out["parent_run_id"], "--episodes", "20")
    assert result["exit_code"] == 0, result
    assert sorted(r["seed"] for r in result["runs"]) == [0, 1]
    assert all(r["backend"] == "native" for r in result["runs"])


def test_eval_of_an_unknown_run_is_a_clean_error(tmp_path):
    run_json(
        "run",
        str(
            write_spec(
                tmp_path, native_spec(tmp_path, train={"total_env_steps": 1000, "eval_every": 0})
            )
        ),
    )
    result = run_cli("eval", "0123456789abcdef")
    assert result.exit_code == 2
    assert "no run id starts with '0123456789abcdef'" in result.output


def test_native_training_is_deterministic_per_seed(tmp_path):
    body = native_spec(tmp_path)
    body["train"] = {"total_env_steps": 20_000, "eval_every": 0, "eval_episodes": 16}
    spec = write_spec(tmp_path, body)
    first, second = run_json("run", str(spec)), run_json("run", str(spec))
    metrics = [client().get_run(o["runs"][0]["run_id"]).data.metrics for o in (first, second)]
    assert metrics[0]["loss/value"] == metrics[1]["loss/value"]
    assert first["runs"][0]["final_return"] == second["runs"][0]["final_return"]


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        ({"env": {"id": "butterfly/cooperative_pong", "params": {}}}, "env.backend", "no native"),
        ({"hardware": {"env_workers": 2}}, "hardware.env_workers", "backend: native"),
        ({"env": {"params": {"curriculum": True}}}, "env.params.curriculum", "not supported"),
    ],
)
def test_native_backend_problems_are_reported_before_launch(tmp_path, change, key, message):
    body = native_spec(tmp_path)
    for section, values in change.items():
        if section == "env" and "params" in values and "id" not in values:
            body["env"]["params"] = {**body["env"]["params"], **values["params"]}
        else:
            body[section] = {**body[section], **values}
    result = run_cli("validate", str(write_spec(tmp_path, body)))
    assert result.exit_code == 2, result.output
    assert f": {key}: " in result.output and message in result.output, result.output


def test_bench_measures_env_and_training_and_suggests_num_envs(tmp_path):
    spec = write_spec(tmp_path, native_spec(tmp_path))
    result = run_cli("bench", str(spec), "--num-envs", "8,32", "--seconds", "0.2")
    assert result.exit_code == 0, result.output
    assert "fastest training: hardware.num_envs=" in result.output
    assert "samples instead of" in result.output  # what the batch size does to PPO
    assert "{" not in result.output  # figures once, in the table: no JSON without --json
    # A budget a loaded machine's training iteration stays inside: a longer one skips the
    # sizes past it (the next test).
    data = run_json("bench", str(spec), "--num-envs", "8,32", "--seconds", "1")
    assert data["exit_code"] == 0
    points = data["points"]
    assert [(p["kind"], p["num_envs"]) for p in points] == [
        ("env", 8),
        ("env", 32),
        ("train", 8),
        ("train", 32),
    ]
    assert all(p["env_steps_per_s"] > 0 and p["peak_memory_mb"] > 0 for p in points)
    assert all(p["agent_steps_per_s"] == pytest.approx(2 * p["env_steps_per_s"]) for p in points)
    best = max((p for p in points if p["kind"] == "train"), key=lambda p: p["env_steps_per_s"])
    assert data["suggested_num_envs"] == best["num_envs"]
    assert not (tmp_path / "mlflow.db").exists()  # bench tracks nothing


def test_bench_counts_a_training_iteration_s_arithmetic(tmp_path):
    """A train point's matrix-product arithmetic per env step: the same at every num_envs
    (MAPPO's work per env step does not depend on it), growing by the same amount with each
    added epoch (the rollout's share counted once), and none for env stepping."""
    spec = write_spec(tmp_path, native_spec(tmp_path))
    per_epochs = {}
    for epochs in (2, 4, 6):
        data = run_json("bench", str(spec), f"algo.epochs={epochs}", "--num-envs", "8,32",
                        "--seconds", "0.2")  # fmt: skip
        assert data["exit_code"] == 0, data
        env = [p for p in data["points"] if p["kind"] == "env"]
        train = [p for p in data["points"] if p["kind"] == "train"]
        assert all(p["flop_per_step"] is None and p["flop_per_s"] is None for p in env)
        assert train[0]["flop_per_step"] > 0
        assert train[1]["flop_per_step"] == pytest.approx(train[0]["flop_per_step"], rel=1e-9)
        for p in train:
            assert p["flop_per_s"] == pytest.approx(p["flop_per_step"] * p["env_steps_per_s"])
        per_epochs[epochs] = train[0]["flop_per_step"]
    two_more = per_epochs[6] - per_epochs[4]
    assert two_more > 0
    assert per_epochs[4] - per_epochs[2] == pytest.approx(two_more, rel=1e-9)
    assert per_epochs[2] > two_more  # the rollout's forward passes, counted once
    result = run_cli("bench", str(spec), "--num-envs", "8", "--seconds", "0.2")
    assert "MFLOP per step: matrix products and convolutions" in result.output


def test_bench_skips_sizes_past_one_that_outlasts_the_budget(tmp_path):
    """A point whose one training iteration takes longer than --seconds is measured once,
    and the larger sizes are skipped and named, so a point costs a few budgets at most."""
    spec = write_spec(tmp_path, native_spec(tmp_path))
    # 900 gradient steps per iteration: seconds, far over the budget, even with 8 envs.
    slow = ("algo.epochs=30", "algo.minibatches=30", "--num-envs", "8,64,256", "--seconds", "0.1")
    data = run_json("bench", str(spec), *slow, "--env-only")
    assert [p["num_envs"] for p in data["points"]] == [8, 64, 256]  # env steps are fast
    data = run_json("bench", str(spec), *slow)
    train = [p for p in data["points"] if p["kind"] == "train"]
    assert [p["num_envs"] for p in train] == [8] and train[0]["slow"]
    assert data["skipped"] == ["train num_envs=64", "train num_envs=256"]


def test_bench_rejects_a_bad_sweep(tmp_path):
    spec = write_spec(tmp_path, native_spec(tmp_path))
    result = run_cli("bench", str(spec), "--num-envs", "8,x")
    assert result.exit_code == 2
    assert "--num-envs" in result.output


def test_usage_errors_exit_2_without_traceback():
    for args in (["run", "x.yaml", "--no-such-option"], ["no-such-command"]):
        proc = subprocess.run(
            [sys.executable, "-m", "marlctl", *args], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "No such" in proc.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_native_rollout_never_syncs_with_the_host_on_cuda():
    from marlctl.algos.ppo import MAPPOConfig
    from marlctl.envs.native import native_class
    from marlctl.spec.models import ModelSpec
    from marlctl.train.base import TrainerSetup
    from marlctl.train.ppo import PPOTrainer

    device = torch.device("cuda")
    env = native_class("mpe/simple_spread")({}, 64, device)
    setup = TrainerSetup(MAPPOConfig(name="mappo"), ModelSpec(), env.info, 64, device, 10, True)
    trainer = PPOTrainer(setup)
    ob = env.reset(0)
    trainer.collect(env, ob)  # warm-up: lazy CUDA initialisation may sync
    with no_host_sync():
        trainer.collect(env, ob)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("algo", ["qmix", "maddpg", "masac"])
def test_replay_based_iterations_never_sync_with_the_host_on_cuda(algo):
    from marlctl.envs.native import native_class
    from marlctl.spec.models import Spec
    from marlctl.train.runner import build_trainer

    device = torch.device("cuda")
    env = native_class("mpe/simple_spread")({}, 2 * 16, device, seeds=2)
    spec = Spec.model_validate(
        {
            "env": {"id": "mpe/simple_spread", "backend": "native"},
            "algo": {"name": algo, "batch_size": 32, "learning_starts": 64},
        }
    )
    trainer = build_trainer(spec, env.info, 16, device, 10, (0, 1))
    ob = env.reset([0, 1])
    for _ in range(8):  # past learning_starts; lazy CUDA initialisation may sync
        ob, _ = trainer.train_iteration(env, ob)
    with no_host_sync():
        for _ in range(3):
            ob, _ = trainer.train_iteration(env, ob)


ROLLOUT_CASES = {
    "mappo-spread-2-seeds": ("mappo", "mpe/simple_spread", (0, 1), {}),
    "ippo-continuous": ("ippo", "mpe/simple_spread", (2,), {"continuous_actions": True}),
    "mappo-recurrent-masked": ("mappo", "lbf/Foraging-8x8-2p-2f-coop-v3", (3,), "gru"),
    "mappo-smax-wins": ("mappo", "smax/3m", (4,), {}),  # statistics with won battles
}


@pytest.mark.parametrize("case", sorted(ROLLOUT_CASES))
def test_compiled_rollout_steps_collect_what_eager_ones_collect(case):
    """`hardware.compile: true` runs each group's part of a rollout step, and the episode
    statistics, compiled: from the same weights and env seeds, the same actions, and the
    same log-probabilities, values and returns up to the rounding of fused kernels."""
    from marlctl.envs.native import native_class
    from marlctl.train.build import build_trainer

    algo, env_id, seeds, extra = ROLLOUT_CASES[case]
    params = extra if isinstance(extra, dict) else {}
    model = {"recurrent": extra} if isinstance(extra, str) else {}
    spec = Spec.model_validate(
        {
            "env": {"id": env_id, "backend": "native", "params": params},
            "algo": {"name": algo, "rollout_steps": 6, "epochs": 1, "minibatches": 1},
            "model": model,
            "hardware": {"device": "cpu"},
        }
    )
    device, num_envs = torch.device("cpu"), 16
    runs = []
    for compiled in (False, True):
        env = native_class(env_id)(dict(spec.env.params), num_envs * len(seeds), device,
                                   seeds=len(seeds))  # fmt: skip
        trainer = build_trainer(spec, env.info, num_envs, device, 100, seeds)
        if compiled:
            trainer.compile()
        runs.append((trainer, env, env.reset(list(seeds) if len(seeds) > 1 else seeds[0])))
    (eager, env_e, ob_e), (fused, env_c, ob_c) = runs
    fused.load_state_dict(eager.state_dict())
    for _ in range(3):  # the regions' first call runs eagerly, the later ones compiled
        ours, ob_e, _ = eager.collect(env_e, ob_e)
        theirs, ob_c, _ = fused.collect(env_c, ob_c)
        for name, rollout in ours.items():
            if rollout.actions.is_floating_point():  # mean + std * noise, rounded apart
                assert torch.allclose(rollout.actions, theirs[name].actions, atol=1e-5), name
            else:
                assert torch.equal(rollout.actions, theirs[name].actions), name
            for field in ("log_probs", "values", "rewards"):
                a, b = getattr(rollout, field), getattr(theirs[name], field)
                assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (name, field)
    assert torch.allclose(eager.stats.sums, fused.stats.sums, rtol=1e-4, atol=1e-5)
    assert torch.equal(eager.stats.counts, fused.stats.counts)
    for field in ("wins", "count"):
        ours, theirs = getattr(eager.stats, field), getattr(fused.stats, field)
        assert (ours is None and theirs is None) or torch.equal(ours, theirs), field
    assert all(region.draws is not None for region in fused._act.values())


@pytest.mark.slow
def test_compiled_networks_train_and_checkpoint_under_the_same_names(tmp_path):
    body = native_spec(tmp_path, hardware={"compile": True, "num_envs": 32})
    body["train"] = {"total_env_steps": 640, "eval_every": 0, "eval_episodes": 4}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    run_id = out["runs"][0]["run_id"]
    path = client().download_artifacts(run_id, "policy/final.pt", str(tmp_path))
    state = torch.load(path, weights_only=True)
    assert all("_orig_mod" not in key for key in state["policies"])
    result = run_json("eval", run_id, "--episodes", "8")
    assert result["exit_code"] == 0, result


def test_list_envs_shows_the_native_backend():
    from marlctl.envs.native import NATIVE, NATIVE_ONLY

    data = run_json("list", "envs")
    backends = {row["id"]: row["backends"] for row in data["envs"]}
    for env_id in NATIVE:
        expected = ["native"] if env_id in NATIVE_ONLY else ["pettingzoo", "native"]
        assert backends[env_id] == expected
    assert backends["sisl/multiwalker"] == ["pettingzoo"]


def batched_and_alone(tmp_path, body: dict) -> dict:
    """Runs `body` (`batch_seeds: true`, seeds [0, 1, ...]) and its seed 1 alone; asserts that
    seed 1 of the batch logged what it logged alone. The batched run's summary."""
    from test_training import history

    batched = run_json("run", str(write_spec(tmp_path, body, "batched.yaml")))
    assert batched["exit_code"] == 0, batched
    alone_body = {**body, "seeds": [1], "hardware": {**body["hardware"], "batch_seeds": False}}
    alone = run_json("run", str(write_spec(tmp_path, alone_body, "alone.yaml")))
    assert alone["exit_code"] == 0, alone
    ours, theirs = batched["runs"][1], alone["runs"][0]
    assert ours["final_return"] == theirs["final_return"]
    for key in ("loss/value", "loss/policy", "eval/return_mean", "train/return_mean"):
        assert history(ours["run_id"], key) == history(theirs["run_id"], key), key
    return batched


def test_batched_seeds_compute_what_each_seed_computes_alone(tmp_path):
    body = native_spec(tmp_path, seeds=[0, 1, 2], hardware={"batch_seeds": True, "num_envs": 32})
    body["train"] = {
        "total_env_steps": 9_600,
        "eval_every": 3_200,
        "eval_episodes": 16,
        "checkpoint_every": 6_400,
    }
    batched = batched_and_alone(tmp_path, body)
    assert [r["seed"] for r in batched["runs"]] == [0, 1, 2]
    assert len({r["run_id"] for r in batched["runs"]}) == 3
    # Seeds differ from one another, and each seed's policy evaluates on its own.
    assert len({r["final_return"] for r in batched["runs"]}) == 3
    result = run_json("eval", batched["parent_run_id"], "--episodes", "8")
    assert result["exit_code"] == 0 and len(result["runs"]) == 3, result


def test_batched_seeds_need_a_batched_backend(tmp_path):
    body = native_spec(tmp_path, hardware={"batch_seeds": True})
    body["env"]["backend"] = "pettingzoo"
    result = run_cli("validate", str(write_spec(tmp_path, body)))
    assert result.exit_code == 2
    assert ": hardware.batch_seeds: " in result.output


def test_a_killed_seed_batch_resumes_together(tmp_path):
    import json
    import signal
    import time

    body = native_spec(tmp_path, seeds=[0, 1, 2], hardware={"batch_seeds": True, "num_envs": 16})
    body["algo"]["epochs"] = 1
    body["train"] = {
        "total_env_steps": 30_000,
        "eval_every": 10_000,
        "eval_episodes": 8,
        "checkpoint_every": 5_000,
        "log_every": 1_000,
    }
    body["tracking"] = {"flush_every_s": 0.1}
    spec = write_spec(tmp_path, body)
    proc = subprocess.Popen(
        [sys.executable, "-m", "marlctl", "run", str(spec)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("mlruns/**/checkpoints/latest.pt"))) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoints appeared"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    mlflow = client()
    seeds = [
        r
        for e in mlflow.search_experiments()
        for r in mlflow.search_runs([e.experiment_id])
        if r.data.tags.get("marlctl.role") == "seed"
    ]
    assert len(seeds) == 3 and all(r.info.status == "RUNNING" for r in seeds)
    parent = seeds[0].data.tags["mlflow.parentRunId"]
    done = subprocess.run(
        [sys.executable, "-m", "marlctl", "run", "--resume", parent, "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert sorted(r["seed"] for r in summary["runs"]) == [0, 1, 2]
    resumed = {mlflow.get_run(r.info.run_id).data.tags["marlctl.resumed_from_step"] for r in seeds}
    assert len(resumed) == 1 and int(resumed.pop()) >= 5_000  # one step for the whole batch
    for run in seeds:
        assert mlflow.get_run(run.info.run_id).info.status == "FINISHED"
        history = mlflow.get_metric_history(run.info.run_id, "loss/policy")
        assert len({m.step for m in history}) == len(history)
        evals = mlflow.get_metric_history(run.info.run_id, "eval/return_mean")
        assert max(m.step for m in evals) >= 30_000
