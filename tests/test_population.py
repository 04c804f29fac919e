"""Population-based training inside one batch: exploit copies a member's rows (weights,
target networks, optimiser state), explore perturbs its hyperparameters within the space,
and a row's new values act as if it had started with them."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_algorithms import _trainer

from marlctl.spec.search import Choices, Range
from marlctl.train.population import copy_rows, explore, field_value, quantile_count

PBT = SimpleNamespace(perturb=(0.8, 1.2), resample_probability=0.0)


def test_explore_perturbs_within_the_range_and_steps_to_adjacent_choices():
    rng = random.Random(0)
    lr = Range(low=1e-4, high=1e-2, log=True)
    seen = sorted({round(explore(1e-3, lr, PBT, rng), 12) for _ in range(50)})
    assert seen == pytest.approx([0.8e-3, 1.2e-3])
    assert sorted({round(explore(1e-2, lr, PBT, rng), 12) for _ in range(50)}) == pytest.approx(
        [8e-3, 1e-2]
    )  # kept inside the range
    epochs = Range(low=2, high=20)
    assert all(isinstance(explore(10, epochs, PBT, rng), int) for _ in range(10))
    assert {explore(10, epochs, PBT, rng) for _ in range(50)} == {8, 12}
    clip = Choices(choices=[0.1, 0.2, 0.3])
    assert {explore(0.2, clip, PBT, rng) for _ in range(50)} == {0.1, 0.3}
    assert {explore(0.1, clip, PBT, rng) for _ in range(50)} == {0.1, 0.2}
    resampled = SimpleNamespace(perturb=(0.8, 1.2), resample_probability=1.0)
    drawn = [explore(1e-3, lr, resampled, rng) for _ in range(200)]
    assert all(1e-4 <= v <= 1e-2 for v in drawn) and min(drawn) < 3e-4 < 3e-3 < max(drawn)


@pytest.mark.parametrize(("members", "count"), [(1, 0), (2, 1), (4, 1), (8, 2), (16, 4), (3, 1)])
def test_the_quantiles_hold_a_fifth_of_the_members_at_least_one_at_most_half(members, count):
    assert quantile_count(members, 0.2) == count
    assert quantile_count(100, 0.07) == 7  # not 8 for the product's rounding


def test_explore_moves_small_integers_and_stays_on_the_grid():
    rng = random.Random(1)
    small = Range(low=1, high=8)
    assert {explore(1, small, PBT, rng) for _ in range(50)} == {1, 2}  # 0.8 stops at low
    assert {explore(2, small, PBT, rng) for _ in range(50)} == {1, 3}
    grid = Range(low=0.1, high=0.35, step=0.1)  # points 0.1, 0.2, 0.3
    assert {round(explore(0.3, grid, PBT, rng), 9) for _ in range(50)} <= {0.2, 0.3}
    assert all(explore(0.3, grid, PBT, rng) <= 0.35 for _ in range(50))


@pytest.mark.parametrize("algo", ["mappo", "qmix"])
def test_copying_rows_gives_the_target_rows_every_weight_and_moment_of_the_sources(algo):
    torch.set_num_threads(1)
    rows = [{"lr": 1e-3}, {"lr": 2e-3}, {"lr": 3e-3}]
    trainer, env, ob = _trainer(algo, (0, 1, 2), rows=rows)
    for _ in range(6):
        ob, _ = trainer.train_iteration(env, ob)
    before = {k: v.clone() for k, v in trainer.seed_state(1)["policies"].items()}
    kept = {k: v.clone() for k, v in trainer.seed_state(0)["policies"].items()}
    copy_rows(trainer, [1], [2])
    after, untouched = trainer.seed_state(2), trainer.seed_state(0)
    for key, value in before.items():
        assert torch.equal(after["policies"][key], value), key
        assert torch.equal(untouched["policies"][key], kept[key]), key
    source = trainer.seed_state(1)["optimizers"]
    for name, saved in after["optimizers"].items():
        for index, entry in saved["state"].items():
            for key, value in entry.items():
                if torch.is_tensor(value) and value.dim():
                    assert torch.equal(value, source[name]["state"][index][key]), (index, key)


@pytest.mark.parametrize("algo", ["mappo", "qmix"])
def test_a_row_value_set_before_training_acts_as_if_the_row_began_with_it(algo):
    torch.set_num_threads(1)
    names = ("lr", "gamma") if algo == "mappo" else ("lr", "tau", "epsilon_end")
    start = {name: value for name, value in zip(names, (1e-3, 0.9, 0.1), strict=False)}
    changed = {name: value * 1.2 for name, value in start.items()}
    extra = {} if algo == "mappo" else {"target_update_every": 0}
    set_later, env, ob = _trainer(algo, (0, 1), rows=[start, start], **extra)
    for name, value in changed.items():
        set_later.set_row_value(name, 1, value)
    made, env2, ob2 = _trainer(algo, (0, 1), rows=[start, changed], **extra)
    for _ in range(6):
        ob, one = set_later.train_iteration(env, ob)
        ob2, two = made.train_iteration(env2, ob2)
        for key in one:
            assert torch.equal(one[key], two[key]), key
    for key, value in set_later.policies.state_dict().items():
        assert torch.equal(value, made.policies.state_dict()[key]), key


def test_a_population_sweep_exploits_explores_and_writes_the_best_member_s_schedule(tmp_path):
    from test_sweep import TINY, journal_study, mlflow_client, runs_by_role, sweep_json, write_spec

    space = {
        "algo.lr": {"low": 1.0e-4, "high": 3.0e-3, "log": True},
        "algo.entropy_coef": {"low": 0.0, "high": 0.05},
    }
    body = {
        **TINY,
        "name": "population",
        "train": {**TINY["train"], "total_env_steps": 2000, "eval_every": 500},
        "sweep": {"trials": 4, "sampler": "pbt", "seed": 1, "space": space},
    }
    code, summary = sweep_json(str(write_spec(tmp_path, body)))
    assert code == 0, summary
    assert summary["counts"] == {"COMPLETE": 4}
    trials = journal_study(tmp_path, "population").get_trials()
    schedules = [t.user_attrs["marlctl.pbt_schedule"] for t in trials]
    # The start, and the first evaluation at or past each 500 steps (iterations of 400).
    for schedule in schedules:
        assert [step for step, _ in schedule["algo.lr"]] == [0, 800, 1200, 1600]
    client = mlflow_client(tmp_path)
    seeds = runs_by_role(client, "population")["seed"]
    assert {r.data.tags["marlctl.batch_rows"] for r in seeds} == {"8"}  # 4 members x 2 seeds
    by_run = {t.user_attrs["marlctl.mlflow_run_id"]: n for n, t in enumerate(trials)}
    exploited = 0
    for run in seeds:
        member = by_run[run.data.tags["mlflow.parentRunId"]]
        for point in client.get_metric_history(run.info.run_id, "pbt/exploited"):
            exploited += 1
            winner = int(point.value)
            assert winner != member
            step = dict(schedules[member]["algo.lr"])[point.step]
            source = dict(schedules[winner]["algo.lr"])[point.step]
            assert step == pytest.approx(source * 0.8) or step == pytest.approx(
                min(source * 1.2, 3.0e-3)
            ), (step, source)
    assert exploited >= 2 * 3  # a worst member at each of the 3 intervals, both seeds
    # best.yaml replays the best member's lineage: it starts with the values the lineage
    # started with and takes each one it explored at the step it did; it ends with the
    # member's own final values.
    from marlctl.spec import load_spec

    path = tmp_path / "sweep-population" / "best.yaml"
    assert "# Population-based training" in path.read_text()
    best = load_spec(str(path), []).spec
    top = max(trials, key=lambda t: t.value)
    for key in space:
        replayed = [[0, field_value(best, key)], *best.train.schedule.get(key, [])]
        assert {step for step, _ in replayed} <= {0, 800, 1200, 1600}
        final = top.user_attrs["marlctl.pbt_schedule"][key][-1][1]
        assert replayed[-1][1] == pytest.approx(final)


@pytest.mark.parametrize(
    ("change", "where", "message"),
    [
        ({"space": {"model.hidden": {"choices": [[16], [32]]}}}, "sweep.space.model.hidden",
         "changes only what a row may have of its own"),
        ({"pbt": {"interval": 700}}, "sweep.pbt.interval", "not a multiple of train.eval_every"),
        ({"trials": 1}, "sweep.trials", "at least 2 members"),
        ({}, "train.schedule", "sets the schedule itself"),
    ],
)  # fmt: skip
def test_a_population_that_cannot_train_is_exit_2_at_its_line(tmp_path, change, where, message):
    from test_sweep import TINY, runner, write_spec

    from marlctl.cli import app

    sweep = {"trials": 4, "sampler": "pbt", "space": {"algo.lr": {"low": 1e-4, "high": 1e-3}}}
    train = {**TINY["train"], "eval_every": 500}
    if where == "train.schedule":
        train["schedule"] = {"algo.lr": [[0, 1e-3]]}
    body = {**TINY, "train": train, "sweep": {**sweep, **change}}
    result = runner.invoke(app, ["sweep", str(write_spec(tmp_path, body))])
    assert result.exit_code == 2, result.output
    assert f": {where}: " in result.output and message in result.output
    assert not (tmp_path / "optuna.journal").exists()


def _scheduled(folder: Path, name: str, lr: float, schedule: dict | None = None):
    """A run of test_batched_trials' body at `lr`, with `train.schedule` if given."""
    import yaml
    from test_batched_trials import BODY

    from marlctl.plan import compile_plan
    from marlctl.spec import load_spec

    body = {**BODY, "algo": {**BODY["algo"], "lr": lr}}
    if schedule is not None:
        body["train"] = {**BODY["train"], "schedule": schedule}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    loaded = load_spec(str(path), [])
    return loaded, compile_plan(loaded)


