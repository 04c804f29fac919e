"""Native tasks: batched torch envs, run on the training device with no Python loop over envs.

Most re-implement a registered PettingZoo env, and a parity test holds each to its original
(`tests/test_native_parity.py`). Some have no original: they declare their own agents and
spaces (`marlctl.envs.native.base.NativeEnv`) and are listed in `NATIVE_ONLY`.

Pure (no torch import): `validate` checks a `backend: native` spec against this table.
"""

from __future__ import annotations

import importlib
from typing import Any

from marlctl.envs.families import LBF_TASK
from marlctl.envs.native.params import choice, flag, integer, number

NATIVE: dict[str, str] = {
    "mpe/simple": "marlctl.envs.native.simple:Simple",
    "mpe/simple_spread": "marlctl.envs.native.simple_spread:SimpleSpread",
    "mpe/simple_adversary": "marlctl.envs.native.simple_adversary:SimpleAdversary",
    "mpe/simple_tag": "marlctl.envs.native.simple_tag:SimpleTag",
    "mpe/simple_push": "marlctl.envs.native.simple_push:SimplePush",
    "mpe/simple_reference": "marlctl.envs.native.simple_reference:SimpleReference",
    "mpe/simple_speaker_listener": (
        "marlctl.envs.native.simple_speaker_listener:SimpleSpeakerListener"
    ),
    "mpe/simple_crypto": "marlctl.envs.native.simple_crypto:SimpleCrypto",
    "mpe/simple_world_comm": "marlctl.envs.native.simple_world_comm:SimpleWorldComm",
    "matrix/climbing": "marlctl.envs.native.matrix:Climbing",
    "matrix/penalty": "marlctl.envs.native.matrix:Penalty",
    "classic/tictactoe": "marlctl.envs.native.classic:TicTacToe",
    "classic/connect_four": "marlctl.envs.native.classic:ConnectFour",
    "sisl/pursuit": "marlctl.envs.native.pursuit:Pursuit",
}
# Native envs with no PettingZoo original, with the summary `marlctl list envs` shows.
NATIVE_ONLY: dict[str, str] = {
    "matrix/climbing": "climbing game: 2 players coordinate past -30 penalties",
    "matrix/penalty": "penalty game: 2 players pick one of two optima, miscoordination costs k",
}

# SMAX scenarios (`marlctl.envs.native.smax`): allies, enemies and what they are. Native
# only: SMAX itself is JAX code, not a PettingZoo env.
SMAX = {
    "3m": "3 marines against 3 marines",
    "2s3z": "2 stalkers and 3 zealots against the same",
    "25m": "25 marines against 25 marines",
    "3s5z": "3 stalkers and 5 zealots against the same",
    "8m": "8 marines against 8 marines",
    "5m_vs_6m": "5 marines against 6 marines",
    "10m_vs_11m": "10 marines against 11 marines",
    "27m_vs_30m": "27 marines against 30 marines",
    "3s5z_vs_3s6z": "3 stalkers and 5 zealots against 3 stalkers and 6 zealots",
    "3s_vs_5z": "3 stalkers against 5 zealots",
    "6h_vs_8z": "6 hydralisks against 8 zealots",
    "smacv2_5_units": "SMACv2-style: 5 random units a side, random start formations",
    "smacv2_10_units": "SMACv2-style: 10 random units a side, random start formations",
    "smacv2_20_units": "SMACv2-style: 20 random units a side, random start formations",
}
for _name, _what in SMAX.items():
    NATIVE[f"smax/{_name}"] = f"marlctl.envs.native.smax:Smax_{_name}"
    NATIVE_ONLY[f"smax/{_name}"] = f"SMAX {_name}: {_what}; the enemies follow SMAX's heuristic"

# Hanabi for 2 to 5 players (`marlctl.envs.native.hanabi`): native only, JaxMARL's Hanabi.
for _players in range(2, 6):
    NATIVE[f"hanabi/{_players}p"] = f"marlctl.envs.native.hanabi:Hanabi_{_players}p"
    NATIVE_ONLY[f"hanabi/{_players}p"] = (
        f"Hanabi, {_players} players: hint, play and discard to build the fireworks together"
    )

