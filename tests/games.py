"""Helpers of the tests of competitive games: a tiny native simple_tag spec and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from marlctl.cli import app

runner = CliRunner()

TAG = {"num_good": 1, "num_adversaries": 2, "num_obstacles": 0, "max_cycles": 25}


def tag_spec(groups: dict | None = None, **extra) -> dict:
    """Two predators (`adversary`) and one prey (`agent`), 400 env steps of MAPPO; `extra`
    mappings merge into the spec's, other values replace."""
    body = {
        "name": "tag",
        "seeds": [0],
        "env": {"id": "mpe/simple_tag", "backend": "native", "params": dict(TAG)},
        "algo": {"name": "mappo", "rollout_steps": 25, "epochs": 1, "minibatches": 1},
        "model": {"hidden": [16]},
        "train": {
            "total_env_steps": 400,
            "eval_every": 200,
            "eval_episodes": 4,
            "checkpoint_every": 0,
        },
        "hardware": {"device": "cpu", "num_envs": 4},
    }
    if groups is not None:
        body["groups"] = groups
    for key, value in extra.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return body


def write(body: dict, name: str = "spec.yaml") -> Path:
    path = Path(name)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def invoke(*args: str) -> tuple[int, dict]:
    """A command's exit code and JSON document (`--json`), never a traceback."""
    result = runner.invoke(app, [*args, "--json"])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, json.loads(result.stdout[result.stdout.index("{") :])


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def client():
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{Path.cwd() / 'mlflow.db'}")