def test_a_scheduled_run_takes_each_value_from_its_step_on(tmp_path):
    from test_batched_trials import KEYS
    from test_training import history

    from marlctl.launch import run_plan

    fixed = run_plan(*_scheduled(tmp_path, "fixed", 3e-3))
    # A point at step 0 replaces the algo value: the run is the fixed one, exactly.
    start = run_plan(*_scheduled(tmp_path, "start", 1e-3, {"algo.lr": [[0, 3e-3]]}))
    # Iterations of 160 env steps: the change takes effect after the iteration ending at 800.
    late = {"algo.lr": [[0, 3e-3], [800, 5e-4]]}
    changed = run_plan(*_scheduled(tmp_path, "changed", 1e-3, late))
    for ours, theirs, later in zip(start.runs, fixed.runs, changed.runs, strict=True):
        assert history(later.run_id, "schedule/lr") == [(0, 3e-3), (800, 5e-4)]
        for key in KEYS:
            assert history(ours.run_id, key) == history(theirs.run_id, key), key
        points, fixed_points = (
            history(later.run_id, "loss/value"),
            history(theirs.run_id, "loss/value"),
        )
        before = [point for point in points if point[0] <= 960]  # trained at 3e-3 until 800
        assert before == [point for point in fixed_points if point[0] <= 960]
        assert points != fixed_points


