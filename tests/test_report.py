"""`marlctl report` against a real MLflow store.

The store is written through MLflow's client in the layout marlctl uses (experiment → seed
runs, study → trial → seed), with scores the tests choose, so every value in the report can
be recomputed here independently: numpy and scipy for the statistics, the test's own
bootstrap for the stratified intervals. Real training and a real sweep feed the file and
browser tests.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import stats as scipy_stats
from test_training import run_cli, write_spec

from marlctl import tracking

T0 = 1_700_000_000_000  # ms


def _metrics(steps: list[int], values: list[float], key: str = "eval/return_mean"):
    from mlflow.entities import Metric

    return [Metric(key, v, T0 + i, s) for i, (s, v) in enumerate(zip(steps, values, strict=True))]


def add_experiment_run(client, experiment: str, algo: str, env: str, seeds: dict, **extra):
    """A parent run and one FINISHED seed run per entry of `seeds`:
    seed → (eval steps, eval values, wall seconds, steps/s or None); all start at `start`."""
    exp_id = tracking.ensure_experiment(client, experiment, None)
    common = {"marlctl.algo": algo, "marlctl.env": env, "marlctl.spec_hash": extra.get("hash", "h")}
    start = extra.get("start", T0)
    parent = client.create_run(
        exp_id, run_name=experiment, tags={**common, "marlctl.role": "experiment"}, start_time=start
    ).info.run_id
    params = {"algo.name": algo, "env.id": env, "algo.lr": str(extra.get("lr", 0.001))}
    ids = {}
    for seed, (steps, values, wall, speed) in seeds.items():
        run = client.create_run(
            exp_id,
            run_name=f"seed-{seed}",
            start_time=start,
            tags={
                **common,
                tracking.PARENT_TAG: parent,
                "marlctl.role": "seed",
                "marlctl.seed": str(seed),
            },
        ).info.run_id
        tracking.log_params(client, run, {**params, "seed": str(seed)})
        metrics = _metrics(steps, values)
        if speed is not None:
            metrics += _metrics([steps[-1]], [speed], "perf/env_steps_per_s_mean")
        client.log_batch(run, metrics=metrics, synchronous=True)
        status = extra.get("status", "FINISHED")
        client.set_terminated(run, status, end_time=start + int(wall * 1000))
        ids[seed] = run
    client.set_terminated(parent, "FINISHED", end_time=start + 1000)
    return parent, ids


STEPS = [1000, 2000, 3000]
SPREAD_MAPPO = [-14.0, -15.5, -13.2, -16.1, -14.8]
SPREAD_IPPO = [-16.0, -15.1, -17.3, -15.9]
SPEAKER_MAPPO = [-11.0, -12.5, -10.2]


def curve_for(final: float, seed: int) -> list[float]:
    return [final - 6 + seed * 0.1, final - 2 - seed * 0.05, final]


@pytest.fixture
def store(tmp_path):
    """Two experiments, three (algo, env) groups, plus a failed run and an old-style run."""
    client = tracking.client_for(None)
    add_experiment_run(
        client,
        "spread",
        "mappo",
        "mpe/simple_spread",
        {s: (STEPS, curve_for(v, s), 10.0 + s, 300.0 + s) for s, v in enumerate(SPREAD_MAPPO)},
    )
    add_experiment_run(
        client,
        "spread",
        "ippo",
        "mpe/simple_spread",
        {s: (STEPS, curve_for(v, s), 20.0 + s, 100.0) for s, v in enumerate(SPREAD_IPPO)},
        lr=0.0003,
    )
    add_experiment_run(
        client,
        "speaker",
        "mappo",
        "mpe/simple_speaker_listener",
        {s: (STEPS, curve_for(v, s), 5.0, None) for s, v in enumerate(SPEAKER_MAPPO)},
    )
    # A crashed run: left out of the statistics, counted in the notes.
    add_experiment_run(
        client,
        "spread",
        "ippo",
        "mpe/simple_spread",
        {9: ([1000], [-99.0], 1.0, None)},
        status="FAILED",
        lr=0.0003,
    )
    # A run from before marlctl's tags and its final eval: only params, no metrics.
    exp_id = tracking.ensure_experiment(client, "spread", None)
    old = client.create_run(exp_id, run_name="old", start_time=T0).info.run_id
    tracking.log_params(client, old, {"algo.name": "qmix", "env.id": "mpe/simple_spread"})
    client.set_terminated(old, "FINISHED", end_time=T0 + 4000)
    return client


def report_json(*args: str) -> dict:
    result = run_cli("report", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def by_label(document: dict) -> dict[str, dict]:
    return {g["label"]: g for g in document["groups"]}


def bootstrap_distribution(scores, statistic, reps=20000, seed=123) -> np.ndarray:
    """scipy's bootstrap replicates of `statistic`: an implementation independent of ours."""
    found = scipy_stats.bootstrap(
        (np.asarray(scores),),
        statistic,
        n_resamples=reps,
        method="percentile",
        random_state=np.random.default_rng(seed),
        vectorized=True,
    )
    return found.bootstrap_distribution


