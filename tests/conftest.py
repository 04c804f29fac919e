"""Shared fixtures.

Every test runs from its own empty temporary working directory (the `tmp_path` of the
test), so nothing a command writes — `mlflow.db`, `mlruns/`, checkpoints — can land in the
repository. Presets (`algos/`, `envs/`, `sweeps/`) are still found: marlctl looks next to
the spec and next to the installed package as well as in the working directory. Tests that
need the repository's files use the `repo_root` fixture (absolute paths); a test that
really needs the repository as its working directory is marked `@pytest.mark.repo_cwd`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# The suite runs tests side by side (pytest-xdist), one per core: a run's `threads_per_run:
# auto` takes one thread, as it would on a machine whose other cores are busy.
os.environ["OMP_NUM_THREADS"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "repo_cwd: run the test from the repository root instead of a temporary dir"
    )


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository checkout (the folder holding `marlctl/`, `specs/`, `algos/`...)."""
    assert (REPO_ROOT / "marlctl").is_dir(), REPO_ROOT
    return REPO_ROOT


@pytest.fixture(autouse=True)
def _working_dir(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Path:
    """Run each test from its `tmp_path` (or from the repository with `repo_cwd`)."""
    where = REPO_ROOT if request.node.get_closest_marker("repo_cwd") else tmp_path
    monkeypatch.chdir(where)
    return where


@pytest.fixture(autouse=True)
def _signal_state():
    """Commands run in-process install signal handlers (SIGTERM stops a run like Ctrl-C);
    each test starts from the handlers and signal mask the session began with."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def foreground_job() -> None:
    """`preexec_fn` for a CLI subprocess that stands for a terminal's foreground job: default
    SIGINT handling and nothing blocked, whatever the test process itself has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


_TEMPLATE: dict[str, Path] = {}


@pytest.fixture(autouse=True)
def _migrated_mlflow_store(monkeypatch: pytest.MonkeyPatch, tmp_path_factory) -> None:
    """A new SQLite MLflow store spends seconds creating and migrating its schema. Tests make
    hundreds of stores: each starts as a copy of one store migrated once per test process
    (made only when a test opens a store that does not exist yet)."""
    import shutil

    from marlctl import tracking

    original = tracking.client_for

    def client_for(uri):
        resolved = tracking.resolve_uri(uri)
        if resolved.startswith("sqlite:///"):
            target = Path(resolved[len("sqlite:///") :])
            if not target.exists() and target.parent.is_dir():
                if "db" not in _TEMPLATE:
                    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
                    original(f"sqlite:///{path}").search_experiments()
                    _TEMPLATE["db"] = path
                shutil.copyfile(_TEMPLATE["db"], target)
        return original(uri)

    monkeypatch.setattr(tracking, "client_for", client_for)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A role of the `postgres` server that needs its password: (user, password).
PASSWORD_ROLE = ("alice", "right-password")


@pytest.fixture
def postgres():
    """A PostgreSQL server in a temporary folder, as a non-root user; skipped if it cannot start."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not bins:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    pg_bin = bins[-1].parent
    pytest.importorskip("psycopg")
    base = Path(tempfile.mkdtemp(prefix="marlctl-pg-"))
    prefix: list[str] = []
    if os.getuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser to drop to the postgres user")
        shutil.chown(base, "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    data = base / "data"

    def pg(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=60)

    init = pg(str(pg_bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "marlctl", "--no-sync")
    if init.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"initdb failed: {init.stderr.strip()[:300]}")
    # One role signs in with a password (PASSWORD_ROLE); everyone else is trusted.
    hba = data / "pg_hba.conf"
    hba.write_text(f"host all {PASSWORD_ROLE[0]} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
    start = pg(
        str(pg_bin / "pg_ctl"),
        "-D",
        str(data),
        "-o",
        options,
        "-l",
        str(base / "log"),
        "-w",
        "start",
    )
    if start.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"PostgreSQL did not start: {start.stderr.strip()[:300]}")
    try:
        created = pg(
            str(pg_bin / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "marlctl", "sweeps"
        )
        assert created.returncode == 0, created.stderr
        user, password = PASSWORD_ROLE
        role = pg(
            str(pg_bin / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "marlctl",
            "-d", "sweeps", "-c", f"CREATE ROLE {user} LOGIN PASSWORD '{password}'",
        )  # fmt: skip
        assert role.returncode == 0, role.stderr
        yield f"postgresql://marlctl@127.0.0.1:{port}/sweeps"
    finally:
        pg(str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(base, ignore_errors=True)
