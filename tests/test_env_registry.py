"""Every env family is listed whether or not its package is installed, and an id of one that is
not installed names the command that installs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marlctl.cli import app
from marlctl.envs import families
from marlctl.envs.registry import backends, lookup, registered_ids

runner = CliRunner()


@pytest.mark.skipif(importlib.util.find_spec("vmas") is None, reason="vmas is not installed")
def test_the_listed_vmas_scenarios_are_the_installed_packages():
    from marlctl.envs.vmas import scenario_names

    assert families.VMAS_SCENARIOS == tuple(scenario_names())


@pytest.fixture
def without_vmas(monkeypatch):
    importable = families._importable
    monkeypatch.setattr(families, "_importable", lambda m: m != "vmas" and importable(m))


def test_a_family_that_is_not_installed_is_listed_with_its_install_command(without_vmas):
    ids = [i for i in registered_ids() if i.startswith("vmas/")]
    assert len(ids) == len(families.VMAS_SCENARIOS) == 41
    entry = lookup("vmas/navigation")
    assert not entry.installed and entry.install_hint == "pip install 'marlctl[vmas]'"
    assert backends("vmas/navigation") == ["vmas"]


def test_an_id_of_a_family_not_installed_names_its_install_command(without_vmas, tmp_path):
    spec = Path(__file__).resolve().parent.parent / "specs" / "spread_mappo.yaml"
    result = runner.invoke(app, ["validate", str(spec), "env.id=vmas/navigation"])
    assert result.exit_code == 2, result.output
    assert "env.id: env 'vmas/navigation' needs vmas, which is not installed" in result.output
    assert "pip install 'marlctl[vmas]'" in result.output and "unknown env" not in result.output


def test_backends_follow_the_env():
    assert backends("mpe/simple_spread") == ["pettingzoo", "native"]
    assert backends("sisl/pursuit") == ["pettingzoo", "native"]
    assert backends("sisl/multiwalker") == ["pettingzoo"]
    assert backends("vmas/balance") == ["vmas"]
    native_only = [i for i in registered_ids() if lookup(i).suite == "native"]
    assert native_only and all(backends(i) == ["native"] for i in native_only)


def test_one_parser_reads_foraging_task_names():
    from marlctl.envs.native import foraging_task

    task = "Foraging-2s-8x8-2p-2f-coop-v3"
    assert lookup(f"lbf/{task}").summary == (
        "level-based foraging: 8x8 grid, 2 players, 2 food, sight 2, every food needs all players"
    )
    keywords = foraging_task(task)
    assert keywords["sight"] == 2 and keywords["field_size"] == (8, 8) and keywords["force_coop"]
    assert foraging_task("Foraging-8x8-2p-2f-v2") is None  # not the version the kernel steps
    assert families.LBF_TASK.match("Foraging-8x10-2p-2f-v3") is None  # the package's are square


def test_momaland_is_listed_without_momaland(monkeypatch):
    importable = families._importable
    monkeypatch.setattr(families, "_importable", lambda m: m != "momaland" and importable(m))
    entries = list(families._momaland())
    assert [e.id for e in entries] == [f"momaland/{name}" for name in families.MOMALAND]
    assert all(not e.installed for e in entries)
    assert {e.install_hint for e in entries} == {"pip install --no-deps momaland"}
