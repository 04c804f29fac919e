"""`marlctl report` output fit for a paper: words that agree with their counts, no machine
paths or passwords, a warning where few seeds make an interval unreliable, readable figure
labels, curves from step 0, an appendix with the hyperparameters that differ and the
evaluation protocol, and figure files as SVG or PDF.

Every store here is written through MLflow's client in marlctl's layout, as in
`test_report.py`; the last test reads runs that marlctl itself trained.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_report import T0, add_experiment_run, report_json, store  # noqa: F401 (a fixture)
from test_training import run_cli, write_spec

from marlctl import tracking
from marlctl.report import labels

EVAL_STEPS = [0, 15_000, 30_000]
PROTOCOL = {"train.eval_episodes": "64", "train.eval_every": "15000"}
PROTOCOL["train.total_env_steps"] = "30000"
SHARED = {"algo.clip": "0.2", "model.hidden": "[64, 64]", **PROTOCOL}


def add_group(client, experiment, algo, finals, params, steps=EVAL_STEPS, **extra):
    """A parent and one seed run per final score, curves rising to it over `steps`, with
    `params` logged on every seed as the flattened spec would be."""
    curves = {
        s: (steps, [v - 10 + 5 * i for i in range(len(steps) - 1)] + [v], 10.0, None)
        for s, v in enumerate(finals)
    }
    parent, ids = add_experiment_run(client, experiment, algo, "mpe/simple_spread", curves, **extra)
    for seed, run_id in ids.items():
        tracking.log_params(client, run_id, {**params, "hardware.device": f"cuda:{seed}"})
    return parent, ids


MAPPO = [-14.0, -15.5, -13.2, -16.1, -14.8]  # 5 seeds: no warning
IPPO = [-16.0, -15.1]  # 2 seeds: a warning


@pytest.fixture
def compared(tmp_path):
    """Two groups on one env: MAPPO over five seeds, IPPO over two; they differ in the
    learning rate and share every other hyperparameter and the evaluation protocol."""
    client = tracking.client_for(None)
    add_group(client, "paper", "mappo", MAPPO, SHARED, lr=0.001)
    add_group(client, "paper", "ippo", IPPO, SHARED, lr=0.0003)
    return client


def outputs(*args: str) -> dict[str, str]:
    """The report in every format, as the text a reader gets: terminal, Markdown, the HTML
    page without its plotly.js, CSV, JSON from a file and from --json."""
    found = {}
    result = run_cli("report", *args)
    assert result.exit_code == 0, result.output
    found["terminal"] = result.output
    for suffix in ("md", "html", "csv", "json"):
        result = run_cli("report", *args, "--out", f"report.{suffix}")
        assert result.exit_code == 0, result.output
        found[suffix] = Path(f"report.{suffix}").read_text()
    found["html"] = re.sub(r"<script.*?</script>", "", found["html"], flags=re.S)
    result = run_cli("report", *args, "--json")
    assert result.exit_code == 0, result.output
    found["--json"] = result.stdout
    return found


# ---------------------------------------------------------------- 1. plurals


def test_labels_plural_agrees_with_the_count():
    assert labels.plural(1, "group") == "1 group"
    assert labels.plural(2, "group") == "2 groups"
    assert labels.plural(0, "seed") == "0 seeds"
    assert labels.plural(1, "policy") == "1 policy"
    assert labels.plural(3, "policy") == "3 policies"


WRONG_PLURAL = re.compile(r"\b1 (groups|seeds|runs|trials|envs|episodes)\b|\(s\)")


def test_every_format_writes_one_thing_in_the_singular(tmp_path):
    """One group, one diverged run, one seed without a step-0 evaluation, one trial."""
    client = tracking.client_for(None)
    add_experiment_run(
        client,
        "single",
        "mappo",
        "mpe/simple_spread",
        {
            0: ([0, 1000, 2000], [0.0, 1.0, 2.0], 1.0, None),
            1: ([1000, 2000], [1.0, float("nan")], 1.0, None),
            2: ([0, 1000, 2000], [0.5, 1.5, 2.5], 1.0, None),
        },
    )
    add_study(client, str(tmp_path / "gone" / "optuna.journal"), trials=1)
    # Whitespace as a reader sees it: the terminal wraps long lines.
    found = {name: " ".join(text.split()) for name, text in outputs().items()}
    for name, text in found.items():
        assert not WRONG_PLURAL.search(text), (name, WRONG_PLURAL.search(text))
    for name in ("md", "html"):
        assert "1 group by algo.name, env.id" in found[name], name
    for name in ("md", "html", "terminal", "json", "--json"):
        assert "1 run ended with a non-finite" in found[name], name
        assert "no evaluation at step 0 in 1 seed of 3" in found[name], name
        assert "1 trial (1 complete)" in found[name] or name in ("json", "--json"), name
    assert "1 trial (1 complete)" not in found["csv"]  # CSV is numbers only


def test_several_things_are_written_in_the_plural(compared):
    found = outputs()
    for name in ("md", "html"):
        assert "2 groups by algo.name, env.id" in found[name], name
        assert not WRONG_PLURAL.search(found[name])


def add_study(client, storage_url: str, trials: int) -> str:
    """A sweep's study run with `trials` complete trials, as MLflow holds it; its Optuna
    storage is at `storage_url` (which need not exist: the report falls back to MLflow)."""
    exp_id = tracking.ensure_experiment(client, "sweep", None)
    study = client.create_run(
        exp_id,
        run_name="study",
        start_time=T0,
        tags={
            "marlctl.role": "study",
            "marlctl.study": "tiny",
            "marlctl.storage_url": storage_url,
        },
    ).info.run_id
    tracking.log_params(client, study, {"sweep.metric": "eval/return_mean"})
    for number in range(trials):
        trial = client.create_run(
            exp_id,
            run_name=f"trial-{number}",
            start_time=T0,
            tags={
                tracking.PARENT_TAG: study,
                "marlctl.role": "trial",
                "marlctl.trial": str(number),
                "marlctl.trial_state": "COMPLETE",
            },
        ).info.run_id
        tracking.log_params(client, trial, {"algo.lr": str(0.001 * (number + 1))})
        client.log_metric(trial, "objective", -10.0 + number, step=2000)
        client.set_terminated(trial, "FINISHED", end_time=T0 + 1000)
    client.set_terminated(study, "FINISHED", end_time=T0 + 1000)
    return study


# ---------------------------------------------------------------- 2. no machine paths


def test_places_are_described_without_folders_hosts_or_passwords():
    assert labels.place("sqlite:////home/alice/runs/mlflow.db") == "SQLite file mlflow.db"
    assert labels.place("sqlite:///C:\\Users\\alice\\mlflow.db") == "SQLite file mlflow.db"
    assert labels.place("postgresql+psycopg2://alice:hunter2@db.lab:5432/mlflow") == (
        "PostgreSQL database"
    )
    assert labels.place("https://bob:pw@mlflow.lab.example:5000") == "HTTPS server"
    assert labels.place("/home/alice/optuna.journal") == "local file optuna.journal"
    text = (
        "no database at sqlite:////home/alice/x/optuna.db; no journal at /srv/lab/a.journal, "
        "(C:\\Users\\alice\\b.journal) or ~/runs/c.journal; "
        "could not reach postgresql://alice:hunter2@db.lab/optuna"
    )
    assert labels.public(text) == (
        "no database at SQLite file optuna.db; no journal at a.journal, (b.journal) or "
        "c.journal; could not reach PostgreSQL database"
    )
    # What is not a path stays as it is.
    for kept in (
        "mpe/simple_spread",
        "env steps/s",
        "algo.lr=0.001 · [64, 64]",
        "a / b, 1/2",
        "package.module:factory",
        "eval/return/agent",
    ):
        assert labels.public(kept) == kept


def test_no_format_shows_a_local_path(compared, tmp_path):
    """The store, a sweep's storage and a param all hold absolute paths; no output does."""
    client = compared
    add_study(client, str(tmp_path / "studies" / "optuna.journal"), trials=2)
    # A param holding a path, different per group, so that the appendix lists it.
    add_group(
        client,
        "paper",
        "qmix",
        [-20.0, -21.0],
        {**SHARED, "env.params.map": str(tmp_path / "maps" / "arena.txt")},
    )
    found = outputs()
    for name, text in found.items():
        assert str(tmp_path) not in text, name
        assert str(Path.home()) not in text, name
        assert "sqlite:" not in text and "file://" not in text, name
    for name in ("md", "html"):
        assert "MLflow store: SQLite file mlflow.db" in found[name], name
        assert "arena.txt" in found[name], name  # the appendix still names the file
    for name in ("md", "html", "terminal", "--json"):
        assert "no journal at optuna.journal" in found[name].replace("\n", " "), name
    assert json.loads(found["json"])["store"] == "SQLite file mlflow.db"
    assert "tracking_uri" not in json.loads(found["--json"])


