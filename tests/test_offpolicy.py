"""The pieces replay-based learners share, checked against their reference definitions."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from test_algorithms import _trainer as any_trainer


def _trainer(algo: str, seeds: tuple[int, ...], **config):
    """Discrete actions: the targets checked here are one-hot."""
    return any_trainer(algo, seeds, continuous=False, **config)


def _fill(trainer, env, ob, iterations: int):
    for _ in range(iterations):
        ob, _ = trainer.train_iteration(env, ob)
    return ob


def test_sampled_rewards_are_standardised_by_the_collected_rewards():
    trainer, env, ob = _trainer("vdn", (0,), buffer_size=4_000, learning_starts=10_000)
    ob = _fill(trainer, env, ob, 40)  # 160 transitions, no update yet
    collected = trainer.buffer.data["reward/agent"][0, : trainer.buffer.written].flatten()
    batch = trainer.buffer.sample(4_000)
    scaled = trainer.reward(batch, "agent")
    mean, std = collected.mean(), collected.std(correction=0)
    expected = (batch["reward/agent"] - mean) / std
    assert torch.allclose(scaled, expected, atol=1e-4)
    assert abs(float(scaled.mean())) < 0.2 and abs(float(scaled.std()) - 1) < 0.2


def test_raw_rewards_stay_raw_and_scaling_keeps_their_sign():
    for mode in ("none", "scale"):
        trainer, env, ob = _trainer("iql", (0,), reward_scaling=mode, learning_starts=10_000)
        _fill(trainer, env, ob, 10)
        batch = trainer.buffer.sample(64)
        raw, scaled = batch["reward/agent"], trainer.reward(batch, "agent")
        if mode == "none":
            assert torch.equal(raw, scaled)
        else:
            assert torch.all((raw < 0) == (scaled < 0)) and not torch.equal(raw, scaled)


def _online_target(trainer):
    online = torch.cat([p.flatten() for p in trainer.policies["online"].parameters()])
    target = torch.cat([p.flatten() for p in trainer.target.parameters()])
    return online, target


def test_hard_target_updates_copy_every_n_gradient_steps_and_not_in_between():
    trainer, env, ob = _trainer("qmix", (0,), target_update_every=3)
    ob = _fill(trainer, env, ob, 4)  # 16 transitions: learning starts with the next one
    start = trainer.updates
    for step in range(1, 7):
        ob, _ = trainer.train_iteration(env, ob)
        online, target = _online_target(trainer)
        assert trainer.updates == start + step
        assert torch.equal(online, target) == ((start + step) % 3 == 0), step


def test_polyak_targets_move_a_tau_fraction_towards_the_online_networks():
    trainer, env, ob = _trainer("maddpg", (0,), tau=0.25)
    ob = _fill(trainer, env, ob, 4)
    before = [p.clone() for p in trainer.target.parameters()]
    ob, _ = trainer.train_iteration(env, ob)
    online = trainer.policies["online"].parameters()
    for old, new, source in zip(before, trainer.target.parameters(), online, strict=True):
        assert torch.allclose(new, old + 0.25 * (source - old), atol=1e-6)


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_discrete_target_actions_are_the_target_actors_argmax(algo):
    trainer, env, ob = _trainer(algo, (0,), **({"target_noise": 0.0} if algo == "matd3" else {}))
    ob = _fill(trainer, env, ob, 6)
    batch = trainer.buffer.sample(64)

    def flat(x):
        return x.flatten(1, 2)

    action = trainer._target_action("agent", batch, flat)
    logits, _ = trainer.target["actors"]["agent"](flat(batch["next_obs/agent"]))
    assert torch.equal(action.argmax(-1), logits.argmax(-1))
    assert torch.equal(action.sum(-1), torch.ones_like(action.sum(-1)))  # one-hot


def test_a_shared_critic_without_agent_ids_runs_once_per_sample_with_every_agents_value():
    trainer, env, ob = any_trainer("maddpg", (0,), model={"agent_ids": False})
    ob = _fill(trainer, env, ob, 6)
    batch = trainer.buffer.sample(32)
    state = batch["state"].flatten(1, 2)
    joint = torch.randn(*state.shape[:2], trainer.joint.width)
    q = trainer._q(trainer.critics, "agent", state, joint)  # [S, X, n, K]
    n = q.shape[-2]
    inputs = torch.cat([state, joint], -1).unsqueeze(-2).expand(-1, -1, n, -1)
    each = trainer.critics["agent"].every_member(inputs).squeeze(-1)  # once per agent
    assert n == 2 and torch.allclose(q, each, atol=1e-6)


def test_without_a_target_actor_the_next_action_is_the_current_actors():
    trainer, env, ob = _trainer("maddpg", (0,), target_actor=False, tau=0.01)
    ob = _fill(trainer, env, ob, 12)  # updates move the actors away from their targets
    batch = trainer.buffer.sample(64)

    def flat(x):
        return x.flatten(1, 2)

    action = trainer._target_action("agent", batch, flat)
    online, _ = trainer.actors["agent"](flat(batch["next_obs/agent"]))
    target, _ = trainer.target["actors"]["agent"](flat(batch["next_obs/agent"]))
    assert torch.equal(action.argmax(-1), online.argmax(-1))
    assert not torch.equal(online.argmax(-1), target.argmax(-1))


@pytest.mark.parametrize("joint", ["sampled", "current"])
def test_maddpg_actors_ascend_q_at_the_joint_action_they_are_told(joint):
    """sampled: agent i's Q at its current action and the others' stored ones (the paper);
    current: every agent's Q at the joint action of the current actors (TorchRL's DDPGLoss)."""
    trainer, env, ob = any_trainer(
        "maddpg", (0,), actor_joint_action=joint, policy_regularization=0.0, critic_lr=1e-12
    )
    ob = _fill(trainer, env, ob, 6)
    batch = trainer.prepare(trainer.buffer.sample(64))
    actors = copy.deepcopy(trainer.actors)  # the actors the loss sees, before their step

    def flat(x):
        return x.flatten(1, 2)

    state = flat(batch["state"])
    stored = trainer.critic_action(trainer.groups["agent"], flat(batch["action/agent"]))
    mine = torch.tanh(actors["agent"](flat(batch["obs/agent"]))[0])  # [1, B, n, 2]
    reported = trainer.update(batch)["actor"]
    n = mine.shape[-2]
    with torch.no_grad():
        current = trainer._q(trainer.critics, "agent", state, mine.flatten(-2))[..., 0]
        own = trainer.joint.with_own(stored.flatten(-2), "agent", mine)
        sampled = trainer._q(trainer.critics, "agent", state, own)[..., 0]
    expected = {"current": -current.mean(), "sampled": -sampled.mean()}
    assert n == 2 and not torch.allclose(expected["current"], expected["sampled"], atol=1e-4)
    assert torch.allclose(reported[0], expected[joint], atol=1e-5), (reported, expected)


def test_matd3_smooths_discrete_targets_by_sampling_at_temperature_target_noise():
    trainer, env, ob = _trainer("matd3", (0,), target_noise=1.0)
    ob = _fill(trainer, env, ob, 6)
    batch = trainer.buffer.sample(1)
    batch = {k: v.expand(-1, -1, 20_000, *v.shape[3:]).contiguous() for k, v in batch.items()}

    def flat(x):
        return x.flatten(1, 2)

    action = trainer._target_action("agent", batch, flat)  # [1, 20000, n, A]
    logits, _ = trainer.target["actors"]["agent"](flat(batch["next_obs/agent"])[:, :1])
    expected = torch.softmax(logits[0, 0], -1)  # [n, A]
    assert torch.allclose(action[0].mean(0), expected, atol=0.02)


def test_the_qmix_mixer_starts_with_a_gain_near_one():
    """dQ_tot/dQ_i at initialisation: EPyMARL's default-initialised hypernetworks, not the
    near-zero gain that let the mixer's weights grow without bound."""
    trainer, env, _ = _trainer("qmix", (0,))
    mixer = trainer.mixer
    state = torch.randn(1, 512, env.info.state_dim)
    q = torch.zeros(1, 512, env.info.n_agents, requires_grad=True)
    mixer(q, state).sum().backward()
    gain = q.grad.mean()
    assert 0.3 < float(gain) < 10.0, float(gain)


