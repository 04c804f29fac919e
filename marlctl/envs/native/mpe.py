"""The MPE world (Lowe et al. 2017; `mpe2._mpe_utils`) as batched torch tensors.

State lives in `[E, n_entities, 2]` tensors on one device; physics, action decoding,
rewards and observations are whole-batch tensor operations, with no Python loop over
envs or agents. A scenario subclass lays out its entities, samples start states and
defines observations and rewards; this module does everything the originals share
(`SimpleEnv` and `World` in mpe2), step for step in the same order of operations.

Auto-reset: when every env starts together and no scenario can end an episode early,
all envs reach `max_cycles` on the same step, which is known on the host; other steps do
no reset work at all. Otherwise, and in graph-safe mode (`make_graph_safe`: every step
the same kernels, for a captured CUDA graph), ended envs are reset with a masked select.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

from marlctl.envs.batch import Observation, Transition
from marlctl.envs.families import ENVS
from marlctl.envs.info import EnvInfo, GroupInfo, group_name
from marlctl.envs.native import RENDER_ONLY, UNSUPPORTED
from marlctl.envs.native.base import SeededBatch

DIM_P = 2
MOVE = 5  # no-op, left, right, down, up
MOVES = ((0.0, 0.0), (-1.0, 0.0), (1.0, 0.0), (0.0, -1.0), (0.0, 1.0))


@lru_cache
def _off_diagonal(n: int, device: torch.device) -> torch.Tensor:
    """Flat indices of (i, j), j != i, of an n × n grid, row by row."""
    flat = [i * n + j for i in range(n) for j in range(n) if i != j]
    return torch.tensor(flat, dtype=torch.long, device=device)


@dataclass
class Body:
    """One entity's constant properties (mpe2 `Entity` / `Agent`)."""

    name: str
    size: float = 0.05
    movable: bool = False
    collide: bool = True
    mass: float = 1.0
    max_speed: float | None = None
    accel: float | None = None  # action sensitivity; None = 5.0
    silent: bool = True


@dataclass
class Layout:
    """What a scenario builds: agents (in PettingZoo order) then landmarks."""

    agents: list[Body]
    landmarks: list[Body]
    dim_c: int = 0
    obs_dims: dict[str, int] = field(default_factory=dict)  # agent name -> observation size


