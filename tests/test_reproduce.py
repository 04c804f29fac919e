"""Suites of published results: the suite file read and checked like a spec, a reference
translated to marlctl's conventions or refused, and the verdict on constructed cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from marlctl.errors import SpecError
from marlctl.report.reproduction import decide
from marlctl.reproduce import Refused, load_suite, translate
from marlctl.reproduce.suite import Reference

SPECS = Path(__file__).resolve().parent.parent / "specs"

REFERENCE = {
    "value": -20.0,
    "interval": [-21.0, -19.0],
    "budget": 100_000,
    "source": {
        "kind": "paper",
        "citation": "Someone et al. 2021, arXiv:0000.00000",
        "table": "Table 2",
    },
    "conventions": {
        "aggregation": "mean",
        "evaluation": "deterministic",
        "episodes": 32,
        "step": "env",
        "episode_length": 25,
    },
    "env_package": {"name": "mpe2", "version": "0.0.1"},
}


def reference(**changes) -> Reference:
    data = {**REFERENCE, **changes}
    return Reference.model_validate(data)


def write_suite(tmp_path: Path, cells: dict) -> Path:
    (tmp_path / "spread.yaml").write_text((SPECS / "spread_mappo.yaml").read_text())
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "cells": cells}, sort_keys=False))
    return path


def test_a_suite_reads_its_cells(tmp_path):
    path = write_suite(
        tmp_path, {"spread": {"spec": "spread.yaml", "seeds": 3, "reference": REFERENCE}}
    )
    suite, folder = load_suite(path)
    assert folder == tmp_path and list(suite.cells) == ["spread"]
    assert suite.cells["spread"].reference.conventions.episodes == 32


def test_every_malformed_field_is_located(tmp_path):
    bad = {
        **REFERENCE,
        "value": -30.0,  # outside its interval
        "source": {"kind": "paper", "citation": "x"},  # no table
        "conventions": {**REFERENCE["conventions"], "evaluation": "greedyish", "episodes": 0},
        "precision": -0.01,
        "colour": "blue",
    }
    cells = {
        "a": {"spec": "missing.yaml", "reference": REFERENCE},
        "b": {"spec": "spread.yaml", "seeds": 0, "reference": bad},
    }
    path = write_suite(tmp_path, cells)
    with pytest.raises(SpecError) as caught:
        load_suite(path)
    problems = {p.path: p for p in caught.value.problems}
    assert set(problems) >= {
        "cells.b.seeds",
        "cells.b.reference.source",
        "cells.b.reference.conventions.evaluation",
        "cells.b.reference.conventions.episodes",
        "cells.b.reference.precision",
        "cells.b.reference.colour",
    }, problems
    assert "needs `table`" in problems["cells.b.reference.source"].message
    assert problems["cells.b.reference.colour"].message == "unknown key"
    lines = path.read_text().splitlines()
    assert "seeds: 0" in lines[problems["cells.b.seeds"].line - 1]
    assert str(path) in str(problems["cells.b.seeds"])
    # A reference's own rules are checked once its fields are valid.
    outside = write_suite(
        tmp_path, {"b": {"spec": "spread.yaml", "reference": {**REFERENCE, "value": -30.0}}}
    )
    with pytest.raises(SpecError) as caught:
        load_suite(outside)
    (problem,) = caught.value.problems
    assert problem.path == "cells.b.reference" and "must hold the value -30.0" in problem.message
    # Once the fields are valid, a spec file that is not there is named at its line.
    good = write_suite(tmp_path, {"a": {"spec": "missing.yaml", "reference": REFERENCE}})
    with pytest.raises(SpecError) as caught:
        load_suite(good)
    (problem,) = caught.value.problems
    assert problem.path == "cells.a.spec" and "missing.yaml" in problem.message


def test_a_summed_return_and_agent_steps_are_translated():
    ref = reference(
        value=-60.0,
        interval=[-63.0, -57.0],
        budget=300_000,
        conventions={**REFERENCE["conventions"], "aggregation": "sum", "step": "agent"},
    )
    out = translate(ref, agents=3, episode_length=25)
    assert out.value == pytest.approx(-20.0) and out.interval == pytest.approx((-21.0, -19.0))
    assert out.budget == 100_000 and len(out.notes) == 2


@pytest.mark.parametrize(
    ("conventions", "agents", "length", "reason"),
    [
        ({"evaluation": "stochastic"}, 3, 25, "metric: eval_sampled/return_mean"),
        ({"metric": "eval_sampled/return_mean"}, 3, 25, "a deterministic policy"),
        ({}, 3, 50, "last 25 steps, the spec's 50"),
        ({"agents": 4, "aggregation": "sum"}, 3, 25, "4 agents, the spec's env 3"),
    ],
)
def test_what_cannot_be_translated_is_refused_with_the_reason(conventions, agents, length, reason):
    ref = reference(conventions={**REFERENCE["conventions"], **conventions})
    with pytest.raises(Refused, match=reason):
        translate(ref, agents=agents, episode_length=length)


def test_a_sampled_reference_compares_with_the_sampled_policy_s_metric():
    conventions = {**REFERENCE["conventions"], "evaluation": "stochastic",
                   "metric": "eval_sampled/return_mean"}  # fmt: skip
    out = translate(reference(conventions=conventions), agents=3, episode_length=25)
    assert out.value == -20.0
    summed = translate(
        reference(value=-60.0, interval=None, conventions={**conventions, "aggregation": "sum"}),
        agents=3,
        episode_length=25,
    )
    assert summed.value == pytest.approx(-20.0) and summed.notes


def translated(**changes):
    return translate(reference(**changes), agents=3, episode_length=25)


@pytest.mark.parametrize(
    ("finals", "kind"),
    [
        ([-20.5, -19.8, -20.1, -19.6, -20.3], "reproduced"),
        ([-15.2, -14.8, -15.1, -14.9, -15.0], "above"),
        ([-25.2, -24.8, -25.1, -24.9, -25.0], "below"),
        ([-20.0, -20.2], "inconclusive"),  # too few seeds
    ],
)
def test_verdicts_on_constructed_cases(finals, kind):
    assert decide(finals, translated().bounds).kind == kind


def test_a_scaled_budget_is_inconclusive_whatever_the_numbers():
    verdict = decide([-15.2, -14.8, -15.1, -14.9, -15.0], translated().bounds, scaled=True)
    assert verdict.kind == "inconclusive" and "scaled" in verdict.reason


def test_a_baseline_is_matched_never_reproduced_and_lower_is_better_for_a_loss():
    finals = [-20.5, -19.8, -20.1, -19.6, -20.3]
    assert decide(finals, translated().bounds, baseline=True).kind == "matches baseline"
    assert decide([-25.0] * 3 + [-25.1, -24.9], translated().bounds, maximize=False).kind == "above"


def test_per_seed_values_give_the_reference_a_bootstrap_interval():
    ref = translated(value=None, interval=None, per_seed=[-21.0, -20.0, -19.0, -20.5, -19.5])
    verdict = decide([-20.2, -19.9, -20.1, -19.8, -20.0], ref.bounds)
    low, high = verdict.reference
    assert -21.0 <= low < -20.0 < high <= -19.0 and verdict.kind == "reproduced"


def test_a_rounded_reference_stands_for_every_value_that_rounds_to_it():
    # Every seed at the task's optimum, 7.3791919..., written rounded to four decimals.
    ours = [7.379191894531249] * 5
    exact = translated(value=None, interval=None, per_seed=[7.3792] * 5)
    assert decide(ours, exact.bounds, baseline=True).kind == "below"
    rounded = translated(value=None, interval=None, per_seed=[7.3792] * 5, precision=1e-4)
    assert decide(ours, rounded.bounds, baseline=True).kind == "matches baseline"
    assert decide([7.3790] * 5, rounded.bounds, baseline=True).kind == "below"
    # A summed reference's margin is translated with it.
    summed = {**REFERENCE["conventions"], "aggregation": "sum"}
    scaled = translated(value=-60.0, interval=None, precision=0.3, conventions=summed)
    assert scaled.bounds == pytest.approx((-20.05, -19.95))


TINY_SPEC = """\
defaults:
  - envs: simple_spread
  - algos: mappo
  - _self_
