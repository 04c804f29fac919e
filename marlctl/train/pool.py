"""Self-play and population training: past snapshots of a learning group's policy play the
group in a share of the episodes (the spec's `groups.NAME.pool`).

The run copies its policies into a snapshot when training starts and every `every` env
steps after; a group's pool keeps the last `size`. As an episode starts in an env row, a
snapshot plays it with probability `share`: the newest (`latest`), any kept one
(`uniform`), or one drawn with weight (1 - x)^power, x being the learners' win rate against
it (`prioritised`: prioritised fictitious self-play, Vinyals et al. 2019, "Grandmaster level
in StarCraft II", f_hard). A snapshot plays every agent of the group (`seats: all`: the other
groups learn against a population instead of one co-learner, as MADDPG's policy ensembles
do) or one of them, drawn per episode (`seats: one`: self-play in a symmetric game whose
one group holds every seat, the learner playing the others). The agents a snapshot plays
are inactive for the learners in that episode: their actions are replaced and they leave
every loss, so a group learns only from the episodes it plays itself.

A pool may also include other runs' policies for the group (`include`: a league, as PSRO's
and AlphaStar's populations): they sit in slots after the snapshots', are drawn like them
and are never evicted or updated; each acts on every row, as a frozen group does.

Who won an episode against a snapshot: with `seats: one`, the learner's seats or the
snapshot's, by their mean return in it; with `seats: all`, the snapshot's return for the
group against what the learner returns for it (a running mean over its own episodes). A
tie is half a win. Win rates are running means over each snapshot's recent games.

A group's snapshots act as one batch: a shadow trainer holds them as extra seeds (`size`
times the run's seeds). On the CPU each snapshot acts on the rows it plays alone, padded to
the most rows any snapshot plays (the host reads that number once a step, and rounds it up
to a power of two), so a step costs about one forward pass over the rows whatever the
pool's size. On a GPU, and for a policy with memory (recurrent, or MADDPG's ensemble member
per episode, which must carry its state from step to step), every snapshot acts on every
row instead: a step's cost grows with the pool's size, and nothing in it waits for the host.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from marlctl.envs.batch import Observation, Transition, Wrapper
from marlctl.envs.info import EnvInfo
from marlctl.spec.models import PoolSpec, Spec

WIN_RATE_STEP = 0.02  # weight of one new game in a snapshot's running win rate
BASELINE_STEP = 0.01  # weight of one new episode in the learner's running group return


def tile(ob: Observation, times: int) -> Observation:
    """`ob` repeated `times` over its env rows (row r of copy k at k * rows + r)."""
    rows = ob.state.shape[0]
    return take_rows(ob, torch.arange(rows, device=ob.state.device).repeat(times))


def take_rows(ob: Observation, index: torch.Tensor) -> Observation:
    """The env rows `index` of `ob`, in that order."""

    def take(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x[index]

    return Observation(
        {k: take(v) for k, v in ob.obs.items()},
        take(ob.state),
        {k: take(v) for k, v in ob.masks.items()},
        {k: take(v) for k, v in ob.active.items()},
    )


def _stacked(state: dict) -> dict[str, torch.Tensor]:
    """The per-seed tensors of a policies state dict (leading dim = seeds)."""
    return {k: v for k, v in state.items() if torch.is_tensor(v) and v.dim()}


class Pool:
    """One group's snapshots, which of them plays each env row's episode, and how the
    learners fare against each."""

    def __init__(
        self,
        name: str,
        cfg: PoolSpec,
        n_agents: int,
        shadow,
        seeds: int,
        rows: int,
        generator: torch.Generator,
        members: list | None = None,
    ):
        self.name, self.cfg, self.shadow = name, cfg, shadow
        self.members = members or []  # the included runs' players, slots K, K + 1, ...
        self.K, self.S, self.rows, self.n = cfg.size, seeds, rows, n_agents
        self.T = self.K + len(self.members)
        self.device = shadow.device
        dev = self.device
        self.generator = generator
        self.filled, self.newest = 0, -1
        self.taken: list[int] = []  # env step of each slot's snapshot
        self.next_snapshot = 0
        self.slot = torch.full((rows,), -1, dtype=torch.long, device=dev)  # -1 = the learner
        self.seat = torch.zeros(rows, dtype=torch.long, device=dev)  # seats: one
        self.win = torch.full((seeds, self.T), 0.5, device=dev)  # learners' win rate
        self.games = torch.zeros(seeds, self.T, device=dev)
        self.returns = torch.zeros(rows, n_agents, device=dev)  # running episode returns
        self.baseline = torch.zeros(seeds, device=dev)  # the learner's group return
        self.baseline_seen = torch.zeros(seeds, dtype=torch.bool, device=dev)
        self._agents = torch.arange(n_agents, device=dev)
        self._row_seed = torch.arange(rows, device=dev) // (rows // seeds)  # seed-major rows
        self._row = torch.arange(rows, device=dev)

    # ------------------------------------------------------------ snapshots

    @torch.no_grad()
    def snapshot(self, live: nn.Module, env_steps: int) -> None:
        """The live policies into the next slot (over the oldest once the pool is full)."""
        k = (self.newest + 1) % self.K
        mine = _stacked(self.shadow.policies.state_dict())
        for key, value in _stacked(live.state_dict()).items():
            mine[key].view(self.K, self.S, *value.shape[1:])[k].copy_(value)
        self.newest, self.filled = k, min(self.K, self.filled + 1)
        if k < len(self.taken):
            self.taken[k] = env_steps
        else:
            self.taken.append(env_steps)
        self.win[:, k] = 0.5
        self.games[:, k] = 0.0
        self.next_snapshot = (env_steps // self.cfg.every + 1) * self.cfg.every

    # ------------------------------------------------------------ who plays

    def played(self) -> torch.Tensor:
        """`[rows, n]` bool: the agents a snapshot plays in each row's current episode."""
        pooled = (self.slot >= 0).unsqueeze(-1)
        if self.cfg.seats == "all":
            return pooled.expand(-1, self.n)
        return pooled & (self._agents == self.seat.unsqueeze(-1))

    def kept(self) -> torch.Tensor:
        """`[T]` bool: the slots that hold a policy (the snapshots taken, every included)."""
        slots = torch.arange(self.T, device=self.device)
        return (slots < self.filled) | (slots >= self.K)

    def weights(self) -> torch.Tensor:
        """`[S, T]`: how likely each slot is drawn, per seed (unnormalised)."""
        kept = self.kept().float().expand(self.S, -1)
        if self.cfg.sample == "latest":
            latest = torch.zeros_like(kept)
            latest[:, self.K :] = 1.0
            if self.filled:
                latest[:, self.newest] = 1.0
            return latest
        if self.cfg.sample == "uniform":
            return kept
        hardness = (1.0 - self.win).clamp_min(0.0).pow(self.cfg.power)
        return kept * (hardness + 1e-6)  # never all zero: every kept snapshot stays possible

    def draw(self, starting: torch.Tensor) -> None:
        """Who plays the episodes that start now in the rows `starting` `[rows]`."""
        if self.filled == 0 and not self.members:
            return
        g, rows = self.generator, self.rows
        pooled = torch.rand(rows, generator=g, device=self.device) < self.cfg.share
        per_row = self.weights().repeat_interleave(rows // self.S, 0)
        k = torch.multinomial(per_row, 1, generator=g).squeeze(-1)
        self.slot = torch.where(starting, torch.where(pooled, k, -1), self.slot)
        seat = torch.randint(self.n, (rows,), generator=g, device=self.device)
        self.seat = torch.where(starting, seat, self.seat)

    @torch.no_grad()
    def actions(self, ob: Observation, first: torch.Tensor | None, own: torch.Tensor):
        """The group's actions: the learner's `own`, the snapshots' where they play."""
        if self.shadow.stateless_acting and self.device.type == "cpu":
            chosen = self.played_rows(ob, False)
        else:
            chosen = self.every_slot(ob, first, False)
        chosen = chosen.to(own.dtype)
        shape = (self.rows, *([1] * (own.dim() - 1)))
        for k, member in enumerate(self.members, self.K):
            theirs = member.act(ob, first, False).to(own.dtype)
            chosen = torch.where((self.slot == k).view(shape), theirs, chosen)
        use = self.played().view(self.rows, self.n, *([1] * (own.dim() - 2)))
        return torch.where(use, chosen, own)

    def every_slot(self, ob: Observation, first: torch.Tensor | None, deterministic: bool):
        """Each row's snapshot actions `[rows, n, ...]`, from every snapshot acting on every
        row: what a policy with memory (recurrent, or an ensemble member per episode) needs
        to carry its state from step to step, and no host sync."""
        out = self.shadow.act(
            tile(ob, self.K), deterministic, None if first is None else first.repeat(self.K)
        )[self.name]
        out = out.view(self.K, self.rows, *out.shape[1:])
        index = self.slot.clamp(0, self.K - 1).view(1, self.rows, *([1] * (out.dim() - 2)))
        return out.gather(0, index.expand(1, *out.shape[1:]))[0]

    def played_rows(self, ob: Observation, deterministic: bool) -> torch.Tensor:
        """Each row's snapshot actions `[rows, n, ...]` (where a snapshot plays; the rest
        arbitrary), from each snapshot acting on its own rows alone: the shadow's seed
        (slot k, seed s) sees the rows of seed s that slot k plays, padded to the most any
        snapshot plays (rounded up to a power of two), so a step costs about one forward
        pass however large the pool."""
        S, K, rows = self.S, self.K, self.rows
        # The shadow's seed of each row a snapshot plays; K * S for the other rows.
        snapshot = (self.slot >= 0) & (self.slot < K)
        key = torch.where(snapshot, self.slot * S + self._row_seed, K * S)
        count = torch.bincount(key, minlength=K * S + 1)
        # The host sets the batch's shape: a power of two, so that a compiled shadow meets a
        # few shapes only.
        most = int(count[: K * S].max())
        width = min(1 << max(0, most - 1).bit_length(), rows // S)
        order = key.argsort(stable=True)
        ordered = key[order]
        start = count.cumsum(0) - count
        place = ordered * width + self._row - start[ordered]
        ours = ordered < K * S
        table = torch.zeros(K * S * width, dtype=torch.long, device=self.device)
        table[place[ours]] = order[ours]  # padding repeats row 0; its actions are dropped
        out = self.shadow.act(take_rows(ob, table), deterministic, None)[self.name]
        at = torch.zeros(rows, dtype=torch.long, device=self.device)
        at[order[ours]] = place[ours]
        return out[at]

    # ------------------------------------------------------------ outcomes

    def record(self, rewards: torch.Tensor, done: torch.Tensor) -> None:
        """Rewards `[rows, n]` of a step; the games against snapshots that ended `done`."""
        self.returns += rewards
        S, T = self.S, self.T
        played = self.played().float()
        if self.cfg.seats == "one":
            theirs = (self.returns * played).sum(-1)
            mine = (self.returns * (1.0 - played)).sum(-1) / (self.n - 1)
        else:
            theirs = self.returns.mean(-1)
            own = (done & (self.slot < 0)).float().view(S, -1)
            count = own.sum(-1)
            mean = (theirs.view(S, -1) * own).sum(-1) / count.clamp_min(1.0)
            step = torch.where(self.baseline_seen, (BASELINE_STEP * count).clamp_max(1.0), 1.0)
            step = torch.where(count > 0, step, 0.0)
            self.baseline += step * (mean - self.baseline)
            self.baseline_seen |= count > 0
            mine = self.baseline.repeat_interleave(self.rows // S)
        tie = (mine - theirs).abs() <= 1e-6 * torch.maximum(mine.abs(), theirs.abs()).clamp_min(1)
        outcome = torch.where(tie, 0.5, (mine > theirs).float())
        ended = (done & (self.slot >= 0)).float()
        games = nn.functional.one_hot(self.slot.clamp_min(0), T).float() * ended.unsqueeze(-1)
        count = games.view(S, -1, T).sum(1)
        wins = (games * outcome.unsqueeze(-1)).view(S, -1, T).sum(1)
        step = (WIN_RATE_STEP * count).clamp_max(1.0)
        self.win += step * (wins / count.clamp_min(1.0) - self.win)
        self.games += count
        self.returns *= (~done).unsqueeze(-1)

    def metrics(self) -> list[dict[str, float]]:
        """Per seed: the learners' mean win rate over the pool's policies, and their count."""
        kept = self.kept()
        size = int(kept.sum())
        if size == 0:
            return [{} for _ in range(self.S)]
        rates = self.win[:, kept].mean(-1).tolist()
        return [
            {f"pool/win_rate/{self.name}": r, f"pool/size/{self.name}": float(size)} for r in rates
        ]

    # ------------------------------------------------------------ checkpoints

    def seed_state(self, index: int) -> dict:
        K, S = self.K, self.S
        snapshots = {
            k: v.view(K, S, *v.shape[1:])[:, index].clone()
            for k, v in _stacked(self.shadow.policies.state_dict()).items()
        }
        return {
            "snapshots": snapshots,
            "filled": self.filled,
            "newest": self.newest,
            "taken": list(self.taken),
            "next_snapshot": self.next_snapshot,
            "win": self.win[index].clone(),
            "games": self.games[index].clone(),
            "baseline": self.baseline[index].clone(),
            "baseline_seen": self.baseline_seen[index].clone(),
            "generator": self.generator.get_state(),
        }

    @torch.no_grad()
    def load_seed_states(self, states: list[dict]) -> None:
        first = states[0]
        mine = _stacked(self.shadow.policies.state_dict())
        for index, state in enumerate(states):
            for key, value in state["snapshots"].items():
                mine[key].view(self.K, self.S, *mine[key].shape[1:])[:, index].copy_(value)
            self.win[index] = state["win"].to(self.device)
            self.games[index] = state["games"].to(self.device)
            self.baseline[index] = state["baseline"].to(self.device)
            self.baseline_seen[index] = state["baseline_seen"].to(self.device)
        self.filled, self.newest = int(first["filled"]), int(first["newest"])
        self.taken = [int(t) for t in first["taken"]]
        self.next_snapshot = int(first["next_snapshot"])
        self.generator.set_state(first["generator"])


class WithPool(Wrapper):
    """`env` with some groups played by snapshots from their pools in some episodes: the
    learners see those agents inactive there."""

    graph_blocker = "groups played by a pool of snapshots step eagerly"

    def __init__(self, env, pools: list[Pool]):
        super().__init__(env)
        self.pools = pools
        self.info: EnvInfo = env.info
        self._ob: Observation | None = None
        self._first: torch.Tensor | None = None

    def snapshot_due(self, live: nn.Module, env_steps: int) -> None:
        """Snapshots of the live policies into the pools whose interval has come."""
        for pool in self.pools:
            if env_steps >= pool.next_snapshot:
                pool.snapshot(live, env_steps)

    def _hide(self, ob: Observation, played: dict[str, torch.Tensor]) -> Observation:
        active = dict(ob.active)
        for name, mask in played.items():
            active[name] = active[name] & ~mask
        return ob._replace(active=active)

    def reset(self, seed) -> Observation:
        ob = self.env.reset(seed)
        every = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        for pool in self.pools:
            pool.returns.zero_()
            pool.draw(every)
        self._ob, self._first = ob, None
        return self._hide(ob, {p.name: p.played() for p in self.pools})

    def step(self, actions: dict[str, torch.Tensor]) -> Transition:
        joint = dict(actions)
        for pool in self.pools:
            joint[pool.name] = pool.actions(self._ob, self._first, joint[pool.name])
        tr = self.env.step(joint)
        done = tr.terminated | tr.truncated
        before = {p.name: p.played() for p in self.pools}
        for pool in self.pools:
            pool.record(tr.rewards[pool.name], done)
            pool.draw(done)
        self._ob, self._first = tr.next, done
        nxt = self._hide(tr.next, {p.name: p.played() for p in self.pools})
        final = nxt if tr.final is tr.next else self._hide(tr.final, before)
        mine = {name: ~mask for name, mask in before.items()}
        return tr._replace(next=nxt, final=final, played=mine)

    def metrics(self) -> list[dict[str, float]]:
        out: list[dict[str, float]] = [{} for _ in range(self.pools[0].S)]
        for pool in self.pools:
            for mine, found in zip(out, pool.metrics(), strict=True):
                mine.update(found)
        return out

    def seed_state(self, index: int) -> dict:
        return {pool.name: pool.seed_state(index) for pool in self.pools}

    def load_seed_states(self, states: list[dict]) -> None:
        for pool in self.pools:
            pool.load_seed_states([state[pool.name] for state in states])


def _shadow_seeds(seeds: list[int], size: int) -> tuple[int, ...]:
    """Snapshot k of seed s samples from a stream of its own, not the learner's."""
    return tuple(
        int(np.random.SeedSequence([seed, 3, k]).generate_state(1)[0] % 2**31)
        for k in range(size)
        for seed in seeds
    )


def with_pool(env, spec: Spec, learners: EnvInfo, seeds: list[int], device: torch.device, client):
    """`env` with the spec's pools, or `env` itself when no group keeps one; `client` (the
    tracking store) loads the runs a pool includes."""
    if not spec.pools:
        return env
    from marlctl.train.build import build_trainer
    from marlctl.train.opponents import frozen_player

    sizes = {g.name: g.n_agents for g in learners.groups}
    per_seed = env.num_envs // len(seeds)
    state = int(np.random.SeedSequence([*seeds, 4]).generate_state(1)[0] % 2**31)
    generator = torch.Generator(device=device).manual_seed(state)
    pools = []
    for name, cfg in spec.pools.items():
        shadow = build_trainer(spec, learners, per_seed, device, 1, _shadow_seeds(seeds, cfg.size))
        members = [
            frozen_player(client, spec, env.info, name, ref, device, env.num_envs)
            for ref in cfg.include
        ]
        pools.append(
            Pool(name, cfg, sizes[name], shadow, len(seeds), env.num_envs, generator, members)
        )
    return WithPool(env, pools)
