"""Native pursuit against PettingZoo's `pursuit_v5`: same positions + same moves -> same results.

Each case copies the start of several seeded PettingZoo envs into one native batch (float64),
then plays random pursuer moves in both; the evaders' random moves are drawn once and given
to both (the original's evader controller is replaced by one that plays them back, in the
order the original asks: its live evaders, in index order). Observations, global state,
rewards and episode ends are compared at every step. Start states are compared in
distribution.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marlctl.envs.native import native_class
from marlctl.envs.probe import describe
from marlctl.envs.registry import lookup, make_env

ENVS = 4
TOL = 1e-9
SMALL = {"x_size": 8, "y_size": 8, "n_pursuers": 6, "max_cycles": 150}
CASES = {
    "default": {"max_cycles": 40},
    # A small map where random pursuers surround evaders; where one pursuer on an evader's
    # cell catches it, the last one's catch ends episodes before their time.
    "small": {**SMALL, "n_evaders": 3},
    "stacked": {**SMALL, "n_evaders": 4, "surround": False, "n_catch": 1},
    "stacked-two": {**SMALL, "n_evaders": 6, "surround": False, "n_catch": 2},
    "own-rewards-even-view": {**SMALL, "n_evaders": 5, "shared_reward": False, "obs_range": 4},
    "frozen-wide": {"x_size": 12, "y_size": 9, "n_evaders": 8, "freeze_evaders": True,
                    "obs_range": 9, "max_cycles": 60},
    "rewards": {**SMALL, "n_evaders": 3, "tag_reward": 0.5, "catch_reward": 2.0,
                "urgency_reward": -0.3, "n_pursuers": 5},
}  # fmt: skip


class PlayBack:
    """An evader controller that plays the moves it is given, one per call."""

    def __init__(self):
        self.moves: list[int] = []

    def act(self, state) -> int:
        return self.moves.pop(0)


def _load(native, originals) -> None:
    """The native batch at the originals' start positions."""
    for i, env in enumerate(originals):
        pz = env.unwrapped.env
        pursuers = [a.current_position().tolist() for a in pz.pursuer_layer.allies]
        evaders = [a.current_position().tolist() for a in pz.evader_layer.allies]
        native.pursuers[i] = torch.tensor(pursuers)
        native.evaders[i] = torch.tensor(evaders)
    native.alive[:] = True


def _close(ours, theirs, what: str) -> None:
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=TOL, rtol=0,
                               err_msg=what)  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_native_pursuit_matches_pettingzoo_step_for_step(case):
    params = CASES[case]
    originals = [make_env("sisl/pursuit", params) for _ in range(ENVS)]
    obs = [env.reset(seed=200 + i)[0] for i, env in enumerate(originals)]
    info = describe(make_env("sisl/pursuit", params), lookup("sisl/pursuit").id,
                    lookup("sisl/pursuit").factory)  # fmt: skip
    native = native_class("sisl/pursuit")(params, ENVS, "cpu", dtype=torch.float64)
    assert native.info == info
    native.reset(0)
    _load(native, originals)
    controllers = [PlayBack() for _ in originals]
    for env, controller in zip(originals, controllers, strict=True):
        env.unwrapped.env.evader_controller = controller
    agents = info.groups[0].agents
    start = native.observe_now()
    _close(start.obs["pursuer"], [[o[a] for a in agents] for o in obs], "start obs")
    _close(start.state, [e.state().flatten() for e in originals], "start state")
    after_catch = {}
    caught_now = native._caught

    def caught_and_kept(pursuers):  # the evaders left to move this step, before any reset
        caught, catchers = caught_now(pursuers)
        after_catch["left"] = native.alive & ~caught
        return caught, catchers

    native._caught = caught_and_kept
    rng = np.random.default_rng(11)
    alive = np.ones(ENVS, dtype=bool)
    caught = ended_early = False
    for t in range(params["max_cycles"]):
        actions = rng.integers(0, 5, size=(ENVS, len(agents)))
        moves = torch.as_tensor(rng.integers(0, 5, size=(ENVS, native.V)))
        if params.get("freeze_evaders"):  # the original's frozen evaders stay (move 4)
            moves = torch.full_like(moves, 4)
        native.randint = lambda high, *shape, moves=moves: moves  # the evaders' moves
        before = native.alive.clone()
        tr = native.step({"pursuer": torch.as_tensor(actions)})
        left = after_catch["left"]
        for i, env in enumerate(originals):
            if not alive[i]:
                continue
            done = bool(tr.terminated[i] | tr.truncated[i])
            controllers[i].moves = [int(moves[i, j]) for j in left[i].nonzero().flatten()]
            caught |= bool((before[i] & ~left[i]).any())
            ob, rew, term, trunc, _ = env.step(
                {a: int(actions[i, j]) for j, a in enumerate(agents)}
            )
            assert controllers[i].moves == [], f"step {t} env {i}: evaders left differ"
            _close(tr.rewards["pursuer"][i], [rew[a] for a in agents], f"step {t} env {i} rewards")
            assert bool(tr.terminated[i]) == any(term.values()), f"step {t} env {i}"
            assert bool(tr.truncated[i]) == any(trunc.values()), f"step {t} env {i}"
            view = tr.final if done else tr.next
            _close(view.obs["pursuer"][i], [ob[a] for a in agents], f"step {t} env {i} obs")
            if done:
                alive[i] = False
                ended_early |= t < params["max_cycles"] - 1
            else:
                _close(tr.next.state[i], env.state().flatten(), f"step {t} env {i} state")
        if not alive.any():
            break
    assert not alive.any(), "the original episodes did not end within max_cycles"
    if case in ("small", "stacked"):
        assert caught, "this case is meant to see evaders caught"
    if case == "stacked":
        assert ended_early, "this case is meant to see episodes end before their time"