# ---------------------------------------------------------------- 3. few seeds


FEW = (
    "ippo · mpe/simple_spread: 2 seeds; too few to compare groups on (3 at the least), and "
    "intervals from fewer than 5 seeds are unreliable"
)


def test_a_group_of_fewer_than_five_seeds_carries_a_warning(compared):
    found = outputs()
    assert f"> **Warning:** {FEW}" in found["md"]
    assert f'<p class="warning"><strong>Warning:</strong> {FEW}</p>' in found["html"]
    document = json.loads(found["json"])
    assert document["warnings"] == [FEW]
    groups = {g["label"]: g for g in document["groups"]}
    assert groups["ippo · mpe/simple_spread"]["fewest_seeds"] == 2
    assert groups["mappo · mpe/simple_spread"]["fewest_seeds"] == 5
    assert json.loads(found["--json"])["warnings"] == [FEW]
    assert f"warning: {FEW}" in " ".join(found["terminal"].split())
    # Five seeds: no warning for MAPPO anywhere.
    for text in found.values():
        assert "mappo · mpe/simple_spread: 5 seeds" not in text


@pytest.mark.usefixtures("store")
def test_a_group_over_several_envs_is_warned_by_its_thinnest_env():
    """`--group-by algo.name` pools MAPPO's 5 seeds on one env with 3 on another: the
    stratified bootstrap rests on 3 there."""
    document = report_json("--group-by", "algo.name")
    assert (
        "mappo: 3 seeds on mpe/simple_speaker_listener; intervals from fewer than 5 seeds "
        "are unreliable" in document["warnings"]
    )
    # IPPO, 4 seeds on one env, is warned too; nothing is said of a group with no interval.
    assert any(w.startswith("ippo: 4 seeds;") for w in document["warnings"])
    assert not any(w.startswith("qmix") for w in document["warnings"])


