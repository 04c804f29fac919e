"""The algorithm benchmark's rows: every spec it would train validates, and a variant of a
preset trains the preset with only the variant's values changed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from marlctl.algos import registered_algos
from marlctl.cli import app
from marlctl.envs.registry import lookup

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import algorithms  # noqa: E402

runner = CliRunner()
ONLINE = [name for name, info in registered_algos().items() if not info.offline]
ROWS = [*ONLINE, *algorithms.PRESETS, *algorithms.VARIANTS]


@pytest.mark.parametrize("algo", ROWS)
def test_every_benchmark_row_compiles_to_a_valid_spec(algo: str, tmp_path: Path) -> None:
    on_policy = registered_algos()[algorithms.registered(algo)].on_policy
    for task in algorithms.TASKS:
        spec = algorithms.spec_for(algo, task, 2_000, 2, on_policy, {"device": "cpu"})
        spec["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
        path = tmp_path / f"{task}.yaml"
        path.write_text(yaml.safe_dump(spec))
        result = runner.invoke(app, ["run", str(path), "--dry-run", "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["plan"]["algo"] == algorithms.registered(algo)
        assert len(data["plan"]["runs"]) == 2
        row = algorithms.settings(algo, on_policy, task)
        for name, value in row["algo"].items():
            assert data["spec"]["algo"][name] == value, name
        for name, value in row.get("model", {}).items():
            assert data["spec"]["model"][name] == value, name


def test_a_preset_variant_changes_only_its_own_values() -> None:
    a2c = algorithms.settings("a2c", True)
    variant = algorithms.settings("a2c-lr4e-3", True)
    assert variant["algo"] == {**a2c["algo"], "lr": 4e-3}
    assert variant["num_envs"] == a2c["num_envs"]
    # IA2C's preset composes A2C's (its own defaults) and changes the algorithm alone.
    assert algorithms.preset("ia2c") == {**algorithms.preset("a2c"), "name": "ippo"}
    independent = algorithms.settings("ia2c-lr4e-3", True)
    assert independent["algo"] == {**variant["algo"], "name": "ippo"}
    assert algorithms.registered("ia2c-lr4e-3") == "ippo"
    assert algorithms.registered("a2c-lr4e-3") == algorithms.preset("a2c")["name"]


def test_task_settings_reach_only_the_fields_an_algorithm_has() -> None:
    # JaxMARL's SMAX settings on 2s3z: MAPPO and HAPPO get the same rollout, clip and GRU,
    # HATRPO its one step per rollout, a replay-based algorithm without recurrence gamma 0.99
    # and no GRU; the MPE rows are unchanged.
    mappo = algorithms.settings("mappo", True, "2s3z")
    happo = algorithms.settings("happo", True, "2s3z")
    hatrpo = algorithms.settings("hatrpo", True, "2s3z")
    assert mappo["algo"]["rollout_steps"] == happo["algo"]["rollout_steps"] == 128
    assert mappo["algo"]["clip"] == happo["algo"]["clip"] == 0.05
    assert happo["algo"]["critic_epochs"] == 4 and "critic_epochs" not in mappo["algo"]
    assert hatrpo["algo"]["epochs"] == 1 and hatrpo["algo"]["rollout_steps"] == 128
    assert mappo["model"] == happo["model"] == {"hidden": [128, 128], "activation": "relu",
                                                 "recurrent": "gru"}  # fmt: skip
    assert not registered_algos()["masac"].recurrent
    masac = algorithms.settings("masac", False, "2s3z")
    assert masac["algo"]["gamma"] == 0.99 and "recurrent" not in masac["model"]
    assert masac["model"]["hidden"] == [128, 128]
    assert algorithms.settings("mappo", True, "simple_spread") == algorithms.ON_POLICY
    assert algorithms.settings("happo", True) == algorithms.settings("happo", True, "simple_spread")


def test_random_play_keeps_to_allowed_actions_and_counts_wins() -> None:
    spread = algorithms.random_play("simple_spread", episodes=64)
    assert set(spread) == {"random"} and spread["random"] < -15
    smax = algorithms.random_play("2s3z", episodes=64)
    assert set(smax) == {"random", "random win rate"}
    assert 0.0 <= smax["random win rate"] < 0.5


def test_a_variant_with_model_settings_changes_the_model_alone() -> None:
    mappo = algorithms.settings("mappo", True, "het_mass")
    independent = algorithms.settings("mappo-independent", True, "het_mass")
    assert independent == {**mappo, "model": {"sharing": "independent"}}
    masac = algorithms.settings("masac-current-independent", False, "het_mass")
    assert masac["algo"] == algorithms.settings("masac-current", False, "het_mass")["algo"]
    assert masac["model"] == {"sharing": "independent"}
    # Reading a variant leaves its entry whole for the next cell.
    assert algorithms.VARIANTS["mappo-independent"][1] == {"model": {"sharing": "independent"}}


@pytest.mark.skipif(not lookup("vmas/het_mass").installed, reason="vmas is not installed")
def test_het_mass_rewards_the_light_agent_running_and_the_heavy_one_resting() -> None:
    assert algorithms.env_id("het_mass") == "vmas/het_mass"
    assert algorithms.backend("het_mass") == "vmas" and not algorithms.reports_wins("het_mass")
    best, joint = algorithms.best_constant_play("het_mass", episodes=2)
    random = algorithms.random_play("het_mass", episodes=16)["random"]
    # agent 0 (mass 4) takes no action; agent 1 (mass 2) pushes; idling both earns 0.
    assert joint[0] == 0 and joint[1] != 0
    assert best > 5.0 and random < 0.0


def dry_runs(bodies: dict[str, dict], tmp_path: Path) -> dict[str, dict]:
    """`marlctl run --dry-run --json` of each spec body: its JSON, by the body's key."""
    plans = {}
    for key, body in bodies.items():
        body = {**body, "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump(body))
        result = runner.invoke(app, ["run", str(path), "--dry-run", "--json"])
        assert result.exit_code == 0, result.output
        plans[key] = json.loads(result.stdout)
    return plans


def test_every_tag_experiment_compiles_and_no_held_out_prey_shares_a_seed(tmp_path: Path) -> None:
    import selfplay

    bodies = selfplay.tag_bodies([], league=3)
    assert list(bodies) == ["league", "population", "co_learning", *selfplay.held_out_prey("mappo")]
    assert list(selfplay.tag_bodies([])) == list(bodies)[1:]
    seeds = [tuple(b["seeds"]) for k, b in bodies.items() if k != "population"]
    assert len(set(seeds)) == len(seeds) and seeds[1] == tuple(bodies["population"]["seeds"])
    assert len(bodies["league"]["seeds"]) == 3 and not bodies["league"].get("groups")
    plans = dry_runs(bodies, tmp_path)
    assert plans["held_out_ippo"]["plan"]["algo"] == "ippo"
    assert plans["held_out_early"]["spec"]["train"]["total_env_steps"] == 300_000
    assert "pool" in yaml.safe_dump(bodies["population"]["groups"])
    assert not plans["co_learning"]["spec"].get("groups")


def test_the_maddpg_tag_experiment_holds_out_maddpg_and_matd3_prey(tmp_path: Path) -> None:
    import selfplay

    spec = "tag_population_maddpg.yaml"
    bodies = selfplay.tag_bodies([], spec=spec)
    assert list(bodies) == [
        "population",
        "co_learning",
        "held_out",
        "held_out_early",
        "held_out_matd3",
    ]
    algos = {key: plan["plan"]["algo"] for key, plan in dry_runs(bodies, tmp_path).items()}
    assert algos == {**dict.fromkeys(bodies, "maddpg"), "held_out_matd3": "matd3"}
    # Each spec's experiment keeps a store of its own: one never wipes the other's runs.
    assert selfplay.store(selfplay.TAG_SPEC) == "tag"
    assert selfplay.store(spec) == "tag_maddpg"
    with pytest.raises(SystemExit, match="no held-out learner for qmix"):
        selfplay.held_out_prey("qmix")


def test_the_tag_table_compares_both_teams_and_their_own_prey() -> None:
    import selfplay

    def team(scores: list[float], own: list[float]) -> dict:
        runs = [f"{k}{n}" for n, k in enumerate("abc")]
        matches = [
            {"run_id": r, "opponent": f"p{j}", "score": s + j}
            for r, s in zip(runs, scores, strict=True)
            for j in range(2)
        ]
        curve = {"steps": [0, 1000], "returns": [[2.0, v] for v in own]}
        return {"run_ids": runs, "matches": matches, "parent": "0" * 32, "own": curve}

    pool = {"share": 0.5, "sample": "prioritised", "size": 8, "every": 100_000}
    cell = {
        "part": "tag",
        "date": "2026-01-01",
        "machine": "m",
        "env_steps": 1000,
        "spec_file": "tag_population_maddpg.yaml",
        "spec": {
            "seeds": [0, 1, 2],
            "algo": {"name": "maddpg"},
            "groups": {"agent": {"pool": pool}},
            "train": {"eval_episodes": 64},
        },
        "held_out": {"held_out": "MADDPG, full budget"},
        "cells": {
            "population": team([20.0, 21.0, 22.0], [25.0, 25.0, 25.0]),
            "co_learning": team([10.0, 11.0, 12.0], [30.0, 31.0, 32.0]),
            "held_out": {"run_ids": ["p0", "p1"], "parent": "1" * 32},
        },
    }
    text = "\n".join(selfplay.tag_table(cell, []))
    assert "## simple_tag: MADDPG predators" in text and "--spec tag_population_maddpg.yaml" in text
    # Per seed, the mean over both held-out prey (score and score + 1).
    assert "| prey population | 21.50 ± " in text and "| 25.00 ± 0.00 |" in text
    assert "seed by seed: 3 of 3; the means differ by +10.00, beyond" in text
    # Both arms' seeds spread by 1 (sd 1): t = 10 / sqrt(2 / 3).
    assert "t = 12.25, one-sided p = 0.000" in text
    # Co-learning: 31 against its own prey, 11.5 against held-out prey.
    assert "co-learning predators return 31.00, +19.50 beside" in text
    assert "trained with (64 episodes)" in text
    assert "- 0: 2.00, 2.00\n- 1,000: 25.00, 31.00" in text
    earlier = "\n".join(selfplay.tag_table(cell, [cell])).split("Earlier runs")[1]
    assert (
        "3 of 3 seeds better, Welch's one-sided p = 0.000; median seeds 21.50 and 11.50" in earlier
    )
    assert "against their own prey 25.00 ± 0.00 and 31.00 ± 2.48." in earlier


def test_a_stopped_cell_is_read_from_its_store_as_the_finished_run_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell recorded from its MLflow store (a run stopped before its budget) takes each
    seed's last evaluation as final: on a run that finished, the same returns, curves and
    env steps that the finished run's own record has."""
    monkeypatch.setattr(algorithms, "WORKDIR", tmp_path)
    hw = {"device": "cpu", "threads_per_run": 1}
    ran = algorithms.run("mappo", "simple_spread", 6_400, 2, True, hw)
    assert ran["ok"] and len(ran["returns"]) == 2
    folder = tmp_path / "mappo-simple_spread"
    read = algorithms.stopped("mappo", "simple_spread", 6_400, True, folder, "a machine")
    for field in ("returns", "mean", "curves", "env_steps", "settings", "budget", "device"):
        assert read[field] == ran[field], field
    assert read["machine"] == "a machine" and read["stopped"] == "FINISHED"
    assert 0 < read["wall_s"] <= ran["wall_s"]
