"""The `marlctl` command line: one module per command, each parsing its arguments, calling one
function of the pipeline and printing; `output` prints and maps errors to exit codes, `main`
runs a command. torch and mlflow are imported only inside commands that train."""

from __future__ import annotations

from marlctl.cli import (
    bench,
    data,
    evaluate,
    listing,
    output,
    report,
    reproduce,
    run,
    sweep,
    validate,
)
from marlctl.cli.app import app
from marlctl.cli.main import main

__all__ = ["app", "main", "output"]

# In the order `--help` lists them.
for _name, _command in [
    ("validate", validate.validate),
    ("run", run.run),
    ("sweep", sweep.sweep),
    ("report", report.report),
    ("eval", evaluate.eval_),
    ("reproduce", reproduce.reproduce),
    ("data", data.data),
    ("bench", bench.bench),
    ("list", listing.list_),
]:
    app.command(_name)(_command)
