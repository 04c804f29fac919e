"""Progress bars of training runs and of sweeps, on stderr, at most 80 columns wide."""

from __future__ import annotations

from typing import Any

from marlctl.cli import output
from marlctl.cli.output import count, short


def with_progress(work, as_json: bool):
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    # Fits 80 columns (a piped or narrow terminal cuts a longer line short): env steps done
    # of the budget, training speed now, the return of training episodes (with exploration),
    # the last evaluation's return (deterministic policy).
    columns = [
        TextColumn("{task.description}"),
        BarColumn(bar_width=10),
        TextColumn("{task.fields[done]:>5}/{task.fields[budget]}"),
        TextColumn("{task.fields[rate]:>7} steps/s"),
        TextColumn("train {task.fields[ret]:>6}"),
        TextColumn("eval {task.fields[eval]:>6}"),
        TimeRemainingColumn(compact=True),
    ]
    with Progress(*columns, console=output.err, transient=False, disable=as_json) as bar:
        tasks: dict[int, Any] = {}
        marks: dict[int, tuple[float, int]] = {}

        def make(plan):
            for r in plan.runs:
                tasks[r.seed] = bar.add_task(
                    f"seed {r.seed}", total=r.total_env_steps, rate="-", ret="-", eval="-",
                    done="0", budget=count(r.total_env_steps),
                )  # fmt: skip

            def update(event: dict[str, Any]) -> None:
                import time

                if event.get("kind") == "eval":
                    score = event["metrics"].get("eval/return_mean")
                    if score is not None and event["seed"] in tasks:
                        bar.update(tasks[event["seed"]], eval=f"{score:.2f}")
                    return
                now = time.perf_counter()
                seed, step = event["seed"], event["step"]
                last = marks.get(seed)
                marks[seed] = (now, step)
                fields: dict[str, Any] = {}
                if last is not None and now > last[0]:
                    fields["rate"] = f"{(step - last[1]) / (now - last[0]):,.0f}"
                if event.get("return") is not None:
                    fields["ret"] = f"{event['return']:.2f}"
                done = min(step, event["total"])
                bar.update(tasks[seed], completed=done, done=count(done), **fields)

            return update

        return work(make)


def with_sweep_progress(work, budget: int, as_json: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [
        TextColumn("trials"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best {task.fields[best]}"),
        TextColumn("running {task.fields[running]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=output.err, disable=as_json) as bar:
        task = bar.add_task("trials", total=budget, running=0, best="-")
        seen: set[int] = set()

        def show(event: dict[str, Any]) -> None:
            for t in event["finished"]:
                if t["trial"] in seen:
                    continue
                seen.add(t["trial"])
                params = " ".join(f"{k}={short(v)}" for k, v in t["params"].items())
                value = "" if t["value"] is None else f" {t['value']:.4g}"
                why = f" ({t['error'].splitlines()[0][:120]})" if t["error"] else ""
                if not as_json:
                    bar.console.print(
                        f"trial {t['trial']} {t['state']}{value}: {params}{why}",
                        highlight=False,
                        markup=False,
                        soft_wrap=True,
                    )
            best = "-" if event["best"] is None else f"{event['best']:.4g}"
            # Each running trial's env steps (its slowest seed's), as far as it has reported.
            from marlctl.report.labels import steps as count

            steps = event.get("progress", {})
            running = ", ".join(
                f"#{n} {count(done)}/{count(total)}" for n, (done, total) in sorted(steps.items())
            )
            unseen = event["running"] - len(steps)
            running = ", ".join(x for x in (running, f"{unseen} starting" * (unseen > 0)) if x)
            bar.update(task, completed=event["done"], running=running or "0", best=best)

        return work(show)