def assert_quantile(samples: np.ndarray, value: float, q: float, tol: float = 0.012) -> None:
    """`value` is a `q`-quantile of `samples`, to Monte Carlo error. Stated through the
    distribution function, as bootstrap distributions of an IQM over a few seeds are discrete."""
    below = np.mean(samples < value - 1e-9)
    at_most = np.mean(samples <= value + 1e-9)
    assert below - tol <= q <= at_most + tol, (value, q, below, at_most)


def scipy_iqm(x, axis=-1):
    return scipy_stats.trim_mean(x, 0.25, axis=axis)


def test_table_matches_independently_computed_statistics(store):
    document = report_json()
    groups = by_label(document)
    assert set(groups) == {
        "mappo · mpe/simple_spread",
        "ippo · mpe/simple_spread",
        "mappo · mpe/simple_speaker_listener",
        "qmix · mpe/simple_spread",
    }
    for label, scores, walls, speed in [
        ("mappo · mpe/simple_spread", SPREAD_MAPPO, [10, 11, 12, 13, 14], 302.0),
        ("ippo · mpe/simple_spread", SPREAD_IPPO, [20, 21, 22, 23], 100.0),
        ("mappo · mpe/simple_speaker_listener", SPEAKER_MAPPO, [5, 5, 5], 3000 / 5),
    ]:
        g = groups[label]
        assert g["seeds"] == len(scores) and g["runs"] == len(scores)
        assert sorted(g["scores"]) == pytest.approx(sorted(scores))
        assert g["mean"]["value"] == pytest.approx(np.mean(scores))
        assert g["iqm"]["value"] == pytest.approx(scipy_stats.trim_mean(scores, 0.25))
        # Two bootstraps with different generators agree to Monte Carlo error.
        for name, func in (("mean", np.mean), ("iqm", scipy_iqm)):
            samples = bootstrap_distribution(scores, func)
            assert_quantile(samples, g[name]["low"], 0.025)
            assert_quantile(samples, g[name]["high"], 0.975)
            assert g[name]["low"] <= g[name]["value"] <= g[name]["high"]
        assert g["env_steps"] == STEPS[-1]
        assert g["wall_s"] == pytest.approx(np.mean(walls))
        # perf/env_steps_per_s_mean when logged, otherwise env steps over wall-clock.
        assert g["steps_per_s"] == pytest.approx(speed)
        # The curve is the mean over seeds at each eval step.
        curves = np.array([curve_for(v, s) for s, v in enumerate(scores)])
        assert g["curve"]["steps"] == STEPS
        assert g["curve"]["value"] == pytest.approx(curves.mean(axis=0).tolist())
        assert all(
            lo <= v <= hi
            for lo, v, hi in zip(*(g["curve"][k] for k in ("low", "value", "high")), strict=True)
        )
    # The old run has no metrics: shown as missing, not dropped, not a crash.
    old = groups["qmix · mpe/simple_spread"]
    assert old["runs"] == 1 and old["seeds"] == 0 and old["mean"] is None
    assert old["env_steps"] is None and old["curve"] is None
    assert document["left_out"] == {"FAILED": 1}


