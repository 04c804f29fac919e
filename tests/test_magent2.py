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


def _battle_on(envs, red_cells, blue_cells):
    """Put the one env copy of `envs` back on a map with these cells' agents alone, red's
    first: three of them, so the engine's ids name the same agents as in a whole battle."""
    raw = envs.envs[0].unwrapped
    red_handle, blue_handle = raw.handles
    raw.env.reset()
    raw.env.add_agents(red_handle, method="custom", pos=[[x, y, 0] for x, y in red_cells])
    raw.env.add_agents(blue_handle, method="custom", pos=[[x, y, 0] for x, y in blue_cells])
    raw.team_sizes = [len(red_cells), len(blue_cells)]
    ids = [i for h in raw.handles for i in raw.env.get_agent_id(h)]
    raw.agents = [raw.possible_agents[i] for i in ids]


def _fight(envs, red_attacks: bool):
    """Step until the episode ends: red attacking round every side (or standing), blue
    standing; the end's (terminated, won)."""
    import numpy as np

    stand = 6  # the move to its own cell
    for t in range(100):
        red = [13 + (i + t) % 8 if red_attacks else stand for i in range(3)]
        _, rew, _ = envs.step({"red": np.array([red]), "blue": np.full((1, 3), stand)})
        if rew["terminated"][0] or rew["truncated"][0]:
            return bool(rew["terminated"][0]), bool(rew["won"][0])
    raise AssertionError("the episode did not end")


@pytest.mark.parametrize("wins_for", ["red", "blue"])
def test_an_army_wins_with_more_agents_left_at_the_end(wins_for):
    """Counted on the map: the step that wipes out an army terminates every agent, the
    winners too, so its terminations alone would call every such battle lost."""
    from marlctl.envs.pettingzoo import EnvSlice

    info = probe(BATTLE["id"], BATTLE["params"])
    envs = EnvSlice(BATTLE["id"], BATTLE["params"], info, 1, wins_for=wins_for)
    red_wins = wins_for == "red"
    envs.reset(0)
    _battle_on(envs, [(6, 7), (8, 7), (7, 6)], [(7, 7)])  # one blue agent surrounded
    assert _fight(envs, red_attacks=True) == (True, red_wins)  # wiped out: the game's end
    envs.reset(0)
    _battle_on(envs, [(2, 2), (2, 4), (2, 6)], [(12, 12)])  # apart, three against one
    assert _fight(envs, red_attacks=False) == (False, red_wins)  # the time limit
    envs.reset(0)
    _battle_on(envs, [(2, 2), (2, 4), (2, 6)], [(12, 12), (12, 10), (12, 8)])
    assert _fight(envs, red_attacks=False) == (False, False)  # as many on each side
    envs.close()


@pytest.mark.parametrize(
    "name", ["battle", "adversarial_pursuit", "gather", "tiger_deer", "combined_arms"]
)
def test_the_agents_left_are_the_living_ones_while_a_game_goes_on(name):
    """The engine's survivors, named as the env names its agents, in every magent2 game."""
    import numpy as np

    from marlctl.envs.magent2 import agents_left
    from marlctl.envs.registry import make_env

    env = make_env(f"magent2/{name}", {} if name == "gather" else {"map_size": 20})
    env.reset(seed=0)
    draws = np.random.default_rng(0)
    for _ in range(20):
        _, _, terms, _, _ = env.step(
            {a: int(draws.integers(env.action_space(a).n)) for a in env.agents}
        )
        assert sorted(agents_left(env, terms)) == sorted(env.agents)
    env.close()


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
