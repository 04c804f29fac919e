"""The report's text, shared by every format: its table's header, cells and best marks, the
per-seed and best-trial tables, the notes and warnings. Every string passes through
`labels.public`: a report names no local path and no password."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from marlctl import tracking
from marlctl.report import labels, reproduction, stats
from marlctl.report.labels import plural, public
from marlctl.report.model import Group, Report, Sweep, seed_of

MISSING = "—"
EXPLAINED = (
    "Mean and IQM over seeds of the final value; 95% stratified-bootstrap percentile "
    "intervals (rliable). Best per column in bold."
)


def number(value: float | None, digits: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:,.{digits}f}"


def _ci(estimate) -> str:
    if estimate is None or not math.isfinite(estimate.low):
        return MISSING
    return f"[{estimate.low:.2f}, {estimate.high:.2f}]"


def _steps(value: float | None) -> str:
    return MISSING if value is None else labels.steps(value)


def _seeds(group: Group) -> str:
    return str(len(group.scores)) if not group.missing else f"{len(group.scores)}/{len(group.runs)}"


def config_text(group: Group) -> str:
    return public(", ".join(f"{k}={MISSING if v is None else v}" for k, v in group.config.items()))


def rows(report: Report) -> tuple[list[str], list[list[str]], dict[tuple[int, int], bool]]:
    """Header, cells, and which cells are their column's best: shared by every format."""
    configs = any(g.config for g in report.groups)
    named = any(g.custom for g in report.groups)
    header = [*(["group"] if named else []), *report.group_by, *(["config"] if configs else [])]
    width = len(header)
    header += ["seeds", "mean", "95% CI", "IQM", "95% CI", "env steps", "wall-clock", "steps/s"]
    column = {
        "mean": width + 1,
        "iqm": width + 3,
        "wall_s": width + 6,
        "steps_per_s": width + 7,
    }
    marks = {(i, column[name]): True for name, found in report.best.items() for i in found}
    body = []
    for g in report.groups:
        body.append(
            [
                *([g.label] if named else []),
                *(MISSING if v is None else public(v) for v in g.key),
                *([config_text(g) or MISSING] if configs else []),
                _seeds(g),
                number(g.mean.value if g.mean else None),
                _ci(g.mean),
                number(g.iqm.value if g.iqm else None),
                _ci(g.iqm),
                _steps(g.env_steps),
                labels.duration(g.wall_s),
                number(g.steps_per_s, 0),
            ]
        )
    return header, body, marks


def _finished(run) -> str:
    if run.end_ms is None:
        return "end not recorded"
    when = datetime.fromtimestamp(run.end_ms / 1000, UTC)
    return f"finished {when:%Y-%m-%d %H:%M} UTC"


def _duplicate_note(group: Group, found) -> str:
    left = "; ".join(f"run {r.run_id[:8]} ({_finished(r)})" for r in found.left_out)
    times = plural(1 + len(found.left_out), "time")
    return (
        f"{group.label}: seed {found.seed} finished {times} with the same params; counted "
        f"once: kept run {found.kept.run_id[:8]} (the newest, {_finished(found.kept)}), "
        f"left out {left}"
    )


def seed_order(run) -> tuple:
    seed = seed_of(run) or ""
    return (not seed.isdigit(), int(seed) if seed.isdigit() else 0, seed, run.run_id)


def seed_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """Each group's runs, one row per seed: its final value of the metric (what the mean
    and IQM are computed from), its env steps and its run."""
    header = ["group", "seed", f"final {report.metric}", "env steps", "run"]
    body = []
    for g in report.groups:
        for run in sorted(g.runs, key=seed_order):
            value = g.finals.get(run.run_id)
            shown = "non-finite" if run.diverged else number(value)
            seed = seed_of(run)
            body.append(
                [
                    public(g.label),
                    MISSING if seed is None else seed,
                    shown,
                    _steps(run.env_steps),
                    run.run_id[:8],
                ]
            )
    return header, body


SCENARIO_PREFIX = "scenario/"
DATASETS_EXPLAINED = (
    "An offline group's dataset return is the mean return of the dataset's episodes: the "
    "score of the policy that played them, on the same metric. The difference is the group's "
    "mean final value less it."
)
SCENARIOS_EXPLAINED = (
    "Melting Pot scenarios: each seed's policy played the scenario as its focal population "
    "beside the scenario's background players (`marlctl eval RUN --scenario NAME`); the score "
    "is the focal per-capita return, the mean episode return of the focal players, as the "
    "Melting Pot papers define it: mean over seeds (n)."
)