WINDOW = {"constraint_window": 0.8, "n_evaders": 5, "n_pursuers": 4}


@pytest.mark.parametrize("params", [{}, WINDOW], ids=["default", "window"])
def test_native_pursuit_starts_follow_the_original_distribution(params):
    """Each cell's chance of holding a pursuer and an evader at the start, over 1,500 starts
    of each, within 5 standard errors; and nobody starts beside one of its own kind."""
    samples = 1500
    native = native_class("sisl/pursuit")(params, samples, "cpu", dtype=torch.float64)
    ours = native.reset(3).state.view(samples, 16, 16, 3).numpy()
    env = make_env("sisl/pursuit", params)
    theirs = np.array([(env.reset(seed=s), env.state())[1] for s in range(samples)])
    np.testing.assert_array_equal(ours[0, ..., 0], theirs[0, ..., 0])  # the same building
    for layer in (1, 2):
        a, b = (ours[..., layer] > 0).mean(0), (theirs[..., layer] > 0).mean(0)
        both = (a + b) / 2
        se = np.sqrt(np.maximum(both * (1 - both), 1e-3) * 2 / samples)
        assert (np.abs(a - b) <= 5 * se).all(), (layer, np.abs(a - b).max())
        assert (ours[..., layer] <= 1).all()  # none on the same cell
    for kind in ("pursuers", "evaders"):
        pos = getattr(native, kind)
        gap = (pos.unsqueeze(1) - pos.unsqueeze(2)).abs().sum(-1)  # [E, n, n]
        off = ~torch.eye(pos.shape[1], dtype=torch.bool)
        assert (gap[:, off] >= 2).all(), kind  # none on or beside another of its kind


def test_a_crowded_start_keeps_every_agent_on_an_open_cell_and_a_tiny_window_is_refused():
    """More evaders than fit apart (the original would draw forever): each still starts on
    an open cell, beside others rather than on them while a free cell is left."""
    native = native_class("sisl/pursuit")({"x_size": 8, "y_size": 8, "n_evaders": 40}, 64)
    native.reset(0)
    pos = native.evaders  # [E, 40, 2]
    assert not native.building[pos[..., 0], pos[..., 1]].any()
    cells = pos[..., 0] * 8 + pos[..., 1]
    assert all(len(set(row.tolist())) == 40 for row in cells)  # 49 open cells: none shared
    with pytest.raises(ValueError, match="less than one cell"):
        native_class("sisl/pursuit")({"constraint_window": 0.05}, 4)
