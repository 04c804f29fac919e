"""Level-based foraging (Albrecht & Ramamoorthy 2013; the `lbforaging` package, v3 tasks) as
a batched torch env: `lbf/<task>` under `env.backend: native`.

Players with levels walk a grid and load food: a food is collected when the players next to
it that load on the same step have levels summing to at least its level, and each of them
is paid its level times the food's level, over the sum of their levels and the food spawned
in the episode (`normalize_reward`). The rules are the package's, step for step (a parity
test holds them to it):

- An action that is not allowed (walking off the grid or onto food, loading with no food
  next to the player) is replaced by NONE; the allowed ones are the action masks.
- Players that target the same cell (staying counts as targeting one's own) all stay; two
  players may swap cells.
- Each observation lists the foods within `sight` (row-major, relative to the corner of the
  player's view clipped at the grid's edge), then the player itself and the other players it
  sees, in index order, each as (row, col, level); unseen slots are (-1, -1, 0). As in the
  package, a player near the grid's top or left edge sees other players up to `2 * sight`
  cells below or right of its view's corner. With `grid_observation` it is the package's
  grid instead: three `(2 * sight + 1)`-square layers centred on the player (players'
  levels, foods' levels, cells free to step on), a frame `model.encoder: cnn` reads.
- Start states: players on distinct cells, uniform; foods one after another on inner cells
  with no food in the 3x3 around them or two cells away along a row or column; levels
  uniform in their ranges (foods at the maximum with `force_coop`; the maximum defaults to
  the sum of the three lowest player levels).

Foods are kept as `max_num_food` slots (position and level, 0 once collected), so a step is
a few tensor operations over `[envs, players, foods]`: no loop over envs, players or foods.
Only a reset places foods one at a time (they constrain each other).

The task name gives the package's keywords (`Foraging-2s-8x8-2p-2f-coop-v3`: sight 2, an 8x8
grid, 2 players, 2 foods, cooperative); `env.params` override them, as with the package.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from marlctl.envs.native import (
    FORAGING_UNSUPPORTED,
    foraging_params,
    foraging_task,
    foraging_unsupported,
)
from marlctl.envs.native.base import NativeEnv, group
from marlctl.envs.signature import FactoryParams

ACTIONS = 6  # NONE, NORTH, SOUTH, WEST, EAST, LOAD
NONE, LOAD = 0, 5
# Row and column change of each action.
MOVES = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (0, 0))


def task_class(env_id: str) -> type[Foraging]:
    """The native env of `lbf/<task>`: `Foraging` with the task's keywords as defaults."""
    kwargs = foraging_task(env_id.partition("/")[2])
    if kwargs is None:
        raise ValueError(f"'{env_id}' is not a level-based foraging task name")
    return type("Foraging", (Foraging,), {"env_id": env_id, "task": kwargs})