def scenario_rows(report: Report) -> tuple[list[str], list[list[str]]] | None:
    """Per group, the focal per-capita return of each Melting Pot scenario its seeds played
    (`scenario/NAME`), mean over the seeds that played it; None where none did."""
    names = sorted(
        {
            k
            for g in report.groups
            for r in g.runs
            for k in r.metrics
            if k.startswith(SCENARIO_PREFIX)
        }
    )
    if not names:
        return None
    body = []
    for g in report.groups:
        cells = []
        for name in names:
            values = [r.metrics[name] for r in g.runs if name in r.metrics]
            mean = sum(values) / len(values) if values else None
            cells.append(MISSING if mean is None else f"{number(mean)} ({len(values)})")
        body.append([public(g.label), *cells])
    return ["group", *(n.removeprefix(SCENARIO_PREFIX) for n in names)], body


def dataset_rows(report: Report) -> tuple[list[str], list[list[str]]] | None:
    """Per group of offline runs: its dataset (`data`), the dataset's own return (the policy
    that played it) and the group's mean final value beside it; None where no group has
    one, or where the report's metric is not the return."""
    body = []
    for g in report.groups if report.metric == "eval/return_mean" else ():
        key = tracking.DATA_RETURN
        values = [r.metrics[key] for r in g.runs if key in r.metrics]
        if not values:
            continue
        names = sorted({Path(r.params.get("data", "")).name or MISSING for r in g.runs})
        behaviour = sum(values) / len(values)
        ours = g.mean.value if g.mean else None
        gap = MISSING if ours is None else f"{ours - behaviour:+.2f}"
        body.append([public(g.label), public(", ".join(names)), number(behaviour),
                     number(ours), gap])  # fmt: skip
    if not body:
        return None
    return ["group", "dataset", "dataset return", f"mean {report.metric}", "difference"], body


def notes(report: Report) -> list[str]:
    out = []
    for g in report.groups:
        out += [_duplicate_note(g, found) for found in g.duplicates]
        if g.diverged:
            out.append(
                f"{g.label}: {plural(g.diverged, 'run')} ended with a non-finite '{report.metric}'"
            )
        if g.missing > g.diverged:
            out.append(
                f"{g.label}: {plural(g.missing - g.diverged, 'run')} logged no "
                f"'{report.metric}' (shown missing)"
            )
        if g.differs:
            shown = ", ".join(g.differs[:6]) + (", …" if len(g.differs) > 6 else "")
            out.append(f"{g.label}: runs differ in {shown}; pooled as seeds by --group-by")
        if g.tasks > 1:
            out.append(
                f"{g.label}: raw scores of {plural(g.tasks, 'env')} pooled; "
                "bootstrap stratified by env"
            )
        if g.mean is not None and not math.isfinite(g.mean.low) and len(g.scores) > 0:
            out.append(f"{g.label}: no interval: an env has fewer than 2 seeds")
        if g.no_step0 and g.curve is not None:
            with_curves = sum(r.curve is not None for r in g.runs)
            out.append(
                f"{g.label}: no evaluation at step 0 in {plural(g.no_step0, 'seed')} of "
                f"{with_curves}; the curve starts where every seed has data "
                f"({labels.steps(g.curve.steps[0])} env steps)"
            )
        if g.references > 1:
            out.append(
                f"{g.label}: its runs carry {g.references} different suite references; "
                "no verdict for runs of several cells pooled (group by cell)"
            )
    if report.left_out:
        counts = ", ".join(f"{n} {state.lower()}" for state, n in sorted(report.left_out.items()))
        out.append(f"left out, not finished: {counts}")
    return [public(n) for n in out]


def warnings(report: Report) -> list[str]:
    """What a reader must know before trusting a number: groups of fewer than
    `stats.THIN_SEEDS` seeds, whose scores say little against another group's; groups whose
    intervals rest on fewer than `stats.RELIABLE_SEEDS` (on some env, for a group spanning
    several); importances fitted to fewer than `stats.RELIABLE_TRIALS` trials."""
    out = []
    for g in report.groups:
        count, env = g.fewest_seeds
        where = f" on {env}" if env else ""
        has_interval = g.mean is not None and math.isfinite(g.mean.low)
        unreliable = f"intervals from fewer than {stats.RELIABLE_SEEDS} seeds are unreliable"
        if g.scores and count < stats.THIN_SEEDS:
            also = f", and {unreliable}" if has_interval else ""
            out.append(
                f"{g.label}: {plural(count, 'seed')}{where}; too few to compare groups on "
                f"({stats.THIN_SEEDS} at the least){also}"
            )
        elif has_interval and count < stats.RELIABLE_SEEDS:
            out.append(f"{g.label}: {plural(count, 'seed')}{where}; {unreliable}")
    out += _env_versions(report)
    for sweep in report.sweeps:
        fitted = sweep.counts.get("COMPLETE", 0)
        if sweep.importances and fitted < stats.RELIABLE_TRIALS:
            out.append(
                f"sweep {sweep.name}: parameter importances from "
                f"{plural(fitted, 'complete trial')}; fANOVA importances from fewer than "
                f"{stats.RELIABLE_TRIALS} trials are unreliable"
            )
    return [public(w) for w in out]


