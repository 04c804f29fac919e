"""Population-based training (Jaderberg et al. 2017) inside one batch.

The members of a population are sweep trials trained as rows of one batch, each with the
spec's seeds and its own hyperparameters (`marlctl.train.rows`). Every `sweep.pbt.interval`
env steps, at an evaluation, the members are ranked by the mean of their seeds' scores; each
member of the worst quantile *exploits* one of the best quantile, drawn at random: it takes
that member's weights, optimiser state and hyperparameters (seed row k from seed row k), then
*explores*: every searched hyperparameter is multiplied by one of the perturbation factors
(0.8 or 1.2), kept inside its range, or an adjacent choice is taken; with
`resample_probability` it is drawn from its range afresh instead. Each row keeps its own env
episodes and random streams. Every row logs its hyperparameters as `pbt/KEY` at the start
and at each interval (its schedule), and `pbt/exploited` with the member it copied.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from marlctl.train.compact import networks_of
from marlctl.train.lifecycle import Part, RunState

SCHEDULE_PREFIX = "pbt/"
EXPLOITED = "pbt/exploited"  # the index of the member whose weights a member took
# A member's lineage, as its rows' runs keep it: by space key, the values from each env step
# on of the members whose weights it descends from (`train.schedule`'s form).
LINEAGE = "pbt/lineage.json"
REPLAYED_PREFIX = "schedule/"  # a `train.schedule` value, logged where it takes effect


class Population(Part):
    """Exploit and explore between the members of a batch (`sweep.sampler: pbt`)."""

    def __init__(self, run: RunState):
        sweep = run.spec.sweep
        self.config, self.space = sweep.pbt, dict(sweep.space)
        self.metric, self.maximize = sweep.metric, sweep.direction == "maximize"
        self.members = members_of(run.requests)
        # The searched values each member trains with now, by space key.
        self.values = [
            {key: field_value(run.requests[rows[0]].spec, key) for key in self.space}
            for rows in self.members
        ]
        # Each member's lineage: what it trained with, then at each exploit, what the member
        # it copied had trained with, and the values it explored from there.
        self.lineage = [
            {key: [[run.env_steps, value]] for key, value in values.items()}
            for values in self.values
        ]
        seed = sweep.seed if sweep.seed is not None else run.seeds[0]
        self.rng = random.Random(seed)
        self.every = self.config.interval or run.spec.train.eval_every
        self.next = (run.env_steps // self.every + 1) * self.every

    def on_training_start(self, run: RunState) -> None:
        self._log_schedule(run)

    def on_iteration(self, run: RunState, losses: dict[str, torch.Tensor]) -> None:
        if run.env_steps < self.next or run.scored_at != run.env_steps:
            return
        self.next = (run.env_steps // self.every + 1) * self.every
        scores = self._scores(run)
        ranked = sorted(scores, key=scores.get, reverse=self.maximize)  # best first
        count = quantile_count(len(ranked), self.config.quantile)
        if count == 0:
            return
        best, worst = ranked[:count], ranked[-count:]
        for loser in worst:
            winner = self.rng.choice(best)
            self._exploit(run, winner, loser)
            self.values[loser] = {
                key: explore(self.values[winner][key], param, self.config, self.rng)
                for key, param in self.space.items()
            }
            self.lineage[loser] = {
                key: _then(points, run.env_steps, self.values[loser][key])
                for key, points in self.lineage[winner].items()
            }
            for row in self.members[loser]:
                for key, value in self.values[loser].items():
                    run.trainer.set_row_value(key.split(".", 1)[1], row, value)
                if row in run.live:
                    run.sinks[row].log({EXPLOITED: winner}, run.env_steps)
        self._log_schedule(run)

    def on_compact(self, run: RunState, keep: list[int]) -> None:
        """The members whose rows left the batch (a failed seed ends its member's) leave
        the population."""
        kept = [rows[0] in keep for rows in self.members]
        self.values = [v for v, stays in zip(self.values, kept, strict=True) if stays]
        self.lineage = [v for v, stays in zip(self.lineage, kept, strict=True) if stays]
        self.members = members_of(run.requests)

    def on_end(self, run: RunState) -> None:
        """Each member's lineage, kept by its rows' runs (`LINEAGE`)."""
        for member, rows in enumerate(self.members):
            for row in rows:
                if row in run.live:
                    run.client.log_dict(run.requests[row].run_id, self.lineage[member], LINEAGE)

    def _scores(self, run: RunState) -> dict[int, float]:
        """Each member's mean over its seeds of the metric just evaluated; a member whose
        rows ended (a seed failed, which fails them all) or whose score is not finite takes
        no part: it is neither copied nor replaced."""
        scores = {}
        for member, rows in enumerate(self.members):
            if any(run.has_ended(row) for row in rows):
                continue
            found = [run.scores[row].get(self.metric) for row in rows]
            if all(v is not None and math.isfinite(v) for v in found):
                scores[member] = sum(found) / len(found)
        return scores

    def _exploit(self, run: RunState, winner: int, loser: int) -> None:
        copy_rows(run.trainer, self.members[winner], self.members[loser])

    def _log_schedule(self, run: RunState) -> None:
        for member, rows in enumerate(self.members):
            logged = {
                SCHEDULE_PREFIX + key: float(value)
                for key, value in self.values[member].items()
                if isinstance(value, int | float)
            }
            for row in rows:
                if row in run.live:
                    run.sinks[row].log(logged, run.env_steps)


def _then(points: list, step: int, value: Any) -> list:
    """`points` ([step, value] from each step on), and `value` from `step` on."""
    return points if points[-1][1] == value else [*points, [step, value]]


class Schedule(Part):
    """`train.schedule`: every row takes each scheduled value at the first iteration that
    reaches its env step (a resumed run, every value up to its step, before training), or,
    for a `linear` entry, the value interpolated at each iteration's first env step; an
    `env.PARAM` entry changes the training env. Each value is logged as `schedule/KEY` (the
    field's name alone for `algo`) where it changes."""

    def __init__(self, run: RunState):
        from marlctl.spec.sections import schedule_points

        self.points, self.linear = [], {}
        for key, entry in run.spec.train.schedule.items():
            points, linear = schedule_points(entry)
            if linear:
                self.linear[key] = [(float(step), float(value)) for step, value in points]
            else:
                self.points += [(step, key, value) for step, value in points]
        self.points.sort()
        self.taken, self.now = 0, {}

    def on_start(self, run: RunState) -> None:
        self._take(run)

    def on_iteration(self, run: RunState, losses: dict[str, torch.Tensor]) -> None:
        self._take(run)

    def _take(self, run: RunState) -> None:
        due = {}
        while self.taken < len(self.points) and self.points[self.taken][0] <= run.env_steps:
            _, key, value = self.points[self.taken]
            due[key] = value
            self.taken += 1
        for key, points in self.linear.items():
            due[key] = interpolated(points, run.env_steps)
        changed = {}
        for key, value in due.items():
            if self.now.get(key) == value:
                continue
            self.now[key] = value
            section, _, name = key.partition(".")
            if section == "env":
                run.env.set_param(name, value)
            else:
                for row in range(len(run.requests)):
                    run.trainer.set_row_value(name, row, value)
            changed[REPLAYED_PREFIX + (key if section == "env" else name)] = float(value)
        for row in run.live if changed else ():
            run.sinks[row].log(changed, run.env_steps)


def interpolated(points: list[tuple[float, float]], step: int) -> float:
    """The value of the piecewise-linear schedule `points` at `step`."""
    if step <= points[0][0]:
        return points[0][1]
    for (s0, v0), (s1, v1) in zip(points, points[1:], strict=False):
        if step <= s1:
            return v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return points[-1][1]


def members_of(requests: list) -> list[list[int]]:
    """The batch's rows by member (trial), in order: each member's seed rows."""
    members: dict[Any, list[int]] = {}
    for index, request in enumerate(requests):
        members.setdefault(request.trial, []).append(index)
    found = list(members.values())
    if len({len(rows) for rows in found}) > 1:
        raise ValueError("the members of a population must train the same seeds")
    return found


def quantile_count(members: int, quantile: float) -> int:
    """How many members the best and the worst quantile hold: at least one where there are
    two members or more, at most half of them."""
    if members < 2:
        return 0
    # ceil, less a rounding error of the product (100 x 0.07 is 7.000000000000001)
    return min(members // 2, max(1, math.ceil(members * quantile - 1e-9)))


def explore(value: Any, param, config, rng: random.Random) -> Any:
    """A perturbed `value` of search parameter `param` (a range or choices)."""
    resample = rng.random() < config.resample_probability
    if hasattr(param, "choices"):
        choices = list(param.choices)
        if resample or value not in choices:
            return rng.choice(choices)
        index = choices.index(value) + rng.choice((-1, 1))
        return choices[min(max(index, 0), len(choices) - 1)]
    low, high = float(param.low), float(param.high)
    if resample:
        found = (
            math.exp(rng.uniform(math.log(low), math.log(high)))
            if param.log
            else rng.uniform(low, high)
        )
    else:
        factor = rng.choice(config.perturb)
        found = min(max(float(value) * factor, low), high)
        if param.is_int and round(found) == value and factor != 1:
            # A small integer that a factor leaves where it was moves by one its way.
            found = min(max(value + (1 if factor > 1 else -1), low), high)
    if param.step is not None:  # the nearest point of the grid, inside the range
        top = math.floor((high - low) / param.step + 1e-9)
        found = low + min(max(round((found - low) / param.step), 0), top) * param.step
    return int(round(found)) if param.is_int else found


def copy_rows(trainer, sources: list[int], targets: list[int]) -> None:
    """Rows `targets` of every weight and buffer of the trainer's networks (online and
    target), of its optimisers' state and of its own per-row state (`copy_extra_rows`) take
    the values of rows `sources`, in place (a captured graph reads them)."""
    if not sources:
        return
    S = len(trainer.seeds)
    device = trainer.device
    src = torch.tensor(sources, device=device)
    dst = torch.tensor(targets, device=device)

    def copy(tensor: torch.Tensor, where: str) -> None:
        if tensor.dim() == 0:
            return  # shared by every row (a step count)
        if tensor.shape[0] != S:
            raise ValueError(f"{where}: {tuple(tensor.shape)} has no leading row of {S}")
        tensor.data.index_copy_(0, dst.to(tensor.device), tensor.data.index_select(0, src))

    with torch.no_grad():
        for name, module in networks_of(trainer):
            for key, tensor in module.state_dict(keep_vars=True).items():
                copy(tensor, f"{name}.{key}")
        for name, optimizer in trainer.optimizers.items():
            for state in optimizer.state.values():
                for key, value in state.items():
                    if torch.is_tensor(value):
                        copy(value, f"optimizer {name}: {key}")
        trainer.copy_extra_rows(src, dst)


def field_value(spec, key: str) -> Any:
    """The value of the spec field a space key names (`algo.lr`)."""
    section, _, name = key.partition(".")
    return getattr(getattr(spec, section), name)
