"""Unit checks of the shared pieces: GAE, running statistics, batched MLPs."""

from __future__ import annotations

import itertools

import pytest
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


def test_tanh_normal_log_prob_is_torchs_squashed_gaussian_on_the_action_box():
    from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

    from marlctl.envs.info import GroupInfo
    from marlctl.train.actions import ActionBounds, TanhNormal, softplus_scale

    group = GroupInfo("agent", ("a",), (2,), "float32", False, 2, (-2.0, 0.0), (3.0, 1.0))
    bounds = ActionBounds(group, torch.device("cpu"))
    loc = torch.tensor([[0.3, -1.2], [2.0, 0.1]], dtype=torch.float64)
    scale = softplus_scale(torch.tensor([[0.0, -2.0], [1.5, 0.4]], dtype=torch.float64))
    assert float(softplus_scale(torch.zeros(1))) == pytest.approx(1.0)  # TorchRL's default
    assert float(softplus_scale(torch.tensor([-50.0]))) == pytest.approx(0.01)
    dist = TanhNormal(loc, scale, bounds)
    reference = TransformedDistribution(
        Normal(loc, scale),
        [TanhTransform(), AffineTransform(bounds.low.double() + 0.5 * (bounds.high - bounds.low),
                                          0.5 * (bounds.high - bounds.low).double())],
    )  # fmt: skip
    u = torch.tensor([[0.5, -3.0], [1.0, 0.0]], dtype=torch.float64)
    action = bounds.squash(u)
    assert ((action >= bounds.low) & (action <= bounds.high)).all()
    assert torch.allclose(dist.log_prob(u), reference.log_prob(action), atol=1e-6)
    # Far in the tail tanh rounds to 1: the log-probability stays finite.
    assert torch.isfinite(dist.log_prob(torch.full_like(u, 40.0))).all()
    # The one-sample entropy estimate is unbiased: its mean is -E[log p].
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(200_000, *loc.shape, generator=gen, dtype=torch.float64)
    estimates = dist.entropy(noise).mean(0)
    samples = loc + scale * noise
    assert torch.allclose(estimates, -dist.log_prob(samples).mean(0), atol=0.01)
    assert torch.allclose(estimates, -reference.log_prob(bounds.squash(samples)).mean(0), atol=0.01)


@pytest.mark.parametrize("recurrent", [None, "gru"])
def test_torch_init_draws_every_weight_and_bias_as_nn_linear_does(recurrent):
    from marlctl.spec.models import ModelSpec
    from marlctl.train.networks import AgentNet

    gens = [torch.Generator().manual_seed(0)]
    model = ModelSpec(hidden=[32, 16], activation="tanh", init="torch", recurrent=recurrent)
    net = AgentNet(1, 3, 8, 4, model, "shared", gens, out_gain=0.01)
    for name, p in net.named_parameters():
        fan_in = p.shape[-2] if p.dim() == 4 else None
        if name.startswith("gru"):
            bound = 1 / 16**0.5  # the cell's size
        elif fan_in is None:  # a bias: bounded by its layer's fan-in
            continue
        else:
            bound = 1 / fan_in**0.5
        assert p.abs().max() <= bound, name
        assert p.abs().max() > 0.5 * bound, name  # uniform over the range, not scaled down
    biases = [p for n, p in net.named_parameters() if "bias" in n]
    assert biases and all(b.abs().sum() > 0 for b in biases)  # drawn, not zero


def test_a_shared_centralised_critic_runs_once_per_state_and_updates_as_per_agent_copies():
    from marlctl.envs.native import native_class
    from marlctl.spec.models import Spec
    from marlctl.train.runner import build_trainer

    params = {"N": 3, "max_cycles": 10, "continuous_actions": True}

    def trainer(per_state: bool, agent_ids: bool = False):
        env = native_class("mpe/simple_spread")(params, 8, "cpu", seeds=2)
        spec = Spec.model_validate(
            {
                "env": {"id": "mpe/simple_spread", "backend": "native", "params": params},
                "algo": {"name": "mappo", "rollout_steps": 6, "epochs": 2, "minibatches": 2},
                "model": {"hidden": [16], "agent_ids": agent_ids},
            }
        )
        t = build_trainer(spec, env.info, 4, torch.device("cpu"), 10, (3, 4))
        ob = env.reset([3, 4])
        t.restart_episodes()
        pol = next(iter(t.policies.values()))
        if not per_state:
            pol.state_critic = False
        return t, env, ob, pol

    assert not trainer(True, agent_ids=True)[3].state_critic  # agent ids: a value per agent
    once, env, ob, pol = trainer(True)
    assert pol.state_critic
    rows = []
    pol.critic.mlp.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[-2]))
    split = once.split(ob)
    value, _ = pol.value(pol.critic_input(split))
    assert rows == [1] and value.shape[-1] == 3  # one row per state, a value per agent
    every = pol.critic(split.state.unsqueeze(-2).expand(*split.state.shape[:-1], 3, -1))[0]
    assert torch.allclose(value, every.squeeze(-1), atol=1e-6)

    # Two iterations from the same start: the same parameters as a critic run per agent.
    copies, env2, ob2, _ = trainer(False)
    for _ in range(2):
        ob = once.train_iteration(env, ob)[0]
        ob2 = copies.train_iteration(env2, ob2)[0]
    for a, b in zip(once.policies.values(), copies.policies.values(), strict=True):
        for mine, theirs in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.allclose(mine, theirs, atol=1e-5)