def test_a_mixer_init_scale_starts_q_tot_near_zero_on_a_state_of_any_scale():
    """SMAX's global state holds raw positions and cooldowns (tens): `nn.Linear`'s init
    gives the mixer a gain of tens there, JaxMARL's 0.001 scale one near zero."""

    def gain_and_value(**config):
        trainer, env, _ = _trainer("qmix", (0,), **config)
        state = 30.0 * torch.rand(1, 512, env.info.state_dim)
        q = torch.zeros(1, 512, env.info.n_agents, requires_grad=True)
        value = trainer.mixer(q, state)
        value.sum().backward()
        return float(q.grad.mean()), float(value.detach().abs().max())

    gain, _ = gain_and_value()
    assert gain > 10.0, gain
    gain, value = gain_and_value(mixer_init_scale=0.001)
    assert 0.0 <= gain < 1e-3 and value < 1e-3, (gain, value)


def test_one_layer_hypernetworks_compute_the_papers_mixer():
    """`hypernet_layers: 1`: w1, w2 and b1 are linear maps of the state, and Q_tot is
    |W2 s|·elu(q·|W1 s| + B1 s) + V(s), as TorchRL's QMixer (BenchMARL's) computes it."""
    trainer, env, _ = _trainer("qmix", (0,), hypernet_layers=1, mixer_embed=8)
    mixer, n, D = trainer.mixer, env.info.n_agents, env.info.state_dim
    for net in (mixer.hyper_w1, mixer.hyper_b1, mixer.hyper_w2):
        assert len(net.weights) == 1  # one linear layer
    assert len(mixer.value.weights) == 2  # V(s) keeps its hidden ReLU layer
    state, q = torch.randn(64, D), torch.randn(64, n)

    def linear(net, x, index=0):
        return x @ net.weights[index][0, 0] + net.biases[index][0, 0]  # [in, out]

    w1 = linear(mixer.hyper_w1, state).abs().view(64, n, 8)
    hidden = F.elu(torch.einsum("xn,xne->xe", q, w1) + linear(mixer.hyper_b1, state))
    value = linear(mixer.value, torch.relu(linear(mixer.value, state)), 1).squeeze(-1)
    expected = (hidden * linear(mixer.hyper_w2, state).abs()).sum(-1) + value
    assert torch.allclose(mixer(q[None], state[None])[0], expected, atol=1e-5)
    two = _trainer("qmix", (0,), mixer_embed=8)[0].mixer
    assert len(two.hyper_w1.weights) == 2  # the default keeps EPyMARL's hidden layer