@pytest.mark.parametrize(
    ("algo", "schedule", "message"),
    [
        ({}, {"algo.epochs": [[0, 2]]}, "changes only what a row may have of its own"),
        ({}, {"model.hidden": [[0, 2]]}, "changes only what a row may have of its own"),
        ({}, {"algo.lr": [[0, 1e-3], [500, -1.0]]}, "-1 from env step 500"),
        ({"name": "maddpg"}, {"algo.lr": [[0, 1e-3]]}, "nothing of maddpg"),
        ({}, {"env.N": [[0, 3]]}, "mpe/simple_spread lets a schedule change none of its params"),
        ({}, {"algo.lr": {"linear": [[0, 1e-3]]}}, "at least 2 items"),
        ({}, {"algo.lr": {"linear": [[0, 1e-3], [500, -1.0]]}}, "-1 from env step 500"),
    ],
)  # fmt: skip
def test_a_schedule_of_what_cannot_change_is_exit_2_at_its_line(tmp_path, algo, schedule, message):
    from test_sweep import TINY, runner, write_spec

    from marlctl.cli import app

    body = {**TINY, "train": {**TINY["train"], "schedule": schedule}}
    if algo:
        body["algo"] = algo
    result = runner.invoke(app, ["validate", str(write_spec(tmp_path, body))])
    assert result.exit_code == 2, result.output
    assert f": train.schedule.{next(iter(schedule))}" in result.output, result.output
    assert message in result.output


def test_the_report_draws_each_member_s_schedule(tmp_path):
    from PIL import Image
    from test_report import report_json, run_cli
    from test_sweep import TINY, sweep_json, write_spec

    body = {
        **TINY,
        "name": "drawn",
        "train": {**TINY["train"], "total_env_steps": 1200, "eval_every": 400},
        "sweep": {
            "trials": 3,
            "sampler": "pbt",
            "seed": 0,
            "space": {"algo.lr": {"low": 1.0e-4, "high": 3.0e-3, "log": True}},
        },
    }
    code, summary = sweep_json(str(write_spec(tmp_path, body)))
    assert code == 0, summary
    (sweep,) = report_json()["sweeps"]
    assert all(len(t["schedule"]["algo.lr"]) == 3 for t in sweep["trials"])
    for out in ("pbt.md", "pbt.html"):
        result = run_cli("report", "--out", out)
        assert result.exit_code == 0, result.output
    assert Image.open("pbt_files/sweep0_schedules.png").size[0] >= 800
    assert "hyperparameter schedules" in Path("pbt.html").read_text()


