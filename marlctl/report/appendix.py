"""The report's appendix: what a reader needs to trust and repeat a comparison — the
hyperparameters in which the compared groups differ, and how their runs were evaluated.

Both are read from the runs' MLflow params (the flattened resolved spec), so they describe
what ran, not what a spec file says today.
"""

from __future__ import annotations

from dataclasses import dataclass

from marlctl.report import INCIDENTAL, Group, Report, labels

MISSING = "—"
EPISODES, EVERY, BUDGET = "train.eval_episodes", "train.eval_every", "train.total_env_steps"
# How `marlctl.train.runner.evaluate` plays: `trainer.act(..., deterministic=True)` on an
# eval env seeded from `eval_seed(seed)`, a stream apart from training's.
POLICY = "deterministic policy (the most probable action, no exploration noise)"
EPISODE_SEEDS = "episode seeds drawn apart from training's"


@dataclass(frozen=True)
class Hyperparameter:
    name: str
    values: list[str]  # one per group, in the report's order


@dataclass(frozen=True)
class Evaluation:
    """One group's evaluation protocol; None where its runs did not record the param."""

    group: str
    episodes: int | str | None  # a str lists the values of pooled runs that differ
    every: int | str | None  # env steps between evaluations; 0 = at the end only
    budget: int | str | None  # env steps of training


def hyperparameters(report: Report) -> list[Hyperparameter]:
    """Params whose value differs between groups: seeds, hardware, tracking and sweep
    settings do not change what is learned, and the group-by keys name the groups already."""
    if len(report.groups) < 2:
        return []
    hidden = set(report.group_by) | {f"params.{k}" for k in report.group_by}
    names = set().union(*(r.params for g in report.groups for r in g.runs))
    found = []
    for name in sorted(names):
        if name.startswith(INCIDENTAL) or name in hidden or f"params.{name}" in hidden:
            continue
        values = [_shown(_values(g, name)) for g in report.groups]
        if len(set(values)) > 1:
            found.append(Hyperparameter(name, [labels.public(v) for v in values]))
    return found


def evaluation(report: Report) -> list[Evaluation]:
    return [
        Evaluation(
            g.label,
            _number(_values(g, EPISODES)),
            _number(_values(g, EVERY)),
            _number(_values(g, BUDGET)),
        )
        for g in report.groups
    ]


def shared(protocols: list[Evaluation]) -> Evaluation | None:
    """The protocol every group shares, or None when they differ."""
    distinct = {(p.episodes, p.every, p.budget) for p in protocols}
    if len(distinct) != 1:
        return None
    return Evaluation("all groups", *distinct.pop())


def episodes_text(value: int | str | None) -> str:
    if value is None:
        return "not recorded"
    return labels.plural(value, "episode") if isinstance(value, int) else f"{value} episodes"


def every_text(value: int | str | None) -> str:
    if value is None:
        return "not recorded"
    if value == 0:
        return "at the end of training only"
    shown = labels.steps(value) if isinstance(value, int) else value
    return f"every {shown} env steps and at the end of training"


def budget_text(value: int | str | None) -> str:
    if value is None:
        return "not recorded"
    return f"{labels.steps(value) if isinstance(value, int) else value} env steps"


def protocol_sentence(metric: str, protocol: Evaluation, shown: str | None = None) -> str:
    """The shared protocol in one paragraph; `shown` is the metric's name as the format
    writes code (Markdown's backticks)."""
    return (
        f"Scores are each run's last evaluation of {shown or metric} "
        f"({labels.metric(metric)}), after {budget_text(protocol.budget)} of training. "
        f"Runs were evaluated {every_text(protocol.every)}; each evaluation plays "
        f"{episodes_text(protocol.episodes)} with the {POLICY}, on {EPISODE_SEEDS}."
    )


def policy_sentence(metric: str, shown: str | None = None) -> str:
    """What every group shares even when their protocols differ (the table says the rest)."""
    return (
        f"Scores are each run's last evaluation of {shown or metric} ({labels.metric(metric)}),"
        f" at the end of training. Each evaluation plays its episodes with the {POLICY}, on "
        f"{EPISODE_SEEDS}."
    )


def to_dict(report: Report) -> dict:
    names = [g.label for g in report.groups]
    return {
        "hyperparameters": [
            {"name": h.name, "values": dict(zip(names, h.values, strict=True))}
            for h in hyperparameters(report)
        ],
        "evaluation": {
            "policy": "deterministic",
            "groups": [vars(p) for p in evaluation(report)],
        },
    }


def _values(group: Group, name: str) -> list[str | None]:
    return sorted({r.params.get(name) for r in group.runs}, key=lambda v: (v is None, v or ""))


def _shown(values: list[str | None]) -> str:
    """One value, or every value of the group's (pooled) runs."""
    if values == [None]:
        return MISSING
    return " / ".join(MISSING if v is None else v for v in values)


def _number(values: list[str | None]) -> int | str | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    numbers = [_int(v) for v in known]
    if len(known) == 1 and numbers[0] is not None:
        return numbers[0]
    return " / ".join(labels.public(v) for v in known)


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None