def test_grouping_across_envs_stratifies_the_bootstrap(store):
    groups = by_label(report_json("--group-by", "algo.name"))
    g = groups["mappo"]
    scores = {"spread": SPREAD_MAPPO, "speaker": SPEAKER_MAPPO}
    everything = np.array(SPREAD_MAPPO + SPEAKER_MAPPO)
    assert g["mean"]["value"] == pytest.approx(everything.mean())
    assert g["iqm"]["value"] == pytest.approx(scipy_stats.trim_mean(everything, 0.25))
    # The test's own stratified bootstrap: resample seeds within each env, never across.
    rng = np.random.default_rng(7)
    reps = 20000
    samples = np.concatenate(
        [rng.choice(np.array(s), size=(reps, len(s))) for s in scores.values()], axis=1
    )
    for name, func in (("mean", np.mean), ("iqm", scipy_iqm)):
        values = func(samples, axis=1)
        assert_quantile(values, g[name]["low"], 0.025)
        assert_quantile(values, g[name]["high"], 0.975)
    # An unstratified bootstrap would mix the envs' very different scores: a wider interval.
    pooled = rng.choice(everything, size=(reps, len(everything))).mean(axis=1)
    assert np.percentile(pooled, 97.5) - np.percentile(pooled, 2.5) > 1.2 * (
        g["mean"]["high"] - g["mean"]["low"]
    )


