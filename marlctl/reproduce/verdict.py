"""A cell's verdict: marlctl's seeds against the reference.

Our interval is the 95% percentile-bootstrap interval of the mean over seeds (`report.stats`),
the reference's its own interval, or the same bootstrap over its per-seed values, or its value
alone. Intervals that overlap reproduce the reference; ours wholly above it (better, by the
metric's direction) is `above`, wholly below `below`. Too few seeds, or a budget scaled down,
is `inconclusive` whatever the numbers. Against a regression baseline (marlctl's own earlier
result) an overlap is `matches baseline`, never `reproduced`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from marlctl.report import stats
from marlctl.reproduce.conventions import Translated

MIN_SEEDS = 3  # fewer make no interval worth comparing (`report.stats.THIN_SEEDS`)


@dataclass(frozen=True)
class Verdict:
    kind: str  # reproduced | matches baseline | above | below | inconclusive
    ours: stats.Estimate
    reference: tuple[float, float]  # the reference's interval (a point: low == high)
    reason: str = ""


def _interval(finals: list[float]) -> stats.Estimate:
    return stats.estimate(np.asarray(finals, float), [0] * len(finals), "mean")


def reference_interval(reference: Translated) -> tuple[float, float]:
    if reference.per_seed is not None:
        found = _interval(list(reference.per_seed))
        if math.isnan(found.low):  # one seed: its value
            return (found.value, found.value)
        return (found.low, found.high)
    if reference.interval is not None:
        return reference.interval
    assert reference.value is not None  # a Reference has a value or per-seed values
    return (reference.value, reference.value)


def decide(
    finals: list[float],
    reference: Translated,
    baseline: bool = False,
    scaled: bool = False,
    maximize: bool = True,
) -> Verdict:
    """The verdict on our seeds' final values; `scaled`: the budget was scaled down."""
    ours = _interval(finals)
    theirs = reference_interval(reference)
    if len(finals) < MIN_SEEDS:
        return Verdict("inconclusive", ours, theirs, f"{len(finals)} seeds, {MIN_SEEDS} needed")
    if scaled:
        return Verdict("inconclusive", ours, theirs, "the budget was scaled down")
    low, high = theirs
    if ours.high < low:
        kind = "below" if maximize else "above"
    elif ours.low > high:
        kind = "above" if maximize else "below"
    else:
        kind = "matches baseline" if baseline else "reproduced"
    return Verdict(kind, ours, theirs)
