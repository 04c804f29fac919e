"""HAPPO, HATRPO and HASAC: the sequential update, its compounded weight, per-agent Adam state,
the KL-bounded step, seeds batched, and learning on a tiny task."""

from __future__ import annotations

import pytest
import torch
from test_algorithms import LEARNING_SEEDS, assert_row_computes_alike, random_spread_return
from test_training import run_json, write_spec

from marlctl.envs.native import native_class
from marlctl.spec.models import Spec
from marlctl.train.core import AgentAdam
from marlctl.train.runner import build_trainer

QUICK = {
    "happo": {"rollout_steps": 5, "epochs": 2, "minibatches": 2, "critic_epochs": 1},
    "hatrpo": {"rollout_steps": 5, "minibatches": 2, "critic_epochs": 1},
    "hasac": {"batch_size": 16, "learning_starts": 16, "buffer_size": 2_000},
}


def trainer_on(algo: str, seeds: tuple[int, ...], env_id: str = "mpe/simple_spread", **config):
    """A trainer on a tiny native task (4 envs per seed, 10-step episodes)."""
    params = {"max_cycles": 10, "continuous_actions": config.pop("continuous", False)}
    if env_id == "mpe/simple_spread":
        params["N"] = 3
    model = {"hidden": [16], **config.pop("model", {})}
    env = native_class(env_id)(params, 4 * len(seeds), "cpu", seeds=len(seeds))
    spec = Spec.model_validate(
        {
            "env": {"id": env_id, "backend": "native", "params": params},
            "algo": {"name": algo, **QUICK[algo], **config},
            "model": model,
        }
    )
    trainer = build_trainer(spec, env.info, 4, torch.device("cpu"), 10, seeds)
    ob = env.reset(seeds[0] if len(seeds) == 1 else list(seeds))
    trainer.restart_episodes()
    return trainer, env, ob


def test_the_heterogeneous_agent_algorithms_default_to_a_network_per_agent():
    def sharing(algo: str, **model) -> str:
        body = {"env": {"id": "mpe/simple_spread"}, "algo": {"name": algo}, "model": model}
        return Spec.model_validate(body).model.sharing

    assert sharing("happo") == sharing("hatrpo") == sharing("hasac") == "independent"
    assert sharing("mappo") == sharing("qmix") == "shared"
    assert sharing("happo", sharing="shared") == "shared"


def test_agent_adam_is_torchs_adam_on_the_copies_it_moves_and_leaves_the_others_alone():
    gen = torch.Generator().manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(2, 3, 4, 5, generator=gen))
    theirs = torch.nn.Parameter(ours.detach().clone())
    agent = AgentAdam([ours], lr=1e-2, eps=1e-5)
    reference = torch.optim.Adam([theirs], lr=1e-2, eps=1e-5)
    everything = torch.ones(2, 3, dtype=torch.bool)
    for _ in range(4):
        grad = torch.randn(2, 3, 4, 5, generator=gen)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        agent.step({ours: everything})
        reference.step()
    assert torch.allclose(ours, theirs, atol=1e-6)
    # Copy 1 of seed 0 and copy 2 of seed 1 step on; the others keep weights and moments.
    moved = torch.tensor([[False, True, False], [False, False, True]])
    before = ours.detach().clone()
    moments = agent.state[ours]["exp_avg"].clone()
    ours.grad = torch.randn(2, 3, 4, 5, generator=gen)
    agent.step({ours: moved})
    changed = (ours.detach() != before).flatten(2).any(-1)
    assert torch.equal(changed, moved)
    kept = ~moved
    assert torch.equal(agent.state[ours]["exp_avg"][kept], moments[kept])
    assert torch.equal(agent.state[ours]["step"], 4 + moved.float())