def test_groups_of_one_to_four_seeds_are_warned_by_how_thin_they_are(tmp_path):
    client = tracking.client_for(None)
    add_group(client, "thin", "mappo", [1.0], SHARED)
    add_group(client, "thin", "ippo", [1.0, 2.0, 3.0], SHARED)
    document = report_json()
    assert document["warnings"] == [
        "ippo · mpe/simple_spread: 3 seeds; intervals from fewer than 5 seeds are unreliable",
        "mappo · mpe/simple_spread: 1 seed; too few to compare groups on (3 at the least)",
    ]


def journal_study(path: Path, trials: int) -> str:
    """An Optuna journal holding study `tiny` with `trials` complete trials over two
    parameters, the second of which decides the value; returns the journal's path."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(path)))
    study = optuna.create_study(study_name="tiny", storage=storage, direction="maximize")
    space = {"algo.lr": FloatDistribution(0, 1), "algo.clip": FloatDistribution(0, 1)}
    rng = np.random.default_rng(0)
    for _ in range(trials):
        params = {name: float(rng.uniform()) for name in space}
        study.add_trial(
            optuna.trial.create_trial(
                params=params, distributions=space, value=10 * params["algo.clip"]
            )
        )
    return str(path)


@pytest.mark.parametrize(("trials", "warned"), [(6, True), (20, False)])
def test_importances_from_fewer_than_twenty_trials_carry_a_warning(tmp_path, trials, warned):
    add_study(tracking.client_for(None), journal_study(tmp_path / "j.journal", trials), 0)
    found = outputs()
    (sweep,) = json.loads(found["json"])["sweeps"]
    assert sweep["importances"] and sweep["counts"] == {"COMPLETE": trials}
    caveat = (
        "sweep tiny: parameter importances from 6 complete trials; fANOVA importances from "
        "fewer than 20 trials are unreliable"
    )
    assert (f"> **Warning:** {caveat}" in found["md"]) is warned
    assert (caveat in found["html"]) is warned
    assert (caveat in " ".join(found["terminal"].split())) is warned
    assert json.loads(found["--json"])["warnings"] == ([caveat] if warned else [])


# ---------------------------------------------------------------- 4. figure labels


def test_metric_labels_cover_the_vocabulary_and_keep_unknown_names():
    assert labels.metric("eval/return_mean") == "Evaluation return (mean per agent)"
    assert labels.metric("train/return_mean") == "Training return (mean per agent)"
    assert labels.metric("eval/return/adversary") == (
        "Evaluation return of group adversary (mean per agent)"
    )
    assert labels.metric("eval/win_rate") == "Evaluation win rate"
    assert labels.metric("loss/policy") == "Policy loss"
    assert labels.metric("perf/env_steps_per_s") == "Throughput (env steps/s)"
    assert labels.metric("custom/thing") == "custom/thing"
    assert labels.metric("loss/novel") == "loss/novel"


def test_step_counts_read_as_k_and_m():
    assert [labels.steps(v) for v in (0, 950, 2500, 30_000, 1_500_000, 2e9)] == [
        "0",
        "950",
        "2.5k",
        "30k",
        "1.5M",
        "2G",
    ]


def svg_texts(path: Path) -> list[str]:
    """The text of an SVG drawn with text kept as text (what a reader sees)."""
    return re.findall(r"<text[^>]*>([^<]*)</text>", path.read_text())


def test_curve_axes_have_readable_labels_and_ticks(compared):
    result = run_cli("report", "--out", "report.md", "--figures", "svg")
    assert result.exit_code == 0, result.output
    texts = svg_texts(Path("report_files/curves.svg"))
    assert "Evaluation return (mean per agent)" in texts
    assert "Environment steps" in texts
    assert {"0", "15k", "30k"} <= set(texts)
    assert not {"15000", "30000", "eval/return_mean", "env steps"} & set(texts)
    # The interactive plot: the same labels, and d3's SI ticks (30k, 1.5M).
    assert run_cli("report", "--out", "report.html").exit_code == 0
    page = Path("report.html").read_text()
    assert '"title":{"text":"Environment steps"}' in page
    assert '"title":{"text":"Evaluation return (mean per agent)"}' in page
    assert '"tickformat":"~s"' in page


# ---------------------------------------------------------------- 5. step 0


def test_curves_start_at_step_zero_when_the_runs_were_evaluated_there(compared):
    from marlctl import report as reporting
    from marlctl.report import figures

    document = report_json()
    for group in document["groups"]:
        assert group["curve"]["steps"] == EVAL_STEPS
    built = reporting.build(None, [], [], [])
    fig = figures.curves_figure(built)
    for line in fig.axes[0].lines:
        assert line.get_xdata()[0] == 0
    assert run_cli("report", "--out", "report.html").exit_code == 0
    page = Path("report.html").read_text()
    assert len(re.findall(r'"x":\[0\.0,15000\.0,30000\.0\]', page)) == 2  # one line per group
    assert "no evaluation at step 0" not in json.dumps(document["notes"])


def test_a_seed_without_a_step_zero_evaluation_is_named(tmp_path):
    client = tracking.client_for(None)
    add_experiment_run(
        client,
        "mixed",
        "mappo",
        "mpe/simple_spread",
        {
            0: ([0, 1000, 2000], [0.0, 1.0, 2.0], 1.0, None),
            1: ([1000, 2000], [1.0, 3.0], 1.0, None),
        },
    )
    document = report_json()
    (group,) = document["groups"]
    # A mean over seeds needs every seed: the curve starts at 1000, and a note says why.
    assert group["curve"]["steps"] == [1000, 2000]
    assert (
        "mappo · mpe/simple_spread: no evaluation at step 0 in 1 seed of 2; the curve starts "
        "where every seed has data (1k env steps)" in document["notes"]
    )


# ---------------------------------------------------------------- 6. appendix


def test_the_appendix_lists_shared_hyperparameters_once_and_the_others_side_by_side(compared):
    found = outputs()
    md = found["md"]
    appendix = md[md.index("## Appendix") :]
    shared = appendix[: appendix.index("### Hyperparameters that differ")]
    assert "### Hyperparameters shared by every group" in shared
    assert "| `algo.clip` | 0.2 |" in shared and "| `model.hidden` | [64, 64] |" in shared
    assert "| `env.id` | mpe/simple_spread |" in shared  # a group-by key all groups share
    assert "| `algo.lr`" not in shared
    assert "| parameter | ippo · mpe/simple_spread | mappo · mpe/simple_spread |" in appendix
    assert "| `algo.lr` | 0.0003 | 0.001 |" in appendix
    # Seeds, hardware (different on every seed here) and the keys naming groups: absent.
    for hidden in ("hardware.device", "`seed`", "`algo.name`"):
        assert hidden not in appendix, hidden
    assert (
        "Runs were evaluated every 15k env steps and at the end of training; each evaluation "
        "plays 64 episodes with the deterministic policy" in appendix
    )
    assert "after 30k env steps of training" in appendix
    html = found["html"]
    assert "<h2>Appendix</h2>" in html
    assert "<h3>Hyperparameters shared by every group</h3>" in html
    assert "<tr><td>algo.clip</td><td>0.2</td></tr>" in html
    assert "<tr><td>algo.lr</td><td>0.0003</td><td>0.001</td></tr>" in html
    assert "every 15k env steps" in html and "64 episodes with the deterministic" in html
    document = json.loads(found["json"])["appendix"]
    assert document["shared_hyperparameters"]["algo.clip"] == "0.2"
    assert document["hyperparameters"] == [
        {
            "name": "algo.lr",
            "values": {"ippo · mpe/simple_spread": "0.0003", "mappo · mpe/simple_spread": "0.001"},
        }
    ]
    assert document["evaluation"]["policy"] == "deterministic"
    assert {(g["episodes"], g["every"], g["budget"]) for g in document["evaluation"]["groups"]} == {
        (64, 15000, 30000)
    }


def tag_runs(client, ids: dict, tags: dict) -> None:
    for run_id in ids.values():
        for key, value in tags.items():
            client.set_tag(run_id, key, value)


def test_a_field_that_takes_no_part_in_a_group_is_left_out_or_shown_missing(tmp_path):
    """Continuous MAPPO uses `model.action_dist`, discrete MAPPO does not; neither uses
    `model.federated_every` (shared networks): the runs' `marlctl.unused` tags say so."""
    client = tracking.client_for(None)
    params = {**SHARED, "model.action_dist": "normal", "model.federated_every": "10"}
    _, continuous = add_group(client, "dist", "mappo", MAPPO, params)
    _, discrete = add_group(client, "dist", "ippo", MAPPO, params)
    tag_runs(client, continuous, {"marlctl.unused": "model.federated_every"})
    tag_runs(client, discrete, {"marlctl.unused": "model.action_dist,model.federated_every"})
    found = outputs()
    appendix = found["md"][found["md"].index("## Appendix") :]
    assert "| `model.action_dist` | — | normal |" in appendix
    assert "— : not a setting of the group's algorithm or model, or one that takes no" in appendix
    assert "model.federated_every" not in appendix
    document = json.loads(found["json"])["appendix"]
    assert "model.action_dist" not in document["shared_hyperparameters"]
    assert "model.federated_every" not in json.dumps(document)


