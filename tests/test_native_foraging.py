"""The native level-based foraging env against the `lbforaging` package: the same states
and actions give the same observations, action masks, rewards and episode ends, and start
states come from the same distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch

lbforaging = pytest.importorskip("lbforaging")

from marlctl.envs.gymma import LBF, TupleSpaceEnv  # noqa: E402
from marlctl.envs.native import native_class, native_problem  # noqa: E402

# Registered tasks, and the package's keywords that no registered name sets.
TASKS = [
    ("Foraging-8x8-2p-2f-coop-v3", {}),
    ("Foraging-2s-8x8-2p-2f-coop-v3", {}),
    ("Foraging-10x10-3p-3f-v3", {}),
    ("Foraging-2s-10x10-3p-3f-v3", {}),
    ("Foraging-5x5-4p-1f-v3", {}),
    ("Foraging-7x7-3p-2f-v3", {"penalty": 0.1, "sight": 1, "max_player_level": [1, 2, 3]}),
    ("Foraging-6x6-2p-2f-v3", {"max_food_level": 1, "normalize_reward": False}),
    # The package's grid observations: a player's view of three layers.
    ("Foraging-2s-8x8-2p-2f-coop-v3", {"grid_observation": True}),
    ("Foraging-7x7-3p-2f-v3", {"grid_observation": True, "sight": 1, "max_player_level": 3}),
    ("Foraging-5x5-4p-1f-v3", {"grid_observation": True}),
]
ENVS = 6


def _copy_into(native, row: int, env) -> None:
    """Put the package env's state into row `row` of the native env."""
    F = native.F
    pos = torch.tensor([p.position for p in env.players])
    level = torch.tensor([p.level for p in env.players])
    cells = list(zip(*np.nonzero(env.field), strict=True))
    food_pos = torch.zeros(F, 2, dtype=torch.long)
    food_level = torch.zeros(F, dtype=torch.long)
    for i, (r, c) in enumerate(cells):
        food_pos[i] = torch.tensor([r, c])
        food_level[i] = int(env.field[r, c])
    for name, value in (("pos", pos), ("level", level), ("food_pos", food_pos),
                        ("food_level", food_level)):  # fmt: skip
        getattr(native, name)[row] = value
    native.food_spawned[row] = float(env._food_spawned)
    native.steps[row] = env.current_step


def grid_space(env):
    """The space of the package's grid observations as `_make_gym_obs` makes them: three
    `(2 * sight + 1)`-square layers. lbforaging 2.0.0 declares it with shape (3,), which
    gymnasium refuses, so the package cannot make a grid env unpatched."""
    from gymnasium.spaces import Box

    width = 1 + 2 * env.sight
    return Box(0.0, np.inf, (3, width, width), np.float32)


@pytest.mark.parametrize("common_reward", [False, True])
@pytest.mark.parametrize(("task", "extra"), TASKS)
def test_native_foraging_steps_exactly_as_the_package(task, extra, common_reward, monkeypatch):
    from lbforaging.foraging.environment import ForagingEnv

    if extra.get("grid_observation"):
        monkeypatch.setattr(ForagingEnv, "_get_observation_space", grid_space)
    params = {"common_reward": common_reward, **extra}
    originals = [TupleSpaceEnv(LBF, task, **params) for _ in range(ENVS)]
    native = native_class(f"lbf/{task}")(params, ENVS, "cpu")
    native.reset(0)
    rng = np.random.default_rng(0)
    outs = []
    for i, env in enumerate(originals):
        obs, infos = env.reset(seed=100 + i)
        outs.append((obs, infos))
        _copy_into(native, i, env.env)
    agents = originals[0].possible_agents
    ends = loads = 0
    for step in range(400):
        ob = native._observation()
        for i, (obs, infos) in enumerate(outs):
            for j, agent in enumerate(agents):
                assert np.array_equal(ob.obs["agent"][i, j].numpy(), obs[agent]), (step, i, j)
                assert np.array_equal(
                    ob.masks["agent"][i, j].numpy(), infos[agent]["action_mask"]
                ), (step, i, j)
        # Mostly allowed actions, some not (the env must replace them by NONE).
        masks = ob.masks["agent"].numpy()
        actions = np.zeros((ENVS, len(agents)), dtype=np.int64)
        for i in range(ENVS):
            for j in range(len(agents)):
                allowed = np.flatnonzero(masks[i, j]) if rng.random() < 0.8 else np.arange(6)
                if masks[i, j, 5] and rng.random() < 0.5:
                    allowed = np.array([5])  # load often, so foods get collected
                actions[i, j] = rng.choice(allowed)
        tr = native.step({"agent": torch.from_numpy(actions)})
        for i, env in enumerate(originals):
            obs, reward, term, trunc, infos = env.step(
                {a: int(actions[i, j]) for j, a in enumerate(agents)}
            )
            for j, agent in enumerate(agents):
                assert tr.rewards["agent"][i, j].item() == pytest.approx(reward[agent], abs=1e-6)
                loads += reward[agent] != 0
            ended = term[agents[0]] or trunc[agents[0]]
            assert bool(tr.terminated[i]) == term[agents[0]], (step, i)
            assert bool(tr.truncated[i]) == trunc[agents[0]], (step, i)
            if ended:  # compare the final observation, then start both from the package's
                ends += 1
                for j, agent in enumerate(agents):
                    assert np.array_equal(tr.final.obs["agent"][i, j].numpy(), obs[agent])
                obs, infos = env.reset(seed=1000 * step + i)
                _copy_into(native, i, env.env)
            outs[i] = (obs, infos)
    assert ends > 0 and loads > 0  # whole episodes, with food collected