# Overcooked layouts (`marlctl.envs.native.overcooked`): the five of Carroll et al. 2019, as
# JaxMARL names them. Native only: JaxMARL's Overcooked is JAX code.
OVERCOOKED = {
    "cramped_room": "a small kitchen with one pot",
    "asymm_advantages": "two kitchens, each cook nearer other supplies",
    "coord_ring": "a ring around a counter",
    "forced_coord": "a wall they pass items across",
    "counter_circuit": "a long loop around a counter",
}
for _name, _what in OVERCOOKED.items():
    NATIVE[f"overcooked/{_name}"] = f"marlctl.envs.native.overcooked:Overcooked_{_name}"
    NATIVE_ONLY[f"overcooked/{_name}"] = f"Overcooked {_name}: two cooks deliver soup; {_what}"

# POGEMA's multi-agent pathfinding (`marlctl.envs.native.pogema`): native only, held to
# episodes recorded from pogema 1.4.0, whose pydantic 1 cannot live beside marlctl's.
NATIVE["pogema/random"] = "marlctl.envs.native.pogema:Pogema"
NATIVE["pogema/maze"] = "marlctl.envs.native.pogema:PogemaMaze"
NATIVE_ONLY["pogema/random"] = "POGEMA pathfinding: agents reach their targets on a random map"
NATIVE_ONLY["pogema/maze"] = "POGEMA pathfinding: agents reach their targets in a maze"

# Parameters of the originals that only affect rendering: accepted and ignored.
RENDER_ONLY = frozenset({"dynamic_rescaling", "render_mode"})
# Parameters the native tasks do not implement, with the reason given to the user.
UNSUPPORTED = {
    "curriculum": "curriculum stages are advanced by calling the env object; "
    "use backend: pettingzoo",
    "benchmark_data": "per-step benchmark infos are not produced by native tasks; "
    "use backend: pettingzoo",
    "opponent": "a scripted opponent plays inside the PettingZoo env; use backend: pettingzoo",
}


def foraging_task(task: str) -> dict[str, Any] | None:
    """The `lbforaging` package's registration keywords of a `Foraging...-v3` task name (as
    its `__init__` registers them), or None for another name."""
    m = LBF_TASK.match(task)
    if m is None or m["version"] != "3":  # the version the native kernel reproduces
        return None
    size = int(m["size"])
    return {
        "players": int(m["players"]),
        "min_player_level": 1,
        "max_player_level": 2,
        "field_size": (size, size),
        "min_food_level": 1,
        "max_food_level": 1 if m["ind"] else None,
        "max_num_food": int(m["food"]),
        "sight": int(m["sight"]) if m["sight"] else size,
        "max_episode_steps": 50,
        "force_coop": bool(m["coop"]),
        "grid_observation": bool(m["grid"]),
        "penalty": 0.1 if m["pen"] else 0.0,
    }


# Package keywords the native foraging env does not implement, at the value that needs them.
FORAGING_UNSUPPORTED = {
    "observe_agent_levels": "false is not implemented natively; use backend: pettingzoo",
}


def foraging_unsupported(params: dict[str, Any]) -> str | None:
    """The first of `FORAGING_UNSUPPORTED` that foraging `params` ask for, or None."""
    if params.get("observe_agent_levels") is False:
        return "observe_agent_levels"
    return None


