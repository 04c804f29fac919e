"""Every registered algorithm: through the CLI on both backends, and learning on tiny tasks."""

from __future__ import annotations

import pytest
from test_training import client, run_json, write_spec

from marlctl.algos import registered_algos

# The algorithms that learn from an env; the offline ones, which learn from a dataset, are
# tested in test_offline.py.
ALGOS = {name: info for name, info in registered_algos().items() if not info.offline}

# A few updates' worth of settings per family.
QUICK = {
    True: {"rollout_steps": 5, "epochs": 1, "minibatches": 2},  # on-policy
    False: {"batch_size": 16, "learning_starts": 16, "buffer_size": 2_000},  # replay
}


def quick_spec(algo: str, backend: str, continuous: bool, **extra) -> dict:
    info = ALGOS[algo]
    body = {
        "seeds": [0],
        "env": {
            "id": "mpe/simple_spread",
            "backend": backend,
            "params": {"N": 2, "max_cycles": 10, "continuous_actions": continuous},
        },
        "algo": {"name": algo, **QUICK[info.on_policy]},
        "model": {"hidden": [16]},
        "train": {
            "total_env_steps": 200,
            "eval_every": 100,
            "eval_episodes": 2,
            "checkpoint_every": 100,
        },
        "hardware": {"num_envs": 4},
    }
    for key, value in extra.items():
        body[key] = body.get(key, {}) | value
    return body


SMOKE = [
    pytest.param(algo, backend, kind, id=f"{algo}-{backend}-{kind}")
    for algo, info in ALGOS.items()
    for backend in ("native", "pettingzoo")
    for kind in info.action_kinds
]


@pytest.mark.parametrize(("algo", "backend", "kind"), SMOKE)
def test_every_algorithm_trains_through_the_cli(algo, backend, kind, tmp_path):
    spec = write_spec(tmp_path, quick_spec(algo, backend, kind == "continuous"))
    out = run_json("run", str(spec))
    assert out["exit_code"] == 0, out
    (run,) = out["runs"]
    assert run["status"] == "FINISHED" and run["env_steps"] >= 200
    data = client().get_run(run["run_id"]).data
    assert "eval/return_mean" in data.metrics
    assert any(key.startswith("loss/") for key in data.metrics)
    files = {f.path for f in client().list_artifacts(run["run_id"], "policy")}
    assert "policy/final.pt" in files


RECURRENT = [a for a, info in ALGOS.items() if info.recurrent]


@pytest.mark.parametrize("algo", RECURRENT)
def test_recurrent_agents_train_and_evaluate(algo, tmp_path):
    body = quick_spec(algo, "native", False, model={"recurrent": "gru"})
    if not ALGOS[algo].on_policy:
        body["algo"]["sequence_length"] = 4
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    assert out["runs"][0]["final_return"] is not None


def test_algorithms_without_recurrent_agents_are_rejected_before_launch(tmp_path):
    body = quick_spec("maddpg", "native", True, model={"recurrent": "gru"})
    spec = write_spec(tmp_path, body)
    out = run_json("validate", str(spec))
    assert out["exit_code"] == 2
    text = str(out)
    assert "model.recurrent" in text and "'maddpg'" in text and "mpe/simple_spread" in text


@pytest.mark.parametrize(("algo", "dist"), [("masac", "normal"), ("maddpg", "tanh_normal")])
def test_a_policy_distribution_the_algorithm_lacks_is_rejected_before_launch(algo, dist, tmp_path):
    spec = write_spec(tmp_path, quick_spec(algo, "native", True, model={"action_dist": dist}))
    out = run_json("validate", str(spec))
    assert out["exit_code"] == 2
    text = str(out)
    assert "model.action_dist" in text and f"'{algo}' has no '{dist}' policy" in text


