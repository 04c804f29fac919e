"""Unit checks of the shared pieces: GAE, running statistics, batched MLPs."""

from __future__ import annotations

import itertools

import torch

from marlctl.train.core import BatchedMLP, RunningMeanStd, gae


def test_gae_matches_a_hand_computed_episode():
    rewards = torch.tensor([1.0, 0.0, 2.0]).view(3, 1, 1)
    values = torch.tensor([0.5, 0.4, 0.3]).view(3, 1, 1)
    last = torch.tensor([[9.0]])  # after the episode ended: must not be used
    continues = torch.tensor([True, True, False]).view(3, 1, 1)
    gamma, lam = 0.9, 0.8
    adv, ret = gae(rewards, values, last, continues, gamma, lam)
    d2 = 2.0 - 0.3
    d1 = 0.0 + gamma * 0.3 - 0.4
    d0 = 1.0 + gamma * 0.4 - 0.5
    a1 = d1 + gamma * lam * d2
    expected = torch.tensor([d0 + gamma * lam * a1, a1, d2])
    assert torch.allclose(adv.view(3), expected)
    assert torch.allclose(ret, adv + values)


def test_gae_does_not_bootstrap_an_agent_that_left_early():
    # Agent 1 gets -1 and leaves after step 0; its env goes on and the critic says 5.0 on the
    # blank observation it is given afterwards.
    rewards = torch.tensor([[[0.0, -1.0]], [[0.0, 0.0]]])
    values = torch.tensor([[[0.0, 0.0]], [[0.0, 5.0]]])
    continues = torch.tensor([[[True, False]], [[True, False]]])
    adv, _ = gae(rewards, values, torch.zeros(1, 2), continues, 0.99, 0.95)
    assert adv[0, 0, 1].item() == -1.0


def test_running_mean_std_matches_batch_statistics_per_seed():
    stats = RunningMeanStd(seeds=2)
    data = torch.stack([torch.randn(1000) * 3 + 2, torch.randn(1000) - 5])
    for chunk in data.split(100, dim=1):
        stats.update(chunk)
    for seed in range(2):
        assert abs(stats.mean[seed].item() - data[seed].mean().item()) < 1e-3
        assert abs(stats.var[seed].item() - data[seed].var(unbiased=False).item()) < 2e-2


def _generators(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_batched_mlp_gives_each_agent_its_own_network():
    net = BatchedMLP(1, 3, 4, [8], 2, "tanh", False, 1.0, _generators(0))
    x = torch.randn(1, 5, 3, 4)
    out = net(x)
    for agent in range(3):
        w0, b0 = net.weights[0][0, agent], net.biases[0][0, agent]
        h = torch.tanh(x[0, :, agent] @ w0 + b0)
        manual = h @ net.weights[1][0, agent] + net.biases[1][0, agent]
        assert torch.allclose(out[0, :, agent], manual, atol=1e-6)


def test_a_seed_in_a_batch_computes_exactly_what_it_computes_alone():
    for copies, n_out in itertools.product((1, 3), (1, 2)):
        alone = BatchedMLP(1, copies, 4, [8], n_out, "relu", True, 1.0, _generators(7))
        batch = BatchedMLP(3, copies, 4, [8], n_out, "relu", True, 1.0, _generators(1, 7, 9))
        for mine, theirs in zip(alone.parameters(), batch.parameters(), strict=True):
            assert torch.equal(mine[0], theirs[1])  # same initialisation from the same seed
        x = torch.randn(3, 6, 3, 4)
        assert torch.equal(alone(x[1:2])[0], batch(x)[1])
