"""The report as data: a JSON document and CSV tables."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from marlctl.report import appendix, labels, reproduction
from marlctl.report.content import (
    CROSSPLAY_EXPLAINED,
    VERDICTS_EXPLAINED,
    config_text,
    notes,
    seed_order,
    warnings,
)
from marlctl.report.labels import public
from marlctl.report.model import Report, seed_of


def _clean(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _estimate(estimate) -> dict | None:
    if estimate is None:
        return None
    return {"value": estimate.value, "low": _clean(estimate.low), "high": _clean(estimate.high)}


def to_dict(report: Report) -> dict[str, Any]:
    groups = []
    for g in report.groups:
        curve = None
        if g.curve is not None:
            curve = {
                "steps": g.curve.steps.tolist(),
                "value": g.curve.value.tolist(),
                "low": [_clean(v) for v in g.curve.low.tolist()],
                "high": [_clean(v) for v in g.curve.high.tolist()],
            }
        groups.append(
            {
                "key": dict(zip(report.group_by, g.key, strict=True)),
                "label": g.label,
                "runs": len(g.runs),
                "seeds": len(g.scores),
                "scores": g.scores,
                "run_ids": [r.run_id for r in g.runs],
                "duplicates": [
                    {
                        "seed": d.seed,
                        "kept": d.kept.run_id,
                        "left_out": [r.run_id for r in d.left_out],
                    }
                    for d in g.duplicates
                ],
                "mean": _estimate(g.mean),
                "iqm": _estimate(g.iqm),
                "env_steps": g.env_steps,
                "wall_s": g.wall_s,
                "steps_per_s": g.steps_per_s,
                "config": g.config,
                "envs": list(g.envs),
                "diverged": g.diverged,
                "differs": g.differs,
                "fewest_seeds": g.fewest_seeds[0],
                "per_seed": [
                    {
                        "seed": seed_of(r),
                        "run_id": r.run_id,
                        "value": _clean(g.finals.get(r.run_id)),
                        "env_steps": r.env_steps,
                    }
                    for r in sorted(g.runs, key=seed_order)
                ],
                "curve": curve,
            }
        )
    sweeps = [
        {
            "name": s.name,
            "experiment": s.experiment,
            "run_id": s.run_id,
            "metric": s.metric,
            "direction": s.direction,
            "counts": s.counts,
            "trials": [vars(t) for t in s.trials],
            "best": [t.number for t in s.best],
            "importances": s.importances,
            "note": s.note,
        }
        for s in report.sweeps
    ]
    # The store by its kind and file name only: a report is for sharing (labels.place).
    document = {
        "store": report.store,
        "metric": report.metric,
        "metric_label": labels.metric(report.metric),
        "direction": report.direction,
        "group_by": list(report.group_by),
        "groups": groups,
        "sweeps": sweeps,
        "left_out": report.left_out,
        "notes": notes(report),
        "warnings": warnings(report),
        "appendix": appendix.to_dict(report),
        "crossplay": _crossplay_dict(report),
        "reproduction": _reproduction_dict(report),
    }
    return labels.public_all(document)


def _reproduction_dict(report: Report) -> dict | None:
    from dataclasses import asdict

    results = reproduction.cell_results(report)
    if not results:
        return None
    cells = [
        {
            **asdict(r.reference),
            "group": report.groups[r.group].label,
            "method": r.method,
            "verdict": r.verdict.kind,
            "reason": r.verdict.reason,
            "ours": _estimate(r.verdict.ours),
            "untrained": r.start,
            "normalised": reproduction.normalised(r, report),
        }
        for r in results
    ]
    profiled = reproduction.profiles(report, results)
    return {
        "cells": cells,
        "profile": {
            "taus": reproduction.PROFILE_TAUS.tolist(),
            "fractions": {m: f.tolist() for m, f in profiled.items()},
        },
        "explained": VERDICTS_EXPLAINED,
    }


def _crossplay_dict(report: Report) -> dict | None:
    from dataclasses import asdict

    table = report.crossplay
    if table is None:
        return None
    return {
        "labels": table.labels,
        "matches": [asdict(m) for m in table.matches],
        "ratings": [{**asdict(r), "ordinal": r.ordinal, "games": r.games} for r in table.ratings],
        "coordination": [c.to_dict() for c in table.coordination],
        "explained": CROSSPLAY_EXPLAINED,
    }


def crossplay_csv(report: Report) -> str | None:
    """The cross-play matches and ratings as one CSV (a row per match, then per rating);
    `agent` is the one agent of the seat a match's run played (empty: the whole group)."""
    table = report.crossplay
    if table is None:
        return None
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(
        ["kind", "seat", "run_id", "run", "opponent_id", "opponent", "score", "win_rate"]
        + ["episodes", "mu", "sigma", "ordinal", "wins", "draws", "losses", "agent"]
    )
    for m in table.matches:
        writer.writerow(
            ["match", m.seat, m.run_id, table.labels[m.run_id], m.opponent,
             table.labels[m.opponent], m.score, m.win_rate, m.episodes]
            + [None] * 6 + [m.agent]
        )  # fmt: skip
    for r in table.ratings:
        writer.writerow(
            ["rating", None, r.run_id, table.labels[r.run_id], None, None, None, None, None,
             r.mu, r.sigma, r.ordinal, r.wins, r.draws, r.losses]
        )  # fmt: skip
    return buffer.getvalue()


def to_csv(report: Report) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(
        [*report.group_by, "label", "config", "runs", "seeds", "mean", "mean_low", "mean_high"]
        + ["iqm"]
        + ["iqm_low", "iqm_high", "env_steps", "wall_s", "steps_per_s"]
    )
    for g in report.groups:
        estimates = []
        for e in (g.mean, g.iqm):
            estimates += [e.value, _clean(e.low), _clean(e.high)] if e else [None] * 3
        key = [None if v is None else public(v) for v in g.key]
        writer.writerow(
            [*key, g.label, config_text(g), len(g.runs), len(g.scores), *estimates]
            + [g.env_steps, g.wall_s, g.steps_per_s]
        )
    return buffer.getvalue()
