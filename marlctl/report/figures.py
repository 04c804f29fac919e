"""The report's plots, twice: files through matplotlib (PNG for Markdown and READMEs, SVG or
PDF for papers) and interactive plotly divs (HTML). Both draw the same data with the same
colours, the same axis labels and the same step ticks (30k, 1.5M)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from marlctl.report import labels
from marlctl.report.model import Report, Sweep

FILE_FORMATS = ("png", "svg", "pdf")

# matplotlib's tab10, so a group has one colour in both renderings.
COLOURS = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]


def _colour(index: int) -> str:
    return COLOURS[index % len(COLOURS)]


def _rgba(colour: str, alpha: float) -> str:
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Text stays text in an SVG (editable, searchable) and TrueType in a PDF: publishers
    # refuse the Type 3 fonts matplotlib embeds by default. A fixed salt and no date make
    # the same report draw byte-identical SVGs.
    plt.rcParams.update({"svg.fonttype": "none", "pdf.fonttype": 42, "svg.hashsalt": "marlctl"})
    return plt


def _title(report: Report) -> str:
    title = f"{labels.metric(report.metric)}: mean over seeds, 95% bootstrap CI"
    return f"{report.title}\n{title}" if report.title else title  # two lines: it fits


def _cells(report: Report):
    """`(colour, prefix, reference, span)` once per suite cell among the report's groups
    whose reference compares to its metric: `span` the steps its groups' curves cover, the
    colour that of the cell's first group (black in a figure of one cell), `prefix` what its
    lines' labels start with ("" in a figure of one cell, else "CELL: ")."""
    seen: dict[tuple[str, str], tuple[int, list[float]]] = {}
    for i, group in enumerate(report.groups):
        ref = group.reference
        if group.curve is None or ref is None or ref.metric != report.metric:
            continue
        _, span = seen.setdefault((ref.suite, ref.cell), (i, []))
        span += [float(group.curve.steps[0]), float(group.curve.steps[-1])]
    one = len(seen) == 1
    for (_, cell), (i, span) in seen.items():
        colour = "#000000" if one else _colour(i)
        prefix = "" if one else f"{labels.public(cell)}: "
        yield colour, prefix, report.groups[i].reference, (min(span), max(span))


def references(report: Report):
    """`(colour, label, reference, span)` per cell (`_cells`): a dashed line at the
    reference's value."""
    for colour, prefix, ref, span in _cells(report):
        yield colour, f"{prefix}reference", ref, span


POINT_DASHES = (":", "-.", (0, (1, 4)), (0, (5, 2, 1, 2, 1, 2)))  # matplotlib line styles
PLOTLY_DASHES = ("dot", "dashdot", "longdashdot", "longdash")


def points(report: Report):
    """`(colour, label, value, span, style)` for every reference point of the cells
    (`_cells`): a line in the cell's colour, each point of a cell in a style of its own (the
    index into `POINT_DASHES`)."""
    for colour, prefix, ref, span in _cells(report):
        for style, point in enumerate(ref.points):
            yield colour, f"{prefix}{point.name}", point.value, span, style % len(POINT_DASHES)


PROFILE_TITLE = "Performance profile: share of runs reaching τ of the reference's gain"
PROFILE_X = "τ: (final − untrained) / (reference − untrained)"


def has_curves(report: Report) -> bool:
    return any(g.curve is not None for g in report.groups)


def trial_points(sweep: Sweep):
    """`(state, colour, trials)` for the trials with a value: complete ones, then pruned ones
    at their last reported value."""
    for state, colour in (("COMPLETE", "#1f77b4"), ("PRUNED", "#bbbbbb")):
        found = [t for t in sweep.trials if t.state == state and t.value is not None]
        if found:
            yield state, colour, found


def best_so_far(sweep: Sweep) -> tuple[list[int], list[float]]:
    """Trial numbers and the best objective up to each complete trial."""
    numbers, values, best = [], [], None
    pick = max if sweep.direction == "maximize" else min
    for t in sorted(sweep.trials, key=lambda t: t.number):
        if t.state == "COMPLETE" and t.value is not None:
            best = t.value if best is None else pick(best, t.value)
            numbers.append(t.number)
            values.append(best)
    return numbers, values


# ---------------------------------------------------------------- files (matplotlib)


