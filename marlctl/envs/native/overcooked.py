"""Overcooked (Carroll et al. 2019, as JaxMARL's `overcooked` env) as batched torch:
`overcooked/<layout>` under `env.backend: native`, for the five layouts of the paper.

Two cooks share a kitchen on a grid. Each step each one moves up, down, right or left (turning
to face that way, and stepping there unless a counter is in the way), stays, or interacts with
the counter it faces: takes an onion or a plate from a pile, picks up or puts down an item on
a bare counter, puts an onion into a pot, serves a cooked soup from the pot onto a plate, or
delivers a plated soup at the serving counter. A pot cooks once it holds three onions (20
steps). Cooks that would step onto the same cell, or swap cells, both stay; cook 0 interacts
before cook 1, which acts on what cook 0 left. A delivered soup pays both cooks 20 (the sparse
reward); the shaped reward pays the cook that puts an onion in a pot 3, serves a soup 5, or
picks up a plate that a started pot needs while no plate lies on a counter 3. A cook's reward
is `sparse + shaped_reward_scale * shaped`; after each step `sparse_reward` `[E]` and
`shaped_reward` `[E, 2]` hold the two parts (JaxMARL's reward and `info["shaped_reward"]`).
An episode is truncated after `max_cycles` steps (JaxMARL's `max_steps`, 400).

Each cook observes the whole grid as JaxMARL's 26 layers `[H, W, 26]`, float32 (a pot's
cooking time and onion count stay counts, as JaxMARL's networks read them, where uint8 frames
would be scaled by 1/255): its own position, the other cook's, their directions (its own
first), then 16 layers both see alike: pots, bare counters, onion and plate piles, serving
counters, onions in pots and in soups, cooking time, ready soups, loose plates and onions (a
cook's cell shows what it holds) and, in the last 40 steps, urgency. The global state is cook
0's observation. A start state puts the cooks on the layout's cells facing random directions;
`random_reset` draws two distinct free cells, each pot's state and what each cook holds, as
JaxMARL does.

The rules, observations and rewards are JaxMARL's (jaxmarl 0.2.0,
`jaxmarl/environments/overcooked`): a parity test steps both from the same states with the
same actions. A step has no Python loop over envs: the state is a few `[E, H * W]` maps.

JaxMARL's IPPO anneals the shaped reward from 1 to 0 over `REW_SHAPING_HORIZON` env steps:
`train.schedule: {env.shaped_reward_scale: {linear: [[0, 1.0], [HORIZON, 0.0]]}}` does the
same to the training env, while evaluation plays `env.params` (0 for JaxMARL's sparse return).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from marlctl.envs.native.base import NativeEnv, group
from marlctl.envs.native.params import flag, number

# JaxMARL's object codes (`OBJECT_TO_INDEX`); a bare counter is a wall.
EMPTY, WALL, ONION, ONION_PILE, PLATE, PLATE_PILE, GOAL, POT, DISH = 1, 2, 3, 4, 5, 6, 7, 8, 9
SYMBOLS = {" ": EMPTY, "0": EMPTY, "1": EMPTY, "W": WALL, "O": ONION_PILE, "B": PLATE_PILE,
           "X": GOAL, "P": POT}  # fmt: skip
# A pot's status counts down: 23 empty, 22 and 21 one and two onions, 20 full (cooking starts),
# 0 ready.
POT_EMPTY, POT_FULL = 23, 20
DELIVERY_REWARD = 20.0
ONION_IN_POT, SOUP_SERVED, PLATE_PICKED = 3.0, 5.0, 3.0  # JaxMARL's BASE_REW_SHAPING_PARAMS
URGENCY = 40  # steps left when the urgency layer turns on
MOVES, ACTIONS = 4, 6  # up, down, right, left; then stay and interact
INTERACT = 5
CHANNELS = 26
DIRECTIONS = ((0, -1), (0, 1), (1, 0), (-1, 0))  # (x, y) steps of up, down, right, left
HELD_AT_RANDOM = (EMPTY, ONION, PLATE, DISH)
# What a cell shows, as a row block of the observation table: object code x pot status x
# urgency.
SHOWN = (DISH + 1) * (POT_EMPTY + 1) * 2

# JaxMARL's `overcooked_layouts`: W counter, O onion pile, B plate pile, X serving counter,
# P pot, 0 and 1 the cooks' start cells.
GRIDS = {
    "cramped_room": ("WWPWW", "O0 1O", "W   W", "WBWXW"),
    "asymm_advantages": (
        "WWWWWWWWW",
        "O WXWOW X",
        "W   P   W",
        "W 0 P1  W",
        "WWWBWBWWW",
    ),  # fmt: skip
    "coord_ring": ("WWWPW", "W 0 P", "B1W W", "O   W", "WOXWW"),
    "forced_coord": ("WWWPW", "O W1P", "O0W W", "B W W", "WWWXW"),
    "counter_circuit": ("WWWPPWWW", "W 0    W", "B WWWW X", "W     1W", "WWWOOWWW"),
}


@dataclass(frozen=True)
class Layout:
    height: int
    width: int
    cells: tuple[int, ...]  # each cell's object, row by row, the cooks left out
    starts: tuple[int, int]  # the cooks' start cells

    @classmethod
    def parse(cls, rows: tuple[str, ...]) -> Layout:
        text = "".join(rows)
        starts = (text.index("0"), text.index("1"))
        return cls(len(rows), len(rows[0]), tuple(SYMBOLS[c] for c in text), starts)


LAYOUTS = {name: Layout.parse(rows) for name, rows in GRIDS.items()}


class Overcooked(NativeEnv):
    env_id = "overcooked/cramped_room"
    layout = LAYOUTS["cramped_room"]
    max_cycles = 400
    # A step draws no random numbers: both fuse whole.
    pure_steps = ("observe", "advance")
    schedulable = ("shaped_reward_scale",)

    def build(self, random_reset: bool = False, shaped_reward_scale: float = 1.0):
        """JaxMARL's keywords (`max_cycles` is its `max_steps`), and the weight of the shaped
        reward in each cook's reward."""
        self.random_reset = flag("random_reset", random_reset)
        lay, dev = self.layout, self.device
        scale = number("shaped_reward_scale", shaped_reward_scale)
        self.shaped_scale = torch.tensor(scale, device=dev)
        self.height, self.width = lay.height, lay.width
        self.start_cells = torch.tensor(lay.cells, device=dev)
        # Every cell but the floor is a counter of some kind: no cook steps on it, and it is
        # what a cook interacts with.
        self.solid = self.start_cells != EMPTY
        self.pot_map = self.start_cells == POT
        self.pot_cells = self.pot_map.nonzero().flatten()
        self.start_agents = torch.tensor(lay.starts, device=dev)
        self.steps_xy = torch.tensor(DIRECTIONS, device=dev)
        self.corner = torch.tensor([lay.width - 1, lay.height - 1], device=dev)
        self.held_at_random = torch.tensor(HELD_AT_RANDOM, device=dev)
        # Comparisons with it make one-hots (`one_hot` checks its input on the host).
        self.cell_index = torch.arange(lay.height * lay.width, device=dev)
        self.obs_table = _obs_table().to(device=dev, dtype=self.dtype)
        size = lay.height * lay.width * CHANNELS
        cooks = replace(
            group("agent", 2, size, ACTIONS), obs_shape=(lay.height, lay.width, CHANNELS)
        )
        return [cooks], size

    def set_param(self, name: str, value: float) -> None:
        if name != "shaped_reward_scale":
            super().set_param(name, value)
        self.shaped_scale.fill_(value)

    # ------------------------------------------------------------ start states

    def start(self, n: int) -> dict[str, torch.Tensor]:
        cells = self.start_cells.expand(n, -1)
        pots = torch.where(self.pot_map, POT_EMPTY, 0).expand(n, -1)
        agents = self.start_agents.expand(n, 2)
        held = torch.full((n, 2), EMPTY, dtype=torch.long, device=self.device)
        facing = self.randint(len(DIRECTIONS), n, 2)
        if self.random_reset:
            # Two distinct free cells, each ordered pair as likely (JaxMARL's choice without
            # replacement, uniform over the floor): the first two of a random order.
            u = self.rand(n, cells.shape[1], low=0.0, high=1.0).masked_fill(self.solid, 2.0)
            agents = u.argsort(-1)[:, :2]
            pots = torch.zeros(n, cells.shape[1], dtype=torch.long, device=self.device)
            pots[:, self.pot_cells] = self.randint(POT_EMPTY + 1, n, len(self.pot_cells))
            held = self.held_at_random[self.randint(len(HELD_AT_RANDOM), n, 2)]
        return {
            "cells": cells,  # each cell's object; floor cells stay EMPTY under the cooks
            "pots": pots,  # each pot cell's status, 0 on every other cell
            "agent_cell": agents,  # [n, 2] row-major cell index
            "agent_dir": facing,  # [n, 2] index into DIRECTIONS
            "held": held,  # [n, 2] object code, EMPTY for empty hands
        }

    # ------------------------------------------------------------ a step

    def advance(self, actions: dict[str, torch.Tensor]):
        act = actions["agent"].long()
        cell, facing = self.agent_cell, self.agent_dir
        moving = act < MOVES
        ahead = self._next_cell(cell, act.clamp(max=MOVES - 1))
        target = torch.where(moving & ~self.solid[ahead], ahead, cell)
        # Cooks that would share a cell or pass through each other both stay.
        collide = target[:, 0] == target[:, 1]
        swap = (target[:, 0] == cell[:, 1]) & (target[:, 1] == cell[:, 0])
        blocked = (collide | swap).unsqueeze(-1)
        # Interactions face the cell in front from where the cook stood: it did not move.
        front = self._next_cell(cell, facing)
        cells, pots, held = self.cells, self.pots, self.held
        delivered, shaped = [], []
        for i in range(2):  # cook 0 first, then cook 1 on what it left, as JaxMARL
            cells, pots, held, paid, bonus = self._interact(
                cells, pots, held, i, front[:, i], act[:, i] == INTERACT
            )
            delivered.append(paid)
            shaped.append(bonus)
        cooking = (pots > 0) & (pots <= POT_FULL)
        self.pots = torch.where(cooking, pots - 1, pots)
        self.cells, self.held = cells, held
        self.agent_cell = torch.where(blocked, cell, target)
        self.agent_dir = torch.where(moving, act, facing)
        self.sparse_reward = delivered[0] + delivered[1]
        self.shaped_reward = torch.stack(shaped, -1)
        reward = self.sparse_reward.unsqueeze(-1) + self.shaped_scale * self.shaped_reward
        return {"agent": reward}, None

    def _next_cell(self, cell: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        """The cell one step from `cell` towards `direction`, within the grid."""
        xy = torch.stack([cell % self.width, cell // self.width], -1) + self.steps_xy[direction]
        xy = torch.minimum(xy.clamp(min=0), self.corner)
        return xy[..., 1] * self.width + xy[..., 0]

    def _interact(
        self,
        cells: torch.Tensor,
        pots: torch.Tensor,
        held: torch.Tensor,
        i: int,
        front: torch.Tensor,
        acting: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """Cook `i` interacts with cell `front` `[E]` where `acting`: JaxMARL's
        `process_interact`. The maps and hands after it, the sparse reward it earns `[E]` and
        its shaped reward `[E]`."""
        at = front.unsqueeze(-1)
        thing = cells.gather(1, at).squeeze(-1)
        status = pots.gather(1, at).squeeze(-1)
        hands = held[:, i]
        empty_hands = hands == EMPTY
        is_pot = thing == POT
        counter = self.solid[front] & ~is_pot
        bare = thing == WALL
        pile = (thing == ONION_PILE) | (thing == PLATE_PILE)
        loose = (thing == ONION) | (thing == PLATE) | (thing == DISH)
        fill = is_pot & (status > POT_FULL) & (hands == ONION)
        serve = is_pot & (status == 0) & (hands == PLATE)
        pick = counter & empty_hands & (pile | loose)
        drop = counter & bare & ~empty_hands
        deliver = counter & (thing == GOAL) & (hands == DISH)
        taken = torch.where(loose, thing, torch.where(thing == PLATE_PILE, PLATE, ONION))
        new_hands = torch.where(pick, taken, torch.where(serve, DISH, hands))
        new_hands = torch.where(fill | drop | deliver, EMPTY, new_hands)
        new_thing = torch.where(drop, hands, torch.where(pick & loose, WALL, thing))
        new_status = torch.where(fill, status - 1, torch.where(serve, POT_EMPTY, status))
        # A plate counts when a pot that has started needs one more than the cooks hold, and
        # none lies on a counter (counted before this cook's move).
        plates_held = (held == PLATE).sum(-1)
        started = ((pots != POT_EMPTY) & self.pot_map).sum(-1)
        no_loose_plate = ~(cells == PLATE).any(-1)
        useful_plate = pick & (new_hands == PLATE) & no_loose_plate & (plates_held < started)
        shaped = (
            ONION_IN_POT * fill.to(self.dtype)
            + SOUP_SERVED * serve.to(self.dtype)
            + PLATE_PICKED * useful_plate.to(self.dtype)
        )
        cells = cells.scatter(1, at, torch.where(acting, new_thing, thing).unsqueeze(-1))
        pots = pots.scatter(1, at, torch.where(acting, new_status, status).unsqueeze(-1))
        hands = torch.where(acting, new_hands, hands)
        held = torch.stack([hands, held[:, 1]] if i == 0 else [held[:, 0], hands], -1)
        paid = (deliver & acting).to(self.dtype) * DELIVERY_REWARD
        return cells, pots, held, paid, torch.where(acting, shaped, 0.0)

    # ------------------------------------------------------------ observations

    def observe(self):
        """Each cell's 26 layers are a row of `obs_table`, picked by what the cell shows (its
        object code, its pot's status, the urgency) and by the cooks on it: one gather."""
        E, H, W = self.cells.shape[0], self.height, self.width
        on = self.agent_cell.unsqueeze(-1) == self.cell_index  # [E, 2, HW]
        # Where a cook stands, the grid shows what it holds.
        in_hand = (on * self.held.unsqueeze(-1)).sum(1)
        shown = torch.where(on.any(1), in_hand, self.cells)
        urgent = (self.max_cycles - self.steps < URGENCY).long().unsqueeze(-1)
        cell = (shown * (POT_EMPTY + 1) + self.pots) * 2 + urgent  # [E, HW]
        who = on * (1 + self.agent_dir).unsqueeze(-1)  # 0: no cook; 1 + its direction
        views = torch.stack([who[:, 0] * 5 + who[:, 1], who[:, 1] * 5 + who[:, 0]], 1)
        index = views * SHOWN + cell.unsqueeze(1)  # [E, 2, HW]: each cook's view
        obs = self.obs_table.index_select(0, index.flatten()).view(E, 2, H, W, CHANNELS)
        return {"agent": obs}, obs[:, 0].flatten(1), {"agent": None}


def _obs_table() -> torch.Tensor:
    """JaxMARL's 26 layers of a cell `[25 * SHOWN, 26]`, by (the viewing cook, the other:
    5 x 5, each absent or there facing one of 4 ways) x (the object code the cell shows, its
    pot's status, whether the episode is in its last `URGENCY` steps: `SHOWN`)."""
    code = torch.arange(DISH + 1).view(-1, 1, 1)
    status = torch.arange(POT_EMPTY + 1).view(1, -1, 1)
    urgent = torch.arange(2).view(1, 1, -1)
    pot, soup, none = code == POT, code == DISH, torch.tensor(0)
    layers = [
        pot, code == WALL, code == ONION_PILE, none, code == PLATE_PILE, code == GOAL,
        (POT_EMPTY - status).clamp(max=3) * (status >= POT_FULL), none,
        3 * ((pot & (status < POT_FULL)) | soup), none, status * (status < POT_FULL),
        (pot & (status == 0)) | soup, code == PLATE, code == ONION, none, urgent,
    ]  # fmt: skip
    shape = (DISH + 1, POT_EMPTY + 1, 2)
    shared = torch.stack([layer.expand(shape).float() for layer in layers], -1).view(-1, 16)
    cooks = torch.zeros(5, 5, 10)
    for own in range(5):
        for other in range(5):
            cooks[own, other, 0], cooks[own, other, 1] = own > 0, other > 0
            if own:
                cooks[own, other, 1 + own] = 1.0  # its heading: layers 2 to 5
            if other:
                cooks[own, other, 5 + other] = 1.0  # the other's: layers 6 to 9
    cooks = cooks.view(25, 1, 10).expand(-1, SHOWN, -1)
    return torch.cat([cooks, shared.expand(25, -1, -1)], -1).reshape(-1, CHANNELS)


# One class per layout (`overcooked/cramped_room` is `Overcooked_cramped_room`), as the
# registry names native envs.
for _name, _layout in LAYOUTS.items():
    _cls = type(
        f"Overcooked_{_name}",
        (Overcooked,),
        {"env_id": f"overcooked/{_name}", "layout": _layout, "__module__": __name__},
    )
    globals()[_cls.__name__] = _cls
