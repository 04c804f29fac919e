"""The base of native envs: batched torch envs on one device, seeded per seed block.

`SeededBatch` holds what every native env shares: `num_envs` envs split into equal blocks,
one per seed trained in the batch, each block drawing from its own generator. `NativeEnv`
adds the rest of `BatchedEnv` for an env that declares its own agents, spaces and groups
(no PettingZoo original needed): step counting, time limits, auto-reset and the final
observation of ended episodes. A subclass writes only its rules:

- `build(**params)`: read the env's parameters; return its groups and state size;
- `start(n)`: start states of `n` envs, as a dict of tensors (they become attributes);
- `observe()`: observations per group, the global state, and action masks;
- `advance(actions)`: apply one step's actions; rewards per group and terminations.

`marlctl.envs.native.matrix` is a complete example.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from marlctl.envs.batch import Observation, Transition
from marlctl.envs.info import EnvInfo, GroupInfo
from marlctl.envs.native.params import integer
from marlctl.envs.signature import FactoryParams, method_params


class SeededBatch:
    """`num_envs` envs in `seeds` equal blocks, each with its own random stream."""

    num_envs: int
    device: torch.device
    dtype: torch.dtype
    generators: list[torch.Generator]
    # The methods of a step that draw no random numbers, compiled by `compile`.
    pure_steps: tuple[str, ...] = ()
    # Tensors made with the env that hold one row per env; any other made then is one of
    # the env's constants (sizes, tables), which `keep_blocks` leaves whole.
    per_env_at_start: tuple[str, ...] = ("steps", "_active")
    # State kept per seed block rather than per env, which `_keep_block_state` cuts.
    block_state: tuple[str, ...] = ()
    _constants: frozenset[str] = frozenset()

    def compile(self) -> None:
        """torch.compile the step's methods that draw no random numbers (`pure_steps`), so
        that their many small tensor operations run as a few fused kernels; start states
        stay eager, each seed block drawing from its own generator. Where both `advance` and
        `observe` are pure, a step runs them as one compiled call: a small batch's step is
        mostly the calls' own cost."""
        eager = {name: getattr(self, name) for name in self.pure_steps}
        for name, method in eager.items():
            setattr(self, name, torch.compile(method, dynamic=False))
        if {"advance", "observe"} <= eager.keys():
            advance, observe = eager["advance"], eager["observe"]

            def advance_and_observe(actions: dict[str, torch.Tensor]):
                return self._advance(actions, advance, observe)

            # The instance's own, over the class's eager method.
            self.advance_and_observe = torch.compile(advance_and_observe, dynamic=False)

    def _note_constants(self) -> None:
        """The end of construction: what the env holds now, but `per_env_at_start`, is
        constant."""
        self._constants = frozenset(vars(self)) - set(self.per_env_at_start)

    def keep_blocks(self, keep: list[int]) -> None:
        """Only seed blocks `keep` (in that order) go on, each with its envs' states, step
        counts and random stream (the ended rows of a batch leave it,
        `marlctl.train.compact`); a block steps on exactly as it would have."""
        blocks = len(self.generators)
        rows = self.num_envs // blocks
        index = (torch.tensor(keep).unsqueeze(1) * rows + torch.arange(rows)).flatten()
        index = index.to(self.device)

        def per_env(value: Any) -> bool:
            return torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == self.num_envs

        skip = self._constants | set(self.block_state)
        for name, value in list(vars(self).items()):
            if name in skip:
                continue
            if per_env(value):
                setattr(self, name, value.index_select(0, index.to(value.device)))
            elif isinstance(value, dict) and any(per_env(v) for v in value.values()):
                cut = {k: v.index_select(0, index) if per_env(v) else v for k, v in value.items()}
                setattr(self, name, cut)
        self._keep_block_state(keep, rows)
        self.generators = [self.generators[b] for b in keep]
        self.num_envs = rows * len(keep)

    def _keep_block_state(self, keep: list[int], rows: int) -> None:
        """Cut the `block_state` of blocks `keep` (`rows` envs each)."""

    def _seed_blocks(self, seeds: int) -> None:
        if self.num_envs % seeds:
            raise ValueError(f"num_envs={self.num_envs} does not split into {seeds} seed blocks")
        self.generators = [torch.Generator(device=self.device) for _ in range(seeds)]

    def _seed(self, seed: int | Sequence[int]) -> None:
        seeds = [seed] if isinstance(seed, int) else list(seed)
        if len(seeds) != len(self.generators):
            raise ValueError(f"reset needs {len(self.generators)} seed(s), got {len(seeds)}")
        for generator, value in zip(self.generators, seeds, strict=True):
            generator.manual_seed(int(value))

    @property
    def _like(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "device": self.device}

    def rand(self, *shape: int, low: float = -1.0, high: float = 1.0) -> torch.Tensor:
        """Uniform [low, high) (`np_random.uniform`); shape[0] runs over all envs."""
        return self._draw(torch.rand, shape, self._like) * (high - low) + low

    def randint(self, high: int, *shape: int) -> torch.Tensor:
        """Uniform integers in [0, high) (`np_random.integers`); shape[0] runs over all envs."""
        return self._draw(partial(torch.randint, high), shape, {"device": self.device})

    def _draw(self, fn, shape: tuple[int, ...], like: dict[str, Any]) -> torch.Tensor:
        """Each seed block's rows from its own generator."""
        if len(self.generators) == 1:
            return fn(shape, generator=self.generators[0], **like)
        rows = shape[0] // len(self.generators)
        return torch.cat([fn((rows, *shape[1:]), generator=g, **like) for g in self.generators])

    def _assign(self, state: dict[str, torch.Tensor], where: torch.Tensor | None = None) -> None:
        """Set each state tensor as an attribute, only in the env rows `where` if given."""
        for key, value in state.items():
            if where is None:
                setattr(self, key, value)
            else:
                old = getattr(self, key)
                mask = where.view(-1, *([1] * (old.dim() - 1)))
                setattr(self, key, torch.where(mask, value, old))


