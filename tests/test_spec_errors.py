"""Every bad spec or override is reported as `FILE:LINE: key.path: message`, exit 2, no traceback.

These tests only validate and compile plans; nothing trains, nothing imports torch.
They run from a temporary working directory (see conftest.py), so spec files are written
there and passed by their relative name: FILE in a problem line is the path as given on the
command line; for overrides it is `<overrides>` and LINE is the override's position.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marlctl.cli import app
from marlctl.plan import visible_cuda_devices

REPO_ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted(p for ext in ("yaml", "yml", "toml") for p in (REPO_ROOT / "specs").glob(f"*.{ext}"))
GPUS = visible_cuda_devices()

runner = CliRunner()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def invoke(*args: str):
    return runner.invoke(app, list(args))


def assert_clean_exit(result, code: int) -> None:
    """Exit `code` through typer.Exit, with no traceback anywhere in the output."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception),
        result.output,
    )
    assert "Traceback" not in result.output, result.output


def problem_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def find_problem(output: str, head: str, fragment: str) -> int:
    """Index of the output line `HEAD MESSAGE` whose message contains `fragment`."""
    for index, line in enumerate(problem_lines(output)):
        if line.startswith(head + " ") and fragment in line[len(head) :]:
            return index
    raise AssertionError(f"no line '{head} ...{fragment}...' in output:\n{output}")


# A valid spec without presets; cases below break one thing at a time.
BASE = """
env:
  id: mpe/simple_spread
algo:
  name: mappo
train:
  total_env_steps: 1000
  eval_every: 500
"""

WITH_PRESETS = """
defaults:
  - envs: simple_spread
  - algos: mappo
  - _self_
seeds: [0, 1]
train:
  total_env_steps: 1000
  eval_every: 500
"""


@dataclass(frozen=True)
class Case:
    """Files to write (relative to tmp_path), the arguments, the expected problem line."""

    files: dict[str, str]
    head: str  # "FILE:LINE: key.path:" (or "FILE:LINE:" / "FILE:" without a key path)
    fragment: str  # must appear in the message after `head`
    spec: str = "spec.yaml"
    overrides: tuple[str, ...] = ()
    also: tuple[str, ...] = field(default=())  # further fragments of the same line


