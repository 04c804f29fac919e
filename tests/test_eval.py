"""`marlctl eval`: repeat a run's final evaluation, choose the weights, render episodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from PIL import Image
from test_training import client, run_cli, run_json, write_spec

MAX_CYCLES = 10


def spec_body(backend: str = "native", seeds: list[int] | None = None) -> dict:
    return {
        "seeds": seeds or [0, 1],
        "env": {
            "id": "mpe/simple_spread",
            "backend": backend,
            "params": {"N": 2, "max_cycles": MAX_CYCLES},
        },
        "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 2, "minibatches": 2},
        # 40 episodes over 32 eval envs: some envs play two episodes.
        "train": {"total_env_steps": 4000, "eval_every": 0, "eval_episodes": 40},
        "hardware": {"num_envs": 20, "device": "cpu"},
    }


@pytest.fixture
def trained(tmp_path) -> dict:
    out = run_json("run", str(write_spec(tmp_path, spec_body())))
    assert out["exit_code"] == 0, out
    return out


def test_eval_sampled_acts_as_in_training_beside_the_run_s_sampled_evaluation(tmp_path):
    body = spec_body()
    body["train"]["eval_sampled"] = True
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    sampled = run_json("eval", out["parent_run_id"], "--sampled")
    assert sampled["exit_code"] == 0, sampled
    greedy = run_json("eval", out["parent_run_id"])
    for row, plain in zip(sampled["runs"], greedy["runs"], strict=True):
        assert row["sampled"] and not plain["sampled"] and row["episodes"] == 40
        logged = client().get_run(row["run_id"]).data.metrics
        # compared with the run's own sampled evaluation, not its deterministic one
        assert row["logged_return"] == logged["eval_sampled/return_mean"]
        assert plain["logged_return"] == logged["eval/return_mean"]
    # the sampled episodes are other episodes than the most probable actions play
    assert [r["return_mean"] for r in sampled["runs"]] != [r["return_mean"] for r in greedy["runs"]]
    again = run_json("eval", out["parent_run_id"], "--sampled")  # seeded: the same draws
    assert [r["return_mean"] for r in again["runs"]] == [r["return_mean"] for r in sampled["runs"]]
    # a scenario's logged score stays the most probable actions'
    refused = run_json("eval", out["parent_run_id"], "--sampled", "--scenario", "x")
    assert refused["exit_code"] == 2 and "--sampled" in refused["errors"][0], refused


def test_eval_repeats_the_final_evaluation_of_each_seed(trained):
    result = run_json("eval", trained["parent_run_id"])
    assert result["exit_code"] == 0, result
    assert [r["seed"] for r in result["runs"]] == [0, 1]
    logged = {r["run_id"]: r["final_return"] for r in trained["runs"]}
    for row in result["runs"]:
        assert row["episodes"] == 40 and row["checkpoint"] == "policy/final.pt"
        # Same weights, episodes, env layout and seed stream as training's final eval.
        assert row["return_mean"] == pytest.approx(logged[row["run_id"]], abs=1e-5)
        assert row["logged_return"] == pytest.approx(logged[row["run_id"]], abs=1e-6)
    # The two seeds' evaluations use different episodes.
    assert len({r["eval_seed"] for r in result["runs"]}) == 2
    other = run_json("eval", trained["runs"][0]["run_id"], "--seed", "12345")
    assert other["runs"][0]["eval_seed"] == 12345


def test_eval_repeats_a_pettingzoo_run(tmp_path):
    out = run_json("run", str(write_spec(tmp_path, spec_body("pettingzoo", [3]))))
    assert out["exit_code"] == 0, out
    (row,) = run_json("eval", out["runs"][0]["run_id"])["runs"]
    assert row["backend"] == "pettingzoo"
    assert row["return_mean"] == pytest.approx(out["runs"][0]["final_return"], abs=1e-5)


class Hostile:
    """Unpickled, it would create the file at `path`."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_eval_chooses_weights(trained, tmp_path):
    run_id = trained["runs"][0]["run_id"]
    final = trained["runs"][0]["final_return"]
    # The latest checkpoint is written at the end of training: the same policy.
    latest = run_json("eval", run_id, "--checkpoint", "latest")["runs"][0]
    assert latest["checkpoint"] == "checkpoints/latest.pt"
    assert latest["return_mean"] == pytest.approx(final, abs=1e-5)
    local = Path(client().download_artifacts(run_id, "policy/final.pt", str(tmp_path)))
    from_file = run_json("eval", run_id, "--checkpoint", str(local))["runs"][0]
    assert from_file["checkpoint"] == str(local)
    assert from_file["return_mean"] == pytest.approx(final, abs=1e-5)

    missing = run_cli("eval", run_id, "--checkpoint", "checkpoints/step_9.pt")
    assert missing.exit_code == 2
    assert "--checkpoint: 'checkpoints/step_9.pt' is neither an artifact" in missing.output
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    junk = run_cli("eval", run_id, "--checkpoint", str(tmp_path / "junk.pt"))
    assert junk.exit_code == 2 and "not a PyTorch checkpoint of tensors" in junk.output
    import pickle

    import torch

    # A pickle that would run code when loaded: weights_only refuses it, and nothing runs.
    marker = tmp_path / "ran"
    torch.save({"policies": Hostile(str(marker))}, tmp_path / "hostile.pt", pickle_module=pickle)
    hostile = run_cli("eval", run_id, "--checkpoint", str(tmp_path / "hostile.pt"))
    assert hostile.exit_code == 2 and "cannot load" in hostile.output
    assert "Traceback" not in hostile.output and not marker.exists()
    assert "weights_only" not in hostile.output  # PyTorch's advice to load it unsafely

    torch.save({"policies": {"actor.w": torch.zeros(3)}}, tmp_path / "other.pt")
    other = run_cli("eval", run_id, "--checkpoint", str(tmp_path / "other.pt"))
    assert other.exit_code == 2 and "Traceback" not in other.output
    assert "does not fit this run's networks" in other.output