def test_provenance_is_shared_once_and_differences_side_by_side(tmp_path):
    client = tracking.client_for(None)
    _, mappo = add_group(client, "prov", "mappo", MAPPO, SHARED)
    _, ippo = add_group(client, "prov", "ippo", MAPPO, SHARED)
    common = {
        "marlctl.versions": "marlctl==0.1.0 torch==2.5.1 mlflow==3.1.0",
        "marlctl.env_package": "mpe2==1.1.1",
        "marlctl.device": "cuda:0",
    }
    tag_runs(client, mappo, {**common, "marlctl.hardware": "NVIDIA H100 80GB HBM3"})
    tag_runs(client, mappo, {"mlflow.source.git.commit": "0123456789abcdef0123"})
    tag_runs(client, ippo, {**common, "marlctl.hardware": "NVIDIA H200"})
    tag_runs(client, ippo, {"marlctl.no_commit": "not run in a git checkout"})
    found = outputs()
    md = found["md"]
    provenance = md[md.index("### Provenance\n") : md.index("### Evaluation")]
    for row in (
        "| marlctl | 0.1.0 |",
        "| torch | 2.5.1 |",
        "| env package | mpe2==1.1.1 |",
        "| device | cuda:0 |",
        "### Provenance that differs between groups",
        "| field | ippo · mpe/simple_spread | mappo · mpe/simple_spread |",
        "| hardware | NVIDIA H200 | NVIDIA H100 80GB HBM3 |",
        "| commit | none: not run in a git checkout | 0123456789ab |",
    ):
        assert row in provenance, (row, provenance)
    assert (
        "<tr><td>hardware</td><td>NVIDIA H200</td><td>NVIDIA H100 80GB HBM3</td></tr>"
        in (found["html"])
    )
    document = json.loads(found["json"])["appendix"]["provenance"]
    assert document["shared"]["torch"] == "2.5.1"
    assert {"name": "commit", "values": {
        "ippo · mpe/simple_spread": "none: not run in a git checkout",
        "mappo · mpe/simple_spread": "0123456789ab",
    }} in document["differing"]  # fmt: skip


