"""The native Overcooked env against JaxMARL's Overcooked (jaxmarl 0.2.0, on JAX's CPU
backend): from the same states, with the same actions, each step gives the same observations
(both cooks' 26 layers), global state, sparse and shaped rewards and episode ends, over a
whole episode and into the next, on every layout, for start states of both kinds
(`random_reset` or not); and the native start states are the ones JaxMARL's reset draws."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
pytest.importorskip("jaxmarl")
jax.config.update("jax_platforms", "cpu")

import jax.numpy as jnp  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from jaxmarl.environments.overcooked import Overcooked, overcooked_layouts  # noqa: E402

from marlctl.envs.native import native_class  # noqa: E402
from marlctl.envs.native.overcooked import EMPTY, LAYOUTS, PLATE, POT  # noqa: E402

ROWS = 16  # half start as the layout says, half from JaxMARL's random reset
BATCH = 4000  # start states drawn at once
MAX_STEPS = 200
STEPS = MAX_STEPS + 40  # a whole episode, its end, and into the next
SCALE = 0.5  # shaped_reward_scale: each cook's reward is sparse + 0.5 * shaped
# Random actions, interacting often enough that pots fill and soups are served.
ACTION_P = [0.15, 0.15, 0.15, 0.15, 0.05, 0.35]
AGENT = 10  # JaxMARL's code for a cook on the map


@pytest.fixture(autouse=True, scope="module")
def _quick_compiles():
    """XLA's optimisations off while this module compiles JaxMARL's functions: compiling
    them is most of the tests' time, and the env's integer steps come out the same."""
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", False)


def _theirs(layout: str, random_reset: bool, max_steps: int = MAX_STEPS) -> Overcooked:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return Overcooked(
            overcooked_layouts[layout], random_reset=random_reset, max_steps=max_steps
        )


@functools.cache
def _reset(layout: str, random_reset: bool):
    """JaxMARL's reset of `BATCH` envs, compiled once per layout and kind (both tests take
    their start states from it: compiling is most of their time)."""
    return jax.jit(jax.vmap(_theirs(layout, random_reset).reset))


def _starts(layout: str, seed: int):
    """JaxMARL's start states of `ROWS` envs and their observations: the first half as the
    layout says, the rest from its random reset."""
    keys = jax.random.split(jax.random.PRNGKey(seed), BATCH)
    half = ROWS // 2
    fixed = _reset(layout, False)(keys)
    drawn = _reset(layout, True)(keys)
    return jax.tree.map(lambda a, b: jnp.concatenate([a[:half], b[:half]]), fixed, drawn)


def _copy_into(env, state) -> None:
    """JaxMARL's batched state into every row of the native env."""
    H, W = env.height, env.width
    pad = (state.maze_map.shape[1] - H) // 2
    maze = np.asarray(state.maze_map)[:, pad : pad + H, pad : pad + W].reshape(ROWS, H * W, 3)
    cells = maze[..., 0].astype(np.int64)
    pos = np.asarray(state.agent_pos).astype(np.int64)
    env.cells = torch.from_numpy(np.where(cells == AGENT, EMPTY, cells))
    env.pots = torch.from_numpy(np.where(cells == POT, maze[..., 2], 0).astype(np.int64))
    env.agent_cell = torch.from_numpy(pos[..., 1] * W + pos[..., 0])
    env.agent_dir = torch.from_numpy(np.asarray(state.agent_dir_idx).astype(np.int64))
    env.held = torch.from_numpy(np.asarray(state.agent_inv).astype(np.int64))
    env.steps = torch.from_numpy(np.asarray(state.step).astype(np.int64))


def _same_obs(ob, obs) -> None:
    for j in range(2):
        theirs = np.asarray(obs[f"agent_{j}"]).astype(np.float32)
        assert np.array_equal(ob.obs["agent"][:, j].numpy(), theirs), j
    assert np.array_equal(ob.state.numpy(), np.asarray(obs["agent_0"]).reshape(ROWS, -1))


