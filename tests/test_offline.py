"""Offline algorithms: specs that train from a dataset are checked before any training, and
behaviour cloning and the conservative Q-learners learn the dataset's good joint action."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

import pytest
import torch
from test_algorithms import quick_spec
from test_training import client, run_json, write_spec

from marlctl.algos import registered_algos
from marlctl.data.format import Manifest, groups_of
from marlctl.data.writer import DatasetWriter, EpisodeStager, Recording
from marlctl.envs.native import native_class
from marlctl.train.offline import STATE_CLIP

ENVS = 64


def climbing_dataset(
    folder: Path, episodes: int, expert: float, env_id="matrix/climbing", action: int = 0
):
    """One-shot climbing games: a share `expert` of them played at joint action (`action`,
    `action`) (the best, (0, 0), is worth 11; (1, 1) 7), the rest uniformly at random (mean
    -3.4)."""
    env = native_class(env_id)({}, ENVS, torch.device("cpu"))
    manifest = Manifest(env_id, "native", {}, "marlctl", groups_of(env.info), env.info.state_dim)
    writer = DatasetWriter(folder, manifest, limit=episodes)
    stager = EpisodeStager(ENVS, env.device, torch.zeros(ENVS, dtype=torch.long), writer.add)
    recording = Recording(env, env.info, stager)
    recording.reset(0)
    draws = torch.Generator().manual_seed(0)
    while not writer.full:
        best = torch.rand(ENVS, generator=draws) < expert
        random = torch.randint(3, (ENVS, 2), generator=draws)
        recording.step({"player": torch.where(best[:, None], action, random)})
    return writer.close()


def spec(algo: str, data: str | None, **train) -> dict:
    body = {
        "seeds": [0, 1, 2],
        "env": {"id": "matrix/climbing", "backend": "native"},
        "algo": {"name": algo},
        "train": {"total_updates": 600, "eval_every": 0, "eval_episodes": 16, **train},
        "hardware": {"num_envs": 16, "device": "cpu", "batch_seeds": True},
    }
    return body | ({"data": data} if data else {})


@pytest.fixture
def mixed(tmp_path) -> Path:
    manifest = climbing_dataset(tmp_path / "mixed", 2000, expert=0.5)
    assert 3.0 < sum(manifest.returns) / manifest.episodes < 5.0
    return tmp_path / "mixed"


@pytest.mark.parametrize(
    ("algo", "recurrent"),
    [("bc", False), ("iql_cql", False), ("qmix_cql", False), ("maicq", False), ("bc", True)]
    + [pytest.param(a, True, marks=pytest.mark.slow) for a in ("iql_cql", "qmix_cql", "maicq")],
)
def test_an_offline_algorithm_learns_the_joint_action_its_dataset_favours(
    tmp_path, algo, recurrent
):
    # Half of each dataset's games are played at one joint action, half at random (-3.4 on
    # average). Acting greedily, each learner plays the joint action its dataset favours:
    # (0, 0), worth 11, from one dataset and (1, 1), worth 7, from the other. A policy that
    # learned nothing plays one fixed action on both, so it cannot pass both. Recurrent
    # learners train on windows of 4 steps that cross episodes, their state reset at each.
    for action, worth in [(0, 11.0), (1, 7.0)]:
        data = tmp_path / f"expert{action}"
        climbing_dataset(data, 2000, expert=0.5, action=action)
        body = spec(algo, str(data))
        if recurrent:  # a quarter of the windows: each is 4 steps, and a GRU runs over them
            body["algo"] |= {"sequence_length": 4, "batch_size": 64}
            body["model"] = {"recurrent": "gru"}
        out = run_json("run", str(write_spec(tmp_path, body)))
        assert out["exit_code"] == 0, out
        finals = [r["final_return"] for r in out["runs"]]
        assert median(finals) == pytest.approx(worth), (action, finals)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("algo", ["bc", "qmix_cql", "maicq"])
def test_an_offline_run_on_a_gpu_is_captured_and_learns(tmp_path, algo):
    climbing_dataset(tmp_path / "expert0", 2000, expert=0.5, action=0)
    body = spec(algo, str(tmp_path / "expert0"))
    body["hardware"] |= {"device": "cuda"}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    finals = [r["final_return"] for r in out["runs"]]
    assert median(finals) == pytest.approx(11.0), finals
    data = client().get_run(out["runs"][0]["run_id"]).data
    assert data.tags["marlctl.compile"] == "CUDA graph"
    assert data.metrics["perf/capture_s"] > 0


def test_bench_of_an_offline_spec_times_its_gradient_steps(mixed, tmp_path):
    body = spec("qmix_cql", str(mixed)) | {"seeds": [0, 1]}
    body["algo"] |= {"updates": 4}
    data = run_json("bench", str(write_spec(tmp_path, body)), "--seconds", "0.3")
    assert data["exit_code"] == 0, data
    assert data["unit"] == "gradient steps"
    (point,) = data["points"]  # no env point: an offline iteration steps no env
    assert point["kind"] == "train" and point["num_envs"] == 16 and point["seeds"] == 2
    # Several iterations of 4 gradient steps per seed were timed.
    assert point["env_steps_per_s"] * point["seconds"] >= 2 * 4 * 2, point
    refused = run_json("bench", str(write_spec(tmp_path, body)), "--env-only")
    assert refused["exit_code"] == 2 and "--env-only" in refused["errors"][0], refused


def test_offline_specs_are_checked_before_training(mixed, tmp_path):
    cases = {
        "no_data": (spec("bc", None), "algo.name: bc trains offline, from a recorded dataset"),
        "online": (spec("qmix", str(mixed)) | {"train": {"total_env_steps": 1000}},
                   "data: qmix learns from the env"),
        "no_budget": (spec("bc", str(mixed), total_updates=None), "set train.total_updates"),
        "missing": (spec("bc", str(tmp_path / "none")), "no such dataset folder"),
    }  # fmt: skip
    for name, (body, message) in cases.items():
        out = run_json("validate", str(write_spec(tmp_path, body, f"{name}.yaml")))
        assert out["exit_code"] == 2, (name, out)
        assert any(message in e for e in out["errors"]), (name, out["errors"])
        located = [e for e in out["errors"] if message in e][0]
        assert located.startswith(str(tmp_path / f"{name}.yaml") + ":"), located


def test_a_dataset_of_another_env_or_a_damaged_one_is_refused(mixed, tmp_path):
    climbing_dataset(tmp_path / "penalty", 100, 0.5, env_id="matrix/penalty")
    out = run_json("validate", str(write_spec(tmp_path, spec("bc", str(tmp_path / "penalty")))))
    assert out["exit_code"] == 2
    assert "holds episodes of matrix/penalty, not matrix/climbing" in out["errors"][0]
    assert ":" in out["errors"][0].split(" data: ")[0]  # FILE:LINE: data: ...
    chunk = next(mixed.glob("chunk-*.pt"))
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, other bytes: found when training reads it
    chunk.write_bytes(bytes(raw))
    out = run_json("run", str(write_spec(tmp_path, spec("bc", str(mixed)))))
    assert out["exit_code"] == 1
    assert all(r["status"] == "FAILED" for r in out["runs"])
    assert f"{chunk}: its SHA-256 differs" in out["runs"][0]["error"]
    chunk.write_bytes(bytes(raw[:-5]))  # truncated: found before any training
    out = run_json("validate", str(write_spec(tmp_path, spec("bc", str(mixed)))))
    assert out["exit_code"] == 2 and "bytes where the manifest says" in out["errors"][0]


OFFLINE = [
    pytest.param(algo, backend, kind, id=f"{algo}-{backend}-{kind}")
    for algo, info in registered_algos().items()
    if info.offline
    for backend in ("native", "pettingzoo", *(("recurrent",) if info.recurrent else ()))
    for kind in info.action_kinds
]


@pytest.mark.parametrize(("algo", "backend", "kind"), OFFLINE)
def test_every_offline_algorithm_trains_through_the_cli(algo, backend, kind, tmp_path):
    """A dataset recorded from a briefly trained MAPPO on native simple_spread trains every
    offline algorithm on either backend (the backends' envs are the same env), and the
    recurrent ones with `model.recurrent: gru` too, on windows inside 25-step episodes."""
    recurrent = backend == "recurrent"
    backend = "native" if recurrent else backend
    continuous = kind == "continuous"
    body = quick_spec("mappo", "native", continuous)
    trained = run_json("run", str(write_spec(tmp_path, body, "online.yaml")))
    assert trained["exit_code"] == 0, trained
    recorded = run_json("eval", trained["parent_run_id"], "--record", "data", "--episodes", "8")
    assert recorded["exit_code"] == 0, recorded
    body = quick_spec("mappo", backend, continuous)
    body["algo"] = {"name": algo, "batch_size": 16, "updates": 10}
    if recurrent:
        burn_in = {"burn_in": 2} if algo in ("iql_cql", "qmix_cql") else {}
        body["algo"] |= {"sequence_length": 8} | burn_in
        body["model"] = {**body.get("model", {}), "recurrent": "gru"}
    body["data"] = "data"
    body["train"] = {"total_updates": 40, "eval_every": 20, "eval_episodes": 2,
                     "checkpoint_every": 20}  # fmt: skip
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    (run,) = out["runs"]
    assert run["status"] == "FINISHED" and run["env_steps"] == 40  # gradient steps
    data = client().get_run(run["run_id"]).data
    assert "eval/return_mean" in data.metrics
    assert any(key.startswith("loss/") for key in data.metrics)
    history = client().get_metric_history(run["run_id"], "eval/return_mean")
    assert sorted({m.step for m in history}) == [0, 20, 40]


def test_the_report_sets_an_offline_group_beside_its_datasets_return(mixed, tmp_path):
    out = run_json("run", str(write_spec(tmp_path, spec("bc", str(mixed), total_updates=100))))
    assert out["exit_code"] == 0, out
    returns = json.loads((mixed / "manifest.json").read_text())["returns"]
    behaviour = sum(returns) / len(returns)
    for run in out["runs"]:
        assert client().get_run(run["run_id"]).data.metrics["data/return_mean"] == (
            pytest.approx(behaviour, rel=1e-6)
        )
    report = run_json("report", "--out", "report.md")
    assert report["exit_code"] == 0, report
    text = (tmp_path / "report.md").read_text()
    table = text.split("## Offline runs and their datasets")[1]
    row = next(line for line in table.splitlines() if line.startswith("| bc"))
    mean = sum(r["final_return"] for r in out["runs"]) / 3
    assert row.split(" | ")[1:] == ["mixed", f"{behaviour:.2f}", f"{mean:.2f}",
                                    f"{mean - behaviour:+.2f} |"]  # fmt: skip


def simple_dataset(folder: Path, episodes: int, noise: float, envs: int = 16) -> Manifest:
    """MPE `simple` with continuous actions: a scripted agent that steers at the landmark
    (damped by its velocity), taking uniformly random actions instead at a share `noise` of
    its steps (1.0: uniformly random play)."""
    params = {"continuous_actions": True}
    env = native_class("mpe/simple")(params, envs, torch.device("cpu"))
    manifest = Manifest("mpe/simple", "native", params, "marlctl", groups_of(env.info),
                        env.info.state_dim)  # fmt: skip
    writer = DatasetWriter(folder, manifest, limit=episodes)
    sources = torch.zeros(envs, dtype=torch.long)
    recording = Recording(env, env.info, EpisodeStager(envs, env.device, sources, writer.add))
    ob, draws = recording.reset(0), torch.Generator().manual_seed(0)
    while not writer.full:
        obs = ob.obs["agent"][:, 0]
        dx, dy = (obs[:, 2:] - 0.5 * obs[:, :2]).unbind(-1)
        steer = torch.stack([torch.zeros(envs), -dx, dx, -dy, dy], -1).clamp(0, 1)
        random = torch.rand(envs, 5, generator=draws)
        explore = torch.rand(envs, 1, generator=draws) < noise
        ob = recording.step({"agent": torch.where(explore, random, steer).unsqueeze(1)}).next
    return writer.close()


@pytest.mark.parametrize("algo", ["bc", "maddpg_cql"])
def test_continuous_offline_learners_beat_random_play_by_far(tmp_path, algo):
    # A dataset whose every other step is random scores about -13; random play about -38.
    # Each learner, from the noisy dataset alone, acts at least halfway from random play to
    # the dataset's score (both reach about -8 to -12 here).
    data = simple_dataset(tmp_path / "noisy", 200, noise=0.5)
    random = simple_dataset(tmp_path / "random", 200, noise=1.0)
    behaviour = sum(data.returns) / data.episodes
    chance = sum(random.returns) / random.episodes
    assert behaviour > chance + 15
    body = {"seeds": [0, 1, 2],
            "env": {"id": "mpe/simple", "backend": "native",
                    "params": {"continuous_actions": True}},
            "algo": {"name": algo, "batch_size": 128} | ({"ood_actions": 4} if "cql" in algo
                                                         else {}),
            "data": "noisy", "train": {"total_updates": 600, "eval_every": 0,
                                       "eval_episodes": 32},
            "hardware": {"num_envs": 16, "device": "cpu", "batch_seeds": True}}  # fmt: skip
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    finals = [r["final_return"] for r in out["runs"]]
    assert median(finals) > chance + 0.5 * (behaviour - chance), (finals, chance, behaviour)


def test_an_offline_spec_plans_gradient_steps_and_sweeps(mixed, tmp_path):
    body = spec("bc", str(mixed), total_updates=200, eval_every=100) | {"seeds": [0]}
    space = {"algo.lr": {"low": 1.0e-4, "high": 1.0e-2, "log": True}}
    body["sweep"] = {"trials": 2, "pruner": "hyperband", "space": space}
    path = str(write_spec(tmp_path, body))
    planned = run_json("run", path, "--dry-run")
    assert planned["plan"]["step_unit"] == "gradient steps"
    assert planned["plan"]["steps_per_iteration"] == 100  # algo.updates
    assert [r["total_env_steps"] for r in planned["plan"]["runs"]] == [200]
    swept = run_json("sweep", path)
    assert swept["exit_code"] == 0 and swept["counts"] == {"COMPLETE": 2}, swept


def test_a_dataset_logged_to_a_run_trains_from_its_uri(mixed, tmp_path):
    from marlctl.data.artifacts import cached_copy

    store = client()
    owner = store.create_run(store.create_experiment("datasets")).info.run_id
    logged = run_json("data", "log", str(mixed), "--run", owner[:8])
    assert logged["exit_code"] == 0, logged
    uri = logged["uri"]
    assert uri == f"runs:/{owner}/dataset"
    again = run_json("data", "log", str(mixed), "--run", owner)
    assert again["exit_code"] == 2 and "already holds artifacts there" in again["errors"][0]
    out = run_json("run", str(write_spec(tmp_path, spec("bc", uri, total_updates=50))))
    assert out["exit_code"] == 0, out
    returns = json.loads((mixed / "manifest.json").read_text())["returns"]
    for run in out["runs"]:
        assert store.get_run(run["run_id"]).data.params["data"] == uri
        assert store.get_run(run["run_id"]).data.metrics["data/return_mean"] == (
            pytest.approx(sum(returns) / len(returns), rel=1e-6)
        )
    # A store whose artifacts are not local files: downloaded whole once, then reused.
    copy = cached_copy(store, uri, tmp_path / "cache")
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in mixed.iterdir())
    stamp = (copy / "manifest.json").stat().st_mtime_ns
    assert cached_copy(store, uri, tmp_path / "cache") == copy
    assert (copy / "manifest.json").stat().st_mtime_ns == stamp


def test_a_runs_dataset_that_is_not_there_or_damaged_is_refused(mixed, tmp_path):
    store = client()
    owner = store.create_run(store.create_experiment("datasets")).info.run_id
    chunk = next(mixed.glob("chunk-*.pt"))
    whole = chunk.read_bytes()
    chunk.write_bytes(whole[:-5])
    refused = run_json("data", "log", str(mixed), "--run", owner, "--path", "damaged")
    assert refused["exit_code"] == 2 and "bytes where the manifest says" in refused["errors"][0]
    assert store.list_artifacts(owner, "damaged") == []
    chunk.write_bytes(whole)
    assert run_json("data", "log", str(mixed), "--run", owner)["exit_code"] == 0
    stored = Path(store.get_run(owner).info.artifact_uri.removeprefix("file://"))
    cases = {
        f"runs:/{'0' * 32}/dataset": f"no run {'0' * 32} in the tracking store",
        f"runs:/{owner}/elsewhere": "holds no dataset at 'elsewhere'",
        "runs:/1234/dataset": "with the whole 32-digit run id",
    }
    for uri, message in cases.items():
        out = run_json("validate", str(write_spec(tmp_path, spec("bc", uri))))
        assert out["exit_code"] == 2, (uri, out)
        assert " data: " in out["errors"][0] and message in out["errors"][0], out["errors"]
    (stored / "dataset" / chunk.name).write_bytes(whole[:-5])
    out = run_json("validate", str(write_spec(tmp_path, spec("bc", f"runs:/{owner}/dataset"))))
    assert out["exit_code"] == 2 and "bytes where the manifest says" in out["errors"][0], out


def test_the_dataset_sampler_draws_each_row_s_windows_through_the_trainer_s_stream():
    from marlctl.train.offline import DatasetSampler

    data = {"terminated": torch.zeros(50, dtype=torch.bool), "x": torch.arange(50)}

    def sampled(seeds: tuple[int, ...]) -> tuple[torch.Tensor, list]:
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        calls = []

        def uniform(shape, dtype):  # as `Trainer.noise` draws: a row per seed's generator
            calls.append((shape, dtype))
            return torch.stack([torch.rand(shape[1:], generator=g, dtype=dtype)
                                for g in generators])  # fmt: skip

        return DatasetSampler(data, "cpu", generators, uniform).sample(4000, length=3)["x"], calls

    x, calls = sampled((0, 1))
    assert calls == [(torch.Size((2, 4000)), torch.float64)]  # every draw through the trainer
    assert x.shape == (2, 3, 4000)
    assert torch.equal(x[:, 1] - x[:, 0], torch.ones(2, 4000, dtype=torch.long))
    assert torch.equal(x[:, 2] - x[:, 1], torch.ones(2, 4000, dtype=torch.long))
    assert int(x[:, 0].min()) == 0 and int(x[:, 0].max()) == 47  # every window, none past
    assert not torch.equal(x[0], x[1])  # each row its own stream
    again, _ = sampled((1, 0))
    assert torch.equal(again[0], x[1]) and torch.equal(again[1], x[0])


def random_spread_dataset(folder: Path, continuous: bool) -> tuple[dict, dict]:
    """Uniformly random play of native simple_spread (2 agents, 10 steps): its params and
    transitions."""
    from marlctl.data.reader import load_transitions

    params = {"N": 2, "max_cycles": 10, "continuous_actions": continuous}
    env = native_class("mpe/simple_spread")(params, 8, torch.device("cpu"))
    manifest = Manifest("mpe/simple_spread", "native", params, "marlctl", groups_of(env.info),
                        env.info.state_dim)  # fmt: skip
    writer = DatasetWriter(folder, manifest, limit=40)
    sources = torch.zeros(8, dtype=torch.long)
    recording = Recording(env, env.info, EpisodeStager(8, env.device, sources, writer.add))
    recording.reset(0)
    draws = torch.Generator().manual_seed(0)
    while not writer.full:
        act = torch.rand(8, 2, 5, generator=draws) if continuous else torch.randint(
            5, (8, 2), generator=draws)  # fmt: skip
        recording.step({"agent": act})
    writer.close()
    return params, load_transitions(folder)[1]


def offline_trainer(folder: Path, algo: str, device="cpu", seeds=(0, 1), model=None, **config):
    """`algo`'s trainer on `device` with a dataset of random simple_spread play loaded (made
    in `folder`, which must not hold one yet), the env it is evaluated on and the dataset."""
    from marlctl.spec.models import Spec
    from marlctl.train.runner import build_trainer

    continuous = algo == "maddpg_cql"
    params, data = random_spread_dataset(folder / f"random-{continuous}", continuous)
    env = native_class("mpe/simple_spread")(params, 4 * len(seeds), torch.device(device),
                                             seeds=len(seeds))  # fmt: skip
    spec = Spec.model_validate({
        "env": {"id": "mpe/simple_spread", "backend": "native", "params": params},
        "algo": {"name": algo, "batch_size": 32, **config},
        "model": {"hidden": [16], **(model or {})},
    })  # fmt: skip
    trainer = build_trainer(spec, env.info, 4, torch.device(device), 10, seeds)
    trainer.load_dataset(data)
    return trainer, env, data


@pytest.mark.parametrize("algo", ["qmix_cql", "maicq"])
def test_offline_targets_are_copied_every_n_gradient_steps_and_not_in_between(tmp_path, algo):
    trainer, env, _ = offline_trainer(tmp_path, algo, updates=1, target_update_every=3)
    ob = env.reset([0, 1])
    for step in range(1, 8):
        ob, _ = trainer.train_iteration(env, ob)
        online = torch.cat([p.flatten() for p in trainer.policies["online"].parameters()])
        target = torch.cat([p.flatten() for p in trainer.target.parameters()])
        assert trainer.updates == step
        assert torch.equal(online, target) == (step % 3 == 0), step


class Replay:
    """Stands in for a captured iteration on a CPU: it runs the iteration as it is, with the
    trainer set up as a capture sets it (the counts a replay reads kept on the device)."""

    calls = 0

    def run(self, fn):
        return fn()


@pytest.mark.parametrize("algo", ["bc", "qmix_cql", "maicq", "maddpg_cql"])
def test_an_offline_iteration_set_up_for_capture_computes_what_the_eager_one_does(tmp_path, algo):
    """The captured form's arithmetic (hard target copies by the device's count of gradient
    steps, as a lerp by 0 or 1) gives what the eager one does, copies crossing iterations."""
    runs = []
    for replayed in (False, True):
        trainer, env, _ = offline_trainer(tmp_path / str(replayed), algo, updates=2,
                                          **({} if algo in ("bc", "maddpg_cql")
                                             else {"target_update_every": 3}))  # fmt: skip
        if replayed:
            trainer.graph_counters()
            trainer.graph = Replay()
        for _ in range(5):
            trainer.train_iteration(env, None)
        runs.append(torch.cat([p.detach().flatten() for p in trainer.policies.parameters()]))
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize(
    ("algo", "config", "scaling"),
    [("qmix_cql", {}, "standardise"), ("maicq", {}, "clipped"), ("maddpg_cql", {}, "standardise"),
     ("maicq", {"state_scaling": "standardise"}, "standardise"),
     ("maicq", {"state_scaling": "range"}, "range"),
     ("qmix_cql", {"state_scaling": "clipped"}, "clipped"),
     ("qmix_cql", {"state_scaling": "none"}, None), ("iql_cql", {}, None)],
)  # fmt: skip
def test_the_centralised_learners_read_the_dataset_s_state_scaled(tmp_path, algo, config, scaling):
    trainer, _, data = offline_trainer(tmp_path, algo, **config)
    state, nxt = trainer.buffer.data["state"], trainer.buffer.data["next_state"]
    raw = data["state"]
    std, mean = torch.std_mean(raw, 0, correction=0)
    varying = std > 1e-6  # simple_spread's silent communication reads 0 throughout
    assert varying.sum() >= 16 and (~varying).any() and raw.abs().mean() > 0.1
    if scaling is None:
        assert torch.equal(state, raw) and torch.equal(nxt, data["next_state"])
        return
    if scaling == "clipped":  # standardised, bounded to STATE_CLIP standard deviations
        scale = torch.where(varying, std, 1.0)
        for key, scaled in (("state", state), ("next_state", nxt)):
            expected = ((data[key] - mean) / scale).clamp(-STATE_CLIP, STATE_CLIP)
            torch.testing.assert_close(scaled, expected)
        assert state.abs().amax() <= STATE_CLIP
        return
    if scaling == "standardise":
        torch.testing.assert_close(state.mean(0), torch.zeros_like(mean), atol=1e-4, rtol=0)
        torch.testing.assert_close(state.std(0, correction=0), varying.float(), atol=1e-4, rtol=0)
        centre, spread = mean, std
    else:  # each varying feature from -1 to 1 exactly, a constant one 0
        low, high = raw.amin(0), raw.amax(0)
        torch.testing.assert_close(state.amin(0), torch.where(varying, -1.0, 0.0))
        torch.testing.assert_close(state.amax(0), torch.where(varying, 1.0, 0.0))
        centre, spread = (high + low) / 2, (high - low) / 2
    scale = torch.where(varying, spread, 1.0)
    torch.testing.assert_close(nxt, (data["next_state"] - centre) / scale)  # the same statistics


def test_maicq_s_target_counts_an_agent_inactive_at_the_next_step_as_zero(tmp_path):
    # As Q_tot does at the step itself: the Q of an agent that no longer acts is never
    # trained, so what it reads must not reach the target.
    trainer, _, _ = offline_trainer(tmp_path, "maicq")
    batch = trainer.sampled_batch()
    (name,) = trainer.groups
    batch[f"active/{name}"][:, 1, :, 0] = False
    noisy = dict(batch)
    noisy[f"obs/{name}"] = batch[f"obs/{name}"].clone()
    noisy[f"obs/{name}"][:, 1, :, 0] += 5 * torch.randn_like(noisy[f"obs/{name}"][:, 1, :, 0])
    target = trainer._target(batch, trainer._agents(batch))
    assert torch.equal(trainer._target(noisy, trainer._agents(noisy)), target)
    noisy[f"obs/{name}"][:, 1, :, 1] += 5  # an agent still acting there does count
    assert not torch.allclose(trainer._target(noisy, trainer._agents(noisy)), target)


def test_a_state_feature_constant_in_the_dataset_reads_zero():
    from marlctl.train.offline import scaled_state

    state = torch.tensor([[1.0, 5.0], [3.0, 5.0]])
    out = scaled_state({"state": state, "next_state": torch.tensor([[2.0, 6.0]])}, "standardise")
    assert torch.equal(out["state"], torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
    assert torch.equal(out["next_state"], torch.tensor([[0.0, 1.0]]))  # centred only


def test_clipped_scaling_bounds_a_standardised_state_feature_s_tail():
    from marlctl.train.offline import scaled_state

    # one 1 among 36 zeros: the 1 stands sqrt(36) = 6 standard deviations out
    state = torch.zeros(37, 2)
    state[0, 0] = 1.0
    out = scaled_state({"state": state, "next_state": torch.tensor([[-1.0, 0.0]])}, "clipped")
    assert STATE_CLIP == 5.0
    torch.testing.assert_close(out["state"][:, 0], torch.tensor([5.0] + [-1 / 6] * 36))
    assert torch.equal(out["state"][:, 1], torch.zeros(37))  # constant: 0
    # -1 is (-1 - 1/37) / (6/37) = -38/6 standard deviations out: bounded as well
    torch.testing.assert_close(out["next_state"], torch.tensor([[-5.0, 0.0]]))
    unclipped = scaled_state({"state": state, "next_state": state[:1]}, "standardise")
    torch.testing.assert_close(unclipped["state"][0, 0], torch.tensor(6.0))


def test_range_scaling_maps_each_state_feature_s_extremes_to_plus_and_minus_one():
    from marlctl.train.offline import scaled_state

    state = torch.tensor([[0.0, 5.0, -4.0], [10.0, 5.0, 0.0], [1.0, 5.0, 60.0]])
    out = scaled_state({"state": state, "next_state": torch.tensor([[5.0, 7.0, 28.0]])}, "range")
    assert torch.equal(out["state"], torch.tensor([[-1.0, 0.0, -1.0], [1.0, 0.0, -0.875],
                                                   [-0.8, 0.0, 1.0]]))  # fmt: skip
    # next_state by the same statistics; a constant feature only centred
    assert torch.equal(out["next_state"], torch.tensor([[0.0, 2.0, 0.0]]))