def test_runs_from_before_provenance_was_recorded_say_so(compared):
    md = outputs()["md"]
    provenance = md[md.index("### Provenance") : md.index("### Evaluation")]
    for field in ("marlctl", "torch", "env package", "hardware", "commit"):
        assert f"| {field} | not recorded |" in provenance, field


def test_the_fields_a_run_leaves_unused_follow_its_algorithm_env_and_model(tmp_path):
    from marlctl.plan import compile_plan, unused_fields
    from marlctl.spec import load_spec

    def unused(body: dict, *overrides: str) -> list[str]:
        loaded = load_spec(str(write_spec(tmp_path, body)), list(overrides))
        return unused_fields(loaded.spec, compile_plan(loaded).env)

    spread = {"env": {"id": "mpe/simple_spread", "params": {"N": 2}}, "algo": {"name": "mappo"}}
    assert unused(spread) == ["env.reward_weights", "model.action_dist", "model.federated_every"]
    moving = unused(spread, "+env.params.continuous_actions=true", "model.sharing=federated")
    assert moving == ["env.reward_weights", "model.agent_ids"]
    qmix = {**spread, "algo": {"name": "qmix"}}
    assert {"algo.tau", "algo.sequence_length", "algo.burn_in"} <= set(unused(qmix))
    polyak = unused(qmix, "algo.target_update_every=0", "model.recurrent=gru")
    assert not {"algo.tau", "algo.sequence_length", "algo.burn_in"} & set(polyak)