def curves_figure(report: Report):
    """The sample-efficiency figure, not yet saved: every group's mean curve from its first
    evaluation (step 0 where the runs logged one) with its 95% band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    for i, group in enumerate(report.groups):
        curve = group.curve
        if curve is None:
            continue
        colour = _colour(i)
        # Markers too: a curve of one or two evaluations is still seen, step 0 included.
        ax.plot(curve.steps, curve.value, color=colour, lw=2, marker="o", ms=3, label=group.label)
        if np.isfinite(curve.low).all():
            ax.fill_between(curve.steps, curve.low, curve.high, color=colour, alpha=0.2, lw=0)
    for colour, label, ref, _ in references(report):
        ax.axhline(ref.value, color=colour, ls="--", lw=1.5, label=label)
        if ref.high > ref.low:
            ax.axhspan(ref.low, ref.high, color=colour, alpha=0.08, lw=0)
    for colour, label, value, _, style in points(report):
        ax.axhline(value, color=colour, ls=POINT_DASHES[style], lw=1.2, alpha=0.7, label=label)
    _steps_axis(ax)
    _finish(fig, ax, labels.STEPS_AXIS, labels.metric(report.metric), _title(report))
    return fig


def curves_file(report: Report, path: Path) -> Path:
    """The sample-efficiency figure as `path` (PNG, SVG or PDF, by its suffix)."""
    return _save(curves_figure(report), path)


def profile_file(report: Report, path: Path) -> Path:
    """The performance profile across a suite's cells (`reproduction.profiles`)."""
    from marlctl.report.reproduction import PROFILE_TAUS, profiles

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.4), dpi=120)
    for i, (method, fractions) in enumerate(sorted(profiles(report).items())):
        ax.plot(PROFILE_TAUS, fractions, color=_colour(i), lw=2, label=labels.public(method))
    ax.axvline(1.0, color="#7f7f7f", ls=":", lw=1)
    ax.set_ylim(-0.02, 1.02)
    _finish(fig, ax, PROFILE_X, "Fraction of runs ≥ τ", PROFILE_TITLE)
    return _save(fig, path)


def trial_ticks(sweep: Sweep) -> list[int]:
    """Whole trial numbers for the history's x axis, as matplotlib's integer locator places
    them (a trial 1.5 does not exist); the interactive plot gets the same."""
    from matplotlib.ticker import MaxNLocator

    numbers = [t.number for _, _, trials in trial_points(sweep) for t in trials] or [0]
    low, high = min(numbers), max(numbers)
    ticks = MaxNLocator(integer=True).tick_values(low, high)
    return [int(t) for t in ticks if low <= t <= high] or [low]


def history_figure(sweep: Sweep):
    """The optimisation history, not yet saved: each trial's value, and the best so far."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4), dpi=120)
    for state, colour, trials in trial_points(sweep):
        numbers, values = [t.number for t in trials], [t.value for t in trials]
        ax.scatter(numbers, values, s=18, color=colour, label=state.lower())
    numbers, best = best_so_far(sweep)
    if numbers:
        ax.step(numbers, best, where="post", color="#d62728", lw=2, label="best so far")
    ax.set_xticks(trial_ticks(sweep))
    title = f"sweep {sweep.name}: optimisation history"
    _finish(fig, ax, "Trial", labels.metric(sweep.metric), title)
    return fig


def history_file(sweep: Sweep, path: Path) -> Path:
    return _save(history_figure(sweep), path)


def importances_file(sweep: Sweep, path: Path) -> Path:
    plt = _pyplot()
    items = sorted((sweep.importances or {}).items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.4 * max(len(items), 1)), dpi=120)
    ax.barh([k for k, _ in items], [v for _, v in items], color="#1f77b4")
    title = f"sweep {sweep.name}: parameter importances"
    _finish(fig, ax, "Importance (fANOVA)", None, title, legend=False)
    return _save(fig, path)


def schedules(sweep: Sweep) -> dict[str, list[tuple[int, list, list]]]:
    """Per searched key, each population member's schedule: (trial, env steps, values)."""
    found: dict[str, list[tuple[int, list, list]]] = {}
    for trial in sorted(sweep.trials, key=lambda t: t.number):
        for key, points in (trial.schedule or {}).items():
            steps = [int(step) for step, _ in points]
            found.setdefault(key, []).append((trial.number, steps, [v for _, v in points]))
    return found


def schedules_file(sweep: Sweep, path: Path) -> Path:
    """A panel per searched key: each member's value from each exploit/explore step on."""
    plt = _pyplot()
    found = schedules(sweep)
    fig, axes = plt.subplots(len(found), 1, figsize=(8, 2.8 * len(found)), dpi=120, squeeze=False)
    for ax, (key, members) in zip(axes[:, 0], found.items(), strict=True):
        for i, (number, steps, values) in enumerate(members):
            ax.step(steps, values, where="post", color=_colour(i), lw=1.2, label=f"trial {number}")
        _steps_axis(ax)
        ax.grid(alpha=0.3)
        _finish(fig, ax, "Env steps", key, f"sweep {sweep.name}: {key}", legend=False)
    axes[0, 0].legend(loc="best", fontsize=7, ncol=2)
    fig.tight_layout()
    return _save(fig, path)


def schedules_div(sweep: Sweep, first: bool) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    found = schedules(sweep)
    fig = make_subplots(rows=len(found), cols=1, subplot_titles=list(found))
    for row, members in enumerate(found.values(), 1):
        for i, (number, steps, values) in enumerate(members):
            fig.add_trace(
                go.Scatter(
                    x=steps,
                    y=values,
                    mode="lines",
                    line={"shape": "hv", "color": _colour(i)},
                    name=f"trial {number}",
                    legendgroup=str(number),
                    showlegend=row == 1,
                ),
                row=row,
                col=1,
            )
    title = f"sweep {sweep.name}: hyperparameter schedules"
    return _div(fig, first, title, 260 * len(found), "Env steps")


