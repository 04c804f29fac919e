"""Offline training: learners that sample a recorded dataset instead of an env (`algos.offline`).

`DatasetSampler` holds a dataset's transitions once, on the run's device where they fit, and
every seed row samples them with its own random stream, in the shapes a replay buffer gives.
`Offline` turns a learner into an offline one: the dataset is its buffer, and an
iteration is `updates` gradient steps, with no env step. On it: `BCTrainer` (behaviour
cloning), `CQLTrainer` (IQL or QMIX with Conservative Q-Learning's penalty) and
`MADDPGCQLTrainer` (MADDPG's twin critics with CQL(H)'s penalty).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from marlctl.envs.batch import Observation
from marlctl.train.actions import flat_obs, mask_logits, masked_mean
from marlctl.train.base import Trainer, TrainerSetup, clip_grad_norm_per_seed
from marlctl.train.core import adam
from marlctl.train.maddpg import MADDPGTrainer
from marlctl.train.networks import reset_where
from marlctl.train.qmix import QLearningTrainer
from marlctl.train.replay import storage_device


def unroll_window(
    net: nn.Module,
    obs: torch.Tensor,
    batch: dict[str, torch.Tensor],
    name: str,
    steps: slice = slice(None),
) -> torch.Tensor:
    """Group `name`'s network `net` on sampled windows `obs` `[S, L, B, n, O]`: its outputs
    at the window's `steps`, `[S, T, B, n, A]`. A recurrent net (the batch holds its state,
    `hidden/NAME`) unrolls the whole window from that state, reset where an episode starts;
    a feed-forward one sees only those steps."""
    hidden = batch.get(f"hidden/{name}")
    if hidden is None:
        x = obs[:, steps]
        return net(x.flatten(1, 2))[0].unflatten(1, x.shape[1:3])
    h, outs = hidden[:, 0], []
    for t in range(obs.shape[1]):
        out, h = net(obs[:, t], reset_where(h, batch["first"][:, t]))
        outs.append(out)
    return torch.stack(outs, 1)[:, steps]


class DatasetSampler:
    """`[N, ...]` transitions (`marlctl.data.reader.load_transitions`) that `seeds` rows
    sample, each row with its generator: `sample` gives `[S, length, B, ...]` windows of
    consecutive transitions, as `ReplayBuffer.sample` does. Where the dataset lies on the
    run's device, the draws come from `uniform` (the trainer's `noise`: a compiled region's
    or captured iteration's random numbers) and no host value is read. `hidden`: the
    recurrent state size per group; a window's state enters as zeros (Off-the-Grid MARL's
    sequences do), reset again where an episode starts inside it."""

    def __init__(
        self,
        data: dict[str, torch.Tensor],
        device,
        generators: list[torch.Generator],
        uniform: Callable[[torch.Size, torch.dtype], torch.Tensor] | None = None,
        hidden: dict[str, int] | None = None,
    ):
        self.device = torch.device(device)
        self.size = len(data["terminated"])
        nbytes = sum(v.numel() * v.element_size() for v in data.values())
        self.storage = storage_device(self.device, nbytes)
        self.data = {k: v.to(self.storage) for k, v in data.items()}
        self.generators = generators
        self.uniform = uniform if self.storage == self.device else None
        self.hidden = {
            name: (data[f"obs/{name}"].shape[1], size) for name, size in (hidden or {}).items()
        }

    def __len__(self) -> int:
        return self.size

    @property
    def written(self) -> int:
        return self.size

    @property
    def on_device(self) -> bool:
        return self.storage == self.device

    def sample(self, batch: int, length: int = 1) -> dict[str, torch.Tensor]:
        windows = self.size - length + 1
        if self.uniform is not None:
            u = self.uniform(torch.Size((len(self.generators), batch)), torch.float64)
            starts = (u * windows).long().clamp_(max=windows - 1)
        else:
            starts = torch.stack([
                torch.randint(windows, (batch,), generator=g, device=g.device)
                for g in self.generators
            ]).to(self.storage)  # fmt: skip
        rows = starts.unsqueeze(1) + torch.arange(length, device=self.storage).view(1, -1, 1)
        flat = rows.flatten()
        out = {
            name: value.index_select(0, flat).view(*rows.shape, *value.shape[1:])
            for name, value in self.data.items()
        }
        if self.storage != self.device:
            out = {k: v.to(self.device, non_blocking=True) for k, v in out.items()}
        for name, (n, size) in self.hidden.items():
            zeros = torch.zeros(len(self.generators), 1, batch, n, size, device=self.device)
            out[f"hidden/{name}"] = zeros.expand(-1, length, -1, -1, -1)
        return out

    def keep(self, index: torch.Tensor, generators: list[torch.Generator]) -> None:
        self.generators = generators  # every row reads the one dataset

    def state_dict(self, index: int | None = None) -> dict:
        return {}  # the dataset stays where it is, out of every checkpoint


STATE_CLIP = 5.0  # standard deviations: SMAX's rare states lie 10 to 20 out


def scaled_state(data: dict[str, torch.Tensor], how: str) -> dict[str, torch.Tensor]:
    """`data` with `state` and `next_state` scaled per feature by statistics of `state` over
    the dataset: `standardise` subtracts the mean and divides by the standard deviation;
    `clipped` standardises, then bounds each feature to `STATE_CLIP` standard deviations;
    `range` maps the minimum to -1 and the maximum to 1. A feature constant there reads 0 in
    `state`. `next_state` takes the same statistics: past an episode's last recorded step it
    may fall outside the range (MAICQ, which bootstraps from the window's next recorded state,
    never reads it)."""
    state = data["state"]
    if how in ("standardise", "clipped"):
        spread, centre = torch.std_mean(state, 0, correction=0)
    elif how == "range":
        low, high = state.amin(0), state.amax(0)
        spread, centre = (high - low) / 2, (high + low) / 2
    else:
        raise ValueError(f"unknown state scaling {how!r}")
    spread = torch.where(spread > 1e-6, spread, torch.ones_like(spread))
    scaled = {key: (data[key] - centre) / spread for key in ("state", "next_state")}
    if how == "clipped":
        scaled = {key: value.clamp(-STATE_CLIP, STATE_CLIP) for key, value in scaled.items()}
    return {**data, **scaled}


class Offline:
    """Mixed in before a trainer (a replay learner's, or one of its own): its buffer is the
    dataset, given once by `load_dataset`, and an iteration takes `updates` gradient steps
    and no env step. On a GPU an iteration is captured as one CUDA graph
    (`marlctl.train.capture`) where the dataset lies on the device: its draws come from the
    trainer's streams and hard target copies follow the device's count of gradient steps."""

    steps_env = False

    def load_dataset(self, data: dict[str, torch.Tensor]) -> None:
        """`data`: a dataset's transitions. Terminations as `bootstrap_time_limit` says (a
        truncation ends the return where it is false); reward statistics of every reward in
        it, for `reward_scaling`; a float state scaled as `state_scaling` says."""
        data = dict(data)
        scaling = getattr(self.cfg, "state_scaling", "none")
        if scaling != "none" and data["state"].is_floating_point():
            data = scaled_state(data, scaling)
        cut = data.pop("truncated")
        if not getattr(self.cfg, "bootstrap_time_limit", True):
            data["terminated"] = data["terminated"] | cut
        draw = lambda shape, dtype: self.noise(shape, False, dtype)  # noqa: E731
        hidden = self.hidden_sizes() if hasattr(self, "hidden_sizes") else {}
        self.buffer = DatasetSampler(data, self.device, self.generators, draw, hidden)
        S = len(self.seeds)
        for name, stats in self.reward_stats.items():
            rewards = data[f"reward/{name}"].to(self.device)
            active = data[f"active/{name}"].to(self.device)
            stats.update(rewards.expand(S, *rewards.shape), active.expand(S, *active.shape))

    def _ensure_buffer(self):
        if self.buffer is None:
            raise RuntimeError("an offline trainer trains from a dataset: load_dataset first")
        return self.buffer

    def train_iteration(self, env, ob: Observation):
        self._ensure_buffer()
        totals = self.graph.run(self.gradient_steps) if self.graph else self.gradient_steps()
        self.iteration += 1
        return ob, {f"loss/{k}": v for k, v in totals.items()}

    def gradient_steps(self) -> dict[str, torch.Tensor]:
        """`updates` gradient steps on batches of the dataset: each loss's mean per seed."""
        totals = {k: torch.zeros(len(self.seeds), device=self.device) for k in self.loss_keys}
        for _ in range(self.cfg.updates):
            losses = self.update(self.sampled_batch())
            self.after_update()
            for key, value in losses.items():
                totals[key] += value.detach() / self.cfg.updates
        return totals

    @property
    def steps_per_iteration(self) -> int:
        return self.cfg.updates  # gradient steps: what an offline run counts

    def ready(self) -> bool:
        return True  # the dataset is whole from the start

    def capture_blocker(self, env) -> str | None:
        if self.buffer is None:
            return "no dataset is loaded"
        if not self.buffer.on_device:
            return "the dataset is kept in CPU memory (too large for the GPU's share)"
        return super().capture_blocker(env)

    def graph_counters(self) -> list[tuple[object, str]]:
        # No env step: the replay learners' env-step and replay counters stay as they are,
        # the env steps on the device too (what acting's annealed values read).
        if hasattr(self, "env_steps"):
            self._env_steps_t = torch.tensor(self.env_steps, device=self.device)
        return Trainer.graph_counters(self)

    def extra_state(self, index: int | None) -> dict:
        state = super().extra_state(index)
        state.pop("replay", None)
        return state