def _starts(task: str, n: int, extra: dict):
    """Player levels, food levels, player cells and food cells of n start states, from the
    package and from the native env."""
    env = TupleSpaceEnv(LBF, task, **extra)
    ours = native_class(f"lbf/{task}")(extra, n, "cpu")
    ours.reset(0)
    theirs = {"level": [], "food": [], "pcell": [], "fcell": []}
    for i in range(n):
        env.reset(seed=i)
        e = env.env
        theirs["level"] += [p.level for p in e.players]
        theirs["pcell"] += [p.position[0] * e.cols + p.position[1] for p in e.players]
        rows, cols = np.nonzero(e.field)
        theirs["food"] += list(e.field[rows, cols])
        theirs["fcell"] += list(rows * e.cols + cols)
    placed = ours.food_level > 0
    mine = {
        "level": ours.level.flatten().tolist(),
        "food": ours.food_level[placed].tolist(),
        "pcell": (ours.pos[..., 0] * ours.cols + ours.pos[..., 1]).flatten().tolist(),
        "fcell": (ours.food_pos[..., 0] * ours.cols + ours.food_pos[..., 1])[placed].tolist(),
    }
    return theirs, mine, ours.rows * ours.cols


@pytest.mark.parametrize(
    ("task", "extra"),
    [
        ("Foraging-8x8-2p-2f-coop-v3", {}),
        ("Foraging-6x6-3p-3f-v3", {"max_player_level": [1, 2, 3]}),
    ],
)
def test_native_start_states_have_the_packages_distribution(task, extra):
    n = 3000
    theirs, mine, cells = _starts(task, n, extra)
    assert len(mine["food"]) == pytest.approx(len(theirs["food"]), rel=0.02)  # foods placed
    for key, bins in (("level", 8), ("food", 8), ("pcell", cells), ("fcell", cells)):
        a = np.bincount(theirs[key], minlength=bins) / len(theirs[key])
        b = np.bincount(mine[key], minlength=bins) / len(mine[key])
        # Total variation between the two empirical frequencies: sampling noise at these
        # counts (3000 starts; foods of a start share their level) stays under half the
        # bounds, a wrong rule (levels off by one, foods on the edge) gives 0.25 or more.
        assert 0.5 * np.abs(a - b).sum() < (0.06 if "cell" in key else 0.04), key


def test_grid_observations_are_frames_the_cnn_reads_channels_first():
    assert native_problem("lbf/Foraging-grid-8x8-2p-2f-v3", {}) is None  # a grid task
    assert native_problem("lbf/Foraging-8x8-2p-2f-v3", {"grid_observation": True}) is None
    assert native_problem("lbf/NotATask-v3", {})[0] == "env.backend"
    (group,) = native_class("lbf/Foraging-grid-2s-8x8-2p-2f-v3")({}, 1, "cpu").info.groups
    assert group.obs_shape == (3, 5, 5) and group.channels_first
    assert group.frame_shape == (5, 5, 3)


def _random_return(task: str) -> float:
    """Per-agent episode return of uniform allowed actions on the native env."""
    env = native_class(f"lbf/{task}")({}, 512, "cpu")
    ob = env.reset(123)
    gen = torch.Generator().manual_seed(0)
    total = torch.zeros(512)
    for _ in range(env.max_cycles):  # every env ends by then
        mask = ob.masks["agent"].float()
        action = torch.multinomial(mask.view(-1, 6), 1, generator=gen).view(512, -1)
        tr = env.step({"agent": action})
        total += tr.rewards["agent"].mean(-1)
        ob = tr.next
    return float(total.mean())


@pytest.mark.slow
def test_mappo_learns_native_cooperative_foraging(tmp_path):
    """Two players must load the one food together: the median of three seeds collects it
    in most episodes, where uniform play rarely does."""
    from test_training import run_json, write_spec

    task = "Foraging-5x5-2p-1f-coop-v3"
    body = {
        "seeds": [0, 1, 2],
        "env": {"id": f"lbf/{task}", "backend": "native"},
        "algo": {"name": "mappo", "rollout_steps": 50, "epochs": 4, "minibatches": 2, "lr": 1e-3},
        "train": {"total_env_steps": 30_000, "eval_every": 0, "eval_episodes": 64},
        "hardware": {"num_envs": 16, "batch_seeds": True},
    }
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    returns = sorted(run["final_return"] for run in out["runs"])
    baseline = _random_return(task)  # the most an agent can get is 0.5 per episode
    assert returns[1] > 0.3 and returns[1] > baseline + 0.2, (returns, baseline)


def test_a_policy_trained_natively_evaluates_on_the_package(tmp_path):
    from test_training import run_json, write_spec

    body = {
        "seeds": [0],
        "env": {"id": "lbf/Foraging-8x8-2p-2f-coop-v3", "backend": "native"},
        "algo": {"name": "qmix", "batch_size": 16, "learning_starts": 16, "buffer_size": 2_000},
        "train": {"total_env_steps": 400, "eval_every": 0, "eval_episodes": 4},
        "hardware": {"num_envs": 8},
    }
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    run_id = out["runs"][0]["run_id"]
    evaluated = run_json("eval", run_id, "--backend", "pettingzoo", "--episodes", "4")
    assert evaluated["exit_code"] == 0, evaluated
    (row,) = evaluated["runs"]
    assert row["backend"] == "pettingzoo" and row["episodes"] == 4, row
