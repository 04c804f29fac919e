"""Observation spaces beyond Box, and global states without a `state_space`, in PettingZoo
envs: what the learners see, what validation refuses, and training and evaluation on them.

`toy_envs.SpaceZoo` observes a known sequence of values of each kind of space, so every
encoded observation can be written down here by hand; `toy_envs.Meetup` has a `state()`
and no `state_space`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from test_training import run_json, write_spec

from marlctl.envs.pettingzoo import PettingZooEnv
from marlctl.envs.probe import probe

ZOO = "toy_envs:space_zoo"
RPS = "pettingzoo.classic.rps_v2:parallel_env"


def one_hot(index: int, size: int) -> list[float]:
    return [float(i == index) for i in range(size)]


def expected(kind: str, k: int) -> list[float]:
    """What agent i sees at step t (k = t + i), encoded by hand."""
    return {
        "box": [k % 2, -0.5, 0.25],
        "discrete": one_hot(k % 4, 4),  # Discrete(4, start=1) holds 1 + k % 4
        "multidiscrete": one_hot(k % 2, 2) + one_hot(k % 3, 3),
        "multibinary": [k % 2, (k // 2) % 2, 1],
        "dict": one_hot(k % 3, 3) + [0.5, -0.5],  # members in key order: cell, pos
        "tuple": [1, k % 2] + one_hot(k % 2, 2),
        "masked": one_hot(k % 3, 3),  # the mask is taken out, the observation encoded
    }[kind]


KINDS = ["box", "discrete", "multidiscrete", "multibinary", "dict", "tuple", "masked"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_supported_space_is_seen_as_gymnasiums_flattened_values(kind):
    import toy_envs

    info = probe(ZOO, {"space": kind})
    (group,) = info.groups
    size = len(expected(kind, 0))
    assert group.obs_shape == ((3,) if kind == "box" else (size,))
    assert group.obs_flattened == (kind != "box")
    assert (group.mask_source == "obs") == (kind == "masked")
    env = PettingZooEnv(ZOO, {"space": kind}, info, 2, torch.device("cpu"))
    space = toy_envs.SpaceZoo(kind).space
    try:
        ob = env.reset(0)
        for t in range(3):
            obs = ob.obs[group.name]
            assert obs.dtype == torch.float32 and obs.shape == (2, 2, size)
            for i in range(2):
                assert obs[0, i].tolist() == pytest.approx(expected(kind, t + i)), (t, i)
                if kind in ("dict", "tuple"):  # the standard these follow
                    raw = toy_envs.SpaceZoo(kind).observe(t, i)
                    assert obs[0, i].tolist() == pytest.approx(spaces.flatten(space, raw))
            ob = env.step({group.name: torch.zeros(2, 2, dtype=torch.long)}).next
    finally:
        env.close()


def test_flattened_observations_come_the_same_from_env_worker_processes():
    info = probe(ZOO, {"space": "dict"})
    env = PettingZooEnv(ZOO, {"space": "dict"}, info, 2, torch.device("cpu"), workers=2)
    try:
        ob = env.reset(0)
        assert ob.obs["agent"][1, 1].tolist() == pytest.approx(expected("dict", 1))
    finally:
        env.close()


@pytest.mark.parametrize(
    ("kind", "shown"),
    [
        ("text", "Text("),
        ("sequence", "Sequence(Discrete(2)"),
        ("graph", "Graph("),
        ("dict_of_text", "Dict('cell': Discrete(3), 'name': Text("),
    ],
)
def test_an_unsupported_observation_space_is_refused_at_env_id(tmp_path, kind, shown):
    body = {
        "seeds": [0],
        "env": {"id": ZOO, "params": {"space": kind}},
        "algo": {"name": "mappo"},
    }
    spec = write_spec(tmp_path, body)
    out = run_json("validate", str(spec))
    assert out["exit_code"] == 2
    (error,) = out["errors"]
    line = spec.read_text().splitlines().index(f"  id: {ZOO}") + 1
    assert error.startswith(
        f"{spec}:{line}: env.id: env '{ZOO}': agent 'agent_0' has an unsupported observation "
        f"space {shown}"
    ), error
    if kind == "dict_of_text":
        assert "(its part Text(" in error
    assert error.endswith(
        "; supported: Box; Discrete (as a one-hot), MultiDiscrete (concatenated one-hots), "
        "MultiBinary (0/1), and Dict or Tuple of these (flattened as gymnasium.spaces.flatten "
        "does); a Dict with 'observation' and 'action_mask' keys gives action masks"
    ), error
    assert "env.params" not in error


def test_rock_paper_scissors_validates_with_its_discrete_observations(tmp_path):
    spec = write_spec(tmp_path, {"seeds": [0], "env": {"id": RPS}, "algo": {"name": "mappo"}})
    out = run_json("run", str(spec), "env.params={}", "--dry-run")
    assert out["exit_code"] == 0, out
    (group,) = out["plan"]["env"]["groups"]
    assert group["obs_shape"] == [4] and group["agents"] == ["player_0", "player_1"]


def test_rock_paper_scissors_trains_and_evaluates(tmp_path):
    spec = write_spec(
        tmp_path,
        {
            "seeds": [0],
            "env": {"id": RPS, "params": {"num_actions": 3, "max_cycles": 5}},
            "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 2},
            "model": {"hidden": [16]},
            "train": {"total_env_steps": 400, "eval_every": 200, "eval_episodes": 4},
            "hardware": {"device": "cpu", "num_envs": 4},
        },
    )
    out = run_json("run", str(spec))
    assert out["exit_code"] == 0, out
    (run,) = out["runs"]
    assert run["status"] == "FINISHED" and np.isfinite(run["final_return"])
    evaluated = run_json("eval", run["run_id"], "--trust-factory", RPS)
    assert evaluated["exit_code"] == 0, evaluated
    (row,) = evaluated["runs"]
    assert row["return_mean"] == pytest.approx(row["logged_return"])


# ---------------------------------------------------------------- global state


def test_a_state_without_a_state_space_is_read_from_state(tmp_path):
    info = probe("toy_envs:meetup", {})
    assert info.state_from_env and info.state_dim == 8  # not the 3 x 8 observations
    env = PettingZooEnv("toy_envs:meetup", {}, info, 2, torch.device("cpu"))
    try:
        ob = env.reset(0)
        for t in range(1, 8):  # through an episode end (6 steps) and its reset
            assert ob.state[0].tolist() == one_hot((t - 1) % 6, 8)
            tr = env.step({"agent": torch.zeros(2, 3, dtype=torch.long)})
            if t == 6:
                assert tr.final.state[0].tolist() == one_hot(6, 8)
            ob = tr.next
    finally:
        env.close()
    spec = write_spec(
        tmp_path, {"seeds": [0], "env": {"id": "toy_envs:meetup"}, "algo": {"name": "mappo"}}
    )
    out = run_json("run", str(spec), "--dry-run")
    assert out["plan"]["env"]["state_dim"] == 8 and out["plan"]["env"]["state_from_env"]


def test_a_state_that_changes_size_fails_with_a_message():
    info = probe("toy_envs:meetup", {"grow_state_at": 3})
    env = PettingZooEnv("toy_envs:meetup", {"grow_state_at": 3}, info, 1, torch.device("cpu"))
    try:
        env.reset(0)
        env.step({"agent": torch.zeros(1, 3, dtype=torch.long)})
        env.step({"agent": torch.zeros(1, 3, dtype=torch.long)})
        with pytest.raises(ValueError, match=r"state\(\) returned 9 values, not the 8 of its"):
            env.step({"agent": torch.zeros(1, 3, dtype=torch.long)})
    finally:
        env.close()
