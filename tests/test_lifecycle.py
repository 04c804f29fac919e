"""A training run's parts: the typed spec reaches the runner's process, and the parts that
act around the iterations (`marlctl.train.lifecycle`) hook in, in order."""

from __future__ import annotations

import pickle
import threading
import time

import yaml

from marlctl.plan import compile_plan
from marlctl.spec import load_spec
from marlctl.spec.models import Spec
from marlctl.train.lifecycle import (
    Checkpointer,
    Clock,
    Evaluator,
    MetricLogger,
    PoolSnapshots,
    ProgressEvents,
    Pruning,
    RunState,
    ThreadWatch,
    parts_for,
)
from marlctl.train.runner import RunRequest


def _request(tmp_path, stop=None) -> RunRequest:
    path = tmp_path / "spread.yaml"
    body = {"env": {"id": "mpe/simple_spread"}, "algo": {"name": "mappo"}, "seeds": [0]}
    path.write_text(yaml.safe_dump(body))
    loaded = load_spec(path)
    plan = compile_plan(loaded)
    return RunRequest(loaded.spec, plan.env, plan.runs[0], None, "run-id", stop=stop)


def test_a_run_request_carries_the_typed_spec_into_a_runs_process(tmp_path):
    request = _request(tmp_path)
    again = pickle.loads(pickle.dumps(request))
    assert isinstance(again.spec, Spec)
    assert again.spec == request.spec


def test_the_parts_of_a_run_hook_in_in_order(tmp_path):
    request = _request(tmp_path, stop=threading.Event())
    run = RunState(request.spec, [request], [], None, [], None, None, None, None, print)
    kinds = [type(part) for part in parts_for(run)]
    assert kinds[-5:] == [MetricLogger, Evaluator, Checkpointer, ProgressEvents, Pruning]
    assert PoolSnapshots not in kinds  # no pools
    assert kinds[:-5] in ([], [ThreadWatch])

    quiet = RunState(request.spec, [_request(tmp_path)], [], None, [], None, None, None, None)
    assert [type(part) for part in parts_for(quiet)][-3:] == [
        MetricLogger,
        Evaluator,
        Checkpointer,
    ]


def test_time_paused_for_evaluations_is_left_out_of_the_throughput_not_the_mean():
    clock = Clock()
    clock.start(100)
    tick = clock.tick
    with clock.paused():
        time.sleep(0.05)
    assert clock.tick - tick >= 0.05
    assert clock.mean_rate(100) == 0.0
    assert clock.elapsed >= 0.05