def test_eval_on_cpu_of_a_run_placed_on_a_gpu(trained, tmp_path):
    """A run's spec names the GPU it trained on; eval runs where it is told (CPU here)."""
    run_id = trained["runs"][1]["run_id"]
    store = client()
    spec = yaml.safe_load(
        Path(store.download_artifacts(run_id, "spec.yaml", str(tmp_path))).read_text()
    )
    spec["hardware"] = {**spec["hardware"], "device": "cuda:1", "devices": ["cuda:1"]}
    folder = tmp_path / "gpu"
    folder.mkdir()
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    store.log_artifact(run_id, str(folder / "spec.yaml"))
    store.set_tag(run_id, "marlctl.device", "cuda:1")
    row = run_json("eval", run_id)["runs"][0]
    assert row["return_mean"] == pytest.approx(trained["runs"][1]["final_return"], abs=1e-5)


def gif_duration_ms(path: Path) -> tuple[int, tuple[int, int]]:
    image = Image.open(path)
    total = 0
    for index in range(image.n_frames):
        image.seek(index)
        total += image.info["duration"]
    return total, image.size


def test_render_writes_a_gif_of_whole_episodes(trained, tmp_path):
    run_id = trained["runs"][0]["run_id"]
    result = run_json(
        "eval", run_id, "--render", "play.gif", "--render-episodes", "2", "--fps", "20"
    )
    assert result["exit_code"] == 0, result
    assert result["runs"][0]["video"] == "play.gif"
    # Each episode: its first state and one frame per step (Pillow merges repeated frames
    # into longer ones, so count time, not frames).
    duration, size = gif_duration_ms(Path("play.gif"))
    assert duration == 2 * (MAX_CYCLES + 1) * 50
    assert size == (700, 700)
    # A parent run renders one video per seed.
    both = run_json("eval", trained["parent_run_id"], "--render", "all.gif")
    assert [r["video"] for r in both["runs"]] == ["all-seed0.gif", "all-seed1.gif"]
    assert all(Path(p).stat().st_size > 1000 for p in ("all-seed0.gif", "all-seed1.gif"))


def test_render_writes_an_mp4(trained):
    ffmpeg = pytest.importorskip("imageio_ffmpeg", reason="the video extra is not installed")
    run_id = trained["runs"][0]["run_id"]
    result = run_json("eval", run_id, "--render", "play.mp4", "--backend", "pettingzoo")
    assert result["exit_code"] == 0, result
    data = Path("play.mp4").read_bytes()
    assert data[4:8] == b"ftyp"
    frames, _ = ffmpeg.count_frames_and_secs("play.mp4")
    assert frames == MAX_CYCLES + 1


@pytest.mark.parametrize(
    ("target", "message"),
    [("play.avi", "write a .gif or an .mp4"), ("nowhere/play.gif", "no folder 'nowhere'")],
)
def test_bad_render_targets_fail_before_evaluating(trained, target, message):
    result = run_cli("eval", trained["runs"][0]["run_id"], "--render", target)
    assert result.exit_code == 2, result.output
    assert "--render: " in result.output and message in result.output
    assert not Path(target).exists()


def test_run_ids_can_be_shortened_to_an_unambiguous_prefix(trained):
    ids = [r["run_id"] for r in trained["runs"]] + [trained["parent_run_id"]]
    seed = trained["runs"][0]["run_id"]
    # The shortest prefix of the seed's id that no other run shares.
    prefix = next(
        seed[:n] for n in range(4, 33) if not any(o.startswith(seed[:n]) for o in ids if o != seed)
    )
    result = run_json("eval", prefix)
    assert result["exit_code"] == 0, result
    assert [r["run_id"] for r in result["runs"]] == [seed]
    for bad, message in (
        ("xyz", "'xyz' is not a run id or the start of one"),
        ("0000000", "no run id starts with '0000000'"),
    ):
        out = run_cli("eval", bad)
        assert out.exit_code == 2 and message in out.output and "Traceback" not in out.output
    # Two runs sharing a prefix are both listed: make runs until two ids share 4 digits.
    store = client()
    experiment = store.get_run(seed).info.experiment_id
    seen = {run_id[:4]: run_id for run_id in ids}
    while True:
        run_id = store.create_run(experiment).info.run_id
        if run_id[:4] in seen:
            break
        seen[run_id[:4]] = run_id
    out = run_cli("eval", run_id[:4])
    assert out.exit_code == 2, out.output
    assert run_id in out.output and seen[run_id[:4]] in out.output
    assert "type more of it" in out.output