def group(
    name: str,
    n_agents: int,
    obs_dim: int,
    n_actions: int,
    *,
    discrete: bool = True,
    low: float = -1.0,
    high: float = 1.0,
) -> GroupInfo:
    """A group of `n_agents` agents named `name_0`, `name_1`, ... with one observation vector
    each and `n_actions` discrete actions (or a continuous action box of that size)."""
    bounds = ((), ()) if discrete else ((low,) * n_actions, (high,) * n_actions)
    agents = tuple(f"{name}_{i}" for i in range(n_agents))
    return GroupInfo(name, agents, (obs_dim,), "float32", discrete, n_actions, *bounds)


class NativeEnv(SeededBatch):
    """A native env with its own agents and spaces (see the module docstring)."""

    env_id = ""
    max_cycles = 25  # default episode length; `env.params.max_cycles` overrides it
    # True for an env whose `advance` sets `self.won` `[E]` bool (the learners won the
    # episodes that end now): `train/win_rate` and `eval/win_rate` are logged.
    reports_wins = False
    # True for a game of turns: one agent acts per step, the others are inactive (an env
    # that sets its observations' `active` itself; `EnvInfo.turn_based`).
    turn_based = False
    # Methods `compile` fuses: none by default. A step of a few operations (the matrix
    # games') runs slower compiled; list `observe`/`advance` where they hold many.
    pure_steps: tuple[str, ...] = ()
    # The params `set_param` changes while the env runs (`train.schedule`'s `env.PARAM`).
    schedulable: tuple[str, ...] = ()
    # Start states drawn ahead, per env row, on the CPU (see `_restart`).
    ahead = 4
    block_state = ("_ahead", "_taken")
    # The global state's shape where the original's `state_space` has more than one
    # dimension (pursuit's map); `observe` gives it flat all the same.
    state_shape: tuple[int, ...] = ()

    def __init__(
        self,
        params: dict[str, Any],
        num_envs: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        seeds: int = 1,
    ):
        params = dict(params)
        self.max_cycles = integer("max_cycles", params.pop("max_cycles", self.max_cycles), 1)
        self.num_envs, self.device, self.dtype = num_envs, torch.device(device), dtype
        self._seed_blocks(seeds)
        groups, state_dim = self.build(**params)
        agents = tuple(a for g in groups for a in g.agents)
        factory = f"{type(self).__module__}:{type(self).__qualname__}"
        self.info = EnvInfo(
            self.env_id, factory, tuple(groups), state_dim, True, agents, self.turn_based,
            schedulable=self.schedulable, state_shape=self.state_shape,
        )  # fmt: skip
        self.steps = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        # Drawing ahead asks the host how many envs ended; on a GPU every step draws instead.
        self.graph_safe = self.device.type != "cpu"
        self._active = {
            g.name: torch.ones(num_envs, g.n_agents, dtype=torch.bool, device=self.device)
            for g in groups
        }
        self._note_constants()

    @classmethod
    def parameters(cls) -> FactoryParams:
        """The env's parameters: `max_cycles` and the keywords of `build` (followed through
        `**params` it hands on, as `MatrixGame.build` does to `payoff`)."""
        own = method_params(cls, "build")
        return FactoryParams({"max_cycles": cls.max_cycles, **own.defaults}, own.open)

    # ------------------------------------------------------------ the env's rules

    def build(self, **params: Any) -> tuple[list[GroupInfo], int]:
        """The env's groups (`group(...)` makes one) and the size of its global state."""
        raise NotImplementedError

    def start(self, n: int) -> dict[str, torch.Tensor]:
        """Start states of `n` envs; each tensor's first dim runs over envs. `n` is
        `num_envs` at a reset, or a seed block's states drawn ahead (`_restart`) from its
        generator alone: they may depend on `n` and the params, not on the current state."""
        raise NotImplementedError

    def observe(
        self,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor | None]]:
        """Per group `[E, n, obs_dim]`, the global state `[E, state_dim]`, and per group an
        action mask `[E, n, n_actions]` (True = allowed) or None."""
        raise NotImplementedError

    def advance(
        self, actions: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """Apply one step's actions (per group `[E, n]`, or `[E, n, A]` if continuous);
        rewards per group `[E, n]`, and `[E]` bool where the episode ended for good (None if
        it never ends before `max_cycles`)."""
        raise NotImplementedError

    def set_param(self, name: str, value: float) -> None:
        """Param `name` (one of `schedulable`) at `value` from the next step on: an env that
        names params keeps each in a tensor it changes in place, which a captured iteration
        reads at every replay."""
        raise ValueError(f"{self.env_id} lets no schedule change '{name}'")

    # ------------------------------------------------------------ BatchedEnv

    def reset(self, seed: int | Sequence[int]) -> Observation:
        self._seed(seed)
        # Contiguous as restarts leave them (a start state may be an expanded view), so
        # that a compiled step's guards on the states' strides hold from the first step.
        self._assign({k: v.contiguous() for k, v in self.start(self.num_envs).items()})
        # None drawn ahead yet: a block draws its first when one of its episodes ends.
        self._ahead: dict[str, torch.Tensor] = {}
        self._taken = torch.full((len(self.generators),), self.num_envs * self.ahead)
        self.steps.zero_()
        return self._observation()

    def step(self, actions: dict[str, torch.Tensor]) -> Transition:
        rewards, terminated, truncated, seen = self.advance_and_observe(actions)
        final = self._observation(seen)
        won = self.won if self.reports_wins else None  # set by `advance`
        done = terminated | truncated
        if self.graph_safe:
            self._assign(self.start(self.num_envs), done)
        elif not self._restart(done):  # no env ended: the next observation is the final one
            return Transition(final, rewards, terminated, truncated, final, won=won)
        self.steps = torch.where(done, torch.zeros_like(self.steps), self.steps)
        return Transition(self._observation(), rewards, terminated, truncated, final, won=won)

    def advance_and_observe(self, actions: dict[str, torch.Tensor]):
        """One step's rewards, the envs that ended by termination and by time, and the
        observation after it (`compile` makes this one compiled call where it can)."""
        return self._advance(actions, self.advance, self.observe)

    def _advance(self, actions: dict[str, torch.Tensor], advance, observe):
        rewards, terminated = advance(actions)
        self.steps += 1
        if terminated is None:
            terminated = torch.zeros_like(self.steps, dtype=torch.bool)
        truncated = (self.steps >= self.max_cycles) & ~terminated
        return rewards, terminated, truncated, observe()

    def close(self) -> None:
        pass

    def make_graph_safe(self) -> None:
        """Step with the same kernels every step and no host-side branch, so that steps can
        be captured in a CUDA graph: every step draws start states for all envs and keeps
        those of the envs that ended (the random stream differs from the CPU's eager one)."""
        self.graph_safe = True

    def _restart(self, done: torch.Tensor) -> bool:
        """Start the envs that ended from start states drawn ahead: each seed block keeps
        `ahead` states per env row, taken in row order and drawn anew (from the block's own
        generator) when they run out. One `start` call serves many steps' resets, where
        drawing `num_envs` fresh states each step is most of a small env's step; and a
        block's stream depends only on its own episodes, so a seed in a batch still steps
        exactly as it does alone. False where no env ended."""
        blocks = len(self.generators)
        rows = self.num_envs // blocks
        ended = done.view(blocks, rows)
        counts = ended.sum(1)
        if not bool(counts.any()):
            return False
        size = self.ahead * rows
        empty = (counts > 0) & (self._taken + counts > size)
        for block in empty.nonzero().flatten().tolist():
            drawn = self._draw_block(block, size)
            if not self._ahead:
                self._ahead = {
                    k: v.new_empty((blocks * size, *v.shape[1:])) for k, v in drawn.items()
                }
            for key, value in drawn.items():
                self._ahead[key][block * size : (block + 1) * size] = value
            self._taken[block] = 0
        # An ended row r of block b takes state `taken[b] + (ended rows of b before r)`; the
        # others pick any state in their block, which `_assign` leaves unused.
        order = ended.long().cumsum(1) - 1 + self._taken.unsqueeze(1)
        pick = (order.clamp(0, size - 1) + torch.arange(blocks).unsqueeze(1) * size).flatten()
        self._assign({k: v[pick] for k, v in self._ahead.items()}, done)
        self._taken += counts
        return True

    def _keep_block_state(self, keep: list[int], rows: int) -> None:
        if not hasattr(self, "_taken"):
            return  # not reset yet
        size = self.ahead * rows
        if self._ahead:
            index = (torch.tensor(keep).unsqueeze(1) * size + torch.arange(size)).flatten()
            index = index.to(self.device)
            self._ahead = {k: v.index_select(0, index) for k, v in self._ahead.items()}
        self._taken = self._taken[keep]

    def _draw_block(self, block: int, n: int) -> dict[str, torch.Tensor]:
        """`start(n)` drawn from seed block `block`'s generator alone."""
        generators = self.generators
        self.generators = [generators[block]]
        try:
            return self.start(n)
        finally:
            self.generators = generators

    def observe_now(self) -> Observation:
        return self._observation()

    def _observation(self, seen: tuple | None = None) -> Observation:
        """The observation `observe` makes now, or `seen`, one it made already."""
        obs, state, masks = self.observe() if seen is None else seen
        masks = {g.name: masks.get(g.name) for g in self.info.groups}
        return Observation(obs, state, masks, self._active)


def describe_native(cls: type[NativeEnv], params: dict[str, Any]) -> EnvInfo:
    """Build one env of `cls` on the CPU, reset it and step it once with allowed actions;
    its `info`. Params that only fail once the env runs fail here, at validation."""
    env = cls(params, 1, "cpu")
    ob = env.reset(0)
    actions = {}
    for g in env.info.groups:
        mask = ob.masks[g.name]
        if not g.discrete:
            low = torch.tensor(g.action_low).clamp(min=-1.0)
            high = torch.tensor(g.action_high).clamp(max=1.0)
            actions[g.name] = ((low + high) / 2).expand(1, g.n_agents, g.n_actions)
        elif mask is None:
            actions[g.name] = torch.zeros(1, g.n_agents, dtype=torch.long)
        else:
            actions[g.name] = mask.to(torch.int8).argmax(-1)
    env.step(actions)
    env.close()
    return env.info
