"""Native tasks: batched torch envs, run on the training device with no Python loop over envs.

Most re-implement a registered PettingZoo env, and a parity test holds each to its original
(`tests/test_native_parity.py`). Some have no original: they declare their own agents and
spaces (`marlctl.envs.native.base.NativeEnv`) and are listed in `NATIVE_ONLY`.

Pure (no torch import): `validate` checks a `backend: native` spec against this table.
"""

from __future__ import annotations

import importlib
from typing import Any

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
}
# Native envs with no PettingZoo original, with the summary `marlctl list envs` shows.
NATIVE_ONLY: dict[str, str] = {
    "matrix/climbing": "climbing game: 2 players coordinate past -30 penalties",
    "matrix/penalty": "penalty game: 2 players pick one of two optima, miscoordination costs k",
}

# Parameters of the originals that only affect rendering: accepted and ignored.
RENDER_ONLY = frozenset({"dynamic_rescaling", "render_mode"})
# Parameters the native tasks do not implement, with the reason given to the user.
UNSUPPORTED = {
    "curriculum": "curriculum stages are advanced by calling the env object; "
    "use backend: pettingzoo",
    "benchmark_data": "per-step benchmark infos are not produced by native tasks; "
    "use backend: pettingzoo",
}


def native_problem(env_id: str, params: dict[str, Any]) -> tuple[str, str] | None:
    """(key, message) when `env_id` with `params` cannot run natively, else None."""
    if env_id not in NATIVE:
        have = ", ".join(sorted(NATIVE))
        return "env.backend", f"no native implementation of '{env_id}' (native: {have})"
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


def native_class(env_id: str) -> type:
    module, _, name = NATIVE[env_id].partition(":")
    return getattr(importlib.import_module(module), name)
