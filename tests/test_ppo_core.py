"""Unit checks of the shared pieces: GAE, running statistics, batched MLPs."""

from __future__ import annotations

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


def test_running_mean_std_matches_batch_statistics():
    stats = RunningMeanStd()
    data = torch.randn(1000) * 3 + 2
    for chunk in data.split(100):
        stats.update(chunk)
    assert abs(stats.mean.item() - data.mean().item()) < 1e-3
    assert abs(stats.var.item() - data.var(unbiased=False).item()) < 1e-2


def test_batched_mlp_gives_each_agent_its_own_network():
    torch.manual_seed(0)
    net = BatchedMLP(3, 4, [8], 2, "tanh", layer_norm=False, out_gain=1.0)
    x = torch.randn(5, 3, 4)
    out = net(x)
    for agent in range(3):
        h = torch.tanh(x[:, agent] @ net.weights[0][agent] + net.biases[0][agent])
        manual = h @ net.weights[1][agent] + net.biases[1][agent]
        assert torch.allclose(out[:, agent], manual, atol=1e-6)