def test_the_env_package_is_the_distribution_that_holds_the_envs_code():
    from importlib import metadata

    from marlctl.envs.registry import env_package

    assert env_package("mpe/simple_spread") == f"mpe2=={metadata.version('mpe2')}"
    assert env_package("mpe/simple_spread", "native") == (f"marlctl=={metadata.version('marlctl')}")
    assert env_package("classic/tictactoe") == f"pettingzoo=={metadata.version('pettingzoo')}"
    assert env_package("pettingzoo.classic.rps_v2:parallel_env").startswith("pettingzoo==")
    assert env_package("toy_envs:meetup") == "toy_envs (not an installed distribution: no version)"
    # A module whose distribution has another name is found by the scan of every package.
    assert env_package("yaml:safe_load") == f"PyYAML=={metadata.version('PyYAML')}"


def test_the_env_package_scan_reads_only_the_folder_the_module_comes_from(tmp_path, monkeypatch):
    from importlib import metadata

    from marlctl.envs import registry

    def everything():
        raise AssertionError("scanned every installed distribution")

    monkeypatch.setattr(metadata, "packages_distributions", everything)
    registry._distributions.cache_clear()
    (tmp_path / "toy_checkout").mkdir()
    (tmp_path / "toy_checkout" / "__init__.py").write_text("def make():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # A package run from a checkout, with no distribution beside it (a module on the path).
    assert registry.env_package("toy_checkout:make") == (
        "toy_checkout (not an installed distribution: no version)"
    )
    assert registry.env_package("yaml:safe_load") == f"PyYAML=={metadata.version('PyYAML')}"
    registry._distributions.cache_clear()


def test_a_run_outside_a_git_checkout_records_why_it_has_no_commit(tmp_path):
    assert tracking.git_state() == (None, "not run in a git checkout")


def test_groups_evaluated_differently_get_a_protocol_table(tmp_path):
    client = tracking.client_for(None)
    add_group(client, "eval", "mappo", [1.0, 2.0], {**SHARED, "train.eval_episodes": "32"})
    add_group(client, "eval", "ippo", [1.0, 2.0], {**SHARED, "train.eval_every": "0"})
    result = run_cli("report", "--out", "report.md")
    assert result.exit_code == 0, result.output
    md = Path("report.md").read_text()
    assert "| ippo · mpe/simple_spread | 64 episodes | at the end of training only | 30k env " in md
    assert "| mappo · mpe/simple_spread | 32 episodes | every 15k env steps and at the end" in md
    # The differing eval settings are hyperparameters that differ, too.
    assert (
        "| `train.eval_episodes` | 64 | 32 |" in md and "| `train.eval_every` | 0 | 15000 |" in md
    )


# ---------------------------------------------------------------- 7. figure files


@pytest.mark.parametrize("kind", ["svg", "pdf"])
def test_figures_for_papers_as_svg_or_pdf(compared, kind):
    result = run_cli("report", "--out", "paper/report.md", "--figures", kind)
    assert result.exit_code == 0, result.output
    md = Path("paper/report.md").read_text()
    figure = Path(f"paper/report_files/curves.{kind}")
    if kind == "svg":
        assert "![sample efficiency](report_files/curves.svg)" in md
        assert figure.read_text().lstrip().startswith("<?xml") and "<svg" in figure.read_text()
    else:
        # Markdown cannot show a PDF inline: it links it.
        assert "[sample efficiency (PDF)](report_files/curves.pdf)" in md
        assert figure.read_bytes().startswith(b"%PDF-") and figure.stat().st_size > 5_000
    assert not list(Path("paper/report_files").glob("*.png"))
    # An HTML page keeps its interactive plots and links the files for print.
    result = run_cli("report", "--out", "paper/page.html", "--figures", kind)
    assert result.exit_code == 0, result.output
    page = Path("paper/page.html").read_text()
    assert f'<a href="page_figures/curves.{kind}">' in page and "Plotly.newPlot" in page
    assert Path(f"paper/page_figures/curves.{kind}").stat().st_size > 5_000
    assert md == Path("paper/report.md").read_text()  # the Markdown's figures are untouched
    assert figure.exists()


def test_the_same_report_draws_the_same_svg(compared):
    for out in ("a.md", "b.md"):
        assert run_cli("report", "--out", out, "--figures", "svg").exit_code == 0
    assert Path("a_files/curves.svg").read_bytes() == Path("b_files/curves.svg").read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "r.md", "--figures", "eps"], "--figures: 'eps' is not png|svg|pdf"),
        (["--out", "r.csv", "--figures", "svg"], "figure files go with an md or html report"),
        (["--figures", "pdf"], "figure files go with an md or html report"),
    ],
)
def test_bad_figure_formats_are_clean_errors(compared, args, message):
    result = run_cli("report", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not list(Path.cwd().glob("r*"))


# ---------------------------------------------------------------- real runs


def test_the_appendix_of_runs_marlctl_trained(tmp_path):
    """Params as training logs them: two learning rates, two seeds each. Only the learning
    rate differs; the protocol comes from the spec's train section."""
    spec = write_spec(
        tmp_path,
        {
            "name": "lrs",
            "seeds": [0, 1],
            "env": {"id": "mpe/simple_spread", "backend": "native", "params": {"N": 2}},
            "algo": {"name": "mappo", "epochs": 1, "minibatches": 1},
            "train": {"total_env_steps": 1000, "eval_every": 500, "eval_episodes": 4},
            "hardware": {"device": "cpu", "num_envs": 8},
        },
    )
    for lr, label in (("0.001", None), ("0.002", "'Fast MAPPO'")):
        result = run_cli("run", str(spec), f"algo.lr={lr}", *([f"label={label}"] if label else []))
        assert result.exit_code == 0, result.output
    result = run_cli("report", "--out", "report.md")
    assert result.exit_code == 0, result.output
    md = Path("report.md").read_text()
    assert "| group | algo.name | env.id | config | seeds |" in md
    assert "| Fast MAPPO | mappo | mpe/simple_spread | algo.lr=0.002 | 2 |" in md
    appendix = md[md.index("## Appendix") :]
    differing = appendix[appendix.index("### Hyperparameters that differ") :]
    differing = differing[: differing.index("### Provenance")]
    rows = [line for line in differing.splitlines() if line.startswith("| `")]
    assert rows == ["| `algo.lr` | 0.001 | 0.002 |"], appendix
    assert "| parameter | mappo · mpe/simple_spread · algo.lr=0.001 | Fast MAPPO |" in differing
    # Every other hyperparameter once, env params and the number of envs included; what
    # takes no part in a run with discrete actions and shared networks is left out.
    shared = appendix[: appendix.index("### Hyperparameters that differ")]
    for row in ("| `env.params.N` | 2 |", "| `hardware.num_envs` | 8 |", "| `algo.epochs` | 1 |"):
        assert row in shared, row
    for absent in ("model.action_dist", "model.federated_every", "env.reward_weights"):
        assert absent not in appendix, absent
    for bookkeeping in ("train.log_every", "train.checkpoint_every", "`label`"):
        assert bookkeeping not in appendix, bookkeeping
    # Where the runs came from.
    provenance = appendix[appendix.index("### Provenance") : appendix.index("### Evaluation")]
    from importlib import metadata

    for row in (
        f"| marlctl | {metadata.version('marlctl')} |",
        f"| torch | {metadata.version('torch')} |",
        f"| env package | marlctl=={metadata.version('marlctl')} |",  # the native backend
        "| device | cpu |",
        "| commit | none: not run in a git checkout |",  # a temporary folder
    ):
        assert row in provenance, (row, provenance)
    assert re.search(r"\| hardware \| .+, \d+ cores? \|", provenance), provenance
    assert "each evaluation plays 4 episodes with the deterministic policy" in appendix
    assert "every 500 env steps and at the end of training" in appendix
    assert "after 1k env steps of training" in appendix
    # Two seeds per group: both are warned about.
    assert md.count("> **Warning:**") == 2
    assert np.isfinite(report_json()["groups"][0]["mean"]["value"])


# ---------------------------------------------------------------- integer axes


def test_the_sweep_history_ticks_fall_on_whole_trials(tmp_path):
    from marlctl import report as reporting
    from marlctl.report import figures

    add_study(tracking.client_for(None), str(tmp_path / "gone.journal"), trials=4)
    (sweep,) = reporting.build(None, [], [], []).sweeps
    ax = figures.history_figure(sweep).axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks == [0, 1, 2, 3]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "3"]
    assert run_cli("report", "--out", "report.html").exit_code == 0
    assert '"tickvals":[0,1,2,3]' in Path("report.html").read_text()


