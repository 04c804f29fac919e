"""Rows of a batch with hyperparameters of their own: a row trains as a batch of that row
alone does (the same code path: `RowAdam` steps each row's rate, and it steps as torch's Adam
does to float rounding); what a trainer cannot take per row is refused with the reason."""

from __future__ import annotations

import pytest
import torch
from test_algorithms import _trainer, assert_row_computes_alike

from marlctl.train.rows import RowAdam

ROWS = [
    {"lr": 1e-3, "entropy_coef": 0.01, "clip": 0.2, "gae_lambda": 0.95, "gamma": 0.99},
    {"lr": 4e-3, "entropy_coef": 0.1, "clip": 0.05, "gae_lambda": 0.7, "gamma": 0.9,
     "value_coef": 0.5, "max_grad_norm": 0.3, "critic_lr": 2e-3},
    {"lr": 3e-4, "entropy_coef": 0.0, "clip": 0.3, "gae_lambda": 1.0, "gamma": 0.95},
]  # fmt: skip


def _train(algo: str, seeds: tuple[int, ...], rows=None, iterations: int = 6, **config):
    """Losses per iteration and the final weights; `rows` per seed (`build_trainer`)."""
    on_policy = {"epochs": 2} if algo in ("mappo", "ippo") else {}
    trainer, env, ob = _trainer(algo, seeds, rows=rows, **on_policy, **config)
    losses = []
    for _ in range(iterations):
        ob, step = trainer.train_iteration(env, ob)
        losses.append({k: v.clone() for k, v in step.items()})
    return losses, trainer.policies.state_dict()


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
@pytest.mark.parametrize("anneal", [False, True])
def test_a_row_trains_as_a_run_of_its_own_hyperparameters_alone(algo, anneal):
    torch.set_num_threads(1)
    batched = _train(algo, (0, 1, 2), ROWS, anneal_lr=anneal)
    alone = _train(algo, (1,), [ROWS[1]], anneal_lr=anneal)
    assert any(float(step["loss/grad_norm"][0]) > 0 for step in alone[0])
    assert_row_computes_alike(alone, batched, 1)
    # The rows did differ: row 0's weights are not row 1's run alone.
    first, _ = _train(algo, (0,), [ROWS[0]], anneal_lr=anneal)
    policy = [steps[-1]["loss/policy"] for steps in (first, batched[0], alone[0])]
    assert torch.allclose(policy[0][0], policy[1][0], atol=1e-6)
    assert not torch.allclose(policy[0][0], policy[2][0])


Q_ROWS = [
    {"lr": 1e-3, "gamma": 0.99, "tau": 0.01, "epsilon_anneal_steps": 200},
    {"lr": 5e-3, "gamma": 0.9, "tau": 0.1, "epsilon_start": 0.5, "epsilon_end": 0.2,
     "epsilon_anneal_steps": 100, "max_grad_norm": 0.5},
    {"lr": 3e-4, "gamma": 0.95, "tau": 0.005, "epsilon_anneal_steps": 0},
]  # fmt: skip


@pytest.mark.parametrize("algo", ["qmix", "iql"])
@pytest.mark.parametrize("recurrent", [None, "gru"])
def test_a_q_learning_row_trains_as_a_run_of_its_own_hyperparameters_alone(algo, recurrent):
    torch.set_num_threads(1)
    model = {"recurrent": recurrent}
    fixed = {"target_update_every": 0, "sequence_length": 4} if recurrent else {
        "target_update_every": 0}  # fmt: skip

    def train(seeds, rows, **config):
        trainer, env, ob = _trainer(algo, seeds, model=model, rows=rows, **fixed, **config)
        losses, rates = [], []
        for _ in range(12):
            ob, step = trainer.train_iteration(env, ob)
            losses.append({k: v.clone() for k, v in step.items()})
            rates.append(trainer.schedules()["train/epsilon"].clone())
        return (losses, trainer.policies.state_dict()), rates

    batch, batch_rates = train((0, 1, 2), Q_ROWS)
    alone, alone_rates = train((1,), [Q_ROWS[1]])
    assert any(float(step["loss/grad_norm"][0]) > 0 for step in alone[0])
    for mine, theirs in zip(alone_rates, batch_rates, strict=True):
        assert float(mine[0]) == pytest.approx(float(theirs[1]))
    assert float(batch_rates[-1][2]) == pytest.approx(0.05)  # anneal 0: the end at once
    assert_row_computes_alike(alone, batch, 1)


def test_what_a_trainer_cannot_take_per_row_is_refused():
    with pytest.raises(ValueError, match="does not take epochs per row"):
        _train("mappo", (0, 1), [{"epochs": 3}, {}])
    with pytest.raises(ValueError, match="1 rows of hyperparameters for 2 seeds"):
        _train("mappo", (0, 1), [{"lr": 1e-3}])
    with pytest.raises(ValueError, match="not with n_step above 1"):
        _train("qmix", (0, 1), [{"gamma": 0.9}, {}], n_step=3)
    with pytest.raises(ValueError, match="maddpg: no hyperparameters per row"):
        _train("maddpg", (0, 1), [{"lr": 1e-3}, {"lr": 2e-3}])


