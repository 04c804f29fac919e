"""Env presets and switching envs: every registered env has a preset `envs/NAME.yaml` that
validates; `envs=NAME` and `env.id=ID` switch a spec to another env, dropping the params
written for the old one; `marlctl list envs` says how to install what is missing."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from marlctl.cli import app
from marlctl.envs import families
from marlctl.envs.families import DISTRIBUTIONS, ENVS, EnvEntry
from marlctl.envs.native import NATIVE_ONLY
from marlctl.envs.registry import env_params, lookup, preset_name, registered_ids
from marlctl.envs.signature import REQUIRED, FactoryParams, factory_params

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "envs"
SPREAD = ROOT / "specs" / "spread_mappo.yaml"
runner = CliRunner()

SPEC = """\
defaults:
  - envs: {preset}
  - algos: mappo
  - _self_
seeds: [0]
train: {{total_env_steps: 1000, eval_every: 0, checkpoint_every: 0}}
hardware: {{num_envs: 2}}
"""


def preset(env_id: str) -> dict:
    """The preset's env as a resolved spec has it (fields it leaves out at their defaults)."""
    text = (PRESETS / f"{preset_name(env_id)}.yaml").read_text(encoding="utf-8")
    return {"reward_weights": None, **yaml.safe_load(text)}


