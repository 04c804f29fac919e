"""The registered env families: each id, its factory, what it needs installed and the command that
installs it, found without importing the env packages."""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EnvEntry:
    id: str
    factory: str  # "module:callable" returning a PettingZoo ParallelEnv
    suite: str
    summary: str
    requires: tuple[str, ...] = ()  # modules the env imports beyond its package
    extra: str | None = None  # the marlctl extra that installs `requires` (pyproject.toml)
    # Keywords the factory always gets for this id (a family factory's task name).
    kwargs: tuple[tuple[str, Any], ...] = ()
    # Agents of one space form a group per name (`red_0`, `blue_0`: armies of one kind).
    teams_by_name: bool = False

    @property
    def missing(self) -> tuple[str, ...]:
        """Modules the env needs that are not installed (found without importing them)."""
        modules = (self.factory.split(":")[0].split(".")[0], *self.requires)
        return tuple(m for m in modules if not _importable(m))

    @property
    def installed(self) -> bool:
        return not self.missing

    @property
    def install_hint(self) -> str | None:
        """The command that installs what is missing, or None when nothing is."""
        missing = self.missing
        if not missing:
            return None
        if self.extra is not None:
            return f"pip install 'marlctl[{self.extra}]'"
        return "pip install " + " ".join(DISTRIBUTIONS.get(m, m) for m in missing)


