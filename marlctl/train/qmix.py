"""QMIX, VDN and IQL: per-agent Q networks trained by TD from replay (config: `algos.qmix`).

QMIX (Rashid et al. 2018) mixes the agents' chosen Q values into Q_tot with a network whose
non-negative weights come from hypernetworks on the global state, so argmax Q_tot is every
agent's own argmax (monotonicity). VDN (Sunehag et al. 2017) sums them. IQL trains each
agent's Q on its own reward. The joint reward of QMIX and VDN is the mean of the agents'
rewards. Targets use target networks (Polyak-averaged), double Q, and bootstrap through a
time limit but never through a termination; agents that left early add nothing.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from marlctl.algos.qmix import QLearningConfig
from marlctl.envs.batch import Observation
from marlctl.train.actions import flat_obs, mask_logits, masked_mean, uniform_probs
from marlctl.train.base import TrainerSetup
from marlctl.train.core import BatchedMLP, adam, per_seed
from marlctl.train.networks import reset_where
from marlctl.train.offpolicy import OffPolicyTrainer
from marlctl.train.rows import Q_LEARNING, RowAdam

# ---------------------------------------------------------------- mixer


class QMixer(nn.Module):
    """Q_tot(q, s) = w2(s)·elu(w1(s)·q + b1(s)) + V(s), with |w1|, |w2| (QMIX §4.2).

    Hypernetworks for w1 and w2 of `layers` layers, `nn.Linear`'s default initialisation, as
    in EPyMARL's `modules/mixers/qmix.py` (`hypernet_layers`). With two, the mixer's gain
    d Q_tot / d Q_i starts near 1 to 3 on a state of unit scale, in the range where the
    agents' own Q values sit once rewards are standardised; one is the paper's and TorchRL's
    `QMixer`. `init_scale` instead gives every layer of the mixer an orthogonal initialisation
    of that gain and zero biases (JaxMARL's `MIXER_INIT_SCALE`): a small one starts Q_tot
    near zero whatever the state's scale.
    """

    def __init__(
        self,
        seeds: int,
        n_agents: int,
        state_dim: int,
        embed: int,
        layers: int,
        hidden: int,
        generators: list[torch.Generator],
        init_scale: float | None = None,
    ):
        super().__init__()
        self.n_agents, self.embed = n_agents, embed
        common = {
            "activation": "relu",
            "layer_norm": False,
            "generators": generators,
            "out_gain": 1.0,
            "init": "torch",
        }
        if init_scale is not None:
            common.update(init="orthogonal", out_gain=init_scale, hidden_gain=init_scale)
        widths = [hidden] * (layers - 1)
        self.hyper_w1 = BatchedMLP(seeds, 1, state_dim, widths, n_agents * embed, **common)
        self.hyper_b1 = BatchedMLP(seeds, 1, state_dim, [], embed, **common)
        self.hyper_w2 = BatchedMLP(seeds, 1, state_dim, widths, embed, **common)
        self.value = BatchedMLP(seeds, 1, state_dim, [embed], 1, **common)

    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """q `[S, X, N]`, state `[S, X, D]` -> Q_tot `[S, X]`."""
        return self.mix(q.unsqueeze(2), self.weights(state)).squeeze(2)

    def weights(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The mixing weights the hypernetworks emit for states `[S, X, D]`: w1, b1, w2, V."""
        S, X = state.shape[:2]
        s = state.unsqueeze(-2)  # one "agent": the hypernetworks are shared by every row
        w1 = self.hyper_w1(s).abs().view(S, X, self.n_agents, self.embed)
        b1 = self.hyper_b1(s).view(S, X, 1, self.embed)
        w2 = self.hyper_w2(s).abs().view(S, X, 1, self.embed)
        return w1, b1, w2, self.value(s).view(S, X, 1)

    def k(self, state: torch.Tensor) -> torch.Tensor:
        """Each agent's weight in Q_tot `[S, X, N]`: |w1| |w2| summed over the embedding, the
        mixer's slope in that agent's Q with the ELU taken as the identity (pymarl's
        `QMixer.k`, which MAICQ weights its agents' policy losses by)."""
        w1, _, w2, _ = self.weights(state)
        return (w1 * w2).sum(-1)

    @staticmethod
    def mix(q: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Q_tot `[S, X, K]` of K joint Q vectors `[S, X, K, N]` per state, mixed by the
        state's `weights`: the hypernetworks run once per state, not once per vector."""
        w1, b1, w2, value = weights
        hidden = F.elu(torch.einsum("sxkn,sxne->sxke", q, w1) + b1)
        return (hidden * w2).sum(-1) + value


# ---------------------------------------------------------------- trainer


EPSILON = ("epsilon_start", "epsilon_end", "epsilon_anneal_steps")  # the exploration schedule


class QLearningTrainer(OffPolicyTrainer):
    """Per-group Q networks (`model.sharing`, `model.recurrent` apply) and an optional mixer."""

    loss_keys = ("td", "q_taken", "grad_norm")
    row_fields = Q_LEARNING
    compacts = True

    def __init__(self, setup: TrainerSetup):
        config: QLearningConfig = setup.config
        model, info = setup.model, setup.info
        self.recurrent = model.recurrent is not None
        length = config.sequence_length if self.recurrent else 1
        super().__init__(setup, length)
        S = len(self.seeds)
        self.groups = {g.name: g for g in info.groups}
        self.q = nn.ModuleDict(
            {
                g.name: self.agent_net(g, g.obs_dim, g.n_actions, out_gain=1.0, observes=True)
                for g in info.groups
            }  # fmt: skip
        )
        networks = {"q": self.q}
        self.mixer = None
        self.reads_state = config.mixing == "qmix"  # the mixer reads it
        if config.mixing == "qmix":
            self.mixer = QMixer(
                S, info.n_agents, info.state_dim, config.mixer_embed, config.hypernet_layers,
                config.hypernet_hidden, self.init_generators, config.mixer_init_scale,
            )  # fmt: skip
            networks["mixer"] = self.mixer
        online = nn.ModuleDict(networks)
        self.target = copy.deepcopy(online)
        self.target.requires_grad_(False)
        self.policies = nn.ModuleDict({"online": online, "target": self.target}).to(self.device)
        self.params = list(online.parameters())
        if self.values.differ("lr"):  # a rate per row
            rates = self.values.tensor("lr", torch.float64)
            self.optimizer = RowAdam([self.params], [rates], config.adam_eps)
        else:
            self.optimizer = adam(self.params, config.lr, config.adam_eps)
        self.optimizers = {"adam": self.optimizer}
        self._hidden = {
            name: net.initial_state(S, self.num_envs, device=self.device)
            for name, net in self.q.items()
        }

    def keep_rows(self, index: torch.Tensor) -> None:
        super().keep_rows(index)
        self._hidden = {name: h.index_select(0, index) for name, h in self._hidden.items()}

    def hidden_sizes(self) -> dict[str, int]:
        return {name: net.hidden_size for name, net in self.q.items()} if self.recurrent else {}

    # ------------------------------------------------------------ acting

    def epsilon(self) -> float | list[float]:
        """The exploration rate now, on the host: one, or one per row where they differ."""
        return self.annealed_rows(*EPSILON, host=True)

    def schedules(self) -> dict[str, torch.Tensor]:
        rate = self.epsilon()
        if isinstance(rate, list):
            return {"train/epsilon": torch.tensor(rate, device=self.device)}
        return {"train/epsilon": torch.full((len(self.seeds),), rate, device=self.device)}

    def _exploration_rate(self) -> float | torch.Tensor:
        return self.annealed_rows(*EPSILON)

    def _greedy_or_random(
        self, q: torch.Tensor, mask: torch.Tensor | None, epsilon: float | torch.Tensor
    ) -> torch.Tensor:
        action = mask_logits(q, mask).argmax(-1)
        if not torch.is_tensor(epsilon) and epsilon <= 0:
            return action
        uniform = self.sample_categorical(uniform_probs(mask, q.shape, q.device))
        if torch.is_tensor(epsilon) and epsilon.dim():  # a rate per row
            epsilon = per_seed(epsilon, action)
        explore = self.noise(action.shape, normal=False) < epsilon
        return torch.where(explore, uniform, action)

    def explore(self, ob: Observation, first: torch.Tensor):
        epsilon, actions, extra = self._exploration_rate(), {}, {}
        for name, net in self.q.items():
            h = None
            if self.recurrent:
                h = reset_where(self._hidden[name], first)
                extra[f"hidden/{name}"] = h
            q, h = net(flat_obs(ob.obs[name], self.groups[name]), h)
            if self.recurrent:
                self._hidden[name] = h
            actions[name] = self._greedy_or_random(q, ob.masks[name], epsilon)
        return actions, extra

    def act_step(self, ob: Observation, deterministic: bool, first: torch.Tensor | None):
        epsilon = 0.0 if deterministic else self.values.of("epsilon_end")
        actions = {}
        for name, net in self.q.items():
            q = self.acting_output(name, net, flat_obs(ob.obs[name], self.groups[name]), first)
            actions[name] = self._greedy_or_random(q, ob.masks[name], epsilon)
        return actions

    # ------------------------------------------------------------ update

    def _unroll(
        self,
        net,
        obs: torch.Tensor,
        nxt: torch.Tensor,
        h,
        first: torch.Tensor,
        now: bool,
        after: bool = True,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Q of every action `[S, L, B, n, A]` at the stored observations (with gradient, if
        `now`) and at the next ones (without, if `after`). Recurrent nets unroll the window
        from state `h`; each next observation continues the sequence one step on from that
        step's state."""
        if not self.recurrent:
            q_now = net(obs)[0] if now else None
            if not after:
                return q_now, None
            with torch.no_grad():
                return q_now, net(nxt)[0]
        current, following = [], []
        for t in range(obs.shape[1]):
            h = reset_where(h, first[:, t])
            q, h = net(obs[:, t], h)
            current.append(q)
            if after:
                with torch.no_grad():
                    following.append(net(nxt[:, t], h.detach())[0])
        return (
            torch.stack(current, 1) if now else None,
            torch.stack(following, 1) if after else None,
        )

    @torch.no_grad()
    def _burn_in(self, net, obs: torch.Tensor, h: torch.Tensor, first: torch.Tensor):
        """The hidden state after the window's first `burn_in` steps, from the stored one."""
        for t in range(obs.shape[1]):
            _, h = net(obs[:, t], reset_where(h, first[:, t]))
        return h

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        loss, q_mean = self.td_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()  # seeds share no parameter
        grad = self.clip_gradients(self.params)
        self.optimizer.step()
        self.update_targets([(self.target, self.policies["online"])])
        return {"td": loss.detach(), "q_taken": q_mean, "grad_norm": grad}

    compiled_regions = ("td_loss",)

    def td_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The TD loss per seed `[S]` (with gradient) and the mean Q of the taken actions."""
        cfg = self.cfg
        # Recurrent windows: the first `burn_in` steps only rebuild the hidden states, of the
        # online and of the target network each (R2D2); the loss covers the rest.
        start = cfg.burn_in_steps if self.recurrent else 0

        def flat(x: torch.Tensor) -> torch.Tensor:  # [S, L, B, ...] -> [S, (L - start) * B, ...]
            return x[:, start:].flatten(1, 2)

        chosen, target_next, rewards, active, next_active = [], [], [], [], []
        online, target = self.policies["online"]["q"], self.target["q"]
        first = batch["first"]
        for name in self.q:
            group = self.groups[name]
            obs = flat_obs(batch[f"obs/{name}"], group)
            nxt = flat_obs(batch[f"next_obs/{name}"], group)
            h = h_target = None
            if self.recurrent:
                h = h_target = batch[f"hidden/{name}"][:, 0]
                if start:
                    h = self._burn_in(online[name], obs[:, :start], h, first)
                    h_target = self._burn_in(target[name], obs[:, :start], h_target, first)
            obs, nxt, window = obs[:, start:], nxt[:, start:], first[:, start:]
            # The online net's next-step values only pick the actions of double Q.
            q, q_next_online = self._unroll(
                online[name], obs, nxt, h, window, now=True, after=cfg.double_q
            )
            _, q_next = self._unroll(target[name], obs, nxt, h_target, window, now=False)
            q, q_next = q.flatten(1, 2), q_next.flatten(1, 2)
            mask = batch.get(f"next_mask/{name}")
            pick = q_next_online.flatten(1, 2) if cfg.double_q else q_next
            pick = mask_logits(pick, None if mask is None else flat(mask))
            best = pick.argmax(-1, keepdim=True)
            target_next.append(q_next.gather(-1, best).squeeze(-1))
            chosen.append(q.gather(-1, flat(batch[f"action/{name}"]).unsqueeze(-1)).squeeze(-1))
            rewards.append(flat(batch[f"reward/{name}"]))
            active.append(flat(batch[f"active/{name}"]).to(q.dtype))
            next_active.append(flat(batch[f"next_active/{name}"]).to(q.dtype))
        a = torch.cat(active, -1)
        chosen = torch.cat(chosen, -1) * a
        target_next = torch.cat(target_next, -1) * torch.cat(next_active, -1)
        rewards = torch.cat(rewards, -1)
        keep = 1.0 - flat(batch["terminated"]).to(chosen.dtype)  # [S, X]
        discount = flat(batch["discount"])

        if cfg.mixing == "none":
            target_value = rewards + (discount * keep).unsqueeze(-1) * target_next
            error, weight = chosen - target_value.detach(), a
            taken = chosen
        else:
            team_reward = rewards.mean(-1)
            if self.mixer is not None:
                q_tot = self.mixer(chosen, flat(batch["state"]))
                with torch.no_grad():
                    next_tot = self.target["mixer"](target_next, flat(batch["next_state"]))
            else:
                q_tot, next_tot = chosen.sum(-1), target_next.sum(-1)
            error = q_tot - (team_reward + discount * keep * next_tot).detach()
            weight = (a.sum(-1) > 0).to(error.dtype)
            taken = q_tot
        with torch.no_grad():
            q_mean = masked_mean(taken, weight)
        return masked_mean(error**2, weight), q_mean
