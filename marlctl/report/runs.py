"""Which runs a report covers, read from MLflow through its client.

A report compares seed runs: the leaves of `experiment → seed` and `study → trial → seed`.
Runs made by older versions may lack tags or metrics; every lookup here tolerates that and
leaves the value missing (None).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field

import numpy as np

from marlctl import tracking
from marlctl.errors import SpecError

ROLE = "marlctl.role"
SPEED = "perf/env_steps_per_s_mean"


@dataclass
class RunRecord:
    run_id: str
    name: str
    experiment: str
    status: str
    parent_id: str | None
    role: str | None
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]
    start_ms: int | None
    end_ms: int | None
    curve: tuple[np.ndarray, np.ndarray] | None = None
    parent_role: str | None = None
    diverged: bool = False  # the metric's last value is not finite

    def lookup(self, key: str) -> str | None:
        """A param, tag or run attribute by name: `params.X` / `tags.X` force the source; a
        bare key tries params, then tags, then `marlctl.`-prefixed tags."""
        if key.startswith("params."):
            return self.params.get(key.removeprefix("params."))
        if key.startswith("tags."):
            return self.tags.get(key.removeprefix("tags."))
        special = {"experiment": self.experiment, "status": self.status, "run": self.name}
        if key in special:
            return special[key]
        for found in (self.params.get(key), self.tags.get(key), self.tags.get(f"marlctl.{key}")):
            if found is not None:
                return found
        if key == "env.id":
            return self.tags.get("marlctl.env")
        if key == "algo.name":
            return self.tags.get("marlctl.algo")
        return None

    @property
    def wall_s(self) -> float | None:
        """The seconds it trained, over every process that did (a resumed run's time
        stopped left out), where the run says; else from its start to its end."""
        if tracking.TRAINED_S in self.metrics:
            return self.metrics[tracking.TRAINED_S]
        if self.start_ms is None or self.end_ms is None:
            return None
        return (self.end_ms - self.start_ms) / 1000

    @property
    def env_steps(self) -> int | None:
        return int(self.curve[0][-1]) if self.curve is not None else None

    @property
    def steps_per_s(self) -> float | None:
        if SPEED in self.metrics:
            return self.metrics[SPEED]
        steps, wall = self.env_steps, self.wall_s
        return steps / wall if steps and wall else None


# ---------------------------------------------------------------- filters

_FILTER = re.compile(r"^\s*([^<>=!\s]+)\s*(<=|>=|!=|==|=|<|>)\s*(.*?)\s*$")
_COMPARE = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(frozen=True)
class Filter:
    """`KEY=V1,V2`, `KEY!=V`, or a numeric `KEY<V` (also `<=`, `>`, `>=`) on a param or tag."""

    key: str
    op: str
    values: tuple[str, ...]

    @classmethod
    def parse(cls, text: str, index: int) -> Filter:
        found = _FILTER.match(text)
        if not found or not found.group(3):
            raise SpecError.at(
                f"--filter #{index}",
                f"'{text}' is not KEY=VALUE, KEY!=VALUE or KEY<VALUE (<=, >, >=)",
            )
        key, op, value = found.groups()
        op = "=" if op == "==" else op
        if op in _COMPARE and _number(value) is None:
            raise SpecError.at(f"--filter #{index}", f"'{value}' in '{text}' is not a number")
        values = tuple(v.strip() for v in value.split(",")) if op in ("=", "!=") else (value,)
        return cls(key, op, values)

    def accepts(self, run: RunRecord) -> bool:
        found = run.lookup(self.key)
        if self.op == "=":
            return found is not None and any(_same(found, v) for v in self.values)
        if self.op == "!=":
            return found is None or not any(_same(found, v) for v in self.values)
        number = _number(found) if found is not None else None
        return number is not None and _COMPARE[self.op](number, float(self.values[0]))


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _same(found: str, wanted: str) -> bool:
    if found == wanted:
        return True
    a, b = _number(found), _number(wanted)
    return a is not None and a == b


# ---------------------------------------------------------------- selection


@dataclass
class Selection:
    """The seed runs a report compares, the study runs it describes, and what it left out."""

    uri: str
    seeds: list[RunRecord] = field(default_factory=list)
    studies: list[RunRecord] = field(default_factory=list)
    trials: dict[str, list[RunRecord]] = field(default_factory=dict)  # study run id → trials
    left_out: dict[str, int] = field(default_factory=dict)  # status → count


def _experiments(client) -> list:
    found, token = [], None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        found.extend(page)
        token = page.token
        if not token:
            return found


def _trial_number(record: RunRecord) -> int:
    text = record.tags.get("marlctl.trial", "")
    return int(text) if text.isdigit() else 1 << 30


def _is_marlctl(record: RunRecord) -> bool:
    """Runs other tools logged to the same store are not seeds: marlctl's carry its algo."""
    return "algo.name" in record.params or "marlctl.algo" in record.tags