@pytest.mark.parametrize("recurrent", [None, "gru"])
def test_tanh_normal_actors_act_inside_the_action_box_and_train(recurrent, tmp_path):
    import torch

    model = {"action_dist": "tanh_normal", "agent_ids": False, "recurrent": recurrent}
    trainer, env, ob = _trainer("mappo", (0,), model=model)
    (group,) = env.info.groups
    assert trainer.policies[group.name].log_std is None  # the actor outputs the scale
    low, high = torch.tensor(group.action_low), torch.tensor(group.action_high)
    for _ in range(3):
        ob, losses = trainer.train_iteration(env, ob)
        assert all(torch.isfinite(v).all() for v in losses.values()), losses
    for deterministic in (True, False):
        action = trainer.act(ob, deterministic)[group.name]
        assert ((action >= low) & (action <= high)).all()
    body = quick_spec("mappo", "pettingzoo", True, model=model)
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out


def test_value_decomposition_rejects_continuous_actions(tmp_path):
    spec = write_spec(tmp_path, quick_spec("qmix", "native", True))
    out = run_json("validate", str(spec))
    assert out["exit_code"] == 2
    assert "'qmix' does not support continuous actions" in str(out)


@pytest.mark.parametrize("algo", ["maddpg", "matd3", "masac", "mappo", "happo", "hatrpo", "hasac"])
def test_heterogeneous_groups_with_masks_and_agents_leaving(algo, tmp_path):
    import toy_envs

    toy_envs.MaskedRelay.violations = 0
    body = quick_spec(algo, "pettingzoo", False)
    body["env"] = {"id": "toy_envs:masked_relay", "params": {"max_cycles": 6, "leave_at": 3}}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    assert toy_envs.MaskedRelay.violations == 0  # masked actions are never taken
    metrics = client().get_run(out["runs"][0]["run_id"]).data.metrics
    assert {"eval/return/scout", "eval/return/carrier"} <= set(metrics)


@pytest.mark.parametrize("sharing", ["independent", "federated"])
def test_sharing_modes(sharing, tmp_path):
    body = quick_spec("qmix", "native", False, model={"sharing": sharing, "federated_every": 2})
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out


def test_federated_averaging_makes_the_agents_networks_equal():
    import torch

    from marlctl.spec.models import ModelSpec
    from marlctl.train.networks import AgentNet

    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    net = AgentNet(2, 3, 4, 2, ModelSpec(hidden=[8], activation="tanh"), "federated", gens)
    x = torch.randn(2, 5, 3, 4)
    before, _ = net(x)
    assert not torch.allclose(before[:, :, 0], before[:, :, 1])  # one network per agent
    expected = {k: v.mean(1, keepdim=True) for k, v in net.state_dict().items()}
    net.average_agents()
    for key, value in net.state_dict().items():
        assert torch.allclose(value, expected[key].expand_as(value))  # per seed, not across
    after, _ = net(x[:, :, :1].expand(-1, -1, 3, -1).contiguous())
    assert torch.allclose(after[:, :, 0], after[:, :, 2])


# ---------------------------------------------------------------- learning


def two_step_return(algo: str, tmp_path, **model) -> float:
    """Greedy return on the two-step game after Q-learning from uniformly random play."""
    body = {
        "seeds": [0],
        "env": {"id": "toy_envs:two_step"},
        "algo": {
            "name": algo,
            "lr": 2e-3,
            "gamma": 0.99,
            "batch_size": 64,
            "learning_starts": 64,
            "rollout_steps": 1,
            "updates": 1,
            "tau": 0.05,
            "epsilon_start": 1.0,
            "epsilon_end": 1.0,  # the paper's setting: the data cover every joint action
            "sequence_length": 2,
        },
        "model": {"hidden": [32], **model},
        "train": {"total_env_steps": 8_000, "eval_every": 0, "eval_episodes": 8},
        "hardware": {"num_envs": 8},
    }
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    return out["runs"][0]["final_return"]


def test_qmix_finds_the_optimum_of_the_two_step_game_and_vdn_does_not(tmp_path):
    (tmp_path / "q").mkdir()
    (tmp_path / "v").mkdir()
    (tmp_path / "i").mkdir()
    qmix = two_step_return("qmix", tmp_path / "q")
    vdn = two_step_return("vdn", tmp_path / "v")
    iql = two_step_return("iql", tmp_path / "i")
    assert qmix == pytest.approx(8.0), (qmix, vdn)
    assert vdn == pytest.approx(7.0), (qmix, vdn)
    assert iql == pytest.approx(7.0), iql  # beats uniform play (4.75), misses the optimum