def test_layouts_are_jaxmarls() -> None:
    assert set(LAYOUTS) == set(overcooked_layouts)
    for name, ours in LAYOUTS.items():
        theirs = overcooked_layouts[name]
        assert (ours.height, ours.width) == (theirs["height"], theirs["width"])
        cells = np.array(ours.cells)
        assert set(np.flatnonzero(cells != EMPTY)) == set(np.asarray(theirs["wall_idx"]).tolist())
        assert list(ours.starts) == np.asarray(theirs["agent_idx"]).tolist()
        for key, code in (("goal_idx", 7), ("plate_pile_idx", 6), ("onion_pile_idx", 4),
                          ("pot_idx", POT)):  # fmt: skip
            assert set(np.flatnonzero(cells == code)) == set(np.asarray(theirs[key]).tolist())


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_native_overcooked_steps_as_jaxmarl(layout: str) -> None:
    theirs = _theirs(layout, False)
    step = jax.jit(jax.vmap(theirs.step_env))
    ours = native_class(f"overcooked/{layout}")(
        {"max_cycles": MAX_STEPS, "shaped_reward_scale": SCALE}, ROWS, "cpu"
    )
    ours.reset(0)
    obs, state = _starts(layout, 0)
    _copy_into(ours, state)
    _same_obs(ours.observe_now(), obs)
    rng = np.random.default_rng(0)
    keys = jax.random.split(jax.random.PRNGKey(0), ROWS)  # unused by JaxMARL's step
    delivered = plates = ends = 0
    paid: set[float] = set()
    for t in range(STEPS):
        actions = rng.choice(6, size=(ROWS, 2), p=ACTION_P)
        joint = {f"agent_{j}": jnp.asarray(actions[:, j], dtype=jnp.int32) for j in range(2)}
        obs, state, rewards, dones, info = step(keys, state, joint)
        before = ours.held.numpy().copy()
        tr = ours.step({"agent": torch.from_numpy(actions)})
        sparse = np.asarray(rewards["agent_0"])
        bonus = np.stack([np.asarray(info["shaped_reward"][f"agent_{j}"]) for j in range(2)], 1)
        assert np.array_equal(ours.sparse_reward.numpy(), sparse), t
        assert np.array_equal(ours.shaped_reward.numpy(), bonus), t
        assert np.allclose(tr.rewards["agent"].numpy(), sparse[:, None] + SCALE * bonus), t
        done = np.asarray(dones["__all__"])
        assert np.array_equal(tr.truncated.numpy(), done) and not tr.terminated.any(), t
        _same_obs(tr.final, obs)
        delivered += int((sparse > 0).sum())
        paid |= set(bonus.ravel().tolist())
        took = (before == EMPTY) & (ours.held.numpy() == PLATE)
        plates += int((took & (bonus > 0)).sum())
        if done.any():
            assert done.all() and t + 1 == MAX_STEPS  # every row started at step 0
            ends += 1
            obs, state = _starts(layout, 1 + t)
            _copy_into(ours, state)
            _same_obs(ours.observe_now(), obs)
        else:
            _same_obs(tr.next, obs)
    # Every kind of reward was paid: soups delivered, onions put in pots or plates that a pot
    # needs taken, soups served.
    assert ends == 1 and delivered > 0 and {3.0, 5.0} <= paid, (ends, delivered, paid)
    assert plates > 0, plates


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_native_start_states_are_jaxmarls(layout: str) -> None:
    n = BATCH
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    cls = native_class(f"overcooked/{layout}")
    # As the layout says: the same cells and map, each pair of directions drawn.
    obs = _reset(layout, False)(keys)[0]
    theirs = {np.asarray(obs[f"agent_{j}"][i]).astype(np.float32).tobytes()
              for i in range(n) for j in range(2)}  # fmt: skip
    env = cls({}, n, "cpu")
    ob = env.reset(0)
    ours = {ob.obs["agent"][i, j].numpy().tobytes() for i in range(n) for j in range(2)}
    assert ours == theirs and len(ours) == 2 * 16  # 16 pairs of directions, seen by each cook
    # Random reset: two distinct free cells, each pot's status, what each cook holds.
    state = _reset(layout, True)(keys)[1]
    env = cls({"random_reset": True}, n, "cpu")
    env.reset(0)
    W = env.width
    pos = np.asarray(state.agent_pos).astype(np.int64)
    their_pairs = set(map(tuple, (pos[..., 1] * W + pos[..., 0]).tolist()))
    our_pairs = set(map(tuple, env.agent_cell.tolist()))
    free = set(np.flatnonzero(np.array(LAYOUTS[layout].cells) == EMPTY).tolist())
    assert all(a != b and {a, b} <= free for a, b in our_pairs)
    assert our_pairs == their_pairs and len(our_pairs) == len(free) * (len(free) - 1)
    pots = env.pots[:, env.pot_cells]
    assert set(pots.flatten().tolist()) == set(range(24))
    assert set(env.held.flatten().tolist()) == set(np.asarray(state.agent_inv).ravel().tolist())
    assert (env.cells == env.start_cells).all()
