"""Rows that leave a batch (`marlctl.train.compact`): a pruned or failed sweep trial's rows
are cut out of the trainer and the envs, and the rows that remain compute what they would
have computed in the full batch, bit for bit."""

from __future__ import annotations

import pytest
import torch
from test_algorithms import _trainer
from test_rows import Q_ROWS, ROWS

from marlctl.envs.native import native_class
from marlctl.train.compact import keep_observation, keep_rows

KEEP = [0, 2]


def _losses(trainer, env, ob, iterations: int):
    found = []
    for _ in range(iterations):
        ob, step = trainer.train_iteration(env, ob)
        found.append({k: v.clone() for k, v in step.items()})
    return ob, found


@pytest.mark.parametrize(
    "algo, rows, config",
    [
        ("mappo", ROWS, {"epochs": 2}),
        ("ippo", ROWS, {"epochs": 2, "anneal_lr": True}),
        ("qmix", Q_ROWS, {"target_update_every": 0}),
        ("iql", Q_ROWS, {"target_update_every": 0}),
    ],
)
@pytest.mark.parametrize("recurrent", [None, "gru"])
def test_the_rows_left_in_a_batch_compute_what_they_computed_in_the_full_one(
    algo, rows, config, recurrent
):
    torch.set_num_threads(1)
    model = {"recurrent": recurrent}
    if recurrent and algo in ("qmix", "iql"):
        config = {**config, "sequence_length": 4}
    before, after = 6, 6

    full, env, ob = _trainer(algo, (0, 1, 2), model=model, rows=rows, **config)
    ob, _ = _losses(full, env, ob, before)
    _, expected = _losses(full, env, ob, after)

    cut, env, ob = _trainer(algo, (0, 1, 2), model=model, rows=rows, **config)
    ob, _ = _losses(cut, env, ob, before)
    ob = keep_observation(ob, KEEP, 3)
    keep_rows(cut, KEEP)
    env.keep_blocks(KEEP)
    assert cut.seeds == (0, 2) and env.num_envs == 8
    _, found = _losses(cut, env, ob, after)

    assert any(float(step["loss/grad_norm"][0]) > 0 for step in found)
    for theirs, ours in zip(expected, found, strict=True):
        for key, value in ours.items():
            assert value.shape[0] == 2, key
            assert torch.equal(value, theirs[key][KEEP]), key
    weights = full.policies.state_dict()
    for name, value in cut.policies.state_dict().items():
        assert torch.equal(value, weights[name][KEEP]), name
    for name, optimizer in cut.optimizers.items():
        theirs = list(full.optimizers[name].state.values())
        for mine, their in zip(optimizer.state.values(), theirs, strict=True):
            for key, value in mine.items():
                expected_value = their[key][KEEP] if value.dim() else their[key]
                assert torch.equal(value, expected_value), (name, key)
    if algo in ("qmix", "iql"):
        assert cut.buffer.seeds == 2 and len(cut.buffer.generators) == 2


def _actions(env, ob, generator):
    """Uniform actions among the allowed ones, for every env row."""
    actions = {}
    for group in env.info.groups:
        mask = ob.masks[group.name]
        if mask is None:
            mask = torch.ones(*ob.obs[group.name].shape[:2], group.n_actions, dtype=torch.bool)
        flat = mask.flatten(0, 1).float()
        drawn = torch.multinomial(flat, 1, generator=generator).view(mask.shape[:2])
        actions[group.name] = drawn
    return actions


@pytest.mark.parametrize(
    "env_id, params",
    [
        # 3 agents and 3 landmarks: 6 entities, as many as the 6 envs, whose sizes, masses
        # and speeds are constants of the env and stay whole.
        ("mpe/simple_spread", {"N": 3, "max_cycles": 4}),
        ("lbf/Foraging-8x8-2p-2f-coop-v3", {"max_cycles": 5}),
        ("smax/3m", {"max_cycles": 6}),
        ("matrix/climbing", {}),
    ],
)
def test_the_seed_blocks_left_in_an_env_step_as_they_stepped_in_the_full_one(env_id, params):
    cls = native_class(env_id)
    full, cut = cls(params, 6, "cpu", seeds=2), cls(params, 6, "cpu", seeds=2)
    constants = {k: v.clone() for k, v in vars(full).items() if torch.is_tensor(v)}
    generator = torch.Generator().manual_seed(0)
    ob = full.reset([5, 7])
    cut.reset([5, 7])
    for _ in range(7):  # through resets
        actions = _actions(full, ob, generator)
        ob = full.step(actions).next
        cut.step(actions)
    cut.keep_blocks([1])
    assert cut.num_envs == 3 and len(cut.generators) == 1
    for name in cut._constants:
        if name in constants:
            assert torch.equal(getattr(cut, name), constants[name]), name
    for _ in range(12):
        actions = _actions(full, ob, generator)
        step = full.step(actions)
        mine = cut.step({k: v[3:] for k, v in actions.items()})
        ob = step.next
        for key, value in step.next.obs.items():
            assert torch.equal(mine.next.obs[key], value[3:]), key
        assert torch.equal(mine.next.state, step.next.state[3:])
        for key, value in step.rewards.items():
            assert torch.equal(mine.rewards[key], value[3:]), key
        assert torch.equal(mine.terminated, step.terminated[3:])
        assert torch.equal(mine.truncated, step.truncated[3:])


def test_an_env_not_reset_yet_keeps_its_blocks_too():
    # An evaluation env is cut before its next reset: its blocks then reset as they would.
    cls = native_class("lbf/Foraging-8x8-2p-2f-coop-v3")
    full, cut = cls({}, 8, "cpu", seeds=4), cls({}, 8, "cpu", seeds=4)
    cut.keep_blocks([1, 3])
    mine, theirs = cut.reset([11, 13]), full.reset([10, 11, 12, 13])
    rows = torch.tensor([2, 3, 6, 7])
    for key, value in theirs.obs.items():
        assert torch.equal(mine.obs[key], value[rows]), key