def test_filters_and_experiments_select_runs(store):
    only_ippo = report_json("--filter", "algo.name=ippo")
    assert [g["label"] for g in only_ippo["groups"]] == ["ippo · mpe/simple_spread"]
    small_lr = report_json("--filter", "algo.lr<0.0005")
    assert [g["label"] for g in small_lr["groups"]] == ["ippo · mpe/simple_spread"]
    speaker = report_json("speaker")
    assert [g["label"] for g in speaker["groups"]] == ["mappo · mpe/simple_speaker_listener"]
    not_mappo = report_json("spread", "--filter", "algo.name!=mappo,qmix")
    assert [g["label"] for g in not_mappo["groups"]] == ["ippo · mpe/simple_spread"]
    tagged = report_json("--filter", "tags.marlctl.env=mpe/simple_speaker_listener")
    assert len(tagged["groups"]) == 1
    one_run = by_label(report_json("--runs", tagged["groups"][0]["run_ids"][0]))
    assert [g["seeds"] for g in one_run.values()] == [1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "no experiment 'nope'"),
        (["--filter", "algo.lr~3"], "is not KEY=VALUE"),
        (["--filter", "algo.lr<abc"], "'abc' in 'algo.lr<abc' is not a number"),
        (["--filter", "algo.name=sac"], "no finished runs match"),
        (["--runs", "0123456789abcdef"], "no run id starts with '0123456789abcdef'"),
        (["--out", "report.pdf"], "cannot tell the format"),
        (["--direction", "up"], "is not maximize|minimize"),
    ],
)
def test_bad_report_arguments_are_clean_errors(store, args, message):
    result = run_cli("report", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert not list(Path.cwd().glob("report*")), "nothing is written"


def test_markdown_html_csv_json_files(store):
    result = run_cli("report", "--out", "out/report.md")
    assert result.exit_code == 0, result.output
    md = Path("out/report.md").read_text()
    # Best per column in bold, among the groups on the same env: MAPPO on simple_spread.
    row = next(line for line in md.splitlines() if line.startswith("| mappo | mpe/simple_spread"))
    assert f"**{np.mean(SPREAD_MAPPO):.2f}**" in row
    # Alone on its env, the speaker listener group has nothing to beat.
    row = next(line for line in md.splitlines() if "simple_speaker_listener" in line)
    assert "**" not in row
    assert "| qmix | mpe/simple_spread | 0/1 | — |" in md
    assert "![sample efficiency](report_files/curves.png)" in md
    png = Image.open("out/report_files/curves.png")
    assert png.size[0] >= 800 and png.size[1] >= 500
    # A real plot: many distinct colours, not a blank canvas.
    assert len(png.convert("RGB").getcolors(maxcolors=1 << 20)) > 200

    assert run_cli("report", "--out", "report.html").exit_code == 0
    page = Path("report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "Plotly.newPlot" in page
    assert "<script src=" not in page, "self-contained: no external scripts"
    assert page.count("simple_speaker_listener") >= 2  # table and curve legend
    assert len(page) > 1_000_000  # plotly.js is inline

    assert run_cli("report", "--out", "report.csv").exit_code == 0
    rows = list(csv.DictReader(io.StringIO(Path("report.csv").read_text())))
    document = report_json()
    for row in rows:
        group = next(
            g
            for g in document["groups"]
            if g["key"]["algo.name"] == row["algo.name"] and g["key"]["env.id"] == row["env.id"]
        )
        if group["mean"]:
            assert float(row["mean"]) == pytest.approx(group["mean"]["value"])
            assert float(row["iqm_low"]) == pytest.approx(group["iqm"]["low"])
        else:
            assert row["mean"] == ""

    assert run_cli("report", "--out", "report.json").exit_code == 0
    saved = json.loads(Path("report.json").read_text())
    assert [g["mean"] for g in saved["groups"]] == [g["mean"] for g in document["groups"]]


def test_curves_with_different_eval_steps_are_interpolated(tmp_path):
    client = tracking.client_for(None)
    add_experiment_run(
        client,
        "steps",
        "mappo",
        "mpe/simple_spread",
        {
            0: ([1000, 2000, 3000], [0.0, 2.0, 4.0], 1.0, None),
            1: ([1500, 3000, 3500], [1.0, 4.0, 6.0], 1.0, None),
        },
    )
    (g,) = report_json()["groups"]
    # Shared range 1500..3000; seed 0 interpolated at 1500, seed 1 at 2000.
    assert g["curve"]["steps"] == [1500, 2000, 3000]
    assert g["curve"]["value"] == pytest.approx([(1.0 + 1.0) / 2, (2.0 + 2.0) / 2, 4.0])
    assert g["scores"] == [4.0, 6.0]  # finals are each run's last value


def test_configurations_are_never_pooled_as_seeds_by_default(tmp_path):
    client = tracking.client_for(None)
    for lr, finals in ((0.001, [1.0, 2.0]), (0.01, [5.0, 6.0])):
        add_experiment_run(
            client,
            "lrs",
            "mappo",
            "mpe/simple_spread",
            {s: ([1000], [v], 1.0, None) for s, v in enumerate(finals)},
            lr=lr,
        )
    split = report_json()["groups"]
    assert [(g["config"], g["scores"]) for g in split] == [
        ({"algo.lr": "0.001"}, [1.0, 2.0]),
        ({"algo.lr": "0.01"}, [5.0, 6.0]),
    ]
    # Asked to group by algo and env only, the user gets that, and a note.
    result = run_cli("report", "--group-by", "algo.name,env.id", "--json")
    (pooled,) = json.loads(result.stdout)["groups"]
    assert sorted(pooled["scores"]) == [1.0, 2.0, 5.0, 6.0]
    assert pooled["differs"] == ["algo.lr"]
    assert any("runs differ in algo.lr" in n for n in json.loads(result.stdout)["notes"])


def test_a_seed_finished_twice_with_the_same_params_counts_once(tmp_path):
    """A command interrupted after seed 0 finished (seeds 1 and 2 killed), then run again:
    seed 0 has two finished runs. The newest is kept, and the report says which it left out."""
    client = tracking.client_for(None)
    _, first = add_experiment_run(
        client, "meetup", "mappo", "mpe/simple_spread", {0: ([1000], [9.0], 10.0, None)}
    )
    add_experiment_run(
        client,
        "meetup",
        "mappo",
        "mpe/simple_spread",
        {s: ([1000], [0.0], 10.0, None) for s in (1, 2)},
        status="KILLED",
    )
    rerun_start = T0 + 3_600_000  # an hour later
    _, rerun = add_experiment_run(
        client,
        "meetup",
        "mappo",
        "mpe/simple_spread",
        {s: ([1000], [float(s)], 10.0, None) for s in (0, 1, 2)},
        start=rerun_start,
    )
    document = report_json()
    (group,) = document["groups"]
    assert group["seeds"] == 3 and group["runs"] == 3
    assert sorted(group["scores"]) == [0.0, 1.0, 2.0]  # the first seed 0's 9.0 is out
    assert sorted(group["run_ids"]) == sorted(rerun.values())
    assert group["duplicates"] == [{"seed": "0", "kept": rerun[0], "left_out": [first[0]]}]
    note = (
        f"mappo · mpe/simple_spread: seed 0 finished 2 times with the same params; counted "
        f"once: kept run {rerun[0][:8]} (the newest, finished 2023-11-14 23:13 UTC), left "
        f"out run {first[0][:8]} (finished 2023-11-14 22:13 UTC)"
    )
    assert note in document["notes"]
    result = run_cli("report")
    assert result.exit_code == 0, result.output
    assert note in " ".join(result.output.split())
    assert run_cli("report", "--out", "report.md").exit_code == 0
    assert f"- {note}" in Path("report.md").read_text()


def test_the_same_seed_with_other_params_is_not_a_duplicate(tmp_path):
    client = tracking.client_for(None)
    for lr in (0.001, 0.01):
        add_experiment_run(
            client, "lrs", "mappo", "mpe/simple_spread", {0: ([1000], [1.0], 1.0, None)}, lr=lr
        )
    result = run_cli("report", "--group-by", "algo.name", "--json")
    (pooled,) = json.loads(result.stdout)["groups"]
    assert pooled["seeds"] == 2 and pooled["duplicates"] == []


def test_a_diverged_final_value_is_missing_not_an_earlier_score(tmp_path):
    client = tracking.client_for(None)
    add_experiment_run(
        client,
        "nan",
        "mappo",
        "mpe/simple_spread",
        {
            0: ([1000, 2000], [1.0, 2.0], 1.0, None),
            1: ([1000, 2000], [3.0, float("nan")], 1.0, None),
            2: ([1000, 2000], [2.0, 4.0], 1.0, None),
        },
    )
    document = report_json()
    (g,) = document["groups"]
    assert g["scores"] == [2.0, 4.0] and g["diverged"] == 1 and g["runs"] == 3
    assert any("1 run ended with a non-finite" in n for n in document["notes"])


def test_one_seed_per_env_gives_no_interval():
    from marlctl.report import stats

    single = stats.estimate(np.array([1.0, 5.0]), [0, 1], "mean")
    assert single.value == 3.0 and np.isnan(single.low) and np.isnan(single.high)
    pair = stats.estimate(np.array([1.0, 5.0]), [0, 0], "mean")
    assert pair.low < pair.high


def test_a_missing_store_is_an_error_and_is_not_created(tmp_path):
    result = run_cli("report")
    assert result.exit_code == 2, result.output
    assert "no MLflow store at" in result.output
    assert not (tmp_path / "mlflow.db").exists()


def test_terminal_table_shows_missing_values(store):
    result = run_cli("report", "spread")
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if "qmix" in x)
    assert "0/1" in line and "—" in line
    assert "left out, not finished: 1 failed" in result.output


# ---------------------------------------------------------------- real runs


SWEEP = {
    "name": "tiny",
    "seeds": [0, 1],
    "env": {"id": "mpe/simple_spread", "backend": "native", "params": {"N": 2}},
    "algo": {"name": "mappo", "epochs": 2, "minibatches": 2},
    "train": {"total_env_steps": 2000, "eval_every": 1000, "eval_episodes": 4},
    "hardware": {"device": "cpu", "num_envs": 16},
    "sweep": {
        "trials": 5,
        "startup_trials": 2,
        "pruner": "none",
        "space": {
            "algo.lr": {"low": 1.0e-4, "high": 3.0e-3, "log": True},
            "model.hidden": {"choices": [[16], [32, 32]]},
        },
    },
}


@pytest.fixture
def swept(tmp_path):
    spec = write_spec(tmp_path, SWEEP)
    result = run_cli("sweep", str(spec))
    assert result.exit_code == 0, result.output
    return tmp_path


def test_sweep_report_best_trials_history_and_importances(swept):
    import optuna

    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(swept / "optuna.journal"))
    )
    study = optuna.load_study(study_name="tiny", storage=storage)
    document = report_json()
    assert document["groups"] == []  # trial seeds belong to the sweep
    (sweep,) = document["sweeps"]
    assert sweep["counts"] == {"COMPLETE": 5}
    complete = sorted(
        (t for t in study.trials if t.value is not None), key=lambda t: t.value, reverse=True
    )
    assert sweep["best"] == [t.number for t in complete]
    assert sweep["best"][0] == study.best_trial.number
    by_number = {t["number"]: t for t in sweep["trials"]}
    assert by_number[study.best_trial.number]["value"] == pytest.approx(study.best_value)
    assert set(sweep["importances"]) == {"algo.lr", "model.hidden"}
    assert sum(sweep["importances"].values()) == pytest.approx(1.0)

    result = run_cli("report", "--out", "sweep.md")
    assert result.exit_code == 0, result.output
    text = Path("sweep.md").read_text()
    assert "## Sweep `tiny`" in text and "5 trials (5 complete)" in text
    for name in ("sweep0_history.png", "sweep0_importances.png"):
        assert Image.open(f"sweep_files/{name}").size[0] >= 800

    # The seeds of one trial, asked for by run, form a group of their own.
    trial_run = by_number[study.best_trial.number]["run_id"]
    (group,) = report_json("--runs", trial_run)["groups"]
    assert group["seeds"] == 2
    assert np.mean(group["scores"]) == pytest.approx(study.best_value)
    # eval walks down from a trial (or a study) to its seeds.
    evaluated = run_cli("eval", trial_run, "--json")
    assert evaluated.exit_code == 0, evaluated.output
    rows = json.loads(evaluated.stdout)["runs"]
    assert sorted(r["seed"] for r in rows) == [0, 1]
    assert [r["return_mean"] for r in rows] == pytest.approx([r["logged_return"] for r in rows])

    # Without the Optuna storage, the trials still come from MLflow; importances do not.
    shutil.move(swept / "optuna.journal", swept / "elsewhere.journal")
    (fallback,) = report_json()["sweeps"]
    assert fallback["importances"] is None and "no journal" in fallback["note"]
    assert fallback["best"] == sweep["best"]
    moved = report_json("--storage", str(swept / "elsewhere.journal"))["sweeps"][0]
    assert moved["importances"] == pytest.approx(sweep["importances"])


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_html_report_renders_in_a_headless_browser(store, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium)")
    assert run_cli("report", "--out", "report.html").exit_code == 0
    url = (tmp_path / "report.html").as_uri()
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
    ]
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [
            *flags,
            "--window-size=1280,1400",
            f"--screenshot={shot}",
            "--enable-logging=stderr",
            "--v=0",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert not [line for line in console if "Error" in line or "Uncaught" in line], console
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 1400)
    # The page drew something: many colours (plot, table), not a blank page.
    assert len(image.getcolors(maxcolors=1 << 20)) > 100
    dom = subprocess.run(
        [*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120
    ).stdout
    # plotly.js ran and drew the curves into the page.
    assert 'class="main-svg"' in dom and "mpe/simple_speaker_listener" in dom
    # With readable axes: the metric's label, and steps ticked as 1.5k, not 1500.
    assert "Evaluation return (mean per agent)" in dom and "Environment steps" in dom
    ticks = re.findall(r'class="xtick"[^>]*>.*?<text[^>]*>([^<]*)</text>', dom)
    assert "1.5k" in ticks and "1500" not in ticks, ticks
