"""Launch a compiled plan: seeds in-process or in processes, and the lifecycle of their
MLflow runs (created here, reopened on resume, ended here with each seed's result)."""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from marlctl import tracking
from marlctl.atomic import remove_stale_staging, staging
from marlctl.cores import passive_wait
from marlctl.errors import SpecError
from marlctl.plan import Plan, compile_plan
from marlctl.redact import redact_all
from marlctl.spec import LoadedSpec, load_spec
from marlctl.stored import CHECKPOINT_STEP_TAG, SPEC_ARTIFACT, identity_tags
from marlctl.train.lifecycle import Progress
from marlctl.train.runner import RunRequest, RunResult, execute_batch

THREADS_TAG = "marlctl.threads"  # how the threads were chosen, where auto chose them


@dataclass
class Summary:
    experiment: str
    tracking_uri: str
    parent_run_id: str
    runs: list[RunResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.status == "FINISHED" for r in self.runs)

    @property
    def interrupted(self) -> bool:
        return any(r.status == "KILLED" for r in self.runs)

    def aggregate(self) -> dict[str, float | None]:
        import statistics

        returns = [r.final_return for r in self.runs if r.final_return is not None]
        rates = [r.steps_per_s for r in self.runs if r.steps_per_s is not None]
        return {
            "eval/return_mean": statistics.fmean(returns) if returns else None,
            "eval/return_std": statistics.pstdev(returns) if len(returns) > 1 else None,
            "perf/env_steps_per_s": statistics.fmean(rates) if rates else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "tracking_uri": self.tracking_uri,
            "parent_run_id": self.parent_run_id,
            "ok": self.ok,
            "aggregate": self.aggregate(),
            # The traceback of a failure is the run's `error.txt` artifact, not output.
            "runs": [{k: v for k, v in asdict(r).items() if k != "trace"} for r in self.runs],
        }


def run_plan(
    loaded: LoadedSpec,
    plan: Plan,
    progress: Progress | None = None,
    parent_id: str | None = None,
    stop: Any = None,
    tags: dict[str, str] | None = None,
) -> Summary:
    """Create the MLflow runs for a validated plan and train every seed.

    The seeds' runs go under a new parent run, or under `parent_id` (a sweep's trial run,
    which its caller creates and ends). `stop` (an Event) ends every seed early. `tags` go on
    every run besides the spec's own (a suite's cell and its reference).
    """
    return run_together([Planned(loaded, plan, parent_id, stop)], progress, tags)[0]


@dataclass
class Planned:
    """A validated plan to train, its seeds' runs under `parent_id` (or a new parent run),
    ended early when `stop` (an Event) is set; `progress` is told its seeds' events; a
    `population` member of a population-based training."""

    loaded: LoadedSpec
    plan: Plan
    parent_id: str | None = None
    stop: Any = None
    progress: Progress | None = None
    population: bool = False


def run_together(
    planned: list[Planned], progress: Progress | None = None, tags: dict[str, str] | None = None
) -> list[Summary]:
    """`run_plan` for several plans whose specs differ only in hyperparameters a row of a
    batch may have of its own (a sweep's trials): with `hardware.batch_seeds`, the seeds of
    all of them on one device train as one batch. A summary per plan, in order; `progress`
    is told every event, each plan's own its seeds'."""
    remove_stale_staging()
    first = planned[0].plan
    per_plan = [_create_runs(item, tags) for item in planned]
    requests = [request for _, found in per_plan for request in found]
    routes = {
        request.run_id: item.progress
        for item, (_, found) in zip(planned, per_plan, strict=True)
        for request in found
        if item.progress is not None
    }

    def told(event: dict[str, Any]) -> None:
        if progress is not None:
            progress(event)
        if (own := routes.get(event.get("run"))) is not None:
            own(event)

    with passive_wait(first.passive_wait):
        listened = told if progress is not None or routes else None
        results = _execute_all(_jobs(requests, first), first.parallel_runs, listened)
    by_run = {result.run_id: result for result in results}
    summaries = []
    for item, (parent_id, found) in zip(planned, per_plan, strict=True):
        uri = item.loaded.spec.tracking.uri
        summary = Summary(item.plan.experiment, tracking.resolve_uri(uri), parent_id)
        summary.runs = [by_run[request.run_id] for request in found]
        if item.parent_id is None:
            _finish_parent(tracking.client_for(uri), parent_id, summary)
        summaries.append(summary)
    return summaries