def resolved_env(*args: str) -> dict:
    """`marlctl validate ARGS --json`: the composed spec's env (the command must succeed)."""
    result = runner.invoke(app, ["validate", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["spec"]["env"]


# ---------------------------------------------------------------- a preset per env


@pytest.mark.parametrize("env_id", registered_ids())
def test_every_registered_env_has_a_preset_naming_it(env_id: str) -> None:
    path = PRESETS / f"{preset_name(env_id)}.yaml"
    assert path.is_file(), f"no {path.name}: run .venv/bin/python scripts/env_presets.py"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# @package env\n"), "the preset must place itself under env"
    data = yaml.safe_load(text)
    assert data["id"] == env_id
    suite = lookup(env_id).suite
    expected = "native" if env_id in NATIVE_ONLY else "vmas" if suite == "vmas" else "pettingzoo"
    assert data["backend"] == expected
    # Each key is a parameter the env names: a typo fails here even where the factory
    # would swallow it through **kwargs.
    named = env_params(env_id).defaults
    assert set(data["params"] or {}) <= set(named), set(data["params"]) - set(named)


@pytest.mark.parametrize("env_id", registered_ids())
def test_every_preset_validates_and_envs_name_switches_to_it(env_id: str, tmp_path: Path) -> None:
    if not lookup(env_id).installed:
        pytest.skip(f"{env_id} is not installed: {lookup(env_id).install_hint}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(preset=preset_name(env_id)))
    assert resolved_env(str(spec)) == preset(env_id)
    # The same preset picked on the command line replaces the spec's own env preset whole.
    assert resolved_env(str(SPREAD), f"envs={preset_name(env_id)}") == preset(env_id)


def test_every_preset_file_belongs_to_an_env_of_a_known_suite() -> None:
    known = {
        *(f"mpe/{n}" for n in families.MPE),
        *(f"sisl/{n}" for n in families.SISL),
        *(f"butterfly/{n}" for n in families.BUTTERFLY),
        *(f"lbf/{n}" for n in families.LBF_TASKS),
        *(f"rware/{n}" for n in families.RWARE_TASKS),
        *(f"classic/{n}" for n in families.CLASSIC),
        *(f"magent2/{n}" for n in families.MAGENT2),
        *(f"meltingpot/{n}" for n in families.MELTINGPOT_SUBSTRATES),
        *(e for e in families.ENVS if e.startswith(("vmas/", "momaland/"))),
        *NATIVE_ONLY,
    }
    for path in sorted(PRESETS.glob("*.y*ml")):
        env_id = yaml.safe_load(path.read_text(encoding="utf-8"))["id"]
        assert env_id in known, f"{path.name} names '{env_id}', which is not registered"
        if env_id in registered_ids():
            assert path.stem == preset_name(env_id)


def test_the_generator_writes_what_is_committed_and_finds_nothing_missing() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import env_presets
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert env_presets.main(["--check"]) == 0
    # The native-only presets depend on nothing outside this repository: they stay equal.
    for env_id in NATIVE_ONLY:
        path = PRESETS / f"{preset_name(env_id)}.yaml"
        assert env_presets.preset_text(env_id) == path.read_text(encoding="utf-8")


def test_suites_that_share_an_env_name_get_prefixed_presets(monkeypatch) -> None:
    clash = EnvEntry("vmas/simple_tag", "vmas:make", "vmas", "VMAS's simple_tag")
    monkeypatch.setattr(families, "ENVS", {**families.ENVS, clash.id: clash})
    assert preset_name("mpe/simple_tag") == "simple_tag"  # listed first: keeps the name
    assert preset_name("vmas/simple_tag") == "vmas_simple_tag"
    assert preset_name("mpe/simple_spread") == "simple_spread"


# ---------------------------------------------------------------- parameters from signatures


class _Work:
    def __init__(self, rng, size: int = 3, *, speed: float = 1.0) -> None:
        self.size = size


class _Stash:
    """Keeps its keywords and builds the real env in another method (cooperative_pong)."""

    def __init__(self, **kwargs) -> None:
        self._kwargs = kwargs
        self._build()

    def _build(self) -> None:
        self.env = _Work(None, **self._kwargs)


def _wrap(env_fn):
    def outer(**kwargs):  # PettingZoo's parallel_wrapper_fn: the callee is a closure cell
        return env_fn(**kwargs)

    return outer


def _two_callees(**kwargs):
    _Work(None, **kwargs)
    return _narrow(**kwargs)


def _narrow(size: int = 3, depth: int = 1):
    return size, depth


def _anything(**kwargs):
    return dict(**kwargs)


def test_parameters_are_found_behind_kwargs_that_are_handed_on() -> None:
    work = {"size": 3, "speed": 1.0}  # `rng` is filled positionally by every caller
    assert factory_params(_Stash) == FactoryParams(work)
    assert factory_params(_wrap(_Stash)) == FactoryParams(work)
    # Keywords that reach two callees must suit both.
    assert factory_params(_two_callees) == FactoryParams({"size": 3})
    # Keywords that go nowhere we can read: anything is accepted.
    assert factory_params(_anything).open and factory_params(_anything).accepts("N")
    assert factory_params(_Work).defaults == {"rng": REQUIRED, **work}


def test_registered_factories_name_their_parameters() -> None:
    tag = env_params("mpe/simple_tag")
    assert not tag.open and tag.defaults["num_adversaries"] == 3 and "N" not in tag.defaults
    penalty = env_params("matrix/penalty")
    assert penalty == FactoryParams({"max_cycles": 1, "k": -100.0})
    if ENVS.get("sisl/multiwalker") and lookup("sisl/multiwalker").installed:
        walker = env_params("sisl/multiwalker")  # raw_env(*args, **kwargs) -> MultiWalkerEnv
        assert not walker.open and walker.defaults["n_walkers"] == 3


# ---------------------------------------------------------------- switching env.id


NOTE = "env.params: dropped N, local_ratio: not parameters of mpe/simple_tag"


@pytest.fixture
def notes(monkeypatch):
    """The notes of every spec the CLI loads in this test (the CLI prints them on stderr)."""
    import marlctl.spec as spec

    said: list[str] = []
    real = spec.load_spec

    def load(*args, **kwargs):
        loaded = real(*args, **kwargs)
        said.extend(loaded.notes)
        return loaded

    monkeypatch.setattr(spec, "load_spec", load)
    return lambda: list(said)


def test_an_env_id_override_drops_the_params_of_the_previous_env_with_a_note(notes) -> None:
    spread = preset("mpe/simple_spread")["params"]
    env = resolved_env(str(SPREAD), "env.id=mpe/simple_tag")
    assert env["id"] == "mpe/simple_tag"
    assert env["params"] == {k: v for k, v in spread.items() if k not in ("N", "local_ratio")}
    assert notes() == [f"{NOTE} (its own preset: envs=simple_tag)"]


def test_params_set_for_the_new_env_are_still_checked(notes) -> None:
    result = runner.invoke(
        app, ["validate", str(SPREAD), "env.id=mpe/simple_tag", "+env.params.M=1"]
    )
    assert result.exit_code == 2
    assert "<overrides>:2: env.params.M: not a parameter of env 'mpe/simple_tag'" in result.output
    # N was written for simple_spread, but set again here: it is meant for simple_tag.
    result = runner.invoke(
        app, ["validate", str(SPREAD), "env.id=mpe/simple_tag", "env.params.N=4"]
    )
    assert result.exit_code == 2
    assert "env.params.N: not a parameter of env 'mpe/simple_tag'" in result.output


def test_an_env_id_in_the_spec_file_drops_the_params_of_its_env_preset(tmp_path, notes) -> None:
    spec = tmp_path / "tag.yaml"
    spec.write_text(SPEC.format(preset="simple_spread") + "env:\n  id: mpe/simple_tag\n")
    env = resolved_env(str(spec))
    assert env["id"] == "mpe/simple_tag" and "N" not in env["params"]
    assert notes() == [f"{NOTE} (its own preset: envs=simple_tag)"]
    # Params the file sets beside its own id are its own: a wrong one is an error.
    spec.write_text(spec.read_text() + "  params: {N: 4}\n")
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2 and "tag.yaml:10: env.params" in result.output


def test_an_env_preset_picked_on_the_command_line_drops_the_spec_files_params(
    tmp_path, notes
) -> None:
    spec = tmp_path / "spread.yaml"
    spec.write_text(SPEC.format(preset="simple_spread") + "env:\n  params: {N: 4}\n")
    env = resolved_env(str(spec), "envs=simple_tag")
    assert env == preset("mpe/simple_tag")
    assert notes() == ["env.params: dropped N: not parameters of mpe/simple_tag"]


def test_params_a_factory_takes_through_kwargs_are_kept(notes) -> None:
    # crashing_spread(crash_at, **params) hands them to a module it imports inside: open.
    env = resolved_env(str(SPREAD), "env.id=toy_envs:crashing_spread")
    assert env["params"] == preset("mpe/simple_spread")["params"] and notes() == []
    # constant_reward(**params) hands them to ConstantReward(bonus, max_cycles).
    env = resolved_env(str(SPREAD), "env.id=toy_envs:constant_reward")
    assert env["params"] == {"max_cycles": 25}
    assert notes()[0].startswith("env.params: dropped N, local_ratio, continuous_actions,")


def test_env_params_mapping_override_replaces_the_params() -> None:
    assert resolved_env(str(SPREAD), "env.params={}")["params"] == {}
    assert resolved_env(str(SPREAD), "env.params={max_cycles: 10}")["params"] == {"max_cycles": 10}
    assert resolved_env(str(SPREAD), "env.params={}", "env.params.N=5")["params"] == {"N": 5}
    switched = resolved_env(str(SPREAD), "env.id=sisl/pursuit", "env.params={}")
    assert switched == {
        "id": "sisl/pursuit",
        "backend": "pettingzoo",
        "params": {},
        "reward_weights": None,
    }


def test_deleting_the_env_params_leaves_the_env_at_its_defaults() -> None:
    # `~env.params` (no value) as the benchmark scripts switch env: each env's own defaults
    assert resolved_env(str(SPREAD), "~env.params")["params"] == {}
    switched = resolved_env(str(SPREAD), "env.id=hanabi/2p", "env.backend=native", "~env.params")
    assert switched["id"] == "hanabi/2p" and switched["params"] == {}


def test_env_params_mapping_override_applies_where_the_file_sets_no_params(tmp_path) -> None:
    bare = tmp_path / "bare.yaml"
    bare.write_text("env:\n  id: mpe/simple_adversary\nalgo:\n  name: mappo\n")
    assert resolved_env(str(bare), "env.params={N: 3}")["params"] == {"N": 3}
    assert resolved_env(str(bare), "env={params: {N: 3}}")["params"] == {"N": 3}
    # Keys the preset does not list are params all the same.
    chosen = resolved_env(str(SPREAD), "env.params={N: 2, dynamic_rescaling: true}")
    assert chosen["params"] == {"N": 2, "dynamic_rescaling": True}
    result = runner.invoke(app, ["validate", str(bare), "env.params={M: 3}"])
    assert result.exit_code == 2
    assert "<overrides>:1: env.params.M: not a parameter of env" in result.output


def test_the_note_is_one_line_on_stderr() -> None:
    marlctl = str(Path(sys.executable).parent / "marlctl")
    done = subprocess.run(
        [marlctl, "validate", str(SPREAD), "env.id=mpe/simple_tag", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"note {NOTE} (its own preset: envs=simple_tag)\n" in done.stderr
    assert json.loads(done.stdout)["spec"]["env"]["id"] == "mpe/simple_tag"


# ---------------------------------------------------------------- installing envs


def _requirements(extras: dict[str, list[str]], name: str) -> set[str]:
    """Distribution names an extra installs, through `marlctl[...]` references."""
    names: set[str] = set()
    for requirement in extras[name]:
        dist = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()
        if dist == "marlctl":
            inner = re.search(r"\[(.*)\]", requirement).group(1)
            for other in inner.split(","):
                names |= _requirements(extras, other.strip())
        else:
            names.add(dist)
    return names


def test_every_extra_an_env_names_exists_and_installs_what_it_imports(repo_root: Path) -> None:
    project = tomllib.loads((repo_root / "pyproject.toml").read_text(encoding="utf-8"))
    extras = project["project"]["optional-dependencies"]
    installed = importlib.metadata.packages_distributions()
    suites = {e.suite for e in ENVS.values() if e.requires}
    for entry in ENVS.values():
        if not entry.requires:
            continue
        assert entry.extra in extras, f"{entry.id}: no extra '{entry.extra}' in pyproject.toml"
        provided = _requirements(extras, entry.extra)
        for module in entry.requires:
            dist = DISTRIBUTIONS.get(module, module).lower()
            assert dist in provided, f"{entry.id} imports {module}: not in [{entry.extra}]"
            if module in installed:  # the module-to-distribution map matches what is here
                assert dist in {d.lower() for d in installed[module]}, (module, installed[module])
    # extra-envs, which scripts/setup (and so CI) installs, covers every suite but Melting
    # Pot's, whose build downloads assets and which needs TensorFlow.
    assert {e.extra for e in ENVS.values() if e.suite in suites} - {"meltingpot"} <= set(
        re.search(r"\[(.*)\]", extras["extra-envs"][0]).group(1).split(",")
    )
    assert 'extras="extra-envs,' in (repo_root / "scripts" / "setup").read_text()


def test_list_envs_says_how_to_install_an_env_that_is_missing(monkeypatch) -> None:
    if "sisl/multiwalker" not in ENVS:
        pytest.skip("this PettingZoo has no multiwalker")
    importable = families._importable
    monkeypatch.setattr(families, "_importable", lambda m: m != "Box2D" and importable(m))
    result = runner.invoke(app, ["list", "envs", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["id"]: row for row in json.loads(result.stdout)["envs"]}
    walker = rows["sisl/multiwalker"]
    assert (walker["installed"], walker["missing"]) == (False, ["Box2D"])
    assert walker["install"] == "pip install 'marlctl[sisl]'"
    assert rows["mpe/simple_tag"]["install"] is None and rows["mpe/simple_tag"]["installed"]
    assert rows["mpe/simple_tag"]["preset"] == "simple_tag"
    from marlctl import cli

    monkeypatch.setattr(cli.output.out, "_width", 250)  # one table row per env
    table = runner.invoke(app, ["list", "envs"]).output
    (line,) = [line for line in table.splitlines() if "sisl/multiwalker" in line]
    assert "no: pip install 'marlctl[sisl]'" in line
    # Without an extra to name, the hint names the distributions themselves.
    bare = EnvEntry("x/y", "mpe2.simple_v3:parallel_env", "x", "", ("pygame", "Box2D"))
    monkeypatch.setattr(families, "_importable", lambda m: m == "mpe2")
    assert bare.install_hint == "pip install pygame-ce box2d"
