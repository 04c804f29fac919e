"""The native POGEMA against pogema 1.4.0, through episodes it recorded
(`scripts/pogema_record.py`, in a virtualenv of its own: pogema pins pydantic 1). From the
recorded map, starts and targets, with the recorded actions, every step gives the same
observations of the agents on the map, the same rewards, the same agents leaving and the
same episode ends, on random maps of two sizes and on a maze, with both collision systems
and both target rules. Start states the native env draws itself are valid tasks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from marlctl.envs.native import native_class
from marlctl.envs.native.pogema import MAZE, parse_map

FIXTURE = Path(__file__).parent / "fixtures" / "pogema_episodes.npz"
SETTINGS = {  # as scripts/pogema_record.py configured each kind
    "random": ("pogema/random", {"size": 8, "density": 0.3, "num_agents": 4}),
    "random_large": ("pogema/random", {"size": 16, "density": 0.2, "num_agents": 8}),
    "maze": ("pogema/maze", {"num_agents": 6}),
}


def _episodes() -> dict[tuple, list[dict]]:
    data = np.load(FIXTURE)
    out: dict[tuple, list[dict]] = {}
    for i in range(int(data["episodes"])):
        ep = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith(f"{i}/")}
        shape = tuple(ep["obs_shape"])
        ep["obs"] = np.unpackbits(ep["obs"])[: int(np.prod(shape))].reshape(shape)
        key = (str(ep["kind"]), str(ep["collision"]), str(ep["on_target"]))
        out.setdefault(key, []).append(ep)
    return out


EPISODES = _episodes()


def test_the_fixture_holds_over_a_hundred_episodes_on_three_map_kinds():
    assert sum(len(v) for v in EPISODES.values()) >= 100
    assert {k[0] for k in EPISODES} == set(SETTINGS)
    r = int(EPISODES[("maze", "priority", "finish")][0]["obs_radius"])
    inner = EPISODES[("maze", "priority", "finish")][0]["obstacles"][r:-r, r:-r]
    assert inner.tolist() == parse_map(MAZE)  # the native maze is the recorded one


@pytest.mark.parametrize("key", sorted(EPISODES), ids=lambda k: "-".join(k))
def test_recorded_episodes_replay_step_for_step(key):
    kind, collision, on_target = key
    episodes = EPISODES[key]
    env_id, params = SETTINGS[kind]
    first = episodes[0]
    params = params | {
        "obs_radius": int(first["obs_radius"]), "collision_system": collision,
        "on_target": on_target, "max_cycles": int(first["max_steps"]),
    }  # fmt: skip
    env = native_class(env_id)(params, len(episodes), "cpu")
    env.reset(0)
    env.obstacles = torch.from_numpy(np.stack([e["obstacles"] for e in episodes]).astype(bool))
    env.pos = torch.from_numpy(np.stack([e["starts"] for e in episodes]).astype(np.int64))
    env.target = torch.from_numpy(np.stack([e["targets"] for e in episodes]).astype(np.int64))
    env.on = torch.ones(len(episodes), params["num_agents"], dtype=torch.bool)
    start = env.observe_now()
    for row, ep in enumerate(episodes):
        assert np.array_equal(start.obs["agent"][row].numpy(), ep["obs"][0])
    longest = max(len(e["actions"]) for e in episodes)
    live = np.ones(len(episodes), bool)
    for t in range(longest):
        actions = np.zeros((len(episodes), params["num_agents"]), np.int64)
        for row, ep in enumerate(episodes):
            if t < len(ep["actions"]):
                actions[row] = ep["actions"][t]
        tr = env.step({"agent": torch.from_numpy(actions)})
        for row, ep in enumerate(episodes):
            if not live[row]:
                continue
            active = ep["active"][t + 1]
            assert tr.final.active["agent"][row].numpy().tolist() == active.tolist(), (row, t)
            obs = tr.final.obs["agent"][row].numpy()
            assert np.array_equal(obs[active], ep["obs"][t + 1][active]), (row, t)
            assert tr.rewards["agent"][row].numpy().tolist() == ep["rewards"][t].tolist()
            ended = bool(ep["terminated"][t].all() or ep["truncated"][t].all())
            assert bool(tr.terminated[row]) == bool(ep["terminated"][t].all()), (row, t)
            assert bool(tr.terminated[row] | tr.truncated[row]) == ended, (row, t)
            if ended:
                assert t == len(ep["actions"]) - 1
                assert bool(tr.won[row]) == (ep["metrics"][1] == 1.0 if on_target == "finish"
                                             else bool(ep["terminated"][t].all()))  # fmt: skip
                live[row] = False
    assert not live.any()


@pytest.mark.parametrize("env_id", ["pogema/random", "pogema/maze"])
def test_drawn_tasks_are_valid(env_id):
    env = native_class(env_id)({"num_agents": 6}, 64, "cpu")
    env.reset(3)
    r = env.r
    for row in range(64):
        walls = env.obstacles[row].numpy()
        starts, targets = env.pos[row].numpy(), env.target[row].numpy()
        cells = [tuple(c) for c in (*starts, *targets)]
        assert len(set(cells)) == len(cells)  # starts and targets all distinct
        assert not any(walls[c] for c in cells)
        inner = walls[r:-r, r:-r]
        for s, g in zip(starts - r, targets - r, strict=True):
            assert _reachable(inner, tuple(s), tuple(g))


def _reachable(walls: np.ndarray, a: tuple, b: tuple) -> bool:
    seen, todo = {a}, [a]
    while todo:
        x, y = todo.pop()
        for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            c = (x + dx, y + dy)
            inside = 0 <= c[0] < walls.shape[0] and 0 <= c[1] < walls.shape[1]
            if inside and not walls[c] and c not in seen:
                seen.add(c)
                todo.append(c)
    return b in seen