def test_step_ticks_are_whole_steps_on_a_short_axis(tmp_path):
    from marlctl import report as reporting
    from marlctl.report import figures

    add_experiment_run(
        tracking.client_for(None),
        "short",
        "mappo",
        "mpe/simple_spread",
        {s: ([0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0 + s], 1.0, None) for s in range(2)},
    )
    ax = figures.curves_figure(reporting.build(None, [], [], [])).axes[0]
    assert all(float(t).is_integer() for t in ax.get_xticks())


# ---------------------------------------------------------------- per-seed values


def test_each_seeds_final_value_is_listed(tmp_path):
    client = tracking.client_for(None)
    _, ids = add_group(client, "paper", "mappo", MAPPO, SHARED)
    add_experiment_run(
        client,
        "paper",
        "ippo",
        "mpe/simple_spread",
        {0: ([0, 1000], [1.0, float("nan")], 1.0, None), 1: ([0, 1000], [1.0, 2.5], 1.0, None)},
    )
    found = outputs()
    md = found["md"]
    section = md[md.index("## Per-seed results") : md.index("## Appendix")]
    assert "| group | seed | final eval/return_mean | env steps | run |" in section
    for seed, value in enumerate(MAPPO):
        row = f"| mappo · mpe/simple_spread | {seed} | {value:.2f} | 30k | {ids[seed][:8]} |"
        assert row in section
    assert "| ippo · mpe/simple_spread | 0 | non-finite |" in section
    assert "| ippo · mpe/simple_spread | 1 | 2.50 | 1k |" in section
    html = found["html"]
    assert "<h2>Per-seed results</h2>" in html
    assert f"<td>mappo · mpe/simple_spread</td><td>2</td><td>{MAPPO[2]:.2f}</td>" in html
    groups = {g["label"]: g for g in json.loads(found["json"])["groups"]}
    per_seed = groups["mappo · mpe/simple_spread"]["per_seed"]
    assert [(p["seed"], p["value"], p["run_id"]) for p in per_seed] == [
        (str(seed), value, ids[seed]) for seed, value in enumerate(MAPPO)
    ]
    assert groups["ippo · mpe/simple_spread"]["per_seed"][0]["value"] is None


