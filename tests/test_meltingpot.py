"""Melting Pot (`meltingpot/<substrate>`): the adapter against a stand-in with the package's
interface and timestep structure (`tests/standins/meltingpot`), and against the package
itself where it is installed. A policy trained on a substrate plays one of its scenarios as
the focal population, and the focal per-capita return reaches the run and the report."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
from test_training import client, run_cli, run_json, write_spec

from marlctl.envs import families
from marlctl.envs.registry import env_params, lookup

STANDINS = Path(__file__).parent / "standins"


def _real_meltingpot() -> bool:
    try:
        module = importlib.import_module("meltingpot")
    except ImportError:
        return False
    return not getattr(module, "STANDIN", False)


REAL = _real_meltingpot()


@pytest.fixture
def standin(monkeypatch):
    """The stand-in as `meltingpot`, for this test only."""
    for name in [m for m in sys.modules if m == "meltingpot" or m.startswith("meltingpot.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(STANDINS))
    importlib.invalidate_caches()
    yield
    for name in [m for m in sys.modules if m == "meltingpot" or m.startswith("meltingpot.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def test_every_substrate_is_an_id_with_a_preset_and_the_package_extra():
    ids = [e for e in families.ENVS if e.startswith("meltingpot/")]
    assert len(ids) == len(families.MELTINGPOT_SUBSTRATES) == 49
    entry = lookup("meltingpot/commons_harvest__open")
    assert entry.kwargs == (("substrate", "commons_harvest__open"),)
    assert entry.requires == ("meltingpot",) and entry.extra == "meltingpot"
    presets = Path(__file__).parent.parent / "envs"
    for name in families.MELTINGPOT_SUBSTRATES:
        assert f"id: meltingpot/{name}\n" in (presets / f"{name}.yaml").read_text()
    with pytest.raises(ValueError, match="unknown env"):
        lookup("meltingpot/no_such_substrate")


@pytest.mark.skipif(
    not REAL, reason="dm-meltingpot is not installed (pip install 'marlctl[meltingpot]')"
)
def test_the_listed_substrates_are_the_packages():
    from meltingpot import substrate

    assert set(families.MELTINGPOT_SUBSTRATES) == set(substrate.SUBSTRATES)


def test_the_adapter_is_a_parallel_env_of_frames_with_the_world_as_state(standin):
    from pettingzoo.test import parallel_api_test

    from marlctl.envs.meltingpot import make

    env = make("commons_harvest__open")
    parallel_api_test(env, num_cycles=40)
    obs, _ = env.reset(seed=3)
    assert env.agents == [f"player_{i}" for i in range(7)]
    assert obs["player_0"].shape == (40, 40, 3) and obs["player_0"].dtype == np.uint8
    state = env.state()
    assert state.shape == env.state_space.shape == (6, 6, 3)  # one value per cell: a frame
    world = env._env._timestep(0, np.zeros(7)).observation[0]["WORLD.RGB"]
    assert np.allclose(state, world[::8, ::8] / 255.0)  # 8x8 sprites of one colour
    assert set(env_params("meltingpot/commons_harvest__open").defaults) == {
        "scenario", "observation", "state_downsample", "render_mode"
    }  # fmt: skip


def test_an_episode_ends_for_everyone_truncated_at_its_length(standin):
    from marlctl.envs.meltingpot import make

    env = make("coins")
    env.reset(seed=0)
    steps, rewards = 0, 0.0
    while env.agents:
        _, r, terms, truncs, _ = env.step({a: 1 for a in env.agents})
        steps, rewards = steps + 1, rewards + sum(r.values())
    assert steps == 30 and all(truncs.values()) and not any(terms.values())
    assert env.agents == []


def test_vector_observations_are_the_permitted_ones_but_the_view(standin):
    from marlctl.envs.meltingpot import make

    env = make("coins", observation="vector")
    obs, _ = env.reset(seed=0)
    # COLLECTIVE_REWARD and READY_TO_SHOOT, in name order
    assert obs["player_0"].tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="observation must be one of rgb, vector"):
        make("coins", observation="pixels")


def test_a_scenario_exposes_its_focal_players_only_and_keeps_the_state_size(standin):
    from marlctl.envs.meltingpot import make

    env = make("commons_harvest__open", scenario="commons_harvest__open_0")
    obs, _ = env.reset(seed=0)
    assert list(obs) == [f"player_{i}" for i in range(5)]
    assert env.state().shape == make("commons_harvest__open").state_space.shape
    assert not env.state().any()  # focal players do not see the map
    with pytest.raises(ValueError, match="not a scenario of coins; its scenarios: coins_0"):
        make("coins", scenario="commons_harvest__open_0")


def _spec(tmp_path: Path, **model) -> Path:
    body = {
        "seeds": [0, 1],
        "env": {"id": "meltingpot/commons_harvest__open"},
        "algo": {"name": "mappo", "rollout_steps": 30, "epochs": 1, "minibatches": 1},
        "model": {"hidden": [32], "encoder": "cnn", "agent_ids": False,
                  "cnn": {"channels": [8], "kernels": [3], "strides": [1], "downsample": 8,
                          "state_downsample": 1},
                  **model},
        "train": {"total_env_steps": 120, "eval_every": 0, "eval_episodes": 2},
        "hardware": {"device": "cpu", "num_envs": 2, "env_workers": 0},
    }  # fmt: skip
    return write_spec(tmp_path, body)


def test_a_policy_trained_on_a_substrate_plays_a_scenario_as_its_focal_population(
    standin, tmp_path
):
    out = run_json("run", str(_spec(tmp_path)))
    assert out["exit_code"] == 0, out
    parent = out["parent_run_id"]
    played = run_json("eval", parent, "--scenario", "commons_harvest__open_0")
    assert played["exit_code"] == 0, played
    assert len(played["runs"]) == 2
    for r in played["runs"]:
        assert r["scenario"] == "commons_harvest__open_0" and r["episodes"] == 2
        logged = client().get_metric_history(r["run_id"], "scenario/commons_harvest__open_0")
        assert [m.value for m in logged] == [r["return_mean"]]
        assert logged[0].step == 120  # the run's last evaluation's step
    report = run_cli("report", "--format", "md", "--out", str(tmp_path / "r.md"))
    assert report.exit_code == 0, report.output
    text = (tmp_path / "r.md").read_text()
    assert "Melting Pot scenarios" in text and "commons_harvest__open_0" in text


def test_a_scenario_refuses_a_policy_that_reads_the_slot_or_an_env_without_scenarios(
    standin, tmp_path
):
    out = run_json("run", str(_spec(tmp_path, agent_ids=True)))
    assert out["exit_code"] == 0, out
    refused = run_cli("eval", out["parent_run_id"], "--scenario", "commons_harvest__open_0")
    assert refused.exit_code == 2
    assert "--scenario" in refused.output and "agent_ids: false" in refused.output
    body = {
        "seeds": [0],
        "env": {"id": "mpe/simple_spread"},
        "algo": {"name": "mappo", "rollout_steps": 25},
        "train": {"total_env_steps": 50, "eval_every": 0, "eval_episodes": 1},
        "hardware": {"device": "cpu", "num_envs": 2},
    }
    other = run_json("run", str(write_spec(tmp_path, body, "spread.yaml")))
    refused = run_cli("eval", other["parent_run_id"], "--scenario", "x")
    assert refused.exit_code == 2 and "has no scenarios" in refused.output


@pytest.mark.skipif(
    not REAL, reason="dm-meltingpot is not installed (pip install 'marlctl[meltingpot]')"
)
def test_the_package_substrate_steps_through_the_adapter():
    from pettingzoo.test import parallel_api_test

    from marlctl.envs.meltingpot import make

    env = make("commons_harvest__open")
    parallel_api_test(env, num_cycles=20)
    obs, _ = env.reset(seed=0)
    assert obs["player_0"].shape == (88, 88, 3) and len(obs) == 7
    assert env.state().shape == (18, 24, 3)
