"""The report's plots, twice: PNG through matplotlib (Markdown, README) and interactive
plotly divs (HTML). Both draw the same data with the same colours."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from marlctl.report import Report, Sweep

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

    return plt


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


# ---------------------------------------------------------------- PNG


def curves_png(report: Report, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    for i, group in enumerate(report.groups):
        curve = group.curve
        if curve is None:
            continue
        colour = _colour(i)
        ax.plot(curve.steps, curve.value, color=colour, lw=2, label=group.label)
        if np.isfinite(curve.low).all():
            ax.fill_between(curve.steps, curve.low, curve.high, color=colour, alpha=0.2, lw=0)
    title = f"{report.metric}: mean over seeds, 95% bootstrap CI"
    return _save(plt, fig, ax, path, "env steps", report.metric, title)


def history_png(sweep: Sweep, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4), dpi=120)
    for state, colour, trials in trial_points(sweep):
        numbers, values = [t.number for t in trials], [t.value for t in trials]
        ax.scatter(numbers, values, s=18, color=colour, label=state.lower())
    numbers, best = best_so_far(sweep)
    if numbers:
        ax.step(numbers, best, where="post", color="#d62728", lw=2, label="best so far")
    title = f"sweep {sweep.name}: optimisation history"
    return _save(plt, fig, ax, path, "trial", sweep.metric, title)


def importances_png(sweep: Sweep, path: Path) -> Path:
    plt = _pyplot()
    items = sorted((sweep.importances or {}).items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.4 * max(len(items), 1)), dpi=120)
    ax.barh([k for k, _ in items], [v for _, v in items], color="#1f77b4")
    title = f"sweep {sweep.name}: parameter importances"
    return _save(plt, fig, ax, path, "importance (fANOVA)", None, title, legend=False)


def _save(plt, fig, ax, path: Path, x: str, y: str | None, title: str, legend=True) -> Path:
    ax.set_xlabel(x)
    if y:
        ax.set_ylabel(y)
    ax.set_title(title)
    if legend:
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- plotly


def _div(
    fig, first: bool, title: str, height: int, x: str | None = None, y: str | None = None
) -> str:
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        height=height,
        template="plotly_white",
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
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
                mode="lines",
                line={"color": colour, "width": 2},
                legendgroup=group.label,
                name=group.label,
            )
        )
    title = f"{report.metric}: mean over seeds, 95% bootstrap CI"
    return _div(fig, first, title, 480, "env steps", report.metric)


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
    title = f"sweep {sweep.name}: optimisation history"
    return _div(fig, first, title, 420, "trial", sweep.metric)


def importances_div(sweep: Sweep, first: bool) -> str:
    import plotly.graph_objects as go

    items = sorted((sweep.importances or {}).items(), key=lambda kv: kv[1])
    fig = go.Figure(go.Bar(x=[v for _, v in items], y=[k for k, _ in items], orientation="h"))
    title = f"sweep {sweep.name}: parameter importances (fANOVA)"
    return _div(fig, first, title, 120 + 30 * len(items))