def _create_runs(item: Planned, tags: dict[str, str] | None) -> tuple[str, list[RunRequest]]:
    """The plan's parent run (its own, or `item.parent_id`) and a request per seed, each with
    its new MLflow run."""
    loaded, plan, parent_id = item.loaded, item.plan, item.parent_id
    spec = loaded.spec
    uri = spec.tracking.uri
    tracking.check_reachable(uri)
    client = tracking.client_for(uri)
    experiment_id = tracking.ensure_experiment(client, plan.experiment, uri)
    common = {**run_tags(loaded, plan), **(tags or {})}
    params = tracking.flatten(loaded.resolved)
    # The threads the runs start with, not `auto`: the tag says how auto chose them.
    params["hardware.threads_per_run"] = str(plan.runs[0].threads)
    named = {**loaded.resolved, "name": plan.experiment}
    if parent_id is None:
        parent = client.create_run(
            experiment_id,
            run_name=f"{plan.experiment}",
            tags={**common, "marlctl.role": "experiment"},
        )
        parent_id = parent.info.run_id
        tracking.log_params(client, parent_id, params)
        log_spec(client, parent_id, named)
    requests = []
    for run in plan.runs:
        child = client.create_run(
            experiment_id,
            run_name=f"seed-{run.seed}",
            tags={
                **common,
                tracking.PARENT_TAG: parent_id,
                "marlctl.role": "seed",
                "marlctl.seed": str(run.seed),
                "marlctl.device": run.device,
            },
        )
        tracking.log_params(client, child.info.run_id, {**params, "seed": str(run.seed)})
        log_spec(client, child.info.run_id, {**named, "seeds": [run.seed]})
        request = RunRequest(
            spec, plan.env, run, uri, child.info.run_id, stop=item.stop, trial=parent_id,
            population=item.population,
        )  # fmt: skip
        requests.append(request)
    return parent_id, requests


def run_tags(loaded: LoadedSpec, plan: Plan) -> dict[str, str]:
    """Tags every run of a spec carries: what it trains and with which code."""
    from marlctl.plan import unused_fields

    spec = loaded.spec
    tags = {
        **identity_tags(loaded),
        "marlctl.algo": plan.algo,
        "marlctl.env": plan.env.id,
        tracking.UNUSED_TAG: ",".join(unused_fields(spec, plan.env)),
    }
    if plan.threads_note:
        tags[THREADS_TAG] = plan.threads_note
    commit, why_not = tracking.git_state()
    if commit:
        tags[tracking.COMMIT_TAG] = commit
    else:
        tags[tracking.NO_COMMIT_TAG] = why_not or "unknown"
    return tags