def test_on_policy_returns_bootstrap_through_time_limits_only_when_told():
    from marlctl.envs.native import native_class
    from marlctl.spec.models import Spec
    from marlctl.train.runner import build_trainer

    params = {"N": 2, "max_cycles": 4}  # 4-step episodes: the 6-step rollout crosses a cut
    stored = {}
    for bootstrap in (True, False):
        env = native_class("mpe/simple_spread")(params, 3, "cpu")
        spec = Spec.model_validate(
            {
                "env": {"id": "mpe/simple_spread", "backend": "native", "params": params},
                "algo": {"name": "mappo", "rollout_steps": 6, "bootstrap_time_limit": bootstrap},
                "model": {"hidden": [8]},
            }
        )
        trainer = build_trainer(spec, env.info, 3, torch.device("cpu"), 10, (0,))
        ob = env.reset(0)
        trainer.restart_episodes()
        rollouts, _, dones = trainer.collect(env, ob)
        stored[bootstrap] = (rollouts["agent"].rewards, dones)
    (boot, dones), (plain, same_dones) = stored[True], stored[False]
    assert torch.equal(dones, same_dones) and dones[3].all() and not dones[:3].any()
    # The same policy and env: rewards differ exactly at the cut, by gamma * V(final obs).
    assert torch.equal(boot[:3], plain[:3]) and torch.equal(boot[4:], plain[4:])
    assert (boot[3] != plain[3]).all()


@pytest.mark.parametrize("sharing", ["shared", "independent"])
def test_a_recurrent_net_runs_a_sequence_as_it_runs_its_steps(sharing):
    # `AgentNet.sequence` (the update's path) computes what `forward` does step by step (the
    # rollout's path), state reset where episodes start, gradients included; with `copy`,
    # one agent's network alone.
    from marlctl.spec.models import ModelSpec
    from marlctl.train.networks import AgentNet, reset_where

    gens = [torch.Generator().manual_seed(s) for s in range(2)]
    model = ModelSpec(hidden=[24, 16], activation="relu", recurrent="gru")
    net = AgentNet(2, 3, 10, 5, model, sharing, gens)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 9, 3, 10, generator=gen)
    h0 = torch.randn(2, 4, 3, 16, generator=gen)
    first = torch.rand(2, 4, 9, generator=gen) < 0.2

    def stepwise(x, h, copy=None):
        outs = []
        for t in range(x.shape[2]):
            out, h = net(x[:, :, t], reset_where(h, first[:, :, t]), copy=copy)
            outs.append(out)
        return torch.stack(outs, 2)

    expected = stepwise(x, h0)
    grads = torch.autograd.grad(expected.square().sum(), list(net.parameters()))
    out = net.sequence(x, h0, first)
    assert out.shape == (2, 4, 9, 3, 5)
    assert torch.allclose(out, expected, atol=1e-5)
    for g, g_seq in zip(
        grads, torch.autograd.grad(out.square().sum(), list(net.parameters())), strict=True
    ):
        assert torch.allclose(g, g_seq, atol=1e-4)
    if sharing == "independent":  # agent 2's network alone (of seed 0; agent 0's of seed 1)
        copy = torch.tensor([2, 0])
        one = net.sequence(x[:, :, :, :1], h0[:, :, :1], first, copy)
        assert torch.allclose(one, stepwise(x[:, :, :, :1], h0[:, :, :1], copy), atol=1e-5)
        assert not torch.allclose(one[0], expected[0, :, :, :1], atol=1e-3)
        assert torch.allclose(one[1], expected[1, :, :, :1], atol=1e-5)
