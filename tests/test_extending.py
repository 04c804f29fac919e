"""The templates of `docs/extending.md` work as the guide says, and every file it names
exists: a new algorithm (config + trainer), a PettingZoo env named by its factory."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marlctl.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "docs" / "extending"
GUIDE = ROOT / "docs" / "extending.md"

SPEC = """\
name: {name}
algo:
  name: {algo}
env:
  id: {env}
  backend: {backend}
seeds: {seeds}
train:
  total_env_steps: {steps}
  eval_every: 0
  eval_episodes: 64
  log_every: 1000
  checkpoint_every: 0
hardware:
  num_envs: {envs}
  batch_seeds: {batch}
"""


@pytest.fixture
def templates(monkeypatch):
    """The templates importable as the guide's top-level modules."""
    monkeypatch.syspath_prepend(str(TEMPLATES))
    yield
    for module in ("algo_config", "algo_trainer", "pettingzoo_env"):
        sys.modules.pop(module, None)


# The spec model knows the algorithms registered when it is built: a new algorithm's config
# is imported first, as `marlctl.algos` does for every module of its package.
WITH_TEMPLATE = """
import sys
sys.path.insert(0, sys.argv.pop(1))
import algo_config  # registers "pg"
from marlctl.cli import main
main()
"""


def _marlctl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", WITH_TEMPLATE, str(TEMPLATES), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_algorithm_template_is_listed_and_learns(tmp_path: Path) -> None:
    listed = _marlctl("list", "algos", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "pg" in {row["name"] for row in json.loads(listed.stdout)["algos"]}
    spec = tmp_path / "pg.yaml"
    spec.write_text(
        SPEC.format(
            name="pg", algo="pg", env="matrix/climbing", backend="native",
            seeds=[0, 1, 2], steps=30_000, envs=64, batch="true",
        )
    )  # fmt: skip
    done = _marlctl("run", str(spec), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert all(r["status"] == "FINISHED" for r in runs)
    # Uniform random play scores -3.4 per round; the game's equilibria pay 5 or more.
    assert statistics.median(r["final_return"] for r in runs) >= 4.5, runs


def test_the_pettingzoo_template_validates_and_trains(templates, tmp_path: Path, monkeypatch):
    from marlctl.envs.probe import probe

    monkeypatch.chdir(tmp_path)
    info = probe("pettingzoo_env:parallel_env", {"size": 6})
    (walkers,) = info.groups
    assert walkers.n_agents == 2 and walkers.obs_shape == (12,) and walkers.n_actions == 3
    assert walkers.mask_source == "info" and info.state_from_env and info.state_dim == 12
    spec = tmp_path / "meet.yaml"
    spec.write_text(
        SPEC.format(
            name="meet", algo="mappo", env="pettingzoo_env:parallel_env", backend="pettingzoo",
            seeds=[0], steps=400, envs=4, batch="false",
        )
    )  # fmt: skip
    result = runner.invoke(app, ["validate", str(spec), "+env.params.size=1"])
    assert result.exit_code == 2 and "size must be at least 2" in result.output
    result = runner.invoke(app, ["run", str(spec), "--json"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    assert run["status"] == "FINISHED" and run["final_return"] <= 0


def test_every_file_the_guide_names_exists() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    pattern = r"`((?:marlctl|tests|docs|algos|envs|specs)/[\w./<>-]+\.(?:py|yaml|md))`"
    named = set(re.findall(pattern, text))
    real = {n for n in named if "<" not in n}  # `marlctl/algos/<name>.py` is a new file
    missing = [n for n in sorted(real) if not (ROOT / n).exists()]
    assert len(real) >= 10 and not missing, missing
