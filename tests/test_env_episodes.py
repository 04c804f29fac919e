"""Every registered env, on every backend it has, played through several episode ends.

Random actions (allowed ones where the env masks them) on 2 env copies with short
episodes: each step's tensors have the shapes the env's description promises, rewards and
observations are finite, episodes end within `max_cycles` and the env resets itself.
Params come from the env's preset (`envs/NAME.yaml`), so the presets are played too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from marlctl.envs.batch import Observation, Transition
from marlctl.envs.families import ENVS
from marlctl.envs.info import EnvInfo
from marlctl.envs.native import is_native, native_class
from marlctl.envs.probe import probe
from marlctl.envs.registry import env_params, lookup, preset_name, registered_ids

PRESETS = Path(__file__).resolve().parent.parent / "envs"
COPIES = 2
MAX_CYCLES = 6  # short episodes: a few steps each, so every env ends several
ENDS = 2  # episode ends each copy must reach
# The parameter that limits an episode's length: PettingZoo's, LBF's and RWARE's names.
TIME_LIMITS = ("max_cycles", "max_episode_steps", "max_steps", "num_timesteps")
# Games with no time limit end within their board's number of moves.
GAME_LENGTHS = {
    "classic/tictactoe": 9,
    "classic/connect_four": 42,
    **{f"momaland/{name}": 200 for name in ("catch", "surround", "escort")},  # fixed horizon
}


def _cases():
    for env_id in registered_ids():
        if env_id in ENVS:
            backend = "vmas" if lookup(env_id).suite == "vmas" else "pettingzoo"
            yield pytest.param(env_id, backend, id=f"{backend}-{env_id}")
        if is_native(env_id):
            yield pytest.param(env_id, "native", id=f"native-{env_id}")


def preset_params(env_id: str) -> dict:
    text = (PRESETS / f"{preset_name(env_id)}.yaml").read_text(encoding="utf-8")
    return dict(yaml.safe_load(text)["params"] or {})


def make(env_id: str, backend: str, params: dict, info: EnvInfo):
    if backend == "native":
        return native_class(env_id)(params, COPIES, "cpu")
    if backend == "vmas":
        from marlctl.envs.vmas import VmasEnv

        return VmasEnv(env_id, dict(lookup(env_id).kwargs)["scenario"], params, COPIES, "cpu")
    from marlctl.envs.pettingzoo import PettingZooEnv

    return PettingZooEnv(env_id, params, info, COPIES, torch.device("cpu"))


def random_actions(info: EnvInfo, ob: Observation, generator: torch.Generator) -> dict:
    """Uniform actions per agent: among the allowed ones where there is a mask; inside
    the bounds (at most [-1, 1]) for continuous actions."""
    actions = {}
    for g in info.groups:
        if g.discrete:
            mask = ob.masks[g.name]
            weights = torch.ones(COPIES, g.n_agents, g.n_actions) if mask is None else mask.float()
            weights[weights.sum(-1) == 0] = 1.0  # an agent with nothing allowed (not acting)
            flat = torch.multinomial(weights.view(-1, g.n_actions), 1, generator=generator)
            actions[g.name] = flat.view(COPIES, g.n_agents)
        else:
            low = torch.tensor(g.action_low).clamp(min=-1.0)
            high = torch.tensor(g.action_high).clamp(max=1.0)
            u = torch.rand(COPIES, g.n_agents, g.n_actions, generator=generator)
            actions[g.name] = low + u * (high - low)
    return actions


def finite(t: torch.Tensor) -> bool:
    # One sum instead of an elementwise check: NaN or inf anywhere makes it non-finite,
    # and image observations (pistonball's state is 1.5M pixels) stay fast.
    return bool(t.sum().isfinite())


def check_observation(info: EnvInfo, ob: Observation) -> None:
    assert ob.state.shape == (COPIES, info.state_dim) and finite(ob.state)
    for g in info.groups:
        obs = ob.obs[g.name]
        assert obs.shape == (COPIES, g.n_agents, *g.obs_shape), g.name
        # uint8 frames stay uint8 (scaled where a network reads them); the rest is float32
        assert obs.dtype == getattr(torch, g.obs_storage), g.name
        assert finite(obs.float()), g.name
        assert ob.active[g.name].shape == (COPIES, g.n_agents), g.name
        mask = ob.masks[g.name]
        if mask is not None:
            assert mask.shape == (COPIES, g.n_agents, g.n_actions) and mask.dtype == torch.bool


def check_transition(info: EnvInfo, tr: Transition) -> torch.Tensor:
    """The envs whose episode ended this step, after checking every tensor."""
    check_observation(info, tr.next)
    check_observation(info, tr.final)
    for g in info.groups:
        reward = tr.rewards[g.name]
        assert reward.shape == (COPIES, g.n_agents) and reward.isfinite().all(), g.name
    assert tr.terminated.shape == tr.truncated.shape == (COPIES,)
    assert tr.terminated.dtype == tr.truncated.dtype == torch.bool
    assert not (tr.terminated & tr.truncated).any()
    return tr.terminated | tr.truncated


def play(env, info: EnvInfo, max_cycles: int, ends: int = ENDS, seed: int = 0) -> dict:
    """Step until every copy has ended `ends` episodes; episode lengths and what was seen."""
    generator = torch.Generator().manual_seed(seed)
    ob = env.reset(seed)
    check_observation(info, ob)
    lengths: list[list[int]] = [[] for _ in range(COPIES)]
    steps = [0] * COPIES
    left_early = False  # an agent left an episode before it ended
    terminated = truncated = 0
    for _ in range(ends * max_cycles + 1):
        tr = env.step(random_actions(info, ob, generator))
        done = check_transition(info, tr)
        terminated += int(tr.terminated.sum())
        truncated += int(tr.truncated.sum())
        for i in range(COPIES):
            steps[i] += 1
            if info.turn_based:  # one agent moves per step: the one whose turn it is
                moving = sum(int(tr.next.active[g.name][i].sum()) for g in info.groups)
                assert moving == 1, (i, moving)
            if done[i]:
                lengths[i].append(steps[i])
                steps[i] = 0
                for g in info.groups:  # a new episode: every agent is back
                    assert info.turn_based or tr.next.active[g.name][i].all(), (g.name, i)
            elif not info.turn_based:
                left_early |= any(not tr.next.active[g.name][i].all() for g in info.groups)
            assert steps[i] < max_cycles, f"copy {i} ran {steps[i]} steps without an end"
        ob = tr.next
        if all(len(ended) >= ends for ended in lengths):
            break
    assert all(len(ended) >= ends for ended in lengths), lengths
    assert all(n <= max_cycles for ended in lengths for n in ended), lengths
    return {
        "lengths": lengths,
        "terminated": terminated,
        "truncated": truncated,
        "left_early": left_early,
    }


@pytest.mark.parametrize("env_id, backend", list(_cases()))
def test_every_env_plays_through_episode_ends_on_each_backend(env_id: str, backend: str) -> None:
    entry = lookup(env_id)
    if not entry.installed:
        pytest.skip(f"{env_id} is not installed: {entry.install_hint}")
    limits = [k for k in TIME_LIMITS if k in env_params(env_id).defaults]
    params, max_cycles = preset_params(env_id), MAX_CYCLES
    if limits:
        params[limits[0]] = MAX_CYCLES
    else:
        assert env_id in GAME_LENGTHS, "shorten this env's episodes another way"
        max_cycles = GAME_LENGTHS[env_id]
    info = probe(env_id, params)
    env = make(env_id, backend, params, info)
    try:
        if backend == "native":  # a native task presents its original's spaces exactly
            assert env.info.groups == info.groups and env.info.state_dim == info.state_dim
        play(env, info, max_cycles)
    finally:
        env.close()


@pytest.mark.parametrize("terminate_on_fall", [True, False])
def test_multiwalker_episodes_end_when_a_walker_falls(terminate_on_fall: bool) -> None:
    """Regression: multiwalker's state() reads a fallen walker's destroyed body, so reading
    the state after a fall failed ('NoneType' object has no attribute 'position') at the
    first episode end, and mid-episode when the others walk on (terminate_on_fall=False).
    Its global state is the walkers' observations instead."""
    entry = lookup("sisl/multiwalker")
    if not entry.installed:
        pytest.skip(f"sisl/multiwalker is not installed: {entry.install_hint}")
    params = {**preset_params("sisl/multiwalker"), "terminate_on_fall": terminate_on_fall}
    info = probe("sisl/multiwalker", params)
    env = make("sisl/multiwalker", "pettingzoo", params, info)
    try:
        # Random walkers fall within ~200 steps: these episodes end by a fall, well before
        # the time limit (max_cycles, which multiwalker also reports as a termination).
        seen = play(env, info, params["max_cycles"], ends=1)
    finally:
        env.close()
    (walkers,) = info.groups
    assert not info.state_from_env and info.state_dim == walkers.n_agents * walkers.obs_dim
    assert seen["terminated"] >= COPIES
    assert all(n < params["max_cycles"] for ended in seen["lengths"] for n in ended)
    if not terminate_on_fall:
        assert seen["left_early"]  # a fallen walker left while the others walked on