def test_time_limits_end_returns_only_when_told():
    for bootstrap in (True, False):
        trainer, env, ob = _trainer("iql", (0,), bootstrap_time_limit=bootstrap)
        _fill(trainer, env, ob, 12)  # max_cycles 10: every env hits its time limit once
        terminated = trainer.buffer.data["terminated"][0, : trainer.buffer.written]
        assert bool(terminated.any()) == (not bootstrap)


def test_q_learning_without_double_q_trains_from_the_target_networks_max():
    trainer, env, ob = _trainer("qmix", (0,), double_q=False)
    ob = _fill(trainer, env, ob, 8)
    _, losses = trainer.train_iteration(env, ob)
    assert torch.isfinite(losses["loss/td"]).all() and float(losses["loss/grad_norm"][0]) > 0


def test_recurrent_q_learning_without_double_q_trains_through_the_cli(tmp_path):
    from test_algorithms import quick_spec
    from test_training import run_json, write_spec

    body = quick_spec("qmix", "native", False, model={"recurrent": "gru"})
    body["algo"] |= {"sequence_length": 4, "double_q": False}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    assert out["runs"][0]["final_return"] is not None


def test_masac_gives_each_agent_its_own_critic_unless_told_to_share():
    own, env, ob = _trainer("masac", (0,), learning_starts=8, batch_size=16)
    shared, _, _ = _trainer("masac", (0,), share_critic=True)
    assert own.actors["agent"].sharing == shared.actors["agent"].sharing == "shared"
    assert own.critics["agent"].sharing == "independent"
    assert shared.critics["agent"].sharing == "shared"
    n = own.groups["agent"].n_agents
    per_agent = sum(p.numel() for p in own.critics["agent"].parameters())
    one = sum(p.numel() for p in shared.critics["agent"].parameters())
    assert n == 2 and per_agent > 1.8 * one  # one network per agent, no id input
    before = [p.clone() for p in own.critics["agent"].parameters()]
    _fill(own, env, ob, 6)  # past learning_starts: the per-agent critics train
    after = own.critics["agent"].parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("joint", ["sampled", "current"])
