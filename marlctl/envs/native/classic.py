"""Two-player board games of PettingZoo's `classic` suite as batched torch envs: tic-tac-toe
(`tictactoe_v3`) and connect four (`connect_four_v3`), step for step as the pettingzoo
backend presents the AEC games (through `marlctl.envs.turns`).

Two players take turns, the first of `agents` moving first with mark 1, the other with mark
2, on a board whose cells are numbered row by row. Only the player to move is active: the
other's action is ignored and it leaves the loss (turn-based). The move that completes a
line ends the game with +1 for its player and -1 for the other, both on that step; a full
board without a line ends it with 0. Each player observes the board from its own side,
`[rows, cols, 2]`: its own marks, then the other's. Its legal moves are masked on its turn
and all masked otherwise; the global state is both observations, as the pettingzoo backend
concatenates them for an env without `state()`.

An illegal move (masked, so only a caller that ignores masks makes one) changes nothing: the
same player is still to move. A game of legal moves ends within one move per cell, the
episode limit. The scripted opponents of `env.params.opponent` play in the PettingZoo env
only (`native_problem` refuses them at validation).
"""

from __future__ import annotations

from typing import Any

import torch

from marlctl.envs.batch import Observation
from marlctl.envs.info import GroupInfo
from marlctl.envs.native.base import NativeEnv
from marlctl.envs.signature import FactoryParams


def lines_of(rows: int, cols: int, length: int) -> list[tuple[int, ...]]:
    """Every run of `length` cells in a row, a column or a diagonal of the board."""
    found = []
    for r in range(rows):
        for c in range(cols):
            for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                cells = [(r + i * dr, c + i * dc) for i in range(length)]
                if all(0 <= y < rows and 0 <= x < cols for y, x in cells):
                    found.append(tuple(y * cols + x for y, x in cells))
    return found


class BoardGame(NativeEnv):
    """Two players alternate marks on a `rows` x `cols` board; `line` in a row wins."""

    turn_based = True
    rows = cols = line = 0
    agents: tuple[str, str] = ("player_0", "player_1")
    n_actions = 0
    screen: tuple[str, Any] = ("", None)  # the original's keyword for its screen, default

    @classmethod
    def parameters(cls) -> FactoryParams:
        key, default = cls.screen
        return FactoryParams({"max_cycles": cls.max_cycles, "opponent": None, key: default}, False)

    def build(self, opponent: str | None = None, **screen: Any):
        """`opponent` and the screen's size are the original's: no scripted opponent plays
        here, and the screen is its renderer's."""
        unknown = set(screen) - {self.screen[0]}
        if unknown:
            raise ValueError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
        if opponent is not None:
            raise ValueError(f"opponent {opponent!r} plays in backend: pettingzoo only")
        self.lines = torch.tensor(lines_of(self.rows, self.cols, self.line), device=self.device)
        self.seat = torch.arange(2, device=self.device)
        self.cells = self.rows * self.cols
        players = GroupInfo(
            "player", self.agents, (self.rows, self.cols, 2), "int8", True, self.n_actions,
            mask_source="obs",
        )  # fmt: skip
        return [players], 2 * self.cells * 2

    def legal(self) -> torch.Tensor:
        """`[E, n_actions]`: the moves allowed on each board."""
        raise NotImplementedError

    def cell(self, action: torch.Tensor) -> torch.Tensor:
        """The cell `[E, 1]` that move `action` `[E, 1]` marks (where it is legal)."""
        raise NotImplementedError

    def start(self, n: int) -> dict[str, torch.Tensor]:
        dev = self.device
        return {
            "board": torch.zeros(n, self.cells, dtype=torch.long, device=dev),  # 0, 1 or 2
            "mover": torch.zeros(n, dtype=torch.long, device=dev),  # the seat to move
            "over": torch.zeros(n, dtype=torch.bool, device=dev),
        }

    def observe(self):
        E = self.board.shape[0]
        marks = self.board.unsqueeze(1) == (self.seat + 1).view(1, 2, 1)  # [E, seat, cells]
        obs = torch.stack([marks, marks.flip(1)], -1).view(E, 2, self.rows, self.cols, 2)
        obs = obs.to(self.dtype)
        masks = self.legal().unsqueeze(1) & self.to_move().unsqueeze(-1)
        return {"player": obs}, obs.flatten(1), {"player": masks}

    def advance(self, actions: dict[str, torch.Tensor]):
        move = actions["player"].long().gather(1, self.mover.unsqueeze(-1))  # [E, 1]
        inside = move.clamp(0, self.n_actions - 1)
        legal = self.legal().gather(1, inside) & (move == inside)
        cell = self.cell(inside)
        mark = (self.mover + 1).unsqueeze(-1)
        chosen = torch.zeros_like(self.board, dtype=torch.bool).scatter_(1, cell, legal)
        board = torch.where(chosen, mark, self.board)
        # Only the mover's new mark can complete a line.
        won = (board[:, self.lines] == mark.unsqueeze(-1)).all(-1).any(-1)
        over = won | (board != 0).all(-1)
        reward = torch.where(self.to_move(), 1.0, -1.0) * won.unsqueeze(-1)
        self.board, self.over = board, over
        self.mover = torch.where(legal.squeeze(-1), 1 - self.mover, self.mover)
        return {"player": reward.to(self.dtype)}, over

    def to_move(self) -> torch.Tensor:
        """`[E, 2]`: the seat whose turn it is."""
        return self.seat == self.mover.unsqueeze(-1)

    def _observation(self, seen: tuple | None = None) -> Observation:
        ob = super()._observation(seen)
        # The player to move, while its game goes on (a final observation has no one).
        return ob._replace(active={"player": self.to_move() & ~self.over.unsqueeze(-1)})


class TicTacToe(BoardGame):
    """3 x 3, three in a line; action k marks cell k."""

    env_id = "classic/tictactoe"
    rows = cols = line = 3
    agents = ("player_1", "player_2")
    n_actions = 9
    max_cycles = 9
    screen = ("screen_height", 1000)

    def legal(self) -> torch.Tensor:
        return self.board == 0

    def cell(self, action: torch.Tensor) -> torch.Tensor:
        return action


class ConnectFour(BoardGame):
    """6 rows x 7 columns, four in a line; action c drops a disc into column c, onto the
    lowest empty cell."""

    env_id = "classic/connect_four"
    rows, cols, line = 6, 7, 4
    n_actions = 7
    max_cycles = 42
    screen = ("screen_scaling", 9)

    def legal(self) -> torch.Tensor:
        return self.board[:, : self.cols] == 0  # the column's top cell is empty

    def cell(self, action: torch.Tensor) -> torch.Tensor:
        column = self.board.view(-1, self.rows, self.cols).gather(
            2, action.unsqueeze(1).expand(-1, self.rows, 1)
        )  # [E, rows, 1]
        filled = (column != 0).sum(1)  # [E, 1]: discs already in it, from the bottom
        row = (self.rows - 1 - filled).clamp(min=0)
        return row * self.cols + action
