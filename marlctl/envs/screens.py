"""Pixel envs whose agents each see a crop of one screen: the screen read once per frame.

PettingZoo 1.27's pistonball builds every piston's observation from the whole screen: each
`observe(agent)` references the screen's pixels, copies the piston's crop out of them, and
turns it upright (`rot90` and `fliplr` of an x-major crop: a transpose). Twenty pistons read
the screen twenty times per step; that is most of the env's step. `share_screen` gives the
raw env an `observe` and a `state` that read the screen upright (row by row) once each time
it is drawn and cut every agent's crop from that copy: the same arrays, a test compares
them step by step with the package's own.

Pure: imports numpy and pygame.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

# The factories (by module) whose raw env draws one screen that every observation crops.
SHARED_SCREEN = ("pettingzoo.butterfly.pistonball",)


def share_screen(env: Any, factory: str) -> Any:
    """`env`, its raw env reading the screen once per drawn frame where `factory` names one
    of `SHARED_SCREEN`'s and the env draws (a render mode); others as they are."""
    if not factory.startswith(SHARED_SCREEN):
        return env
    raw = env.unwrapped
    if getattr(raw, "render_mode", None) is None:
        return env  # it never draws: every observation is the reset frame's, as the package's
    upright: dict[str, Any] = {}

    def redrawn(method):
        def wrapper(*args, **kwargs):
            upright.clear()
            return method(*args, **kwargs)

        return wrapper

    def screen() -> np.ndarray:
        if upright.get("surface") is not raw.screen:
            upright.clear()
        if "pixels" not in upright:
            import pygame

            # Row by row ([y, x, rgb]), as the crops turned upright read it: one C copy.
            width, height = raw.screen.get_size()
            data = pygame.image.tobytes(raw.screen, "RGB")
            upright["pixels"] = np.frombuffer(data, np.uint8).reshape(height, width, 3)
            upright["surface"] = raw.screen
        return upright["pixels"]

    def observe(self, agent):
        i = self.agent_name_mapping[agent]
        x_high = self.wall_width + self.piston_width * (i + 2)
        x_low = self.wall_width + self.piston_width * (i - 1)
        y_high = self.screen_height - self.wall_width - self.piston_body_height
        y_low = self.wall_width
        return screen()[y_low:y_high, x_low:x_high].copy()

    def state(self):
        return screen().copy()

    for name in ("draw", "draw_background", "draw_pistons", "enable_render"):
        setattr(raw, name, redrawn(getattr(raw, name)))
    raw.observe = types.MethodType(observe, raw)
    raw.state = types.MethodType(state, raw)
    return env