def test_masac_actors_step_against_q_at_the_joint_action_they_are_told(joint):
    """sampled: agent i's soft Q at its fresh sample and the others' stored actions;
    current: at every agent's fresh sample (TorchRL's SACLoss on a group, BenchMARL's)."""
    trainer, env, ob = any_trainer(
        "masac", (0,), actor_joint_action=joint, share_critic=True, model={"agent_ids": False}
    )
    ob = _fill(trainer, env, ob, 6)
    batch = trainer.prepare(trainer.buffer.sample(64))
    alpha = trainer.log_alpha.detach().exp()[0, 0]
    draws = []
    sample = trainer.sample

    def recorded(name, dist):
        draws.append(sample(name, dist))
        return draws[-1]

    trainer.sample = recorded
    reported = trainer.update(batch)["actor"]
    action, log_prob = (x.detach() for x in draws[-1])  # the actors' draw: the last one
    state = batch["state"].flatten(1, 2)
    group = trainer.groups["agent"]
    stored = trainer.critic_action(group, batch["action/agent"].flatten(1, 2))  # in [-1, 1]
    n = action.shape[-2]
    with torch.no_grad():
        rows = []
        for i in range(n):  # agent i's critic input, built by hand
            mine = stored.clone() if joint == "sampled" else action.clone()
            mine[..., i, :] = action[..., i, :]
            x = torch.cat([state, mine.flatten(-2)], -1).unsqueeze(-2)
            rows.append(trainer.critics["agent"].every_member(x).amin(-2)[..., 0, 0])
        q = torch.stack(rows, -1)  # [1, B, n]
    expected = (alpha * log_prob - q).mean()
    assert n == 2 and torch.allclose(reported[0], expected, atol=1e-5), (reported, expected)


def test_masac_runs_a_shared_critic_without_agent_ids_once_per_sample():
    trainer, env, ob = any_trainer("masac", (0,), share_critic=True, model={"agent_ids": False})
    ob = _fill(trainer, env, ob, 6)
    batch = trainer.buffer.sample(32)
    state = batch["state"].flatten(1, 2)
    group = trainer.groups["agent"]
    joint = {"agent": torch.rand(*state.shape[:2], group.n_agents, group.n_actions) * 2 - 1}
    critic = trainer.critics["agent"]
    once = trainer.q_values(critic, "agent", state, joint)  # [S, X, n, 2, 1]
    each = critic.every_member(trainer.critic_input("agent", state, joint, joint["agent"]))
    assert critic.same_for_every_agent and once.shape == each.shape
    assert torch.allclose(once, each, atol=1e-6)


def test_masac_with_discrete_actions_trains_with_actor_joint_action_current():
    trainer, env, ob = _trainer("masac", (0, 1), actor_joint_action="current")
    ob = _fill(trainer, env, ob, 12)
    assert trainer.updates > 0
    for p in trainer.policies.parameters():
        assert torch.isfinite(p).all()


def test_maddpg_exploration_noise_anneals_linearly_and_is_logged():
    trainer, env, ob = any_trainer(
        "maddpg", (0,), exploration_noise=0.8, exploration_noise_end=0.1, noise_anneal_steps=400
    )
    assert trainer.exploration_sigma() == pytest.approx(0.8)
    trainer.env_steps = 200
    assert trainer.exploration_sigma() == pytest.approx(0.45)
    trainer.env_steps = 4_000
    assert trainer.exploration_sigma() == pytest.approx(0.1)
    trainer.env_steps = 0
    for _ in range(4):
        ob, losses = trainer.train_iteration(env, ob)
    sigma = 0.8 + (trainer.env_steps / 400) * (0.1 - 0.8)
    assert float(losses["train/exploration_noise"][0]) == pytest.approx(sigma, rel=1e-5)
    constant, _, _ = any_trainer("maddpg", (0,), exploration_noise=0.3)
    assert constant.exploration_sigma() == 0.3 and constant.schedules() == {}


def test_n_step_targets_sum_discounted_rewards_up_to_the_window_or_episode_end():
    trainer, _, _ = _trainer("iql", (0,), n_step=3, reward_scaling="none", gamma=0.5)
    # Three windows of 3 steps: (a) inside one episode; (b) terminated at its first step, the
    # next episode starting at step 1; (c) cut by a time limit after step 1.
    first = torch.tensor([[False, False, False], [False, True, False], [False, False, True]])
    terminated = torch.tensor([[False, False, False], [True, False, False], [False] * 3])
    reward = torch.tensor([[1.0, 2.0, 4.0], [1.0, 8.0, 8.0], [1.0, 2.0, 8.0]])
    step = torch.arange(3.0).expand(3, 3)  # next_obs names the step it follows
    batch = {
        "first": first.T.unsqueeze(0),  # [S=1, n=3, B=3]
        "terminated": terminated.T.unsqueeze(0),
        "reward/agent": reward.T.unsqueeze(0)[..., None].expand(1, 3, 3, 2),  # 2 agents
        "obs/agent": step.T.unsqueeze(0)[..., None, None].expand(1, 3, 3, 2, 4),
        "next_obs/agent": step.T.unsqueeze(0)[..., None, None].expand(1, 3, 3, 2, 4),
        "next_active/agent": torch.ones(1, 3, 3, 2, dtype=torch.bool),
    }
    out = trainer.prepare(batch)
    assert out["reward/agent"].shape == (1, 1, 3, 2)
    assert out["reward/agent"][0, 0, :, 0].tolist() == [1 + 0.5 * 2 + 0.25 * 4, 1.0, 1 + 0.5 * 2]
    assert out["discount"][0, 0].tolist() == [0.125, 0.5, 0.25]
    assert out["next_obs/agent"][0, 0, :, 0, 0].tolist() == [2.0, 0.0, 1.0]
    assert out["terminated"][0, 0].tolist() == [False, True, False]
    assert out["obs/agent"][0, 0, :, 0, 0].tolist() == [0.0, 0.0, 0.0]