class Foraging(NativeEnv):
    env_id = "lbf/Foraging-8x8-2p-2f-coop-v3"
    task: dict[str, Any] = foraging_task("Foraging-8x8-2p-2f-coop-v3")
    pure_steps = ("observe", "advance")

    # Keywords of the package's env and of marlctl's wrapper that no task name sets.
    extra = {
        "common_reward": False,
        "reward_scalarisation": "sum",
        "normalize_reward": True,
        "observe_agent_levels": True,
    }

    @classmethod
    def parameters(cls) -> FactoryParams:
        task = {k: list(v) if isinstance(v, tuple) else v for k, v in cls.task.items()}
        return FactoryParams({"max_cycles": cls.max_cycles, **task, **cls.extra}, False)

    def build(self, **params: Any):
        p = {**self.task, **self.extra, **params}
        p.pop("render_mode", None)
        unknown = set(p) - set(self.parameters().defaults)
        if unknown:
            raise ValueError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
        key = foraging_unsupported(p)
        if key is not None:
            raise ValueError(f"{key}: {FORAGING_UNSUPPORTED[key]}")
        p = foraging_params(p)
        (rows, cols), P, F = p["field_size"], p["players"], p["max_num_food"]
        self.rows, self.cols, self.P, self.F = rows, cols, P, F
        self.sight = p["sight"]
        self.max_cycles = p["max_episode_steps"]
        self.force_coop, self.penalty = p["force_coop"], p["penalty"]
        self.normalize = p["normalize_reward"]
        self.common = p["common_reward"]
        self.mean_reward = p["reward_scalarisation"] == "mean"
        dev = self.device
        self.player_min = torch.tensor(p["min_player_level"], device=dev)
        self.player_max = torch.tensor(p["max_player_level"], device=dev)
        self.food_min = torch.tensor(p["min_food_level"], device=dev)
        top = p["max_food_level"]
        self.food_max = None if top is None else torch.tensor(top, device=dev)
        self.moves = torch.tensor(MOVES, device=dev)
        self.unseen = torch.tensor([-1, -1, 0], device=dev)  # (row, col, level) of no one
        self.player_index = torch.arange(P, device=dev)
        self.grid = p.get("grid_observation", False)
        self.obs_dim = 3 * (2 * self.sight + 1) ** 2 if self.grid else 3 * F + 3 * P
        # The original's masks come in its infos: the same group, whichever backend runs.
        agents = replace(group("agent", P, self.obs_dim, ACTIONS), mask_source="info")
        if self.grid:  # the package's layers: players, foods, access; each a player's view
            agents = replace(agents, obs_shape=(3, 2 * self.sight + 1, 2 * self.sight + 1))
        return [agents], P * self.obs_dim

    # ------------------------------------------------------------ start states

    def start(self, n: int) -> dict[str, torch.Tensor]:
        P, F, R, C, dev = self.P, self.F, self.rows, self.cols, self.device
        # Player levels: each player draws in the range of a random player (the package
        # permutes the per-player ranges), positions uniform over distinct cells.
        perm = self.rand(n, P, low=0, high=1).argsort(-1)
        low, high = self.player_min[perm], self.player_max[perm]
        level = low + (self.rand(n, P, low=0, high=1) * (high - low + 1)).long()
        cell = self.rand(n, R * C, low=0, high=1).argsort(-1)[:, :P]
        pos = torch.stack([cell // C, cell % C], -1)
        # Food levels: the package permutes the per-food ranges too.
        perm = self.rand(n, F, low=0, high=1).argsort(-1)
        if self.food_max is None:
            top = level.sort(-1).values[:, :3].sum(-1, keepdim=True).expand(n, F)
        else:
            top = self.food_max[perm]
        bottom = top if self.force_coop else self.food_min[perm]
        food_level = bottom + (self.rand(n, F, low=0, high=1) * (top - bottom + 1)).long()
        # Food cells, one after another: uniform over the inner cells left free.
        field = torch.zeros(n, R, C, dtype=torch.long, device=dev)
        occupied = self._grid(pos, torch.ones(n, P, dtype=torch.long, device=dev)) > 0
        inner = torch.zeros(R, C, dtype=torch.bool, device=dev)
        inner[1 : R - 1, 1 : C - 1] = True
        food_pos = torch.zeros(n, F, 2, dtype=torch.long, device=dev)
        placed = torch.zeros(n, F, dtype=torch.bool, device=dev)
        for f in range(F):
            free = inner & ~occupied & (self._near(field) == 0)
            keys = self.rand(n, R * C, low=0, high=1).masked_fill(~free.flatten(1), -1.0)
            best = keys.argmax(-1)
            ok = free.flatten(1).any(-1)
            food_pos[:, f] = torch.stack([best // C, best % C], -1)
            placed[:, f] = ok
            hit = torch.zeros(n, R * C, dtype=torch.long, device=dev)
            hit.scatter_(1, best.unsqueeze(1), (food_level[:, f] * ok).unsqueeze(1))
            field = field + hit.view(n, R, C)
        food_level = food_level * placed
        return {
            "pos": pos,
            "level": level,
            "food_pos": food_pos,
            "food_level": food_level,
            "food_spawned": food_level.sum(-1).to(self.dtype),
        }

    def _grid(self, pos: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """`value` `[E, k]` scattered onto the grid at `pos` `[E, k, 2]` -> `[E, R, C]`."""
        E = pos.shape[0]
        flat = torch.zeros(E, self.rows * self.cols, dtype=value.dtype, device=self.device)
        flat.scatter_add_(1, pos[..., 0] * self.cols + pos[..., 1], value)
        return flat.view(E, self.rows, self.cols)

    def _near(self, field: torch.Tensor) -> torch.Tensor:
        """Per cell, the food in its 3x3 block and two cells away along its row and column:
        a food may spawn only where this is 0."""
        padded = torch.nn.functional.pad(field, (2, 2, 2, 2))
        R, C = self.rows, self.cols
        total = torch.zeros_like(field)
        for dr in (-1, 0, 1):
            for dc in (-1, 0, 1):
                total = total + padded[:, 2 + dr : 2 + dr + R, 2 + dc : 2 + dc + C]
        for d in (-2, 2):
            total = total + padded[:, 2 + d : 2 + d + R, 2 : 2 + C]
            total = total + padded[:, 2 : 2 + R, 2 + d : 2 + d + C]
        return total

    # ------------------------------------------------------------ observations

    def _field(self) -> torch.Tensor:
        return self._grid(self.food_pos, self.food_level)

    def _masks(self, field: torch.Tensor) -> torch.Tensor:
        """Allowed actions `[E, P, 6]`: a move onto the grid and off food; LOAD next to food."""
        R, C = self.rows, self.cols
        target = self.pos.unsqueeze(2) + self.moves  # [E, P, 6, 2]
        inside = (target >= 0).all(-1) & (target[..., 0] < R) & (target[..., 1] < C)
        t = target.clamp(min=0)
        t = torch.stack([t[..., 0].clamp(max=R - 1), t[..., 1].clamp(max=C - 1)], -1)
        E = field.shape[0]
        food_at = field.view(E, -1).gather(1, (t[..., 0] * C + t[..., 1]).view(E, -1))
        food_at = food_at.view(E, self.P, ACTIONS) > 0
        mask = inside & ~food_at
        mask[..., NONE] = True
        adjacent = (food_at & inside)[..., 1:5].any(-1)  # a food N, S, W or E of the player
        mask[..., LOAD] = adjacent
        return mask

    def observe(self):
        if self.grid:
            obs = self._grid_views()
            return {"agent": obs}, obs.flatten(1), {"agent": self._masks(self._field())}
        s, P, F = self.sight, self.P, self.F
        pos, level = self.pos, self.level
        origin = (pos - s).clamp(min=0)  # [E, P, 2]: the corner of each player's view
        # Foods within sight, row-major.
        rel_f = self.food_pos.unsqueeze(1) - pos.unsqueeze(2)  # [E, P, F, 2]
        seen_f = (rel_f.abs() <= s).all(-1) & (self.food_level > 0).unsqueeze(1)
        order = self.food_pos[..., 0] * self.cols + self.food_pos[..., 1]  # [E, F]
        key = torch.where(seen_f, order.unsqueeze(1), self.rows * self.cols + 1)
        rank = key.argsort(dim=-1, stable=True)  # seen foods first, in row-major order
        food = torch.cat(
            [self.food_pos.unsqueeze(1) - origin.unsqueeze(2), self.food_level.unsqueeze(1)
             .expand(-1, P, F).unsqueeze(-1)], -1,
        )  # fmt: skip
        food = torch.where(seen_f.unsqueeze(-1), food, self.unseen)
        food = food.gather(2, rank.unsqueeze(-1).expand(-1, -1, -1, 3))
        # Players: itself first, then the others it sees in index order (packed).
        rel_p = pos.unsqueeze(1) - origin.unsqueeze(2)  # [E, P(viewer), P(seen), 2]
        seen_p = ((rel_p >= 0) & (rel_p <= 2 * s)).all(-1)
        idx = self.player_index
        me = idx.unsqueeze(1) == idx  # [P, P]
        rank_key = torch.where(me, -1, idx).expand_as(seen_p)  # self before everyone
        rank_key = torch.where(seen_p, rank_key, P + 1)
        rank = rank_key.argsort(dim=-1, stable=True)
        players = torch.cat([rel_p, level.unsqueeze(1).expand(-1, P, P).unsqueeze(-1)], -1)
        players = torch.where(seen_p.unsqueeze(-1), players, self.unseen)
        players = players.gather(2, rank.unsqueeze(-1).expand(-1, -1, -1, 3))
        obs = torch.cat([food.flatten(2), players.flatten(2)], -1).to(self.dtype)
        masks = self._masks(self._field())
        return {"agent": obs}, obs.flatten(1), {"agent": masks}

    def _grid_views(self) -> torch.Tensor:
        """`grid_observation`: each player's view `[E, P, 3, 2s+1, 2s+1]` of three layers,
        the players' levels, the foods' levels and the cells a player may step on (off the
        grid, players and foods: 0), centred on the player."""
        s, E = self.sight, self.pos.shape[0]
        field = self._field()
        # Where players share a cell (a move into a cell its player left for another), the
        # package writes them in turn: the last one's level stays.
        same = (self.pos.unsqueeze(2) == self.pos.unsqueeze(1)).all(-1)  # [E, P, P]
        later = same & (self.player_index.unsqueeze(1) < self.player_index)  # q after p
        players = self._grid(self.pos, self.level * ~later.any(-1))
        free = (self._grid(self.pos, torch.ones_like(self.level)) == 0) & (field == 0)
        layers = torch.stack([players, field, free.long()], -1).to(self.dtype)  # [E, R, C, 3]
        layers = torch.nn.functional.pad(layers, (0, 0, s, s, s, s))  # zeros off the grid
        span = torch.arange(2 * s + 1, device=self.device)
        rows = (self.pos[..., 0, None] + span)[..., :, None]  # [E, P, W, 1], padded coords
        cols = (self.pos[..., 1, None] + span)[..., None, :]  # [E, P, 1, W]
        envs = torch.arange(E, device=self.device).view(E, 1, 1, 1)
        return layers[envs, rows, cols].permute(0, 1, 4, 2, 3)

    # ------------------------------------------------------------ a step

    def advance(self, actions: dict[str, torch.Tensor]):
        a = actions["agent"].long()
        field = self._field()
        allowed = self._masks(field).gather(-1, a.unsqueeze(-1)).squeeze(-1)
        a = torch.where(allowed, a, NONE)
        # Moves: a player moves unless another player targets the same cell.
        target = self.pos + self.moves[a]
        same = (target.unsqueeze(2) == target.unsqueeze(1)).all(-1).sum(-1)
        self.pos = torch.where((same == 1).unsqueeze(-1), target, self.pos)
        # Loads: the loaders next to a food together; each player is next to one food at
        # most (foods never spawn that close to each other).
        dist = (self.food_pos.unsqueeze(1) - self.pos.unsqueeze(2)).abs().sum(-1)  # [E, P, F]
        alive = self.food_level > 0
        near = (dist == 1) & (a == LOAD).unsqueeze(-1) & alive.unsqueeze(1)
        lvl = self.level.to(self.dtype)
        group_level = (near * lvl.unsqueeze(-1)).sum(1)  # [E, F]
        food = self.food_level.to(self.dtype)
        loaded = alive & (group_level >= food) & (group_level > 0)
        share = lvl.unsqueeze(-1) * food.unsqueeze(1)  # [E, P, F]
        if self.normalize:
            spawned = self.food_spawned.view(-1, 1, 1)
            share = share / (group_level.unsqueeze(1) * spawned).clamp(min=1e-12)
        paid = near & loaded.unsqueeze(1)
        failed = near & ~loaded.unsqueeze(1)
        reward = (share * paid).sum(-1) - self.penalty * failed.any(-1).to(self.dtype)
        self.food_level = torch.where(loaded, 0, self.food_level)
        if self.common:
            team = reward.mean(-1) if self.mean_reward else reward.sum(-1)
            reward = team.unsqueeze(-1).expand_as(reward)
        return {"agent": reward}, (self.food_level == 0).all(-1)
