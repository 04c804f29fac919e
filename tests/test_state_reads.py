"""A PettingZoo env computes its global state only for trainers that read one: `env.state()`
can cost as much as a step (pistonball renders a 560x880 frame for it), and IPPO, IQL and
VDN never look at it."""

from __future__ import annotations

import pytest
import torch

from marlctl.envs.pettingzoo import PettingZooEnv
from marlctl.envs.probe import probe
from marlctl.spec.models import Spec
from marlctl.train.runner import build_trainer

SPREAD = "mpe/simple_spread"


@pytest.mark.parametrize(
    ("algo", "model", "reads"),
    [
        ("ippo", {}, False),
        ("mappo", {}, True),
        ("iql", {}, False),
        ("vdn", {}, False),
        ("qmix", {}, True),
        ("maddpg", {}, True),
        ("happo", {}, True),
    ],
)
def test_a_trainer_says_whether_it_reads_the_state(algo, model, reads):
    info = probe(SPREAD, {})
    spec = Spec.model_validate({"env": {"id": SPREAD}, "algo": {"name": algo}, "model": model})
    trainer = build_trainer(spec, info, 2, torch.device("cpu"), 10, (0,))
    assert trainer.reads_state is reads


def test_an_env_without_state_never_calls_state_and_steps_alike(monkeypatch):
    info = probe(SPREAD, {})
    full = PettingZooEnv(SPREAD, {}, info, 2, "cpu")
    calls = []
    spared = PettingZooEnv(SPREAD, {}, info, 2, "cpu", state=False)
    for env in spared._local.envs:
        real = env.state
        monkeypatch.setattr(env, "state", lambda real=real: calls.append(1) or real())
    a, b = full.reset(seed=3), spared.reset(seed=3)
    actions = {g.name: torch.zeros(2, g.n_agents, dtype=torch.long) for g in info.groups}
    for _ in range(30):  # through an episode end (25 steps)
        for g in info.groups:
            assert torch.equal(a.obs[g.name], b.obs[g.name])
        assert b.state.shape == a.state.shape and not b.state.any()
        ta, tb = full.step(actions), spared.step(actions)
        a, b = ta.next, tb.next
        for g in info.groups:
            assert torch.equal(ta.rewards[g.name], tb.rewards[g.name])
    assert calls == [] and full.reset(seed=0).state.any()
    full.close()
    spared.close()
