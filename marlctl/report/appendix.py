"""The report's appendix: what a reader needs to trust and repeat a comparison — every
hyperparameter of every group (those the groups share once, those that differ side by
side), where the runs came from (versions, hardware, commit), and how they were evaluated.

Hyperparameters are read from the runs' MLflow params (the flattened resolved spec), so
they describe what ran, not what a spec file says today; fields a run's tag
`marlctl.unused` names took no part in it (`marlctl.plan.unused_fields`) and are left out.
Provenance comes from the tags every run gets when it starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from marlctl import tracking
from marlctl.report import labels
from marlctl.report.model import INCIDENTAL, Group, Report

MISSING = "—"
# Hardware settings change how fast runs go, not what they learn; the number of envs also
# sets how much experience each update sees (an on-policy batch), so it is a hyperparameter.
KEPT = ("hardware.num_envs",)
# Settings of what is logged and saved, not of what is learned.
BOOKKEEPING = ("train.log_every", "train.checkpoint_every")
BOOKKEEPING_SUFFIXES = (".checkpoint_replay",)
NOT_APPLICABLE = (
    "— : not a setting of the group's algorithm or model, or one that takes no part in its "
    "runs (the distribution of continuous actions in a run whose actions are discrete, say)."
)
NOT_RECORDED = "not recorded"
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


def _is_hyperparameter(name: str) -> bool:
    """Seeds, names, hardware (but the number of envs), tracking and sweep settings do not
    change what is learned, nor do logging and checkpoint intervals."""
    if name in KEPT:
        return True
    return not (
        name.startswith(INCIDENTAL) or name in BOOKKEEPING or name.endswith(BOOKKEEPING_SUFFIXES)
    )


def _applies(group: Group, name: str) -> bool:
    """Whether the param takes part in some run of the group (runs from before the tag
    existed: assumed so)."""
    return any(name not in r.tags.get(tracking.UNUSED_TAG, "").split(",") for r in group.runs)


def _table(report: Report) -> list[Hyperparameter]:
    """Every hyperparameter that applies to some group, with its value in each group."""
    names = set().union(*(r.params for g in report.groups for r in g.runs))
    found = []
    for name in sorted(n for n in names if _is_hyperparameter(n)):
        values = [_shown(_values(g, name)) if _applies(g, name) else MISSING for g in report.groups]
        if any(v != MISSING for v in values):
            found.append(Hyperparameter(name, [labels.public(v) for v in values]))
    return found


def shared_hyperparameters(report: Report) -> list[tuple[str, str]]:
    """(name, value) of the hyperparameters every group has, with one value."""
    return [
        (h.name, h.values[0])
        for h in _table(report)
        if len(set(h.values)) == 1 and h.values[0] != MISSING
    ]


def hyperparameters(report: Report) -> list[Hyperparameter]:
    """The hyperparameters whose value differs between groups (or that apply to some groups
    only); the group-by keys name the groups already."""
    if len(report.groups) < 2:
        return []
    hidden = set(report.group_by) | {f"params.{k}" for k in report.group_by}
    return [
        h
        for h in _table(report)
        if len(set(h.values)) > 1 and h.name not in hidden and f"params.{h.name}" not in hidden
    ]


# ---------------------------------------------------------------- provenance


PROVENANCE = ("marlctl", "torch", "env package", "device", "hardware", "commit")


def _provenance_of(run) -> dict[str, str]:
    tags = run.tags
    versions = dict(
        part.split("==", 1) for part in tags.get("marlctl.versions", "").split() if "==" in part
    )
    if tags.get(tracking.COMMIT_TAG):
        commit = tags[tracking.COMMIT_TAG][:12]
    elif tags.get(tracking.NO_COMMIT_TAG):
        commit = f"none: {tags[tracking.NO_COMMIT_TAG]}"
    else:
        commit = NOT_RECORDED
    found = {
        "marlctl": versions.get("marlctl"),
        "torch": versions.get("torch"),
        "env package": tags.get(tracking.ENV_PACKAGE_TAG),
        "device": tags.get("marlctl.device"),
        "hardware": tags.get(tracking.HARDWARE_TAG),
        "commit": commit,
    }
    return {k: NOT_RECORDED if v is None else v for k, v in found.items()}


def provenance(report: Report) -> list[Hyperparameter]:
    """Per field of `PROVENANCE`, its value in each group: where a group's runs differ (two
    GPUs, say), every value."""
    rows = []
    for name in PROVENANCE:
        values = []
        for g in report.groups:
            seen = sorted({_provenance_of(r)[name] for r in g.runs})
            values.append(labels.public(" / ".join(seen)) if seen else NOT_RECORDED)
        rows.append(Hyperparameter(name, values))
    return rows


def split(rows: list[Hyperparameter]) -> tuple[list[tuple[str, str]], list[Hyperparameter]]:
    """Rows every group shares, as (name, value), and the rows that differ."""
    shared = [(h.name, h.values[0]) for h in rows if len(set(h.values)) == 1]
    return shared, [h for h in rows if len(set(h.values)) > 1]


# ---------------------------------------------------------------- blocks


@dataclass(frozen=True)
class Block:
    """A part of the appendix as every format writes it: a heading, paragraphs, and a table
    whose first column names params (`code`: Markdown shows them as code)."""

    heading: str
    text: tuple[str, ...] = ()
    header: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    code: bool = False


def blocks(report: Report) -> list[Block]:
    """The hyperparameter and provenance parts of the appendix."""
    names = tuple(g.label for g in report.groups)
    several = len(report.groups) > 1
    out = []
    shared = shared_hyperparameters(report)
    title = "Hyperparameters shared by every group" if several else "Hyperparameters"
    if shared:
        out.append(Block(title, (), ("parameter", "value"), tuple(shared), code=True))
    differing = hyperparameters(report)
    if several:
        title = "Hyperparameters that differ between groups"
        if differing:
            rows = tuple((h.name, *h.values) for h in differing)
            text = (NOT_APPLICABLE,) if any(MISSING in h.values for h in differing) else ()
            out.append(Block(title, text, ("parameter", *names), rows, code=True))
        else:
            out.append(Block(title, ("The groups differ only in the keys that name them.",)))
    same, apart = split(provenance(report))
    if same:
        out.append(Block("Provenance", (), ("field", "value"), tuple(same)))
    if apart:
        rows = tuple((h.name, *h.values) for h in apart)
        title = "Provenance that differs between groups" if same else "Provenance"
        out.append(Block(title, (), ("field", *names), rows))
    return out


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
    same, apart = split(provenance(report))
    return {
        "shared_hyperparameters": dict(shared_hyperparameters(report)),
        "hyperparameters": [
            {"name": h.name, "values": dict(zip(names, h.values, strict=True))}
            for h in hyperparameters(report)
        ],
        "provenance": {
            "shared": dict(same),
            "differing": [
                {"name": h.name, "values": dict(zip(names, h.values, strict=True))} for h in apart
            ],
        },
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