def test_row_adam_steps_as_torch_adam_at_each_row_s_rate():
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(3, 4, 5, generator=generator)
    rates = torch.tensor([1e-3, 1e-2, 3e-4])
    rowed = start.clone().requires_grad_()
    row_adam = RowAdam([[rowed]], [rates], eps=1e-8)
    alone = [start[i].clone().requires_grad_() for i in range(3)]
    adams = [
        torch.optim.Adam([p], lr=float(r), eps=1e-8)
        for p, r in zip(alone, rates.tolist(), strict=True)
    ]
    for _ in range(5):
        grad = torch.randn(3, 4, 5, generator=generator)
        rowed.grad = grad.clone()
        row_adam.step()
        for i, (p, adam) in enumerate(zip(alone, adams, strict=True)):
            p.grad = grad[i].clone()
            adam.step()
    for i, p in enumerate(alone):
        assert torch.allclose(rowed[i], p, rtol=1e-5, atol=1e-7), i
    assert set(row_adam.state[rowed]) == set(adams[0].state[alone[0]])  # checkpoints load


def test_a_row_s_checkpoint_resumes_as_a_run_of_its_own_values():
    torch.set_num_threads(1)
    batch, env, ob = _trainer("mappo", (0, 1, 2), rows=ROWS, epochs=2)
    for _ in range(3):
        ob, _ = batch.train_iteration(env, ob)
    state = batch.seed_state(1)
    assert [g["lr"] for g in state["optimizers"]["adam"]["param_groups"]] == [4e-3, 2e-3]
    alone, alone_env, alone_ob = _trainer("mappo", (1,), epochs=2, **ROWS[1])
    alone.load_seed_states([state])
    assert [g["lr"] for g in alone.optimizer.param_groups] == [4e-3, 2e-3]
    # The weights and Adam's moments are the row's.
    for name, value in alone.policies.state_dict().items():
        assert torch.equal(value[0], batch.policies.state_dict()[name][1]), name
    moments = batch.optimizer.state_dict()["state"]
    for key, entry in alone.optimizer.state_dict()["state"].items():
        for field in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(entry[field][0], moments[key][field][1]), (key, field)
        assert float(entry["step"]) == float(moments[key]["step"])


ON_POLICY_VALUES = {
    "lr": 4e-3, "critic_lr": 2e-3, "gamma": 0.9, "gae_lambda": 0.7, "entropy_coef": 0.1,
    "value_coef": 0.5, "clip": 0.05, "max_grad_norm": 0.3,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ON_POLICY_VALUES))
def test_an_on_policy_row_computes_exactly_what_its_trial_computes_unbatched(name):
    # Not only as a batch of that row alone: as the plain run of the trial's spec, which
    # reads its values as floats and steps torch's Adam. Every per-row value rounds as the
    # float does, so a sweep's batched trial logs what it would have logged on its own.
    torch.set_num_threads(1)
    value = ON_POLICY_VALUES[name]
    batched = _train("mappo", (0, 1), [{}, {name: value}], anneal_lr=True)
    alone = _train("mappo", (1,), None, anneal_lr=True, **{name: value})
    for step, their_step in zip(alone[0], batched[0], strict=True):
        for key in step:
            assert torch.equal(step[key][0], their_step[key][1]), key
    for key, weights in alone[1].items():
        assert torch.equal(weights[0], batched[1][key][1]), key


def _spec(**algo):
    from marlctl.spec.models import Spec

    return Spec.model_validate(
        {
            "env": {"id": "mpe/simple_spread", "backend": "native"},
            "algo": {"name": "mappo", **algo},
            "seeds": [0, 1],
        }
    )


def test_specs_batch_as_rows_where_they_differ_in_row_fields_only():
    from marlctl.train.build import batch_rows, structure

    plain = _spec()
    assert batch_rows([plain, _spec()]) is None
    renamed = plain.model_copy(update={"name": "other", "seeds": [5]})
    assert batch_rows([plain, renamed]) is None  # nothing training reads
    rows = batch_rows([_spec(lr=1e-3), _spec(lr=2e-3, entropy_coef=0.1), _spec(lr=1e-3)])
    assert rows == [
        {"lr": 1e-3, "entropy_coef": plain.algo.entropy_coef},
        {"lr": 2e-3, "entropy_coef": 0.1},
        {"lr": 1e-3, "entropy_coef": plain.algo.entropy_coef},
    ]
    assert structure(_spec(lr=1e-3)) == structure(_spec(lr=2e-3, clip=0.1))
    assert structure(_spec(epochs=3)) != structure(plain)
    with pytest.raises(ValueError, match=r"these differ in algo\.epochs"):
        batch_rows([plain, _spec(epochs=3, lr=1e-3)])
    wider = plain.model_copy(update={"model": plain.model.model_copy(update={"hidden": [8]})})
    with pytest.raises(ValueError, match="these differ in model"):
        batch_rows([plain, wider])
