"""Datasets for offline training: recorded from a run's episodes (`marlctl eval --record`),
read back whole and checked, described, split by quality and merged (`marlctl data`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_eval import MAX_CYCLES, spec_body
from test_training import run_json, write_spec

from marlctl.data import writer
from marlctl.data.format import DatasetError, Manifest, read_manifest
from marlctl.data.reader import load_transitions
from marlctl.data.writer import STAGE_STEPS, DatasetWriter, EpisodeStager, Recording
from marlctl.envs.batch import Observation, Transition
from marlctl.envs.info import EnvInfo, GroupInfo

# ---------------------------------------------------------------- a synthetic env

AGENTS, OBS = 2, 3


class Counting:
    """Env e's episodes last `lengths[e]` steps (longer than the staging block for some):
    its observation is (env, episode, step) for every agent, its reward 1 per agent-step."""

    def __init__(self, lengths: list[int]):
        self.lengths = torch.tensor(lengths)
        self.num_envs, self.device = len(lengths), torch.device("cpu")
        group = GroupInfo("agents", ("a_0", "a_1"), (OBS,), "float32", True, 4)
        self.info = EnvInfo("test/counting", "test", (group,), 2, True)

    def _ob(self) -> Observation:
        values = torch.stack([torch.arange(self.num_envs), self.episode, self.step_], -1)
        obs = values.float()[:, None, :].expand(-1, AGENTS, -1).clone()
        active = {"agents": torch.ones(self.num_envs, AGENTS, dtype=torch.bool)}
        return Observation({"agents": obs}, values[:, :2].float(), {"agents": None}, active)

    def reset(self, seed) -> Observation:
        self.episode = torch.zeros(self.num_envs, dtype=torch.long)
        self.step_ = torch.zeros(self.num_envs, dtype=torch.long)
        return self._ob()

    def step(self, actions) -> Transition:
        self.step_ += 1
        done = self.step_ == self.lengths
        final = self._ob()
        self.episode += done.long()
        self.step_[done] = 0
        rewards = {"agents": torch.ones(self.num_envs, AGENTS)}
        truncated = done & (torch.arange(self.num_envs) % 2 == 0)
        return Transition(self._ob(), rewards, done & ~truncated, truncated, final)

    def close(self) -> None:
        pass


def manifest_for(info: EnvInfo) -> Manifest:
    from marlctl.data.format import groups_of

    return Manifest(info.id, "native", {}, "test", groups_of(info), info.state_dim)


def record_counting(folder: Path, lengths: list[int], steps: int, **writer) -> Manifest:
    env = Counting(lengths)
    out = DatasetWriter(folder, manifest_for(env.info), **writer)
    sources = torch.arange(env.num_envs) % 2
    wrapped = Recording(env, env.info, EpisodeStager(env.num_envs, env.device, sources, out.add))
    wrapped.reset(0)
    for _ in range(steps):
        wrapped.step({"agents": torch.zeros(env.num_envs, AGENTS, dtype=torch.long)})
    return out.close()


def test_every_episode_is_recorded_whole_and_in_order(tmp_path):
    lengths = [3, 5, STAGE_STEPS + 7, 2 * STAGE_STEPS + 1]  # two longer than the block
    steps = 4 * STAGE_STEPS
    manifest = record_counting(tmp_path / "d", lengths, steps, chunk_transitions=50)
    assert len(manifest.chunks) > 2  # chunks of at least 50 transitions
    expected = sum(steps // n for n in lengths)
    assert manifest.episodes == expected
    _, data = load_transitions(tmp_path / "d")
    obs = data["obs/agents"][:, 0]  # (env, episode, step)
    starts = data["first"].nonzero().flatten().tolist() + [len(obs)]
    seen: dict[int, list[int]] = {}
    for begin, end in zip(starts[:-1], starts[1:], strict=True):
        env, episode = int(obs[begin, 0]), int(obs[begin, 1])
        seen.setdefault(env, []).append(episode)
        # One env's one episode, every step in order, from its first to its last.
        assert obs[begin:end, 0].eq(env).all() and obs[begin:end, 1].eq(episode).all()
        assert obs[begin:end, 2].tolist() == list(range(lengths[env]))
        # The next observation: the following step's, and the final one at the end.
        assert data["next_obs/agents"][begin : end - 1].equal(data["obs/agents"][begin + 1 : end])
        assert data["next_obs/agents"][end - 1, 0].tolist() == [env, episode, lengths[env]]
        assert data["next_state"][end - 1].tolist() == [env, episode]
        ended = data["terminated"][begin:end] | data["truncated"][begin:end]
        assert ended.tolist() == [False] * (lengths[env] - 1) + [True]
        assert bool(data["truncated"][end - 1]) == (env % 2 == 0)
    # Every env's episodes, none lost or repeated, in the order they were played.
    assert {e: sorted(v) for e, v in seen.items()} == {
        e: list(range(steps // n)) for e, n in enumerate(lengths)
    }
    assert manifest.returns == pytest.approx(
        [float(lengths[int(data["obs/agents"][b, 0, 0])]) for b in starts[:-1]]
    )


def test_a_writer_stops_at_its_episode_limit(tmp_path):
    manifest = record_counting(tmp_path / "d", [4, 4, 6], 40, limit=7)
    assert manifest.episodes == 7
    _, data = load_transitions(tmp_path / "d")
    assert int(data["first"].sum()) == 7


def test_a_damaged_dataset_is_refused_by_path(tmp_path):
    folder = tmp_path / "d"
    manifest = record_counting(folder, [5, 5], 50, chunk_transitions=20)
    chunk = folder / manifest.chunks[1].file
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match=f"{chunk}: its SHA-256 differs"):
        load_transitions(folder)
    chunk.write_bytes(bytes(raw[:-10]))
    with pytest.raises(DatasetError, match="truncated or replaced"):
        load_transitions(folder)
    chunk.unlink()
    with pytest.raises(DatasetError, match="missing: the manifest lists it"):
        load_transitions(folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(DatasetError, match="its writing did not finish"):
        read_manifest(folder)
    result = run_json("data", "describe", str(folder))
    assert result["exit_code"] == 2
    assert "its writing did not finish" in result["errors"][0]


def test_a_writer_refuses_a_folder_with_files(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("")
    with pytest.raises(DatasetError, match="exists and is not empty"):
        record_counting(tmp_path / "d", [3], 9)


def test_split_cuts_at_return_quantiles_and_keeps_episodes_whole(tmp_path):
    # Episodes of many lengths: their returns (the length) spread out.
    record_counting(tmp_path / "d", [2, 3, 5, 7, 11, 13], 300, chunk_transitions=100)
    result = run_json("data", "split", str(tmp_path / "d"), "--out", str(tmp_path / "q"))
    assert result["exit_code"] == 0, result
    by_name = {r["name"]: r for r in result["datasets"]}
    assert list(by_name) == ["poor", "medium", "good"]
    total = read_manifest(tmp_path / "d")
    assert sum(r["episodes"] for r in by_name.values()) == total.episodes
    assert sum(r["transitions"] for r in by_name.values()) == total.transitions
    ranges = []
    for name in by_name:
        manifest, data = load_transitions(tmp_path / "q" / name)
        ranges.append((min(manifest.returns), max(manifest.returns)))
        lengths = data["obs/agents"][data["first"], 0, 0].long()
        # Whole episodes: each one's return is its env's episode length.
        assert manifest.returns == [float([2, 3, 5, 7, 11, 13][e]) for e in lengths]
    assert ranges[0][1] <= ranges[1][0] and ranges[1][1] <= ranges[2][0]
    assert ranges[0][0] < ranges[1][1] < ranges[2][1]
    # Thirds of the episodes, by rank.
    for row in by_name.values():
        assert abs(row["episodes"] - total.episodes / 3) <= 1
    described = run_json("data", "describe", str(tmp_path / "q" / "good"))
    assert described["episodes"] == by_name["good"]["episodes"]
    assert sum(b["episodes"] for b in described["histogram"]) == described["episodes"]
    listed = run_json("data", "list", str(tmp_path))
    assert len(listed["datasets"]) == 4


def test_merge_joins_datasets_of_one_env_and_refuses_others(tmp_path):
    a = record_counting(tmp_path / "a", [3, 4], 24)
    b = record_counting(tmp_path / "b", [5], 25)
    result = run_json("data", "merge", str(tmp_path / "a"), str(tmp_path / "b"),
                      "--out", str(tmp_path / "m"))  # fmt: skip
    assert result["exit_code"] == 0, result
    merged, data = load_transitions(tmp_path / "m")
    assert merged.returns == a.returns + b.returns
    assert len(merged.sources) == len(a.sources) + len(b.sources)
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    manifest["env_id"] = "test/other"
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(manifest))
    refused = run_json("data", "merge", str(tmp_path / "a"), str(tmp_path / "b"),
                       "--out", str(tmp_path / "n"))  # fmt: skip
    assert refused["exit_code"] == 2
    assert "env 'test/other', not 'test/counting'" in refused["errors"][0]
    assert not (tmp_path / "n").exists()


# ---------------------------------------------------------------- recording a run


@pytest.fixture
def trained(tmp_path) -> dict:
    out = run_json("run", str(write_spec(tmp_path, spec_body())))
    assert out["exit_code"] == 0, out
    return out


def test_eval_records_the_episodes_it_scores(trained, tmp_path):
    folder = tmp_path / "data" / "expert"
    (tmp_path / "data").mkdir()
    result = run_json("eval", trained["parent_run_id"], "--record", str(folder))
    assert result["exit_code"] == 0, result
    assert result["dataset"]["episodes"] == 80  # 40 per seed run
    manifest, data = load_transitions(folder)
    assert manifest.env_id == "mpe/simple_spread" and manifest.backend == "native"
    assert [s.run_id for s in manifest.sources] == [r["run_id"] for r in result["runs"]]
    assert {s.mode for s in manifest.sources} == {"deterministic"}
    (group,) = [g["name"] for g in manifest.groups]
    assert data[f"obs/{group}"].shape[1:] == (2, 12)
    assert data["state"].abs().sum() > 0  # the global state is recorded, not left zeros
    returns = torch.tensor(manifest.returns)
    chunks = [torch.load(folder / c.file, weights_only=True) for c in manifest.chunks]
    source = torch.cat([c["episode/source"] for c in chunks])
    # The recorded episodes are the ones the evaluation counted: the same mean return.
    for index, row in enumerate(result["runs"]):
        assert float(returns[source == index].mean()) == pytest.approx(row["return_mean"],
                                                                          abs=1e-4)  # fmt: skip
    # Each episode's return: its rewards summed over its steps, then averaged over agents.
    episode = torch.cumsum(data["first"].long(), 0) - 1
    summed = torch.zeros(len(returns), 2).index_add_(0, episode, data[f"reward/{group}"])
    assert summed.mean(-1) == pytest.approx(returns, abs=1e-4)


def test_eval_refuses_a_dataset_folder_in_use_and_records_sampled_actions(trained, tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("")
    run_id = trained["parent_run_id"]
    result = run_json("eval", run_id, "--record", str(tmp_path / "used"))
    assert result["exit_code"] == 2 and "--record" in result["errors"][0]
    sampled = run_json("eval", run_id, "--record", str(tmp_path / "s"), "--sampled")
    assert sampled["exit_code"] == 0, sampled
    assert {s.mode for s in read_manifest(tmp_path / "s").sources} == {"sampled"}


def record_spec(tmp_path, folder: str) -> Path:
    body = spec_body()
    body["train"]["record"] = folder
    body["hardware"]["batch_seeds"] = True
    return write_spec(tmp_path, body, "record.yaml")


def test_a_run_records_what_its_training_collects_one_dataset_per_seed(tmp_path, monkeypatch):
    monkeypatch.setattr("marlctl.data.writer.CHUNK_TRANSITIONS", 1000)
    out = run_json("run", str(record_spec(tmp_path, "replay")))
    assert out["exit_code"] == 0, out
    steps = spec_body()["train"]["total_env_steps"]
    for run in out["runs"]:
        folder = tmp_path / "replay" / f"seed-{run['seed']}"
        manifest, data = load_transitions(folder)
        assert [(s.run_id, s.mode) for s in manifest.sources] == [(run["run_id"], "training")]
        # Every step of every env, in whole episodes of `max_cycles` steps.
        assert manifest.transitions == steps and manifest.episodes == steps // MAX_CYCLES
        assert len(manifest.chunks) == 4
        assert data["state"].abs().sum() > 0
    # A second run would write over them: refused before it trains.
    again = run_json("validate", str(record_spec(tmp_path, "replay")))
    assert again["exit_code"] == 2 and "train.record" in again["errors"][0]


def test_a_run_that_fails_leaves_no_dataset(tmp_path, monkeypatch):
    from marlctl.train.ppo import PPOTrainer

    calls = {"n": 0}
    train = PPOTrainer.train_iteration

    def failing(self, env, ob):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("boom")
        return train(self, env, ob)

    monkeypatch.setattr(PPOTrainer, "train_iteration", failing)
    monkeypatch.setattr("marlctl.data.writer.CHUNK_TRANSITIONS", 100)
    written = []

    def write_chunk(*args, write=writer.write_chunk):
        written.append(write(*args))
        return written[-1]

    monkeypatch.setattr("marlctl.data.writer.write_chunk", write_chunk)
    out = run_json("run", str(record_spec(tmp_path, "replay")))
    assert calls["n"] == 5 and out["exit_code"] == 1
    assert "boom" in out["runs"][0]["error"]
    assert written  # chunks were written before it failed; they are gone
    assert not (tmp_path / "replay").exists() or not any((tmp_path / "replay").iterdir())


def test_kept_policies_record_datasets_of_rising_skill(tmp_path):
    body = spec_body(seeds=[0])
    body["train"] |= {"checkpoint_every": 1000, "keep_policies": True}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    run_id = out["runs"][0]["run_id"]
    from test_training import client

    names = {f.path for f in client().list_artifacts(run_id, "policy")}
    assert names == {"policy/final.pt", *(f"policy/step-{n}.pt" for n in (1000, 2000, 3000, 4000))}
    early = run_json("eval", run_id, "--checkpoint", "policy/step-1000.pt", "--record", "early")
    assert early["exit_code"] == 0, early
    assert read_manifest(tmp_path / "early").sources[0].checkpoint == "policy/step-1000.pt"


# ---------------------------------------------------------------- Off-the-Grid MARL's Vaults


def write_vault(folder: Path, leaves: dict, written: int) -> None:
    """A Vault as flashbax 0.1 writes one: metadata.json with the experience's structure, and
    each leaf a zarr array (time axis of 10^13 steps) in a TensorStore OCDBT database."""
    ts = pytest.importorskip("tensorstore")

    def nest(values: dict) -> dict:
        tree: dict = {}
        for name, value in values.items():
            *parents, leaf = name.rstrip(".").split(".")
            node = tree
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value
        return tree

    folder.mkdir(parents=True)
    shapes = {n: str((a.shape[0], a.shape[1], *a.shape[2:])) for n, a in leaves.items()}
    dtypes = {n: a.dtype.name for n, a in leaves.items()}
    metadata = {"version": 1.2, "structure_shape": nest(shapes), "structure_dtype": nest(dtypes)}
    (folder / "metadata.json").write_text(json.dumps(metadata))

    def store(name: str, shape, dtype):
        kvstore = {"driver": "ocdbt", "base": f"file://{folder}", "path": name}
        spec = {"driver": "zarr", "metadata": {"compressor": {"id": "gzip", "level": 5}},
                "kvstore": kvstore}  # fmt: skip
        return ts.open(spec, create=True, shape=shape, dtype=dtype).result()

    for name, array in leaves.items():
        target = store(name, (array.shape[0], int(10e12), *array.shape[2:]), array.dtype.name)
        target[:, : array.shape[1]].write(array).result()
    store("vault_index", (1,), "int32").write(np.array([written], dtype=np.int32)).result()


def climbing_vault(folder: Path, written: int = 30) -> dict:
    """Two streams of climbing games in episodes of 1 to 4 steps, the last unfinished."""
    draws = np.random.default_rng(0)
    B, T, N = 2, 32, 2
    actions = draws.integers(0, 3, (B, T, N)).astype(np.int32)
    table = np.array([[11.0, -30.0, 0.0], [-30.0, 7.0, 6.0], [0.0, 0.0, 5.0]], np.float32)
    reward = table[actions[..., 0], actions[..., 1]]
    ends = np.zeros((B, T), bool)
    ends[:, [0, 3, 5, 9, 10, 14, 17, 21, 24, 26]] = True  # no end after step 26
    cut = ends & (np.arange(T) % 2 == 1)  # time limits at odd steps, terminations at even
    leaves = {
        "observations.": draws.random((B, T, N, 1)).astype(np.float32),
        "actions.": actions,
        "rewards.": np.repeat(reward[..., None], N, -1),
        "terminals.": np.repeat((ends & ~cut)[..., None], N, -1).astype(np.float32),
        "truncations.": np.repeat(cut[..., None], N, -1).astype(np.float32),
        "infos.state.": draws.random((B, T, 1)).astype(np.float32),
    }
    write_vault(folder, leaves, written)
    return {name: array[:, :written] for name, array in leaves.items()}


def test_an_og_marl_vault_converts_into_a_dataset_that_trains(tmp_path):
    vault = tmp_path / "vaults" / "matrix" / "climbing.vlt" / "Good"
    leaves = climbing_vault(vault)
    out = run_json("data", "import", str(vault), "--env", "matrix/climbing", "--out", "good")
    assert out["exit_code"] == 0, out
    manifest, data = load_transitions(tmp_path / "good")
    # Ten episodes per stream end by step 26; the steps after it are an unfinished one.
    assert manifest.episodes == 20 and manifest.transitions == 2 * 27
    assert data["obs/player"].shape == (54, 2, 1)
    expected = torch.as_tensor(leaves["observations."][:, :27]).flatten(0, 1)
    assert torch.equal(data["obs/player"], expected)
    assert torch.equal(
        data["action/player"], torch.as_tensor(leaves["actions."][:, :27]).flatten(0, 1).long()
    )
    ended = torch.as_tensor(leaves["terminals."][:, :27, 0] + leaves["truncations."][:, :27, 0])
    assert torch.equal(data["terminated"] | data["truncated"], ended.flatten() > 0)
    assert torch.equal(
        data["truncated"], torch.as_tensor(leaves["truncations."][:, :27, 0]).flatten() > 0
    )
    rewards = torch.as_tensor(leaves["rewards."][:, :27]).flatten(0, 1)
    episode = torch.cumsum(data["first"].long(), 0) - 1
    summed = torch.zeros(20, 2).index_add_(0, episode, rewards).mean(-1)
    assert torch.tensor(manifest.returns) == pytest.approx(summed)
    body = {"seeds": [0], "env": {"id": "matrix/climbing", "backend": "native"},
            "algo": {"name": "bc", "batch_size": 16, "updates": 10}, "data": "good",
            "train": {"total_updates": 20, "eval_every": 0, "eval_episodes": 4},
            "hardware": {"num_envs": 4, "device": "cpu"}}  # fmt: skip
    trained = run_json("run", str(write_spec(tmp_path, body)))
    assert trained["exit_code"] == 0, trained


def test_a_vault_that_does_not_fit_the_env_is_refused(tmp_path):
    vault = tmp_path / "v"
    climbing_vault(vault)
    out = run_json("data", "import", str(vault), "--env", "mpe/simple_spread", "--out", "x")
    assert out["exit_code"] == 2
    assert "observations (2, 1) per step; mpe/simple_spread has 3 agents of 18" in out["errors"][0]
    assert not (tmp_path / "x").exists()
    (vault / "metadata.json").write_text("{}")
    out = run_json("data", "import", str(vault), "--env", "matrix/climbing", "--out", "x")
    assert out["exit_code"] == 2 and "not a flashbax Vault's metadata" in out["errors"][0]
