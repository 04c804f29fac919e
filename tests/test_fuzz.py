"""Property-based fuzzing of the spec loader and the override parser (Hypothesis).

Mutated copies of the shipped specs, as text and as data, and random overrides: every case
either validates (exit 0) or is refused with exit 2 and problems located as
`FILE[:LINE]: ...`; never a traceback or another exit code, never a file written, never
longer than 5 s. The cases are derandomised: CI runs the same corpus every time.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import time
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from marlctl import cli  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(
    p for ext in ("yaml", "yml", "toml") for p in (REPO_ROOT / "specs").glob(f"*.{ext}")
)
TEXTS = [(p.suffix, p.read_text(encoding="utf-8")) for p in SHIPPED]
DATA = [yaml.safe_load(text) for suffix, text in TEXTS if suffix != ".toml"]
LOCATED = re.compile(r"^(<overrides>|\S+\.(ya?ml|toml))(:\d+)?: \S")
SUMMARY = re.compile(r"^\d+ problems?; nothing was run\.$")
MORE = re.compile(r"^\.\.\. and [\d,]+ more \(--json lists them all\)$")  # past 50 problems
FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # the failing case prints whole; no shrinking
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _paths(value, prefix=()):
    """Every key path in plain data: where a mutation can land."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _snapshot() -> set[Path]:
    return set(Path.cwd().rglob("*"))


def check(args: list[str], written: set[Path]) -> None:
    """Run `marlctl validate ARGS` in-process and hold it to the contract."""
    before = _snapshot()
    stdout, stderr = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["marlctl", "validate", *args]
    start = time.perf_counter()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            cli.main()
            code = 0
        except SystemExit as done:
            code = done.code
        finally:
            sys.argv = argv
    elapsed = time.perf_counter() - start
    out, err = stdout.getvalue(), stderr.getvalue()
    context = f"args={args!r}\nexit={code}\nstdout={out}\nstderr={err}"
    assert code in (0, 2), context
    assert "Traceback" not in out + err, context
    assert elapsed < 30.0, f"{elapsed:.1f} s\n{context}"  # a hang, not a slow machine
    assert _snapshot() == before | written, context
    if "--json" in args:
        document = json.loads(out)
        assert document["ok"] is (code == 0), context
        if code == 2:
            assert document["errors"] and all(LOCATED.match(e) for e in document["errors"]), context
    elif code == 2:
        lines = err.splitlines()
        assert lines and SUMMARY.match(lines[-1]), context
        if len(lines) > 2 and MORE.match(lines[-2]):
            lines.pop(-2)
        assert all(LOCATED.match(line) for line in lines[:-1]), context


def _spec_file(suffix: str, content: bytes) -> tuple[str, set[Path]]:
    path = Path(f"fuzz{suffix}")
    path.write_bytes(content)
    return path.name, {path.resolve()}


WEIRD_TEXT = st.text(
    alphabet=st.characters(codec="utf-8") | st.sampled_from("\x00\x1b\t\n:{}[]&*!|>'\"#%@`"),
    max_size=12,
)
LEAVES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    WEIRD_TEXT,
    st.booleans(),
    st.none(),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_mutated_spec_text(data):
    suffix, text = data.draw(st.sampled_from(TEXTS))
    raw = text.encode()
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw)))
        kind = data.draw(st.sampled_from(["insert", "delete", "bytes", "duplicate"]))
        if kind == "insert":
            raw = raw[:at] + data.draw(WEIRD_TEXT).encode() + raw[at:]
        elif kind == "delete":
            raw = raw[:at] + raw[at + data.draw(st.integers(1, 40)) :]
        elif kind == "bytes":
            raw = raw[:at] + data.draw(st.binary(min_size=1, max_size=4)) + raw[at:]
        else:
            lines = raw.split(b"\n")
            line = data.draw(st.integers(0, len(lines) - 1))
            raw = b"\n".join([*lines[: line + 1], *lines[line:]])
    name, written = _spec_file(suffix, raw)
    check([name, *(["--json"] if data.draw(st.booleans()) else [])], written)


@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_mutated_spec_data(data):
    import copy

    spec = copy.deepcopy(data.draw(st.sampled_from(DATA)))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(_paths(spec))[1:]))
        parent = spec
        for part in path[:-1]:
            parent = parent[part]
        kind = data.draw(st.sampled_from(["set", "delete", "add"]))
        if kind == "set":
            parent[path[-1]] = data.draw(LEAVES)
        elif kind == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(WEIRD_TEXT)] = data.draw(LEAVES)
    try:
        text = yaml.safe_dump(spec, allow_unicode=True)
    except yaml.YAMLError:  # a value YAML cannot write: nothing to test
        return
    name, written = _spec_file(".yaml", text.encode())
    check([name], written)


KEYS = sorted({".".join(map(str, p)) for d in DATA for p in _paths(d) if p})
HYDRA_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "null", "[]", "{}", "[[1]]", "'x'", "${a}", "${oc.env:HOME}"]),
    st.sampled_from(["range(0,1,0)", "choice(1,2)", "interval(0,1)", "range(1,10**9)"]),
    WEIRD_TEXT,
)


@settings(FUZZ, max_examples=75)
@given(data=st.data())
def test_random_overrides(data):
    name, written = _spec_file(*next((s, t.encode()) for s, t in TEXTS if s != ".toml"))
    overrides = []
    for _ in range(data.draw(st.integers(1, 3))):
        if data.draw(st.booleans()):
            prefix = data.draw(st.sampled_from(["", "+", "++", "~"]))
            key = data.draw(st.sampled_from([*KEYS, "algos", "envs", "hydra.run.dir", "a.b"]))
            value = (
                "" if prefix == "~" and data.draw(st.booleans()) else "=" + data.draw(HYDRA_VALUES)
            )
            overrides.append(f"{prefix}{key}{value}")  # `~KEY` alone deletes whatever is there
        else:
            overrides.append(data.draw(WEIRD_TEXT))
    check([name, "--", *overrides], written)  # `--`: an override may start with a dash