# The distribution that provides a module, where the names differ. MOMAland declares pygame
# (which would overwrite the pygame-ce the SISL envs install) and wandb; the MOMAland envs
# registered here import neither, so it is installed without its declared dependencies.
DISTRIBUTIONS = {
    "pygame": "pygame-ce",
    "Box2D": "box2d",
    "momaland": "--no-deps momaland",
    "meltingpot": "dm-meltingpot",
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _latest(package: str, name: str) -> str | None:
    """`package.name_vN` with the highest N that is installed, without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except ImportError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    versions = []
    for folder in spec.submodule_search_locations:
        for path in Path(folder).glob(f"{name}_v*.py"):
            suffix = path.stem.removeprefix(f"{name}_v")
            if suffix.isdigit():
                versions.append(int(suffix))
    return f"{package}.{name}_v{max(versions)}" if versions else None


def _suite(
    prefix: str,
    package: str,
    envs: dict[str, tuple[str, tuple[str, ...]]],
    extra: str | None = None,
):
    for name, (summary, requires) in envs.items():
        module = _latest(package, name)
        if module is not None:
            factory = f"{module}:parallel_env"
            yield EnvEntry(f"{prefix}/{name}", factory, prefix, summary, requires, extra)


MPE = {
    "simple": ("one agent reaches a landmark", ()),
    "simple_spread": ("N agents cover N landmarks, cooperative", ()),
    "simple_adversary": ("good agents hide the target from an adversary", ()),
    "simple_tag": ("predators chase faster prey", ()),
    "simple_push": ("adversary pushes an agent away from its landmark", ()),
    "simple_reference": ("two agents communicate each other's goal", ()),
    "simple_speaker_listener": ("a speaker guides a listener (heterogeneous)", ()),
    "simple_crypto": ("two agents talk privately past an eavesdropper", ()),
    "simple_world_comm": ("leader-led adversaries, forests, food", ()),
    "simple_line": ("agents form a line", ()),
    "simple_formation": ("agents form a shape around a landmark", ()),
    "collect_treasure": ("hunters collect and deposit treasure", ()),
}
SISL = {
    "pursuit": ("pursuers surround evaders on a grid", ("pygame",)),
    "waterworld": ("archea eat food and avoid poison", ("pygame", "pymunk")),
    "multiwalker": ("walkers carry a package", ("pygame", "Box2D")),
}
BUTTERFLY = {
    "knights_archers_zombies": ("knights and archers hold off zombies", ("pygame",)),
    "pistonball": ("pistons move a ball left (image obs)", ("pygame", "pymunk")),
    "cooperative_pong": ("two paddles keep a ball in play (image obs)", ("pygame",)),
}
# Gymnasium envs with tuple spaces (`marlctl.envs.gymma`): the tasks of EPyMARL's benchmark
# (Papoudakis et al. 2021) are listed, with presets; any other id the package registers is
# found by `lookup` too.
LBF_TASKS = (
    "Foraging-8x8-2p-2f-coop-v3",
    "Foraging-2s-8x8-2p-2f-coop-v3",
    "Foraging-8x8-2p-3f-v3",
    "Foraging-10x10-3p-3f-v3",
    "Foraging-2s-10x10-3p-3f-v3",
    "Foraging-15x15-4p-3f-v3",
)
RWARE_TASKS = (
    "rware-tiny-2ag-v2",
    "rware-tiny-4ag-v2",
    "rware-small-4ag-v2",
    "rware-tiny-2ag-hard-v2",
)
# A level-based foraging task name as `lbforaging` registers it: its grid and sight, players,
# food, and whether food needs every player (coop), has one level (ind), or costs a penalty.
LBF_TASK = re.compile(
    r"^Foraging(?P<grid>-grid)?(?:-(?P<sight>\d+)s)?-(?P<size>\d+)x(?P=size)-(?P<players>\d+)p"
    r"-(?P<food>\d+)f(?P<coop>-coop)?(?P<ind>-ind)?(?P<pen>-pen)?-v(?P<version>\d+)$"
)
_RWARE_ID = re.compile(
    r"^rware(?P<image>-img)?-(?P<size>tiny|small|medium|large)-(?P<agents>\d+)ag"
    r"(?P<difficulty>-easy|-hard)?-v\d+$"
)


def _lbf_summary(task: str) -> str | None:
    m = LBF_TASK.match(task)
    if m is None:
        return None
    sight = f", sight {m['sight']}" if m["sight"] else ""
    coop = ", every food needs all players" if m["coop"] else ""
    return (
        f"level-based foraging: {m['size']}x{m['size']} grid, {m['players']} players, "
        f"{m['food']} food{sight}{coop}"
    )


def _rware_summary(task: str) -> str | None:
    m = _RWARE_ID.match(task)
    if m is None:
        return None
    difficulty = f", {m['difficulty'][1:]} requests" if m["difficulty"] else ""
    return f"robot warehouse: {m['size']}, {m['agents']} robots{difficulty}"


# Melting Pot's substrates (dm-meltingpot 2.4; `marlctl.envs.meltingpot`), listed whether or
# not the package is installed (a test holds the list to the package where it is).
MELTINGPOT_SUBSTRATES = (
    "allelopathic_harvest__open",
    "bach_or_stravinsky_in_the_matrix__arena",
    "bach_or_stravinsky_in_the_matrix__repeated",
    "boat_race__eight_races",
    "chemistry__three_metabolic_cycles",
    "chemistry__three_metabolic_cycles_with_plentiful_distractors",
    "chemistry__two_metabolic_cycles",
    "chemistry__two_metabolic_cycles_with_distractors",
    "chicken_in_the_matrix__arena",
    "chicken_in_the_matrix__repeated",
    "clean_up",
    "coins",
    "collaborative_cooking__asymmetric",
    "collaborative_cooking__circuit",
    "collaborative_cooking__cramped",
    "collaborative_cooking__crowded",
    "collaborative_cooking__figure_eight",
    "collaborative_cooking__forced",
    "collaborative_cooking__ring",
    "commons_harvest__closed",
    "commons_harvest__open",
    "commons_harvest__partnership",
    "coop_mining",
    "daycare",
    "externality_mushrooms__dense",
    "factory_commons__either_or",
    "fruit_market__concentric_rivers",
    "gift_refinements",
    "hidden_agenda",
    "paintball__capture_the_flag",
    "paintball__king_of_the_hill",
    "predator_prey__alley_hunt",
    "predator_prey__open",
    "predator_prey__orchard",
    "predator_prey__random_forest",
    "prisoners_dilemma_in_the_matrix__arena",
    "prisoners_dilemma_in_the_matrix__repeated",
    "pure_coordination_in_the_matrix__arena",
    "pure_coordination_in_the_matrix__repeated",
    "rationalizable_coordination_in_the_matrix__arena",
    "rationalizable_coordination_in_the_matrix__repeated",
    "running_with_scissors_in_the_matrix__arena",
    "running_with_scissors_in_the_matrix__one_shot",
    "running_with_scissors_in_the_matrix__repeated",
    "stag_hunt_in_the_matrix__arena",
    "stag_hunt_in_the_matrix__repeated",
    "territory__inside_out",
    "territory__open",
    "territory__rooms",
)


def _meltingpot_summary(substrate: str) -> str | None:
    if substrate not in MELTINGPOT_SUBSTRATES:
        return None
    return "Melting Pot substrate: players' RGB views of one map"


# prefix -> (factory, summary of a task id, module, extra, the keyword that names the task)
_FAMILIES = {
    "lbf": ("marlctl.envs.gymma:lbf", _lbf_summary, "lbforaging", "lbf", "task"),
    "rware": ("marlctl.envs.gymma:rware", _rware_summary, "rware", "rware", "task"),
    "meltingpot": (
        "marlctl.envs.meltingpot:make",
        _meltingpot_summary,
        "meltingpot",
        "meltingpot",
        "substrate",
    ),  # fmt: skip
}


def family_entry(env_id: str) -> EnvEntry | None:
    """The entry of `PREFIX/TASK` for a tuple-space family task, or None."""
    prefix, _, task = env_id.partition("/")
    if prefix not in _FAMILIES:
        return None
    factory, summary, module, extra, keyword = _FAMILIES[prefix]
    text = summary(task)
    if text is None:
        return None
    return EnvEntry(env_id, factory, prefix, text, (module,), extra, ((keyword, task),))


# Turn-based (AEC) games, one agent acting per step (`marlctl.envs.turns`).
CLASSIC = {
    "tictactoe": ("tic-tac-toe: two players take turns on a 3x3 board (turn-based)", ()),
    "connect_four": ("connect four: two players drop discs into 7 columns (turn-based)", ()),
}


def _turn_based(envs: dict[str, tuple[str, tuple[str, ...]]]):
    for name, (summary, requires) in envs.items():
        module = _latest("pettingzoo.classic", name)
        if module is not None:
            game = (("game", module.rpartition(".")[2]),)
            factory = "marlctl.envs.turns:classic"
            yield EnvEntry(f"classic/{name}", factory, "classic", summary, requires, None, game)


# VMAS's scenarios, MPE's and the debug ones included, as the installed package has them
# (`marlctl.envs.vmas.scenario_names`; a test holds this list to it): listed, and named at
# validation, without VMAS installed.
VMAS_SCENARIOS = (
    "balance",
    "ball_passage",
    "ball_trajectory",
    "buzz_wire",
    "discovery",
    "dispersion",
    "dropout",
    "flocking",
    "football",
    "give_way",
    "joint_passage",
    "joint_passage_size",
    "multi_give_way",
    "navigation",
    "passage",
    "reverse_transport",
    "road_traffic",
    "sampling",
    "transport",
    "wheel",
    "wind_flocking",
    "simple",
    "simple_adversary",
    "simple_crypto",
    "simple_push",
    "simple_reference",
    "simple_speaker_listener",
    "simple_spread",
    "simple_tag",
    "simple_world_comm",
    "asym_joint",
    "circle_trajectory",
    "diff_drive",
    "drone",
    "goal",
    "het_mass",
    "kinematic_bicycle",
    "line_trajectory",
    "pollock",
    "vel_control",
    "waterfall",
)


def _vmas():
    for name in VMAS_SCENARIOS:
        summary = f"VMAS {name.replace('_', ' ')} (batched torch, CPU or GPU)"
        scenario = (("scenario", name),)
        factory = "marlctl.envs.vmas:make"
        yield EnvEntry(f"vmas/{name}", factory, "vmas", summary, ("vmas",), "vmas", scenario)


# Multi-objective envs (MOMAland, Felten et al. 2024): a reward vector per agent, scalarised
# for training by `env.reward_weights`; every objective's return is logged.
MOMALAND = {
    "beach": ("momaland.envs.beach", "mobeach", "beach problem: sections' capacity vs mix"),
    "catch": ("momaland.envs.crazyrl.catch", "catch", "drones catch a moving target"),
    "surround": ("momaland.envs.crazyrl.surround", "surround", "drones surround a target"),
    "escort": ("momaland.envs.crazyrl.escort", "escort", "drones escort a moving target"),
    "multiwalker_stability": (
        "momaland.envs.multiwalker_stability",
        "momultiwalker_stability",
        "walkers carry a package steadily",
    ),
}


# MAgent2's grid battles of many agents (Zheng et al. 2018; Farama's magent2): each agent sees
# the cells around it as layers, `[H, W, C]` frames `model.encoder: cnn` reads, and leaves
# the episode when it dies. Listed at their version whether or not magent2 is installed.
MAGENT2 = {
    "battle": ("battle_v4", "two armies of 81 fight on a 45x45 map"),
    "adversarial_pursuit": ("adversarial_pursuit_v4", "predators tag faster prey"),
    "gather": ("gather_v5", "agents compete for food, and may attack each other"),
    "tiger_deer": ("tiger_deer_v4", "tigers hunt deer in pairs"),
    "combined_arms": ("combined_arms_v6", "melee and ranged units per army"),
    "battlefield": ("battlefield_v5", "battle on an 80x80 map with obstacles"),
}


def _magent2():
    for name, (stem, summary) in MAGENT2.items():
        factory = f"magent2.environments.{stem}:parallel_env"
        yield EnvEntry(
            f"magent2/{name}", factory, "magent2", summary, (), "magent2", teams_by_name=True
        )


def _momaland():
    """MOMAland's envs at their newest installed version; without MOMAland, listed at their
    first, not installed, with the command that installs it."""
    installed = _importable("momaland")
    for name, (package, stem, summary) in MOMALAND.items():
        module = _latest(package, stem) if installed else f"{package}.{stem}_v0"
        if module is not None:
            text = f"{summary} (multi-objective)"
            yield EnvEntry(f"momaland/{name}", f"{module}:parallel_env", "momaland", text)


ENVS: dict[str, EnvEntry] = {
    e.id: e
    for e in [
        *_suite("mpe", "mpe2", MPE),  # mpe2 is one of marlctl's own dependencies
        *_suite("sisl", "pettingzoo.sisl", SISL, extra="sisl"),
        *_suite("butterfly", "pettingzoo.butterfly", BUTTERFLY, extra="butterfly"),
        *(family_entry(f"lbf/{task}") for task in LBF_TASKS),
        *(family_entry(f"rware/{task}") for task in RWARE_TASKS),
        *_turn_based(CLASSIC),
        *_vmas(),
        *_momaland(),
        *_magent2(),
        *(family_entry(f"meltingpot/{name}") for name in MELTINGPOT_SUBSTRATES),
    ]
}