def _all_runs(client, experiment_ids: list[str]) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def select(
    client,
    uri: str | None,
    experiments: list[str],
    run_ids: list[str],
    filters: list[Filter],
) -> Selection:
    """Seed runs of the named experiments (default: every experiment with marlctl runs), or
    under the named runs, that pass every filter."""
    from mlflow.exceptions import MlflowException

    selection = Selection(tracking.resolve_uri(uri))
    by_id: dict[str, str] = {}
    if experiments:
        for name in experiments:
            found = client.get_experiment_by_name(name)
            if found is None:
                known = sorted(e.name for e in _experiments(client))
                raise SpecError.at(
                    "EXPERIMENT",
                    f"no experiment '{name}' in {selection.uri}; known: {', '.join(known)}",
                )
            by_id[found.experiment_id] = found.name
    run_ids = [tracking.resolve_run_id(client, run_id, "--runs") for run_id in run_ids]
    for run_id in run_ids:
        try:
            run = client.get_run(run_id)
        except MlflowException:
            raise SpecError.at("--runs", f"no run '{run_id}' in {selection.uri}") from None
        if run.info.experiment_id not in by_id:
            by_id[run.info.experiment_id] = client.get_experiment(run.info.experiment_id).name
    if not by_id:
        by_id = {e.experiment_id: e.name for e in _experiments(client)}
    raw = _all_runs(client, list(by_id)) if by_id else []
    records = {r.info.run_id: _record(r, by_id[r.info.experiment_id]) for r in raw}
    parents = {r.parent_id for r in records.values() if r.parent_id}
    for record in records.values():
        parent = records.get(record.parent_id or "")
        record.parent_role = parent.role if parent else None
    if run_ids:
        wanted = set(run_ids)
        chosen = [r for r in records.values() if _under(r, wanted, records)]
    else:
        chosen = list(records.values())

    for record in chosen:
        if record.role == "study":
            selection.studies.append(record)
            continue
        is_seed = record.role == "seed" or (
            record.role is None and record.run_id not in parents and _is_marlctl(record)
        )
        # Trial seeds belong to their sweep unless the user asked for them by run.
        if not is_seed or (record.parent_role == "trial" and not run_ids):
            continue
        if not all(f.accepts(record) for f in filters):
            continue
        if record.status != "FINISHED" or "marlctl.pruned_at_step" in record.tags:
            state = "PRUNED" if record.status == "FINISHED" else record.status
            selection.left_out[state] = selection.left_out.get(state, 0) + 1
            continue
        selection.seeds.append(record)
    for study in selection.studies:
        selection.trials[study.run_id] = sorted(
            (r for r in records.values() if r.parent_id == study.run_id and r.role == "trial"),
            key=_trial_number,
        )
    selection.seeds.sort(key=lambda r: (r.experiment, r.start_ms or 0, r.name))
    return selection


def _under(record: RunRecord, wanted: set[str], records: dict[str, RunRecord]) -> bool:
    seen: set[str] = set()
    current: RunRecord | None = record
    while current is not None and current.run_id not in seen:
        if current.run_id in wanted:
            return True
        seen.add(current.run_id)
        current = records.get(current.parent_id or "")
    return False


def _record(run, experiment: str) -> RunRecord:
    tags = run.data.tags
    return RunRecord(
        run_id=run.info.run_id,
        name=run.info.run_name or tags.get("mlflow.runName", run.info.run_id[:8]),
        experiment=experiment,
        status=run.info.status,
        parent_id=tags.get(tracking.PARENT_TAG),
        role=tags.get(ROLE),
        params=dict(run.data.params),
        tags=dict(tags),
        metrics=dict(run.data.metrics),
        start_ms=run.info.start_time,
        end_ms=run.info.end_time,
    )


def load_curves(client, runs: list[RunRecord], metric: str) -> None:
    """Attach `metric`'s history `(steps, values)` to each run that logged it."""
    for run in runs:
        history = client.get_metric_history(run.run_id, metric) if metric in run.metrics else []
        points = sorted((m.step, m.timestamp, m.value) for m in history)
        if not points:
            continue
        last: dict[int, float] = {}
        for step, _, value in points:
            last[step] = value  # a resumed run may log a step twice: the later one counts
        steps = np.fromiter(last, dtype=float)
        values = np.fromiter(last.values(), dtype=float)
        keep = np.isfinite(values)
        run.diverged = not keep[-1]
        if keep.any():
            run.curve = (steps[keep], values[keep])