@pytest.mark.parametrize("algo", ["happo", "hatrpo"])
def test_each_position_of_the_order_moves_one_agent_network_per_seed(algo):
    trainer, env, ob = trainer_on(algo, (0, 1), continuous=True)
    actor = trainer.policies["agent"].actor
    changes = []
    inner = trainer.update_unit

    def watched(unit, ud, factor):
        before = [p.detach().clone() for p in unit.params]
        out = inner(unit, ud, factor)
        moved = torch.zeros(2, actor.copies, dtype=torch.bool)
        for old, new in zip(before, unit.params, strict=True):
            moved |= (old != new.detach()).flatten(2).any(-1)
        changes.append(moved)
        return out

    trainer.update_unit = watched
    for _ in range(2):
        ob, _ = trainer.train_iteration(env, ob)
    assert len(changes) == 2 * 3  # three agents, each its own unit, per iteration
    for iteration in (changes[:3], changes[3:]):
        for moved in iteration:
            # HATRPO may refuse a step (no copy moves); no position moves two.
            assert (moved.sum(1) <= 1).all(), moved
        if algo == "happo":  # every agent updated once per iteration, in each seed's order
            assert torch.equal(sum(m.int() for m in iteration), torch.ones(2, 3, dtype=torch.int))


def test_hasac_steps_one_agent_network_per_seed_and_position():
    trainer, env, ob = trainer_on("hasac", (0, 1), continuous=True)
    actor = trainer.actors["agent"]
    optimizer = trainer.optimizers["actor"]
    inner, moves = optimizer.step, []

    def step(moved):
        before = [p.detach().clone() for p in actor.parameters()]
        inner(moved)
        changed = torch.zeros(2, actor.copies, dtype=torch.bool)
        for old, new in zip(before, actor.parameters(), strict=True):
            changed |= (old != new.detach()).flatten(2).any(-1)
        moves.append(changed)

    optimizer.step = step
    for _ in range(6):  # past learning_starts
        ob, _ = trainer.train_iteration(env, ob)
    assert moves and len(moves) % 3 == 0  # three agents per gradient step
    for start in range(0, len(moves), 3):
        steps = moves[start : start + 3]
        assert all((m.sum(1) == 1).all() for m in steps), steps
        assert torch.equal(sum(m.int() for m in steps), torch.ones(2, 3, dtype=torch.int))


def test_hasac_takes_the_current_joint_action_only():
    """The sequential update defines the others' actions; MASAC's stored-action mode is
    refused rather than ignored."""
    from pydantic import ValidationError

    from marlctl.algos.hetero import HASACConfig

    assert HASACConfig().actor_joint_action == "current"
    with pytest.raises(ValidationError, match="actor_joint_action"):
        HASACConfig(actor_joint_action="sampled")


def test_hasac_hands_each_agent_the_actions_of_those_updated_before_it():
    from marlctl.train.hasac import HASACTrainer

    current = torch.zeros(2, 4, 3, 5)
    new = torch.ones(2, 4, 1, 5)
    on = torch.tensor([True, False])
    out = HASACTrainer.replace(current, new, on, torch.tensor([2, 0]))
    assert torch.equal(out[0, :, 2], torch.ones(4, 5))  # seed 0: agent 2's slot replaced
    assert out[0, :, :2].abs().sum() == 0 and out[1].abs().sum() == 0  # nothing else
    shared = HASACTrainer.replace(current, torch.ones(2, 4, 3, 5), on, None)
    assert torch.equal(shared[0], torch.ones(4, 3, 5)) and shared[1].abs().sum() == 0


def test_the_compounded_weight_is_the_product_of_the_earlier_agents_ratios():
    trainer, env, ob = trainer_on("happo", (0,), fixed_order=True)
    seen = {}
    inner_update, inner_unit = trainer.update, trainer.update_unit

    def update(data):
        seen["data"] = data
        return inner_update(data)

    def update_unit(unit, ud, factor):
        seen.setdefault("factors", []).append(factor.clone())
        return inner_unit(unit, ud, factor)

    trainer.update, trainer.update_unit = update, update_unit
    trainer.train_iteration(env, ob)
    d, pol = seen["data"]["agent"], trainer.policies["agent"]
    # The actors after the iteration: agents 0 and 1 moved before agent 2, in fixed order.
    with torch.no_grad():
        dist, _ = pol.distribution(d["actor_in"], d["masks"])
        log_ratio = dist.log_prob(d["actions"]) - d["log_probs"]
    assert torch.equal(seen["factors"][0], torch.ones_like(seen["factors"][0]))
    for position in (1, 2):
        expected = log_ratio[..., :position].sum(-1).exp()
        assert torch.allclose(seen["factors"][position], expected, rtol=1e-5)
    assert not torch.allclose(seen["factors"][2], torch.ones_like(seen["factors"][2]))


