"""MAgent2's battles (`magent2/...`): the two armies are two groups although their spaces
are one, each agent sees a frame of layers the cnn encoder reads, agents that die leave the
episode, and either army learns against the other or against a scripted one."""

from __future__ import annotations

import pytest
from test_training import run_json, write_spec

pytest.importorskip("magent2")

from marlctl.envs.probe import probe  # noqa: E402

BATTLE = {"id": "magent2/battle", "params": {"map_size": 15, "max_cycles": 30}}


def test_the_armies_are_groups_of_frames():
    info = probe(BATTLE["id"], BATTLE["params"])
    assert [g.name for g in info.groups] == ["red", "blue"]
    red, blue = info.groups
    assert red.n_agents == blue.n_agents > 1
    assert red.frame_shape == (13, 13, 5) and not red.channels_first


def test_agents_that_die_leave_the_episode():
    from magent2.environments import battle_v4

    env = battle_v4.parallel_env(map_size=15, max_cycles=200)
    env.reset(seed=0)
    start = len(env.agents)
    for step in range(200):  # attack in every direction until someone falls
        env.step({a: 13 + (i + step) % 8 for i, a in enumerate(env.agents)})
        if len(env.agents) < start or not env.agents:
            break
    assert len(env.agents) < start


@pytest.mark.parametrize("groups", [None, {"blue": {"scripted": "random"}}])
def test_an_army_trains_with_convolutions_against_the_other(tmp_path, groups):
    body = {
        "seeds": [0],
        "env": BATTLE,
        "algo": {"name": "ippo", "rollout_steps": 10, "epochs": 1, "minibatches": 2},
        "model": {"hidden": [32], "encoder": "cnn",
                  "cnn": {"channels": [8, 16], "kernels": [3, 3], "strides": [1, 1]}},
        "train": {"total_env_steps": 200, "eval_every": 0, "eval_episodes": 1},
        "hardware": {"device": "cpu", "num_envs": 2},
    }  # fmt: skip
    if groups:
        body["groups"] = groups
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    assert out["runs"][0]["status"] == "FINISHED"


def test_an_army_wins_with_more_agents_left_at_the_end():
    from marlctl.envs.pettingzoo import EnvSlice

    info = probe(BATTLE["id"], BATTLE["params"])
    red, blue = info.groups
    envs = EnvSlice(BATTLE["id"], BATTLE["params"], info, 1, wins_for="red")
    ended = {a: False for a in (*red.agents, *blue.agents)}  # a time limit: all left
    assert not envs._won(ended)  # as many on each side
    assert envs._won(ended | {blue.agents[0]: True})  # one blue agent died on the last step
    assert not envs._won(ended | {red.agents[0]: True})
    assert not envs._won(dict.fromkeys(ended, True))  # everyone terminated at once
    envs.wins_for = "blue"
    assert envs._won(ended | {red.agents[0]: True})
    envs.close()


def test_a_run_against_a_scripted_army_logs_its_win_rate(tmp_path):
    from test_training import client

    body = {
        "seeds": [0],
        "env": BATTLE,
        "groups": {"red": {"scripted": "random"}},
        "algo": {"name": "ippo", "rollout_steps": 10, "epochs": 1, "minibatches": 2},
        "model": {"hidden": [16], "encoder": "cnn",
                  "cnn": {"channels": [4], "kernels": [3], "strides": [2]}},
        "train": {"total_env_steps": 60, "eval_every": 0, "eval_episodes": 2},
        "hardware": {"device": "cpu", "num_envs": 2},
    }  # fmt: skip
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    metrics = client().get_run(out["runs"][0]["run_id"]).data.metrics
    assert 0.0 <= metrics["eval/win_rate"] <= 1.0  # blue's, the learning army
    assert 0.0 <= metrics["train/win_rate"] <= 1.0


def test_the_global_state_holds_when_an_army_is_wiped_out():
    """magent2's own `state()` fails once an army has no agent left (the end of a battle won
    by elimination); marlctl's env gives the map with that army's layers empty, and the
    package's state while both armies stand."""
    import numpy as np

    from marlctl.envs.registry import make_env

    for extra_features in (True, False):  # the package's, while both armies stand
        params = {**BATTLE["params"], "extra_features": extra_features}
        env = make_env(BATTLE["id"], params)
        env.reset(seed=0)
        raw, draws = env.unwrapped, np.random.default_rng(0)
        for _ in range(5):
            assert np.array_equal(raw.state(), type(raw).state(raw))
            env.step({a: int(draws.integers(env.action_space(a).n)) for a in env.agents})
        if extra_features:
            env.close()
    raw = env.unwrapped
    red_handle, blue_handle = raw.handles
    red = raw.env.get_pos(red_handle)
    raw.env.reset()  # the map emptied, then only the red army put back
    raw.env.add_agents(red_handle, method="custom", pos=[[int(x), int(y), 0] for x, y in red])
    assert raw.env.get_num(blue_handle) == 0 and raw.env.get_num(red_handle) == len(red) > 0
    with pytest.raises(ValueError):
        type(raw).state(raw)  # the package's own
    state = raw.state()
    assert np.array_equal(state[..., 0], raw.base_state[..., 0])  # the walls
    layer = 1 + red_handle.value * 2
    assert {(int(x), int(y)) for x, y in zip(*np.nonzero(state[..., layer]), strict=True)} == {
        (int(x), int(y)) for x, y in red
    }
    assert (state[..., layer + 1] > 0).sum() == len(red)  # their health
    blue = 1 + blue_handle.value * 2
    assert not state[..., blue].any() and not state[..., blue + 1].any()
    env.close()
