"""A built report as a rich table, Markdown with PNGs, one self-contained HTML file, CSV or
JSON. Files are written whole or not at all (a temporary file, then a rename)."""

from __future__ import annotations

import csv
import html
import io
import math
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from marlctl.atomic import replacing
from marlctl.report import Group, Report, Sweep, figures

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
    if value is None:
        return MISSING
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}"


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
    return ", ".join(f"{k}={MISSING if v is None else v}" for k, v in group.config.items())


def rows(report: Report) -> tuple[list[str], list[list[str]], dict[tuple[int, int], bool]]:
    """Header, cells, and which cells are their column's best: shared by every format."""
    configs = any(g.config for g in report.groups)
    header = [*report.group_by, *(["config"] if configs else [])]
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
                *(MISSING if v is None else v for v in g.key),
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


def notes(report: Report) -> list[str]:
    out = []
    for g in report.groups:
        if g.diverged:
            out.append(f"{g.label}: {g.diverged} run(s) ended with a non-finite '{report.metric}'")
        if g.missing > g.diverged:
            out.append(
                f"{g.label}: {g.missing - g.diverged} run(s) logged no '{report.metric}' "
                "(shown missing)"
            )
        if g.differs:
            shown = ", ".join(g.differs[:6]) + (", …" if len(g.differs) > 6 else "")
            out.append(f"{g.label}: runs differ in {shown}; pooled as seeds by --group-by")
        if g.tasks > 1:
            out.append(
                f"{g.label}: raw scores of {g.tasks} envs pooled; bootstrap stratified by env"
            )
        if g.mean is not None and not math.isfinite(g.mean.low) and len(g.scores) > 0:
            out.append(f"{g.label}: no interval: an env has fewer than 2 seeds")
    if report.left_out:
        counts = ", ".join(f"{n} {state.lower()}" for state, n in sorted(report.left_out.items()))
        out.append(f"left out, not finished: {counts}")
    return out


