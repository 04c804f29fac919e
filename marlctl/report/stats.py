"""Aggregate scores over seeds the way rliable does (Agarwal et al. 2021, "Deep RL at the
Edge of the Statistical Precipice"): the interquartile mean, and percentile confidence
intervals from a stratified bootstrap, which resamples runs within each task.

Vectorised over bootstrap replicates and curve points, and it accepts tasks with unequal
numbers of seeds (rliable's score matrices must be rectangular).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REPS = 5000
CONFIDENCE = 0.95
# A percentile bootstrap over n runs resamples only n values: for small n its interval is
# too narrow and covers the true value less often than it claims. Reports warn below this
# many seeds per env; a rule of thumb, not a guarantee above it.
RELIABLE_SEEDS = 5
# Below this many seeds a group's score is too thin to set against another's at all: one
# or two runs say next to nothing of the spread between seeds.
THIN_SEEDS = 3
# fANOVA fits a random forest to the trials: with few of them the importances move with
# the trials drawn and the forest's own randomness. A rule of thumb, as the two above.
RELIABLE_TRIALS = 20


def iqm(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Mean of the middle 50%: 25% trimmed from each end (scipy's `trim_mean`, as rliable)."""
    values = np.sort(np.asarray(scores, dtype=float), axis=axis)
    n = values.shape[axis]
    cut = int(0.25 * n)
    return np.take(values, np.arange(cut, n - cut), axis=axis).mean(axis=axis)


def _mean(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(scores, dtype=float).mean(axis=axis)


STATISTICS = {"mean": _mean, "iqm": iqm}


def stratified_resample(tasks: list, reps: int, rng: np.random.Generator) -> np.ndarray:
    """Indices `[reps, n]` into the runs, `tasks` being each run's task label: each replicate
    draws, with replacement, as many runs from each task as the task has, and only from it."""
    task = np.asarray(tasks)
    columns = []
    for value in np.unique(task):
        members = np.flatnonzero(task == value)
        columns.append(members[rng.integers(0, len(members), size=(reps, len(members)))])
    return np.concatenate(columns, axis=1)


def fewest_per_task(tasks: list) -> tuple[int, object]:
    """The smallest number of runs any task has, and that task: what a stratified interval's
    reliability hangs on."""
    values, counts = np.unique(np.asarray(tasks), return_counts=True)
    index = int(np.argmin(counts))
    return int(counts[index]), values[index].item()


def resamplable(tasks: list) -> bool:
    """A bootstrap interval needs two runs in every task: a task with one run is the same
    in every replicate, and an interval over such tasks only would have zero width."""
    _, counts = np.unique(np.asarray(tasks), return_counts=True)
    return len(counts) > 0 and bool((counts >= 2).all())


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float


def estimate(
    scores: np.ndarray,
    tasks: list,
    statistic: str,
    reps: int = REPS,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """A statistic of `scores` (one per run) with its stratified-bootstrap percentile CI."""
    values = np.asarray(scores, dtype=float)
    func = STATISTICS[statistic]
    point = float(func(values))
    if not resamplable(tasks):
        return Estimate(point, float("nan"), float("nan"))
    index = stratified_resample(tasks, reps, np.random.default_rng(seed))
    low, high = _percentiles(func(values[index], axis=-1), confidence)
    return Estimate(point, float(low), float(high))


def band(
    curves: np.ndarray,
    tasks: list,
    statistic: str = "mean",
    reps: int = 2000,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point estimate and CI at every column of `curves` `[runs, points]`; one set of bootstrap
    indices serves every point, so the band is as smooth as the curves."""
    values = np.asarray(curves, dtype=float)
    func = STATISTICS[statistic]
    point = func(values, axis=0)
    if not resamplable(tasks):
        nan = np.full_like(point, np.nan)
        return point, nan, nan
    index = stratified_resample(tasks, reps, np.random.default_rng(seed))
    low, high = np.empty_like(point), np.empty_like(point)
    # [reps, runs, points] at once could take gigabytes for long curves: a slice of points
    # at a time, all with the same replicates.
    chunk = max(1, 2**24 // max(1, index.size))
    for start in range(0, values.shape[1], chunk):
        part = slice(start, start + chunk)
        samples = func(values[:, part][index], axis=1)  # [reps, points]
        low[part], high[part] = _percentiles(samples, confidence)
    return point, low, high


def _percentiles(samples: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    tail = (1 - confidence) / 2 * 100
    return np.percentile(samples, tail, axis=0), np.percentile(samples, 100 - tail, axis=0)


def common_grid(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Put seeds' curves `(steps, values)` on shared steps: the union of their steps where
    every seed has data, each curve linearly interpolated there. Returns `(steps, [runs, n])`."""
    start = max(float(steps[0]) for steps, _ in curves)
    stop = min(float(steps[-1]) for steps, _ in curves)
    every = np.unique(np.concatenate([steps for steps, _ in curves]))
    grid = every[(every >= start) & (every <= stop)]
    values = np.stack([np.interp(grid, steps, ys) for steps, ys in curves])
    return grid, values