def test_recurrent_qmix_learns_the_two_step_game(tmp_path):
    assert two_step_return("qmix", tmp_path, recurrent="gru") == pytest.approx(8.0)


# ---------------------------------------------------------------- seeds and checkpoints


def _trainer(
    algo: str,
    seeds: tuple[int, ...],
    continuous: bool | None = None,
    model: dict | None = None,
    rows: list[dict] | None = None,
    **config,
):
    """A trainer on native simple_spread (N=2, 10 steps), 4 envs per seed; continuous actions
    where the algorithm has them, unless `continuous` says; `rows`: per seed, hyperparameters
    of its own."""
    import torch

    from marlctl.envs.native import native_class
    from marlctl.spec.models import Spec
    from marlctl.train.runner import build_trainer

    if continuous is None:
        continuous = "continuous" in ALGOS[algo].action_kinds
    params = {"N": 2, "max_cycles": 10, "continuous_actions": continuous}
    env = native_class("mpe/simple_spread")(params, 4 * len(seeds), "cpu", seeds=len(seeds))
    spec = Spec.model_validate(
        {
            "env": {"id": "mpe/simple_spread", "backend": "native", "params": params},
            "algo": {"name": algo, **QUICK[ALGOS[algo].on_policy], **config},
            "model": {"hidden": [16], **(model or {})},
        }
    )
    trainer = build_trainer(spec, env.info, 4, torch.device("cpu"), 10, seeds, rows=rows)
    ob = env.reset(seeds[0] if len(seeds) == 1 else list(seeds))
    trainer.restart_episodes()
    return trainer, env, ob


@pytest.mark.parametrize("algo", [a for a, info in ALGOS.items() if not info.on_policy])
def test_a_batched_seed_computes_what_it_computes_alone(algo):
    """A seed trained in a batch of three computes what it computes alone: the same random
    draws, minibatches and updates, to float rounding. Bit for bit on some CPUs; on others an
    elementwise kernel (Adam's step) rounds an element differently in a vector lane than in
    the scalar tail, and which one an element lands in depends on the seeds beside it."""
    import torch

    torch.set_num_threads(1)

    def train(seeds: tuple[int, ...]) -> tuple[list[dict], dict]:
        trainer, env, ob = _trainer(algo, seeds)
        out = []
        for _ in range(12):  # past learning_starts: several updates from sampled batches
            ob, step = trainer.train_iteration(env, ob)
            out.append({k: v.clone() for k, v in step.items()})
        return out, trainer.policies.state_dict()

    alone, batch = train((1,)), train((0, 1, 2))
    assert any(float(step["loss/grad_norm"][0]) > 0 for step in alone[0])
    assert_row_computes_alike(alone, batch, 1, atol=1e-7)


def assert_row_computes_alike(alone, batch, row: int, atol: float = 1e-6) -> None:
    """`(losses per iteration, final weights)` of a run alone equal row `row` of a batch's,
    to float rounding."""
    import torch

    (mine, mine_params), (theirs, their_params) = alone, batch
    for step, their_step in zip(mine, theirs, strict=True):
        for key in step:
            assert torch.allclose(step[key][0], their_step[key][row], rtol=1e-4, atol=atol), key
    for name, value in mine_params.items():
        assert torch.allclose(value[0], their_params[name][row], rtol=1e-4, atol=atol), name


@pytest.mark.parametrize("keep", [True, False])
def test_checkpoints_carry_the_replay_buffer_unless_told_not_to(keep, tmp_path):
    import torch

    source, env, ob = _trainer("qmix", (0,), checkpoint_replay=keep)
    for _ in range(8):
        ob, _ = source.train_iteration(env, ob)
    path = tmp_path / "checkpoint.pt"
    torch.save(source.seed_state(0), path)
    target, _, _ = _trainer("qmix", (0,), checkpoint_replay=keep)
    target.load_seed_states([torch.load(path, weights_only=True)])
    assert target.env_steps == source.env_steps
    if not keep:
        assert target.buffer is None  # refilled from scratch on resume
        return
    assert len(target.buffer) == len(source.buffer) == 8 * 4
    a, b = source.buffer.sample(16), target.buffer.sample(16)
    for name in a:
        assert torch.equal(a[name], b[name]), name


