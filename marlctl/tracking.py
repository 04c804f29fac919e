"""MLflow layout: one parent run per invocation, one child run per seed.

Metrics are queued and sent by a background thread in batches, so logging never waits on
the store inside the training loop.
"""

from __future__ import annotations

import hashlib
import json
import queue
import random
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from marlctl.errors import SpecError, one_line
from marlctl.redact import redact

PARENT_TAG = "mlflow.parentRunId"
ERROR_TAG = "marlctl.error"


def default_uri() -> str:
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def resolve_uri(uri: str | None) -> str:
    return uri or default_uri()


def check_store(uri: str | None, writes: bool = False) -> None:
    """Refuse a SQLite store that does not exist instead of creating an empty one (for the
    commands that use an existing store: eval and report read it, resume `writes`)."""
    resolved = resolve_uri(uri)
    if resolved.startswith("sqlite:///"):
        path = resolved.removeprefix("sqlite:///")
        if path and not path.startswith(":memory:") and not Path(path).is_file():
            where = "--tracking-uri" if uri else "mlflow.db"
            raise SpecError.at(where, f"no MLflow store at {path}; pass --tracking-uri")
    check_reachable(uri, writes)


def client_for(uri: str | None) -> MlflowClient:
    import logging
    import os

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # A new SQLite store prints its schema migrations; they are not the user's business.
    for name in ("alembic", "mlflow.store.db.utils"):
        logging.getLogger(name).setLevel(logging.WARNING)
    resolved = resolve_uri(uri)

    def open_store() -> MlflowClient:
        # Opening a new SQLite store creates its schema: commands on this machine take
        # turns (two started together in a fresh folder would both migrate it and break it).
        with _schema_lock(resolved):
            return RedactingClient(tracking_uri=resolved)

    return _retried(open_store, uri)


def _retried(action: Callable[[], Any], uri: str | None) -> Any:
    """`action()`, tried again after a short pause when it fails (a store another command
    is creating at the same moment); exit 2 naming the store when it keeps failing."""
    for attempt in range(STORE_ATTEMPTS):
        try:
            return action()
        except Exception as err:
            if attempt == STORE_ATTEMPTS - 1:
                raise _store_error(uri, err) from None
            time.sleep(0.2 * (attempt + 1) + 0.1 * random.random())
    raise AssertionError("unreachable")


@contextmanager
def _schema_lock(uri: str) -> Iterator[None]:
    """An exclusive lock per SQLite file while a client opens it: a hidden file beside the
    database (`.mlflow.db.lock`), so that nothing is written outside the store's folder.
    Not the database itself: closing a second handle on it would drop SQLite's own locks."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    try:
        import fcntl
    except ImportError:  # not on POSIX: no lock
        yield
        return
    database = Path(uri.removeprefix("sqlite:///")).resolve()
    try:
        handle = open(database.with_name(f".{database.name}.lock"), "a")
    except OSError:  # a folder that takes no writes: no schema can be created there either
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class RedactingClient(MlflowClient):
    """An MLflow client that stores no URL password in a param or tag (`redact`)."""

    def set_tag(self, run_id: str, key: str, value: Any, synchronous: bool | None = None):
        return super().set_tag(run_id, key, redact(str(value)), synchronous=synchronous)

    def log_param(self, run_id: str, key: str, value: Any, synchronous: bool | None = None):
        return super().log_param(run_id, key, redact(str(value)), synchronous=synchronous)

    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        params = [Param(p.key, redact(p.value)) for p in params]
        tags = [RunTag(t.key, redact(t.value)) for t in tags]
        return super().log_batch(run_id, metrics, params, tags, synchronous=synchronous)

    def create_run(self, experiment_id, start_time=None, tags=None, run_name=None):
        tags = {k: redact(str(v)) for k, v in (tags or {}).items()}
        return super().create_run(experiment_id, start_time, tags, run_name)


def ensure_experiment(client: MlflowClient, name: str, uri: str | None) -> str:
    """The experiment's id, created if new; a command that loses the race to create it
    tries again."""
    location = None if uri is not None else (Path.cwd() / "mlruns").as_uri()

    def find_or_create() -> str:
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        return client.create_experiment(name, artifact_location=location)

    return _retried(find_or_create, uri)


STORE_ATTEMPTS = 5
CONNECT_TIMEOUT_S = 10


def check_reachable(uri: str | None, writes: bool = True) -> None:
    """Fail fast (exit 2, the store named) when a database or server store cannot be
    reached or refuses the credentials, or when a SQLite store that will be written sits
    in a folder that takes no writes (read-only, or a full disk); MLflow itself retries
    for minutes first."""
    resolved = resolve_uri(uri)
    scheme = resolved.split("://", 1)[0].split("+", 1)[0]
    try:
        if scheme == "sqlite" and writes:
            _check_writable(resolved.removeprefix("sqlite:///"))
        elif scheme in ("postgresql", "mysql", "mssql"):
            import sqlalchemy

            args = {"connect_timeout": CONNECT_TIMEOUT_S} if scheme != "mssql" else {}
            engine = sqlalchemy.create_engine(resolved, connect_args=args)
            try:
                with engine.connect():
                    pass
            finally:
                engine.dispose()
        elif scheme in ("http", "https"):
            from marlctl.servers import server_silence

            reason = server_silence(resolved)
            if reason is not None:
                raise ConnectionError(f"no MLflow server answers ({reason})")
    except Exception as err:
        raise _store_error(uri, err) from None


# A new SQLite store is about 1 MB of schema; its folder must take at least this much.
WRITE_CHECK_BYTES = 1 << 20


_writable: set[Path] = set()  # folders that took the write check in this process


def _check_writable(path: str) -> None:
    """SQLite writes the store and its journal next to each other: try the folder (once per
    process: the CLI checks before its progress display, then the run or sweep it starts)."""
    if not path or path.startswith(":memory:") or path.startswith("file:"):
        return
    import os
    import tempfile

    folder = Path(path).parent
    if folder in _writable:
        return
    if not folder.is_dir():
        raise OSError(f"no folder {folder}")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".marlctl-write-check-") as probe:
            probe.write(b"\0" * WRITE_CHECK_BYTES)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as err:
        raise OSError(f"cannot write in {folder}: {err.strerror or err}") from None
    _writable.add(folder)


def _store_error(uri: str | None, err: Exception) -> SpecError:
    reason = one_line(str(getattr(err, "orig", None) or err))
    where = "tracking.uri" if uri else "mlflow.db"
    return SpecError.at(where, f"cannot use the MLflow store {redact(resolve_uri(uri))}: {reason}")


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: json.dumps(data) if isinstance(data, (list, type(None))) else str(data)}


def spec_hash(resolved: dict[str, Any]) -> str:
    """What is trained, as a short hash: seeds and the report's label left out."""
    payload = {k: v for k, v in resolved.items() if k not in ("seeds", "label")}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


