"""Native MPE tasks against their mpe2 originals: same state + same actions -> same results.

Each case copies the worlds of several seeded PettingZoo envs into one native batch (in
float64, the originals' precision), plays a full episode of random actions in both, and
compares observations, global state, rewards and episode ends at every step (1e-5).
Start states are compared in distribution (two-sample KS test per observation entry).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marlctl.envs.native import NATIVE, native_class
from marlctl.envs.probe import describe
from marlctl.envs.registry import lookup, make_env

ENVS = 4
TOL = 1e-5

# env id -> parameter sets exercised (every scenario parameter at a non-default value too)
CASES: dict[str, list[dict]] = {
    "mpe/simple_spread": [
        {},
        {"continuous_actions": True},
        {"N": 4, "local_ratio": 0.2, "max_cycles": 30},
        {"num_agent_neighbors": 1, "num_landmark_neighbors": 2},
        {"terminate_on_success": True, "max_cycles": 40},
    ],
    "mpe/simple": [{}, {"continuous_actions": True}, {"max_cycles": 30}],
    "mpe/simple_adversary": [
        {},
        {"continuous_actions": True},
        {"N": 3, "max_cycles": 30},
        {"N": 1},
        {"num_agent_neighbors": 1, "num_landmark_neighbors": 1},
        {"N": 3, "num_agent_neighbors": 5, "num_landmark_neighbors": 4, "continuous_actions": True},
    ],
    "mpe/simple_tag": [
        {},
        {"continuous_actions": True},
        {"num_good": 2, "num_adversaries": 2, "num_obstacles": 3, "max_cycles": 30},
        {"num_good": 3, "num_adversaries": 1, "num_obstacles": 0},
        {"num_agent_neighbors": 2, "num_landmark_neighbors": 1},
        {"num_good": 2, "num_agent_neighbors": 6, "num_landmark_neighbors": 3},
        {"terminate_on_success": True, "num_adversaries": 6, "max_cycles": 60},
    ],
    "mpe/simple_push": [{}, {"continuous_actions": True}, {"max_cycles": 30}],
    "mpe/simple_reference": [
        {},
        {"continuous_actions": True},
        {"local_ratio": 0.2, "max_cycles": 30},
    ],
    "mpe/simple_speaker_listener": [{}, {"continuous_actions": True}, {"max_cycles": 40}],
    "mpe/simple_crypto": [{}, {"continuous_actions": True}, {"max_cycles": 10}],
    "mpe/simple_world_comm": [
        {},
        {"continuous_actions": True},
        {
            "num_good": 3,
            "num_adversaries": 2,
            "num_obstacles": 2,
            "num_food": 3,
            "num_forests": 4,
            "max_cycles": 40,
        },
        {"num_adversaries": 1, "num_obstacles": 0, "num_forests": 0, "continuous_actions": True},
        {"num_adversaries": 0, "num_good": 3, "num_food": 1, "num_forests": 1},
    ],
}

# Cases whose random episodes do end early (terminate_on_success), so the terminated flag
# and the reset of a single env mid-batch are compared, not only truncation.
ENDS_EARLY = [
    ("mpe/simple_tag", {"terminate_on_success": True, "num_adversaries": 6, "max_cycles": 60})
]


def _params(env_id: str) -> list[tuple[str, dict]]:
    return [(env_id, p) for p in CASES.get(env_id, [])]


# Parity applies where an original exists; the other families' have files of their own
# (test_native_classic.py, test_native_foraging.py, test_native_smax.py).
ORIGINALS = [env_id for env_id in NATIVE if env_id.startswith("mpe/")]
ALL = [case for env_id in ORIGINALS for case in _params(env_id)]


def _ids(case) -> str:
    env_id, params = case
    extra = ",".join(f"{k}={v}" for k, v in params.items())
    return env_id.split("/")[1] + (f"[{extra}]" if extra else "")


def test_every_native_task_has_parity_cases():
    missing = [env_id for env_id in ORIGINALS if not CASES.get(env_id)]
    assert not missing, f"native tasks without parity cases: {missing}"


def _random_actions(info, rng: np.random.Generator, n_envs: int) -> dict[str, np.ndarray]:
    actions = {}
    for g in info.groups:
        if g.discrete:
            actions[g.name] = rng.integers(0, g.n_actions, size=(n_envs, g.n_agents))
        else:
            # Out-of-range values too: both sides clip to the Box.
            actions[g.name] = rng.uniform(-0.2, 1.2, size=(n_envs, g.n_agents, g.n_actions))
    return actions


def _check(native_obs, pz_obs: list[dict], pz_states: list[np.ndarray], info, what: str):
    for g in info.groups:
        ours = native_obs.obs[g.name].numpy()
        theirs = np.array([[o[a] for a in g.agents] for o in pz_obs])
        np.testing.assert_allclose(ours, theirs, atol=TOL, rtol=0, err_msg=f"{what} obs {g.name}")
    np.testing.assert_allclose(
        native_obs.state.numpy(), np.array(pz_states), atol=TOL, rtol=0, err_msg=f"{what} state"
    )


@pytest.mark.parametrize("case", ALL, ids=_ids)
def test_native_matches_pettingzoo_step_for_step(case):
    env_id, params = case
    originals = [make_env(env_id, params) for _ in range(ENVS)]
    obs = [env.reset(seed=100 + i)[0] for i, env in enumerate(originals)]
    info = describe(make_env(env_id, params), lookup(env_id).id, lookup(env_id).factory)
    native = native_class(env_id)(params, ENVS, "cpu", dtype=torch.float64)
    assert native.info == info
    native.reset(0)
    native.load_worlds([env.unwrapped.world for env in originals])
    _check(native.observe_now(), obs, [e.state() for e in originals], info, "start")
    rng = np.random.default_rng(7)
    max_cycles = params.get("max_cycles", 25)
    alive = np.ones(ENVS, dtype=bool)
    ended_early = False
    for t in range(max_cycles):
        actions = _random_actions(info, rng, ENVS)
        tr = native.step({k: torch.as_tensor(v) for k, v in actions.items()})
        for i, env in enumerate(originals):
            if not alive[i]:
                continue
            joint = {a: actions[g.name][i, j] for g in info.groups for j, a in enumerate(g.agents)}
            ob, rew, term, trunc, _ = env.step(joint)
            for g in info.groups:
                theirs = np.array([rew[a] for a in g.agents])
                np.testing.assert_allclose(
                    tr.rewards[g.name][i].numpy(),
                    theirs,
                    atol=TOL,
                    rtol=0,
                    err_msg=f"step {t} env {i} rewards {g.name}",
                )
            done = any(term.values()) or any(trunc.values())
            assert bool(tr.terminated[i]) == any(term.values()), f"step {t} env {i}"
            assert bool(tr.truncated[i]) == any(trunc.values()), f"step {t} env {i}"
            view = tr.final if done else tr.next
            for g in info.groups:
                theirs = np.array([ob[a] for a in g.agents])
                np.testing.assert_allclose(
                    view.obs[g.name][i].numpy(),
                    theirs,
                    atol=TOL,
                    rtol=0,
                    err_msg=f"step {t} env {i} obs {g.name}",
                )
            if not done:
                np.testing.assert_allclose(
                    tr.next.state[i].numpy(),
                    env.state(),
                    atol=TOL,
                    rtol=0,
                    err_msg=f"step {t} env {i} state",
                )
            else:
                alive[i] = False
                ended_early |= t < max_cycles - 1
        if not alive.any():
            break
    assert not alive.any(), "the original episodes did not end within max_cycles"
    if (env_id, params) in ENDS_EARLY:
        assert ended_early, "this case is meant to see an episode end before max_cycles"


@pytest.mark.parametrize("env_id", ORIGINALS, ids=lambda e: e.split("/")[1])
def test_native_start_states_follow_the_original_distribution(env_id):
    from scipy.stats import ks_2samp

    params = CASES[env_id][0]
    samples = 1500
    native = native_class(env_id)(params, samples, "cpu", dtype=torch.float64)
    ours = native.reset(3).state.numpy()
    env = make_env(env_id, params)
    theirs = np.array([(env.reset(seed=s), env.state())[1] for s in range(samples)])
    assert ours.shape == theirs.shape
    worst = min(
        ks_2samp(ours[:, j], theirs[:, j]).pvalue
        for j in range(ours.shape[1])
        if np.ptp(theirs[:, j]) > 0 or np.ptp(ours[:, j]) > 0
    )
    # Bonferroni over the state's entries at an overall 1e-3 level.
    assert worst > 1e-3 / ours.shape[1], f"start state distribution differs (p={worst:.2e})"
