"""A suite cell's reference points: named where the suite says (checked like its other fields),
scored in the cell's env as its runs' final evaluation is, carried by its seeds and drawn in
its report beside the reference."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import yaml
from test_report import report_json
from test_report_reproduction import add_cell, reference
from test_reproduce import REFERENCE, TINY_SPEC, write_suite

from marlctl import tracking
from marlctl.errors import SpecError
from marlctl.report.references import CellReference, Point
from marlctl.reproduce import load_suite

SCRIPTED = "marlctl.envs.native.simple_spread:scripted_policy"


def test_points_are_checked_where_the_suite_names_them(tmp_path):
    cells = {
        "a": {"spec": "spread.yaml", "reference": REFERENCE, "points": {"odd": "not a policy"}},
        "b": {"spec": "spread.yaml", "reference": REFERENCE, "points": {"shell": "os:system"}},
    }
    path = write_suite(tmp_path, cells)
    with pytest.raises(SpecError) as caught:
        load_suite(path)
    problems = {p.path: p for p in caught.value.problems}
    assert "must be random or package.module:callable" in problems["cells.a.points"].message
    assert "standard library" in problems["cells.b.points"].message
    assert "odd: 'not a policy'" in str(problems["cells.a.points"])
    # Fields valid: a policy that does not import, and a metric no evaluation gives.
    cells = {
        "a": {"spec": "spread.yaml", "reference": REFERENCE, "points": {"s": "nowhere.mod:fn"}},
        "b": {
            "spec": "spread.yaml",
            "reference": {**REFERENCE, "conventions": {**REFERENCE["conventions"],
                                                       "metric": "train/return_mean"}},
            "points": {"random": "random"},
        },
    }  # fmt: skip
    path = write_suite(tmp_path, cells)
    with pytest.raises(SpecError) as caught:
        load_suite(path)
    problems = {p.path: p for p in caught.value.problems}
    assert "nowhere" in problems["cells.a.points.s"].message
    assert "not an eval/ or eval_sampled/ metric" in problems["cells.b.points"].message
    lines = path.read_text().splitlines()
    assert "s: nowhere.mod:fn" in lines[problems["cells.a.points.s"].line - 1]
    # A suite-wide point is every cell's; a cell's own of the same name replaces it.
    cells = {
        "a": {"spec": "spread.yaml", "reference": REFERENCE},
        "b": {"spec": "spread.yaml", "reference": REFERENCE, "points": {"best": SCRIPTED}},
    }
    path = tmp_path / "suite.yaml"
    suite = {"name": "s", "points": {"random": "random", "best": "random"}, "cells": cells}
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    loaded, _ = load_suite(path)
    assert loaded.points_of("a") == {"random": "random", "best": "random"}
    assert loaded.points_of("b") == {"random": "random", "best": SCRIPTED}


def _spread_return(policy, episodes: int = 256, seed: int = 0) -> float:
    from marlctl.envs.native import native_class

    params = {"N": 3, "local_ratio": 0.5, "max_cycles": 25}
    env = native_class("mpe/simple_spread")(params, episodes, "cpu")
    ob, total = env.reset(seed), torch.zeros(episodes)
    group = SimpleNamespace(discrete=True, n_agents=3)
    for _ in range(25):
        step = env.step({"agent": policy(ob.obs["agent"], None, group)})
        total += step.rewards["agent"].mean(-1)
        ob = step.next
    return float(total.mean())


def test_the_scripted_spread_policy_covers_the_landmarks_from_observations_alone():
    from marlctl.envs.native.simple_spread import scripted_policy

    generator = torch.Generator().manual_seed(0)

    def random(obs, mask, group):
        return torch.randint(5, obs.shape[:2], generator=generator)

    scripted, uniform = _spread_return(scripted_policy), _spread_return(random)
    # Random play ends about 19 below it (-26.5 and -7.5 over 1,024 episodes).
    assert scripted > -9.0 and uniform < -20.0, (scripted, uniform)
    with pytest.raises(ValueError, match="every landmark and agent observed"):
        scripted_policy(torch.zeros(4, 3, 10), None, SimpleNamespace(discrete=True, n_agents=3))


def test_a_cell_s_points_are_scored_carried_by_its_seeds_and_drawn(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from marlctl.cli import app

    (tmp_path / "tiny.yaml").write_text(TINY_SPEC)
    wide = {**REFERENCE, "value": -40.0, "interval": [-90.0, -5.0], "budget": 2_000}
    suite = {
        "name": "tiny",
        "points": {"random": "random"},
        "cells": {
            "spread": {"spec": "tiny.yaml", "seeds": 2, "reference": wide,
                       "points": {"scripted": SCRIPTED}},
        },
    }  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    runner = CliRunner()
    result = runner.invoke(app, ["reproduce", str(path), "--json"])
    assert result.exit_code == 0, result.output
    (cell,) = json.loads(result.stdout)["cells"]
    client = tracking.client_for(None)
    tags = {client.get_run(r).data.tags[tracking.REFERENCE_TAG] for r in cell["run_ids"]}
    (tag,) = tags
    points = {p.name: p for p in CellReference.from_tag(tag).points}
    assert list(points) == ["random", "scripted"] and points["scripted"].player == SCRIPTED
    assert [p["name"] for p in cell["points"]] == ["random", "scripted"]  # in --json too
    # 4 evaluation episodes on each of 2 seeds: about -26.5 and -7.5, far apart.
    assert points["scripted"].value > points["random"].value + 10, points
    text = (tmp_path / "tiny.md").read_text()
    assert "### Reference points" in text
    assert "| tiny | spread | random |" in text and "uniformly random actions" in text
    assert f"| tiny | spread | scripted | {points['scripted'].value:.2f} |" in text
    # Every seed finished: the points its runs carry are read back, not scored again.
    from marlctl.reproduce import points as scoring

    def unexpected(*args, **kwargs):
        raise AssertionError("points scored again")

    monkeypatch.setattr(scoring, "measure", unexpected)
    again = runner.invoke(app, ["reproduce", str(path), "--json"])
    assert again.exit_code == 0, again.output
    assert "### Reference points" in (tmp_path / "tiny.md").read_text()


def test_a_scripted_policy_that_fails_fails_its_cell_before_training(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from marlctl.cli import app

    (tmp_path / "tiny.yaml").write_text(TINY_SPEC)
    (tmp_path / "broken_policy.py").write_text(
        "def act(obs, mask, group):\n    raise KeyError('no such landmark')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    wide = {**REFERENCE, "value": -40.0, "interval": [-90.0, -5.0], "budget": 2_000}
    cells = {"spread": {"spec": "tiny.yaml", "reference": wide,
                        "points": {"mine": "broken_policy:act"}}}  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "cells": cells}, sort_keys=False))
    result = CliRunner().invoke(app, ["reproduce", str(path), "--json"])
    (cell,) = json.loads(result.stdout)["cells"]
    assert cell["kind"] == "failed" and cell["run_id"] is None
    assert "reference points" in cell["reason"] and "no such landmark" in cell["reason"]


def test_points_travel_in_the_reference_tag_and_into_the_report(tmp_path):
    ref = reference("a", -21, -19)
    pointed = CellReference(**{**vars(ref), "points": (Point("random", -26.5, "random"),)})
    assert CellReference.from_tag(pointed.to_tag()) == pointed
    edited = pointed.to_tag().replace("-26.5", "NaN")
    assert CellReference.from_tag(edited).points == ()  # that point left out, the rest kept
    add_cell(tracking.client_for(None), "a", "mappo", [-20.0, -20.5, -19.5], pointed)
    (cell,) = report_json("--group-by", "cell,algo.name")["reproduction"]["cells"]
    assert cell["points"] == [{"name": "random", "value": -26.5, "player": "random"}]
    from marlctl.report import build
    from marlctl.report.figures import curves_figure

    report = build(None, [], [], [], group_by=("cell", "algo.name"))
    labels = [line.get_label() for line in curves_figure(report).axes[0].get_lines()]
    assert "reference" in labels and "random" in labels
