"""`marlctl sweep`: an Optuna study over `sweep.space`, run by workers that share it.

`prepare` checks the spec and the whole space before anything runs (exit 2 on a problem);
`run_sweep` creates (or continues) the study and its MLflow run, starts the workers here
or on SLURM through submitit, waits, and writes the best trial as a runnable spec;
`sweep_status` reads a study without running anything.
"""

from marlctl.sweep.context import Launcher, SweepSummary
from marlctl.sweep.driver import open_sweep, prepare, run_sweep, sweep_status

__all__ = ["Launcher", "SweepSummary", "open_sweep", "prepare", "run_sweep", "sweep_status"]