class MPEWorld(SeededBatch):
    """Batched MPE env implementing `BatchedEnv`; subclasses define one scenario."""

    env_id = ""
    can_terminate = False  # whether `terminal()` may end an episode before max_cycles
    pure_steps = ("_physics", "observations", "rewards", "global_reward", "terminal")
    per_env_at_start = ("steps", "_active", "_no", "_all")
    dt, damping, contact_force, contact_margin = 0.1, 0.25, 1e2, 1e-3

    def __init__(
        self,
        params: dict[str, Any],
        num_envs: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        seeds: int = 1,
    ):
        """`num_envs` envs in all; with `seeds` > 1 they form that many equal blocks, each
        drawing its start states from its own generator (`reset` takes one seed per block)."""
        params = dict(params)
        self.max_cycles = int(params.pop("max_cycles", 25))
        self.continuous = bool(params.pop("continuous_actions", False))
        for key in RENDER_ONLY:
            params.pop(key, None)
        for key, reason in UNSUPPORTED.items():
            if params.pop(key, False):
                raise ValueError(f"{key}: {reason}")
        self.num_envs, self.device, self.dtype = num_envs, torch.device(device), dtype
        self.local_ratio: float | None = None
        layout = self.build(**params)
        self._setup(layout)
        self._seed_blocks(seeds)
        self.steps = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self._host_steps = 0
        self.graph_safe = False
        self._no = torch.zeros(num_envs, dtype=torch.bool, device=self.device)
        self._all = torch.ones(num_envs, dtype=torch.bool, device=self.device)
        self._note_constants()

    # ------------------------------------------------------------ scenario interface

    def build(self, **params: Any) -> Layout:
        """Read the scenario's parameters and lay out its entities."""
        raise NotImplementedError

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        """Start states for `n` envs: `pos` [n, entities, 2] plus scenario tensors."""
        raise NotImplementedError

    def observations(self) -> dict[str, torch.Tensor]:
        """Group name -> [E, n, obs_dim] for the current state."""
        raise NotImplementedError

    def rewards(self) -> torch.Tensor:
        """[E, n_agents] per-agent rewards (before `local_ratio` mixing)."""
        raise NotImplementedError

    def global_reward(self) -> torch.Tensor:
        """[E] shared reward mixed in with weight 1 - local_ratio."""
        raise NotImplementedError

    def terminal(self) -> torch.Tensor | None:
        """[E] bool episode solved, or None where the scenario never ends early."""
        return None

    # ------------------------------------------------------------ layout

    def _setup(self, layout: Layout) -> None:
        bodies = layout.agents + layout.landmarks
        self.layout, self.dim_c = layout, layout.dim_c
        self.n_agents, self.n_entities = len(layout.agents), len(bodies)

        def const(values, dtype=None) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype or self.dtype, device=self.device)

        self.size = const([b.size for b in bodies])
        self.movable = const([b.movable for b in bodies], torch.bool)
        self.mass = const([b.mass for b in bodies])
        inf = float("inf")
        self.max_speed = const([inf if b.max_speed is None else b.max_speed for b in bodies])
        collide = const([b.collide for b in bodies], torch.bool)
        self.sum_size = self.size[:, None] + self.size[None, :]
        # Contact forces only between colliding entities: the smallest index range holding
        # them all (agents and landmarks that collide usually sit together).
        colliding = [i for i, b in enumerate(bodies) if b.collide]
        self._colliders = None
        if len(colliding) >= 2:
            first, last = colliding[0], colliding[-1] + 1
            self._colliders = (first, last)
            span = collide[first:last]
            pair = span[:, None] & span[None, :]
            self._contact = pair & ~torch.eye(last - first, dtype=torch.bool, device=self.device)
            self._contact_size = self.sum_size[first:last, first:last]
        agents = layout.agents
        self.accel = const([5.0 if a.accel is None else a.accel for a in agents])
        self.moves = const(MOVES)
        self._setup_groups(layout)

    def _action_space(self, body: Body) -> tuple[bool, int]:
        """(discrete, size) of an agent's action space, as `SimpleEnv` builds it."""
        if body.movable:
            dim = MOVE
        else:
            dim = 0 if self.continuous else 1
        if not body.silent:
            dim = dim + self.dim_c if self.continuous else dim * self.dim_c
        return not self.continuous, dim

    def _setup_groups(self, layout: Layout) -> None:
        keys: dict[tuple, list[int]] = {}
        for index, agent in enumerate(layout.agents):
            key = (layout.obs_dims[agent.name], *self._action_space(agent))
            keys.setdefault(key, []).append(index)
        groups, self.group_index, self._group_flags = [], {}, {}
        taken: set[str] = set()
        for (obs_dim, discrete, n_actions), members in keys.items():
            names = [layout.agents[i].name for i in members]
            name = group_name(names)
            while name in taken:
                name += "_"
            taken.add(name)
            bounds = () if discrete else (0.0,) * n_actions
            high = () if discrete else (1.0,) * n_actions
            groups.append(
                GroupInfo(
                    name, tuple(names), (obs_dim,), "float32", discrete, n_actions, bounds, high
                )
            )
            self.group_index[name] = torch.tensor(members, device=self.device)
            flags = {(layout.agents[i].movable, layout.agents[i].silent) for i in members}
            if len(flags) != 1:
                raise ValueError(f"agents {names} share spaces but not movable/silent flags")
            self._group_flags[name] = flags.pop()
        entry = ENVS[self.env_id]  # the PettingZoo env this one steps as
        agents = tuple(a.name for a in layout.agents)
        state_dim = sum(layout.obs_dims.values())
        self.info = EnvInfo(entry.id, entry.factory, tuple(groups), state_dim, True, agents)
        # Columns of the group-ordered observation concatenation, in agent order.
        offsets, start = {}, 0
        for group in groups:
            for agent in group.agents:
                offsets[agent] = (start, layout.obs_dims[agent])
                start += layout.obs_dims[agent]
        columns = [c for a in agents for c in range(offsets[a][0], sum(offsets[a]))]
        self._state_columns = torch.tensor(columns, device=self.device)
        self._state_in_order = columns == list(range(state_dim))
        self._active = {
            g.name: torch.ones(self.num_envs, g.n_agents, dtype=torch.bool, device=self.device)
            for g in groups
        }
        self._masks = {g.name: None for g in groups}

    # ------------------------------------------------------------ BatchedEnv

    def reset(self, seed: int | Sequence[int]) -> Observation:
        self._seed(seed)
        self._assign(self.sample(self.num_envs))
        self.vel = torch.zeros(self.num_envs, self.n_entities, DIM_P, **self._like)
        self.comm = torch.zeros(self.num_envs, self.n_agents, self.dim_c, **self._like)
        self.steps.zero_()
        self._host_steps = 0
        return self._observe()

    def step(self, actions: dict[str, torch.Tensor]) -> Transition:
        u, c = self._decode(actions)
        self._physics(u)
        self.comm = c  # silent agents' utterances are zero already
        rewards = self.rewards()
        if self.local_ratio is not None:
            shared = self.global_reward().unsqueeze(-1)
            rewards = shared * (1 - self.local_ratio) + rewards * self.local_ratio
        final = self._observe()
        per_group = {g: rewards.index_select(1, idx) for g, idx in self.group_index.items()}
        if not (self.can_terminate or self.graph_safe):  # every env at one step, on the host
            self._host_steps += 1
            if self._host_steps < self.max_cycles:
                return Transition(final, per_group, self._no, self._no, final)
            self._restart(self._all)
            self._host_steps = 0
            return Transition(self._observe(), per_group, self._no, self._all, final)
        self.steps += 1
        truncated = self.steps >= self.max_cycles
        solved = self.terminal()
        terminated = torch.zeros_like(truncated) if solved is None else solved & ~truncated
        self._restart(truncated | terminated)
        return Transition(self._observe(), per_group, terminated, truncated, final)

    def close(self) -> None:
        pass

    def make_graph_safe(self) -> None:
        """Step with the same kernels every step and no host-side branch, so that steps can
        be captured in a CUDA graph: steps are counted on the device and every step restarts
        the envs that ended with a masked select (start states are drawn on every step, so
        the random stream differs from the eager one's)."""
        if not self.graph_safe:
            self.steps.fill_(self._host_steps)
            self.graph_safe = True

    # ------------------------------------------------------------ internals

    def _restart(self, ended: torch.Tensor) -> None:
        fresh = self.sample(self.num_envs)
        fresh["vel"] = torch.zeros_like(self.vel)
        fresh["comm"] = torch.zeros_like(self.comm)
        self._assign(fresh, ended)
        self.steps = torch.where(ended, torch.zeros_like(self.steps), self.steps)

    def _decode(self, actions: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Group actions -> physical force u [E, n_agents, 2] and utterance c [E, n, dim_c].

        As `SimpleEnv._set_action`: a discrete action of an agent that moves and talks is
        `move + 5 * word`; a continuous one is [no-op, -x, +x, -y, +y, *utterance] in [0, 1].
        """
        E, dim_c = self.num_envs, self.dim_c
        u = torch.zeros(E, self.n_agents, DIM_P, **self._like)
        c = torch.zeros(E, self.n_agents, dim_c, **self._like)
        for name, idx in self.group_index.items():
            a, (movable, silent) = actions[name], self._group_flags[name]
            if self.continuous:
                a = a.to(self.dtype).clamp(0.0, 1.0)
                if movable:
                    u[:, idx] = torch.stack([a[..., 2] - a[..., 1], a[..., 4] - a[..., 3]], -1)
                if not silent:
                    start = MOVE if movable else 0
                    c[:, idx] = a[..., start : start + dim_c]
            else:
                a = a.long()
                if movable:
                    u[:, idx] = self.moves[a % MOVE if not silent else a]
                if not silent:
                    word = a // MOVE if movable else a
                    c[:, idx] = torch.nn.functional.one_hot(word, dim_c).to(self.dtype)
        return u * self.accel[:, None], c

    def _physics(self, u: torch.Tensor) -> None:
        """`World.step`: action and contact forces, integrate, damp, cap speed."""
        force = torch.zeros_like(self.vel)
        force[:, : self.n_agents] = u
        if self._colliders is not None:
            first, last = self._colliders
            pos = self.pos[:, first:last]
            delta = pos[:, :, None, :] - pos[:, None, :, :]  # [E, c, c, 2]: a - b
            dist = torch.linalg.vector_norm(delta, dim=-1)
            k = self.contact_margin
            overlap = -(dist - self._contact_size) / k
            # `np.logaddexp(0, overlap) * k`, in float64 and rounded back: a float32
            # transcendental rounds differently in the vectorized loop than in its scalar
            # tail, which would make a row's step depend on where it sits in the batch.
            wide = overlap.double()
            penetration = torch.logaddexp(torch.zeros_like(wide), wide).to(dist.dtype) * k
            scale = self.contact_force * penetration / torch.where(self._contact, dist, 1.0)
            push = delta * (scale * self._contact)[..., None]
            force[:, first:last] += push.sum(2)
        movable = self.movable[None, :, None]
        pos = self.pos + self.vel * self.dt
        vel = self.vel * (1 - self.damping) + force / self.mass[None, :, None] * self.dt
        speed = torch.linalg.vector_norm(vel, dim=-1, keepdim=True)
        cap = self.max_speed[None, :, None]
        vel = torch.where(speed > cap, vel / speed * cap, vel)
        self.pos = torch.where(movable, pos, self.pos)
        self.vel = torch.where(movable, vel, self.vel)

    def _observe(self) -> Observation:
        obs = self.observations()
        flat = torch.cat([o.flatten(1) for o in obs.values()], dim=1)
        state = flat if self._state_in_order else flat.index_select(1, self._state_columns)
        return Observation(obs, state, self._masks, self._active)

    # ------------------------------------------------------------ observation helpers

    def agent_pos(self) -> torch.Tensor:
        return self.pos[:, : self.n_agents]

    def landmark_pos(self) -> torch.Tensor:
        return self.pos[:, self.n_agents :]

    @staticmethod
    def others(x: torch.Tensor) -> torch.Tensor:
        """x [E, n, n, ...] (row = observer) -> [E, n, n - 1, ...] without the diagonal.

        One index_select: a boolean mask would make CUDA sync with the host to count it."""
        E, n = x.shape[:2]
        picked = x.flatten(1, 2).index_select(1, _off_diagonal(n, x.device))
        return picked.view(E, n, n - 1, *x.shape[3:])

    @staticmethod
    def nearest(rel: torch.Tensor, count: int | None, *extra: torch.Tensor):
        """The `count` entities nearest first, zero-padded (mpe2 partial observability).

        rel: [E, n, m, 2] positions relative to each observer; extra: [E, n, m, d] values
        that travel with them (velocities, utterances). None keeps all, in their order.
        """
        if count is None:
            return (rel, *extra)
        order = rel.square().sum(-1).sqrt().argsort(dim=-1, stable=True)[..., :count]
        picked = []
        for value in (rel, *extra):
            index = order.unsqueeze(-1).expand(*order.shape, value.shape[-1])
            taken = value.gather(2, index)
            if count > value.shape[2]:
                pad = value.new_zeros(*taken.shape[:2], count - value.shape[2], value.shape[-1])
                taken = torch.cat([taken, pad], dim=2)
            picked.append(taken)
        return tuple(picked)

    # ------------------------------------------------------------ parity support

    def load_worlds(self, worlds: list[Any], steps: int = 0) -> None:
        """Copy the states of mpe2 `World`s (one per env) into this batch (parity tests)."""
        import numpy as np

        def stack(values) -> torch.Tensor:
            return torch.as_tensor(np.array(values), **self._like)

        entities = [w.agents + w.landmarks for w in worlds]
        self.pos = stack([[e.state.p_pos for e in ents] for ents in entities])
        self.vel = stack([[e.state.p_vel for e in ents] for ents in entities])
        self.comm = stack(
            [
                [np.asarray(a.state.c, dtype=float).reshape(self.dim_c) for a in w.agents]
                for w in worlds
            ]
        ).reshape(len(worlds), self.n_agents, self.dim_c)
        self.steps = torch.full((self.num_envs,), steps, dtype=torch.long, device=self.device)
        self._host_steps = steps
        self.load_extra(worlds)

    def load_extra(self, worlds: list[Any]) -> None:
        """Scenario state beyond positions, velocities and utterances (goals, keys)."""

    def observe_now(self) -> Observation:
        return self._observe()