CASES = {
    # ------------------------------------------------------------- schema (YAML)
    "unknown-top-level-key": Case(
        {
            "spec.yaml": """
            seedz: [0, 1]
            env:
              id: mpe/simple_spread
            algo:
              name: mappo
            """
        },
        "spec.yaml:1: seedz:",
        "unknown key; did you mean 'seeds'?",
    ),
    "unknown-nested-key": Case(
        {
            "spec.yaml": """
            env:
              id: mpe/simple_spread
            algo:
              name: mappo
              lrr: 0.001
            """
        },
        "spec.yaml:5: algo.lrr:",
        "unknown key; did you mean 'lr'?",
    ),
    "wrong-type": Case(
        {
            "spec.yaml": """
            env:
              id: mpe/simple_spread
            algo:
              name: mappo
              epochs: ten
            """
        },
        "spec.yaml:5: algo.epochs:",
        "Input should be a valid integer",
        also=("(got 'ten')",),
    ),
    "list-where-scalar-given": Case(
        {"spec.yaml": BASE + "model:\n  hidden: 64\n"},
        "spec.yaml:9: model.hidden:",
        "Input should be a valid list",
        also=("(got 64)",),
    ),
    "out-of-range": Case(
        {
            "spec.yaml": """
            env:
              id: mpe/simple_spread
            algo:
              name: mappo
              clip: 2.0
            """
        },
        "spec.yaml:5: algo.clip:",
        "Input should be less than or equal to 1 (got 2.0)",
    ),
    "negative-hidden-size-in-list": Case(
        {"spec.yaml": BASE + "model:\n  hidden:\n    - 64\n    - -3\n"},
        "spec.yaml:11: model.hidden.1:",
        "Input should be greater than or equal to 1 (got -3)",
    ),
    "bad-device-string": Case(
        {"spec.yaml": BASE + "hardware:\n  device: gpu\n"},
        "spec.yaml:9: hardware.device:",
        "must be auto, cpu, cuda or cuda:N (got 'gpu')",
    ),
    "unknown-algo": Case(
        {
            "spec.yaml": """
            env:
              id: mpe/simple_spread
            algo:
              name: mapo
            """
        },
        "spec.yaml:4: algo.name:",
        "unknown algorithm 'mapo'; did you mean 'mappo'?",
    ),
    "missing-env-id": Case(
        {
            "spec.yaml": """
            seeds: [0]
            algo:
              name: mappo
            env:
              backend: pettingzoo
            """
        },
        "spec.yaml:4: env.id:",
        "required",
    ),
    "duplicate-seeds": Case(
        {"spec.yaml": "seeds: [0, 1, 1]\n" + BASE},
        "spec.yaml:1: seeds:",
        "seeds must be distinct (got [0, 1, 1])",
    ),
    "top-level-not-a-mapping": Case(
        {"spec.yaml": "- env\n- algo\n"}, "spec.yaml:1:", "the top level must be a mapping of keys"
    ),
    "defaults-not-a-list": Case(
        {"spec.yaml": "defaults: 5\n" + BASE}, "spec.yaml:1: defaults:", "must be a list"
    ),
    # ------------------------------------------------------------- file format
    "malformed-yaml": Case(
        {
            "spec.yaml": """
            env:
              id: mpe/simple_spread
                backend: pettingzoo
            algo:
              name: mappo
            """
        },
        "spec.yaml:3:",
        "invalid YAML: mapping values are not allowed here",
    ),
    "duplicate-yaml-key": Case(
        {
            "spec.yaml": """
            env:
              id: mpe/simple_spread
            algo:
              name: mappo
              lr: 0.001
              lr: 0.002
            """
        },
        "spec.yaml:6: algo.lr:",
        "duplicate key",
    ),
    "malformed-toml": Case(
        {
            "spec.toml": """
            seeds = [0, 1]
            [env]
            id = mpe/simple_spread
            """
        },
        "spec.toml:3:",
        "invalid TOML: Invalid value",
        spec="spec.toml",
    ),
    "duplicate-toml-key": Case(
        {
            "spec.toml": """
            [env]
            id = "mpe/simple_spread"
            [algo]
            name = "mappo"
            lr = 0.1
            lr = 0.2
            """
        },
        "spec.toml:6:",
        "invalid TOML: Cannot overwrite a value",
        spec="spec.toml",
    ),
    "missing-file": Case({}, "missing.yaml:", "no such file", spec="missing.yaml"),
    "wrong-extension": Case(
        {"spec.json": '{"env": {"id": "mpe/simple_spread"}}\n'},
        "spec.json:",
        "spec must be a .yaml, .yml or .toml file",
        spec="spec.json",
    ),
    # ------------------------------------------------------------- schema (TOML)
    "toml-unknown-nested-key": Case(
        {
            "spec.toml": """
            seeds = [0, 1]
            [env]
            id = "mpe/simple_spread"
            [algo]
            name = "mappo"
            lrr = 0.1
            """
        },
        "spec.toml:6: algo.lrr:",
        "unknown key; did you mean 'lr'?",
        spec="spec.toml",
    ),
    "toml-out-of-range": Case(
        {
            "spec.toml": """
            [env]
            id = "mpe/simple_spread"
            [algo]
            name = "mappo"
            [hardware]
            num_envs = 0
            """
        },
        "spec.toml:6: hardware.num_envs:",
        "Input should be greater than or equal to 1 (got 0)",
        spec="spec.toml",
    ),
    "toml-inline-table-and-dotted-key": Case(
        {
            "spec.toml": """
            seeds = [0, 1]
            env.id = "mpe/simple_spread"
            algo = {name = "mappo", clip = 3.0}
            model.hidden = [64, 0]
            """
        },
        "spec.toml:4: model.hidden.1:",
        "Input should be greater than or equal to 1 (got 0)",
        spec="spec.toml",
    ),
    "toml-duplicate-seeds-with-presets": Case(
        {
            "spec.toml": """
            defaults = [{envs = "simple_spread"}, {algos = "mappo"}, "_self_"]
            seeds = [3, 3]
            [train]
            total_env_steps = 1000
            eval_every = 500
            """
        },
        "spec.toml:2: seeds:",
        "seeds must be distinct (got [3, 3])",
        spec="spec.toml",
    ),
    # ------------------------------------------------------------- env (probed)
    "unknown-env-id": Case(
        {
            "spec.yaml": """
            env:
              id: mpe/simple_spred
            algo:
              name: mappo
            """
        },
        "spec.yaml:2: env.id:",
        "unknown env 'mpe/simple_spred'",
        also=("did you mean 'mpe/simple_spread'?",),
    ),
    "env-factory-not-importable": Case(
        {
            "spec.yaml": """
            env:
              id: nosuchpkg.envs:make_env
            algo:
              name: mappo
            """
        },
        "spec.yaml:2: env.id:",
        "cannot import 'nosuchpkg.envs' for env 'nosuchpkg.envs:make_env'",
        also=("No module named 'nosuchpkg'",),
    ),
    "env-factory-missing-attribute": Case(
        {
            "spec.yaml": """
            env:
              id: marlctl.errors:no_such_factory
            algo:
              name: mappo
            """
        },
        "spec.yaml:2: env.id:",
        "'marlctl.errors' has no attribute 'no_such_factory'",
    ),
    "env-params-rejected": Case(
        {
            "spec.yaml": """
            env:
              id: mpe/simple_spread
              params:
                foo: 1
            algo:
              name: mappo
            """
        },
        "spec.yaml:4: env.params.foo:",
        "not a parameter of env 'mpe/simple_spread'; its parameters: N, ",
    ),
    # ------------------------------------------------------------- plan (cross-field, machine)
    "eval-every-exceeds-budget": Case(
        {
            "spec.yaml": """
            env:
              id: mpe/simple_spread
            algo:
              name: mappo
            train:
              total_env_steps: 1000
              eval_every: 5000
            """
        },
        "spec.yaml:7: train.eval_every:",
        "5000 exceeds train.total_env_steps=1000",
    ),
    "env-workers-exceed-num-envs": Case(
        {"spec.yaml": BASE + "hardware:\n  num_envs: 2\n  env_workers: 4\n"},
        "spec.yaml:10: hardware.env_workers:",
        "4 workers for hardware.num_envs=2 environments",
    ),
    "tf32-on-the-cpu": Case(
        {"spec.yaml": BASE + "hardware:\n  device: cpu\n  tf32: true\n"},
        "spec.yaml:10: hardware.tf32:",
        "TF32 is a precision of CUDA devices and this run trains on the CPU",
    ),
    "cuda-ordinal-beyond-visible-devices": Case(
        {"spec.yaml": BASE + "hardware:\n  device: cuda:99\n"},
        "spec.yaml:9: hardware.device:",
        f"cuda:99 requested but this machine has {GPUS} visible CUDA device(s)",
    ),
    "cuda-device-pool-entry": Case(
        {"spec.yaml": BASE + "hardware:\n  devices:\n    - cpu\n    - cuda:99\n"},
        "spec.yaml:11: hardware.devices.1:",
        f"cuda:99 requested but this machine has {GPUS} visible CUDA device(s)",
    ),
    "unknown-group-in-sharing": Case(
        {"spec.yaml": BASE + "model:\n  sharing: {agentz: independent}\n"},
        "spec.yaml:9: model.sharing.agentz:",
        "no agent group 'agentz' in env",
    ),
    "unknown-sharing-mode": Case(
        {"spec.yaml": BASE + "model:\n  sharing: pooled\n"},
        "spec.yaml:9: model.sharing:",
        "shared",
    ),
    # ------------------------------------------------------------- presets (defaults:)
    "preset-does-not-exist": Case(
        {
            "spec.yaml": """
            defaults:
              - algos: nope
              - _self_
            env:
              id: mpe/simple_spread
            """
        },
        "spec.yaml:2: defaults.0:",
        "no preset 'nope' in algos/",
    ),
    "error-inside-a-preset-file": Case(
        {
            "spec.yaml": WITH_PRESETS.replace("algos: mappo", "algos: mine"),
            "algos/mine.yaml": "# @package algo\nname: mappo\nclipp: 0.1\n",
        },
        "{tmp}/algos/mine.yaml:3: algo.clipp:",
        "unknown key; did you mean 'clip'?",
    ),
    # ------------------------------------------------------------- overrides
    "bad-override-syntax": Case(
        {"spec.yaml": BASE},
        "<overrides>:2: seeds=[0,1:",
        "bad override",
        overrides=("algo.lr=0.001", "seeds=[0,1"),
    ),
    "override-unknown-key": Case(
        {"spec.yaml": BASE},
        "<overrides>:1: algo.lrr:",
        "unknown key; did you mean 'lr'?",
        overrides=("algo.lrr=1",),
    ),
    "override-unknown-top-level-key": Case(
        {"spec.yaml": BASE},
        "<overrides>:1: seedz:",
        "unknown key; did you mean 'seeds'?",
        overrides=("seedz=[0]",),
    ),
    "override-of-a-field-under-a-section-the-file-leaves-out": Case(
        {"spec.yaml": BASE},
        "<overrides>:1: groups.agent.scripted:",
        "not in the spec; to add it write +groups.agent.scripted=...",
        overrides=("groups.agent.scripted=random",),
    ),
    "override-bad-value": Case(
        {"spec.yaml": BASE},
        "<overrides>:1: algo.lr:",
        "Input should be a valid number",
        overrides=("algo.lr=abc",),
        also=("(got 'abc')",),
    ),
    "override-out-of-range-second": Case(
        {"spec.yaml": BASE},
        "<overrides>:2: algo.clip:",
        "Input should be less than or equal to 1 (got 5)",
        overrides=("seeds=[0,1]", "algo.clip=5"),
    ),
    "override-bad-device": Case(
        {"spec.yaml": BASE},
        "<overrides>:1: hardware.device:",
        "must be auto, cpu, cuda or cuda:N",
        overrides=("hardware.device=gpu",),
    ),
    "override-eval-every": Case(
        {"spec.yaml": BASE},
        "<overrides>:1: train.eval_every:",
        "5000 exceeds train.total_env_steps=1000",
        overrides=("train.eval_every=5000",),
    ),
    "override-unknown-algo": Case(
        {"spec.yaml": BASE},
        "<overrides>:1: algo.name:",
        "unknown algorithm 'nope'",
        overrides=("algo.name=nope",),
    ),
    "override-env-params-rejected": Case(
        {"spec.yaml": WITH_PRESETS},
        "<overrides>:1: env.params.foo:",
        "not a parameter of env 'mpe/simple_spread'",
        overrides=("+env.params.foo=1",),
    ),
    "override-misspelt-preset": Case(
        {"spec.yaml": WITH_PRESETS},
        "<overrides>:1: algos:",
        "no preset 'mapo' in algos/; did you mean 'mappo'?",
        overrides=("algos=mapo",),
    ),
    "override-missing-preset": Case(
        {"spec.yaml": WITH_PRESETS},
        "<overrides>:1: algos:",
        "no preset 'nope' in algos/",
        overrides=("algos=nope",),
    ),
}

