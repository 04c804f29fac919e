"""The spec stage: a spec file and its overrides loaded, composed with their presets and
checked into a typed `Spec`, every problem placed at its file and line.

`compose` loads and composes, `problems` turns Hydra's and pydantic's errors into
Problems, `checks` runs the checks that need the env and the machine, `players` those of
the groups that do not learn. Pure: no torch, no mlflow import (a frozen player aside).
"""

from marlctl.spec.checks import (
    check_spec,
    native_params_problem,
    probed_env,
    tracking_problem,
    vmas_problem,
)
from marlctl.spec.compose import load_spec
from marlctl.spec.players import players_problems
from marlctl.spec.problems import env_problem
from marlctl.spec.provenance import (
    OVERRIDES,
    PRESET_GROUPS,
    LoadedSpec,
    Provenance,
    preset_roots,
    sort_problems,
)
from marlctl.spec.teams import learner_info, learning_teams, unused_fields

__all__ = [
    "OVERRIDES",
    "PRESET_GROUPS",
    "LoadedSpec",
    "Provenance",
    "check_spec",
    "env_problem",
    "learner_info",
    "learning_teams",
    "load_spec",
    "native_params_problem",
    "players_problems",
    "preset_roots",
    "probed_env",
    "sort_problems",
    "tracking_problem",
    "unused_fields",
    "vmas_problem",
]
