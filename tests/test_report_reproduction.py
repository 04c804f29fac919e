"""A suite's runs in `marlctl report`: the verdict of each cell from the reference its seeds
carry, the performance profile across cells, reference lines in the curves, and runs of one env
made with different env package versions flagged."""

from __future__ import annotations

import numpy as np
import pytest
from test_report import add_experiment_run, report_json

from marlctl import tracking
from marlctl.report.references import CellReference
from marlctl.report.reproduction import decide

STEPS = [0, 1000, 2000]


def reference(cell: str, low: float, high: float, kind: str = "paper", budget: int = 2000):
    return CellReference("suite", cell, "eval/return_mean", low, high, budget, kind, "Someone 2021")


def add_cell(
    client,
    cell: str,
    algo: str,
    finals: list[float],
    ref: CellReference | None,
    middle=None,
    **extra,
):
    """A cell's seeds, starting from -50 at step 0 (through `middle` at step 1000, or halfway),
    each tagged with the cell's reference."""
    seeds = {
        s: (STEPS, [-50.0, (v - 50) / 2 if middle is None else middle, v], 10.0, None)
        for s, v in enumerate(finals)
    }
    _, ids = add_experiment_run(client, f"suite-{cell}", algo, "mpe/simple_spread", seeds, **extra)
    for run_id in ids.values():
        tracking.log_params(client, run_id, {"train.total_env_steps": str(STEPS[-1])})
        if ref is not None:
            client.set_tag(run_id, tracking.SUITE_TAG, ref.suite)
            client.set_tag(run_id, tracking.CELL_TAG, ref.cell)
            client.set_tag(run_id, tracking.REFERENCE_TAG, ref.to_tag())
    return ids


def test_each_cell_gets_its_verdict_and_the_methods_a_profile(tmp_path):
    client = tracking.client_for(None)
    near, far = reference("near", -21.0, -19.0), reference("far", -11.0, -9.0, kind="baseline")
    add_cell(client, "near", "mappo", [-20.5, -19.8, -20.1], near)
    add_cell(client, "far", "mappo", [-25.0, -24.5, -25.5], far)
    add_cell(client, "near", "ippo", [-30.0, -29.0, -31.0], near, lr=0.01)
    add_cell(client, "far", "ippo", [-8.0, -7.5, -8.5], far, lr=0.01)
    document = report_json("--group-by", "cell,algo.name")
    cells = {(c["cell"], c["method"]): c for c in document["reproduction"]["cells"]}
    assert {k: c["verdict"] for k, c in cells.items()} == {
        ("near", "mappo"): "reproduced",
        ("far", "mappo"): "below",
        ("near", "ippo"): "below",
        ("far", "ippo"): "above",
    }
    # Normalised scores: the share of the reference's gain over the untrained value (-50).
    assert cells[("near", "mappo")]["normalised"] == pytest.approx(
        [(v + 50) / 30 for v in (-20.5, -19.8, -20.1)]
    )
    profile = document["reproduction"]["profile"]
    taus, mappo = np.asarray(profile["taus"]), np.asarray(profile["fractions"]["mappo"])
    # mappo: near reaches 0.983, 1.007, 0.997 (one of three ≥ 1.0); far 0.6125-0.6375.
    assert mappo[np.argmin(abs(taus - 0.5))] == pytest.approx(1.0)
    assert mappo[np.argmin(abs(taus - 0.9))] == pytest.approx(0.5)
    assert mappo[np.argmin(abs(taus - 1.0))] == pytest.approx((1 / 3) / 2)


def test_a_scaled_budget_too_few_seeds_and_a_baseline(tmp_path):
    client = tracking.client_for(None)
    add_cell(
        client, "big", "mappo", [-20.5, -19.8, -20.1], reference("big", -21, -19, budget=10**6)
    )
    add_cell(client, "two", "mappo", [-20.5, -19.8], reference("two", -21, -19))
    add_cell(
        client, "base", "mappo", [-20.5, -19.8, -20.1], reference("base", -21, -19, "baseline")
    )
    document = report_json("--group-by", "cell,algo.name")
    found = {c["cell"]: c for c in document["reproduction"]["cells"]}
    assert found["big"]["verdict"] == "inconclusive" and "scaled" in found["big"]["reason"]
    assert found["two"]["verdict"] == "inconclusive" and "3 needed" in found["two"]["reason"]
    assert found["base"]["verdict"] == "matches baseline"


