"""POGEMA's multi-agent pathfinding (Skrynnik et al. 2024, pogema 1.4.0) as batched torch.

Agents walk a grid of obstacles, each to its own target, one cell (or a wait) per step. An
agent sees the `(2r+1)^2` cells around it as three layers, `[3, 2r+1, 2r+1]`: obstacles
(the map's border is a ring of obstacles one cell outside it; beyond is free), the agents
still on the map (itself included), and its target, or the border cell in its direction
when the target is out of sight. As in POGEMA:

- moves are `(0, 0)` (wait), up, down, left, right (`GridConfig.MOVES`);
- `collision_system: priority` moves the agents in index order, each into its cell if no
  obstacle or agent is there now; `block_both` moves every agent whose cell no other agent
  aims at or stands on, all at once;
- `on_target: finish` rewards 1 on arrival and takes the agent off the map (it leaves the
  episode); the episode ends once every agent has arrived, or after `max_cycles` steps
  (truncated). `on_target: nothing` keeps agents on the map and rewards everyone 1 when all
  stand on their targets at once, which ends the episode.

So an agent's return is its arrival (the mean over agents is POGEMA's ISR, individual
success rate), and `win_rate` is its CSR (cooperative success rate: every agent arrived).

Maps (`pogema/random`): obstacles drawn with probability `density` on a `size` x `size`
grid; `pogema/maze`: a fixed map (`map`: rows of `#` walls and `.` free cells; a maze by
default). As in POGEMA, agents start on distinct free cells and get distinct targets, none
on a start, in their start's connected part of the map. Start states are drawn on the host side
per seed block (`NativeEnv.ahead`); POGEMA's own generator is not reproduced draw for draw,
so `tests/test_native_pogema.py` replays episodes recorded from pogema 1.4.0 (maps, starts,
targets and actions) and compares every step.
"""

from __future__ import annotations

import torch

from marlctl.envs.info import GroupInfo
from marlctl.envs.native.base import NativeEnv
from marlctl.envs.native.params import choice, integer, number

MOVES = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))
COLLISIONS = ("priority", "block_both")
ON_TARGET = ("finish", "nothing")
# A hand-drawn maze: corridors one cell wide, rooms and dead ends (15 x 13).
MAZE = """
.........#.....
.#######.#.###.
.#.....#.#...#.
.#.###.#.###.#.
...#...#.....#.
####.#######.#.
.....#.....#.#.
.#####.###.#.#.
.#.....#...#...
.#.#####.#####.
.#.......#.....
.#########.###.
...........#...
""".strip()
_RETRIES = 32  # fresh maps for envs whose agents could not all be placed


def parse_map(text: str) -> list[list[int]]:
    """Rows of `#` (obstacle) and `.` (free) as 1s and 0s; ValueError if ragged or other."""
    rows = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not rows or len({len(r) for r in rows}) != 1 or set("".join(rows)) - set("#."):
        raise ValueError("map must be rows of equal length of '#' (obstacle) and '.' (free)")
    return [[1 if c == "#" else 0 for c in row] for row in rows]


