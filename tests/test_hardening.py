"""Hostile or careless input: exit 2 with a located message, no traceback, nothing written,
quickly; a defect anywhere: one line, exit 1, the traceback kept in a file."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from marlctl import cli

MINIMAL = "defaults:\n  - envs: simple_spread\n  - algos: mappo\n  - _self_\n"


def main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`marlctl ARGS` through the real entry point: exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["marlctl", *args])
    with pytest.raises(SystemExit) as done:
        cli.main()
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err


def rejected(monkeypatch, capsys, *args: str, seconds: float | None = None) -> str:
    """Exit 2, no traceback, nothing new in the working folder; within `seconds` where given,
    a bound far above the answer's time and far below the time the fault would take."""
    before = set(Path.cwd().iterdir())
    start = time.perf_counter()
    code, out, err = main(monkeypatch, capsys, *args)
    assert seconds is None or time.perf_counter() - start < seconds
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert set(Path.cwd().iterdir()) == before
    return err


BAD_FILES = {
    "control.yaml": (
        b"seeds: [0]\nenv:\n  id: a\x01b\n",
        "control.yaml:3: invalid YAML: character U+0001",
    ),
    "nul.yaml": (b"seeds: [0]\x00\n", "nul.yaml:1: invalid YAML: character U+0000"),
    "latin1.yaml": (b"seeds: [0]\nname: caf\xe9\n", "latin1.yaml:2: not UTF-8 text"),
    "loop.yaml": (b"a: &a [*a]\n", "loop.yaml:1: an alias refers to a node that contains it"),
    "deep.yaml": (b"a: " + b"[" * 150 + b"]" * 150 + b"\n", "deep.yaml:1: nested deeper than"),
    "deeper.yaml": (
        b"seeds: [0]\na: " + b"[" * 5000 + b"]" * 5000 + b"\n",
        "deeper.yaml:2: nested deeper than 32 levels",
    ),
    "deep.toml": (
        b"seeds = [0]\na = [\n" + b"[" * 5000 + b"]" * 5001 + b"\n",
        "deep.toml:3: nested deeper than 32 levels",
    ),
    "deep-strings.toml": (
        b"seeds = [0] # [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n"
        b'name = "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["\n'
        b"a = " + b"[" * 40 + b"]" * 40 + b"\n",
        "deep-strings.toml:3: nested deeper than 32 levels",
    ),
    "deep-table.toml": (
        b"seeds = [0]\n[" + b".".join(b"k%d" % i for i in range(40)) + b"]\nv = 1\n",
        "deep-table.toml:2: nested deeper than 32 levels",
    ),
    "empty-key.yaml": (
        b"seeds: [0]\nmodel:\n  '': 1\n",
        "empty-key.yaml:3: model: an empty key: every key needs a name",
    ),
    "empty-key.toml": (
        b'seeds = [0]\n"" = 1\n[env]\nparams = {"" = 1}\n',
        "empty-key.toml:2: an empty key: every key needs a name",
    ),
    "huge.yaml": (b"# " + b"x" * (2 << 20) + b"\n", "huge.yaml: larger than 1 MiB"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_unreadable_specs_are_located_problems(name, monkeypatch, capsys):
    content, message = BAD_FILES[name]
    Path(name).write_bytes(content)
    err = rejected(monkeypatch, capsys, "validate", name)
    assert message in err


def test_an_empty_key_anywhere_is_located(monkeypatch, capsys):
    Path("spec.toml").write_text('seeds = [0]\n[env]\nid = "x"\nparams = {"" = 1}\n')
    err = rejected(monkeypatch, capsys, "validate", "spec.toml")
    assert "spec.toml:4: env.params: an empty key: every key needs a name" in err
    Path("spec.yaml").write_text("env:\n  id: mpe/simple_spread\n'': 3\nalgo: {name: mappo}\n")
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml")
    assert err.splitlines()[0] == "spec.yaml:3: an empty key: every key needs a name"


@pytest.mark.parametrize("levels", [40, 5000])
def test_an_override_nested_too_deep_is_refused(levels, monkeypatch, capsys):
    Path("spec.yaml").write_text(MINIMAL)
    override = "+x=" + "[" * levels + "]" * levels
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", override)
    assert err.splitlines()[0] == f"<overrides>:1: {override}: nested deeper than 32 levels"


def test_a_yaml_alias_bomb_is_refused_before_it_expands(monkeypatch, capsys):
    lines = ["a: &a [" + ",".join(["x"] * 10) + "]"]
    for prev, name in zip("abcdef", "bcdefg", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]")
    Path("bomb.yaml").write_text("\n".join(lines) + "\n")
    err = rejected(monkeypatch, capsys, "validate", "bomb.yaml", seconds=20)
    assert "bomb.yaml:5: more than 100,000 values once aliases expand" in err


def test_json_output_survives_unreadable_input(monkeypatch, capsys):
    Path("nul.yaml").write_bytes(b"seeds: [0]\x00\n")
    code, out, _ = main(monkeypatch, capsys, "validate", "nul.yaml", "--json")
    document = json.loads(out)
    assert code == 2 and document["ok"] is False
    assert document["errors"] == ["nul.yaml:1: invalid YAML: character U+0000 is not allowed"]


def test_a_file_name_too_long_for_the_system(monkeypatch, capsys):
    err = rejected(monkeypatch, capsys, "validate", "x" * 300 + ".yaml")
    assert "cannot read file: File name too long" in err


def test_deleting_an_element_of_a_list_is_refused_where_it_is(monkeypatch, capsys):
    Path("spec.yaml").write_text(MINIMAL)
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", "~train.eval_every", "~seeds.0")
    assert err.splitlines()[0] == (
        "<overrides>:2: ~seeds.0: an element of a list cannot be deleted: set the whole list "
        "(seeds=[...])"
    )


def test_overrides_that_interpolate_each_other(monkeypatch, capsys):
    Path("spec.yaml").write_text(MINIMAL)
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", "+a=${b}", "+b=${a}")
    assert "<overrides>:1: a: Recursive interpolation detected" in err


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.epochs=range(0,1,0)", "algo.epochs: range() step must not be 0"),
        ("algo.epochs=range(1,100000000)", "algo.epochs: range() gives more than 100,000 values"),
    ],
)
def test_sweep_ranges_that_never_end(override, message, monkeypatch, capsys):
    Path("spec.yaml").write_text(MINIMAL)
    err = rejected(monkeypatch, capsys, "sweep", "spec.yaml", override, "--trials", "1")
    assert f"<overrides>:1: {message}" in err


