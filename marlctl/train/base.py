"""What every trainer shares: seeds trained as one batch, their random streams, env rows,
acting state of recurrent agents, and checkpoints in the single-seed layout.

A trainer trains one seed, or several at once (`hardware.batch_seeds`): env rows are
seed-major, `[S * E, ...]`, and every network, normaliser, random stream, sampled minibatch
and gradient clip is per seed, so a seed's numbers do not depend on the others.
Subclasses define `policies` (every network, incl. critics and targets), `optimizers`,
`act_step`, `train_iteration` and `steps_per_iteration`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marlctl.envs.batch import Observation, Transition
from marlctl.envs.info import EnvInfo
from marlctl.spec.models import ModelSpec
from marlctl.train.actions import action_bounds, one_hot, uniform_probs
from marlctl.train.core import EpisodeStats, inclusive_cumsum, per_seed
from marlctl.train.networks import AgentNet, reset_where, sharing_of
from marlctl.train.regions import Region

# Argument validation costs a host sync and a pass over every tensor on each call.
torch.distributions.Distribution.set_default_validate_args(False)


@dataclass(frozen=True)
class TrainerSetup:
    """What every algorithm's trainer is built from (`marlctl.train.build.build_trainer`).

    `total_iterations` drives schedules (learning-rate decay); `centralised` says whether
    critics see the global state (the algorithm's `centralised_critic`); `seeds` are trained
    as one batch, each row with the hyperparameters `rows` gives it where it is set."""

    config: Any  # the algorithm's config (`marlctl.algos.AlgoConfig`)
    model: ModelSpec
    info: EnvInfo
    num_envs: int
    device: torch.device | str
    total_iterations: int
    centralised: bool
    seeds: tuple[int, ...] = (0,)
    # Per seed row, hyperparameters of its own (`marlctl.train.rows`); None: the config's.
    rows: list[dict] | None = None


class Trainer:
    policies: nn.ModuleDict
    optimizers: dict[str, torch.optim.Optimizer]
    captured_by_default = True  # under `hardware.compile: auto` on a GPU
    row_fields: tuple[str, ...] = ()  # the hyperparameters a row may have of its own
    compacts = False  # `keep_rows` takes all its per-row state: ended rows leave the batch
    # Some network reads the env's global state: without one, an env that computes its
    # state apart (PettingZoo's `state()`, a rendered frame in pistonball) is spared it.
    reads_state = True
    # Its iterations step the env (a captured iteration then holds the env's steps too);
    # an offline learner's take gradient steps only.
    steps_env = True

    def __init__(
        self, model: ModelSpec, info: EnvInfo, num_envs: int, device, seeds: tuple[int, ...]
    ):
        self.model, self.info, self.device = model, info, torch.device(device)
        self.num_envs, self.seeds = num_envs, tuple(seeds)
        S = len(self.seeds)
        # Initial weights from one stream per seed; sampling from another.
        self.init_generators = [torch.Generator().manual_seed(seed) for seed in self.seeds]
        self.generators = [
            torch.Generator(device=self.device).manual_seed(seed + 1) for seed in self.seeds
        ]
        self.iteration = 0
        self.updates = 0  # gradient steps so far (federated averaging counts these)
        self._rows = torch.arange(S, device=self.device).unsqueeze(1)
        groups = {g.name: g.n_agents for g in info.groups}
        self.stats = EpisodeStats(groups, num_envs, self.device, S)
        self._acting: dict[str, torch.Tensor] = {}  # recurrent state while acting
        # Envs whose episode starts with the next observation (recurrent states reset there).
        self._first = torch.ones(S, num_envs, dtype=torch.bool, device=self.device)
        self.bounds = action_bounds(info.groups, self.device)  # continuous groups' boxes
        self.graph = None  # a captured training iteration (`capture`)
        # The draws `noise` records, and the numbers drawn ahead that it hands out instead,
        # around a compiled region (`marlctl.train.regions`).
        self._draws: list[tuple[torch.Size, bool, torch.dtype]] | None = None
        self._tape: list[torch.Tensor] | None = None

    def restart_episodes(self) -> None:
        """The envs were reset: every episode starts afresh."""
        self.stats.reset_running()
        self._first.fill_(True)

    # ------------------------------------------------------------ seeds

    def split(self, ob: Observation) -> Observation:
        """Env rows [S * E, ...] -> [S, E, ...]."""
        S = len(self.seeds)

        def view(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.view(S, -1, *x.shape[1:])

        return Observation(
            {k: view(v) for k, v in ob.obs.items()},
            view(ob.state),
            {k: view(v) for k, v in ob.masks.items()},
            {k: view(v) for k, v in ob.active.items()},
        )

    def noise(
        self, shape: torch.Size, normal: bool, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Per-seed random numbers, shape [S, ...], each seed from its own generator."""
        if self._tape is not None:  # inside a compiled region: drawn before it (`Region`)
            return self._tape.pop(0)
        if self._draws is not None:
            self._draws.append((torch.Size(shape), normal, dtype))
        draw = torch.randn if normal else torch.rand
        if len(self.generators) == 1:  # the same numbers as the stack below, without a copy
            return draw(shape, generator=self.generators[0], device=self.device, dtype=dtype)
        return torch.stack(
            [draw(shape[1:], generator=g, device=self.device, dtype=dtype) for g in self.generators]
        )

    def sample_categorical(self, probs: torch.Tensor) -> torch.Tensor:
        """Inverse-CDF sampling from seed-first probabilities: masked actions have zero mass."""
        u = self.noise(probs.shape[:-1], normal=False).unsqueeze(-1)
        return (inclusive_cumsum(probs) < u).sum(-1).clamp_max(probs.shape[-1] - 1)

    def random_action(self, group, mask: torch.Tensor | None, lead: torch.Size) -> torch.Tensor:
        """Uniform random actions of `group`'s agents, shaped `lead` (`[S, ..., n]`, plus the
        action dimension if continuous): over the allowed actions, or over the action box."""
        shape = (*lead, group.n_actions)
        if group.discrete:
            return self.sample_categorical(uniform_probs(mask, shape, self.device))
        return self.bounds[group.name].to_env(2.0 * self.noise(shape, normal=False) - 1.0)

    def critic_action(self, group, action: torch.Tensor) -> torch.Tensor:
        """A stored env action as a centralised critic takes it: one-hot, or in [-1, 1]."""
        if group.discrete:
            return one_hot(action, group)
        return self.bounds[group.name].from_env(action)

    def agent_net(
        self,
        group,
        n_in: int,
        n_out: int,
        sharing: str | None = None,
        observes: bool = False,
        reads_state: bool = False,
        **kwargs,
    ) -> AgentNet:
        """A network for the agents of `group`, shared among them as `model.sharing` says
        unless `sharing` is given; one that `observes` reads the group's observations, with
        the encoder `model.encoder` gives it; one that `reads_state` reads the global state,
        through the same encoder's convolutions where that state is a frame."""
        frames, first, cnn = None, group.channels_first, None
        if self.model.encoder_for(group.name) == "cnn":
            if observes:
                frames = group.frame_shape
                if frames is None:
                    raise ValueError(f"model.encoder cnn: group {group.name} has no frames")
            elif reads_state and self.info.state_frame is not None:
                frames, first = self.info.state_frame, self.info.state_channels_first
                cnn = self.model.cnn.for_state()
        return AgentNet(
            len(self.seeds), group.n_agents, n_in, n_out, self.model,
            sharing or sharing_of(self.model, group.name), self.init_generators,
            frames=frames, channels_first=first, cnn=cnn, **kwargs,
        )  # fmt: skip

    def after_update(self) -> None:
        """Count a gradient step; average federated networks every `federated_every`."""
        self.updates += 1
        if self.updates % self.model.federated_every:
            return
        for module in self.policies.modules():
            if isinstance(module, AgentNet) and module.sharing == "federated":
                module.average_agents()

    # ------------------------------------------------------------ acting

    @property
    def stateless_acting(self) -> bool:
        """Acting keeps nothing from one step to the next (no recurrent state): a row's
        action depends on its own observation alone, so any subset of rows can act."""
        return self.model.recurrent is None

    @torch.no_grad()
    def act(
        self, ob: Observation, deterministic: bool = True, first: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Actions for env rows [S * E, ...]. `first` [S * E] marks rows whose episode starts
        with this observation (recurrent agents reset their state there); None = all."""
        split = self.split(ob)
        S = len(self.seeds)
        start = None if first is None else first.view(S, -1)
        actions = self.act_step(split, deterministic, start)
        return {k: v.flatten(0, 1) for k, v in actions.items()}

    def act_step(
        self, ob: Observation, deterministic: bool, first: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def acting_state(self, name: str, net: AgentNet, first: torch.Tensor | None, rows: int):
        """The recurrent state of group `name` for this acting step, reset where `first`."""
        h = self._acting.get(name)
        if h is None or h.shape[1] != rows or first is None:
            return net.initial_state(len(self.seeds), rows, device=self.device)
        return reset_where(h, first)

    def acting_output(
        self, name: str, net: AgentNet, x: torch.Tensor, first: torch.Tensor | None
    ) -> torch.Tensor:
        """`net`'s output on inputs `x` `[S, E, ...]` for this acting step: a recurrent one
        (`model.recurrent`) goes on from group `name`'s state and keeps its new one."""
        recurrent = self.model.recurrent is not None
        h = self.acting_state(name, net, first, x.shape[1]) if recurrent else None
        out, h = net(x, h)
        if h is not None:
            self._acting[name] = h
        return out

    # ------------------------------------------------------------ compile

    def compile(self) -> None:
        """torch.compile every network in place (parameter names and checkpoints unchanged)."""
        for module in self.policies.modules():
            if isinstance(module, AgentNet):
                for part in module.children():
                    part.compile(dynamic=False)

    def capture(self, env) -> str | None:
        """Replay training iterations as a CUDA graph (`marlctl.train.capture`), eager until
        a subclass's `train_iteration` hands them to `self.graph`; None, or why this run
        cannot be captured."""
        reason = self.capture_blocker(env)
        if reason is not None:
            return reason
        from marlctl.train.capture import IterationGraph

        for optimizer in self.optimizers.values():
            make_capturable(optimizer)
        roots, generators = [self, self.stats], list(self.generators)
        if self.steps_env:
            env.make_graph_safe()
            roots, generators = [*roots, env], [*generators, *env.generators]
        self.graph = IterationGraph(roots, generators, self.graph_counters())
        return None

    def graph_counters(self) -> list[tuple[object, str]]:
        """The host counts an iteration advances (`IterationGraph` counters); a subclass
        also puts on the device here any count a replay must read. The gradient steps are
        counted on the device too, for `copy_targets`."""
        self._target_steps_t = torch.tensor(self.updates, device=self.device)
        return [(self, "updates")]

    def copy_targets(self, targets: list[torch.Tensor], sources: list[torch.Tensor], every: int):
        """At the end of every `every`-th gradient step, copy `sources` into `targets`: by the
        host's count of gradient steps, or in a captured iteration by the device's, which a
        replay reads (every step then moves the targets by 0, or all the way where a copy is
        due)."""
        with torch.no_grad():
            if self.graph is not None:
                due = ((self._target_steps_t + 1) % every == 0).to(targets[0].dtype)
                torch._foreach_lerp_(targets, sources, [due] * len(targets))
                self._target_steps_t += 1
            elif (self.updates + 1) % every == 0:
                torch._foreach_copy_(targets, sources)

    def capture_blocker(self, env) -> str | None:
        """Why iterations of this trainer on `env` cannot be captured, or None."""
        if self.device.type != "cuda":
            return "CUDA graphs need a CUDA device"
        if self.steps_env and getattr(env, "graph_blocker", None):
            return env.graph_blocker
        if self.steps_env and not hasattr(env, "make_graph_safe"):
            return "only native envs step without the host"
        if any(
            isinstance(m, AgentNet) and m.sharing == "federated" for m in self.policies.modules()
        ):
            return "federated averaging runs on the host every `federated_every` steps"
        return None

    # ------------------------------------------------------------ checkpoints

    def extra_state(self, index: int | None) -> dict:
        """State beyond networks and optimisers (seed `index`'s only, if given)."""
        return {}

    def load_extra_states(self, states: list[dict]) -> None:
        pass

    # ------------------------------------------------------------ rows of their own

    def set_row_value(self, name: str, row: int, value: float) -> None:
        """Row `row` trains with hyperparameter `name` (one of `row_fields`, given per row
        from the start) at `value` from now on, as if it had begun with it."""
        if name not in self.row_fields:
            raise ValueError(f"{type(self).__name__} takes no {name} per row")
        self.values.set(name, row, value)
        for optimizer in self.optimizers.values():
            if hasattr(optimizer, "set_rate"):
                optimizer.set_rate(name, row, self.values.tensor(name, torch.float64)[row])
                if name == "lr" and "critic_lr" in optimizer.names:  # where it follows
                    rates = self.values.tensor("critic_lr", torch.float64)
                    optimizer.set_rate("critic_lr", row, rates[row])

    def copy_extra_rows(self, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Rows `targets` of per-row state kept outside the trainer's networks and optimisers
        take rows `sources`' values (`marlctl.train.population.copy_rows`)."""

    def keep_rows(self, index: torch.Tensor) -> None:
        """Only rows `index` go on: the trainer's per-row state beyond its networks and
        optimisers (`marlctl.train.compact.keep_rows` takes those); a subclass adds its own."""
        keep = index.tolist()
        self.seeds = tuple(self.seeds[i] for i in keep)
        self.generators = [self.generators[i] for i in keep]
        self.init_generators = [self.init_generators[i] for i in keep]
        self._rows = torch.arange(len(keep), device=self.device).unsqueeze(1)
        self._first = self._first.index_select(0, index)
        self._acting = {k: h.index_select(0, index) for k, h in self._acting.items()}
        self.stats.keep(index)
        self.values.keep(keep)
        for value in vars(self).values():
            if isinstance(value, Region):  # its draws' shapes were the old rows'
                value.draws = None

    def state_dict(self) -> dict:
        return {
            "policies": self.policies.state_dict(),
            "optimizers": {k: portable(o.state_dict()) for k, o in self.optimizers.items()},
            "iteration": self.iteration,
            "updates": self.updates,
            "generators": [g.get_state() for g in self.generators],
            "extra": self.extra_state(None),
        }

    def seed_state(self, index: int) -> dict:
        """Seed `index`'s part of the state: what training it alone would have saved."""

        def cut(v):
            return v[index : index + 1].clone() if torch.is_tensor(v) and v.dim() else v

        def groups(optimizer, saved: list[dict]) -> list[dict]:
            own = getattr(optimizer, "row_groups", None)  # rows' own rates (`RowAdam`)
            return saved if own is None else own(saved, index)

        return {
            "policies": {k: cut(v) for k, v in self.policies.state_dict().items()},
            "optimizers": {
                name: {
                    "state": {
                        i: {k: cut(v) for k, v in entry.items()} for i, entry in sd["state"].items()
                    },
                    "param_groups": groups(optimizer, sd["param_groups"]),
                }
                for name, optimizer, sd in (
                    (n, o, portable(o.state_dict())) for n, o in self.optimizers.items()
                )
            },
            "iteration": self.iteration,
            "updates": self.updates,
            "generators": [self.generators[index].get_state()],
            "extra": self.extra_state(index),
        }

    def load_seed_states(self, states: list[dict]) -> None:
        """The inverse of `seed_state` over every seed, in order."""

        def join(values):
            first = values[0]
            return torch.cat(values) if torch.is_tensor(first) and first.dim() else first

        self.policies.load_state_dict(
            {k: join([s["policies"][k] for s in states]) for k in states[0]["policies"]}
        )
        for name, optimizer in self.optimizers.items():
            parts = [s["optimizers"][name] for s in states]
            optimizer.load_state_dict(
                {
                    "state": {
                        i: {k: join([p["state"][i][k] for p in parts]) for k in entry}
                        for i, entry in parts[0]["state"].items()
                    },
                    "param_groups": parts[0]["param_groups"],
                }
            )
        self.iteration = int(states[0]["iteration"])
        self.updates = int(states[0].get("updates", 0))
        for g, state in zip(self.generators, states, strict=True):
            g.set_state(state["generators"][0])
        self.load_extra_states([s.get("extra", {}) for s in states])

    def load_state_dict(self, state: dict) -> None:
        """A state of this trainer's seeds (one seed: also a `seed_state`)."""
        S = len(self.seeds)
        if S == 1:
            self.load_seed_states([state])
            return
        self.policies.load_state_dict(state["policies"])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        self.iteration, self.updates = int(state["iteration"]), int(state["updates"])
        for g, saved in zip(self.generators, state["generators"], strict=True):
            g.set_state(saved)
        self.load_extra_states([state["extra"]])


def next_observation(tr: Transition) -> Observation:
    """What each env saw after its action: the final observation where an episode ended."""
    if tr.final is tr.next:
        return tr.next
    done = tr.terminated | tr.truncated

    def pick(final: torch.Tensor | None, nxt: torch.Tensor | None) -> torch.Tensor | None:
        if nxt is None:
            return None
        return torch.where(done.view(-1, *([1] * (nxt.dim() - 1))), final, nxt)

    return Observation(
        {k: pick(tr.final.obs[k], v) for k, v in tr.next.obs.items()},
        pick(tr.final.state, tr.next.state),
        {k: pick(tr.final.masks[k], v) for k, v in tr.next.masks.items()},
        {k: pick(tr.final.active[k], v) for k, v in tr.next.active.items()},
    )


def clip_grad_norm_per_seed(
    params: list[torch.Tensor], max_norm: float | torch.Tensor, seeds: int
) -> torch.Tensor:
    """`clip_grad_norm_` for each seed's slice of the parameters (`max_norm` one limit, or
    one per seed `[S]`); returns the norms `[S]`."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(seeds, device=params[0].device if params else None)
    # One norm per seed's slice of each gradient: a seed's norm is computed exactly the same
    # way alone and batched (a row-wise reduction over [S, N] may round differently).
    slices = [g[s] for g in grads for s in range(seeds)]
    norms = torch.stack(torch._foreach_norm(slices)).view(len(grads), seeds).T.contiguous()
    total = torch.stack(torch._foreach_norm(list(norms)))
    # A reciprocal times the limit, as `float / tensor` computes it: a limit per row `[S]`
    # rounds as a float one does.
    scale = ((total + 1e-6).reciprocal() * max_norm).clamp(max=1.0)
    torch._foreach_mul_(grads, [per_seed(scale, g) for g in grads])
    return total


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Let a CUDA graph capture `optimizer`'s steps: step counts on the device, and learning
    rates in device tensors (set with `fill_`), which a replay reads; a fused optimiser keeps
    its learning rate, which a replay repeats."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        if group.get("fused"):  # its step count is on the device already; a constant rate
            continue
        device = group["params"][0].device
        group["lr"] = torch.tensor(float(group["lr"]), device=device)
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].to(device=device, dtype=torch.float32)


def portable(state: dict) -> dict:
    """An optimiser's `state_dict` as an uncaptured optimiser on any device loads it."""
    groups = [
        {**g, "lr": float(g["lr"]), "capturable": False} if torch.is_tensor(g["lr"]) else g
        for g in state["param_groups"]
    ]
    return {"state": state["state"], "param_groups": groups}


def freeze(params: list[torch.Tensor], frozen: bool) -> None:
    """Stop (or restart) gradients into `params`; cheaper than `Module.requires_grad_`,
    which walks every submodule."""
    for p in params:
        p.requires_grad_(not frozen)