def test_runs_of_two_cells_pooled_get_no_verdict_and_a_note(tmp_path):
    client = tracking.client_for(None)
    add_cell(client, "a", "mappo", [-20.0, -20.5, -19.5], reference("a", -21, -19))
    # Another cell is another configuration: with the same params its seeds would be taken
    # for the first cell's, trained again, and only the newest of each seed kept.
    add_cell(client, "b", "mappo", [-20.0, -20.5, -19.5], reference("b", -11, -9), lr=0.01)
    document = report_json("--group-by", "algo.name")
    assert document["reproduction"] is None
    assert any("2 different suite references" in n for n in document["notes"])


def test_a_report_without_suite_runs_has_no_reproduction_section(tmp_path):
    client = tracking.client_for(None)
    add_cell(client, "a", "mappo", [-20.0, -20.5, -19.5], None)
    document = report_json()
    assert document["reproduction"] is None
    out = tmp_path / "r.md"
    from test_training import run_cli

    assert run_cli("report", "--out", str(out)).exit_code == 0
    assert "## Reproduction" not in out.read_text()


def test_markdown_shows_verdicts_profile_and_a_figure_per_cell(tmp_path):
    from test_training import run_cli

    client = tracking.client_for(None)
    for cell, ref in (("a", reference("a", -21, -19)), ("b", reference("b", -31, -29))):
        add_cell(client, cell, "mappo", [-20.0, -20.5, -19.5], ref)
        add_cell(client, cell, "ippo", [-25.0, -25.5, -24.5], ref, lr=0.01)
    out = tmp_path / "r.md"
    result = run_cli("report", "--group-by", "cell,algo.name", "--out", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "## Reproduction" in text and "| suite | a | a · mappo | reproduced |" in text
    assert "4 verdicts: 2 above, 1 below, 1 reproduced." in text
    assert "### Performance profile" in text and "![performance profile]" in text
    assert "### suite · a" in text and "### suite · b" in text
    names = sorted(p.name for p in (tmp_path / "r_files").iterdir())
    assert names == ["cell0.png", "cell1.png", "curves.png", "profile.png"]


def test_runs_of_one_env_with_different_package_versions_are_flagged(tmp_path):
    client = tracking.client_for(None)
    old = add_cell(client, "a", "mappo", [-20.0, -20.5, -19.5], None)
    new = add_cell(client, "a", "ippo", [-20.0, -20.5, -19.5], None, lr=0.01)
    for ids, version in ((old, "mpe2==0.0.1"), (new, "mpe2==1.1.1")):
        for run_id in ids.values():
            client.set_tag(run_id, tracking.ENV_PACKAGE_TAG, version)
    warnings = report_json()["warnings"]
    (flag,) = [w for w in warnings if "env package versions" in w]
    assert "mpe/simple_spread" in flag and "mpe2==0.0.1 (3 runs)" in flag and "1.1.1" in flag


def test_a_reference_tag_edited_by_hand_is_ignored():
    assert CellReference.from_tag("{not json") is None
    assert CellReference.from_tag('{"suite": "s"}') is None
    ref = reference("a", -21, -19)
    assert CellReference.from_tag(ref.to_tag()) == ref
    bad = ref.to_tag().replace('"low": -21', '"low": 5')
    assert CellReference.from_tag(bad) is None  # low above high


def test_minimize_swaps_above_and_below():
    assert decide([1.0, 1.1, 0.9], (2.0, 3.0), maximize=False).kind == "above"
    assert decide([4.0, 4.1, 3.9], (2.0, 3.0), maximize=False).kind == "below"


def test_a_maximum_or_average_reference_is_met_with_the_same_statistic():
    from marlctl.report.reproduction import seed_values

    steps = np.array([0, 10, 20])
    curves = [(steps, np.array([0.0, 5.0, 2.0])), (steps, np.array([0.0, 3.0, 4.0]))]
    assert seed_values(curves, "final") == [2.0, 4.0]
    # Best mean over seeds at step 10 (4.0 against 3.0): each seed's value there.
    assert seed_values(curves, "maximum") == [5.0, 3.0]
    assert seed_values(curves, "average") == pytest.approx([7 / 3, 7 / 3])
    assert seed_values(curves, "maximum", maximize=False) == [0.0, 0.0]


def test_a_report_judges_a_maximum_reference_on_each_run_s_best_point(tmp_path):
    client = tracking.client_for(None)
    best = CellReference(
        "suite", "a", "eval/return_mean", -21.0, -19.0, 2000, "paper", "x", "maximum"
    )
    # Curves peak at -20 mid-training and end at -35: the maximum reproduces, the final not.
    add_cell(client, "a", "mappo", [-35.0, -35.5, -34.5], best, middle=-20.0)
    (cell,) = report_json("--group-by", "cell,algo.name")["reproduction"]["cells"]
    assert cell["statistic"] == "maximum" and cell["verdict"] == "reproduced"
