"""SISL pursuit (PettingZoo's `pursuit_v4`/`v5`), batched: pursuers surround evaders on a grid.

The rules of `pettingzoo/sisl/pursuit/pursuit_base.py`, step for step:

- The map is `x_size` x `y_size` cells with a building in its middle (`rectangle_map`: the
  cells whose x lies strictly between 30% and 70% of the width and y between 20% and 80%).
  Nobody enters a building or leaves the map: such a move stays put. Agents stack freely.
- A start places the pursuers one after another uniformly on the open cells of a window
  (`constraint_window` of each side, at a random offset), none on or beside an earlier one,
  then the evaders the same way (apart from each other, not from the pursuers). Where a
  window has no such cell left (too many agents for it), the original draws forever; here
  the agent takes an open cell of the window beside another, or failing that one with
  another on it.
- A step moves the pursuers one after another, as the original's turns do (left, right,
  up, down, stay: x-1, x+1, y+1, y-1, none). After each move every pursuer is paid
  `tag_reward` per evader on the four cells beside it (a neighbour off the map is clipped
  onto the pursuer's own cell) divided by the number of pursuers; the rewards of the
  pursuers' turns add up. After the last move the evaders that are caught are removed: with
  `surround`, one whose every open neighbouring cell holds a pursuer, and every pursuer on
  such a cell earns `catch_reward` (once, however many it caught); otherwise one on whose
  cell `n_catch` pursuers stand. Then every evader left takes a uniformly random move (none,
  with `freeze_evaders`), and every pursuer is paid `urgency_reward`.
- With `shared_reward` each turn's payment is the mean over the pursuers, paid to each.
- The episode terminates when no evader is left, and is cut after `max_cycles` steps (at
  that step even if the last evader is caught there, as the original has it).

Each pursuer observes the `obs_range` x `obs_range` cells around it as `(y, x, layer)`: the
walls (buildings and off the map: 1), the number of pursuers and the number of evaders on
each cell. The global state is the whole map as `(y, x, layer)`, the same three layers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from marlctl.envs.families import ENVS
from marlctl.envs.info import GroupInfo
from marlctl.envs.native.base import NativeEnv
from marlctl.envs.native.params import flag, integer, number

# x, y of the five moves: left, right, up, down, stay (`DiscreteAgent.motion_range`).
MOTION = ((-1, 0), (1, 0), (0, 1), (0, -1), (0, 0))
# The four neighbours (`Pursuit.surround_mask`).
AROUND = ((-1, 0), (1, 0), (0, 1), (0, -1))


def rectangle_map(xs: int, ys: int, xb: float = 0.3, yb: float = 0.2) -> torch.Tensor:
    """The building cells (True) of `two_d_maps.rectangle_map`, `[xs, ys]`."""
    x = torch.arange(xs, dtype=torch.float64) / xs
    y = torch.arange(ys, dtype=torch.float64) / ys
    return ((x > xb) & (x < 1 - xb)).unsqueeze(1) & ((y > yb) & (y < 1 - yb)).unsqueeze(0)


class Pursuit(NativeEnv):
    env_id = "sisl/pursuit"
    max_cycles = 500
    pure_steps = ("observe",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Described as the original is: its factory, which `backend: pettingzoo` builds.
        self.info = replace(self.info, factory=ENVS[self.env_id].factory)

    def build(
        self,
        x_size: int = 16,
        y_size: int = 16,
        shared_reward: bool = True,
        n_evaders: int = 30,
        n_pursuers: int = 8,
        obs_range: int = 7,
        n_catch: int = 2,
        freeze_evaders: bool = False,
        evader_controller: Any = None,
        pursuer_controller: Any = None,
        tag_reward: float = 0.01,
        catch_reward: float = 5.0,
        urgency_reward: float = -0.1,
        surround: bool = True,
        constraint_window: float = 1.0,
    ) -> tuple[list[GroupInfo], int]:
        for name, value in (("evader_controller", evader_controller),
                            ("pursuer_controller", pursuer_controller)):  # fmt: skip
            if value is not None:
                raise ValueError(f"{name} must be null natively: the evaders move at random")
        self.X, self.Y = integer("x_size", x_size, 3), integer("y_size", y_size, 3)
        self.P = integer("n_pursuers", n_pursuers, 1)
        self.V = integer("n_evaders", n_evaders, 1)
        self.view = integer("obs_range", obs_range, 1)
        self.offset = (self.view - 1) // 2
        self.n_catch = integer("n_catch", n_catch, 1)
        self.shared = flag("shared_reward", shared_reward)
        self.frozen = flag("freeze_evaders", freeze_evaders)
        self.surround = flag("surround", surround)
        self.tag = number("tag_reward", tag_reward)
        self.catch = number("catch_reward", catch_reward)
        self.urgency = number("urgency_reward", urgency_reward)
        self.window = number("constraint_window", constraint_window)
        if not 0.0 <= self.window <= 1.0:
            raise ValueError(f"constraint_window must lie in [0, 1], not {constraint_window}")
        if min(int(self.X * self.window), int(self.Y * self.window)) < 1:
            raise ValueError(
                f"constraint_window {constraint_window} leaves less than one cell of the "
                f"{self.X}x{self.Y} map to start on"
            )
        dev = self.device
        self.building = rectangle_map(self.X, self.Y).to(dev)  # [X, Y]
        self.motion = torch.tensor(MOTION, device=dev)
        self.around = torch.tensor(AROUND, device=dev)
        self.size = torch.tensor([self.X, self.Y], device=dev)
        self.cells = torch.cartesian_prod(torch.arange(self.X, device=dev),
                                          torch.arange(self.Y, device=dev))  # fmt: skip
        # Each cell's open neighbours on the map: how many pursuers surround it.
        self.need = self._open(self._neighbours(self.cells))[0].sum(-1).view(self.X, self.Y)
        # Where each cell of a view lies from its centre: -offset .. view - 1 - offset; an
        # even range's last row and column are never filled in (walls, as the original's).
        self.reach = torch.arange(self.view, device=dev) - self.offset
        R = self.view
        walls = torch.ones(self.X + 2 * R, self.Y + 2 * R, device=dev)
        walls[R : R + self.X, R : R + self.Y] = self.building.to(walls.dtype)
        self.walls = walls  # padded by `view` on every side
        self.state_shape = (self.Y, self.X, 3)
        shape = (self.view, self.view, 3)
        agents = tuple(f"pursuer_{i}" for i in range(self.P))
        return [GroupInfo("pursuer", agents, shape, "float32", True, 5)], 3 * self.X * self.Y

    def _neighbours(self, pos: torch.Tensor) -> torch.Tensor:
        """The four neighbouring cells of positions `[..., 2]`: `[..., 4, 2]`."""
        return pos.unsqueeze(-2) + self.around

    def _open(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Whether cells `[..., 2]` lie on the map and outside the building `[...]`, and the
        cells clipped onto the map (to index grids with)."""
        inside = ((pos >= 0) & (pos < self.size)).all(-1)
        clipped = torch.minimum(pos.clamp(min=0), self.size - 1)
        return inside & ~self.building[clipped[..., 0], clipped[..., 1]], clipped

    # ------------------------------------------------------------ start states

    def start(self, n: int) -> dict[str, torch.Tensor]:
        dev, X, Y = self.device, self.X, self.Y
        corner = self.rand(n, 2, low=0.0, high=1.0 - self.window)  # the window's x, y start
        size = self.size.to(self.dtype)
        low = (size * corner).long().unsqueeze(1)
        high = (size * (corner + self.window)).long().unsqueeze(1)
        within = ((self.cells >= low) & (self.cells < high)).all(-1)  # [n, X * Y]
        free = within & ~self.building.flatten()

        def place(count: int) -> torch.Tensor:
            near = torch.zeros(n, X + 2, Y + 2, dtype=torch.bool, device=dev)  # padded by 1
            on = torch.zeros(n, X * Y, dtype=torch.bool, device=dev)
            rows, placed = torch.arange(n, device=dev), []
            for _ in range(count):
                # Uniform over the best cells: apart from the others, else beside one, else
                # on one; never off the window's open cells.
                apart = ~near[:, 1:-1, 1:-1].flatten(1)
                tier = 2 * apart.to(self.dtype) + (~on).to(self.dtype) + 4
                tier = torch.where(free, tier, 0.0)
                pick = (tier + self.rand(n, X * Y, low=0.0, high=1.0)).argmax(-1)
                pos = torch.stack([pick // Y, pick % Y], -1)
                on[rows, pick] = True
                for dx, dy in ((0, 0), *AROUND):
                    near[rows, pos[:, 0] + 1 + dx, pos[:, 1] + 1 + dy] = True
                placed.append(pos)
            return torch.stack(placed, 1)

        pursuers = place(self.P)
        evaders = place(self.V)
        alive = torch.ones(n, self.V, dtype=torch.bool, device=dev)
        return {"pursuers": pursuers, "evaders": evaders, "alive": alive}

    # ------------------------------------------------------------ steps

    def _moved(self, pos: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Positions `[..., 2]` after moves `[...]`: a move off the map or into a building
        stays put."""
        to = pos + self.motion[action]
        return torch.where(self._open(to)[0].unsqueeze(-1), to, pos)

    def _count(self, pos: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Agents at positions `[E, n, 2]` (where `weight` `[E, n]`) counted per cell,
        `[E, X, Y]`."""
        E, n = pos.shape[:2]
        index = pos[..., 0] * self.Y + pos[..., 1]
        ones = torch.ones(E, n, dtype=self.dtype, device=self.device)
        values = ones if weight is None else weight.to(self.dtype)
        grid = torch.zeros(E, self.X * self.Y, dtype=self.dtype, device=self.device)
        return grid.scatter_add_(1, index, values).view(E, self.X, self.Y)

    def _tags(self, evader_grid: torch.Tensor, pursuers: torch.Tensor) -> torch.Tensor:
        """Each pursuer's evaders on the cells beside it (clipped onto the map) `[E, P]`."""
        nbr = self._open(self._neighbours(pursuers))[1]
        flat = (nbr[..., 0] * self.Y + nbr[..., 1]).flatten(1)  # [E, P * 4]
        return evader_grid.flatten(1).gather(1, flat).view(*pursuers.shape[:2], 4).sum(-1)

    def advance(self, actions: dict[str, torch.Tensor]):
        action = actions["pursuer"].long()
        E, P = action.shape
        evader_grid = self._count(self.evaders, self.alive)  # they stay while pursuers move
        pursuers = self.pursuers.clone()
        tags = torch.zeros(E, P, dtype=self.dtype, device=self.device)
        for i in range(P):  # the original's turns, one pursuer after another
            pursuers[:, i] = self._moved(pursuers[:, i], action[:, i])
            tags = tags + self._tags(evader_grid, pursuers)
        self.pursuers = pursuers
        caught, catchers = self._caught(pursuers)
        self.alive = self.alive & ~caught
        if not self.frozen:
            moves = self.randint(5, E, self.V)
            self.evaders = torch.where(
                self.alive.unsqueeze(-1), self._moved(self.evaders, moves), self.evaders
            )
        # Every turn's tag payment, and the last turn's catches and urgency; shared, each
        # turn's payment is a mean over the pursuers, so their sum is the mean of the sum.
        paid = self.tag * tags / P + self.catch * catchers.to(self.dtype) + self.urgency
        if self.shared:
            paid = paid.mean(-1, keepdim=True).expand_as(paid)
        # At the step that reaches `max_cycles` the original cuts the episode, also where
        # its last evader was caught.
        over = ~self.alive.any(-1) & (self.steps + 1 < self.max_cycles)
        return {"pursuer": paid}, over

    def _caught(self, pursuers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The live evaders caught now `[E, V]` and the pursuers that caught one `[E, P]`."""
        E = pursuers.shape[0]
        rows = torch.arange(E, device=self.device).unsqueeze(1)
        occupied = self._count(pursuers)
        ev = self.evaders
        if self.surround:
            ok, at = self._open(self._neighbours(ev))  # [E, V, 4]
            held = ok & (occupied[rows.unsqueeze(-1), at[..., 0], at[..., 1]] > 0)
            caught = self.alive & (held.sum(-1) == self.need[ev[..., 0], ev[..., 1]])
            # A pursuer catches where a caught evader is beside it.
            grid = self._count(ev, caught) > 0
            ok, at = self._open(self._neighbours(pursuers))
            catchers = (ok & grid[rows.unsqueeze(-1), at[..., 0], at[..., 1]]).any(-1)
        else:
            stacked = occupied[rows, ev[..., 0], ev[..., 1]]
            caught = self.alive & (stacked >= self.n_catch)
            grid = self._count(ev, caught) > 0
            catchers = grid[rows, pursuers[..., 0], pursuers[..., 1]]
        return caught, catchers

    # ------------------------------------------------------------ observations

    def _layers(self) -> torch.Tensor:
        """Walls, pursuers and evaders per cell `[E, 3, X, Y]`."""
        E = self.pursuers.shape[0]
        walls = self.building.to(self.dtype).expand(E, self.X, self.Y)
        return torch.stack([walls, self._count(self.pursuers),
                            self._count(self.evaders, self.alive)], 1)  # fmt: skip

    def observe(self):
        layers = self._layers()
        E, R, (X, Y) = layers.shape[0], self.view, (self.X, self.Y)
        padded = torch.zeros(E, 3, X + 2 * R, Y + 2 * R, dtype=self.dtype, device=self.device)
        padded[:, 0] = self.walls
        padded[:, :, R : R + X, R : R + Y] = layers
        xs = self.pursuers[..., 0].unsqueeze(-1) + self.reach + R  # [E, P, view]
        ys = self.pursuers[..., 1].unsqueeze(-1) + self.reach + R
        rows = torch.arange(E, device=self.device).view(E, 1, 1, 1)
        # [E, P, y, x, layer], as the original's (layer, x, y) view with axes 2 and 0 swapped
        view = padded.permute(0, 3, 2, 1)[rows, ys.unsqueeze(-1), xs.unsqueeze(-2)]
        if R % 2 == 0:  # the last row and column the original never fills: walls
            for edge in (view[:, :, -1], view[:, :, :, -1]):
                edge[..., 0] = 1.0
                edge[..., 1:] = 0.0
        state = layers.permute(0, 3, 2, 1).flatten(1)  # (y, x, layer)
        return {"pursuer": view}, state, {}
