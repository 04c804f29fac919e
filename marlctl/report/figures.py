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
    for state, colour in (("COMPLETE", "#1f77b4"), ("PRUNED", "#bbbbbb")):
        points = [
            (t.number, t.value) for t in sweep.trials if t.state == state and t.value is not None
        ]
        if points:
            ax.scatter(*zip(*points, strict=True), s=18, color=colour, label=state.lower())
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


def _div(fig, first: bool) -> str:
    fig.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 50, "b": 50})
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
    fig.update_layout(
        title=f"{report.metric}: mean over seeds, 95% bootstrap CI",
        xaxis_title="env steps",
        yaxis_title=report.metric,
        height=480,
    )
    return _div(fig, first)


def history_div(sweep: Sweep, first: bool) -> str:
    import plotly.graph_objects as go

    fig = go.Figure()
    for state, colour in (("COMPLETE", "#1f77b4"), ("PRUNED", "#bbbbbb")):
        points = [t for t in sweep.trials if t.state == state and t.value is not None]
        if points:
            fig.add_trace(
                go.Scatter(
                    x=[t.number for t in points],
                    y=[t.value for t in points],
                    mode="markers",
                    marker={"color": colour},
                    name=state.lower(),
                    text=[", ".join(f"{k}={v}" for k, v in t.params.items()) for t in points],
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
    fig.update_layout(
        title=f"sweep {sweep.name}: optimisation history",
        xaxis_title="trial",
        yaxis_title=sweep.metric,
        height=420,
    )
    return _div(fig, first)


def importances_div(sweep: Sweep, first: bool) -> str:
    import plotly.graph_objects as go

    items = sorted((sweep.importances or {}).items(), key=lambda kv: kv[1])
    fig = go.Figure(go.Bar(x=[v for _, v in items], y=[k for k, _ in items], orientation="h"))
    fig.update_layout(
        title=f"sweep {sweep.name}: parameter importances (fANOVA)",
        height=120 + 30 * len(items),
    )
    return _div(fig, first)