COMMIT_TAG = "mlflow.source.git.commit"
# Why a run has no commit, where it has none: a report says so rather than "not recorded".
NO_COMMIT_TAG = "marlctl.no_commit"
HARDWARE_TAG = "marlctl.hardware"  # the CPU or GPU a run trained on, by name
ENV_PACKAGE_TAG = "marlctl.env_package"  # the env's distribution and version
UNUSED_TAG = "marlctl.unused"  # spec fields that take no part in the run, comma-separated
# A seed of a suite's cell (`marlctl reproduce`): the suite and cell, and the cell's reference
# in marlctl's conventions as JSON (`report.references`).
SUITE_TAG = "marlctl.suite"
CELL_TAG = "marlctl.cell"
REFERENCE_TAG = "marlctl.reference"


def git_state() -> tuple[str | None, str | None]:
    """The commit checked out in the working folder, or None and why there is none."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None, "git is not installed here"
    commit = out.stdout.strip()
    if out.returncode == 0 and commit:
        return commit, None
    if "not a git repository" in out.stderr:
        return None, "not run in a git checkout"
    return None, f"git rev-parse failed: {one_line(out.stderr.strip()) or out.returncode}"


def hardware_name(device: str) -> str:
    """The processor a run computes on: the GPU's name for a CUDA device, else the CPU's
    model (from /proc/cpuinfo on Linux), with the number of cores this process may use."""
    import os
    import platform

    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return f"{name}, {cores} cores"


# An offline run's dataset: the mean return of its episodes (the policy that played them),
# logged once as the run starts.
DATA_RETURN = "data/return_mean"
# A finished run's seconds of training over every process that trained it (a resumed run's
# time stopped left out)
TRAINED_S = "perf/trained_s"


def package_versions() -> str:
    names = ("marlctl", "torch", "mlflow", "pettingzoo", "mpe2", "gymnasium", "numpy")
    found = []
    for name in names:
        try:
            found.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return " ".join(found)


def log_params(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    items = [Param(k, v[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 100):
        client.log_batch(run_id, params=items[start : start + 100], synchronous=True)


def last_logged_step(client: MlflowClient, run_id: str) -> int:
    """The highest step of any metric the run holds. A crash can leave a step's metrics half
    sent (one batch in the store, the next lost), so a resumed run drops every point up to
    it: a metric may miss that one step, none is logged twice."""
    keys = client.get_run(run_id).data.metrics
    steps = [m.step for key in keys for m in client.get_metric_history(run_id, key)]
    return max(steps, default=-1)


# Metric sinks sending at once in this process. A batch of many rows (a sweep's trials x
# seeds) has a sink each; the SQL store's connection pool holds 15 connections, which as
# many sinks sending together would use up (and time out waiting for).
_SENDING = threading.BoundedSemaphore(4)


class MetricSink:
    """Queues metrics and sends them to one run in batches from a daemon thread.

    Points at or below `skip_until` are dropped: a resumed run replays the steps between its
    last checkpoint and the crash, which the store already holds.
    """

    def __init__(
        self, client: MlflowClient, run_id: str, flush_every_s: float = 5.0, skip_until: int = -1
    ):
        self.client, self.run_id, self.every = client, run_id, flush_every_s
        self.skip_until = skip_until
        self._queue: queue.Queue[Metric | threading.Event | None] = queue.Queue()
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True, name="metric-sink")
        self._thread.start()

    def log(self, metrics: dict[str, float], step: int) -> None:
        if step <= self.skip_until:
            return
        stamp = int(time.time() * 1000)
        for key, value in metrics.items():
            self._queue.put(Metric(key, float(value), stamp, int(step)))

    def flush(self) -> None:
        """Block until everything logged so far is in the store (before a checkpoint)."""
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def _loop(self) -> None:
        pending: list[Metric] = []
        deadline = time.monotonic() + self.every
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                item = "tick"  # type: ignore[assignment]
            if item is None:
                self._send(pending)
                return
            if isinstance(item, Metric):
                pending.append(item)
            if item == "tick" or isinstance(item, threading.Event) or time.monotonic() >= deadline:
                self._send(pending)
                pending = []
                deadline = time.monotonic() + self.every
                if isinstance(item, threading.Event):
                    item.set()

    def _send(self, metrics: list[Metric]) -> None:
        for start in range(0, len(metrics), 1000):
            try:
                with _SENDING:
                    self.client.log_batch(
                        self.run_id, metrics=metrics[start : start + 1000], synchronous=True
                    )
            except Exception as err:  # keep training; report at close
                self._error = err

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"logging metrics to MLflow failed: {self._error}")


# ---------------------------------------------------------------- run lifecycle
# Runs are created by `launch` (experiments and seeds) and `sweep` (studies and trials),
# which also end them, here; training only logs metrics and artifacts into them.

ERROR_TEXT = 5000  # characters of a failure's reason kept in its tag


def end_run(
    client: MlflowClient,
    run_id: str,
    status: str,
    error: str | None = None,
    trace: str | None = None,
    tags: dict[str, str] | None = None,
) -> None:
    """End a run with MLflow `status`: the reason of a failure as its error tag, the
    traceback as an `error.txt` artifact, both with passwords masked; then `tags`."""
    if error is not None:
        client.set_tag(run_id, ERROR_TAG, redact(error)[:ERROR_TEXT])
    if trace is not None:
        from marlctl.atomic import staging

        with staging() as tmp:
            path = tmp / "error.txt"
            path.write_text(redact(trace))
            client.log_artifact(run_id, str(path))
    for key, value in (tags or {}).items():
        client.set_tag(run_id, key, value)
    client.set_terminated(run_id, status)


def artifact_location(client: MlflowClient, run_id: str, name: str) -> str:
    """Where a run's artifact is stored, as a user would open it: a path (relative to the
    working folder when inside it) for a local store, else the artifact URI."""
    from urllib.parse import unquote, urlsplit

    uri = f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{name}"
    parts = urlsplit(uri)
    if parts.scheme not in ("", "file"):
        return redact(uri)
    path = Path(unquote(parts.path))
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def reopen_run(client: MlflowClient, run_id: str) -> None:
    """A run that goes on (resumed): RUNNING again, without its last failure's reason."""
    client.update_run(run_id, status="RUNNING")
    if ERROR_TAG in client.get_run(run_id).data.tags:
        client.delete_tag(run_id, ERROR_TAG)