def test_a_plain_run_of_a_population_spec_trains_no_population(tmp_path):
    # The spec's sweep section is the sweep's, not the run's: `marlctl run` of it trains its
    # seeds as any run does, with the spec's own values and no exploit or explore.
    from test_sweep import TINY, mlflow_client, runs_by_role, write_spec
    from test_training import run_json

    sweep = {"trials": 4, "sampler": "pbt", "space": {"algo.lr": {"low": 1e-4, "high": 1e-3}}}
    body = {**TINY, "name": "plain", "train": {**TINY["train"], "eval_every": 500},
            "sweep": sweep}  # fmt: skip
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    client = mlflow_client(tmp_path)
    for run in runs_by_role(client, "plain")["seed"]:
        assert not [k for k in run.data.metrics if k.startswith("pbt/")]


def test_n_step_returns_keep_the_discount_out_of_the_rows():
    from marlctl.spec.models import Spec
    from marlctl.train.build import structure

    def spec(**algo):
        return Spec.model_validate(
            {"env": {"id": "mpe/simple_spread", "backend": "native"},
             "algo": {"name": "qmix", **algo}}
        )  # fmt: skip

    assert "gamma" in spec().row_fields
    assert "gamma" not in spec(n_step=3).row_fields
    assert structure(spec(n_step=3, gamma=0.9)) != structure(spec(n_step=3, gamma=0.99))


def test_a_member_whose_rows_leave_the_batch_leaves_the_population(tmp_path):
    from test_sweep import TINY, write_spec

    from marlctl.spec import load_spec
    from marlctl.train.lifecycle import RowEnd, RunState
    from marlctl.train.population import Population

    space = {"algo.lr": {"low": 1.0e-4, "high": 3.0e-3, "log": True}}
    body = {**TINY, "sweep": {"trials": 3, "sampler": "pbt", "seed": 1, "space": space}}
    spec = load_spec(str(write_spec(tmp_path, body)), []).spec
    rates = [1e-4, 1e-3, 2e-3]
    requests = [
        SimpleNamespace(
            spec=spec.model_copy(update={"algo": spec.algo.model_copy(update={"lr": rate})}),
            trial=f"trial{member}",
            run=SimpleNamespace(seed=seed),
        )
        for member, rate in enumerate(rates)
        for seed in (0, 1)
    ]
    run = RunState(spec, requests, [None] * 6, None, [None] * 6, None, None, None, None)
    population = Population(run)
    assert population.members == [[0, 1], [2, 3], [4, 5]]
    for row in (2, 3):  # member 1 failed
        run.ended[row] = RowEnd("FAILED", 0, "non-finite loss")
    keep = run.live
    run.keep(keep)
    population.on_compact(run, keep)
    assert population.members == [[0, 1], [2, 3]]
    assert [values["algo.lr"] for values in population.values] == [1e-4, 2e-3]
    assert run.origin == [0, 1, 4, 5] and run.has_ended(2) is False


def test_a_linear_schedule_anneals_the_training_env_s_shaped_reward(tmp_path):
    """JaxMARL's Overcooked IPPO: the shaped reward's weight falls linearly from 1 to 0 in
    training, while evaluation plays `env.params` (0: the sparse return alone)."""
    from test_training import history, run_json, write_spec

    from marlctl.envs.native import native_class

    body = {
        "seeds": [0, 1],
        "env": {"id": "overcooked/cramped_room", "backend": "native",
                "params": {"shaped_reward_scale": 0.0}},
        "algo": {"name": "ippo", "rollout_steps": 16, "epochs": 1, "minibatches": 1},
        "model": {"hidden": [16]},
        "train": {"total_env_steps": 1024, "eval_every": 0, "eval_episodes": 2,
                  "checkpoint_every": 0,
                  "schedule": {"env.shaped_reward_scale": {"linear": [[0, 1.0], [800, 0.0]]}}},
        "hardware": {"device": "cpu", "num_envs": 16, "batch_seeds": True},
    }  # fmt: skip
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    for run in out["runs"]:  # iterations of 256 env steps; 0 from step 800 on
        points = history(run["run_id"], "schedule/env.shaped_reward_scale")
        steps, values = zip(*points, strict=True)
        assert steps == (0, 256, 512, 768, 1024), points
        assert values == pytest.approx((1.0, 0.68, 0.36, 0.04, 0.0)), points
    env = native_class("overcooked/cramped_room")({}, 64, torch.device("cpu"))
    env.reset(0)
    draws, paid = torch.Generator().manual_seed(0), 0.0
    env.set_param("shaped_reward_scale", 0.25)
    for _ in range(400):
        step = env.step({"agent": torch.randint(6, (64, 2), generator=draws)})
        expected = env.sparse_reward.unsqueeze(-1) + 0.25 * env.shaped_reward
        assert torch.equal(step.rewards["agent"], expected)
        paid += float(env.shaped_reward.sum())
    assert paid > 0  # random cooks put onions into pots: the shaped part was there to weigh