@pytest.mark.parametrize("state", [True, False])
def test_env_workers_send_final_observations_and_states_as_one_process_makes_them(state):
    """Each worker sends final observations only where one of its episodes ended, and no
    state where none is computed: rows that ended in one worker's slice and not another's
    come out as the envs stepped in one process give them, state zeros where not read."""
    from marlctl.envs.pettingzoo import PettingZooEnv

    env_id = "sisl/multiwalker"
    entry = lookup(env_id)
    if not entry.installed:
        pytest.skip(f"{env_id} is not installed: {entry.install_hint}")
    params = {**preset_params(env_id), "terminate_on_fall": True}
    info = probe(env_id, params)
    (walkers,) = info.groups
    made = [
        PettingZooEnv(env_id, params, info, 4, torch.device("cpu"), workers=w, state=state)
        for w in (0, 2)
    ]
    try:
        local, remote = made
        assert_same(local.reset(0), remote.reset(0))
        draw = torch.Generator().manual_seed(0)
        ends = []
        for _ in range(160):
            actions = {"walker": torch.rand(4, walkers.n_agents, 4, generator=draw) * 2 - 1}
            x, y = local.step(actions), remote.step(actions)
            done = x.terminated | x.truncated
            assert torch.equal(done, y.terminated | y.truncated)
            assert_same(x.next, y.next)
            assert_same(x.final, y.final, rows=done)
            assert torch.equal(x.rewards["walker"], y.rewards["walker"])
            if not state:
                assert not y.next.state.any() and y.next.state.shape == (4, info.state_dim)
            ends.append(done.tolist())
        # Some steps ended episodes in one worker's rows only.
        assert any(any(d[:2]) != any(d[2:]) for d in ends)
    finally:
        for env in made:
            env.close()


def assert_same(a, b, rows=None) -> None:
    """Observations `a` and `b` equal, in `rows` only where given."""
    pick = (lambda t: t) if rows is None else (lambda t: t[rows])
    assert torch.equal(pick(a.state), pick(b.state))
    for key in a.obs:
        assert torch.equal(pick(a.obs[key]), pick(b.obs[key]))
        assert torch.equal(pick(a.active[key]), pick(b.active[key]))