env:
  backend: native
train:
  total_env_steps: 100000
  eval_every: 50000
  eval_episodes: 4
  checkpoint_every: 0
hardware:
  num_envs: 16
  batch_seeds: true
  threads_per_run: 1
"""


def test_a_tiny_suite_runs_end_to_end_with_a_verdict_per_cell(tmp_path):
    from typer.testing import CliRunner

    from marlctl.cli import app

    (tmp_path / "tiny.yaml").write_text(TINY_SPEC)
    wide = {**REFERENCE, "value": -40.0, "interval": [-90.0, -5.0], "budget": 2_000}
    stochastic = {
        **wide,
        "conventions": {**REFERENCE["conventions"], "evaluation": "stochastic"},
    }
    suite = {
        "name": "tiny",
        "cells": {
            "spread": {"spec": "tiny.yaml", "seeds": 3, "reference": wide},
            "spread-stochastic": {"spec": "tiny.yaml", "reference": stochastic},
        },
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    runner = CliRunner()
    result = runner.invoke(app, ["reproduce", str(path), "--json"])
    assert result.exit_code == 0, result.output
    import json

    cells = {c["name"]: c for c in json.loads(result.stdout)["cells"]}
    ran = cells["spread"]
    assert ran["kind"] in ("reproduced", "above", "below"), ran
    assert ran["budget"] == 2_000 and ran["seeds"] == 3 and len(ran["run_id"]) == 32
    assert ran["ours"]["low"] <= ran["ours"]["value"] <= ran["ours"]["high"]
    assert ran["reference"] == [-90.0, -5.0]
    # The reference's env package (mpe2 0.0.1) is not the native env this spec runs.
    assert any("measured with mpe2==0.0.1, this run has marlctl==" in n for n in ran["notes"])
    refused = cells["spread-stochastic"]
    assert refused["kind"] == "refused" and "stochastic" in refused["reason"]
    assert refused["run_id"] is None  # refused before anything trained
    # The results document: the judged runs' report with the verdict and the cell's figure.
    text = (tmp_path / "tiny.md").read_text()
    assert (
        "## Reproduction" in text and f"| tiny | spread | spread · mappo | {ran['kind']} |" in text
    )
    assert (tmp_path / "tiny_files" / "cell0.png").is_file()
    # Every seed carries its suite, cell and reference: `marlctl report` reads them back.
    from marlctl import tracking

    tagged = tracking.client_for(None).search_runs(
        [e.experiment_id for e in tracking.client_for(None).search_experiments()],
        f"tags.`{tracking.CELL_TAG}` = 'spread' and tags.`marlctl.role` = 'seed'",
    )
    assert sorted(r.info.run_id for r in tagged) == sorted(ran["run_ids"])
    # The same suite again: its finished seeds are read back, nothing trains.
    again = runner.invoke(app, ["reproduce", str(path), "--cells", "spread", "--json"])
    assert again.exit_code == 0, again.output
    (same,) = json.loads(again.stdout)["cells"]
    assert same["run_id"] is None and same["reused"] == 3 and same["ours"] == ran["ours"]
    rerun = runner.invoke(app, ["reproduce", str(path), "--cells", "spread", "--rerun", "--json"])
    (trained,) = json.loads(rerun.stdout)["cells"]
    assert trained["reused"] == 0 and trained["run_id"] not in (None, ran["run_id"])
    # One seed more: the three finished are read back, the fourth trains at the cell's budget.
    args = ["reproduce", str(path), "--cells", "spread", "--seeds", "4", "--json"]
    more = runner.invoke(app, args)
    assert more.exit_code == 0, more.output
    (grown,) = json.loads(more.stdout)["cells"]
    assert grown["reused"] == 3 and len(grown["run_ids"]) == 4
    client = tracking.client_for(None)
    budgets = {client.get_run(r).data.params["train.total_env_steps"] for r in grown["run_ids"]}
    assert budgets == {"2000"}
    # A dry run of two seeds counts two finished, not the four the store holds.
    args = ["reproduce", str(path), "--cells", "spread", "--seeds", "2", "--dry-run", "--json"]
    (dry,) = json.loads(runner.invoke(app, args).stdout)["cells"]
    assert dry["seeds"] == 2 and dry["finished"] == 2 and dry["cost"] is None
    # Fewer seeds or a scaled budget: inconclusive, whatever the numbers.
    args = ["reproduce", str(path), "--cells", "spread", "--seeds", "2", "--budget-scale", "0.5"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    (cell,) = json.loads(result.stdout)["cells"]
    assert cell["kind"] == "inconclusive" and cell["budget"] == 1_000
    result = runner.invoke(app, ["reproduce", str(path), "--cells", "nothing*"])
    assert result.exit_code == 2 and "no cell of tiny matches 'nothing*'" in result.output


def reproduced_once(tmp_path: Path, spec: str, seeds: int) -> tuple[Path, dict]:
    """A suite of one cell, `spec` trained for 2,000 steps with `seeds` seeds, reproduced
    once: the suite's path and the cell's row of `--json`."""
    import json

    from typer.testing import CliRunner

    from marlctl.cli import app

    (tmp_path / "tiny.yaml").write_text(spec)
    ref = {**REFERENCE, "value": -40.0, "interval": [-90.0, -5.0], "budget": 2_000}
    suite = {"name": "tiny", "cells": {"spread": {"spec": "tiny.yaml", "seeds": seeds,
                                                  "reference": ref}}}  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    first = CliRunner().invoke(app, ["reproduce", str(path), "--json"])
    assert first.exit_code == 0, first.output
    (cell,) = json.loads(first.stdout)["cells"]
    return path, cell


def test_a_stopped_seed_resumes_its_run_and_a_finished_one_is_read_back(tmp_path):
    import json

    from typer.testing import CliRunner

    from marlctl import tracking
    from marlctl.cli import app
    from marlctl.train.runner import RESUMED_TAG

    spec = TINY_SPEC.replace("checkpoint_every: 0", "checkpoint_every: 1000")
    spec = spec.replace("batch_seeds: true", "batch_seeds: false")
    path, cell = reproduced_once(tmp_path, spec, seeds=2)
    suite = yaml.safe_load(path.read_text())
    ref = suite["cells"]["spread"]["reference"]
    runner = CliRunner()
    client = tracking.client_for(None)
    stopped = cell["run_ids"][1]
    client.set_terminated(stopped, "KILLED")  # as Ctrl-C or SIGTERM leaves a seed's run
    dry = runner.invoke(app, ["reproduce", str(path), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    (row,) = json.loads(dry.stdout)["cells"]
    assert row["finished"] == 1 and row["resumed"] == 1
    again = runner.invoke(app, ["reproduce", str(path), "--json"])
    assert again.exit_code == 0, again.output
    (resumed,) = json.loads(again.stdout)["cells"]
    assert resumed["reused"] == 1 and resumed["resumed"] == 1 and resumed["run_id"] is None
    assert resumed["run_ids"] == cell["run_ids"]  # the same two runs: nothing trained anew
    run = client.get_run(stopped)
    assert run.info.status == "FINISHED" and run.data.tags[RESUMED_TAG] == "2000"
    assert run.data.tags[tracking.CELL_TAG] == "spread"
    # A reference that averages each seed's evaluations judges the same runs by that average.
    averaged = {**ref, "conventions": {**ref["conventions"], "statistic": "average"}}
    suite["cells"]["spread"]["reference"] = averaged
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    result = runner.invoke(app, ["reproduce", str(path), "--json"])
    assert result.exit_code == 0, result.output
    (cell_avg,) = json.loads(result.stdout)["cells"]
    means = [
        np.mean([m.value for m in client.get_metric_history(r, "eval/return_mean")])
        for r in cell["run_ids"]
    ]
    assert cell_avg["reused"] == 2 and cell_avg["ours"]["value"] == pytest.approx(np.mean(means))


def test_run_skip_finished_trains_only_the_seeds_not_finished_before(tmp_path):
    import json

    from typer.testing import CliRunner

    from marlctl.cli import app

    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_SPEC.replace("100000", "2000").replace("50000", "1000"))
    runner = CliRunner()
    first = runner.invoke(app, ["run", str(spec), "seeds=[0,1]", "--json"])
    assert first.exit_code == 0, first.output
    done = {r["seed"]: r["run_id"] for r in json.loads(first.stdout)["runs"]}
    again = runner.invoke(app, ["run", str(spec), "seeds=[0,1]", "--skip-finished", "--json"])
    assert again.exit_code == 0, again.output
    document = json.loads(again.stdout)
    assert document["trained"] == []
    assert {r["seed"]: r["run_id"] for r in document["finished_before"]} == done
    more = runner.invoke(app, ["run", str(spec), "seeds=[0,1,2]", "--skip-finished", "--json"])
    assert more.exit_code == 0, more.output
    assert [r["seed"] for r in json.loads(more.stdout[more.stdout.index("{") :])["runs"]] == [2]


def test_a_dry_run_estimates_every_cell_and_trains_nothing(tmp_path):
    import json

    from typer.testing import CliRunner

    from marlctl import tracking
    from marlctl.cli import app

    (tmp_path / "tiny.yaml").write_text(TINY_SPEC)
    wide = {**REFERENCE, "value": -40.0, "interval": [-90.0, -5.0], "budget": 20_000}
    suite = {"name": "tiny", "compare": ["ippo"], "cells": {"spread": {"spec": "tiny.yaml",
             "seeds": 2, "reference": wide}}}  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    result = CliRunner().invoke(app, ["reproduce", str(path), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    rows = {(c["name"], c["method"]): c for c in document["cells"]}
    assert set(rows) == {("spread", "mappo"), ("spread", "ippo")}
    for row in rows.values():
        cost = row["cost"]
        assert row["budget"] == 20_000 and cost["env_steps_per_s"] > 0 and cost["evals"] == 2
        # Two seeds batched in one process: their steps at the measured rate, and more.
        assert cost["total_s"] > 2 * 20_000 / cost["env_steps_per_s"]
    assert document["estimated_s"] == pytest.approx(
        sum(r["cost"]["total_s"] for r in rows.values())
    )
    client = tracking.client_for(None)
    assert not [e for e in client.search_experiments() if e.name.startswith("tiny")]


def test_every_cell_is_planned_before_any_trains(tmp_path):
    from typer.testing import CliRunner

    from marlctl import tracking
    from marlctl.cli import app

    (tmp_path / "tiny.yaml").write_text(TINY_SPEC)
    cells = {
        "good": {"spec": "tiny.yaml", "reference": REFERENCE},
        "bad-lr": {"spec": "tiny.yaml", "overrides": ["algo.lr=-1"], "reference": REFERENCE},
        "bad-key": {"spec": "tiny.yaml", "overrides": ["train.colour=1"], "reference": REFERENCE},
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "cells": cells}, sort_keys=False))
    result = CliRunner().invoke(app, ["reproduce", str(path)])
    assert result.exit_code == 2, result.output
    assert "algo.lr" in result.output and "train.colour" in result.output
    client = tracking.client_for(None)
    assert not [e for e in client.search_experiments() if e.name.startswith("tiny")]


SUITES = Path(__file__).resolve().parent.parent / "suites"


@pytest.mark.parametrize("path", sorted(SUITES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_suite_plans_with_every_reference_comparable(path):
    from marlctl.reproduce.runner import plan_suite

    planned = plan_suite(str(path), [], seeds=2, scale=0.01)
    assert planned and not [(cp.name, cp.refused) for cp in planned if cp.refused]
    for cp in planned:
        source = cp.cell.reference.source
        # marlctl's own results are named what they are: never a reproduction.
        assert source.kind != "baseline" or "regression baseline" in source.citation, cp.name
        assert 0 < cp.budget < cp.translated.budget


def test_cells_run_as_submitit_jobs(tmp_path):
    import json

    from typer.testing import CliRunner

    from marlctl.cli import app

    pytest.importorskip("submitit")
    (tmp_path / "tiny.yaml").write_text(TINY_SPEC)
    ref = {**REFERENCE, "value": -40.0, "interval": [-90.0, -5.0], "budget": 1_000}
    cells = {
        "a": {"spec": "tiny.yaml", "seeds": 1, "reference": ref},
        "b": {"spec": "tiny.yaml", "seeds": 1, "overrides": ["algo.lr=0.001"], "reference": ref},
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "cells": cells}, sort_keys=False))
    args = ["reproduce", str(path), "--launcher", "submitit", "--cluster", "local", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    found = {c["name"]: c for c in json.loads(result.stdout)["cells"]}
    for cell in found.values():  # one seed: inconclusive, but trained and judged
        assert cell["kind"] == "inconclusive" and len(cell["run_ids"]) == 1, cell
    assert (tmp_path / "tiny.md").is_file()
    # The jobs' runs are in the store: run here, the suite trains nothing.
    again = CliRunner().invoke(app, ["reproduce", str(path), "--json"])
    assert [c["reused"] for c in json.loads(again.stdout)["cells"]] == [1, 1]


@pytest.mark.parametrize("algo", ["mappo", "qmix"])
def test_sampled_evaluation_is_logged_beside_and_leaves_training_as_it_was(tmp_path, algo):
    import json

    from typer.testing import CliRunner

    from marlctl import tracking
    from marlctl.cli import app

    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_SPEC.replace("100000", "3000").replace("50000", "1000"))
    curves = {}
    for sampled in ("false", "true"):
        args = ["run", str(spec), f"algos={algo}", "seeds=[0]", f"train.eval_sampled={sampled}",
                "--json"]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        (run,) = json.loads(result.stdout)["runs"]
        client = tracking.client_for(None)
        history = client.get_metric_history(run["run_id"], "eval/return_mean")
        curves[sampled] = [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)]
        drawn = client.get_metric_history(run["run_id"], "eval_sampled/return_mean")
        assert len(drawn) == (len(history) if sampled == "true" else 0)
    # The sampled episodes draw from a forked random state: training is the same run.
    assert curves["true"] == curves["false"] and len(curves["true"]) >= 3


def test_an_interrupted_cell_stops_the_suite_and_exits_130(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM ends `marlctl run`'s seeds as KILLED; `reproduce` then stops at that
    cell instead of training the next one, and exits 130 as `run` does."""
    import json
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from marlctl import launch
    from marlctl.cli import app
    from marlctl.launch import RunResult

    (tmp_path / "tiny.yaml").write_text(TINY_SPEC)
    ref = {**REFERENCE, "value": -40.0, "interval": [-90.0, -5.0], "budget": 2_000}
    suite = {
        "name": "tiny",
        "cells": {
            "first": {"spec": "tiny.yaml", "seeds": 2, "reference": ref},
            "second": {"spec": "tiny.yaml", "seeds": 2, "reference": ref},
        },
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    trained = []

    def interrupted(loaded, plan, tags=None, **_):  # as `run_plan` returns after Ctrl-C
        trained.append(tags["marlctl.cell"])
        runs = [RunResult(r.index, r.seed, f"{r.seed:032d}", "KILLED",
                          error="interrupted by the user") for r in plan.runs]  # fmt: skip
        return SimpleNamespace(runs=runs, parent_run_id=None)

    monkeypatch.setattr(launch, "run_plan", interrupted)
    result = CliRunner().invoke(app, ["reproduce", str(path), "--json"])
    assert result.exit_code == 130, result.output
    assert trained == ["first"]  # the second cell never started
    first, second = json.loads(result.stdout)["cells"]
    assert first["kind"] == "interrupted" and "resumes it" in first["reason"]
    assert second["kind"] == "interrupted" and "not started" in second["reason"]


def test_an_interrupted_resume_starts_no_other_seed(tmp_path, monkeypatch):
    import json
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from marlctl import launch
    from marlctl.cli import app
    from marlctl.launch import RunResult
    from marlctl.reproduce import runner
    from marlctl.stored import Stopped

    (tmp_path / "tiny.yaml").write_text(TINY_SPEC)
    ref = {**REFERENCE, "value": -40.0, "interval": [-90.0, -5.0], "budget": 2_000}
    suite = {"name": "tiny", "cells": {"first": {"spec": "tiny.yaml", "seeds": 2,
                                                 "reference": ref}}}  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    stopped = {  # seeds of two parents
        0: Stopped("a" * 32, "p" * 32, 1000),
        1: Stopped("b" * 32, "q" * 32, 1000),
    }
    monkeypatch.setattr(runner, "_pending", lambda cp, rerun: ({}, dict(stopped), []))
    resumed = []

    def interrupted(run_id, uri=None, **_):  # as `resume` returns after Ctrl-C
        resumed.append(run_id)
        seed = next(s for s, run in stopped.items() if run.run_id == run_id)
        return SimpleNamespace(runs=[RunResult(seed, seed, run_id, "KILLED", error="stopped")])

    monkeypatch.setattr(launch, "resume", interrupted)
    result = CliRunner().invoke(app, ["reproduce", str(path), "--json"])
    assert result.exit_code == 130, result.output
    assert resumed == ["a" * 32]  # the other parent's stopped seed was not resumed
    (cell,) = json.loads(result.stdout)["cells"]
    assert cell["kind"] == "interrupted"


def test_a_process_is_known_ended_only_on_its_own_machine_and_boot():
    import os
    import socket
    import subprocess

    from marlctl import processes

    assert not processes.ended(processes.identity())  # this process lives
    child = subprocess.Popen(["sleep", "30"])
    recorded = processes.identity(child.pid)
    assert not processes.ended(recorded)
    child.kill()
    child.wait()
    assert processes.ended(recorded)
    host, boot, pid, start = processes.identity().split("/")
    assert processes.ended(f"{host}/{boot}/{pid}/{int(start) + 1}")  # its pid, reused
    assert processes.ended(f"{host}/{'0' * 8}/{pid}/{start}")  # the machine restarted since
    assert not processes.ended(f"elsewhere-{socket.gethostname()}/{boot}/{child.pid}/{start}")
    assert not processes.ended(None) and not processes.ended("garbled")
    assert host == socket.gethostname() and pid == str(os.getpid())


def test_a_seed_left_running_by_a_process_that_died_resumes_from_its_checkpoint(tmp_path):
    import json
    import subprocess

    from typer.testing import CliRunner

    from marlctl import processes, tracking
    from marlctl.cli import app
    from marlctl.train.runner import RESUMED_TAG

    spec = TINY_SPEC.replace("checkpoint_every: 0", "checkpoint_every: 1000")
    spec = spec.replace("batch_seeds: true", "batch_seeds: false")
    path, cell = reproduced_once(tmp_path, spec, seeds=3)
    client = tracking.client_for(None)
    for run_id in cell["run_ids"]:  # every seed run says which process trained it
        recorded = client.get_run(run_id).data.tags[processes.PROCESS_TAG]
        assert recorded.count("/") == 3, recorded
    child = subprocess.Popen(["sleep", "30"])
    killed = processes.identity(child.pid)
    child.kill()  # as SIGKILL, the out-of-memory killer or a power cut leaves a run
    child.wait()
    dead, alive = cell["run_ids"][1], cell["run_ids"][2]
    for run_id, recorded in ((dead, killed), (alive, processes.identity())):
        client.update_run(run_id, status="RUNNING")
        client.set_tag(run_id, processes.PROCESS_TAG, recorded)
    runner = CliRunner()
    dry = runner.invoke(app, ["reproduce", str(path), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    (row,) = json.loads(dry.stdout)["cells"]
    assert row["finished"] == 1 and row["resumed"] == 1  # the live one is left to its process
    assert client.get_run(dead).info.status == "RUNNING"  # a dry run writes nothing
    again = runner.invoke(app, ["reproduce", str(path), "--json"])
    assert again.exit_code == 0, again.output
    run = client.get_run(dead)
    assert run.info.status == "FINISHED" and run.data.tags[RESUMED_TAG] == "2000"
    assert client.get_run(alive).info.status == "RUNNING"


def test_a_cell_s_stopped_seeds_resume_as_one_batch_where_their_checkpoints_agree(
    tmp_path, monkeypatch
):
    import json

    from typer.testing import CliRunner

    from marlctl import launch, tracking
    from marlctl.cli import app
    from marlctl.reproduce.estimate import PROCESS_START_S
    from marlctl.stored import CHECKPOINT_STEP_TAG
    from marlctl.train.runner import RESUMED_TAG

    spec = TINY_SPEC.replace("checkpoint_every: 0", "checkpoint_every: 1000")
    path, cell = reproduced_once(tmp_path, spec, seeds=3)  # batched seeds
    runner = CliRunner()
    client = tracking.client_for(None)
    runs = cell["run_ids"]
    assert [client.get_run(r).data.tags[CHECKPOINT_STEP_TAG] for r in runs] == ["2000"] * 3
    batches = []
    execute = launch.execute_batch

    def recorded(job, progress):
        batches.append(sorted(request.run.seed for request in job))
        return execute(job, progress)

    monkeypatch.setattr(launch, "execute_batch", recorded)
    for stopped in runs:
        client.set_terminated(stopped, "KILLED")  # as Ctrl-C or SIGTERM leaves the batch
    again = runner.invoke(app, ["reproduce", str(path), "--json"])
    assert again.exit_code == 0, again.output
    (resumed,) = json.loads(again.stdout)["cells"]
    assert resumed["resumed"] == 3 and resumed["run_ids"] == runs
    assert batches == [[0, 1, 2]]  # one batch, not a process per seed
    for run_id in runs:
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.tags[RESUMED_TAG] == "2000"
    # Seeds whose checkpoints stand at other steps cannot share a batch: each step its own.
    for stopped in runs:
        client.set_terminated(stopped, "KILLED")
    client.set_tag(runs[2], CHECKPOINT_STEP_TAG, "1000")
    # A dry run prices the seeds at the steps their checkpoints leave: 0, 0 and 1,000 of 2,000.
    dry = runner.invoke(app, ["reproduce", str(path), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    (row,) = json.loads(dry.stdout)["cells"]
    cost = row["cost"]
    assert row["resumed"] == 3 and cost["processes"] == 1 and cost["waves"] == 1
    fixed = PROCESS_START_S + cost["setup_s"] + cost["evals"] * cost["eval_s"]
    training_s = cost["total_s"] - fixed
    assert training_s * cost["env_steps_per_s"] == pytest.approx(1_000)
    batches.clear()
    again = runner.invoke(app, ["reproduce", str(path), "--json"])
    assert again.exit_code == 0, again.output
    assert sorted(batches) == [[0, 1], [2]]
