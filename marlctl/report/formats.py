"""A built report as a rich table, Markdown with figure files, one self-contained HTML file,
CSV or JSON. Files are written whole or not at all (a temporary file, then a rename).

Every format says the same things: the table, its notes, the warnings a reader must see
before trusting an interval, and (Markdown, HTML, JSON) the appendix. Every string passes
through `labels.public`: a report names no local path and no password.
"""

from __future__ import annotations

import csv
import html
import io
import math
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from marlctl.atomic import replacing
from marlctl.report import Group, Report, Sweep, appendix, figures, labels, seed_of, stats
from marlctl.report.labels import plural, public

MISSING = "—"
_EXPLAINED = (
    "Mean and IQM over seeds of the final value; 95% stratified-bootstrap percentile "
    "intervals (rliable). Best per column in bold."
)


# ---------------------------------------------------------------- cells


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:,.{digits}f}"


def _ci(estimate) -> str:
    if estimate is None or not math.isfinite(estimate.low):
        return MISSING
    return f"[{estimate.low:.2f}, {estimate.high:.2f}]"


def _steps(value: float | None) -> str:
    return MISSING if value is None else labels.steps(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return MISSING
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _seeds(group: Group) -> str:
    return str(len(group.scores)) if not group.missing else f"{len(group.scores)}/{len(group.runs)}"


def _config(group: Group) -> str:
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
                *([_config(g) or MISSING] if configs else []),
                _seeds(g),
                _num(g.mean.value if g.mean else None),
                _ci(g.mean),
                _num(g.iqm.value if g.iqm else None),
                _ci(g.iqm),
                _steps(g.env_steps),
                _duration(g.wall_s),
                _num(g.steps_per_s, 0),
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


def _seed_order(run) -> tuple:
    seed = seed_of(run) or ""
    return (not seed.isdigit(), int(seed) if seed.isdigit() else 0, seed, run.run_id)


def seed_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """Each group's runs, one row per seed: its final value of the metric (what the mean
    and IQM are computed from), its env steps and its run."""
    header = ["group", "seed", f"final {report.metric}", "env steps", "run"]
    body = []
    for g in report.groups:
        for run in sorted(g.runs, key=_seed_order):
            value = g.finals.get(run.run_id)
            shown = "non-finite" if run.diverged else _num(value)
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
            _num(t.value, 3),
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


# ---------------------------------------------------------------- terminal


def crossplay_tables(report: Report) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows): per seat, the seat's return (win rate where the env has one)
    of each run that played it (rows) against each other run (columns); then the ratings."""
    table = report.crossplay
    if table is None:
        return []
    out = []
    name = table.labels
    for seat in table.seats:
        found = [m for m in table.matches if m.seat == seat]
        players = sorted({m.run_id for m in found}, key=lambda r: name[r])
        opponents = sorted({m.opponent for m in found}, key=lambda r: name[r])
        cell = {(m.run_id, m.opponent): m for m in found}

        def shown(m) -> str:
            if m is None:
                return "—"
            return _num(m.score) + ("" if m.win_rate is None else f" ({m.win_rate:.0%} won)")

        body = [
            [name[run], *(shown(cell.get((run, other))) for other in opponents)] for run in players
        ]
        title = f"cross-play, seat {seat}: its return against the other groups' policies"
        head = [f"{seat}: played by ↓, against →", *(name[o] for o in opponents)]
        out.append((title, head, body))
    if table.ratings:
        body = [
            [name[r.run_id], _num(r.mu), _num(r.sigma), _num(r.ordinal),
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
    return out


CROSSPLAY_EXPLAINED = (
    "Cross-play: each run plays a seat (an agent group it learned) with its final policy "
    "while the other run plays every other group it learned, deterministically, over the "
    "seat's run's evaluation episodes (`marlctl eval RUN --vs OTHER` reproduces any cell). "
    "Two runs that both played a seat against each other meet in a game on it; the higher "
    "seat score (win rate where the env says who won, else return) wins, equal scores draw. "
    "Ratings: openskill's Thurstone-Mosteller model (TrueSkill's) over those games in a fixed "
    "order, without dynamics; mu − 3 sigma ranks conservatively."
)


def rich_tables(report: Report) -> list:
    from rich.markup import escape
    from rich.table import Table

    header, body, marks = rows(report)
    tables = []
    if body:
        title = escape(f"{report.metric} at the end of training")
        table = Table(*map(escape, header), title=title)
        for i, cells in enumerate(body):
            table.add_row(
                *(
                    f"[bold green]{escape(c)}[/bold green]" if marks.get((i, j)) else escape(c)
                    for j, c in enumerate(cells)
                )
            )
        tables.append(table)
    for sweep in report.sweeps:
        head, cells = trial_rows(sweep)
        title = escape(f"sweep {sweep.name}: best trials — {sweep_summary(sweep)}")
        trials = Table(*map(escape, head), title=title)
        for row in cells:
            trials.add_row(*map(escape, row))
        tables.append(trials)
        if sweep.importances:
            title = escape(f"sweep {sweep.name}: importances")
            imp = Table("parameter", "importance", title=title)
            for name, value in sweep.importances.items():
                imp.add_row(escape(name), f"{value:.3f}")
            tables.append(imp)
    for title, head, cells in crossplay_tables(report):
        found = Table(*map(escape, head), title=escape(title))
        for row in cells:
            found.add_row(*map(escape, row))
        tables.append(found)
    return tables


# ---------------------------------------------------------------- JSON / CSV


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
                    for r in sorted(g.runs, key=_seed_order)
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
    }
    return labels.public_all(document)


def _crossplay_dict(report: Report) -> dict | None:
    from dataclasses import asdict

    table = report.crossplay
    if table is None:
        return None
    return {
        "labels": table.labels,
        "matches": [asdict(m) for m in table.matches],
        "ratings": [{**asdict(r), "ordinal": r.ordinal, "games": r.games} for r in table.ratings],
        "explained": CROSSPLAY_EXPLAINED,
    }


def crossplay_csv(report: Report) -> str | None:
    """The cross-play matches and ratings as one CSV (a row per match, then per rating)."""
    table = report.crossplay
    if table is None:
        return None
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(
        ["kind", "seat", "run_id", "run", "opponent_id", "opponent", "score", "win_rate"]
        + ["episodes", "mu", "sigma", "ordinal", "wins", "draws", "losses"]
    )
    for m in table.matches:
        writer.writerow(
            ["match", m.seat, m.run_id, table.labels[m.run_id], m.opponent,
             table.labels[m.opponent], m.score, m.win_rate, m.episodes]
            + [None] * 6
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
            [*key, g.label, _config(g), len(g.runs), len(g.scores), *estimates]
            + [g.env_steps, g.wall_s, g.steps_per_s]
        )
    return buffer.getvalue()


# ---------------------------------------------------------------- figure files


def _draw(report: Report, folder: Path, kind: str) -> dict[str, Path]:
    """Every figure of the report drawn into `folder` as `kind` files, by key: `curves`,
    `sweep{i}_history`, `sweep{i}_importances`."""
    drawn: dict[str, Path] = {}
    if figures.has_curves(report):
        drawn["curves"] = figures.curves_file(report, folder / f"curves.{kind}")
    for i, sweep in enumerate(report.sweeps):
        if any(t.value is not None for t in sweep.trials):
            path = folder / f"sweep{i}_history.{kind}"
            drawn[f"sweep{i}_history"] = figures.history_file(sweep, path)
        if sweep.importances:
            path = folder / f"sweep{i}_importances.{kind}"
            drawn[f"sweep{i}_importances"] = figures.importances_file(sweep, path)
    return drawn


def _with_figures(
    report: Report, out: Path, folder: Path, kind: str, compose: Callable[[dict[str, str]], str]
) -> list[Path]:
    """Draw the figures, then write `out` as `compose(links)`, links being each figure's
    path relative to `out`. The figures go to a fresh folder that replaces `folder` only once
    all are drawn, so a failed report leaves the previous one whole."""
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{folder.name}."))
    try:
        drawn = _draw(report, staging, kind)
        text = compose({key: f"{folder.name}/{path.name}" for key, path in drawn.items()})
        if folder.exists():
            shutil.rmtree(folder)
        if drawn:
            staging.chmod(0o755)
            staging.rename(folder)
        write_atomic(out, text)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out, *(folder / path.name for path in drawn.values())]


# ---------------------------------------------------------------- Markdown


def _md_table(header: list[str], body: list[list[str]], marks=None) -> str:
    marks = marks or {}
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, cells in enumerate(body):
        shown = [f"**{c}**" if marks.get((i, j)) else c for j, c in enumerate(cells)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in shown) + " |")
    return "\n".join(lines)


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def markdown(report: Report, out: Path, kind: str = "png") -> list[Path]:
    """`out` plus its figures as `kind` files in `<stem>_files/` beside it, linked relatively
    (renders on GitHub; a PDF is linked, as Markdown cannot show one inline)."""
    folder = out.parent / f"{out.stem}_files"

    def compose(links: dict[str, str]) -> str:
        return "\n\n".join(_markdown_parts(report, links)) + "\n"

    return _with_figures(report, out, folder, kind, compose)


def _markdown_parts(report: Report, links: dict[str, str]) -> list[str]:
    """The document's blocks; `links` maps each drawn figure's key to its relative path."""

    def figure(key: str, alt: str) -> list[str]:
        if key not in links:
            return []
        if links[key].endswith(".pdf"):
            return [f"[{alt} (PDF)]({links[key]})"]
        return [f"![{alt}]({links[key]})"]

    header, body, marks = rows(report)
    parts = [
        "# marlctl report",
        f"{plural(len(report.groups), 'group')} by {', '.join(report.group_by) or 'nothing'} · "
        f"`{report.metric}`, {report.direction} · MLflow store: {report.store} · {_stamp()}",
    ]
    if body:
        parts += [_md_table(header, body, marks), _EXPLAINED]
    parts += [f"> **Warning:** {w}" for w in warnings(report)]
    parts += [f"- {n}" for n in notes(report)]
    parts += figure("curves", "sample efficiency")
    if report.groups:
        parts += ["## Per-seed results", _md_table(*seed_rows(report))]
    for i, sweep in enumerate(report.sweeps):
        parts += [f"## Sweep `{sweep.name}`", sweep_summary(sweep)]
        head, cells = trial_rows(sweep)
        parts.append(_md_table(head, cells) if cells else "No complete trials.")
        parts += figure(f"sweep{i}_history", "optimisation history")
        parts += figure(f"sweep{i}_importances", "parameter importances")
        if sweep.note:
            parts.append(f"_{sweep.note}_")
    found = crossplay_tables(report)
    if found:
        parts.append("## Cross-play")
        for title, head, cells in found:
            parts += [f"### {title[0].upper()}{title[1:]}", _md_table(head, cells)]
        parts.append(CROSSPLAY_EXPLAINED)
    if report.groups:
        parts += ["## Appendix", *_markdown_appendix(report)]
    return parts


def _markdown_appendix(report: Report) -> list[str]:
    parts = []
    for block in appendix.blocks(report):
        parts += [f"### {block.heading}", *block.text]
        if block.rows:
            shown = [[f"`{r[0]}`" if block.code else r[0], *r[1:]] for r in block.rows]
            parts.append(_md_table(list(block.header), shown))
    parts.append("### Evaluation protocol")
    protocols = appendix.evaluation(report)
    common = appendix.shared(protocols)
    if common is not None:
        parts.append(appendix.protocol_sentence(report.metric, common, f"`{report.metric}`"))
    else:
        parts.append(appendix.policy_sentence(report.metric, f"`{report.metric}`"))
        parts.append(_md_table(*_protocol_table(protocols)))
    return parts


def _protocol_table(protocols: list[appendix.Evaluation]) -> tuple[list[str], list[list[str]]]:
    header = ["group", "episodes per evaluation", "evaluated", "training"]
    body = [
        [
            p.group,
            appendix.episodes_text(p.episodes),
            appendix.every_text(p.every),
            appendix.budget_text(p.budget),
        ]
        for p in protocols
    ]
    return header, body


# ---------------------------------------------------------------- HTML

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.35rem 0.7rem; text-align: right; }
th { background: #f4f4f4; }
td:first-child, th:first-child { text-align: left; }
td.best { font-weight: bold; color: #0a7d2c; }
.meta, .note { color: #666; font-size: 0.85rem; }
.warning { color: #7a4b00; background: #fff4e0; border-left: 4px solid #e69500;
  padding: 0.4rem 0.8rem; font-size: 0.9rem; }
"""