def test_one_step_targets_are_the_normalised_reward_and_gamma():
    trainer, env, ob = _trainer("iql", (0,), buffer_size=4_000, learning_starts=10_000)
    _fill(trainer, env, ob, 10)
    batch = trainer.buffer.sample(64)
    out = trainer.prepare(batch)
    assert torch.equal(out["reward/agent"], trainer.reward(batch, "agent"))
    assert torch.all(out["discount"] == trainer.cfg.gamma)
    assert torch.equal(out["next_obs/agent"], batch["next_obs/agent"])


@pytest.mark.parametrize("algo", ["masac", "maddpg", "qmix", "hasac"])
def test_n_step_returns_train_every_replay_learner(algo):
    trainer, env, ob = any_trainer(algo, (0, 1), n_step=4)
    ob = _fill(trainer, env, ob, 12)
    assert trainer.updates > 0
    for p in trainer.policies.parameters():
        assert torch.isfinite(p).all()


COMPILED_CASES = {
    "qmix": ("qmix", False, {}),
    "qmix-recurrent-2-seeds": ("qmix", False, {"model": {"recurrent": "gru"}}),
    "matd3-continuous": ("matd3", True, {}),
    "maddpg-discrete": ("maddpg", False, {}),
    "masac-continuous": ("masac", True, {}),
    "hasac": ("hasac", True, {}),
}


@pytest.mark.parametrize("case", sorted(COMPILED_CASES))
def test_compiled_loss_regions_compute_what_eager_ones_compute(case):
    """`hardware.compile: true` runs a gradient step's losses as compiled regions, their
    random draws made ahead: from the same state and batch, the same losses and gradients as
    the eager code (up to the rounding of fused kernels), step after step."""
    algo, continuous, extra = COMPILED_CASES[case]
    seeds = (0, 1) if "2-seeds" in case else (3,)
    config = {"sequence_length": 3} if extra.get("model") else {}
    eager, env, ob = any_trainer(algo, seeds, continuous, extra.get("model"), **config)
    compiled, _, _ = any_trainer(algo, seeds, continuous, extra.get("model"), **config)
    compiled.compile()
    _fill(eager, env, ob, 12)
    params = list(eager.policies.parameters())
    # The regions of a batch alone; HASAC's per-unit regions run inside its update, whose
    # later units read the parameters earlier units' steps moved (Adam magnifies rounding).
    of_batch = [r for r in compiled.compiled_regions if not r.startswith("unit_")]
    for index in range(4):  # a region's first call runs eagerly; the later ones compiled
        batch = eager.sampled_batch()
        compiled.load_state_dict(eager.state_dict())
        for name in of_batch:
            ours = _loss_and_grads(getattr(eager, name)(batch), params)
            theirs = _loss_and_grads(
                getattr(compiled, name)(batch), list(compiled.policies.parameters())
            )
            for a, b in zip(ours, theirs, strict=True):
                assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (index, name, a, b)
        compiled.load_state_dict(eager.state_dict())
        ours, theirs = eager.update(batch), compiled.update(batch)
        eager.after_update(), compiled.after_update()
        for key in ours:
            assert torch.allclose(ours[key], theirs[key], rtol=1e-2, atol=1e-4), (index, key)
    assert all(region.draws is not None for region in _regions(compiled)[1:])


def _loss_and_grads(out, params: list[torch.Tensor]) -> list[torch.Tensor]:
    loss = out[0] if isinstance(out, tuple) else out
    used = [p for p in params if p.requires_grad]
    grads = torch.autograd.grad(loss.sum(), used, allow_unused=True)
    return [loss.detach()] + [torch.zeros(()) if g is None else g for g in grads]


def _regions(trainer):
    """The trainer's compiled regions, its sampled batch first."""
    from marlctl.train.regions import Region

    return [v for v in vars(trainer).values() if isinstance(v, Region)]
