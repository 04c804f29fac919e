"""MAgent2 once an army is wiped out: its global state, and who is left.

magent2 0.3.4's `state()` marks every army's agents on the map with `zip(*positions)`, which
fails (`ValueError: not enough values to unpack`) when an army has no agent left: the last
step of every battle won by elimination. A run whose critic reads the state (MAPPO, the value
mixers) would fail there. `whole_state` gives the raw env a `state` that is the package's,
an army with no agent left skipped: its layers stay empty, as the map shows it.

The same step ends the game, and magent2 then terminates every agent, the winners too: its
terminations cannot tell who is left. `agents_left` reads the survivors from the engine.

Pure: imports numpy.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np


def _is_magent2(raw: Any) -> bool:
    return type(raw).__module__.startswith("magent2.")


def whole_state(env: Any) -> Any:
    """`env`, its raw env's `state` keeping an emptied army's layers empty where it is one
    of magent2's; others as they are."""
    raw = getattr(env, "unwrapped", env)  # a user's own factory may have none
    if _is_magent2(raw):
        raw.state = types.MethodType(_state, raw)
    return env


def _state(raw: Any) -> np.ndarray:
    """magent2's `magent_parallel_env.state`, an army with no agent left skipped."""
    state = np.copy(raw.base_state)
    for handle in raw._all_handles:
        pos = raw.env.get_pos(handle)
        if len(pos) == 0:
            continue
        view, features = raw.env.get_observation(handle)
        pos_x, pos_y = pos[:, 0], pos[:, 1]
        state[pos_x, pos_y, 1 + handle.value * 2] = 1
        state[pos_x, pos_y, 2 + handle.value * 2] = view[
            :, view.shape[1] // 2, view.shape[2] // 2, 2
        ]
        if raw.extra_features:
            width = state.shape[2] - (
                1 + len(raw.team_sizes) * 2 + features.shape[1] - raw._minimap_features
            )
            rewards = features[:, -1 - raw._minimap_features].reshape(-1, 1)
            actions = features[:, : -1 - raw._minimap_features]
            actions = np.concatenate((actions, np.zeros((features.shape[0], width))), axis=1)
            state[pos_x, pos_y, 1 + len(raw.team_sizes) * 2 :] = np.hstack((actions, rewards))
    return state


def agents_left(env: Any, terminations: dict[str, bool]) -> list[str]:
    """The agents still on the map after an episode's last step: for a magent2 env, those
    the engine has alive (an army wiped out ends the game and terminates every agent);
    for any other, those the step did not terminate."""
    raw = env.unwrapped
    if not _is_magent2(raw):
        return [agent for agent, ended in terminations.items() if not ended]
    # The engine's ids index `possible_agents`; its dead are cleared after every step.
    return [raw.possible_agents[i] for h in raw.handles for i in raw.env.get_agent_id(h)]
