"""Several plans trained as one batch (a sweep's trials, `sweep.batch`): each plan's seeds are
rows of one trainer with the plan's own hyperparameters; a row logs what its plan logs trained
on its own, ends alone when its trial is pruned or its loss turns non-finite, and reports its
progress to its own plan."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml
from test_training import history

from marlctl.launch import Planned, run_plan, run_together
from marlctl.plan import compile_plan
from marlctl.spec import load_spec

BODY = {
    "name": "rows",
    "seeds": [0, 1],
    "env": {"id": "mpe/simple_spread", "backend": "native", "params": {"N": 2, "max_cycles": 10}},
    "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 2, "minibatches": 2},
    "model": {"hidden": [16]},
    "train": {
        "total_env_steps": 1_600,
        "eval_every": 400,
        "eval_episodes": 4,
        "checkpoint_every": 0,
        "log_every": 200,
    },
    "hardware": {"device": "cpu", "num_envs": 16, "batch_seeds": True, "threads_per_run": 1},
}
TRIALS = [{"lr": 3e-3, "entropy_coef": 0.05}, {"lr": 5e-4, "entropy_coef": 0.0, "clip": 0.1}]
KEYS = ("loss/policy", "loss/value", "eval/return_mean", "train/return_mean")


def planned(folder: Path, algo: dict, name: str, **extra) -> Planned:
    body = {**BODY, "algo": {**BODY["algo"], **algo}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    loaded = load_spec(str(path), [])
    return Planned(loaded, compile_plan(loaded), **extra)


def test_trials_trained_as_one_batch_log_what_each_logs_alone(tmp_path):
    events: dict[int, list] = {0: [], 1: []}
    together = run_together(
        [
            planned(tmp_path, trial, f"trial{i}", progress=events[i].append)
            for i, trial in enumerate(TRIALS)
        ]
    )
    from test_training import client

    for index, (trial, summary) in enumerate(zip(TRIALS, together, strict=True)):
        assert summary.ok, summary.runs
        alone = run_plan(*_loaded(planned(tmp_path, trial, f"alone{index}")))
        for ours, theirs in zip(summary.runs, alone.runs, strict=True):
            assert ours.final_return == theirs.final_return
            for key in KEYS:
                assert history(ours.run_id, key) == history(theirs.run_id, key), key
            assert client().get_run(ours.run_id).data.tags["marlctl.batch_rows"] == "4"
            assert client().get_run(theirs.run_id).data.tags["marlctl.batch_rows"] == "2"
        # Each plan heard its own seeds' progress, evaluations included, and no other's.
        own = {run.run_id for run in summary.runs}
        assert {event["run"] for event in events[index]} == own
        assert any(event.get("kind") == "eval" for event in events[index])
    # The trials did differ.
    assert together[0].runs[0].final_return != together[1].runs[0].final_return


def _loaded(item: Planned):
    return item.loaded, item.plan


def test_a_pruned_trial_leaves_the_batch_and_the_others_train_on(tmp_path):
    stop = threading.Event()

    def prune_at_first_evaluation(event: dict) -> None:
        if event.get("kind") == "eval":
            stop.set()

    pruned, kept = run_together(
        [
            planned(tmp_path, TRIALS[0], "pruned", stop=stop, progress=prune_at_first_evaluation),
            planned(tmp_path, TRIALS[1], "kept", stop=threading.Event()),
        ]
    )
    total = BODY["train"]["total_env_steps"]
    for run in pruned.runs:
        assert run.status == "PRUNED"
        assert 400 <= run.env_steps < total
        assert run.tags["marlctl.pruned_at_step"] == str(run.env_steps)
        steps = [step for step, _ in history(run.run_id, "eval/return_mean")]
        assert max(steps) < total  # no final evaluation
    for run in kept.runs:
        assert run.status == "FINISHED" and run.env_steps == total
        assert max(step for step, _ in history(run.run_id, "eval/return_mean")) == total
    # The pruned trial's rows left the batch: the kept trial's two trained on alone, and
    # computed what they compute in a batch of their own.
    rows = [int(value) for _, value in history(kept.runs[0].run_id, "perf/batch_rows")]
    assert rows[0] == 4 and rows[-1] == 2
    alone = run_plan(*_loaded(planned(tmp_path, TRIALS[1], "alone")))
    for ours, theirs in zip(kept.runs, alone.runs, strict=True):
        assert ours.final_return == theirs.final_return
        for key in KEYS:
            assert history(ours.run_id, key) == history(theirs.run_id, key), key


def test_a_row_whose_loss_turns_non_finite_fails_alone():
    import torch

    from marlctl.train.lifecycle import MetricLogger, RowEnd, RunState

    class Sink:
        def __init__(self):
            self.logged, self.closed = [], False

        def log(self, metrics, step):
            assert not self.closed
            self.logged.append((step, metrics))

        def close(self):
            self.closed = True

    class Request:
        def __init__(self, seed, trial):
            self.run = type("Plan", (), {"seed": seed, "index": seed})
            self.env_info = type("Info", (), {"n_agents": 2})
            self.resume, self.stop, self.run_id, self.trial = False, None, f"run{seed}", trial

    class Stats:
        def take(self):
            return [None, None, None]

    trainer = type("Trainer", (), {"graph": None, "stats": Stats()})()
    sinks = [Sink(), Sink(), Sink()]
    spec = type("Spec", (), {"train": type("Train", (), {"log_interval": 1}),
                             "algo": type("Algo", (), {"name": "mappo"})})  # fmt: skip
    # Rows 0 and 1: the two seeds of trial a; row 2: trial b's.
    requests = [Request(0, "a"), Request(1, "a"), Request(2, "b")]
    run = RunState(spec, requests, [None] * 3, None, list(sinks), trainer, None, None, None)
    run.last_return = [None] * 3
    logger = MetricLogger(run)
    run.env_steps = 10
    logger.on_iteration(run, {"loss/value": torch.tensor([0.5, float("nan"), 0.75])})
    assert run.live == [2]  # seed 1 failed, and its trial with it; trial b trains on
    end = run.ended[1]
    assert end == RowEnd("FAILED", 10, end.error)
    assert "non-finite loss by env step 10 (seed 1): loss/value" in end.error
    assert run.ended[0].status == "FAILED" and "seed 1: non-finite loss" in run.ended[0].error
    assert sinks[0].closed and sinks[1].closed and not sinks[2].closed
    assert run.sinks[:2] == [None, None]  # an ended row's sink is not closed twice
    assert sinks[2].logged[-1][1]["loss/value"] == pytest.approx(0.75)
    run.env_steps = 20  # the failed rows are not logged any more
    logger.on_iteration(run, {"loss/value": torch.tensor([float("nan"), float("nan"), 0.25])})
    assert [step for step, _ in sinks[2].logged] == [10, 20]
    assert sinks[0].logged == [] and sinks[1].logged == []


def test_an_interrupted_batch_keeps_its_pruned_trials_pruned(tmp_path):
    stop = threading.Event()

    def prune_at_first_evaluation(event: dict) -> None:
        if event.get("kind") == "eval":
            stop.set()

    def interrupt_at_second_evaluation(event: dict) -> None:
        if event.get("kind") == "eval" and event["step"] >= 800:
            raise KeyboardInterrupt

    pruned, interrupted = run_together(
        [
            planned(tmp_path, TRIALS[0], "pruned", stop=stop, progress=prune_at_first_evaluation),
            planned(tmp_path, TRIALS[1], "cut", progress=interrupt_at_second_evaluation),
        ]
    )
    assert [r.status for r in pruned.runs] == ["PRUNED", "PRUNED"]
    assert [r.status for r in interrupted.runs] == ["KILLED", "KILLED"]
    assert pruned.runs[0].tags["marlctl.pruned_at_step"] == str(pruned.runs[0].env_steps)


def test_many_rows_send_their_metrics_a_few_at_a_time():
    # A batch of 8 trials x 4 seeds has 32 sinks; the SQL store's connection pool holds 15.
    import time as clock

    from marlctl.tracking import MetricSink

    state = {"now": 0, "most": 0}
    lock = threading.Lock()

    class Client:
        def log_batch(self, run_id, metrics, synchronous):
            with lock:
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
            clock.sleep(0.05)
            with lock:
                state["now"] -= 1

    sinks = [MetricSink(Client(), f"run{i}", flush_every_s=60.0) for i in range(32)]
    for sink in sinks:
        sink.log({"loss": 1.0}, 1)
    threads = [threading.Thread(target=sink.flush) for sink in sinks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for sink in sinks:
        sink.close()
    assert 1 <= state["most"] <= 4