# ---------------------------------------------------------------- replay-based learners learn

LEARNING_SEEDS = [0, 1, 2]


def random_spread_return(params: dict) -> float:
    """Per-agent episode return of uniform random actions on native simple_spread."""
    import torch

    from marlctl.envs.native import native_class

    env = native_class("mpe/simple_spread")(params, 512, "cpu")
    env.reset(123)
    group = env.info.groups[0]
    generator = torch.Generator().manual_seed(0)
    total = torch.zeros(512)
    for _ in range(params["max_cycles"]):
        if group.discrete:
            shape = (512, group.n_agents)
            action = torch.randint(group.n_actions, shape, generator=generator)
        else:
            action = torch.rand(512, group.n_agents, group.n_actions, generator=generator)
        total += env.step({group.name: action}).rewards[group.name].mean(-1)
    return float(total.mean())


def median_final_return(algo: str, params: dict, steps: int, tmp_path, **algo_config) -> float:
    """Median over `LEARNING_SEEDS` (trained as one batch) of the final greedy return."""
    body = {
        "seeds": LEARNING_SEEDS,
        "env": {"id": "mpe/simple_spread", "backend": "native", "params": params},
        "algo": {"name": algo, "learning_starts": 1_000, **algo_config},
        "train": {"total_env_steps": steps, "eval_every": 0, "eval_episodes": 64},
        "hardware": {"num_envs": 16, "batch_seeds": True},
    }
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    returns = sorted(run["final_return"] for run in out["runs"])
    return returns[len(returns) // 2]


REPLAY_ALGOS = [a for a, info in ALGOS.items() if not info.on_policy]


@pytest.mark.slow
@pytest.mark.parametrize("algo", REPLAY_ALGOS)
def test_replay_based_learners_learn_discrete_navigation(algo, tmp_path):
    """Two agents covering two landmarks with discrete moves (native simple_spread N=2): the
    median of three seeds beats uniform play by a margin a correct learner clears by far."""
    params = {"N": 2, "max_cycles": 25, "continuous_actions": False}
    baseline = random_spread_return(params)
    learned = median_final_return(algo, params, 20_000, tmp_path)
    assert learned > baseline + 4.0, (learned, baseline)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["maddpg", "matd3", "masac", "hasac"])
def test_actor_critics_learn_continuous_navigation(algo, tmp_path):
    """Two agents covering two landmarks with continuous forces (native simple_spread N=2)."""
    params = {"N": 2, "max_cycles": 25, "continuous_actions": True}
    baseline = random_spread_return(params)
    learned = median_final_return(algo, params, 24_000, tmp_path, batch_size=128, updates=2)
    assert learned > baseline + 4.0, (learned, baseline)


@pytest.mark.slow
@pytest.mark.parametrize("dist", ["normal", "tanh_normal"])
def test_mappo_learns_continuous_navigation_with_either_policy_distribution(dist, tmp_path):
    """Native simple_spread N=2 with continuous forces: a state-independent Gaussian the env
    clips, and a tanh-squashed one with a state-dependent scale, each beat uniform play."""
    params = {"N": 2, "max_cycles": 25, "continuous_actions": True}
    body = {
        "seeds": LEARNING_SEEDS,
        "env": {"id": "mpe/simple_spread", "backend": "native", "params": params},
        "algo": {"name": "mappo", "rollout_steps": 25, "epochs": 5, "minibatches": 2, "lr": 1e-3},
        "model": {"action_dist": dist},
        "train": {"total_env_steps": 40_000, "eval_every": 0, "eval_episodes": 64},
        "hardware": {"num_envs": 16, "batch_seeds": True},
    }
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    returns = sorted(run["final_return"] for run in out["runs"])
    baseline = random_spread_return(params)  # about -20.8
    assert returns[1] > baseline + 4.0, (returns, baseline)