def test_a_grid_step_too_fine_to_enumerate(monkeypatch, capsys):
    body = (
        MINIMAL
        + "sweep:\n  sampler: grid\n  space:\n    algo.lr: {low: 0.1, high: 0.2, step: 1.0e-300}\n"
    )
    Path("spec.yaml").write_text(body)
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml")
    assert "spec.yaml:8: sweep.space.algo.lr: the step gives more than 100,000 values" in err


def test_locations_print_literally(monkeypatch, capsys):
    """rich would print `:100:` as an emoji and obey markup or ANSI escapes in user text."""
    Path("spec.yaml").write_text(MINIMAL + "#\n" * 95 + "algo:\n  lr: -1\n")
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml")
    assert "spec.yaml:101: algo.lr: Input should be greater than 0" in err
    Path("[bold]x.yaml").write_text("seeds: [0\n")
    err = rejected(monkeypatch, capsys, "validate", "[bold]x.yaml")
    assert err.startswith("[bold]x.yaml:1: invalid YAML")
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", "algo.lr='\x1b[31mred'")
    assert "\x1b" not in err and "\\x1b[31mred" in err


@pytest.mark.parametrize("as_json", [False, True])
def test_a_defect_prints_one_line_and_keeps_the_traceback(as_json, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again

    def broken(*args, **kwargs):
        raise RuntimeError("something internal\nwith a second line")

    monkeypatch.setattr(cli.validate, "load", broken)
    Path("spec.yaml").write_text(MINIMAL)
    args = ["validate", "spec.yaml", *(["--json"] if as_json else [])]
    code, out, err = main(monkeypatch, capsys, *args)
    assert code == 1 and "Traceback" not in out + err
    (saved,) = tmp_path.glob("marlctl-*.traceback")
    text = saved.read_text()
    assert text.startswith("marlctl validate spec.yaml") and "Traceback" in text
    assert "RuntimeError: something internal" in text
    if as_json:
        document = json.loads(out)
        assert document["ok"] is False and document["exit_code"] == 1
        assert document["errors"] == ["RuntimeError: something internal with a second line"]
        assert document["traceback"] == str(saved)
    else:
        assert err.splitlines() == [
            "internal error: RuntimeError: something internal with a second line",
            f"the traceback is in {saved}",
        ]


@pytest.mark.parametrize(
    "override, message",
    [
        ("seeds=[-1]", "seeds.0: Input should be greater than or equal to 0"),
        ("seeds=[18446744073709551616]", "seeds.0: Input should be less than or equal to"),
        ("train.total_env_steps=true", "train.total_env_steps: must be a number, not true"),
        ("train.total_env_steps=1e26", "train.total_env_steps: "),
        ("algo.lr=false", "algo.lr: must be a number, not false"),
        ("tracking.uri='::::'", "tracking.uri: must be an MLflow database or server URI"),
        ("env.params.max_cycles=[[1]]", "env.params: env 'mpe/simple_spread' rejected its params"),
    ],
)
def test_values_that_would_only_fail_once_running(override, message, monkeypatch, capsys):
    Path("spec.yaml").write_text(MINIMAL)
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", override)
    assert f"<overrides>:1: {message}" in err


def test_an_env_too_large_to_build_quickly_is_refused(monkeypatch, capsys):
    from marlctl.envs import probe

    monkeypatch.setattr(probe, "PROBE_SECONDS", 0.5)
    Path("spec.yaml").write_text(MINIMAL)
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", "env.params.N=3000")
    assert "env.params: building, resetting and stepping env 'mpe/simple_spread' once took" in err


def test_passwords_in_errors_are_masked(monkeypatch, capsys):
    Path("spec.yaml").write_text(MINIMAL)
    uri = "tracking.uri='pgsql://alice:hunter2@db.example/runs'"
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", uri)
    assert "hunter2" not in err and "alice:***@db.example" in err
    code, out, _ = main(monkeypatch, capsys, "validate", "spec.yaml", uri, "--json")
    assert code == 2 and "hunter2" not in out and "alice:***@" in out


@pytest.mark.parametrize(
    "override, message",
    [
        ("+x=${oc.env:HOME}", "x: resolvers such as ${oc.env:...} are not allowed"),
        ("hydra.job.name=x", "hydra.job.name=x: Hydra's own settings do not apply"),
        ("algos=../../elsewhere/x", "algos=../../elsewhere/x: '../../elsewhere/x' is not a preset"),
    ],
)
def test_a_spec_reads_nothing_from_outside(override, message, monkeypatch, capsys):
    monkeypatch.setenv("HOME", "/home/secret-name")
    Path("spec.yaml").write_text(MINIMAL)
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", override)
    assert f"<overrides>:1: {message}" in err and "secret-name" not in err


def test_spec_files_read_nothing_from_outside(monkeypatch, capsys):
    Path("env.yaml").write_text(MINIMAL + "name: ${oc.env:HOME}\n")
    err = rejected(monkeypatch, capsys, "validate", "env.yaml")
    assert "env.yaml:5: name: resolvers such as ${oc.env:...} are not allowed" in err
    Path("hydra.yaml").write_text(MINIMAL + "hydra:\n  run: {dir: /tmp}\n")
    err = rejected(monkeypatch, capsys, "validate", "hydra.yaml")
    assert "hydra.yaml:5: hydra: Hydra's own settings do not apply" in err
    Path("path.yaml").write_text(MINIMAL.replace("algos: mappo", "algos: ../../x"))
    err = rejected(monkeypatch, capsys, "validate", "path.yaml")
    assert "path.yaml:3: defaults.algos: '../../x' is not a preset name" in err


def test_no_password_reaches_the_tracking_store(tmp_path):
    from mlflow.entities import Param, RunTag

    from marlctl import tracking
    from marlctl.launch import SPEC_ARTIFACT, log_spec

    url = "postgresql://alice:hunter2@db.example/runs"
    client = tracking.client_for(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = tracking.ensure_experiment(client, "secrets", None)
    run_id = client.create_run(experiment, tags={"origin": url}).info.run_id
    client.set_tag(run_id, "marlctl.error", f"could not connect to {url}")
    client.log_param(run_id, "storage", url)
    client.log_batch(run_id, params=[Param("tracking.uri", url)], tags=[RunTag("t", url)])
    log_spec(client, run_id, {"tracking": {"uri": url}, "seeds": [0]})
    run = client.get_run(run_id)
    stored = [*run.data.params.values(), *run.data.tags.values()]
    stored.append(Path(client.download_artifacts(run_id, SPEC_ARTIFACT, str(tmp_path))).read_text())
    assert not any("hunter2" in text for text in stored)
    assert sum("alice:***@db.example" in text for text in stored) == 6


def test_eval_runs_no_factory_named_by_a_stored_spec_unless_trusted(monkeypatch, capsys):
    Path("spec.yaml").write_text(
        "env: {id: 'toy_envs:constant_reward', params: {max_cycles: 5}}\n"
        "algo: {name: mappo, rollout_steps: 5, epochs: 1}\n"
        "train: {total_env_steps: 200, eval_every: 0, eval_episodes: 2, checkpoint_every: 0}\n"
        "hardware: {num_envs: 2, device: cpu}\n"
    )
    code, out, err = main(monkeypatch, capsys, "run", "spec.yaml", "--json")
    assert code == 0, err
    run_id = json.loads(out)["runs"][0]["run_id"]
    import toy_envs

    calls, factory = [], toy_envs.constant_reward
    monkeypatch.setattr(toy_envs, "constant_reward", lambda **p: calls.append(p))
    code, out, _ = main(monkeypatch, capsys, "eval", run_id, "--json")
    (message,) = json.loads(out)["errors"]
    assert code == 2 and calls == []  # refused before importing or calling anything
    assert "names the env factory 'toy_envs:constant_reward'" in message
    monkeypatch.setattr(toy_envs, "constant_reward", factory)
    monkeypatch.setenv("MARLCTL_TRUSTED_FACTORIES", "")
    trusted = ["--trust-factory", "toy_envs:constant_reward", "--json"]
    code, out, err = main(monkeypatch, capsys, "eval", run_id, *trusted)
    assert code == 0 and json.loads(out)["runs"][0]["episodes"] == 2, out + err


def test_reading_commands_create_no_store(monkeypatch, capsys):
    for args in (["eval", "0123456789abcdef"], ["run", "--resume", "0123456789abcdef"]):
        err = rejected(monkeypatch, capsys, *args)
        assert "mlflow.db: no MLflow store at" in err


def test_a_study_name_cannot_place_best_yaml_elsewhere():
    from marlctl.sweep.records import _file_name

    assert _file_name("x/../../../../tmp/escaped") == "x_.._.._.._.._tmp_escaped"
    assert _file_name("../up") == "_up" and _file_name("..") == "study"
    assert _file_name("spread_mappo-v2.1") == "spread_mappo-v2.1"


def test_a_thousand_bad_overrides_are_summed_up_in_a_screenful(monkeypatch, capsys):
    Path("spec.yaml").write_text(MINIMAL)
    unknown = [f"algo.nokey{i}={i}" for i in range(1000)]
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", *unknown)
    assert err.splitlines()[-1] == "1000 problems; nothing was run."
    assert "<overrides>:50: algo.nokey49: unknown key" in err and "... and 950 more" in err
    dangling = [f"+x{i}=${{y{i}}}" for i in range(300)]
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", *dangling)
    assert "<overrides>: stopped after 10 overrides that do not apply" in err


def _unknown_keys(count: int) -> str:
    return MINIMAL + "".join(f"nokey{i}: {i}\n" for i in range(count))


def test_thousands_of_problems_print_a_screenful(monkeypatch, capsys):
    Path("spec.yaml").write_text(_unknown_keys(5000))
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml")
    lines = err.splitlines()
    assert len(lines) == 52 and lines[0].startswith("spec.yaml:5: nokey0: unknown key")
    assert lines[-2:] == [
        "... and 4,950 more (--json lists them all)",
        "5000 problems; nothing was run.",
    ]
    code, out, _ = main(monkeypatch, capsys, "validate", "spec.yaml", "--json")
    assert code == 2 and len(json.loads(out)["errors"]) == 5000


def test_checking_a_spec_takes_time_in_proportion_to_its_keys():
    """Eight times the unknown keys may take about eight times as long, never the square."""
    from marlctl.errors import SpecError
    from marlctl.spec import load_spec

    def seconds(count: int) -> float:
        Path("spec.yaml").write_text(_unknown_keys(count))
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            with pytest.raises(SpecError) as raised:
                load_spec("spec.yaml")
            best = min(best, time.perf_counter() - start)
        assert len(raised.value.problems) == count
        return best

    seconds(10)  # imports and first compositions out of the way
    assert seconds(4000) < 24 * seconds(500)


def test_staging_folders_of_killed_processes_are_removed(monkeypatch, tmp_path):
    import subprocess
    import tempfile

    from marlctl.atomic import STAGING_PREFIX, remove_stale_staging, staging

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    pid = int(dead.stdout)
    stale = tmp_path / f"{STAGING_PREFIX}{pid}-abc"
    (stale / "checkpoints").mkdir(parents=True)
    (stale / "checkpoints" / "latest.pt").write_bytes(b"x" * 1000)
    with staging() as mine:
        assert mine.parent == tmp_path and mine.name.startswith(f"{STAGING_PREFIX}{os.getpid()}-")
        assert remove_stale_staging() == 1
        assert not stale.exists() and mine.exists()  # a running process keeps its own
    assert not mine.exists()


TINY_RUN = MINIMAL + (
    "env: {backend: native, params: {N: 2, max_cycles: 10}}\n"
    "train: {total_env_steps: 400, eval_every: 0, eval_episodes: 2, checkpoint_every: 0}\n"
    "hardware: {num_envs: 4, device: cpu}\n"
)


def test_an_unreachable_store_is_named_at_once(monkeypatch, capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    Path("spec.yaml").write_text(TINY_RUN)
    uri = f"tracking.uri='postgresql://alice:hunter2@127.0.0.1:{port}/runs'"
    err = rejected(monkeypatch, capsys, "run", "spec.yaml", uri, seconds=60)
    assert (
        f"tracking.uri: cannot use the MLflow store postgresql://alice:***@127.0.0.1:{port}" in err
    )
    assert "hunter2" not in err


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_tracking_server_that_does_not_answer_is_named_at_its_line(monkeypatch, capsys):
    port = _closed_port()
    Path("spec.yaml").write_text(
        TINY_RUN + f"tracking: {{uri: 'http://alice:hunter2@127.0.0.1:{port}/'}}\n"
    )
    for command in (["validate"], ["run", "--dry-run"], ["run"]):
        err = rejected(monkeypatch, capsys, *command, "spec.yaml")
        assert err.splitlines()[0] == (
            f"spec.yaml:8: tracking.uri: no MLflow server answers at "
            f"http://alice:***@127.0.0.1:{port}/ (connection refused)"
        )
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml", "train.eval_every=1000")
    assert "2 problems" in err  # reported with the spec's other problems


@pytest.fixture
def http_server():
    """A local HTTP server on a free port, answering every request with `status`."""
    import http.server
    import threading

    answers = {"status": 404, "paths": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            answers["paths"].append(self.path)
            self.send_response(answers["status"])
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], answers
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status", [200, 404, 500])
def test_a_tracking_server_that_answers_passes(status, http_server, monkeypatch, capsys):
    port, answers = http_server
    answers["status"] = status
    Path("spec.yaml").write_text(TINY_RUN + f"tracking: {{uri: 'http://127.0.0.1:{port}/ml'}}\n")
    code, _, err = main(monkeypatch, capsys, "validate", "spec.yaml")
    assert code == 0, err
    assert answers["paths"] == ["/ml/health"]


def test_a_tracking_server_that_accepts_but_never_answers_is_named(monkeypatch, capsys):
    import socket

    from marlctl import servers

    monkeypatch.setattr(servers, "ANSWER_SECONDS", 0.3)
    with socket.socket() as listening:  # connections queue up; nothing reads them
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        port = listening.getsockname()[1]
        Path("spec.yaml").write_text(TINY_RUN + f"tracking: {{uri: 'http://127.0.0.1:{port}'}}\n")
        err = rejected(monkeypatch, capsys, "validate", "spec.yaml")
    assert (
        f"spec.yaml:8: tracking.uri: no MLflow server answers at http://127.0.0.1:{port} "
        "(no answer within 0.3 s)" in err
    )


def test_a_missing_postgresql_database_is_named_at_once(postgres, monkeypatch, capsys):
    Path("spec.yaml").write_text(TINY_RUN)
    missing = postgres.rsplit("/", 1)[0] + "/no_such_db"
    err = rejected(monkeypatch, capsys, "run", "spec.yaml", f"tracking.uri='{missing}'")
    assert f"tracking.uri: cannot use the MLflow store {missing}" in err
    assert 'database "no_such_db" does not exist' in err


def test_a_wrong_postgresql_password_is_named_at_once(postgres, monkeypatch, capsys):
    Path("spec.yaml").write_text(TINY_RUN)
    server = postgres.split("@", 1)[1]
    wrong = f"postgresql://alice:not-the-password@{server}"
    err = rejected(monkeypatch, capsys, "run", "spec.yaml", f"tracking.uri='{wrong}'")
    assert f"tracking.uri: cannot use the MLflow store postgresql://alice:***@{server}" in err
    assert 'password authentication failed for user "alice"' in err
    assert "not-the-password" not in err


def test_two_runs_started_together_in_a_fresh_folder_both_record(tmp_path):
    import subprocess

    Path("spec.yaml").write_text(TINY_RUN)
    temp = tmp_path / "temp"  # the runs' temp dir: left as it was found
    temp.mkdir()
    command = [sys.executable, "-m", "marlctl", "run", "spec.yaml", "--json"]
    runs = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TMPDIR": str(temp)},
        )
        for _ in range(2)
    ]
    outcomes = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outcomes
    parents = {json.loads(out)["parent_run_id"] for out, _ in outcomes}
    assert len(parents) == 2
    assert list(temp.iterdir()) == []
    assert Path(".mlflow.db.lock").is_file()  # the store's lock stays beside it


def test_passwords_are_masked_whole_wherever_they_stand():
    from marlctl.redact import redact, shown_url

    text = "could not reach postgresql://alice:p@ss:w0rd@db.example:5432/runs; retrying"
    assert redact(text) == "could not reach postgresql://alice:***@db.example:5432/runs; retrying"
    assert shown_url("mysql+pymysql://bob:s3cret@db/x?ssl=1") == "mysql+pymysql://bob@db/x?ssl=1"
    assert redact("sqlite:///runs/mlflow.db and http://host/x") == (
        "sqlite:///runs/mlflow.db and http://host/x"
    )


@pytest.fixture
def read_only_folder(tmp_path):
    """A working folder that takes no writes, holding a spec."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    (folder / "spec.yaml").write_text(TINY_RUN)
    yield from _read_only(folder)


@pytest.fixture
def read_only_store(tmp_path):
    """A folder that takes no writes, holding an MLflow store made elsewhere (no lock file)."""
    from marlctl import tracking

    folder = tmp_path / "store"
    folder.mkdir()
    client = tracking.client_for(f"sqlite:///{folder / 'mlflow.db'}")
    run = client.create_run(tracking.ensure_experiment(client, "kept", None))
    client.log_metric(run.info.run_id, "eval/return_mean", 1.5)
    (folder / ".mlflow.db.lock").unlink()
    yield from _read_only(folder)


def _read_only(folder: Path):
    """`folder` read-only while the caller uses it: mode 555, or for root (whom modes do not
    stop) the immutable attribute of ext4 and xfs."""
    import subprocess

    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"no read-only folder here: chattr +i failed ({done.stderr.strip()})")
        undo = ["chattr", "-i", str(folder)]
    else:
        folder.chmod(0o555)
        undo = ["chmod", "755", str(folder)]
    try:
        try:
            (folder / "probe").touch()
        except OSError:
            yield folder
        else:
            pytest.skip("this file system lets the folder be written anyway")
    finally:
        subprocess.run(undo, check=True)


@pytest.fixture
def full_folder(tmp_path):
    """A working folder on a 256 KiB file system that is full (tmpfs; needs root)."""
    import subprocess

    folder = tmp_path / "full"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)]
    done = subprocess.run(mount, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"no small file system to fill here: mount failed ({done.stderr.strip()})")
    try:
        (folder / "spec.yaml").write_text(TINY_RUN)
        with open(folder / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass
        yield folder
    finally:
        os.chdir(tmp_path)
        subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_working_folder_is_named_at_once(read_only_folder, monkeypatch, capsys):
    monkeypatch.chdir(read_only_folder)
    err = rejected(monkeypatch, capsys, "run", "spec.yaml", seconds=60)
    assert f"mlflow.db: cannot use the MLflow store sqlite:///{read_only_folder}/mlflow.db" in err
    assert f"cannot write in {read_only_folder}" in err
    sweep = ("sweep", "spec.yaml", "algo.lr=0.001,0.0003", "--trials", "1")
    assert "cannot write in" in rejected(monkeypatch, capsys, *sweep, seconds=60)


def test_a_store_in_a_read_only_folder_can_be_read(read_only_store):
    from marlctl import tracking

    client = tracking.client_for(f"sqlite:///{read_only_store / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("kept").experiment_id])
    assert run.data.metrics == {"eval/return_mean": 1.5}


def test_a_full_disk_at_start_is_named_at_once(full_folder, monkeypatch, capsys):
    monkeypatch.chdir(full_folder)
    err = rejected(monkeypatch, capsys, "run", "spec.yaml", seconds=60)
    assert f"cannot write in {full_folder}: No space left on device" in err


def test_the_probe_time_limit_holds_when_env_code_swallows_the_first_timeout():
    """An env whose code catches exceptions broadly (a `try/except Exception` around an
    attribute lookup) must not swallow the time limit and then build on for minutes."""
    import time

    from marlctl.envs.probe import ProbeTimeout, time_limit

    swallowed = []
    start = time.perf_counter()
    with pytest.raises(ProbeTimeout, match="building x took longer than 0.2 s"):
        with time_limit(0.2, "building x"):
            try:
                time.sleep(30)  # the first alarm lands here...
            except Exception as err:  # ...in the env's broad except
                swallowed.append(err)
            while time.perf_counter() - start < 30:  # and the build goes on
                sum(range(10_000))
    assert len(swallowed) == 1 and time.perf_counter() - start < 10
    # A block that swallows every alarm still ends in the timeout, once it returns.
    start = time.perf_counter()
    with pytest.raises(ProbeTimeout):
        with time_limit(0.1, "building y"):
            while time.perf_counter() - start < 0.5:
                try:
                    sum(range(10_000))
                except Exception:
                    pass


STDLIB_CODE = {
    "os:system": "params: {command: 'touch made-by-os-system'}",
    "subprocess:run": "params: {args: ['touch', 'made-by-subprocess']}",
    "builtins:exec": "params: {}",
    "sys:exit": "params: {}",
    "os.path:join": "params: {}",
    "__main__:main": "params: {}",
}


@pytest.mark.parametrize("factory", sorted(STDLIB_CODE))
def test_a_spec_names_no_standard_library_code(factory, monkeypatch, capsys):
    import subprocess

    calls = []
    monkeypatch.setattr(os, "system", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(sys, "exit", lambda *a, **k: calls.append(a))
    Path("spec.yaml").write_text(
        f"env:\n  id: '{factory}'\n  {STDLIB_CODE[factory]}\nalgo: {{name: mappo}}\n"
    )
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml")
    top = factory.split(".")[0].split(":")[0]
    assert f"spec.yaml:2: env.id: '{factory}' is in Python's standard library ('{top}')" in err
    assert calls == [] and err.count("\n") == 2


def test_a_scripted_policy_names_no_standard_library_code(monkeypatch, capsys):
    Path("spec.yaml").write_text(
        "defaults: [{envs: simple_tag}, {algos: mappo}, _self_]\n"
        "groups:\n  agent: {scripted: 'builtins:exec'}\n"
    )
    err = rejected(monkeypatch, capsys, "validate", "spec.yaml")
    assert "spec.yaml:3: groups.agent.scripted: 'builtins:exec' is in Python's standard" in err


FACTORIES = """
import os, signal, sys, time
from mpe2 import simple_spread_v3

class Odd(BaseException):
    pass

def exits(**params):
    sys.exit(0)

def interrupts(**params):
    raise KeyboardInterrupt

def odd(**params):
    raise Odd("not an Exception")

def ctrl_c(**params):  # the user's Ctrl-C arriving while the env is built
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)
    return simple_spread_v3.parallel_env()