def resume(
    run_id: str,
    tracking_uri: str | None,
    progress_factory: Callable[[Plan], Progress | None] | None = None,
    others: Collection[str] = (),
) -> Summary:
    """Continue an interrupted run: one seed's child run (with `others`, more seed runs of
    its parent), or every unfinished seed of a parent. Seeds whose checkpoints stand at one
    step train as one batch where the spec batches its seeds.

    The parent's summary, aggregate and status always cover all of its seeds.
    """
    from mlflow.exceptions import MlflowException

    from marlctl.errors import Problem

    def problem(message: str) -> SpecError:
        return SpecError([Problem("--resume", None, "", message)])

    store = tracking.resolve_uri(tracking_uri)
    tracking.check_store(tracking_uri, writes=True)
    remove_stale_staging()
    client = tracking.client_for(tracking_uri)
    run_id = tracking.resolve_run_id(client, run_id, "--resume")
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise problem(f"no run '{run_id}' in {store}") from None
    parent_id = run.data.tags.get(tracking.PARENT_TAG, run_id)
    children = client.search_runs(
        [run.info.experiment_id], f"tags.`{tracking.PARENT_TAG}` = '{parent_id}'"
    )
    wanted = {c.info.run_id for c in children} if parent_id == run_id else {run_id, *others}
    pending = [c for c in children if c.info.run_id in wanted and c.info.status != "FINISHED"]
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = client.download_artifacts(parent_id, SPEC_ARTIFACT, tmp)
        # The one place a stored spec is validated again; its runs get the typed spec.
        loaded = load_spec(spec_path, stored=f"run {parent_id}")
    plan = compile_plan(loaded)
    by_seed = {r.seed: r for r in plan.runs}
    requests: dict[str | None, list[RunRequest]] = {}  # by the step of their checkpoints
    for child in pending:
        run_id = child.info.run_id
        tracking.reopen_run(client, run_id)
        if plan.threads_note:  # chosen again for this machine as it is now
            client.set_tag(run_id, THREADS_TAG, plan.threads_note)
        requests.setdefault(child.data.tags.get(CHECKPOINT_STEP_TAG), []).append(
            RunRequest(
                loaded.spec,
                plan.env,
                by_seed[int(child.data.tags["marlctl.seed"])],
                store,  # where the run was found: the stored spec keeps no password
                run_id,
                resume=True,
                logged_until=tracking.last_logged_step(client, run_id),
            )
        )
    summary = Summary(plan.experiment, store, parent_id)
    if requests:
        tracking.reopen_run(client, parent_id)
        progress = progress_factory(plan) if progress_factory else None
        with passive_wait(plan.passive_wait):
            jobs = [job for same in requests.values() for job in _jobs(same, plan)]
            summary.runs = _execute_all(jobs, plan.parallel_runs, progress)
    done = {r.run_id for r in summary.runs}
    summary.runs += [_stored_result(client, c) for c in children if c.info.run_id not in done]
    summary.runs.sort(key=lambda r: r.seed)
    _finish_parent(client, parent_id, summary)
    return summary


def _stored_result(client, child) -> RunResult:
    """A seed that `resume` left alone, as its run in the store says it ended."""
    child = client.get_run(child.info.run_id)
    metrics = child.data.metrics
    return RunResult(
        0,
        int(child.data.tags["marlctl.seed"]),
        child.info.run_id,
        child.info.status,
        final_return=metrics.get("eval/return_mean") if child.info.status == "FINISHED" else None,
        steps_per_s=metrics.get("perf/env_steps_per_s_mean"),
        error=child.data.tags.get(tracking.ERROR_TAG),
    )


def log_spec(client, run_id: str, resolved: dict[str, Any]) -> None:
    with staging() as tmp:
        path = tmp / SPEC_ARTIFACT
        path.write_text(yaml.safe_dump(redact_all(resolved), sort_keys=False))
        client.log_artifact(run_id, str(path))


def _finish_parent(client, parent_id: str, summary: Summary) -> None:
    aggregate = {k: v for k, v in summary.aggregate().items() if v is not None}
    for key, value in aggregate.items():
        client.log_metric(parent_id, key, value)
    status = "FINISHED" if summary.ok else "KILLED" if summary.interrupted else "FAILED"
    tracking.end_run(client, parent_id, status)


class Terminated(KeyboardInterrupt):
    """SIGTERM to the CLI: stop like Ctrl-C, and pass the signal on to the run processes."""


Job = list[RunRequest]  # runs trained together in one process: one, or a seed batch


def _jobs(requests: list[RunRequest], plan: Plan) -> list[Job]:
    """One job per run, or with `hardware.batch_seeds` one job per device (all the plans'
    seeds placed on it)."""
    if not plan.batch_seeds:
        return [[r] for r in requests]
    by_device: dict[str, Job] = {}
    for request in requests:
        by_device.setdefault(request.run.device, []).append(request)
    return list(by_device.values())