if GPUS == 0:
    CASES["cuda-without-gpu"] = Case(
        {"spec.yaml": BASE + "hardware:\n  device: cuda\n"},
        "spec.yaml:9: hardware.device:",
        "cuda requested but this machine has 0 visible CUDA device(s)",
    )


# A native env's params: each wrong one named where it is, before the env is built.
NATIVE_LBF = """
env:
  id: lbf/Foraging-8x8-2p-2f-coop-v3
  backend: native
  params:
    {param}
algo:
  name: mappo
"""
for _name, _param, _head, _fragment in (
    ("lbf-players-bool", "players: true", "players", "must be a whole number of at least 1"),
    ("lbf-players-zero", "players: 0", "players", "not 0"),
    ("lbf-more-players-than-cells", "players: 65", "players", "do not fit on a 8x8 grid"),
    ("lbf-field-size-scalar", "field_size: 8", "field_size", "must be [rows, columns]"),
    ("lbf-field-size-nan", "field_size: [.nan, 8]", "field_size", "not nan"),
    ("lbf-penalty-string", "penalty: abc", "penalty", "must be a finite number"),
    ("lbf-flag-string", "force_coop: 'yes'", "force_coop", "must be true or false"),
    ("lbf-no-food", "max_num_food: 0", "max_num_food", "of at least 1"),
    ("lbf-levels-wrong-length", "min_player_level: [1, 2, 3]", "min_player_level", "list of 2"),
):
    CASES[_name] = Case(
        {"spec.yaml": NATIVE_LBF.format(param=_param)},
        f"spec.yaml:5: env.params.{_head}:",
        _fragment,
    )