def trial_rows(sweep: Sweep) -> tuple[list[str], list[list[str]]]:
    names = sorted({k for t in sweep.best for k in t.params})
    header = ["trial", sweep.metric, *names, "env steps"]
    body = [
        [
            str(t.number),
            _num(t.value, 3),
            *(_param(t.params.get(n)) for n in names),
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
    return f"{len(sweep.trials)} trials ({counts or 'none'}), {sweep.direction} {sweep.metric}"


# ---------------------------------------------------------------- terminal


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
                "mean": _estimate(g.mean),
                "iqm": _estimate(g.iqm),
                "env_steps": g.env_steps,
                "wall_s": g.wall_s,
                "steps_per_s": g.steps_per_s,
                "config": g.config,
                "envs": list(g.envs),
                "diverged": g.diverged,
                "differs": g.differs,
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
    return {
        "tracking_uri": report.uri,
        "metric": report.metric,
        "direction": report.direction,
        "group_by": list(report.group_by),
        "groups": groups,
        "sweeps": sweeps,
        "left_out": report.left_out,
        "notes": notes(report),
    }


def to_csv(report: Report) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(
        [*report.group_by, "config", "runs", "seeds", "mean", "mean_low", "mean_high", "iqm"]
        + ["iqm_low", "iqm_high", "env_steps", "wall_s", "steps_per_s"]
    )
    for g in report.groups:
        estimates = []
        for e in (g.mean, g.iqm):
            estimates += [e.value, _clean(e.low), _clean(e.high)] if e else [None] * 3
        writer.writerow(
            [*g.key, _config(g), len(g.runs), len(g.scores), *estimates]
            + [g.env_steps, g.wall_s, g.steps_per_s]
        )
    return buffer.getvalue()


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


def markdown(report: Report, out: Path) -> list[Path]:
    """`out` plus PNGs in `<stem>_files/` beside it, linked relatively (renders on GitHub)."""
    import shutil

    folder = out.parent / f"{out.stem}_files"
    out.parent.mkdir(parents=True, exist_ok=True)
    # Figures go to a fresh folder that replaces the old one only once all are drawn.
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{folder.name}."))
    try:
        parts, written = _markdown_parts(report, staging, folder.name)
        if folder.exists():
            shutil.rmtree(folder)
        if written:
            staging.chmod(0o755)
            staging.rename(folder)
        write_atomic(out, "\n\n".join(parts) + "\n")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out, *(folder / name for name in written)]


def _markdown_parts(report: Report, staging: Path, linked: str) -> tuple[list[str], list[str]]:
    """The document's blocks, and the figures drawn into `staging` (linked as `linked/`)."""
    written: list[str] = []

    def figure(path: Path, alt: str) -> None:
        written.append(path.name)
        parts.append(f"![{alt}]({linked}/{path.name})")

    header, body, marks = rows(report)
    parts = [
        "# marlctl report",
        f"{len(report.groups)} groups by {', '.join(report.group_by) or 'nothing'} · "
        f"`{report.metric}`, {report.direction} · {_stamp()}",
    ]
    if body:
        parts += [_md_table(header, body, marks), _EXPLAINED]
    parts += [f"- {n}" for n in notes(report)]
    if figures.has_curves(report):
        figure(figures.curves_png(report, staging / "curves.png"), "sample efficiency")
    for i, sweep in enumerate(report.sweeps):
        parts += [f"## Sweep `{sweep.name}`", sweep_summary(sweep)]
        head, cells = trial_rows(sweep)
        parts.append(_md_table(head, cells) if cells else "No complete trials.")
        if any(t.value is not None for t in sweep.trials):
            path = figures.history_png(sweep, staging / f"sweep{i}_history.png")
            figure(path, "optimisation history")
        if sweep.importances:
            path = figures.importances_png(sweep, staging / f"sweep{i}_importances.png")
            figure(path, "parameter importances")
        if sweep.note:
            parts.append(f"_{sweep.note}_")
    return parts, written


# ---------------------------------------------------------------- HTML

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.35rem 0.7rem; text-align: right; }
th { background: #f4f4f4; }
td:first-child, th:first-child { text-align: left; }
td.best { font-weight: bold; color: #0a7d2c; }
.meta, .note { color: #666; font-size: 0.85rem; }
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


def html_document(report: Report) -> str:
    header, body, marks = rows(report)
    first = True
    parts = [
        "<h1>marlctl report</h1>",
        f'<p class="meta">{len(report.groups)} groups by '
        f"{html.escape(', '.join(report.group_by) or 'nothing')} · "
        f"<code>{html.escape(report.metric)}</code>, {report.direction} · "
        f"{html.escape(report.uri)} · {_stamp()}</p>",
    ]
    if body:
        parts += [_html_table(header, body, marks), f'<p class="note">{_EXPLAINED}</p>']
    parts += [f'<p class="note">{html.escape(n)}</p>' for n in notes(report)]
    if figures.has_curves(report):
        parts += ["<h2>Sample efficiency</h2>", figures.curves_div(report, first)]
        first = False
    for sweep in report.sweeps:
        parts += [
            f"<h2>Sweep <code>{html.escape(sweep.name)}</code></h2>",
            f'<p class="meta">{html.escape(sweep_summary(sweep))}</p>',
        ]
        head, cells = trial_rows(sweep)
        parts.append(_html_table(head, cells) if cells else "<p>No complete trials.</p>")
        if any(t.value is not None for t in sweep.trials):
            parts.append(figures.history_div(sweep, first))
            first = False
        if sweep.importances:
            parts.append(figures.importances_div(sweep, first))
            first = False
        if sweep.note:
            parts.append(f'<p class="note">{html.escape(sweep.note)}</p>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>marlctl report</title><style>{_STYLE}</style></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )


def write_atomic(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write(report: Report, fmt: str, out: Path) -> list[Path]:
    """Write the report as `fmt` at `out`; returns every file written."""
    import json

    if fmt == "md":
        return markdown(report, out)
    if fmt == "html":
        write_atomic(out, html_document(report))
    elif fmt == "csv":
        write_atomic(out, to_csv(report))
    else:
        write_atomic(out, json.dumps(to_dict(report), indent=2, default=str) + "\n")
    return [out]