def _execute_all(jobs: list[Job], parallel: int, progress: Progress | None) -> list[RunResult]:
    if parallel <= 1 or len(jobs) <= 1:
        results: list[RunResult] = []
        for index, job in enumerate(jobs):
            results += _ended(job, execute_batch(job, progress))
            if any(r.status == "KILLED" for r in results):
                for later in jobs[index + 1 :]:
                    results += _ended(later, [_never_started(r) for r in later])
                break
        return results
    ctx = mp.get_context("spawn")
    events = ctx.Queue()  # progress from the run processes
    pump = threading.Thread(target=_pump, args=(events, progress), daemon=True)
    pump.start()
    try:
        return _schedule(ctx, jobs, parallel, events)
    finally:
        events.put(None)
        pump.join()


def _schedule(ctx, jobs: list[Job], parallel: int, events) -> list[RunResult]:
    """One process per job, at most `parallel` at once; a crashed process harms no other."""
    waiting = list(jobs)
    running: dict[str, tuple[Any, Any, Job]] = {}
    results: dict[str, list[RunResult]] = {}
    stopping_since: float | None = None
    while running or (waiting and stopping_since is None):
        stopping = stopping_since is not None
        try:
            while waiting and len(running) < parallel and not stopping:
                job = waiting.pop(0)
                receive, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_run_process, args=(job, events, send))
                proc.start()
                send.close()
                running[job[0].run_id] = (proc, receive, job)
            for key, (proc, receive, job) in list(running.items()):
                proc.join(timeout=0.1)
                if proc.exitcode is None and stopping:
                    _escalate(proc, time.monotonic() - stopping_since)
                if proc.exitcode is None:
                    continue
                results[key] = _ended(job, _result_of(proc, receive, job, stopping))
                del running[key]
        except KeyboardInterrupt as interrupt:
            # Ctrl-C reached every process of the terminal's job; a SIGTERM only this one.
            stopping_since = stopping_since or time.monotonic()
            if isinstance(interrupt, Terminated):
                for proc, _, _ in running.values():
                    if proc.exitcode is None:
                        proc.terminate()
    for job in waiting:
        results[job[0].run_id] = _ended(job, [_never_started(r) for r in job])
    return [result for job in jobs for result in results[job[0].run_id]]


STOP_GRACE_S = 60.0  # time a run process gets to checkpoint after an interrupt


def _escalate(proc, waited: float) -> None:
    """A run process that has not stopped long after an interrupt is terminated, then killed."""
    if waited > 2 * STOP_GRACE_S:
        proc.kill()
    elif waited > STOP_GRACE_S:
        proc.terminate()


def _result_of(proc, receive, job: Job, stopping: bool) -> list[RunResult]:
    try:
        if receive.poll():
            return receive.recv()
    except (EOFError, OSError):
        pass
    # The process died without reporting (killed, out of memory, a crash in native code).
    status = "KILLED" if stopping else "FAILED"
    reason = f"run process ended with exit code {proc.exitcode} before reporting"
    return [RunResult(r.run.index, r.run.seed, r.run_id, status, error=reason) for r in job]


def _never_started(request: RunRequest) -> RunResult:
    """A run left in the queue when the command was interrupted: resumable later."""
    reason = "interrupted before it started"
    return RunResult(request.run.index, request.run.seed, request.run_id, "KILLED", error=reason)


def _ended(job: Job, results: list[RunResult]) -> list[RunResult]:
    """End each seed's MLflow run as its result says (a pruned run is FINISHED, tagged)."""
    client = tracking.client_for(job[0].tracking_uri)
    for result in results:
        status = "FINISHED" if result.status == "PRUNED" else result.status
        tracking.end_run(client, result.run_id, status, result.error, result.trace, result.tags)
        if result.trace is not None:
            result.trace_file = tracking.artifact_location(client, result.run_id, "error.txt")
    return results


def _run_process(job: Job, events, send) -> None:
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # as the CLI process does

    def report(event: dict[str, Any]) -> None:
        try:
            events.put(event)
        except (OSError, EOFError):  # progress display gone; training goes on
            pass

    send.send(execute_batch(job, report))
    send.close()


def _pump(events, progress: Progress | None) -> None:
    while True:
        event = events.get()
        if event is None:
            return
        if progress is not None:
            try:
                progress(event)
            except Exception:  # a display problem must not stop draining the queue
                pass