RUN_ID_LENGTH = 32
MIN_PREFIX = 4


def resolve_run_id(client: MlflowClient, given: str, where: str) -> str:
    """A run id, or the one run id that starts with `given` (at least 4 hex digits), in
    any experiment of the store; an unknown or ambiguous prefix is the user's error."""
    import re

    given = given.strip()
    if re.fullmatch(f"[0-9a-f]{{{RUN_ID_LENGTH}}}", given):
        return given
    if not re.fullmatch(f"[0-9a-f]{{{MIN_PREFIX},{RUN_ID_LENGTH - 1}}}", given):
        raise SpecError.at(
            where,
            f"'{given}' is not a run id or the start of one "
            f"({MIN_PREFIX} to {RUN_ID_LENGTH} hexadecimal digits)",
        )
    from mlflow.entities import ViewType

    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    found = client.search_runs(
        experiments, f"attributes.run_id LIKE '{given}%'", ViewType.ALL, max_results=10
    )
    if not found:
        raise SpecError.at(where, f"no run id starts with '{given}'")
    if len(found) > 1:
        listed = ", ".join(
            f"{r.info.run_id} ({r.info.run_name})"
            for r in sorted(found, key=lambda r: r.info.run_id)
        )
        more = " and more" if len(found) == 10 else ""
        raise SpecError.at(
            where, f"'{given}' starts {len(found)}{more} run ids: {listed}; type more of it"
        )
    return found[0].info.run_id