CASES["env-param-typo"] = Case(
    {
        "spec.yaml": BASE.replace(
            "  id: mpe/simple_spread\n", "  id: mpe/simple_spread\n  params: {Nn: 4}\n"
        )
    },
    "spec.yaml:3: env.params.Nn:",
    "not a parameter of env 'mpe/simple_spread'; did you mean 'N'?",
)


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_spec_is_reported_with_file_line_and_key(case: Case, tmp_path: Path) -> None:
    for name, text in case.files.items():
        write(tmp_path / name, text)
    result = invoke("validate", case.spec, *case.overrides)
    assert_clean_exit(result, 2)
    head = case.head.replace("{tmp}", str(tmp_path.resolve()))
    index = find_problem(result.output, head, case.fragment)
    line = problem_lines(result.output)[index]
    for fragment in case.also:
        assert fragment in line, line
    assert "nothing was run" in result.output


def test_num_envs_whose_rollouts_outgrow_the_memory_are_refused(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr("marlctl.plan.physical_memory_mb", lambda: 1_000.0)
    write(tmp_path / "spec.yaml", BASE + "hardware:\n  num_envs: 100000\n")
    result = invoke("validate", "spec.yaml")
    assert_clean_exit(result, 2)
    find_problem(result.output, "spec.yaml:9: hardware.num_envs:", "more than this machine's 1,000")
    assert invoke("validate", "spec.yaml", "hardware.num_envs=100").exit_code == 0
    # Where the replay buffer is most of it, the buffer is named.
    replay = BASE.replace("name: mappo", "name: qmix\n  buffer_size: 10000000")
    write(tmp_path / "replay.yaml", replay)
    result = invoke("validate", "replay.yaml")
    assert_clean_exit(result, 2)
    find_problem(
        result.output,
        "replay.yaml:5: algo.buffer_size:",
        "a replay buffer of 10,000,000 transitions need(s) an estimated",
    )


def test_several_errors_are_all_reported_sorted_by_line(tmp_path: Path) -> None:
    write(
        tmp_path / "spec.yaml",
        """
        seedz: [0, 1]
        env:
          id: mpe/simple_spread
        hardware:
          device: gpu
        algo:
          name: mappo
          clip: 2.0
          lrr: 0.1
        model:
          hidden: [64, -3]
        """,
    )
    result = invoke("validate", "spec.yaml", "algo.epochs=0")
    assert_clean_exit(result, 2)
    expected = [
        ("spec.yaml:1: seedz:", "unknown key; did you mean 'seeds'?"),
        ("spec.yaml:5: hardware.device:", "must be auto, cpu, cuda or cuda:N (got 'gpu')"),
        ("spec.yaml:8: algo.clip:", "less than or equal to 1 (got 2.0)"),
        ("spec.yaml:9: algo.lrr:", "unknown key; did you mean 'lr'?"),
        ("spec.yaml:11: model.hidden.1:", "greater than or equal to 1 (got -3)"),
        ("<overrides>:1: algo.epochs:", "greater than or equal to 1 (got 0)"),  # overrides last
    ]
    indices = [find_problem(result.output, head, fragment) for head, fragment in expected]
    assert indices == sorted(indices), result.output
    assert len(set(indices)) == len(expected)
    lines = problem_lines(result.output)
    reported = [line for line in lines if line.startswith(("spec.yaml:", "<overrides>:"))]
    assert len(reported) == len(expected), result.output
    assert lines[-1] == f"{len(expected)} problems; nothing was run."


# ----------------------------------------------------------------- valid specs, --json

SPREAD_TOML = """
# The TOML twin of specs/spread_mappo.yaml.
defaults = [{envs = "simple_spread"}, {algos = "mappo"}, "_self_"]
seeds = [0, 1]

[train]
total_env_steps = 100_000
eval_every = 25_000
eval_episodes = 32
checkpoint_every = 50_000

[hardware]
device = "auto"
num_envs = 16
parallel_runs = 2
"""


def test_valid_yaml_and_toml_specs_validate(repo_root: Path, tmp_path: Path) -> None:
    yaml_spec = repo_root / "specs" / "spread_mappo.yaml"
    toml_spec = write(tmp_path / "spread_mappo.toml", SPREAD_TOML)
    resolved = []
    for spec in (yaml_spec, toml_spec):
        result = invoke("validate", str(spec))
        assert_clean_exit(result, 0)
        assert "mappo on mpe/simple_spread, 2 run(s)" in result.output
        as_json = invoke("validate", str(spec), "--json")
        assert_clean_exit(as_json, 0)
        document = json.loads(as_json.stdout)
        assert document["ok"] is True
        assert document["runs"] == 2
        resolved.append(document["spec"])
    assert resolved[0] == resolved[1]  # same schema, same result
    assert resolved[0]["algo"]["name"] == "mappo"
    assert resolved[0]["env"]["params"]["N"] == 3


def test_invalid_spec_with_json_lists_the_errors(tmp_path: Path) -> None:
    write(tmp_path / "spec.yaml", BASE.replace("name: mappo", "name: mappo\n  lrr: 0.1"))
    result = invoke("validate", "spec.yaml", "hardware.device=gpu", "--json")
    assert_clean_exit(result, 2)
    document = json.loads(result.stdout)
    assert document["ok"] is False
    assert document["exit_code"] == 2
    assert document["errors"] == [
        "spec.yaml:5: algo.lrr: unknown key; did you mean 'lr'?",
        "<overrides>:1: hardware.device: must be auto, cpu, cuda or cuda:N (got 'gpu')",
    ]


def test_auto_threads_split_the_cores_between_the_run_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from marlctl import cores as machine
    from marlctl.plan import available_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    write(tmp_path / "spec.yaml", BASE)
    cores = available_cores()
    # Other processes keep no core busy (tests/test_threads.py takes the busy ones off).
    idle = machine.Reading(cores, 0.0, cores, "faked")
    monkeypatch.setattr(machine, "free_cores", lambda: idle)
    for overrides, processes in (
        (["seeds=[0,1]", "hardware.parallel_runs=2"], 2),
        (["seeds=[0,1]", "env.backend=native", "hardware.batch_seeds=true"], 1),
    ):
        args = ("run", "spec.yaml", *overrides, "hardware.threads_per_run=auto", "--dry-run")
        result = invoke(*args, "--json")
        assert_clean_exit(result, 0)
        runs = json.loads(result.stdout)["plan"]["runs"]
        assert {r["threads"] for r in runs} == {max(1, cores // processes)}
    # A small replay batch takes one thread; OMP_NUM_THREADS caps the share.
    for overrides, env, expected in (
        (["algo.name=qmix"], None, 1),
        (["algo.name=qmix", "algo.batch_size=2048"], None, cores),
        ([], "1", 1),
    ):
        if env is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", env)
        result = invoke("run", "spec.yaml", *overrides, "--dry-run", "--json")
        assert_clean_exit(result, 0)
        assert {r["threads"] for r in json.loads(result.stdout)["plan"]["runs"]} == {expected}
    result = invoke("validate", "spec.yaml", "hardware.threads_per_run=0")
    assert_clean_exit(result, 2)
    assert "hardware.threads_per_run: must be a whole number from 1 to 1024, or auto" in (
        result.output
    )


@pytest.mark.parametrize("spec", SPECS, ids=[p.name for p in SPECS])
def test_every_shipped_spec_validates(spec: Path) -> None:
    result = invoke("validate", str(spec))
    if result.exit_code == 2 and "pip install 'marlctl[meltingpot]'" in result.output:
        from marlctl.envs.registry import lookup

        assert not lookup("meltingpot/commons_harvest__open").installed, result.output
        pytest.skip("Melting Pot is not installed (CI leaves it out: docs/environments.md)")
    assert_clean_exit(result, 0)
    result = invoke("run", str(spec), "--dry-run", "--json")
    assert_clean_exit(result, 0)
    assert json.loads(result.stdout)["ok"] is True


def test_specs_folder_is_not_empty() -> None:
    assert SPECS, "the repository's specs/ folder holds no spec"


# ----------------------------------------------------------------- no torch, no mlflow

LIGHT_COMMANDS = """
import sys
from typer.testing import CliRunner
import marlctl.cli
from marlctl.cli import app

def heavy():
    return sorted(m for m in ("torch", "mlflow") if m in sys.modules)

assert not heavy(), ("import marlctl.cli", heavy())
runner = CliRunner()
for args in (["--help"], ["validate", "specs/spread_mappo.yaml"], ["list", "algos"],
             ["list", "envs"], ["list", "algos", "--json"],
             ["run", "specs/spread_mappo.yaml", "--dry-run"],
             ["run", "specs/spread_mappo.yaml", "--dry-run", "--json"],
             ["validate", "specs/spread_mappo_native.yaml"],
             ["run", "specs/spread_mappo_native.yaml", "--dry-run"]):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (args, result.output, result.exception)
    assert not heavy(), (args, heavy())
print("LIGHT")
"""


def test_light_commands_import_neither_torch_nor_mlflow(repo_root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LIGHT_COMMANDS],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("LIGHT"), done.stdout + done.stderr


# ----------------------------------------------------------------- invalid spec writes nothing


@pytest.mark.parametrize(
    "text, overrides",
    [
        pytest.param(BASE.replace("name: mappo", "name: mappo\n  clip: 2.0"), (), id="schema"),
        pytest.param(BASE + "hardware:\n  device: cuda:99\n", (), id="plan"),
        pytest.param(BASE, ("algo.lrr=1",), id="override"),
        pytest.param("env: [\n", (), id="syntax"),
    ],
)
def test_invalid_spec_run_writes_nothing(
    text: str, overrides: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "bad.yaml", text)
    result = invoke("run", "bad.yaml", *overrides)
    assert_clean_exit(result, 2)
    assert "nothing was run" in result.output
    assert not (tmp_path / "mlflow.db").exists()
    assert not (tmp_path / "mlruns").exists()
    assert sorted(os.listdir(tmp_path)) == ["bad.yaml"]


def test_spec_without_defaults_prints_no_hydra_warning(tmp_path: Path) -> None:
    # Hydra warns "Defaults list is missing `_self_`" on stderr unless marlctl adds it.
    write(tmp_path / "spec.yaml", BASE)
    done = subprocess.run(
        [sys.executable, "-W", "always", "-m", "marlctl", "validate", "spec.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr


# ----------------------------------------------------------------- reporting details


def test_problem_lines_are_not_wrapped_on_a_narrow_console(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # what rich uses when stderr is a pipe or a file
    write(tmp_path / "spec.yaml", "env:\n  id: mpe/simple_spred\nalgo:\n  name: mappo\n")
    result = invoke("validate", "spec.yaml")
    assert_clean_exit(result, 2)
    find_problem(result.output, "spec.yaml:2: env.id:", "did you mean 'mpe/simple_spread'?")


def test_override_with_empty_key_is_located_in_overrides(tmp_path: Path) -> None:
    write(tmp_path / "spec.yaml", BASE)
    result = invoke("validate", "spec.yaml", "=1")
    assert_clean_exit(result, 2)
    assert result.output.startswith("<overrides>:1:"), result.output


def test_every_bad_override_is_reported(tmp_path: Path) -> None:
    write(tmp_path / "spec.yaml", BASE)
    result = invoke("validate", "spec.yaml", "algo.lr=abc", "algo.lrr=1")
    assert_clean_exit(result, 2)
    find_problem(result.output, "<overrides>:1: algo.lr:", "valid number")
    find_problem(result.output, "<overrides>:2: algo.lrr:", "unknown key")


def test_unterminated_yaml_quote_points_at_its_line(tmp_path: Path) -> None:
    write(
        tmp_path / "spec.yaml", 'env:\n  id: mpe/simple_spread\nalgo:\n  name: "mappo\nseeds: [0]\n'
    )
    result = invoke("validate", "spec.yaml")
    assert_clean_exit(result, 2)
    find_problem(result.output, "spec.yaml:4:", "invalid YAML")


def test_bad_sweep_range_is_one_readable_problem(tmp_path: Path) -> None:
    write(tmp_path / "spec.yaml", BASE + "sweep:\n  space:\n    algo.lr: {low: 1.0, high: 0.1}\n")
    result = invoke("validate", "spec.yaml")
    assert_clean_exit(result, 2)
    find_problem(result.output, "spec.yaml:10: sweep.space.algo.lr:", "low must be below high")
    assert "function-after" not in result.output and "Choices" not in result.output
    assert "1 problem;" in result.output


def test_a_preset_name_with_a_newline_and_control_characters_is_reported_on_one_line(
    tmp_path: Path,
) -> None:
    import yaml

    body = {"defaults": ["bad\nname\x8e", {"algos": "mappo"}, "_self_"], "env": {"id": "x"}}
    path = tmp_path / "odd.yaml"
    path.write_text(yaml.safe_dump(body, allow_unicode=True), encoding="utf-8")
    result = invoke("validate", str(path))
    assert result.exit_code == 2
    first, summary = result.output.strip().splitlines()
    assert first == f"{path}:1: Could not load 'bad\\nname\\x8e'."
    assert summary == "1 problem; nothing was run."


def test_a_name_override_names_a_spec_that_leaves_its_name_out(tmp_path: Path) -> None:
    """`name` is a top-level field with a default (the file's stem): `name=...` sets it
    without `+`, as `algo.lr=...` sets a field the file leaves to its default."""
    write(tmp_path / "spec.yaml", BASE)
    result = invoke("run", str(tmp_path / "spec.yaml"), "name=renamed", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan"]["experiment"] == "renamed"
    result = invoke("run", str(tmp_path / "spec.yaml"), "--dry-run", "--json")
    assert json.loads(result.stdout)["plan"]["experiment"] == "spec"


def test_a_factory_module_in_the_working_folder_is_pointed_out(tmp_path: Path, monkeypatch) -> None:
    """Python finds a module in the working folder only when told to (`python -m` adds it,
    the `marlctl` command does not): the problem says where the file is and what to do."""
    here = str(tmp_path.resolve())
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", here)])
    write(tmp_path / "mine" / "envs.py", "def make(**params):\n    pass\n")
    write(tmp_path / "spec.yaml", BASE.replace("mpe/simple_spread", "mine.envs:make"))
    result = invoke("validate", "spec.yaml")
    assert_clean_exit(result, 2)
    find_problem(
        result.output,
        "spec.yaml:2: env.id:",
        "No module named 'mine'; mine/envs.py is in the current folder, which is not on "
        "Python's module search path: run with PYTHONPATH=.",
    )
    # Beside a spec in another folder: that folder is named.
    write(tmp_path / "exp" / "solo.py", "def make(**params):\n    pass\n")
    write(tmp_path / "exp" / "spec.yaml", BASE.replace("mpe/simple_spread", "solo:make"))
    result = invoke("validate", "exp/spec.yaml")
    assert_clean_exit(result, 2)
    find_problem(result.output, "exp/spec.yaml:2: env.id:", f"run with PYTHONPATH={here}/exp")
    # A module the factory's own module imports is not the factory's: no hint.
    write(tmp_path / "broken.py", "import nosuchdependency\n\ndef make(**params):\n    pass\n")
    write(tmp_path / "spec.yaml", BASE.replace("mpe/simple_spread", "broken:make"))
    monkeypatch.syspath_prepend(here)
    result = invoke("validate", "spec.yaml")
    assert_clean_exit(result, 2)
    assert "No module named 'nosuchdependency'" in result.output
    assert "PYTHONPATH" not in result.output
    sys.modules.pop("broken", None)


def test_a_scripted_policy_module_in_the_working_folder_is_pointed_out(
    tmp_path: Path, monkeypatch
) -> None:
    from marlctl.train.opponents import import_policy

    here = str(tmp_path.resolve())
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", here)])
    write(tmp_path / "policies.py", "def flee(obs, mask, group):\n    pass\n")
    with pytest.raises(ValueError, match=r"policies.py is in the current folder.*PYTHONPATH=\.$"):
        import_policy("policies:flee")


def test_a_preset_group_the_spec_does_not_list_is_added_with_a_plus(tmp_path: Path) -> None:
    write(tmp_path / "spec.yaml", BASE)
    result = invoke("validate", "spec.yaml", "algos=qmix")
    assert_clean_exit(result, 2)
    find_problem(
        result.output,
        "<overrides>:1: algos:",
        "the spec's defaults list has no algos entry to replace; to add one write +algos=qmix",
    )
    assert "did you mean" not in result.output
    # What the message says works, and the preset's values win over the file's (mappo).
    result = invoke("run", "spec.yaml", "+algos=qmix", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan"]["algo"] == "qmix"


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.lr==3", "a second '='; write KEY=VALUE, and quote a value that holds '='"),
        ("algo.lr=a=b", "a second '='"),
        ("algo.lr", "no '='; write KEY=VALUE (or ~KEY to delete a key)"),
        ("seeds=[0,1", "cannot read [0,1: a bracket or parenthesis left open?"),
        ('name="abc', 'a quote left open at "abc'),
        ("algo.lr=1)", "unexpected ')' (quote a value that holds it)"),
    ],
)
def test_an_override_the_grammar_does_not_read_is_named_in_a_few_words(
    override: str, message: str, tmp_path: Path
) -> None:
    write(tmp_path / "spec.yaml", BASE)
    result = invoke("validate", "spec.yaml", override)
    assert_clean_exit(result, 2)
    first = problem_lines(result.output)[0]
    assert first.startswith(f"<overrides>:1: {override}: bad override: {message}"), first
    assert "expecting" not in first and "BRACKET_OPEN" not in first and len(first) < 160


def test_a_key_with_blanks_at_its_ends_is_quoted_in_its_location():
    from marlctl.errors import Problem

    shown = str(Problem("spec.yaml", 1, " lr", "unknown key"))
    assert shown == "spec.yaml:1: ' lr': unknown key"
