"""The words a report shows: counts with their plurals, metric names a reader understands,
step counts as 30k or 1.5M, and text that says where the data lives without saying which
machine it lives on.

A report is written to be published, so nothing in it may name a local folder or hold a
password: `public` is applied to every string a report prints, whatever its format.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath, PureWindowsPath
from urllib.parse import urlsplit

from marlctl.redact import map_strings

# ---------------------------------------------------------------- counts

_IRREGULAR = {"policy": "policies"}


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 seed`, `2 seeds`, `0 seeds`; `many` for a plural that is not `word + s`."""
    if count == 1:
        return f"{count} {word}"
    return f"{count} {many or _IRREGULAR.get(word, word + 's')}"


# ---------------------------------------------------------------- steps


def steps(value: float) -> str:
    """An env-step count as an axis tick or a table cell: 0, 950, 30k, 1.5M, 2G."""
    size = abs(value)
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}"


STEPS_AXIS = "Environment steps"


# ---------------------------------------------------------------- metrics

# The project's metric vocabulary (what the trainers log): every name a
# report can plot gets a label a reader of a paper understands without the code.
_METRICS = {
    "eval/return_mean": "Evaluation return (mean per agent)",
    "eval/return_std": "Evaluation return, standard deviation over seeds",
    "train/return_mean": "Training return (mean per agent)",
    "eval/win_rate": "Evaluation win rate",
    "eval_sampled/return_mean": "Sampled-policy evaluation return (mean per agent)",
    "eval_sampled/win_rate": "Sampled-policy evaluation win rate",
    "train/win_rate": "Training win rate",
    "perf/env_steps_per_s": "Throughput (env steps/s)",
    "perf/env_steps_per_s_mean": "Mean throughput (env steps/s)",
    "perf/agent_steps_per_s": "Throughput (agent steps/s)",
    "train/alpha": "Entropy temperature α",
    "train/epsilon": "Exploration ε",
    "objective": "Sweep objective",
}
_LOSSES = {
    "policy": "Policy loss",
    "value": "Value loss",
    "entropy": "Policy entropy",
    "approx_kl": "Approximate KL divergence",
    "clip_frac": "Clipped fraction",
    "grad_norm": "Gradient norm",
    "td": "TD loss",
    "q_taken": "Q value of taken actions",
    "q": "Q value",
    "critic": "Critic loss",
    "actor": "Actor loss",
    "alpha": "Temperature loss",
}
_PHASES = {"eval": "Evaluation", "train": "Training"}


def metric(name: str) -> str:
    """A human label for a metric name; an unknown metric keeps its own name, since a label
    guessed from it could say something the metric does not mean."""
    if name in _METRICS:
        return _METRICS[name]
    phase, _, rest = name.partition("/")
    if phase in _PHASES and rest.startswith("return/") and rest != "return/":
        group = rest.removeprefix("return/")
        return f"{_PHASES[phase]} return of group {group} (mean per agent)"
    if phase in _PHASES and rest.startswith("objective/") and rest != "objective/":
        objective = rest.removeprefix("objective/")
        return f"{_PHASES[phase]} return of objective {objective} (mean per agent)"
    if phase == "loss" and rest in _LOSSES:
        return _LOSSES[rest]
    return name


# ---------------------------------------------------------------- places


_KINDS = {
    "postgresql": "PostgreSQL database",
    "postgres": "PostgreSQL database",
    "mysql": "MySQL database",
    "mssql": "SQL Server database",
    "http": "HTTP server",
    "https": "HTTPS server",
    "databricks": "Databricks workspace",
    "file": "local folder",
}


def place(uri: str) -> str:
    """A store or storage URL as a neutral description: its kind, and for a local file its
    name without the folders (`SQLite file mlflow.db`); never a path, host or password."""
    if "://" not in uri:
        name = _last_part(uri)
        return f"local file {name}" if name else "local file"
    scheme = uri.split("://", 1)[0].lower().split("+", 1)[0]
    if scheme == "sqlite":
        name = _last_part(urlsplit(uri).path)
        return f"SQLite file {name}" if name else "in-memory SQLite database"
    if scheme == "file":
        name = _last_part(urlsplit(uri).path)
        return f"local folder {name}" if name else "local folder"
    return _KINDS.get(scheme, f"{scheme} store")


def _last_part(path: str) -> str:
    windows = PureWindowsPath(path)
    if windows.drive or "\\" in path:
        return windows.name
    return PurePosixPath(path).name


# A URL anywhere in a text: scheme://, up to whitespace, a quote or a closing bracket.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]]*")
# An absolute path: `/a/b`, `~/a`, `C:\a\b`, not preceded by what would make it part of a
# relative name (`mpe/simple_spread`, `steps/s`) or of a URL.
_PATH = re.compile(r"(?<![\w.~/\\:-])(?:~|[A-Za-z]:)?(?:[/\\][^\s/\\'\"<>()\[\],;:]+)+[/\\]?")


def public(text: str) -> str:
    """`text` fit to publish: every URL replaced by `place(url)`, every absolute path by its
    last part. Applied to each string of a report, so data that holds a path (an exception
    message, a param) cannot leak one."""
    text = _URL.sub(lambda found: place(found.group(0)), text)
    return _PATH.sub(lambda found: _last_part(found.group(0).rstrip("/\\")) or "/", text)


def public_all(value):
    """A copy of plain data (dicts, lists, strings) with every string made `public`."""
    return map_strings(value, public)


def duration(seconds: float | None) -> str:
    """Seconds as a reader takes them in: 42.0 s, 7.5 min, 2.1 h; `—` where not known."""
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