# ---------------------------------------------------------------- group labels


def test_a_label_on_the_command_line_names_the_group_everywhere(compared):
    named = "mappo,mpe/simple_spread=MAPPO (ours)"
    result = run_cli("report", "--label", named, "--out", "report.md", "--figures", "svg")
    assert result.exit_code == 0, result.output
    md = Path("report.md").read_text()
    assert "| group | algo.name | env.id | seeds |" in md
    assert "| MAPPO (ours) | mappo | mpe/simple_spread | 5 |" in md
    assert "| ippo · mpe/simple_spread | ippo | mpe/simple_spread | 2 |" in md
    assert "| parameter | ippo · mpe/simple_spread | MAPPO (ours) |" in md
    assert "MAPPO (ours)" in svg_texts(Path("report_files/curves.svg"))  # the legend
    assert "mappo · mpe/simple_spread" not in md
    document = report_json("--label", named, "--label", "ippo · mpe/simple_spread=IPPO")
    assert [g["label"] for g in document["groups"]] == ["IPPO", "MAPPO (ours)"]
    assert document["warnings"][0].startswith("IPPO: 2 seeds;")
    result = run_cli("report", "--label", named, "--out", "report.html")
    assert result.exit_code == 0, result.output
    assert '"name":"MAPPO (ours)"' in Path("report.html").read_text()


def test_a_label_given_in_the_spec_names_the_group(tmp_path):
    client = tracking.client_for(None)
    add_group(client, "paper", "mappo", MAPPO, {**SHARED, "label": "MAPPO (ours)"})
    add_group(client, "paper", "ippo", IPPO, {**SHARED, "label": "null"})  # no label
    document = report_json()
    assert [g["label"] for g in document["groups"]] == [
        "ippo · mpe/simple_spread",
        "MAPPO (ours)",
    ]
    # The label is a name: it neither splits a group nor is a hyperparameter.
    assert "label" not in json.dumps(document["appendix"]["hyperparameters"])
    # The command line wins over the spec.
    overridden = report_json("--label", "mappo,mpe/simple_spread=MAPPO")
    assert [g["label"] for g in overridden["groups"]][1] == "MAPPO"


def test_a_label_names_a_split_group_by_its_params(tmp_path):
    client = tracking.client_for(None)
    for lr in (0.001, 0.01):
        add_experiment_run(
            client, "lrs", "mappo", "mpe/simple_spread", {0: ([1000], [1.0], 1.0, None)}, lr=lr
        )
    document = report_json("--label", "mappo,mpe/simple_spread,algo.lr=0.01=lr=1e-2")
    assert [g["label"] for g in document["groups"]] == [
        "mappo · mpe/simple_spread · algo.lr=0.001",
        "lr=1e-2",
    ]


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("qmix=QMIX", "--label #1: 'qmix=QMIX' names no group (GROUP=TEXT); the groups: "
         "ippo,mpe/simple_spread; mappo,mpe/simple_spread"),
        ("MAPPO", "'MAPPO' names no group"),
        ("mappo,mpe/simple_spread=", "'mappo,mpe/simple_spread=' gives the group no text"),
    ],
)  # fmt: skip
def test_a_label_for_no_group_is_a_clean_error(compared, label, message):
    result = run_cli("report", "--label", label, "--out", "report.md")
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not Path("report.md").exists()