def foraging_params(p: dict[str, Any]) -> dict[str, Any]:
    """Foraging keywords `p` (a task's, with `env.params` over them) read with their types;
    a ValueError names the first one that is wrong. Levels come back as lists of whole
    numbers, one per player or food. Pure: validation reads a spec's params with it."""
    players = integer("players", p["players"], 1)
    size = p["field_size"]
    if not isinstance(size, list | tuple) or len(size) != 2:
        raise ValueError(f"field_size must be [rows, columns], not {size!r}")
    # Food spawns on inner cells only: a grid needs one at least.
    rows, cols = (integer("field_size", x, 3) for x in size)
    if players > rows * cols:
        raise ValueError(f"players {players} do not fit on a {rows}x{cols} grid")
    foods = integer("max_num_food", p["max_num_food"], 1)

    def levels(name: str, count: int, low: int) -> list[int]:
        value = p[name]
        values = list(value) if isinstance(value, list | tuple) else [value] * count
        if len(values) != count:
            raise ValueError(f"{name} must be a number or a list of {count}, not {value!r}")
        return [integer(name, v, low) for v in values]

    out = {
        **p,
        "players": players,
        "field_size": (rows, cols),
        "max_num_food": foods,
        "min_player_level": levels("min_player_level", players, 0),
        "max_player_level": levels("max_player_level", players, 0),
        "min_food_level": levels("min_food_level", foods, 0),
        "max_food_level": None
        if p["max_food_level"] is None
        else levels("max_food_level", foods, 0),
        "sight": integer("sight", p["sight"]),
        "max_episode_steps": integer("max_episode_steps", p["max_episode_steps"]),
        "penalty": number("penalty", p["penalty"]),
        "reward_scalarisation": choice(
            "reward_scalarisation", p.get("reward_scalarisation", "sum"), ("sum", "mean")
        ),
    }
    for name in ("force_coop", "normalize_reward", "common_reward", "grid_observation",
                 "observe_agent_levels"):  # fmt: skip
        if name in p:
            out[name] = flag(name, p[name])
    for kind, top in (("player", out["max_player_level"]), ("food", out["max_food_level"])):
        low = out[f"min_{kind}_level"]
        for i, (a, b) in enumerate(zip(low, top or low, strict=True)):
            if a > b:
                raise ValueError(
                    f"min_{kind}_level must be at most max_{kind}_level ({a} > {b} for {kind} {i})"
                )
    return out


def is_native(env_id: str) -> bool:
    """Whether `env_id` runs under `backend: native`: a listed task, or a task of a native
    family (`lbf/<task>`)."""
    prefix, _, task = env_id.partition("/")
    return env_id in NATIVE or (prefix == "lbf" and foraging_task(task) is not None)


def native_problem(env_id: str, params: dict[str, Any]) -> tuple[str, str] | None:
    """(key, message) when `env_id` with `params` cannot run natively, else None."""
    if not is_native(env_id):
        have = ", ".join(sorted(NATIVE))
        return (
            "env.backend",
            f"no native implementation of '{env_id}' (native: {have}, and the lbf/ tasks)",
        )
    if env_id.startswith("lbf/"):
        merged = {**foraging_task(env_id.partition("/")[2]), **params}
        key = foraging_unsupported(merged)
        if key is not None:
            return f"env.params.{key}", FORAGING_UNSUPPORTED[key]
        try:
            foraging_params(merged)
        except ValueError as err:
            return f"env.params.{str(err).split(' ', 1)[0]}", str(err)
    for key, reason in UNSUPPORTED.items():
        if params.get(key):
            return f"env.params.{key}", f"not supported with backend: native ({reason})"
    return None


def native_only_problem(env_id: str, backend: str) -> tuple[str, str] | None:
    """(key, message) when a native-only env is asked for on another backend."""
    if env_id in NATIVE_ONLY and backend != "native":
        return (
            "env.backend",
            f"'{env_id}' exists only natively (no PettingZoo original); set env.backend: native",
        )
    return None


def described_natively(env_id: str, params: dict[str, Any]) -> bool:
    """Whether the native env describes `env_id` itself, the package being unable to build
    it: LBF's grid observations (lbforaging 2.0.0 declares their space with shape (3,),
    which gymnasium refuses; `tests/test_native_foraging.py` holds the native grid to the
    package's own observations)."""
    if not env_id.startswith("lbf/") or not is_native(env_id):
        return False
    return bool({**foraging_task(env_id.partition("/")[2]), **params}.get("grid_observation"))


def native_class(env_id: str) -> type:
    if env_id.startswith("lbf/"):
        from marlctl.envs.native.foraging import task_class

        return task_class(env_id)
    module, _, name = NATIVE[env_id].partition(":")
    return getattr(importlib.import_module(module), name)
