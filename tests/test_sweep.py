"""`marlctl sweep`: Optuna studies shared by worker processes, machines and SLURM jobs.

Every study here is real (a journal file or a PostgreSQL server the test starts), every
trial trains through `run_plan` into a real MLflow store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import foreground_job
from typer.testing import CliRunner

from marlctl.cli import app
from marlctl.sweep.space import Param, overrides_for, split_overrides

runner = CliRunner()
TESTS = Path(__file__).resolve().parent

TINY = {
    "name": "tiny",
    "seeds": [0, 1],
    "env": {"id": "mpe/simple_spread", "backend": "native", "params": {"N": 2}},
    "algo": {"name": "mappo", "epochs": 2, "minibatches": 2},
    "train": {
        "total_env_steps": 2000,
        "eval_every": 1000,
        "eval_episodes": 4,
        "checkpoint_every": 0,
    },
    "hardware": {"device": "cpu", "num_envs": 16, "batch_seeds": True},
    "sweep": {
        "trials": 4,
        "startup_trials": 1,
        "space": {
            "algo.lr": {"low": 1.0e-4, "high": 3.0e-3, "log": True},
            "model.hidden": {"choices": [[16], [32, 32]]},
        },
    },
}


def write_spec(folder: Path, body: dict, name: str = "spec.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def sweep_json(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["sweep", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def journal_study(folder: Path, name: str):
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(folder / "optuna.journal"))
    )
    return optuna.load_study(study_name=name, storage=storage)


def mlflow_client(folder: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")


def runs_by_role(client, experiment: str) -> dict[str, list]:
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    out: dict[str, list] = {}
    for run in runs:
        out.setdefault(run.data.tags.get("marlctl.role", "?"), []).append(run)
    return out


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TESTS)}


# ---------------------------------------------------------------- the space


def test_hydra_sweep_overrides_become_search_parameters() -> None:
    plain, params = split_overrides(
        [
            "algo.lr=tag(log,interval(1e-5,1e-3))",
            "algo.clip=0.1,0.2,0.3",
            "algo.epochs=range(2,5)",
            "model.hidden=[64,64]",
            "train.eval_episodes=choice(4,8)",
            "algo.minibatches=interval(1,4)",
        ]
    )
    assert plain == ["model.hidden=[64,64]"]
    by_key = {p.key: p for p in params}
    lr = by_key["algo.lr"]
    assert (lr.low, lr.high, lr.log, lr.is_int) == (1e-5, 1e-3, True, False)
    assert by_key["algo.clip"].choices == (0.1, 0.2, 0.3)
    assert by_key["algo.epochs"].choices == (2, 3, 4)
    assert by_key["train.eval_episodes"].choices == (4, 8)
    assert not by_key["algo.minibatches"].is_int  # Hydra's interval() is a float range...
    assert overrides_for({"model.hidden": [32, 32], "algos": "ippo", "x.s": "it's"}) == [
        "++model.hidden=[32,32]",
        "+algos=ippo",
        "++x.s='it\\'s'",
    ]
    assert overrides_for({"algos": "ippo"}, {"algos"}) == ["algos=ippo"]


def test_a_range_takes_the_type_of_the_field_it_sets(tmp_path: Path) -> None:
    from marlctl.spec import load_spec
    from marlctl.sweep.space import space_of

    body = {
        **TINY,
        "sweep": {
            "space": {
                "algo.value_coef": {"low": 1, "high": 4},  # a float field
                "algo.epochs": {"low": 1, "high": 4},  # an int field
                "algo.clip": {"low": 0.1, "high": 0.3},
            }
        },
    }
    loaded = load_spec(write_spec(tmp_path, body))
    _, cli = split_overrides(["algo.minibatches=interval(1,4)"])
    kinds = {p.key: p.is_int for p in space_of(loaded, cli)}
    # ...which on an int field samples ints.
    assert kinds == {
        "algo.value_coef": False,
        "algo.epochs": True,
        "algo.clip": False,
        "algo.minibatches": True,
    }


def test_sampled_values_compose_into_a_valid_spec(tmp_path: Path) -> None:
    from marlctl.spec import load_spec

    spec = write_spec(tmp_path, TINY)
    values = {"model.hidden": [8, 8], "algo.lr": 0.002, "algos": "ippo", "algo.clip": 0.3}
    loaded = load_spec(spec, overrides_for(values))
    assert loaded.spec.algo.name == "ippo"
    assert list(loaded.spec.model.hidden) == [8, 8]
    assert loaded.spec.algo.lr == 0.002 and loaded.spec.algo.clip == 0.3


def test_conditional_parameters_are_sampled_only_when_their_condition_holds(
    tmp_path: Path,
) -> None:
    from marlctl.spec import load_spec
    from marlctl.sweep.search import sample
    from marlctl.sweep.space import check_space, space_of

    body = {
        **TINY,
        "sweep": {
            "space": {
                "algo.clip": {"choices": [0.1, 0.3], "when": {"algos": "mappo"}},
                "algos": {"choices": ["mappo", "qmix"]},
                "algo.double_q": {"choices": [True, False], "when": {"algos": ["qmix"]}},
            }
        },
    }
    body["algo"] = {"name": "mappo"}
    spec = write_spec(tmp_path, body)
    loaded = load_spec(spec)
    params = space_of(loaded, [])
    assert [p.key for p in params][0] == "algos"  # conditions are sampled first
    check_space(spec, [], params, "tpe")  # qmix with double_q, mappo with clip: both valid
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(20):
        trial = study.ask()
        values = sample(trial, params)
        seen.add(values["algos"])
        assert ("algo.clip" in values) == (values["algos"] == "mappo")
        assert ("algo.double_q" in values) == (values["algos"] == "qmix")
        load_spec(spec, overrides_for(values))  # every sampled point is a valid spec
        study.tell(trial, 0.0)
    assert seen == {"mappo", "qmix"}


@pytest.mark.parametrize(
    "space, where, message",
    [
        ({"algo.clip": {"choices": [0.2, 7.0]}}, "sweep.space.algo.clip", "7.0 gives an invalid"),
        ({"algo.lrr": {"low": 0.001, "high": 0.01}}, "sweep.space.algo.lrr", "did you mean 'lr'"),
        (
            {"algo.clip": {"choices": [0.2], "when": {"algos": "mappo"}}},
            "sweep.space.algo.clip",
            "'algos' is not a parameter",
        ),
        ({"algo.lr": {"low": 0.01, "high": 0.001}}, "sweep.space.algo.lr", "low must be below"),
        ({"env.params.N": {"choices": [2, 0]}}, "sweep.space.env.params.N", "0 gives an invalid"),
    ],
)
def test_an_invalid_space_is_exit_2_at_its_line_before_anything_runs(
    tmp_path: Path, space: dict, where: str, message: str
) -> None:
    spec = write_spec(tmp_path, {**TINY, "sweep": {"space": space}})
    result = runner.invoke(app, ["sweep", str(spec)])
    assert result.exit_code == 2, result.output
    lines = spec.read_text().splitlines()
    key = where.rsplit(".", 1)[-1] if where.count(".") == 2 else where.split(".", 2)[2]
    line = next(i for i, text in enumerate(lines, start=1) if text.strip().startswith(key + ":"))
    assert f"spec.yaml:{line}: {where}:" in result.output, result.output
    assert message in result.output, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "optuna.journal").exists() and not (tmp_path / "mlflow.db").exists()


def test_an_invalid_sweep_override_is_reported_at_its_position(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, TINY)
    result = runner.invoke(app, ["sweep", str(spec), "seeds=[0]", "algo.clip=0.2,9.0"])
    assert result.exit_code == 2
    assert "<overrides>:2: algo.clip: 9.0 gives an invalid spec" in result.output, result.output


def test_the_grid_sampler_needs_discrete_dimensions(tmp_path: Path) -> None:
    body = {**TINY, "sweep": {**TINY["sweep"], "sampler": "grid"}}
    spec = write_spec(tmp_path, body)
    result = runner.invoke(app, ["sweep", str(spec)])
    assert result.exit_code == 2
    assert "sweep.space.algo.lr: the grid sampler needs choices or a range with a step" in (
        result.output
    )


@pytest.mark.parametrize(
    "preset, algo", [("mappo_core", "mappo"), ("qmix_core", "qmix"), ("maddpg_core", "matd3")]
)
def test_every_preset_space_is_valid_for_its_algorithm(
    tmp_path: Path, repo_root: Path, preset: str, algo: str
) -> None:
    from marlctl.spec import load_spec
    from marlctl.sweep.space import check_space, space_of

    assert (repo_root / "sweeps" / f"{preset}.yaml").is_file()
    body = {
        "defaults": [{"envs": "simple_spread"}, {"algos": algo}, {"sweeps": preset}, "_self_"],
        "env": {"backend": "native"},
    }
    spec = write_spec(tmp_path, body)
    loaded = load_spec(spec)
    params = space_of(loaded, [])
    assert len(params) >= 4
    check_space(spec, [], params, loaded.spec.sweep.sampler)


def test_a_study_continues_only_with_the_space_it_began_with(tmp_path: Path, monkeypatch) -> None:
    from marlctl import cli

    shown = []  # the progress display: a refused sweep never opens it
    monkeypatch.setattr(cli.sweep, "with_sweep_progress", lambda *args: shown.append(args))
    spec = write_spec(tmp_path, {**TINY, "sweep": {"space": {"algo.clip": {"choices": [0.2]}}}})
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "optuna.journal"))
    )
    earlier = optuna.create_study(study_name="tiny", storage=storage, direction="maximize")
    earlier.set_user_attr("marlctl.space", "[another space]")
    result = runner.invoke(app, ["sweep", str(spec)])
    assert result.exit_code == 2, result.output
    assert "sweep.space: study 'tiny' was started with another search space" in result.output
    assert shown == []
    assert not (tmp_path / "mlflow.db").exists()


def test_storage_urls_are_shown_without_their_password() -> None:
    from marlctl.redact import shown_url

    assert shown_url("postgresql://me:secret@db:5432/s") == "postgresql://me@db:5432/s"
    assert shown_url("/data/optuna.journal") == "/data/optuna.journal"


def test_a_grid_never_passes_the_top_of_its_range() -> None:
    assert Param("a", "f", 1, low=4, high=16, step=8, is_int=True).grid() == [4, 12]
    assert Param("a", "f", 1, low=4, high=16, step=8, is_int=True).probe_values() == [4, 12]
    assert Param("b", "f", 1, low=0.1, high=0.3, step=0.1).grid() == pytest.approx([0.1, 0.2, 0.3])


def test_grid_workers_cover_the_grid_once_between_them() -> None:
    from marlctl.spec.models import SweepSpec
    from marlctl.sweep.search import make_sampler, sample

    params = [Param("a", "f", 1, choices=(1, 2, 3)), Param("b", "f", 2, choices=("x", "y"))]
    storage = optuna.storages.InMemoryStorage()
    studies = [
        optuna.create_study(
            study_name="g",
            storage=storage,
            sampler=make_sampler(SweepSpec(sampler="grid"), params, worker),
            load_if_exists=True,
        )
        for worker in (0, 1)
    ]
    points = []
    for i in range(6):  # the two workers take turns
        study = studies[i % 2]
        trial = study.ask()
        points.append(tuple(sample(trial, params).values()))
        study.tell(trial, 0.0)
    assert sorted(points) == sorted((a, b) for a in (1, 2, 3) for b in ("x", "y"))


def test_a_silent_running_trial_is_failed_and_requeued_with_its_point() -> None:
    from marlctl.spec.models import SweepSpec
    from marlctl.sweep.budget import LostTrials, counted

    study = optuna.create_study()
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr("marlctl.heartbeat", 1.0)
    watch = LostTrials(SweepSpec(heartbeat_s=0.01, retries=1), None)
    assert watch.check(study) == []  # first sight: the clock starts
    time.sleep(0.1)
    assert watch.check(study) == [trial.number]
    failed, again = study.get_trials()
    assert failed.state.name == "FAIL" and failed.user_attrs["marlctl.error"].startswith(
        "worker lost"
    )
    assert again.state.name == "WAITING" and again.params == failed.params
    assert again.system_attrs["failed_trial"] == failed.number
    assert [t.number for t in counted(study.get_trials())] == [again.number]
    # A trial that keeps beating is left alone.
    live = study.ask()
    live.set_user_attr("marlctl.heartbeat", 1.0)
    watch.check(study)
    time.sleep(0.1)
    live.set_user_attr("marlctl.heartbeat", 2.0)
    assert watch.check(study) == []


def test_every_sampler_and_pruner_builds() -> None:
    from marlctl.spec.models import SweepSpec, TrainSpec
    from marlctl.sweep.search import make_pruner, make_sampler

    params = [
        Param("a", "f", 1, low=1, high=5, step=1, is_int=True),
        Param("b", "f", 2, choices=(1, "x")),
    ]
    for sampler in ("tpe", "random", "grid", "cmaes"):
        assert make_sampler(SweepSpec(sampler=sampler), params, 0) is not None
    train = TrainSpec(total_env_steps=1000, eval_every=100)
    kinds = {
        type(make_pruner(SweepSpec(pruner=p), train)).__name__
        for p in ("median", "hyperband", "none")
    }
    assert kinds == {"MedianPruner", "HyperbandPruner", "NopPruner"}


# ---------------------------------------------------------------- studies


@pytest.mark.slow
def test_workers_share_one_study_within_a_global_budget_and_resume(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, TINY)
    code, summary = sweep_json(str(spec), "--workers", "2", "--trials", "5")
    assert code == 0, summary
    assert sum(summary["counts"].values()) == 5
    study = journal_study(tmp_path, "tiny")
    trials = study.get_trials()
    assert len(trials) == 5 and all(t.state.is_finished() for t in trials)
    workers = {t.user_attrs["marlctl.worker"] for t in trials}
    assert len(workers) == 2  # both processes took trials from the one study

    client = mlflow_client(tmp_path)
    roles = runs_by_role(client, "tiny")
    (study_run,) = roles["study"]
    assert study_run.info.run_id == summary["study_run_id"]
    assert study_run.info.status == "FINISHED"
    assert len(roles["trial"]) == 5 and len(roles["seed"]) == 10
    for run in roles["trial"]:
        assert run.data.tags["mlflow.parentRunId"] == study_run.info.run_id
        assert run.data.tags["marlctl.trial_state"] in ("COMPLETE", "PRUNED")
        assert "algo.lr" in run.data.params and "model.hidden" in run.data.params
    trial_ids = {r.info.run_id for r in roles["trial"]}
    assert all(r.data.tags["mlflow.parentRunId"] in trial_ids for r in roles["seed"])
    complete = [r for r in roles["trial"] if r.data.tags["marlctl.trial_state"] == "COMPLETE"]
    best = max(complete, key=lambda r: r.data.metrics["objective"])
    assert summary["best"]["value"] == pytest.approx(best.data.metrics["objective"])
    # The objective is the mean over the seeds' final evaluations.
    seeds = [r for r in roles["seed"] if r.data.tags["mlflow.parentRunId"] == best.info.run_id]
    finals = [r.data.metrics["eval/return_mean"] for r in seeds]
    assert best.data.metrics["objective"] == pytest.approx(sum(finals) / len(finals))

    best_spec = Path(summary["best_spec"])
    spec_data = yaml.safe_load(best_spec.read_text())
    assert "sweep" not in spec_data
    assert spec_data["algo"]["lr"] == pytest.approx(summary["best"]["params"]["algo.lr"])
    dry = runner.invoke(app, ["run", str(best_spec), "--dry-run"])
    assert dry.exit_code == 0, dry.output

    # The same command with a larger budget continues the study and its MLflow run.
    code, again = sweep_json(str(spec), "--trials", "6")
    assert code == 0
    assert len(journal_study(tmp_path, "tiny").get_trials()) == 6
    assert again["study_run_id"] == summary["study_run_id"]

    status = runner.invoke(app, ["sweep", str(spec), "--status"])
    assert status.exit_code == 0 and "top trials" in status.output
    cli = subprocess.run(
        [
            str(Path(sys.executable).parent / "optuna"),
            "trials",
            "--storage",
            str(tmp_path / "optuna.journal"),
            "--storage-class",
            "JournalFileBackend",
            "--study-name",
            "tiny",
            "-f",
            "json",
        ],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    assert len(json.loads(cli.stdout)) == 6  # the optuna CLI reads the study as it is
    dashboard = pytest.importorskip("optuna_dashboard")
    from wsgiref.util import setup_testing_defaults

    environ: dict = {"PATH_INFO": "/api/studies"}
    setup_testing_defaults(environ)
    replies: list = []
    app_ = dashboard.wsgi(journal_study(tmp_path, "tiny")._storage)
    body = b"".join(app_(environ, lambda status, headers, *exc: replies.append(status)))
    assert replies[0].startswith("200")
    assert [s["study_name"] for s in json.loads(body)["study_summaries"]] == ["tiny"]


CONSTANT = {
    "name": "constant",
    "seeds": [0],
    "env": {"id": "toy_envs:constant_reward", "params": {"bonus": 1.0, "max_cycles": 5}},
    "algo": {"name": "mappo", "epochs": 1, "minibatches": 1, "rollout_steps": 10},
    "train": {
        "total_env_steps": 400,
        "eval_every": 40,
        "eval_episodes": 2,
        "checkpoint_every": 0,
    },
    "hardware": {"device": "cpu", "num_envs": 4},
}


@pytest.mark.slow
def test_the_median_pruner_stops_bad_trials_early(tmp_path: Path) -> None:
    # The return is 5 × bonus whatever the agents do. The grid's order (seed 0) puts bonus 0
    # and 1 first: later trials with a negative bonus are below the median of the completed
    # ones at every evaluation, so the median pruner must stop them.
    body = {
        **CONSTANT,
        "sweep": {
            "trials": 5,
            "sampler": "grid",
            "seed": 0,
            "startup_trials": 1,
            "space": {"env.params.bonus": {"choices": [1.0, 0.5, 0.0, -0.5, -1.0]}},
        },
    }
    spec = write_spec(tmp_path, body)
    code, summary = sweep_json(str(spec))
    assert code == 0, summary
    trials = journal_study(tmp_path, "constant").get_trials()
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(pruned) >= 1, [(t.state.name, t.params) for t in trials]
    assert all(t.params["env.params.bonus"] < 0 for t in pruned)
    assert all(t.value == pytest.approx(5 * t.params["env.params.bonus"]) for t in complete)
    full = 400
    assert all(t.user_attrs["marlctl.env_steps"] < full for t in pruned)
    assert all(t.user_attrs["marlctl.env_steps"] >= full for t in complete)
    assert summary["best"]["value"] == pytest.approx(5.0)
    client = mlflow_client(tmp_path)
    for run in runs_by_role(client, "constant")["seed"]:
        parent = client.get_run(run.data.tags["mlflow.parentRunId"])
        if parent.data.tags["marlctl.trial_state"] == "PRUNED":
            assert int(run.data.tags["marlctl.pruned_at_step"]) < full


@pytest.mark.slow
def test_a_crashing_trial_is_recorded_fail_and_the_study_goes_on(tmp_path: Path) -> None:
    body = {
        **CONSTANT,
        "name": "crashy",
        "env": {"id": "toy_envs:crashing_spread", "params": {"N": 2, "max_cycles": 10}},
        "sweep": {
            "trials": 2,
            "sampler": "grid",
            "pruner": "none",
            "space": {"env.params.crash_at": {"choices": [100000, 30]}},
        },
    }
    spec = write_spec(tmp_path, body)
    code, summary = sweep_json(str(spec))
    assert code == 0, summary
    assert summary["counts"] == {"COMPLETE": 1, "FAIL": 1}
    trials = journal_study(tmp_path, "crashy").get_trials()
    (failed,) = [t for t in trials if t.state.name == "FAIL"]
    assert failed.params["env.params.crash_at"] == 30
    assert "simulated env failure" in failed.user_attrs["marlctl.error"]
    client = mlflow_client(tmp_path)
    run = client.get_run(failed.user_attrs["marlctl.mlflow_run_id"])
    assert run.info.status == "FAILED"
    assert "simulated env failure" in run.data.tags["marlctl.error"]


def test_a_batched_sweep_trains_trials_that_differ_in_row_values_as_one_batch(
    tmp_path: Path,
) -> None:
    # Four trials taken at once: those with the same network train as rows of one batch
    # (their seeds' runs say how many rows it had), the others in a batch of their own.
    body = {
        **TINY,
        "name": "batched",
        "sweep": {
            **TINY["sweep"],
            "batch": 4,
            "pruner": "none",
            "seed": 3,
            "space": {
                **TINY["sweep"]["space"],
                "algo.entropy_coef": {"low": 0.0, "high": 0.05},
            },
        },
    }
    code, summary = sweep_json(str(write_spec(tmp_path, body)))
    assert code == 0, summary
    assert summary["counts"] == {"COMPLETE": 4}
    trials = journal_study(tmp_path, "batched").get_trials()
    client = mlflow_client(tmp_path)
    seeds = runs_by_role(client, "batched")["seed"]
    for trial in trials:
        run_id = trial.user_attrs["marlctl.mlflow_run_id"]
        own = [r for r in seeds if r.data.tags["mlflow.parentRunId"] == run_id]
        assert [r.info.status for r in own] == ["FINISHED", "FINISHED"]
        alike = [t for t in trials if t.params["model.hidden"] == trial.params["model.hidden"]]
        assert {r.data.tags["marlctl.batch_rows"] for r in own} == {str(2 * len(alike))}
        assert own[0].data.params["algo.lr"] == repr(trial.params["algo.lr"])
    assert len({t.value for t in trials}) == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hardware": {**TINY["hardware"], "batch_seeds": False}}, "hardware.batch_seeds: true"),
        (
            {"algo": {"name": "masac"}, "env": {**TINY["env"], "params": {"N": 2}}},
            "algorithm masac takes no hyperparameters per row",
        ),
    ],
)
def test_a_sweep_batch_that_cannot_be_a_batch_is_exit_2_at_its_line(
    tmp_path: Path, change: dict, message: str
) -> None:
    body = {**TINY, **change, "sweep": {**TINY["sweep"], "batch": 2}}
    if change.get("algo", {}).get("name") == "masac":
        body["sweep"] = {**body["sweep"], "space": {"algo.lr": TINY["sweep"]["space"]["algo.lr"]}}
    spec = write_spec(tmp_path, body)
    result = runner.invoke(app, ["sweep", str(spec)])
    assert result.exit_code == 2, result.output
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if "batch:" in text
                and "batch_seeds" not in text)  # fmt: skip
    assert f"spec.yaml:{line}: sweep.batch: " in result.output
    assert message in result.output
    assert not (tmp_path / "optuna.journal").exists()


def test_an_automatic_batch_fits_the_memory_and_a_quarter_of_the_budget() -> None:
    from types import SimpleNamespace

    from marlctl.sweep.worker import batch_size

    def plan(mb: float, seeds: int = 2):
        runs = [SimpleNamespace(est_memory_mb=mb, device="cpu") for _ in range(seeds)]
        return SimpleNamespace(runs=runs)

    auto = SimpleNamespace(batch="auto", sampler="tpe")
    assert batch_size(SimpleNamespace(batch=6, sampler="tpe"), plan(10.0), 32, 1) == 6
    assert batch_size(auto, plan(1.0), 32, 1) == 4  # 8 rows on a CPU: 4 trials of 2 seeds
    assert batch_size(auto, plan(1.0, seeds=1), 32, 1) == 8  # a quarter of the budget
    assert batch_size(auto, plan(1.0, seeds=1), 32, 2) == 4  # each worker's share
    assert batch_size(auto, plan(1.0), 2, 1) == 1
    assert batch_size(auto, plan(1e12), 32, 1) == 1  # never none
    population = SimpleNamespace(batch=1, sampler="pbt")
    assert batch_size(population, plan(1e12), 12, 1) == 12  # the whole population


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_a_trial_of_a_killed_worker_is_failed_and_retried_on_resume(
    tmp_path: Path, batch: int
) -> None:
    # With `sweep.batch: 2` both trials train as one batch, and both are lost with it.
    body = {
        **TINY,
        "name": "killed",
        "train": {**TINY["train"], "total_env_steps": 10_000_000, "eval_every": 1000},
        "sweep": {
            **TINY["sweep"],
            "trials": 2,
            "heartbeat_s": 0.5,
            "pruner": "none",
            "batch": batch,
            "space": {"algo.lr": TINY["sweep"]["space"]["algo.lr"]},
        },
    }
    spec = write_spec(tmp_path, body)
    cmd = [str(Path(sys.executable).parent / "marlctl"), "sweep", str(spec)]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=cli_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def running_with_heartbeat():
            if not (tmp_path / "optuna.journal").exists():
                return None
            try:
                trials = journal_study(tmp_path, "killed").get_trials()
            except KeyError:
                return None
            return [
                t
                for t in trials
                if t.state.name == "RUNNING" and "marlctl.heartbeat" in t.user_attrs
            ]

        victims = _wait_for(
            lambda: (found := running_with_heartbeat()) and len(found) == batch and found,
            120,
            "the running trials",
        )
        client = mlflow_client(tmp_path)
        _wait_for(
            lambda: [
                r
                for r in runs_by_role(client, "killed").get("seed", [])
                if r.data.metrics.get("eval/return_mean") is not None
            ],
            120,
            "a first evaluation",
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the coordinator, its worker and run processes
        proc.wait()
    for victim in victims:
        assert journal_study(tmp_path, "killed").trials[victim.number].state.name == "RUNNING"

    time.sleep(2.5)  # more than 4 heartbeats: the trial's worker is lost
    result = subprocess.run(
        [*cmd, "train.total_env_steps=2000", "--json"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    trials = journal_study(tmp_path, "killed").get_trials()
    summary = json.loads(result.stdout)
    assert summary["retried"] == batch
    assert sum(summary["counts"].values()) == 2  # the retries stand in for the lost trials
    client = mlflow_client(tmp_path)
    for victim in victims:
        lost = trials[victim.number]
        assert lost.state.name == "FAIL"
        assert lost.user_attrs["marlctl.error"].startswith("worker lost")
        retries = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
        assert len(retries) == 1 and retries[0].state.name == "COMPLETE"
        assert retries[0].params == lost.params
        lost_run = client.get_run(lost.user_attrs["marlctl.mlflow_run_id"])
        assert lost_run.info.status == "FAILED"
        assert lost_run.data.tags["marlctl.error"].startswith("worker lost")
        seeds = [
            r
            for r in runs_by_role(client, "killed")["seed"]
            if r.data.tags["mlflow.parentRunId"] == lost_run.info.run_id
        ]
        assert seeds and all(r.info.status == "FAILED" for r in seeds)


@pytest.mark.slow
def test_submitit_local_executor_runs_the_workers(tmp_path: Path) -> None:
    pytest.importorskip("submitit")
    spec = write_spec(tmp_path, {**TINY, "name": "slurmish"})
    code, summary = sweep_json(
        str(spec), "--launcher", "submitit", "--cluster", "local", "--workers", "2", "--trials", "2"
    )
    assert code == 0, summary
    assert sum(summary["counts"].values()) == 2
    trials = journal_study(tmp_path, "slurmish").get_trials()
    assert len({t.user_attrs["marlctl.worker"] for t in trials}) == 2
    assert list((tmp_path / ".submitit" / "slurmish").rglob("*_result.pkl"))


# ---------------------------------------------------------------- many machines


@pytest.mark.slow
def test_machines_join_one_study_through_postgresql(tmp_path: Path, postgres: str) -> None:
    # Two `marlctl sweep` commands with their own working dirs (their own MLflow stores),
    # as on two machines, share the study through the database and its global budget.
    machines = [tmp_path / "a", tmp_path / "b"]
    for folder in machines:
        folder.mkdir()
        write_spec(folder, {**TINY, "name": "shared"})
    procs = [
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "marlctl"),
                "sweep",
                "spec.yaml",
                "--storage",
                postgres,
                "--trials",
                "4",
                "--json",
            ],
            cwd=folder,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=foreground_job,
        )
        for folder in machines
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, stdout + stderr
    study = optuna.load_study(study_name="shared", storage=postgres)
    trials = study.get_trials()
    assert len(trials) == 4 and all(t.state.is_finished() for t in trials)
    assert len({t.user_attrs["marlctl.worker"] for t in trials}) == 2
    per_machine = [
        len(runs_by_role(mlflow_client(folder), "shared").get("trial", [])) for folder in machines
    ]
    assert sum(per_machine) == 4 and all(n >= 1 for n in per_machine)


def test_a_sweep_whose_budget_was_used_is_ok_though_a_worker_died() -> None:
    from marlctl.sweep import SweepSummary

    def summary(counts: dict[str, int], errors: list[str]) -> SweepSummary:
        best = {"trial": 0, "value": 1.0, "params": {}}
        return SweepSummary(
            "s", "journal", "db", "run", 3, counts, 0, 0, best, [], None, worker_errors=errors
        )

    died = ["worker 1 ended with exit code -9"]
    assert summary({"COMPLETE": 2, "FAIL": 1}, died).ok
    assert not summary({"COMPLETE": 2, "RUNNING": 1}, died).ok
    assert not summary({"COMPLETE": 2}, died).ok
    assert summary({"COMPLETE": 2}, []).ok


def test_the_display_follows_running_trials_and_status_counts_the_asked_budget(
    tmp_path: Path,
) -> None:
    from marlctl.sweep import Launcher, prepare, run_sweep

    body = {
        **TINY,
        "train": {**TINY["train"], "total_env_steps": 40_000, "eval_every": 20_000},
        "sweep": {**TINY["sweep"], "heartbeat_s": 1},
    }
    spec = write_spec(tmp_path, body)
    ctx, settings = prepare(str(spec), [], None, 2)
    events: list[dict] = []
    summary = run_sweep(ctx, settings, 1, Launcher("local"), None, events.append)
    assert summary.ok
    # While a trial trained, the display saw its env steps move (from the trial's storage).
    seen = [step for e in events for step, total in e["progress"].values() if total == 40_000]
    assert seen and min(seen) < 40_000, [e["progress"] for e in events]
    assert any(e["running"] == 1 for e in events)
    # `--status` counts against the 2 trials asked, not the spec's 4.
    code, status = sweep_json(str(spec), "--status")
    finished = status["counts"].get("COMPLETE", 0) + status["counts"].get("PRUNED", 0)
    assert code == 0 and status["budget"] == 2 and finished == 2


def test_a_worker_s_threads_follow_the_rows_of_its_batch(tmp_path: Path, monkeypatch) -> None:
    # QMIX's gradient step of 256 samples x 3 agents is 768 rows: one thread pays for it
    # alone; two trials of one seed in a batch make 1,536, where a second thread pays.
    from marlctl.plan import compile_plan
    from marlctl.spec import load_spec
    from marlctl.sweep.worker import placement

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # as a test worker may have it
    body = {
        "seeds": [0],
        "env": {"id": "mpe/simple_spread", "backend": "native", "params": {"N": 3}},
        "algo": {"name": "qmix", "batch_size": 256},
        "hardware": {"device": "cpu", "batch_seeds": True, "threads_per_run": "auto"},
    }
    loaded = load_spec(str(write_spec(tmp_path, body)), [])
    plan = compile_plan(loaded)
    alone = placement(loaded, plan, 0, 1, free=2, trials=1)
    batched = placement(loaded, plan, 0, 1, free=2, trials=2)
    assert "++hardware.threads_per_run=1" in alone
    assert "++hardware.threads_per_run=2" in batched