class BCTrainer(Offline, Trainer):
    """Behaviour cloning: each group's policy (`model.sharing` applies) maximises the
    likelihood of the dataset's actions of its active agents (discrete: cross-entropy, with
    masked actions left out), or regresses them (continuous: squared error in [-1, 1])."""

    loss_keys = ("bc", "grad_norm")

    def __init__(self, setup: TrainerSetup):
        super().__init__(setup.model.for_algo(setup.config), setup.info, setup.num_envs,
                         setup.device, setup.seeds)  # fmt: skip
        self.cfg = setup.config
        self.buffer: DatasetSampler | None = None
        self.reward_stats = nn.ModuleDict()
        self.groups = {g.name: g for g in setup.info.groups}
        self.actor = nn.ModuleDict({
            g.name: self.agent_net(g, g.obs_dim, g.n_actions, out_gain=0.01, observes=True)
            for g in setup.info.groups
        })  # fmt: skip
        self.policies = nn.ModuleDict({"actor": self.actor}).to(self.device)
        self.params = list(self.actor.parameters())
        self.optimizer = adam(self.params, self.cfg.lr, self.cfg.adam_eps)
        self.optimizers = {"adam": self.optimizer}
        self.reads_state = False
        self.recurrent = setup.model.recurrent is not None

    def hidden_sizes(self) -> dict[str, int]:
        return {n: net.hidden_size for n, net in self.actor.items()} if self.recurrent else {}

    def keep_rows(self, index: torch.Tensor) -> None:
        super().keep_rows(index)
        if self.buffer is not None:
            self.buffer.keep(index, self.generators)

    def sampled_batch(self) -> dict[str, torch.Tensor]:
        length = self.cfg.sequence_length if self.recurrent else 1
        return self.buffer.sample(self.cfg.batch_size, length)

    def clip_gradients(self, params: list[torch.Tensor]) -> torch.Tensor:
        return clip_grad_norm_per_seed(params, self.cfg.max_grad_norm, len(self.seeds))

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        losses, weights = [], []
        for name, group in self.groups.items():
            obs = flat_obs(batch[f"obs/{name}"], group)
            out = unroll_window(self.actor[name], obs, batch, name).flatten(1, 2)  # [S, X, n, A]
            action = batch[f"action/{name}"].flatten(1, 2)
            if group.discrete:
                mask = batch.get(f"mask/{name}")
                logits = mask_logits(out, None if mask is None else mask.flatten(1, 2))
                loss = F.cross_entropy(logits.flatten(0, -2), action.flatten(),
                                       reduction="none").view(action.shape)  # fmt: skip
            else:
                target = self.bounds[name].from_env(action)
                loss = ((torch.tanh(out) - target) ** 2).mean(-1)
            losses.append(loss)
            weights.append(batch[f"active/{name}"].flatten(1, 2).to(loss.dtype))
        loss = masked_mean(torch.cat(losses, -1), torch.cat(weights, -1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()
        grad = self.clip_gradients(self.params)
        self.optimizer.step()
        return {"bc": loss.detach(), "grad_norm": grad}

    def act_step(self, ob: Observation, deterministic: bool, first: torch.Tensor | None):
        actions = {}
        for name, net in self.actor.items():
            group = self.groups[name]
            out = self.acting_output(name, net, flat_obs(ob.obs[name], group), first)
            if not group.discrete:
                actions[name] = self.bounds[name].to_env(torch.tanh(out))
                continue
            logits = mask_logits(out, ob.masks[name])
            if deterministic:
                actions[name] = logits.argmax(-1)
            else:
                actions[name] = self.sample_categorical(torch.softmax(logits, -1))
        return actions


class CQLTrainer(Offline, QLearningTrainer):
    """IQL or QMIX on a dataset, with Conservative Q-Learning's penalty added to the TD loss,
    weighted by `cql_weight`. IQL+CQL: the mean over active agents of logsumexp over the
    allowed actions of Q minus Q of the dataset's action. QMIX+CQL: logsumexp over the mixed
    Q of `ood_actions` uniformly random joint actions and the dataset's, minus the dataset's
    (Off-the-Grid MARL's `qmix_cql`)."""

    loss_keys = ("td", "cql", "q_taken", "grad_norm")
    compacts = False

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        td, q_mean = self.td_loss(batch)
        cql = self.cql_penalty(batch)
        loss = td + self.cfg.cql_weight * cql
        self.optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()  # seeds share no parameter
        grad = self.clip_gradients(self.params)
        self.optimizer.step()
        self.update_targets([(self.target, self.policies["online"])])
        return {"td": td.detach(), "cql": cql.detach(), "q_taken": q_mean, "grad_norm": grad}

    def online_q(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each group's online Q of every action at the window's trained steps (after any
        burn-in), `[S, X, n, A]`, with gradient; recurrent nets unroll the window from its
        stored state, as the TD loss does."""
        start = self.cfg.burn_in_steps if self.recurrent else 0
        first, out = batch["first"], {}
        for name, net in self.policies["online"]["q"].items():
            obs = flat_obs(batch[f"obs/{name}"], self.groups[name])
            h = None
            if self.recurrent:
                h = batch[f"hidden/{name}"][:, 0]
                if start:
                    h = self._burn_in(net, obs[:, :start], h, first)
            q, _ = self._unroll(net, obs[:, start:], obs, h, first[:, start:], True, False)
            out[name] = q.flatten(1, 2)
        return out

    def cql_penalty(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The conservative penalty per seed `[S]`, with gradient."""
        start = self.cfg.burn_in_steps if self.recurrent else 0

        def flat(x: torch.Tensor) -> torch.Tensor:  # [S, L, B, ...] -> [S, X, ...]
            return x[:, start:].flatten(1, 2)

        qs, chosen, actives, masks = [], [], [], []
        for name, q in self.online_q(batch).items():
            mask = batch.get(f"mask/{name}")
            mask = None if mask is None else flat(mask)
            qs.append(q)
            masks.append(mask)
            taken = flat(batch[f"action/{name}"]).unsqueeze(-1)
            chosen.append(q.gather(-1, taken).squeeze(-1))
            actives.append(flat(batch[f"active/{name}"]).to(q.dtype))
        active = torch.cat(actives, -1)
        data_q = torch.cat(chosen, -1)
        if self.mixer is None:
            spread = torch.cat([torch.logsumexp(mask_logits(q, m), -1)
                                for q, m in zip(qs, masks, strict=True)], -1)  # fmt: skip
            return masked_mean(spread - data_q, active)
        state = flat(batch["state"])
        K = self.cfg.ood_actions
        picked = []  # the Q of K uniformly random joint actions per sample, `[S, X, K, n]`
        for name, q, mask in zip(self.q, qs, masks, strict=True):
            q = q.unsqueeze(2).expand(-1, -1, K, -1, -1)
            mask = None if mask is None else mask.unsqueeze(2).expand(-1, -1, K, -1, -1)
            random = self.random_action(self.groups[name], mask, q.shape[:-1])
            picked.append(q.gather(-1, random.unsqueeze(-1)).squeeze(-1))
        joint = torch.cat([(data_q * active).unsqueeze(2), torch.cat(picked, -1)
                           * active.unsqueeze(2)], 2)  # fmt: skip
        values = self.mixer.mix(joint, self.mixer.weights(state))  # [S, X, 1 + K]
        mixed = values[..., 0]
        spread = torch.logsumexp(values, -1)
        weight = (active.sum(-1) > 0).to(spread.dtype)
        return masked_mean(spread - mixed, weight)


class MADDPGCQLTrainer(Offline, MADDPGTrainer):
    """MADDPG with twin critics on a dataset, each critic's loss with CQL(H)'s penalty
    (Kumar et al. 2020, §3.2; Off-the-Grid MARL's `maddpg_cql`): logsumexp of Q over
    `ood_actions` joint actions of each kind, less the log-density each was drawn with
    (uniform over [-1, 1]; the policy's joint action at the state, and at the next state,
    plus Gaussian noise of std `cql_sigma`), minus Q of the dataset's joint action."""

    def critic_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        loss, q_mean = super().critic_loss(batch)
        return loss + self.cfg.cql_weight * self.cql_penalty(batch), q_mean

    def _policy_joint(self, batch: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
        with torch.no_grad():
            return self.joint.join({
                name: torch.tanh(self.actors[name](flat_obs(batch[f"{prefix}{name}"].flatten(1, 2),
                                                            group))[0])
                for name, group in self.groups.items()
            })  # fmt: skip

    def cql_penalty(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The penalty per seed `[S]`, summed over the twin critics, with gradient."""
        cfg = self.cfg
        state = batch["state"].flatten(1, 2)
        (S, X, D), K, J, sigma = state.shape, cfg.ood_actions, self.joint.width, cfg.cql_sigma
        noise = [self.noise((S, X, K, J), normal=True) * sigma for _ in range(2)]
        drawn = [
            self.noise((S, X, K, J), normal=False) * 2 - 1,
            (self._policy_joint(batch, "obs/").unsqueeze(2) + noise[0]).clamp(-1, 1),
            (self._policy_joint(batch, "next_obs/").unsqueeze(2) + noise[1]).clamp(-1, 1),
        ]
        gaussian = [(-(e**2) / (2 * sigma**2) - math.log(sigma * math.sqrt(2 * math.pi))).sum(-1)
                    for e in noise]  # fmt: skip
        log_density = torch.cat([torch.full((S, X, K), J * math.log(0.5), device=state.device),
                                 *gaussian], 2)  # fmt: skip
        joint = torch.cat(drawn, 2).flatten(1, 2)  # [S, X * 3K, J]
        states = state.unsqueeze(2).expand(S, X, 3 * K, D).flatten(1, 2)
        taken = self.joint.join(self._taken(batch))
        penalty = torch.zeros(S, device=state.device)
        for name in self.groups:
            q = self._q(self.critics, name, states, joint)  # [S, X * 3K, n, E]
            q = q.view(S, X, 3 * K, *q.shape[2:]) - log_density[..., None, None]
            spread = torch.logsumexp(q, 2) - self._q(self.critics, name, state, taken)
            active = batch[f"active/{name}"].flatten(1, 2).to(spread.dtype)
            penalty = penalty + masked_mean(spread.sum(-1), active)
        return penalty
