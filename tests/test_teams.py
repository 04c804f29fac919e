"""Groups that learn with algorithms of their own (the spec's `groups.NAME.algo`)."""

from __future__ import annotations

import pytest
from games import client, invoke, line_of, tag_spec, write

MADDPG = {"name": "maddpg", "batch_size": 32, "learning_starts": 50}


# ---------------------------------------------------------------- validation


def test_a_group_algorithm_is_checked_against_that_group_at_its_line():
    body = tag_spec({"adversary": {"algo": {"name": "qmix"}}})
    body["env"]["params"]["continuous_actions"] = True
    path = write(body)
    code, out = invoke("validate", str(path))
    assert code == 2
    (error,) = out["errors"]
    assert error.startswith(f"{path}:{line_of(path, 'name: qmix')}: groups.adversary.algo.name:")
    assert "does not support continuous actions" in error and "group 'adversary'" in error


def test_an_unknown_algorithm_or_field_in_a_group_is_named_with_a_suggestion():
    path = write(tag_spec({"adversary": {"algo": {"name": "madpg"}}}))
    code, out = invoke("validate", str(path))
    assert code == 2
    assert out["errors"] == [
        f"{path}:{line_of(path, 'madpg')}: groups.adversary.algo.name: unknown algorithm "
        "'madpg'; did you mean 'maddpg'?"
    ]
    path = write(tag_spec({"adversary": {"algo": {"name": "maddpg", "bach_size": 32}}}))
    code, out = invoke("validate", str(path))
    assert code == 2
    assert out["errors"] == [
        f"{path}:{line_of(path, 'bach_size')}: groups.adversary.algo.bach_size: unknown key; "
        "did you mean 'batch_size'?"
    ]


def test_a_group_algorithm_named_without_a_mapping_says_how_to_write_it():
    path = write(tag_spec({"adversary": {"algo": "maddpg"}}))
    code, out = invoke("validate", str(path))
    assert code == 2
    assert out["errors"] == [
        f"{path}:{line_of(path, 'algo: maddpg')}: groups.adversary.algo: must be a mapping "
        "with a name, such as {name: maddpg}"
    ]


def test_teams_need_rollouts_that_divide_each_other():
    path = write(tag_spec({"adversary": {"algo": {**MADDPG, "rollout_steps": 7}}}))
    code, out = invoke("validate", str(path))
    assert code == 2
    (error,) = out["errors"]
    assert "groups.adversary.algo.rollout_steps: 7 rollout steps do not divide" in error


def test_a_scripted_group_takes_no_algorithm():
    path = write(tag_spec({"adversary": {"scripted": "random", "algo": {"name": "maddpg"}}}))
    code, out = invoke("validate", str(path))
    assert code == 2
    assert "a scripted or frozen group does not learn" in out["errors"][0]


def test_a_group_model_takes_its_own_algorithms_reference_values():
    from marlctl.spec import load_spec

    loaded = load_spec(write(tag_spec({"adversary": {"algo": {"name": "maddpg"}}})))
    spec = loaded.spec
    assert spec.model.activation == "tanh"  # MAPPO's, for the default team
    assert spec.groups["adversary"].model.activation == "relu"  # MADDPG's
    assert spec.groups["adversary"].model.hidden == [16]  # set at the top level


# ---------------------------------------------------------------- training


def test_maddpg_predators_and_mappo_prey_train_side_by_side_and_evaluate():
    body = tag_spec({"adversary": {"algo": MADDPG}})
    code, out = invoke("run", str(write(body)))
    assert code == 0, out
    (run,) = out["runs"]
    metrics = client().get_run(run["run_id"]).data.metrics
    assert "loss/policy" in metrics  # MAPPO's, the default team's (the prey)
    assert "loss/critic/adversary" in metrics and "loss/actor/adversary" in metrics
    assert {"eval/return/adversary", "eval/return/agent"} <= set(metrics)
    code, evaluated = invoke("eval", run["run_id"])
    assert code == 0, evaluated
    result = evaluated["runs"][0]
    assert result["return_mean"] == pytest.approx(result["logged_return"], abs=1e-5)


def test_one_team_of_every_group_computes_what_the_plain_run_computes():
    spread = {
        "name": "plain",
        "seeds": [0],
        "env": {"id": "mpe/simple_spread", "backend": "native", "params": {"N": 2}},
        "algo": {"name": "mappo", "rollout_steps": 25, "epochs": 2, "minibatches": 2},
        "model": {"hidden": [16]},
        "train": {"total_env_steps": 600, "eval_every": 0, "eval_episodes": 4,
                  "checkpoint_every": 0, "log_every": 100},
        "hardware": {"device": "cpu", "num_envs": 4},
    }  # fmt: skip
    code, plain = invoke("run", str(write(spread, "plain.yaml")))
    assert code == 0, plain
    team = {**spread, "name": "team", "groups": {"agent": {"algo": dict(spread["algo"])}}}
    code, teams = invoke("run", str(write(team, "team.yaml")))
    assert code == 0, teams
    a, b = plain["runs"][0], teams["runs"][0]
    assert a["final_return"] == b["final_return"]
    history = client().get_metric_history
    alone = [m.value for m in history(a["run_id"], "loss/policy")]
    assert len(alone) == 6  # one point per 100-step iteration
    assert alone == [m.value for m in history(b["run_id"], "loss/policy/agent")]


def test_a_failing_team_fails_the_run_with_its_reason_and_no_hang(monkeypatch):
    from marlctl.train import offpolicy

    def broken(self, batch):
        raise RuntimeError("the predators' update broke")

    monkeypatch.setattr(offpolicy.OffPolicyTrainer, "prepare", broken)
    code, out = invoke("run", str(write(tag_spec({"adversary": {"algo": MADDPG}}))))
    assert code == 1
    (run,) = out["runs"]
    assert run["status"] == "FAILED"
    assert "the predators' update broke" in run["error"]