def _steps_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    # Env steps are whole: matplotlib's automatic ticks, never between two steps.
    ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: labels.steps(value)))


def _finish(fig, ax, x: str, y: str | None, title: str, legend: bool = True) -> None:
    ax.set_xlabel(x)
    if y:
        ax.set_ylabel(y)
    ax.set_title(title)
    if legend:
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    kind = path.suffix.lower().lstrip(".")
    if kind not in FILE_FORMATS:
        raise ValueError(f"figure format '{kind}' is not one of {', '.join(FILE_FORMATS)}")
    # No creation date: the same report gives the same file.
    metadata = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(kind)
    fig.savefig(path, metadata=metadata)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- plotly


def _div(
    fig,
    first: bool,
    title: str,
    height: int,
    x: str | None = None,
    y: str | None = None,
    steps: bool = False,
) -> str:
    fig.update_layout(
        title=title.replace("\n", "<br>"),
        xaxis_title=x,
        yaxis_title=y,
        height=height,
        template="plotly_white",
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    if steps:
        # d3's SI format without trailing zeros: 30k, 1.5M, as `labels.steps` writes them.
        fig.update_xaxes(tickformat="~s")
    # The first figure carries plotly.js inline: the HTML file needs nothing else.
    return fig.to_html(
        full_html=False, include_plotlyjs=True if first else False, config={"responsive": True}
    )


def curves_div(report: Report, first: bool) -> str:
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, group in enumerate(report.groups):
        curve = group.curve
        if curve is None:
            continue
        colour = _colour(i)
        x = curve.steps.tolist()
        if np.isfinite(curve.low).all():
            fig.add_trace(
                go.Scatter(
                    x=x + x[::-1],
                    y=curve.high.tolist() + curve.low[::-1].tolist(),
                    mode="lines",
                    fill="toself",
                    fillcolor=_rgba(colour, 0.2),
                    line={"width": 0},
                    hoverinfo="skip",
                    legendgroup=group.label,
                    showlegend=False,
                    name=f"{group.label} 95% CI",
                )
            )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=curve.value.tolist(),
                mode="lines+markers",
                marker={"size": 5},
                line={"color": colour, "width": 2},
                legendgroup=group.label,
                name=group.label,
            )
        )
    for colour, label, ref, span in references(report):
        fig.add_trace(
            go.Scatter(
                x=list(span),
                y=[ref.value, ref.value],
                mode="lines",
                line={"color": colour, "width": 1.5, "dash": "dash"},
                name=label,
            )
        )
    for colour, label, value, span, style in points(report):
        fig.add_trace(
            go.Scatter(
                x=list(span),
                y=[value, value],
                mode="lines",
                opacity=0.7,
                line={"color": colour, "width": 1.2, "dash": PLOTLY_DASHES[style]},
                name=label,
            )
        )
    return _div(
        fig, first, _title(report), 480, labels.STEPS_AXIS, labels.metric(report.metric), True
    )


def profile_div(report: Report, first: bool) -> str:
    import plotly.graph_objects as go

    from marlctl.report.reproduction import PROFILE_TAUS, profiles

    fig = go.Figure()
    for i, (method, fractions) in enumerate(sorted(profiles(report).items())):
        fig.add_trace(
            go.Scatter(
                x=PROFILE_TAUS.tolist(),
                y=fractions.tolist(),
                mode="lines",
                line={"color": _colour(i), "width": 2},
                name=labels.public(method),
            )
        )
    fig.update_yaxes(range=[-0.02, 1.02])
    return _div(fig, first, PROFILE_TITLE, 420, PROFILE_X, "Fraction of runs ≥ τ")


def history_div(sweep: Sweep, first: bool) -> str:
    import plotly.graph_objects as go

    fig = go.Figure()
    for state, colour, trials in trial_points(sweep):
        fig.add_trace(
            go.Scatter(
                x=[t.number for t in trials],
                y=[t.value for t in trials],
                mode="markers",
                marker={"color": colour},
                name=state.lower(),
                text=[", ".join(f"{k}={v}" for k, v in t.params.items()) for t in trials],
            )
        )
    numbers, best = best_so_far(sweep)
    fig.add_trace(
        go.Scatter(
            x=numbers,
            y=best,
            mode="lines",
            line={"shape": "hv", "color": "#d62728"},
            name="best so far",
        )
    )
    fig.update_xaxes(tickmode="array", tickvals=trial_ticks(sweep))
    title = f"sweep {sweep.name}: optimisation history"
    return _div(fig, first, title, 420, "Trial", labels.metric(sweep.metric))


def importances_div(sweep: Sweep, first: bool) -> str:
    import plotly.graph_objects as go

    items = sorted((sweep.importances or {}).items(), key=lambda kv: kv[1])
    fig = go.Figure(go.Bar(x=[v for _, v in items], y=[k for k, _ in items], orientation="h"))
    title = f"sweep {sweep.name}: parameter importances (fANOVA)"
    return _div(fig, first, title, 120 + 30 * len(items))
