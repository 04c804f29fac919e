"""A native env with no PettingZoo original: it declares its own agents and spaces
(`marlctl.envs.native.base.NativeEnv`); the matrix games are the built-in ones."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from marlctl.algos import registered_algos
from marlctl.cli import app
from marlctl.envs.native import NATIVE_ONLY, native_class
from marlctl.envs.native.matrix import CLIMBING, penalty
from marlctl.envs.probe import probe
from marlctl.envs.registry import lookup

runner = CliRunner()
ONLINE = [name for name, info in registered_algos().items() if not info.offline]

SPEC = """\
defaults:
  - algos: {algo}
  - _self_
name: {name}
env:
  id: {env}
  backend: native
seeds: [0, 1, 2]
train:
  total_env_steps: {steps}
  eval_every: 0
  eval_episodes: 64
  log_every: 5000
  checkpoint_every: 0
hardware:
  num_envs: 64
  batch_seeds: true
"""


def test_matrix_games_pay_their_tables_and_end_after_max_cycles() -> None:
    for env_id, table in (("matrix/climbing", CLIMBING), ("matrix/penalty", penalty(-100.0))):
        env = native_class(env_id)({"max_cycles": 2}, 9, "cpu")
        ob = env.reset(0)
        assert ob.obs["player"].shape == (9, 2, 1) and ob.state.shape == (9, 1)
        a = torch.tensor([[i, j] for i in range(3) for j in range(3)])
        tr = env.step({"player": a})
        expected = torch.tensor([table[i][j] for i in range(3) for j in range(3)])
        assert torch.equal(tr.rewards["player"][:, 0], expected)
        assert torch.equal(tr.rewards["player"][:, 1], expected)
        assert not tr.terminated.any() and not tr.truncated.any()
        tr = env.step({"player": a})
        assert tr.terminated.all() and not tr.truncated.any()  # the game is over: no bootstrap
        assert tr.final.obs["player"].eq(1.0).all() and tr.next.obs["player"].eq(0.0).all()


def test_a_native_only_env_is_registered_probed_and_listed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    info = probe("matrix/penalty", {"k": -50})
    assert [g.name for g in info.groups] == ["player"] and info.groups[0].n_actions == 3
    assert lookup("matrix/penalty").suite == "native"
    listed = json.loads(runner.invoke(app, ["list", "envs", "--json"]).stdout)["envs"]
    rows = {row["id"]: row for row in listed}
    for env_id in NATIVE_ONLY:
        assert rows[env_id]["backends"] == ["native"] and rows[env_id]["installed"]
    spec = tmp_path / "m.yaml"
    spec.write_text(SPEC.format(algo="mappo", name="m", env="matrix/climbing", steps=1000))
    result = runner.invoke(app, ["validate", str(spec), "env.backend=pettingzoo"])
    assert result.exit_code == 2
    assert "env.backend: 'matrix/climbing' exists only natively" in result.output
    result = runner.invoke(app, ["validate", str(spec), "+env.params.k=-3"])
    assert result.exit_code == 2
    assert "env.params.k: not a parameter of env 'matrix/climbing'" in result.output
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("algo", ONLINE)
def test_learners_climb_from_random_play_to_a_joint_action_paying_5_or_more(
    tmp_path: Path, monkeypatch, algo: str
) -> None:
    """The climbing game, every online algorithm, in seconds (the longer learning checks are
    marked `slow`): uniform random play scores -31/9 = -3.4 per round; the three equilibria
    pay 11, 7 and 5, and the one other joint action paying over 0 pays 6, a step from 7."""
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "climbing.yaml"
    spec.write_text(SPEC.format(algo=algo, name=algo, env="matrix/climbing", steps=30_000))
    result = runner.invoke(app, ["run", str(spec), "--json"])
    assert result.exit_code == 0, result.output
    returns = [r["final_return"] for r in json.loads(result.stdout)["runs"]]
    assert statistics.median(returns) >= 4.5, returns


NATIVE_SPEC = """\
env:
  id: {env}
  backend: native
  params:
    {param}
algo:
  name: mappo
"""


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("max_cycles: true", "max_cycles must be a whole number of at least 1, not true"),
        ("max_cycles: 2.5", "max_cycles must be a whole number of at least 1, not 2.5"),
        ("map_width: .nan", "map_width must be a finite number above 8, not nan"),
        ("map_height: abc", "map_height must be a finite number above 8, not 'abc'"),
        ("map_width: 1.0e+30", "map_width 1e+30: the slowest unit moves 0.140625 per world"),
        ("time_per_step: .inf", "time_per_step must be a finite number above 0, not inf"),
        (
            "world_steps_per_env_step: 1000000000",
            "world_steps_per_env_step must be a whole number from 1 to 1,000, not 1000000000",
        ),
        ("won_battle_bonus: .nan", "won_battle_bonus must be a finite number, not nan"),
        ("walls_cause_death: 'no'", "walls_cause_death must be true or false, not 'no'"),
        ("attack_mode: sideways", "attack_mode must be closest or random, not 'sideways'"),
        ("atack_mode: random", "not a parameter of env 'smax/3m'; did you mean 'attack_mode'?"),
        ("k: -.inf", "k must be a finite number, not -inf"),
    ],
)
def test_a_wrong_native_param_is_named_at_its_line(
    tmp_path: Path, param: str, message: str
) -> None:
    spec = tmp_path / "native.yaml"
    env = "matrix/penalty" if param.startswith("k:") else "smax/3m"
    spec.write_text(NATIVE_SPEC.format(env=env, param=param))
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    key = param.partition(":")[0]
    assert f"native.yaml:5: env.params.{key}: {message}" in result.output.replace("\n", " ")
