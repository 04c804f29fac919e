"""A reference's result in marlctl's conventions, or the reason it cannot be.

marlctl's `eval/return_*` metrics are an episode's return averaged over the agents, from the
deterministic policy (the most probable action), and a budget counts joint env steps (one
step moves every agent); its `eval_sampled/return_*` metrics (`train.eval_sampled`) score the
policy as it acts in training, what a reference that samples its actions compares to. A
reference that sums the return over its agents is divided by their number; one that counts
agent steps has its budget divided by the agents. What cannot be
translated is refused: a stochastic policy's score is not a deterministic one's (nor the other
way round), and an episode of another length is another task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from marlctl.reproduce.suite import Reference

SAMPLED = "eval_sampled/"  # the metrics of a policy evaluated as it acts in training


class Refused(ValueError):
    """The reference cannot be compared with a marlctl run; the message says why."""


@dataclass(frozen=True)
class Translated:
    value: float | None
    interval: tuple[float, float] | None
    per_seed: tuple[float, ...] | None
    budget: int  # joint env steps
    notes: tuple[str, ...]  # what was translated, for the verdict table
    margin: float = 0.0  # half the unit the reference's numbers are rounded to, translated

    @property
    def bounds(self) -> tuple[float, float]:
        """The interval a verdict compares ours with: the reference's own, the 95% bootstrap
        interval of the mean of its per-seed values (as ours), or its value alone; widened by
        `margin`, as a rounded number stands for every value that rounds to it."""
        low, high = self._interval()
        return (low - self.margin, high + self.margin)

    def _interval(self) -> tuple[float, float]:
        if self.per_seed is not None:
            import numpy as np

            from marlctl.report.stats import estimate

            found = estimate(np.asarray(self.per_seed), [0] * len(self.per_seed), "mean")
            if math.isnan(found.low):  # one seed: its value
                return (found.value, found.value)
            return (found.low, found.high)
        if self.interval is not None:
            return self.interval
        assert self.value is not None  # a Reference has a value or per-seed values
        return (self.value, self.value)


def translate(reference: Reference, agents: int, episode_length: int | None) -> Translated:
    """`reference` for an env of `agents` agents whose episodes last `episode_length` steps
    (None where they end on their own)."""
    c = reference.conventions
    sampled_metric = c.metric.startswith(SAMPLED)
    if c.evaluation == "stochastic" and not sampled_metric:
        raise Refused(
            "the reference evaluates a stochastic policy and the cell's metric is the "
            f"deterministic one's ({c.metric}), whose scores differ; compare with "
            f"`metric: {SAMPLED}return_mean` (the cell then also evaluates the sampled policy)"
        )
    if c.evaluation == "deterministic" and sampled_metric:
        raise Refused(f"the reference evaluates a deterministic policy, {c.metric} a sampled one")
    if c.episode_length is not None and c.episode_length != episode_length:
        raise Refused(
            f"the reference's episodes last {c.episode_length} steps, the spec's "
            f"{episode_length if episode_length is not None else 'until they end'}"
        )
    if c.agents is not None and c.agents != agents:
        raise Refused(f"the reference has {c.agents} agents, the spec's env {agents}")
    scale, notes = 1.0, []
    if c.aggregation == "sum" and c.metric.split("/", 1)[-1].startswith("return"):
        scale = 1.0 / agents
        notes.append(f"summed return divided by {agents} agents")
    budget = reference.budget
    if c.step == "agent":
        budget = max(1, round(budget / agents))
        notes.append(f"{reference.budget:,} agent steps are {budget:,} env steps")

    def scaled(v: float) -> float:
        return v * scale

    low_high = reference.interval
    return Translated(
        value=None if reference.value is None else scaled(reference.value),
        interval=None if low_high is None else (scaled(low_high[0]), scaled(low_high[1])),
        per_seed=None if reference.per_seed is None else tuple(map(scaled, reference.per_seed)),
        budget=budget,
        notes=tuple(notes),
        margin=abs(scale) * (reference.precision or 0.0) / 2,
    )
