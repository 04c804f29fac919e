"""Presets that configure an algorithm rather than add one: A2C over the on-policy trainer."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from typer.testing import CliRunner

from marlctl.cli import app

runner = CliRunner()

SPEC = """\
defaults:
  - algos: a2c
  - _self_
name: a2c
env:
  id: matrix/climbing
  backend: native
seeds: [0, 1, 2]
train:
  total_env_steps: 30000
  eval_every: 0
  eval_episodes: 64
  log_every: 1000
  checkpoint_every: 0
hardware:
  num_envs: 64
  batch_seeds: true
"""


def test_a2c_is_one_policy_gradient_step_per_rollout_and_learns(
    tmp_path: Path, monkeypatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "a2c.yaml"
    spec.write_text(SPEC)
    result = runner.invoke(app, ["run", str(spec), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["run", str(spec), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    client = MlflowClient(summary["tracking_uri"])
    for run in summary["runs"]:
        params = client.get_run(run["run_id"]).data.params
        assert (params["algo.epochs"], params["algo.minibatches"]) == ("1", "1")
        # The only step of each rollout starts at the policy that collected it: ratio 1.
        kl = client.get_metric_history(run["run_id"], "loss/approx_kl")
        assert kl and max(abs(m.value) for m in kl) < 1e-6
    # Uniform random play scores -3.4 per round; the game's equilibria pay 5 or more.
    returns = [r["final_return"] for r in summary["runs"]]
    assert statistics.median(returns) >= 4.5, returns