def trial_rows(sweep: Sweep) -> tuple[list[str], list[list[str]]]:
    names = sorted({k for t in sweep.best for k in t.params})
    header = ["trial", sweep.metric, *names, "env steps"]
    body = [
        [
            str(t.number),
            number(t.value, 3),
            *(public(_param(t.params.get(n))) for n in names),
            _steps(t.env_steps),
        ]
        for t in sweep.best
    ]
    return header, body


def _param(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def sweep_summary(sweep: Sweep) -> str:
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(sweep.counts.items()))
    trials = plural(len(sweep.trials), "trial")
    return f"{trials} ({counts or 'none'}), {sweep.direction} {sweep.metric}"


def crossplay_tables(report: Report) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows): per group seat, the seat's return (win rate where the env has
    one) of each run that played it (rows) against each other run (columns); then the
    ratings; then per group with agent seats, its zero-shot coordination matrix and summary."""
    table = report.crossplay
    if table is None:
        return []
    out = []
    name = table.labels
    for seat in table.seats:
        found = [m for m in table.matches if m.group_seat and m.label == seat]
        players = sorted({m.run_id for m in found}, key=lambda r: name[r])
        opponents = sorted({m.opponent for m in found}, key=lambda r: name[r])
        cell = {(m.run_id, m.opponent): m for m in found}

        def shown(m) -> str:
            if m is None:
                return "—"
            return number(m.score) + ("" if m.win_rate is None else f" ({m.win_rate:.0%} won)")

        body = [
            [name[run], *(shown(cell.get((run, other))) for other in opponents)] for run in players
        ]
        title = f"cross-play, seat {seat}: its return against the other groups' policies"
        head = [f"{seat}: played by ↓, against →", *(name[o] for o in opponents)]
        out.append((title, head, body))
    if table.ratings:
        body = [
            [name[r.run_id], number(r.mu), number(r.sigma), number(r.ordinal),
             f"{r.wins}–{r.draws}–{r.losses}"]
            for r in table.ratings
        ]  # fmt: skip
        out.append(
            (
                "ratings from cross-play (Thurstone-Mosteller, openskill)",
                ["run", "mu", "sigma", "mu − 3 sigma", "won–drawn–lost"],
                body,
            )
        )
    for found in table.coordination:
        runs = sorted(found.runs, key=lambda r: name[r])
        body = [[name[a], *(number(found.cells.get((a, b))) for b in runs)] for a in runs]
        acted = ", sampled actions" if found.sampled else ""
        title = (
            f"zero-shot coordination, group {found.seat}{acted}: its return with one agent "
            "played by the row's run and the others by the column's (self-play on the diagonal)"
        )
        out.append((title, [f"{found.seat}: ↓ with →", *(name[r] for r in runs)], body))
    summary = [
        [found.seat + (" (sampled)" if found.sampled else ""), number(found.self_play),
         number(found.cross_play),
         number(found.cross_play / found.self_play) if _ratio(found) else MISSING]
        for found in table.coordination
    ]  # fmt: skip
    if summary:
        head = ["group", "self-play", "cross-play", "cross-play / self-play"]
        out.append(("zero-shot coordination: mean self-play and cross-play", head, summary))
    return out


def _ratio(found) -> bool:
    """Cross-play over self-play means something: both measured, self-play positive."""
    return found.cross_play is not None and found.self_play is not None and found.self_play > 0


CROSSPLAY_EXPLAINED = (
    "Cross-play: each run plays a seat (an agent group it learned) with its final policy "
    "while the other run plays every other group it learned, deterministically, over the "
    "seat's run's evaluation episodes (`marlctl eval RUN --vs OTHER` reproduces any cell). "
    "Two runs that both played a seat against each other meet in a game on it; the higher "
    "seat score (win rate where the env says who won, else return) wins, equal scores draw. "
    "Ratings: openskill's Thurstone-Mosteller model (TrueSkill's) over those games in a fixed "
    "order, without dynamics; mu − 3 sigma ranks conservatively; `--sampled` matches, where "
    "the policies act as in training, are seats of their own. Zero-shot coordination "
    "(`--seats agents`): a run plays one agent of a group and the other run the group's other "
    "agents; a cell is the group's return, the mean over both runs' seats and every agent, "
    "and the diagonal is each run's self-play over the same episodes. Cross-play below "
    "self-play means the runs learned conventions that do not work with each other's."
)


def _env_versions(report: Report) -> list[str]:
    """Runs of one env made with different versions of its package: their scores may differ
    for that alone (an env's dynamics, observations or rewards change between releases)."""
    by_env: dict[str, dict[str, int]] = {}
    for g in report.groups:
        for run in g.runs:
            version = run.tags.get(tracking.ENV_PACKAGE_TAG)
            if version:
                found = by_env.setdefault(str(run.lookup("env.id")), {})
                found[version] = found.get(version, 0) + 1
    return [
        f"runs on {env} were made with different env package versions: "
        + ", ".join(f"{v} ({plural(n, 'run')})" for v, n in sorted(versions.items()))
        + "; their scores may differ for that alone"
        for env, versions in sorted(by_env.items())
        if len(versions) > 1
    ]


VERDICTS_EXPLAINED = (
    "Verdict: ours is the mean of the seeds' final values with its 95% bootstrap interval; "
    "`reproduced` where it overlaps the reference's interval (`matches baseline` against "
    "marlctl's own earlier result), `above` or `below` where it lies wholly on one side, "
    f"`inconclusive` with fewer than {reproduction.MIN_SEEDS} seeds or a budget below the "
    "reference's. References are in marlctl's conventions: per-agent return, joint env "
    "steps, and the evaluation the metric names (`eval/`: the deterministic policy; "
    "`eval_sampled/`: the policy as it acts in training); a reference rounded to a precision "
    "stands for every value that rounds to it, its interval widened by half that unit."
)
PROFILE_EXPLAINED = (
    "Normalised score of a run: (final − untrained) / (reference − untrained), the untrained "
    "value being its group's evaluation at step 0; 1.0 reaches the reference. The profile at τ "
    "is the fraction of runs scoring at least τ, every cell weighing the same."
)


def verdict_rows(report: Report, results) -> tuple[list[str], list[list[str]]]:
    header = ["suite", "cell", "group", "verdict", "ours", "95% CI", "reference", "source",
              "env steps", "seeds"]  # fmt: skip
    body = []
    for r in results:
        g, ref, v = report.groups[r.group], r.reference, r.verdict
        body.append(
            [
                public(ref.suite),
                public(ref.cell),
                public(g.label),
                f"{v.kind} ({v.reason})" if v.reason else v.kind,
                number(v.ours.value),
                _ci(v.ours),
                ref.interval_text,
                public(f"{ref.kind}: {ref.source}"),
                _steps(g.env_steps),
                _seeds(g),
            ]
        )
    return header, body


POINTS_EXPLAINED = (
    "A reference point is the score of a policy that does not learn, played by every group "
    "that learns in the cell's runs: in the cell's env and metric, on the episodes and "
    "evaluation seeds of its runs' final evaluation, the mean over seeds."
)


def point_rows(results) -> tuple[list[str], list[list[str]]]:
    """The reference points of each suite cell among `results`, once a cell."""
    header = ["suite", "cell", "point", "value", "policy"]
    body, seen = [], set()
    for r in results:
        ref = r.reference
        if (ref.suite, ref.cell) in seen:
            continue
        seen.add((ref.suite, ref.cell))
        for p in ref.points:
            body.append([public(ref.suite), public(ref.cell), public(p.name), number(p.value),
                         public(p.described)])  # fmt: skip
    return header, body


def profile_rows(profiled: dict) -> tuple[list[str], list[list[str]]]:
    taus = reproduction.PROFILE_TAUS
    header = ["method", *(f"runs ≥ {t:g}" for t in reproduction.PROFILE_SHOWN)]
    body = []
    for method, fractions in sorted(profiled.items()):
        at = [float(fractions[int(abs(taus - t).argmin())]) for t in reproduction.PROFILE_SHOWN]
        body.append([public(method), *(f"{v:.0%}" for v in at)])
    return header, body
