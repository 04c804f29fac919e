"""The stand-in's substrates: `SUBSTRATES`, `get_config`, `get_factory` and `build`."""

from __future__ import annotations

from dataclasses import dataclass

from meltingpot import _game

PLAYERS = {"commons_harvest__open": 7, "coins": 2}
SUBSTRATES = frozenset(PLAYERS)


@dataclass(frozen=True)
class Config:
    default_player_roles: tuple[str, ...]


class Factory:
    def __init__(self, name: str):
        self.players = PLAYERS[name]

    def timestep_spec(self):
        spec = _game.Game(self.players).observation_spec()[0]
        return _game.TimeStep(0, [], 1.0, spec)


def get_config(name: str) -> Config:
    return Config(("default",) * PLAYERS[name])


def get_factory(name: str) -> Factory:
    return Factory(name)


def build(name: str, *, roles) -> _game.Game:
    return _game.Game(len(roles))
