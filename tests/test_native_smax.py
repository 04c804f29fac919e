"""The native SMAX env against JaxMARL's SMAX (jaxmarl 0.2.0, on JAX's CPU backend): from the
same state, with the same actions and the same random numbers, each step gives the same
observations, global state, action masks, rewards, episode ends, unit positions and health
(the enemies' heuristic moves included), over whole episodes; and their start states come
from the same distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
pytest.importorskip("jaxmarl")
jax.config.update("jax_platforms", "cpu")

import jax.numpy as jnp  # noqa: E402
from jaxmarl.environments.smax import HeuristicEnemySMAX, map_name_to_scenario  # noqa: E402

from marlctl.envs.native import native_class  # noqa: E402

ENVS = 3


def _t(x, dtype=torch.float32) -> torch.Tensor:
    return torch.from_numpy(np.array(x)).to(dtype)


def _copy_into(env, row: int, state) -> None:
    """Put a JaxMARL `HeuristicEnemySMAX` state into row `row` of the native env."""
    s, h = state.state, state.enemy_policy_state
    env.pos[row] = _t(s.unit_positions)
    env.alive[row] = _t(s.unit_alive, torch.bool)
    env.health[row] = _t(s.unit_health)
    env.types[row] = _t(s.unit_types, torch.long)
    env.cooldown[row] = _t(s.unit_weapon_cooldowns)
    env.prev_move[row] = _t(s.prev_movement_actions)
    env.prev_attack[row] = _t(s.prev_attack_actions, torch.long)
    env.target[row] = _t(h.default_target)
    env.last_attacked[row] = _t(h.last_attacked_enemy, torch.long)
    env.steps[row] = int(s.step)


def _draws(theirs, n_enemies: int, n_units: int):
    """The random numbers JaxMARL's step draws from a key, as one jitted function: each
    enemy's uniform for its heuristic's choice of target, and each world step's cooldown
    deviations."""
    tps = theirs._env.time_per_step

    def target(enemy_key):
        key_target, _ = jax.random.split(enemy_key)
        return jax.random.uniform(key_target)

    def deviation(unit_key):
        return jax.random.uniform(unit_key, minval=-tps, maxval=2 * tps)

    @jax.jit
    def draws(key):
        key, action_key = jax.random.split(key)
        targets = jax.vmap(target)(jax.random.split(action_key, n_enemies))
        deviations, step_key = [], key
        for _ in range(theirs._env.world_steps_per_env_step):
            step_key, world_key = jax.random.split(step_key)
            deviations.append(jax.vmap(deviation)(jax.random.split(world_key, n_units)))
        return targets, jnp.stack(deviations)

    return draws


@pytest.mark.parametrize(
    "scenario",
    ["3m", "2s3z", "smacv2_5_units"]
    + [pytest.param(s, marks=pytest.mark.slow) for s in ("5m_vs_6m", "6h_vs_8z")],
)
def test_native_smax_steps_as_jaxmarl(scenario):
    theirs = HeuristicEnemySMAX(scenario=map_name_to_scenario(scenario))
    step = jax.jit(theirs.step_env)
    get_obs, get_avail = jax.jit(theirs.get_obs), jax.jit(theirs.get_avail_actions)
    get_world_state = jax.jit(theirs.get_world_state)
    ours = native_class(f"smax/{scenario}")({}, ENVS, "cpu")
    ours.reset(0)
    A, En, N = ours.A, ours.E_units, ours.N
    draw_numbers = _draws(theirs, En, N)
    states, queued = [], []
    for i in range(ENVS):
        _, state = theirs.reset(jax.random.PRNGKey(i))
        states.append(state)
        _copy_into(ours, i, state)
    draw = ours.uniform

    def injected(n, *shape, low=0.0, high=1.0):  # the queued numbers, then ours again
        return queued.pop(0) if queued else draw(n, *shape, low=low, high=high)

    ours.uniform = injected
    rng = np.random.default_rng(0)
    ends = wins = 0
    for t in range(120):
        # Each step starts from JaxMARL's state: float sums in another order (units pushed
        # apart) differ in the last bits, and would drift over an episode.
        for i, state in enumerate(states):
            _copy_into(ours, i, state)
        ob = ours._observation()
        masks = np.zeros((ENVS, A, En + 5), dtype=bool)
        for i, state in enumerate(states):
            obs, avail = get_obs(state), get_avail(state)
            for j in range(A):
                ours_obs = ob.obs["ally"][i, j].numpy()
                assert np.allclose(ours_obs, np.asarray(obs[f"ally_{j}"]), atol=1e-5), (t, i, j)
                masks[i, j] = np.asarray(avail[f"ally_{j}"]).astype(bool)
            assert np.array_equal(ob.masks["ally"][i].numpy(), masks[i]), (t, i)
            world = np.asarray(get_world_state(state))
            assert np.allclose(ob.state[i].numpy(), world, atol=1e-4), (t, i)
        actions = np.array(
            [[rng.choice(np.flatnonzero(masks[i, j])) for j in range(A)] for i in range(ENVS)]
        )
        keys = [jax.random.PRNGKey(10_000 * t + i) for i in range(ENVS)]
        draws = [draw_numbers(key) for key in keys]
        queued[:] = [
            torch.from_numpy(np.stack([np.asarray(d[0]) for d in draws])),
            torch.from_numpy(np.stack([np.asarray(d[1]) for d in draws])),
        ]
        tr = ours.step({"ally": torch.from_numpy(actions)})
        assert not queued  # both draws were taken, in that order
        for i, key in enumerate(keys):
            joint = {f"ally_{j}": jnp.int32(actions[i, j]) for j in range(A)}
            obs, states[i], rewards, dones, _ = step(key, states[i], joint)
            s = states[i].state
            won = bool(~s.unit_alive[A:].any() & s.unit_alive[:A].any())
            assert bool(ours.won[i]) == won, (t, i)
            reward = float(rewards["ally_0"])
            assert tr.rewards["ally"][i, 0].item() == pytest.approx(reward, abs=1e-5), (t, i)
            done = bool(dones["__all__"])
            assert bool(tr.terminated[i] | tr.truncated[i]) == done, (t, i)
            if not done:
                assert np.allclose(ours.pos[i].numpy(), np.asarray(s.unit_positions), atol=1e-4)
                assert np.allclose(ours.health[i].numpy(), np.asarray(s.unit_health), atol=1e-4)
                continue
            ends += 1
            wins += int(ours.won[i])
            for j in range(A):
                final = tr.final.obs["ally"][i, j].numpy()
                assert np.allclose(final, np.asarray(obs[f"ally_{j}"]), atol=1e-5), (t, i, j)
            _, states[i] = theirs.reset(jax.random.PRNGKey(777 + 100 * t + i))
    assert ends >= ENVS  # whole episodes


@pytest.mark.parametrize("scenario", ["3m", "2s3z", "smacv2_5_units", "smacv2_10_units"])
def test_native_smax_start_states_have_jaxmarls_distribution(scenario):
    n = 4000
    theirs = HeuristicEnemySMAX(scenario=map_name_to_scenario(scenario))
    reset = jax.jit(jax.vmap(theirs.reset))
    _, states = reset(jax.random.split(jax.random.PRNGKey(0), n))
    their_pos = np.asarray(states.state.unit_positions)  # [n, N, 2]
    their_types = np.asarray(states.state.unit_types).astype(np.int64)
    ours = native_class(f"smax/{scenario}")({}, n, "cpu")
    ours.reset(0)
    our_pos, our_types = ours.pos.numpy(), ours.types.numpy()
    # Where each unit starts: mean and spread per unit and axis, within five standard errors
    # (SMACv2's formations spread units over the map: a standard error of about 0.15).
    noise = 5 * their_pos.std(axis=0) / np.sqrt(n) + 1e-3
    for stat in (np.mean, np.std):
        a, b = stat(their_pos, axis=0), stat(our_pos, axis=0)
        assert (np.abs(a - b) < noise).all(), (stat.__name__, np.abs(a - b).max())

    # How far apart the closest allies and enemies start (the formations, the push apart).
    def gaps(pos, A):
        d = np.linalg.norm(pos[:, :A, None] - pos[:, None, A:], axis=-1)
        return d.min(axis=(1, 2))

    A = ours.A
    for q in (0.1, 0.5, 0.9):
        assert abs(np.quantile(gaps(their_pos, A), q) - np.quantile(gaps(our_pos, A), q)) < 0.5
    # Unit types: fixed by the scenario, or uniform in SMACv2's (the same per unit index).
    for unit in range(ours.N):
        a = np.bincount(their_types[:, unit], minlength=6) / n
        b = np.bincount(our_types[:, unit], minlength=6) / n
        assert 0.5 * np.abs(a - b).sum() < 0.05, unit
    # SMACv2 mirrors the allies' types on the enemies.
    same = their_types[:, A : 2 * A] == their_types[:, :A]
    assert same.all() == (our_types[:, A : 2 * A] == our_types[:, :A]).all()
