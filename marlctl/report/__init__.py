"""`marlctl report`: compare finished runs, read from MLflow only.

Seeds are grouped (by `algo.name,env.id` unless told otherwise); each group gets its final
score as mean and IQM with stratified-bootstrap 95% CIs (`stats`), its cost (env steps,
wall-clock, throughput) and a sample-efficiency curve. A sweep gets its best trials, its
optimisation history and the parameters' importances. An appendix (`appendix`) lists every
group's hyperparameters, where the runs came from and how they were evaluated. Runs that played
each other (`marlctl eval RUN --vs ...`) get a cross-play matrix per seat and ratings.
"""

from marlctl.report.build import build, name_groups
from marlctl.report.model import (
    DEFAULT_GROUP_BY,
    DEFAULT_METRIC,
    INCIDENTAL,
    TOP_TRIALS,
    CrossPlayTable,
    Curve,
    Duplicate,
    Group,
    Report,
    Sweep,
    Trial,
    seed_of,
)

__all__ = [
    "DEFAULT_GROUP_BY",
    "DEFAULT_METRIC",
    "INCIDENTAL",
    "TOP_TRIALS",
    "CrossPlayTable",
    "Curve",
    "Duplicate",
    "Group",
    "Report",
    "Sweep",
    "Trial",
    "build",
    "name_groups",
    "seed_of",
]