def test_hatrpo_steps_stay_inside_the_kl_bound():
    trainer, env, ob = trainer_on("hatrpo", (0, 1, 2), kl_threshold=0.005)
    accepted = []
    for _ in range(4):
        ob, losses = trainer.train_iteration(env, ob)
        assert (losses["loss/approx_kl"] <= 0.005).all(), losses
        accepted.append(losses["loss/accepted"])
    assert float(torch.stack(accepted).mean()) > 0.5  # most steps are taken


@pytest.mark.parametrize(
    ("algo", "env_id", "continuous"),
    [
        ("happo", "mpe/simple_spread", True),
        ("happo", "mpe/simple_speaker_listener", False),
        ("hatrpo", "mpe/simple_spread", False),
        ("hatrpo", "mpe/simple_speaker_listener", False),
        ("hasac", "mpe/simple_speaker_listener", False),
    ],
)
def test_a_batched_seed_computes_what_it_computes_alone(algo, env_id, continuous):
    """Each seed draws its own update order: seed 1 in a batch of three takes the same orders,
    minibatches and steps as alone (to float rounding, as the other algorithms)."""
    torch.set_num_threads(1)

    def train(seeds):
        trainer, env, ob = trainer_on(algo, seeds, env_id, continuous=continuous)
        out = []
        for _ in range(8 if algo == "hasac" else 3):  # HASAC: past learning_starts
            ob, losses = trainer.train_iteration(env, ob)
            out.append({k: v.clone() for k, v in losses.items()})
        return out, trainer.policies.state_dict()

    assert_row_computes_alike(train((1,)), train((0, 1, 2)), 1)


def test_a_checkpoint_resumes_the_sequential_update_exactly():
    source, env, ob = trainer_on("happo", (0,))
    for _ in range(2):
        ob, _ = source.train_iteration(env, ob)
    state = source.seed_state(0)
    assert set(state["optimizers"]) == {"actor", "critic"}
    target, _, _ = trainer_on("happo", (0,))
    target.load_seed_states([state])
    for name, value in source.policies.state_dict().items():
        assert torch.equal(value, target.policies.state_dict()[name]), name
    a = source.optimizers["actor"].state_dict()["state"]
    b = target.optimizers["actor"].state_dict()["state"]
    for index, entry in a.items():
        for key, value in entry.items():
            assert torch.equal(value, b[index][key]), (index, key)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["happo", "hatrpo"])
def test_heterogeneous_agent_learners_learn_discrete_navigation(algo, tmp_path):
    """Two agents covering two landmarks (native simple_spread N=2), a network per agent:
    the median of three seeds beats uniform play by a margin a correct learner clears."""
    params = {"N": 2, "max_cycles": 25, "continuous_actions": False}
    body = {
        "seeds": LEARNING_SEEDS,
        "env": {"id": "mpe/simple_spread", "backend": "native", "params": params},
        "algo": {"name": algo, "rollout_steps": 25, "lr": 1e-3, "critic_lr": 1e-3},
        "train": {"total_env_steps": 40_000, "eval_every": 0, "eval_episodes": 64},
        "hardware": {"num_envs": 16, "batch_seeds": True},
    }
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    returns = sorted(run["final_return"] for run in out["runs"])
    baseline = random_spread_return(params)
    assert returns[1] > baseline + 4.0, (returns, baseline)
