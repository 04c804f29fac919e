"""A suite's cells in a report: each cell's verdict, its seeds against its reference, and the
performance profile of every method across the cells.

The verdict: our interval is the 95% percentile-bootstrap interval of the mean of the seeds'
final values, the reference's its own interval (or its value). Intervals that overlap reproduce
the reference; ours wholly on the better side (by the metric's direction) is `above`, wholly on
the worse side `below`. Fewer than `MIN_SEEDS` seeds, or a budget below the reference's, is
`inconclusive` whatever the numbers. Against a regression baseline (marlctl's own earlier
result) an overlap is `matches baseline`, never `reproduced`.

The profile (Agarwal et al. 2021's performance profile, over cells rather than games): a run's
normalised score is the share of the reference's gain over the untrained policy its final value
reaches, `(final - start) / (reference - start)`, `start` being its group's evaluation at step
0; the profile at τ is the fraction of runs scoring at least τ, each cell weighing the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from marlctl.report import stats
from marlctl.report.model import Group, Report
from marlctl.report.references import CellReference

MIN_SEEDS = stats.THIN_SEEDS  # fewer make no interval worth comparing
PROFILE_TAUS = np.linspace(0.0, 1.5, 61)
PROFILE_SHOWN = (0.5, 0.75, 1.0)  # the thresholds a profile's table shows


@dataclass(frozen=True)
class Verdict:
    kind: str  # reproduced | matches baseline | above | below | inconclusive
    ours: stats.Estimate
    reference: tuple[float, float]  # the reference's interval (a point: low == high)
    reason: str = ""


def decide(
    finals: list[float],
    reference: tuple[float, float],
    baseline: bool = False,
    scaled: bool = False,
    maximize: bool = True,
) -> Verdict:
    """The verdict on our seeds' final values against the reference's interval; `scaled`:
    our budget was below the reference's."""
    ours = stats.estimate(np.asarray(finals, float), [0] * len(finals), "mean")
    if len(finals) < MIN_SEEDS:
        reason = f"{len(finals)} seed{'s' if len(finals) != 1 else ''}, {MIN_SEEDS} needed"
        return Verdict("inconclusive", ours, reference, reason)
    if scaled:
        return Verdict("inconclusive", ours, reference, "the budget was scaled down")
    low, high = reference
    if ours.high < low:
        kind = "below" if maximize else "above"
    elif ours.low > high:
        kind = "above" if maximize else "below"
    else:
        kind = "matches baseline" if baseline else "reproduced"
    return Verdict(kind, ours, reference)


def seed_values(
    curves: list[tuple[np.ndarray, np.ndarray]], statistic: str, maximize: bool = True
) -> list[float]:
    """Each seed's value as a reference's `statistic` takes it from its evaluations: `final`
    the last; `maximum` its value where the mean over seeds is best (curves interpolated on the
    steps every seed has), as a paper's table of maximum returns reports; `average` the mean
    of its evaluations over training, the untrained one at step 0 included."""
    if statistic == "final":
        return [float(values[-1]) for _, values in curves]
    if statistic == "average":
        return [float(np.mean(values)) for _, values in curves]
    _, grid = stats.common_grid(curves)
    mean = grid.mean(axis=0)
    best = int(np.argmax(mean) if maximize else np.argmin(mean))
    return [float(v) for v in grid[:, best]]


@dataclass(frozen=True)
class CellResult:
    group: int  # index into the report's groups
    reference: CellReference
    verdict: Verdict
    method: str  # the algorithm, as the runs name it
    start: float | None  # the group's mean evaluation at step 0, where it has one
    scores: list[float]  # each seed's value, as the reference's statistic takes it


def _budget(group: Group) -> int | None:
    found = [r.params.get("train.total_env_steps") for r in group.runs]
    values = [int(float(v)) for v in found if v not in (None, "", "null")]
    return min(values) if values else None


def cell_results(report: Report) -> list[CellResult]:
    """Every group of one suite cell whose reference compares to the report's metric."""
    out = []
    for i, group in enumerate(report.groups):
        ref = group.reference
        if ref is None or ref.metric != report.metric:
            continue
        budget = _budget(group)
        scaled = budget is not None and budget < ref.budget
        maximize = report.direction == "maximize"
        scores = group.scores
        if ref.statistic != "final":
            curves = [r.curve for r in group.runs if r.curve is not None and len(r.curve[0])]
            scores = seed_values(curves, ref.statistic, maximize) if curves else []
        verdict = decide(
            scores,
            (ref.low, ref.high),
            baseline=ref.baseline,
            scaled=scaled,
            maximize=maximize,
        )
        methods = sorted({str(r.lookup("algo.name")) for r in group.runs})
        curve = group.curve
        start = None
        if curve is not None and len(curve.steps) and curve.steps[0] == 0:
            start = float(curve.value[0])
        out.append(CellResult(i, ref, verdict, " / ".join(methods), start, scores))
    return out


def normalised(result: CellResult, report: Report) -> list[float] | None:
    """The cell's runs' normalised scores (module docstring), or None where the group has no
    evaluation at step 0 or the reference is no better than it."""
    if result.start is None:
        return None
    gain = result.reference.value - result.start
    better = gain > 0 if report.direction == "maximize" else gain < 0
    if not better or not math.isfinite(gain):
        return None
    return [(s - result.start) / gain for s in result.scores]


def profiles(
    report: Report, results: list[CellResult] | None = None, taus: np.ndarray = PROFILE_TAUS
) -> dict[str, np.ndarray]:
    """Per method, the fraction of its runs at or above each τ, every cell weighing the same;
    only methods with at least two cells to profile."""
    by_method: dict[str, list[np.ndarray]] = {}
    for result in cell_results(report) if results is None else results:
        scores = normalised(result, report)
        if not scores:
            continue
        reached = (np.asarray(scores)[:, None] >= taus[None, :]).mean(axis=0)
        by_method.setdefault(result.method, []).append(reached)
    return {m: np.mean(found, axis=0) for m, found in by_method.items() if len(found) >= 2}


def cells_of(results: list[CellResult]) -> dict[tuple[str, str], list[int]]:
    """The groups of each (suite, cell), in the report's order: what a cell's figure draws."""
    out: dict[tuple[str, str], list[int]] = {}
    for result in results:
        key = (result.reference.suite, result.reference.cell)
        out.setdefault(key, []).append(result.group)
    return out