def _html_table(header: list[str], body: list[list[str]], marks=None) -> str:
    marks = marks or {}
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    lines = []
    for i, cells in enumerate(body):
        tds = "".join(
            f'<td class="best">{html.escape(c)}</td>'
            if marks.get((i, j))
            else f"<td>{html.escape(c)}</td>"
            for j, c in enumerate(cells)
        )
        lines.append(f"<tr>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def html_document(report: Report, links: dict[str, str] | None = None) -> str:
    """One self-contained page with interactive plots; `links` (figure key → relative path)
    adds a link to each plot's file for print, when figure files were written beside it."""
    links = links or {}
    header, body, marks = rows(report)
    first = True

    def printable(key: str) -> list[str]:
        if key not in links:
            return []
        name = html.escape(links[key])
        return [f'<p class="note">Figure for print: <a href="{name}">{name}</a></p>']

    groups = plural(len(report.groups), "group")
    parts = [
        "<h1>marlctl report</h1>",
        f'<p class="meta">{groups} by '
        f"{html.escape(', '.join(report.group_by) or 'nothing')} · "
        f"<code>{html.escape(report.metric)}</code>, {report.direction} · "
        f"MLflow store: {html.escape(report.store)} · {_stamp()}</p>",
    ]
    if body:
        parts += [_html_table(header, body, marks), f'<p class="note">{_EXPLAINED}</p>']
    parts += [
        f'<p class="warning"><strong>Warning:</strong> {html.escape(w)}</p>'
        for w in warnings(report)
    ]
    parts += [f'<p class="note">{html.escape(n)}</p>' for n in notes(report)]
    if figures.has_curves(report):
        parts += ["<h2>Sample efficiency</h2>", figures.curves_div(report, first)]
        parts += printable("curves")
        first = False
    if report.groups:
        parts += ["<h2>Per-seed results</h2>", _html_table(*seed_rows(report))]
    for i, sweep in enumerate(report.sweeps):
        parts += [
            f"<h2>Sweep <code>{html.escape(sweep.name)}</code></h2>",
            f'<p class="meta">{html.escape(sweep_summary(sweep))}</p>',
        ]
        head, cells = trial_rows(sweep)
        parts.append(_html_table(head, cells) if cells else "<p>No complete trials.</p>")
        if any(t.value is not None for t in sweep.trials):
            parts.append(figures.history_div(sweep, first))
            parts += printable(f"sweep{i}_history")
            first = False
        if sweep.importances:
            parts.append(figures.importances_div(sweep, first))
            parts += printable(f"sweep{i}_importances")
            first = False
        if sweep.note:
            parts.append(f'<p class="note">{html.escape(sweep.note)}</p>')
    found = crossplay_tables(report)
    if found:
        parts.append("<h2>Cross-play</h2>")
        for title, head, cells in found:
            parts += [f"<h3>{html.escape(title[0].upper() + title[1:])}</h3>"]
            parts.append(_html_table(head, cells))
        parts.append(f'<p class="note">{html.escape(CROSSPLAY_EXPLAINED)}</p>')
    if report.groups:
        parts += ["<h2>Appendix</h2>", *_html_appendix(report)]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>marlctl report</title><style>{_STYLE}</style></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )


def _html_appendix(report: Report) -> list[str]:
    parts = []
    for block in appendix.blocks(report):
        parts.append(f"<h3>{html.escape(block.heading)}</h3>")
        parts += [f"<p>{html.escape(text)}</p>" for text in block.text]
        if block.rows:
            parts.append(_html_table(list(block.header), [list(r) for r in block.rows]))
    parts.append("<h3>Evaluation protocol</h3>")
    protocols = appendix.evaluation(report)
    common = appendix.shared(protocols)
    if common is not None:
        parts.append(f"<p>{html.escape(appendix.protocol_sentence(report.metric, common))}</p>")
    else:
        parts.append(f"<p>{html.escape(appendix.policy_sentence(report.metric))}</p>")
        parts.append(_html_table(*_protocol_table(protocols)))
    return parts


def html_page(report: Report, out: Path, kind: str | None = None) -> list[Path]:
    """The page alone; with `kind`, its figures as files in `<stem>_figures/` beside it too
    (a folder of its own: a Markdown report of the same name keeps `<stem>_files/`)."""
    if kind is None:
        write_atomic(out, html_document(report))
        return [out]
    folder = out.parent / f"{out.stem}_figures"
    return _with_figures(report, out, folder, kind, lambda links: html_document(report, links))


def write_atomic(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write(report: Report, fmt: str, out: Path, figure_files: str | None = None) -> list[Path]:
    """Write the report as `fmt` at `out`; returns every file written. `figure_files`
    (png | svg | pdf) is the format of the figure files: Markdown's default is png; HTML
    writes files only when asked, its plots being interactive and inline."""
    import json

    if fmt == "md":
        return markdown(report, out, figure_files or "png")
    if fmt == "html":
        return html_page(report, out, figure_files)
    if fmt == "csv":
        write_atomic(out, to_csv(report))
        crossplay = crossplay_csv(report)
        if crossplay is not None:
            beside = out.with_name(f"{out.stem}_crossplay.csv")
            write_atomic(beside, crossplay)
            return [out, beside]
    else:
        write_atomic(out, json.dumps(to_dict(report), indent=2, default=str) + "\n")
    return [out]