"""


@pytest.mark.parametrize(
    "factory, message",
    [
        ("user_factories:exits", "SystemExit: 0 (it tried to end the process)"),
        ("user_factories:interrupts", "KeyboardInterrupt"),
        ("user_factories:odd", "Odd: not an Exception"),
        ("exits_on_import:make", "SystemExit: 3 (it tried to end the process)"),
    ],
)
def test_a_factory_that_ends_the_process_is_its_own_failure(
    factory, message, monkeypatch, capsys, tmp_path
):
    folder = tmp_path.parent / f"{tmp_path.name}-code"  # not the working folder: no file added
    folder.mkdir()
    (folder / "user_factories.py").write_text(FACTORIES)
    (folder / "exits_on_import.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(folder))
    Path("spec.yaml").write_text(f"env: {{id: '{factory}'}}\nalgo: {{name: mappo}}\n")
    for command in (["validate"], ["run", "--dry-run"]):
        err = rejected(monkeypatch, capsys, *command, "spec.yaml")
        assert f"spec.yaml:1: env: building env '{factory}' failed: {message}\n" in err
    sys.modules.pop(factory.split(":")[0], None)


def test_ctrl_c_while_a_factory_runs_still_interrupts(monkeypatch, capsys, tmp_path):
    folder = tmp_path.parent / f"{tmp_path.name}-code"
    folder.mkdir()
    (folder / "user_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(folder))
    Path("spec.yaml").write_text("env: {id: 'user_factories:ctrl_c'}\nalgo: {name: mappo}\n")
    # Python's own Ctrl-C handling, as a fresh `marlctl` process has it, whatever an earlier
    # in-process run of this worker left (the fixture `_signal_state` puts it back).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    start = time.perf_counter()
    code, _, err = main(monkeypatch, capsys, "validate", "spec.yaml")
    assert code == 130 and "Traceback" not in err and time.perf_counter() - start < 30
    sys.modules.pop("user_factories", None)


def test_a_scripted_policy_that_ends_the_process_on_import_is_its_failure(monkeypatch, tmp_path):
    from marlctl.train.opponents import import_policy

    (tmp_path / "exiting_policy.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"importing 'exiting_policy:act' raised SystemExit: 0"):
        import_policy("exiting_policy:act")
    with pytest.raises(ValueError, match="'os:system' is in Python's standard library"):
        import_policy("os:system")