class Pogema(NativeEnv):
    env_id = "pogema/random"
    max_cycles = 64
    reports_wins = True

    def __init__(self, params, num_envs, device="cpu", dtype=torch.float32, seeds=1):
        super().__init__(params, num_envs, device, dtype, seeds)
        # Start states are placed with host-side retries: drawn ahead, never in a graph.
        self.graph_safe = False

    def build(
        self,
        num_agents: int = 4,
        size: int = 8,
        density: float = 0.3,
        obs_radius: int = 5,
        collision_system: str = "priority",
        on_target: str = "finish",
        map: str | None = None,
    ):
        self.n = integer("num_agents", num_agents, 1)
        self.r = integer("obs_radius", obs_radius, 1)
        self.collision = choice("collision_system", collision_system, COLLISIONS)
        self.on_target = choice("on_target", on_target, ON_TARGET)
        if map is None:
            self.H = self.W = integer("size", size, 2)
            self.density = number("density", density)
            if not 0.0 <= self.density < 1.0:
                raise ValueError(f"density must be from 0 to below 1, not {density!r}")
            self.fixed = None
        else:
            grid = parse_map(map)
            self.H, self.W, self.density = len(grid), len(grid[0]), 0.0
            self.fixed = torch.tensor(grid, dtype=torch.bool, device=self.device)
            if int((~self.fixed).sum()) < 2 * self.n:
                raise ValueError(f"the map has fewer than {2 * self.n} free cells")
        if self.fixed is None and (1 - self.density) * self.H * self.W < 2 * self.n:
            raise ValueError(f"a {self.H}x{self.W} map of density {density} cannot hold "
                             f"{self.n} agents and their targets")  # fmt: skip
        self.Hb, self.Wb = self.H + 2 * self.r, self.W + 2 * self.r
        self.moves = torch.tensor(MOVES, device=self.device)
        k = 2 * self.r + 1
        self.offsets = torch.arange(-self.r, self.r + 1, device=self.device)
        agents = tuple(f"agent_{i}" for i in range(self.n))
        groups = [GroupInfo("agent", agents, (3, k, k), "float32", True, len(MOVES))]
        return groups, 3 * self.H * self.W

    # ------------------------------------------------------------ start states

    def start(self, n: int) -> dict[str, torch.Tensor]:
        inner = self._maps(n)
        pos, target, ok = self._place(inner)
        for _ in range(_RETRIES):
            if bool(ok.all()):
                break
            again = self._maps(n)
            p2, t2, ok2 = self._place(again)
            redo = ~ok
            inner = torch.where(redo.view(-1, 1, 1), again, inner)
            pos = torch.where(redo.view(-1, 1, 1), p2, pos)
            target = torch.where(redo.view(-1, 1, 1), t2, target)
            ok = ok | ok2
        if not bool(ok.all()):
            raise ValueError("could not place every agent and target: lower num_agents or density")
        return {
            "obstacles": self._bordered(inner),
            "pos": pos + self.r,
            "target": target + self.r,
            "on": torch.ones(n, self.n, dtype=torch.bool, device=self.device),
        }

    def _maps(self, n: int) -> torch.Tensor:
        if self.fixed is not None:
            return self.fixed.expand(n, -1, -1).clone()
        return self.rand(n, self.H, self.W, low=0.0, high=1.0) < self.density

    def _bordered(self, inner: torch.Tensor) -> torch.Tensor:
        """The map inside a ring of obstacles one cell out, free beyond (POGEMA's
        `empty_outside`), `r` cells on each side."""
        n, r = inner.shape[0], self.r
        out = torch.zeros(n, self.Hb, self.Wb, dtype=torch.bool, device=self.device)
        out[:, r - 1, r - 1 : self.Wb - r + 1] = True
        out[:, self.Hb - r, r - 1 : self.Wb - r + 1] = True
        out[:, r - 1 : self.Hb - r + 1, r - 1] = True
        out[:, r - 1 : self.Hb - r + 1, self.Wb - r] = True
        out[:, r : self.Hb - r, r : self.Wb - r] = inner
        return out

    def _components(self, free: torch.Tensor) -> torch.Tensor:
        """`[n, H*W]` each free cell's component label (its smallest cell index)."""
        n, cells = free.shape[0], self.H * self.W
        big = torch.full((n, cells), cells, device=self.device)
        label = torch.where(free.view(n, -1), torch.arange(cells, device=self.device), big)
        while True:
            grid = label.view(n, self.H, self.W)
            low = grid.clone()
            low[:, 1:] = torch.minimum(low[:, 1:], grid[:, :-1])
            low[:, :-1] = torch.minimum(low[:, :-1], grid[:, 1:])
            low[:, :, 1:] = torch.minimum(low[:, :, 1:], grid[:, :, :-1])
            low[:, :, :-1] = torch.minimum(low[:, :, :-1], grid[:, :, 1:])
            step = torch.where(free.view(n, -1), low.view(n, -1), big)
            jumped = step.gather(1, step.clamp(max=cells - 1))  # a label's own label
            step = torch.where(free.view(n, -1), torch.minimum(step, jumped), big)
            if torch.equal(step, label):
                return label
            label = step

    def _place(self, inner: torch.Tensor):
        """Starts on distinct free cells of components of two or more cells, and distinct
        targets in each start's component; `ok` `[n]` where every agent got both."""
        n, cells = inner.shape[0], self.H * self.W
        free = ~inner
        label = self._components(free)
        sizes = torch.zeros(n, cells + 1, device=self.device, dtype=torch.long)
        sizes.scatter_add_(1, label, torch.ones_like(label))
        usable = free.view(n, -1) & (sizes.gather(1, label) >= 2)
        used = torch.zeros(n, cells, dtype=torch.bool, device=self.device)
        priority = self.rand(n, cells, 2 * self.n, low=0.0, high=1.0)
        starts, targets = [], []
        ok = torch.ones(n, dtype=torch.bool, device=self.device)
        for i in range(self.n):
            s, got = self._pick(priority[:, :, 2 * i], usable & ~used)
            used.scatter_(1, s.unsqueeze(1), True)
            same = label == label.gather(1, s.unsqueeze(1))
            t, got_t = self._pick(priority[:, :, 2 * i + 1], same & free.view(n, -1) & ~used)
            used.scatter_(1, t.unsqueeze(1), True)
            starts.append(s)
            targets.append(t)
            ok &= got & got_t
        xy = lambda c: torch.stack((c // self.W, c % self.W), -1)  # noqa: E731
        return xy(torch.stack(starts, 1)), xy(torch.stack(targets, 1)), ok

    @staticmethod
    def _pick(priority: torch.Tensor, allowed: torch.Tensor):
        score = torch.where(allowed, priority, torch.full_like(priority, -1.0))
        return score.argmax(1), allowed.any(1)

    # ------------------------------------------------------------ a step

    def _cells(self, xy: torch.Tensor) -> torch.Tensor:
        return xy[..., 0] * self.Wb + xy[..., 1]

    def _occupied(self) -> torch.Tensor:
        """`[E, Hb*Wb]` the cells of the agents on the map."""
        # Summed: an agent off the map may stand on the cell of one on it.
        occ = torch.zeros(self.num_envs, self.Hb * self.Wb, dtype=torch.long, device=self.device)
        return occ.scatter_add_(1, self._cells(self.pos), self.on.long()) > 0

    def advance(self, actions: dict[str, torch.Tensor]):
        a = actions["agent"].long()
        wall = self.obstacles.view(self.num_envs, -1)
        occ = self._occupied()
        if self.collision == "priority":
            moved = []
            for i in range(self.n):  # in index order, each seeing the cells moved into
                here, nxt = self.pos[:, i], self.pos[:, i] + self.moves[a[:, i]]
                at, to = self._cells(here).unsqueeze(1), self._cells(nxt).unsqueeze(1)
                go = self.on[:, i : i + 1] & ~wall.gather(1, to) & ~occ.gather(1, to)
                occ = occ.scatter(1, at, occ.gather(1, at) & ~go)
                occ = occ.scatter(1, to, occ.gather(1, to) | go)
                moved.append(torch.where(go, nxt, here))
            self.pos = torch.stack(moved, 1)
        else:  # block_both: a cell aimed at twice, or stood on, blocks whoever aims at it
            nxt = self.pos + self.moves[a]
            cells = self._cells(nxt)
            aimed = torch.zeros_like(wall, dtype=torch.long)
            aimed.scatter_add_(1, cells, self.on.long())
            blocked = (aimed.gather(1, cells) > 1) | occ.gather(1, cells) | wall.gather(1, cells)
            go = self.on & ~blocked
            self.pos = torch.where(go.unsqueeze(-1), nxt, self.pos)
        there = (self.pos == self.target).all(-1)
        if self.on_target == "finish":
            reward = (there & self.on).to(self.dtype)
            self.on = self.on & ~there
            done = there.all(1)
        else:
            done = (there & self.on).all(1)
            reward = done.to(self.dtype).unsqueeze(1).expand(-1, self.n)
        self.won = done
        return {"agent": reward}, done

    # ------------------------------------------------------------ observations

    def _windows(self, grid: torch.Tensor) -> torch.Tensor:
        """`[E, n, k, k]` the cells of `grid` `[E, Hb*Wb]` around each agent."""
        rows = self.pos[..., 0, None, None] + self.offsets.view(-1, 1)
        cols = self.pos[..., 1, None, None] + self.offsets.view(1, -1)
        index = (rows * self.Wb + cols).view(self.num_envs, -1)
        k = 2 * self.r + 1
        return grid.gather(1, index).view(self.num_envs, self.n, k, k)

    def observe(self):
        E, r, k = self.num_envs, self.r, 2 * self.r + 1
        walls = self._windows(self.obstacles.view(E, -1))
        occupied = self._occupied()
        agents = self._windows(occupied)
        d = (self.pos - self.target).clamp(-r, r)
        square = torch.zeros(E, self.n, k * k, dtype=self.dtype, device=self.device)
        square.scatter_(2, ((r - d[..., 0]) * k + r - d[..., 1]).unsqueeze(-1), 1.0)
        obs = torch.stack(
            (walls.to(self.dtype), agents.to(self.dtype), square.view(E, self.n, k, k)), 2
        )
        self._active = {"agent": self.on}
        inner = (slice(None), slice(r, r + self.H), slice(r, r + self.W))
        occ = occupied.view(E, self.Hb, self.Wb)[inner]
        goals = torch.zeros(E, self.Hb * self.Wb, dtype=torch.long, device=self.device)
        goals = goals.scatter_add_(1, self._cells(self.target), self.on.long()) > 0
        goals = goals.view(E, self.Hb, self.Wb)
        state = torch.cat(
            [x.reshape(E, -1) for x in (self.obstacles[inner], occ, goals[inner])], 1
        ).to(self.dtype)
        return {"agent": obs}, state, {}


class PogemaMaze(Pogema):
    env_id = "pogema/maze"

    def build(self, num_agents: int = 6, obs_radius: int = 5, collision_system: str = "priority",
              on_target: str = "finish", map: str = MAZE):  # fmt: skip
        return super().build(num_agents, 8, 0.0, obs_radius, collision_system, on_target, map)
