"""The self-play benchmark's experiments: every spec it would train validates, the held-out
prey never share a seed with a team's, and its table reads what the runs recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from marlctl.cli import app

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

runner = CliRunner()


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
