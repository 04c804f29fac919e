"""SMAX (Rutherford et al. 2024, JaxMARL): StarCraft-style unit micromanagement as batched
torch, `smax/<scenario>` under `env.backend: native`.

Two teams of units fight on a 32x32 map. The learners command the allies; the enemies follow
SMAX's scripted heuristic. A step is 8 world steps of 1/16 s: each unit moves (one of four
directions, or stops) or attacks a unit of the other team in range; an attack deals the
unit type's damage when its weapon has cooled down, then the weapon cools down again for the
type's cooldown plus a random deviation in [-1/16, 2/16) s (pysc2's randomness). Units that
overlap are pushed apart, units that touch the map's edge die. The allies' reward is the
enemy health lost (as a fraction of full health, over the number of enemies) plus 1 for a
won battle; the episode ends when a team is dead (terminated) or after `max_steps`
(truncated). `won` marks the episodes the allies won (`eval/win_rate`).

The rules, observations (`unit_list`), global state, action masks, start states and the
enemy heuristic are JaxMARL's SMAX (jaxmarl 0.2.0, `jaxmarl/environments/smax`), unit for
unit: a parity test holds the two to each other. Everything is batched over envs: a step
has no Python loop over envs or units (the 8 world steps are a loop of tensor operations).

Randomness: each world step draws one uniform number per unit (the weapon cooldown's
deviation) and the heuristic draws one per enemy (which visible unit to walk towards);
`uniform` draws them, from each seed block's generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from marlctl.envs.native.base import NativeEnv, group
from marlctl.envs.native.params import choice, flag, integer, number

# Unit types: marine, marauder, stalker, zealot, zergling, hydralisk.
TYPE_NAMES = ("marine", "marauder", "stalker", "zealot", "zergling", "hydralisk")
VELOCITY = (3.15, 2.25, 4.13, 3.15, 4.13, 3.15)
ATTACK = (9.0, 10.0, 13.0, 8.0, 5.0, 12.0)
ATTACK_RANGE = (5.0, 6.0, 6.0, 2.0, 2.0, 5.0)
SIGHT = (9.0, 10.0, 10.0, 9.0, 8.0, 9.0)
RADIUS = (0.375, 0.5625, 0.625, 0.5, 0.375, 0.625)
HEALTH = (45.0, 125.0, 160.0, 150.0, 35.0, 80.0)
COOLDOWN = (0.61, 1.07, 1.87, 0.86, 0.5, 0.59)
N_TYPES = len(TYPE_NAMES)
MOVES = 5  # four directions and stop; attack k is action MOVES + k
UNIT_FEATURES = 7 + N_TYPES  # health, dx, dy, last move x, y, last attack, cooldown, type
OWN_FEATURES = 4 + N_TYPES  # health, x, y, cooldown, type
# SMAX's default is 8; far more makes each step's random numbers (one per world step, unit
# and env) outgrow the memory before the step's time does.
MAX_WORLD_STEPS = 1_000


@dataclass(frozen=True)
class Scenario:
    units: tuple[int, ...]  # unit type of each ally, then each enemy
    allies: int
    enemies: int
    smacv2: bool  # SMACv2-style random start positions and unit types


def _mix(*parts: tuple[int, int]) -> tuple[int, ...]:
    return tuple(t for t, count in parts for _ in range(count))


# JaxMARL's MAP_NAME_TO_SCENARIO (type codes: 0 marine, 2 stalker, 3 zealot, 5 hydralisk).
SCENARIOS = {
    "3m": Scenario(_mix((0, 6)), 3, 3, False),
    "2s3z": Scenario(_mix((2, 2), (3, 3)) * 2, 5, 5, False),
    "25m": Scenario(_mix((0, 50)), 25, 25, False),
    "3s5z": Scenario(_mix((2, 3), (3, 5)) * 2, 8, 8, False),
    "8m": Scenario(_mix((0, 16)), 8, 8, False),
    "5m_vs_6m": Scenario(_mix((0, 11)), 5, 6, False),
    "10m_vs_11m": Scenario(_mix((0, 21)), 10, 11, False),
    "27m_vs_30m": Scenario(_mix((0, 57)), 27, 30, False),
    "3s5z_vs_3s6z": Scenario(_mix((2, 3), (3, 5), (2, 3), (3, 6)), 8, 9, False),
    "3s_vs_5z": Scenario(_mix((2, 3), (3, 5)), 3, 5, False),
    "6h_vs_8z": Scenario(_mix((5, 6), (3, 8)), 6, 8, False),
    "smacv2_5_units": Scenario(_mix((0, 10)), 5, 5, True),
    "smacv2_10_units": Scenario(_mix((0, 20)), 10, 10, True),
    "smacv2_20_units": Scenario(_mix((0, 40)), 20, 20, True),
}


def _movement_table() -> torch.Tensor:
    """Each discrete action's unit movement vector, computed as SMAX does in float32: a
    diagonal vector rotated by 45 degrees (so the values carry its rounding)."""
    s = torch.tensor(1.0, dtype=torch.float32) / torch.sqrt(torch.tensor(2.0))
    rotation = torch.stack([torch.stack([s, -s]), torch.stack([s, s])])
    rows = []
    for a in range(MOVES - 1):
        vec = torch.stack([(-1) ** (a // 2) * s, (-1) ** (a // 2 + a % 2) * s])
        rows.append(rotation @ vec)
    return torch.stack(rows + [torch.zeros(2)])  # stop (and every attack): no movement


class Smax(NativeEnv):
    env_id = "smax/3m"
    scenario = SCENARIOS["3m"]
    max_cycles = 100
    pure_steps = ("observe", "_transition")
    reports_wins = True

    def build(
        self,
        map_width: float = 32.0,
        map_height: float = 32.0,
        world_steps_per_env_step: int = 8,
        time_per_step: float = 1.0 / 16,
        won_battle_bonus: float = 1.0,
        walls_cause_death: bool = True,
        see_enemy_actions: bool = True,
        enemy_shoots: bool = True,
        attack_mode: str = "closest",
    ):
        """SMAX's keywords (`max_cycles` is its `max_steps`), and the enemy heuristic's:
        `enemy_shoots` and `attack_mode` (closest or random unit in range)."""
        self.random_attack = choice("attack_mode", attack_mode, ("closest", "random")) == "random"
        # A step draws `world_steps_per_env_step` random numbers per unit and env, at once.
        self.world_steps = integer(
            "world_steps_per_env_step", world_steps_per_env_step, 1, MAX_WORLD_STEPS
        )
        self.tps = number("time_per_step", time_per_step, above=0.0)
        self.width = number("map_width", map_width, above=8.0)
        self.height = number("map_height", map_height, above=8.0)
        # Positions are float32: a move no larger than their spacing at the map's far edge
        # is lost to rounding, and units stand still.
        slowest = min(VELOCITY) * self.tps
        if max(self.width, self.height) * 2.0**-23 >= slowest:
            name = "map_width" if self.width >= self.height else "map_height"
            size = max(self.width, self.height)
            if size <= 32.0:  # no larger than SMAX's own map: the time step is too small
                name, size = "time_per_step", self.tps
            raise ValueError(
                f"{name} {size:g}: the slowest unit moves {slowest:g} per world step, which "
                f"float32 positions on a {self.width:g} x {self.height:g} map lose to rounding"
            )
        self.bonus = number("won_battle_bonus", won_battle_bonus)
        self.walls_kill = flag("walls_cause_death", walls_cause_death)
        self.see_enemy_actions = flag("see_enemy_actions", see_enemy_actions)
        self.enemy_shoots = flag("enemy_shoots", enemy_shoots)
        sc = self.scenario
        self.A, self.E_units, self.N = sc.allies, sc.enemies, sc.allies + sc.enemies
        like = self._like
        for name, values in (("velocity", VELOCITY), ("attack", ATTACK),
                             ("attack_range", ATTACK_RANGE), ("sight", SIGHT),
                             ("radius", RADIUS), ("health_max", HEALTH),
                             ("cooldown_max", COOLDOWN)):  # fmt: skip
            setattr(self, f"type_{name}", torch.tensor(values, **like))
        self.units = torch.tensor(sc.units, device=self.device)
        self.team = torch.arange(self.N, device=self.device) >= self.A  # True: enemy
        self.moves = _movement_table().to(**like)
        self.map_size = torch.tensor([self.width, self.height], **like)
        W, H = self.width, self.height
        # Constants of start states and the heuristic, made once: a step (and the start
        # states it draws for auto-reset) copies nothing from the host.
        self.team_centres = torch.tensor(
            [[W / 4, H / 2]] * self.A + [[W / 4 * 3, H / 2]] * self.E_units, **like
        )
        self.corners = torch.tensor([[0.0, 0.0], [0.0, H], [W, 0.0], [W, H]], **like)
        self.half_map = torch.tensor([W / 2, H], **like)
        self.right_half = torch.tensor([W / 2, 0.0], **like)
        self.directions = torch.tensor([[0, 1], [1, 0], [0, -1], [-1, 0]], **like)
        # Unit j as unit i lists it: allies see the other allies then the enemies in index
        # order; enemies see the other enemies then the allies, both in reverse.
        self.seen = torch.tensor([self._order(i) for i in range(self.N)], device=self.device)
        # What `_push_apart` adds to pairwise distances: 1 on the diagonal, and SMAX's 1e-6.
        self._self_distance = torch.eye(self.N, **like) + 1e-6
        self.obs_dim = UNIT_FEATURES * (self.N - 1) + OWN_FEATURES
        # The env computes its own action masks (JaxMARL's `get_avail_actions`).
        allies = replace(
            group("ally", self.A, self.obs_dim, self.E_units + MOVES), mask_source="env"
        )
        return [allies], (OWN_FEATURES + 2) * self.N

    def _order(self, i: int) -> list[int]:
        others = [j for j in range(self.N) if j != i]
        return others if i < self.A else others[::-1]

    # ------------------------------------------------------------ randomness

    def uniform(self, n: int, *shape: int, low: float = 0.0, high: float = 1.0):
        """Uniform [low, high) numbers `[n, *shape]` (n = num_envs) from each seed block's
        generator: every random draw of the env goes through here."""
        return self.rand(n, *shape, low=low, high=high)

    # ------------------------------------------------------------ start states

    def start(self, n: int) -> dict[str, torch.Tensor]:
        A, En, N = self.A, self.E_units, self.N
        like = self._like
        if self.scenario.smacv2:
            pos = self._smacv2_positions(n)
            ally_types = (self.uniform(n, A) * N_TYPES).long().clamp(max=N_TYPES - 1)
            enemy_types = torch.zeros(n, En, dtype=torch.long, device=self.device)
            k = min(A, En)  # SMAX copies the allies' types; further enemies are marines
            enemy_types[:, :k] = ally_types[:, :k]
            types = torch.cat([ally_types, enemy_types], 1)
        else:
            noise = self.uniform(n, N, 2, low=-2.0, high=2.0)
            pos = self.team_centres + noise
            types = self.units.expand(n, N)
        zeros = torch.zeros(n, N, **like)
        state = {
            "pos": pos,
            "types": types,
            "health": self.type_health_max[types],
            "alive": torch.ones(n, N, dtype=torch.bool, device=self.device),
            "cooldown": zeros,
            "prev_move": torch.zeros(n, N, 2, **like),
            "prev_attack": torch.zeros(n, N, dtype=torch.long, device=self.device),
            # The heuristic's memory, per enemy: where it heads, whom it attacked last.
            "target": torch.zeros(n, En, 2, **like),
            "last_attacked": torch.full((n, En), -1, dtype=torch.long, device=self.device),
        }
        state["pos"] = self._push_apart(state["pos"], state["alive"], types)
        return state

    def _smacv2_positions(self, n: int) -> torch.Tensor:
        """SMACv2's start positions: half the episodes one team surrounds the other (from
        up to four groups towards the corners), half the teams face each other mirrored."""
        A, En, W = self.A, self.E_units, self.width
        centre = self.map_size / 2

        def surround(inside: int, outside: int) -> tuple[torch.Tensor, torch.Tensor]:
            middle = centre + self.uniform(n, inside, 2, low=-2.0, high=2.0)
            corner = (self.uniform(n, outside) * 4).long().clamp(max=3)
            t = self.uniform(n, 4, 1)
            groups = t * centre + (1 - t) * self.corners  # [n, 4, 2]
            around = groups.gather(1, corner.unsqueeze(-1).expand(-1, -1, 2))
            return middle, around + self.uniform(n, outside, 2, low=-2.0, high=2.0)

        ally_in, enemy_out = surround(A, En)
        enemy_in, ally_out = surround(En, A)
        allies_inside = (self.uniform(n) < 0.5).view(n, 1, 1)
        surrounded = torch.where(
            allies_inside, torch.cat([ally_in, enemy_out], 1), torch.cat([ally_out, enemy_in], 1)
        )
        allies = self.uniform(n, A, 2) * self.half_map
        mirrored = torch.stack([W - allies[..., 0], allies[..., 1]], -1)
        extra = max(En - A, 0)
        enemies = mirrored[:, :En]
        if extra:
            more = self.uniform(n, extra, 2) * self.half_map + self.right_half
            enemies = torch.cat([enemies, more], 1)
        reflected = torch.cat([allies, enemies], 1)
        use_surround = (self.uniform(n) < 0.5).view(n, 1, 1)
        return torch.where(use_surround, surrounded, reflected)

    # ------------------------------------------------------------ physics

    def _push_apart(self, pos: torch.Tensor, alive: torch.Tensor, types: torch.Tensor):
        """Overlapping live units move apart by half their overlap (SMAX's collisions).
        The pairwise `[E, N, N]` planes are built per coordinate (x and y), not as
        `[E, N, N, 2]`, and updated in place: on large scenarios this is the world step's
        main memory traffic."""
        # [E, j, i]: unit i's offset from unit j, so the sum over the other units j runs
        # along a leading dim, as the sum over `[E, N, N, 2]`'s dim 2 did (along the last
        # dim torch associates the terms otherwise).
        x, y = pos[..., 0], pos[..., 1]
        dx = x.unsqueeze(1) - x.unsqueeze(2)  # [E, N, N]
        dy = y.unsqueeze(1) - y.unsqueeze(2)
        # |delta| + 1 on the diagonal + 1e-6, as SMAX: (norm + eye) + 1e-6 == norm + (eye + 1e-6)
        dist = (dx * dx).add_(dy * dy).sqrt_().add_(self._self_distance)
        radius = self.type_radius[types]
        overlap = (radius.unsqueeze(2) + radius.unsqueeze(1)).div_(dist).sub_(1.0).relu_()
        overlap.masked_fill_(~(alive.unsqueeze(2) & alive.unsqueeze(1)), 0.0)
        push = torch.stack([dx.mul_(overlap).sum(1), dy.mul_(overlap).sum(1)], -1)
        return torch.where(alive.unsqueeze(-1), pos + push / 2, pos)

    def _decode(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Discrete actions `[E, N]` -> movement vectors `[E, N, 2]` and attack actions (the
        action where it attacks, else 0)."""
        move = self.moves[actions.clamp(max=MOVES - 1)]
        return move, torch.where(actions > MOVES - 1, actions, 0)

    def _world_step(self, move: torch.Tensor, attack: torch.Tensor, deviation: torch.Tensor):
        """One world step of every unit: move, attack, die at walls, push apart."""
        pos, types, alive = self.pos, self.types, self.alive
        idx = torch.arange(self.N, device=self.device).expand_as(attack)
        # Where each unit moves (dead units stay), within the map.
        speed = (self.type_velocity[types] * self.tps).unsqueeze(-1)
        new_pos = torch.minimum(pos + move * speed, self.map_size).clamp(min=0.0)
        new_pos = torch.where(alive.unsqueeze(-1), new_pos, pos)
        # Whom each unit attacks (itself when it moves), from the positions before moving.
        k = attack - MOVES
        target = torch.where(~self.team, k + self.A, self.A - 1 - k)
        target = torch.where(attack < MOVES, idx, target)
        target_pos = pos.gather(1, target.unsqueeze(-1).expand(-1, -1, 2))
        reach = self.type_attack_range[types]
        in_range = torch.linalg.vector_norm(pos - target_pos, dim=-1) < reach
        valid = in_range & alive & alive.gather(1, target) & (target != idx)
        valid = valid & (self.cooldown <= 0.0)
        damage = torch.where(valid, -self.type_attack[types], 0.0)
        health = self.health.scatter_add(1, target, damage).clamp(min=0.0)
        reload = self.type_cooldown_max[types] + deviation
        cooldown = self.cooldown + torch.where(valid, reload - self.cooldown, -self.tps)
        if self.walls_kill:
            touching = (new_pos <= 0.0).any(-1) | (new_pos >= self.map_size).any(-1)
            health = torch.where(touching, 0.0, health)
        alive = health > 0
        self.health, self.cooldown, self.alive = health, cooldown, alive
        self.pos = self._push_apart(new_pos, alive, types)

    # ------------------------------------------------------------ observations

    def _unit_features(self, viewers: slice) -> torch.Tensor:
        """Every unit as the units `viewers` see it, in each viewer's order:
        `[E, V, N - 1, UNIT_FEATURES]`, zeros where not visible. Only the relative position
        depends on the viewer: the rest is one row per unit, gathered into each view."""
        pos, types, alive = self.pos, self.types, self.alive
        seen = self.seen[viewers]  # [V, N - 1]: indexing with it lists each viewer's units
        max_action = torch.where(
            self.team, float(self.A + MOVES - 1), float(self.E_units + MOVES - 1)
        )
        cooldown = (self.cooldown / self.type_cooldown_max[types]).clamp(0.0, 1.0)
        one_hot = torch.nn.functional.one_hot(types, N_TYPES).to(self.dtype)
        units = torch.cat(
            [(self.health / self.type_health_max[types]).unsqueeze(-1), self.prev_move,
             (self.prev_attack.to(self.dtype) / max_action).unsqueeze(-1),
             cooldown.unsqueeze(-1), one_hot], -1,
        )[:, seen]  # fmt: skip
        if not self.see_enemy_actions:  # the other team's last actions are hidden
            same = (self.team[seen] == self.team[viewers].unsqueeze(-1)).unsqueeze(-1)
            units[..., 1:4] = torch.where(same, units[..., 1:4], 0.0)
        viewer_sight = self.type_sight[types[:, viewers]].unsqueeze(-1)  # [E, V, 1]
        rel = pos[:, seen] - pos[:, viewers].unsqueeze(2)
        visible = torch.linalg.vector_norm(rel, dim=-1) < viewer_sight
        visible = visible & alive[:, viewers].unsqueeze(-1) & alive[:, seen]
        rel = rel / viewer_sight.unsqueeze(-1)
        features = torch.cat([units[..., :1], rel, units[..., 1:]], -1)
        return torch.where(visible.unsqueeze(-1), features, 0.0)

    def _enemy_view(self) -> dict[str, torch.Tensor]:
        """What the heuristic reads of each enemy's observation, computed as the observation
        computes it: the allies (in the enemy's order) relative to it, scaled by its sight
        and back, which of them it sees, and its own type and position (zeros when dead)."""
        A = self.A
        pos, types, alive = self.pos, self.types, self.alive
        allies = self.seen[A:, self.E_units - 1 :]  # [En, A]: the allies, reversed
        own_alive = alive[:, A:]
        sight = self.type_sight[types[:, A:]].unsqueeze(-1)  # [E, En, 1]
        rel = pos[:, allies] - pos[:, A:].unsqueeze(2)  # [E, En, A, 2]
        visible = torch.linalg.vector_norm(rel, dim=-1) < sight
        visible = visible & own_alive.unsqueeze(-1) & alive[:, allies]
        observed = torch.where(visible.unsqueeze(-1), rel / sight.unsqueeze(-1), 0.0)
        unit_type = torch.where(own_alive, types[:, A:], 0)
        own = torch.where(own_alive.unsqueeze(-1), pos[:, A:] / self.map_size, 0.0)
        return {
            "rel": observed * self.type_sight[unit_type].view(*unit_type.shape, 1, 1),
            "visible": visible,
            "unit_type": unit_type,
            "own_pos": own * self.map_size,
        }

    def _own_features(self, normalised: bool) -> torch.Tensor:
        types = self.types
        health = self.health / self.type_health_max[types]
        if normalised:  # what a unit observes of itself
            pos = self.pos / self.map_size
            cooldown = (self.cooldown / self.type_cooldown_max[types]).clamp(0.0, 1.0)
        else:  # the global state
            pos, cooldown = self.pos, self.cooldown
        one_hot = torch.nn.functional.one_hot(types, N_TYPES).to(self.dtype)
        own = torch.cat([health.unsqueeze(-1), pos, cooldown.unsqueeze(-1), one_hot], -1)
        return torch.where(self.alive.unsqueeze(-1), own, 0.0)

    def _ally_obs(self) -> torch.Tensor:
        """The allies' `unit_list` observations `[E, A, obs_dim]`."""
        others = self._unit_features(slice(0, self.A)).flatten(2)
        return torch.cat([others, self._own_features(True)[:, : self.A]], -1)

    def _state(self) -> torch.Tensor:
        E = self.pos.shape[0]
        teams = self.team.to(self.dtype).expand(E, self.N)
        return torch.cat(
            [self._own_features(False).flatten(1), teams, self.types.to(self.dtype)], -1
        )

    def _ally_masks(self) -> torch.Tensor:
        """Allies' allowed actions: moving while alive, stopping always, attacking a live
        enemy in range."""
        A = self.A
        pos, alive = self.pos[:, :A], self.alive[:, :A]
        enemy_pos = self.pos[:, A:]
        dist = torch.linalg.vector_norm(pos.unsqueeze(2) - enemy_pos.unsqueeze(1), dim=-1)
        in_range = dist < self.type_attack_range[self.types[:, :A]].unsqueeze(-1)
        shoot = in_range & self.alive[:, A:].unsqueeze(1) & alive.unsqueeze(-1)
        moves = alive.unsqueeze(-1).expand(-1, -1, MOVES - 1)
        stop = torch.ones_like(alive).unsqueeze(-1)
        return torch.cat([moves, stop, shoot], -1)

    def observe(self):
        # The allies' observations are returned; what the enemies observe is what the
        # heuristic acts on in the next `advance` (a step ends with this state observed, so
        # the part of it the heuristic reads is kept).
        self._enemy_obs = self._enemy_view()
        return {"ally": self._ally_obs()}, self._state(), {"ally": self._ally_masks()}

    # ------------------------------------------------------------ the enemy heuristic

    def _heuristic(
        self, view: dict[str, torch.Tensor], u: torch.Tensor, u_attack: torch.Tensor | None
    ) -> torch.Tensor:
        """SMAX's scripted enemies (`create_heuristic_policy(team=1)`): attack the closest
        ally in range (or one at random, `attack_mode: random`), keeping the last target
        while it stays in range; otherwise walk towards a random visible ally, or to the
        point opposite the start through the map's centre. `view` is what the enemies
        observe (`_enemy_view`), `u` `[E, n]` uniform numbers (and `u_attack` for a random
        attack); returns actions `[E, n]`."""
        rel, visible, unit_type = view["rel"], view["visible"], view["unit_type"]
        own_pos = view["own_pos"]
        dist = torch.linalg.vector_norm(rel, dim=-1)
        shootable = (dist < self.type_attack_range[unit_type].unsqueeze(-1)) & visible
        can_shoot = shootable.any(-1)
        far = math.hypot(self.width, self.height)
        closest = torch.where(shootable, dist, far).argmin(-1)
        if u_attack is not None:
            closest = _choice(shootable.to(self.dtype), u_attack)
        last = self.last_attacked
        keep = (last >= 0) & shootable.gather(-1, last.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        attacked = torch.where(keep, last, closest)
        self.last_attacked = torch.where(
            shootable.gather(-1, attacked.unsqueeze(-1)).squeeze(-1), attacked, -1
        )
        attack_action = attacked + MOVES
        # Where to walk: a random visible ally, else the reflection of the start position.
        pick = _choice(visible.to(self.dtype), u)
        towards = rel.gather(-2, pick.view(*pick.shape, 1, 1).expand(-1, -1, 1, 2)).squeeze(-2)
        centre = self.map_size / 2
        initial = (self.target == 0).all(-1) & (last == -1)
        reflected = -(own_pos - centre) + centre
        self.target = torch.where(initial.unsqueeze(-1), reflected, self.target)
        goal = torch.where(visible.any(-1, keepdim=True), towards + own_pos, self.target)
        to_goal = goal - own_pos
        move_action = (to_goal @ self.directions.T).argmax(-1)
        shoot = can_shoot & self.enemy_shoots
        return torch.where(shoot, attack_action, move_action)

    # ------------------------------------------------------------ a step

    def advance(self, actions: dict[str, torch.Tensor]):
        """Draw the step's random numbers (per seed block), then `_transition`: the step
        itself is random-free, so `compile` fuses it."""
        E, En = self.pos.shape[0], self.E_units
        u = self.uniform(E, En)
        u_attack = self.uniform(E, En) if self.random_attack else None
        deviations = self.uniform(E, self.world_steps, self.N, low=-self.tps, high=2 * self.tps)
        return self._transition(actions["ally"], u, u_attack, deviations)

    def _transition(
        self,
        ally_actions: torch.Tensor,
        u: torch.Tensor,
        u_attack: torch.Tensor | None,
        deviations: torch.Tensor,
    ):
        """One env step from its random numbers: the enemies' heuristic actions, the world
        steps, the rewards."""
        E, A = self.pos.shape[0], self.A
        # The enemies' view, observed at the end of the last reset or step.
        enemy = self._heuristic(self._enemy_obs, u, u_attack)
        joint = torch.cat([ally_actions.long(), enemy], 1)
        move, attack = self._decode(joint)
        before = self.health
        for w in range(self.world_steps):
            self._world_step(move, attack, deviations[:, w])
        self.prev_move, self.prev_attack = move, attack
        lost = (self.health - before) / self.type_health_max[self.types]
        damage = lost[:, A:].sum(-1).abs() / self.E_units
        allies_dead = ~self.alive[:, :A].any(-1)
        enemies_dead = ~self.alive[:, A:].any(-1)
        won = enemies_dead & ~allies_dead
        self.won = won
        reward = damage + self.bonus * won.to(self.dtype)
        return {"ally": reward.unsqueeze(-1).expand(E, A)}, allies_dead | enemies_dead


def _choice(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """An index drawn with probabilities proportional to `weights` `[..., k]`, from uniform
    numbers `u` `[...]`, as `jax.random.choice` draws it: p = weights / their sum, and the
    first index whose cumulative p reaches its total times (1 - u); 0 if every weight is 0."""
    cumulative = (weights / weights.sum(-1, keepdim=True)).cumsum(-1)
    r = cumulative[..., -1:] * (1 - u.unsqueeze(-1))
    return (cumulative < r).sum(-1).clamp(max=weights.shape[-1] - 1)


# One class per scenario (`smax/3m` is `Smax_3m`), as the registry names native envs.
for _name, _scenario in SCENARIOS.items():
    _cls = type(
        f"Smax_{_name}",
        (Smax,),
        {"env_id": f"smax/{_name}", "scenario": _scenario, "__module__": __name__},
    )
    globals()[_cls.__name__] = _cls
