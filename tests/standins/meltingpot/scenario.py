"""The stand-in's scenarios: focal players among a wandering background population."""

from __future__ import annotations

from meltingpot import _game
from meltingpot.substrate import PLAYERS

FOCAL = {"commons_harvest__open_0": ("commons_harvest__open", 5), "coins_0": ("coins", 1)}
SCENARIOS = frozenset(FOCAL)
SCENARIOS_BY_SUBSTRATE = {
    s: frozenset(n for n, (of, _) in FOCAL.items() if of == s) for s in PLAYERS
}
PERMITTED_OBSERVATIONS = frozenset({"RGB", "READY_TO_SHOOT", "COLLECTIVE_REWARD"})


class Scenario(_game.Game):
    """Observations restricted to the permitted ones, as the package's scenarios are."""

    def observation_spec(self):
        return [{k: v for k, v in o.items() if k in PERMITTED_OBSERVATIONS}
                for o in super().observation_spec()]  # fmt: skip

    def _timestep(self, kind, rewards):
        step = super()._timestep(kind, rewards)
        kept = [{k: v for k, v in o.items() if k in PERMITTED_OBSERVATIONS}
                for o in step.observation]  # fmt: skip
        return _game.TimeStep(step.step_type, step.reward, step.discount, kept)


def build(name: str) -> Scenario:
    substrate, focal = FOCAL[name]
    return Scenario(PLAYERS[substrate], focal)
