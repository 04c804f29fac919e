"""MASAC: multi-agent soft actor-critic with centralised twin critics (config: `algos.masac`).

Each agent maximises its own reward plus the entropy of its policy (Haarnoja et al. 2018,
"Soft Actor-Critic Algorithms and Applications"). Per agent group: a stochastic actor on
the agent's observation, two Q critics on the global state and every agent's action
(centralised as in MADDPG, Lowe et al. 2017) with Polyak-averaged targets, the smaller of
the two in every target (clipped double Q), and a temperature per group tuned towards a
target entropy. Critics are one per agent unless `algo.share_critic`; actors follow
`model.sharing`. An actor's Q takes the other agents' stored actions, or with
`algo.actor_joint_action: current` every agent's fresh sample (TorchRL's SACLoss).

Continuous actions: a tanh-squashed Gaussian, reparameterised; log-probabilities are those
of the action in [-1, 1] (what the critics see), so the target entropy -A does not depend
on the env's bounds. Discrete actions (Christodoulou 2019, "Soft Actor-Critic for Discrete
Action Settings"): the critic head gives Q of each of the agent's own actions, its own
slot of the joint-action input being zeros, and the soft value, the actor loss and the
temperature loss are exact expectations over the policy's probabilities.

Targets bootstrap through a time limit but never through a termination, nor for an agent
that is gone at the next step. Every loss is per seed, `[S]`: seeds trained as one batch
share no parameter and draw from their own generators.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from marlctl.algos.masac import MASACConfig
from marlctl.envs.batch import Observation
from marlctl.train.actions import flat_obs, masked_log_softmax, masked_mean, tanh_log_det
from marlctl.train.base import TrainerSetup, freeze
from marlctl.train.core import adam, per_seed
from marlctl.train.offpolicy import OffPolicyTrainer

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0

# ---------------------------------------------------------------- policy helpers


def squash(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor):
    """tanh(u) in [-1, 1] and its log-probability, u ~ N(mean, std) (SAC's appendix C)."""
    gaussian = -0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    return torch.tanh(u), (gaussian - tanh_log_det(u)).sum(-1)


# ---------------------------------------------------------------- trainer


class MASACTrainer(OffPolicyTrainer):
    """Actors, twin critics and a temperature per agent group (`model.sharing` applies).

    Losses per seed: `critic` is both critics' squared soft TD error, `actor` the policy
    loss, `alpha` the temperature loss, each summed over groups; `entropy` is the groups'
    mean policy entropy; `grad_norm` the critics' gradient norm before clipping.
    """

    loss_keys = ("critic", "actor", "alpha", "entropy", "grad_norm")

    def __init__(self, setup: TrainerSetup):
        config: MASACConfig = setup.config
        model, info = setup.model, setup.info
        # `centralised` is always true here; `total_iterations` has no schedule to drive.
        if model.recurrent is not None:
            raise ValueError("masac trains on single transitions: set model.recurrent: null")
        super().__init__(setup)
        S = len(self.seeds)
        self.groups = {g.name: g for g in info.groups}
        # Width of each agent's slot in the joint action: a one-hot, or the action vector.
        joint = sum(g.n_agents * g.n_actions for g in info.groups)
        self.actors = nn.ModuleDict()
        self.critics = nn.ModuleDict()
        for g in info.groups:
            out = g.n_actions if g.discrete else 2 * g.n_actions
            # Small initial outputs: near-uniform logits, or mean 0 and std 1 before tanh.
            self.actors[g.name] = self.agent_net(g, g.obs_dim, out, out_gain=0.01, observes=True)
            q_out = g.n_actions if g.discrete else 1
            # The twin critics are one ensemble of two: one batched call evaluates both.
            self.critics[g.name] = self.agent_net(
                g, info.state_dim + joint, q_out, ensemble=2,
                sharing=None if config.share_critic else "independent",
            )  # fmt: skip
        self.target = copy.deepcopy(self.critics).requires_grad_(False)
        log_alpha = torch.full((S, len(info.groups)), math.log(config.initial_alpha))
        self.log_alpha = nn.Parameter(log_alpha, requires_grad=config.autotune)
        self.policies = nn.ModuleDict(
            {
                "actor": self.actors,
                "critic": self.critics,
                "target": self.target,
                "temperature": nn.ParameterDict({"log_alpha": self.log_alpha}),
            }
        ).to(self.device)
        self.actor_params = list(self.actors.parameters())
        self.critic_params = list(self.critics.parameters())
        self.optimizers = {
            "actor": adam(self.actor_params, config.lr, config.adam_eps),
            "critic": adam(self.critic_params, config.critic_lr, config.adam_eps),
        }
        if config.autotune:
            self.optimizers["alpha"] = adam([self.log_alpha], config.alpha_lr, config.adam_eps)

    # ------------------------------------------------------------ policies

    def policy(self, name: str, obs: torch.Tensor, mask: torch.Tensor | None, copy=None):
        """Discrete: (probs, log_probs); continuous: (mean, log_std), each `[S, ..., n, A]`
        (`copy`: one agent's network per seed, `AgentNet.forward`)."""
        out, _ = self.actors[name](obs, copy=copy)
        if self.groups[name].discrete:
            return masked_log_softmax(out, mask)
        mean, log_std = out.chunk(2, -1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, name: str, dist: tuple[torch.Tensor, torch.Tensor]):
        """One action per agent from the seeds' own generators: discrete: (action, one-hot);
        continuous: (action in [-1, 1], its log-probability), reparameterised."""
        if self.groups[name].discrete:
            action = self.sample_categorical(dist[0])
            return action, F.one_hot(action, dist[0].shape[-1]).to(dist[0].dtype)
        mean, log_std = dist
        u = mean + log_std.exp() * self.noise(mean.shape, normal=True)
        return squash(u, mean, log_std)

    # ------------------------------------------------------------ acting

    def explore(self, ob: Observation, first: torch.Tensor):
        if self.env_steps < self.cfg.learning_starts:
            # SAC's warm-up: uniform over the allowed actions or the action box.
            actions = {
                name: self.random_action(g, ob.masks[name], ob.obs[name].shape[:3])
                for name, g in self.groups.items()
            }
            return actions, {}
        return self.act_step(ob, deterministic=False, first=first), {}

    def act_step(self, ob: Observation, deterministic: bool, first: torch.Tensor | None):
        actions = {}
        for name, g in self.groups.items():
            dist = self.policy(name, flat_obs(ob.obs[name], g), ob.masks[name])
            if g.discrete:
                action = dist[0].argmax(-1) if deterministic else self.sample(name, dist)[0]
            else:
                action = torch.tanh(dist[0]) if deterministic else self.sample(name, dist)[0]
                action = self.bounds[name].to_env(action)
            actions[name] = action
        return actions

    # ------------------------------------------------------------ critic inputs

    def critic_input(
        self,
        name: str,
        state: torch.Tensor,
        joint: dict[str, torch.Tensor],
        own: torch.Tensor,
    ) -> torch.Tensor:
        """`[S, X, n, state + joint]` for the agents of group `name`: the global state and
        every agent's action slot (`joint`, per group `[S, X, n_g, w_g]`), the agent's own
        slot holding `own` `[S, X, n, w]` instead."""
        n = self.groups[name].n_agents
        blocks = [state.unsqueeze(-2).expand(*state.shape[:-1], n, -1)]
        for other, actions in joint.items():
            agents = actions.unsqueeze(-3)  # [S, X, 1, n_g, w]: the same for every row
            if other == name:
                # Row i, slot k: `own[i]` where k == i, else agent k's action.
                eye = torch.eye(n, dtype=torch.bool, device=state.device).unsqueeze(-1)
                block = torch.where(eye, own.unsqueeze(-2), agents)
            else:
                block = agents.expand(*actions.shape[:-2], n, *actions.shape[-2:])
            blocks.append(block.flatten(-2))
        return torch.cat(blocks, -1)

    def q_values(
        self,
        net,
        name: str,
        state: torch.Tensor,
        joint: dict[str, torch.Tensor],
        own: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Both critics of `net` for group `name`'s agents, `[S, X, n, 2, out]`; `own` as in
        `critic_input`, None = each agent's own action as `joint` holds it. Then every
        agent's input is the same, and a critic that gives every agent the same output
        runs once per sample."""
        if own is None and net.same_for_every_agent:
            x = torch.cat([state, *(actions.flatten(-2) for actions in joint.values())], -1)
            return net.every_member_once(x)
        own = joint[name] if own is None else own
        return net.every_member(self.critic_input(name, state, joint, own))

    # ------------------------------------------------------------ update

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        critic_loss = self.critic_loss(batch)
        self.optimizers["critic"].zero_grad(set_to_none=True)
        critic_loss.sum().backward()  # seeds share no parameter
        grad = self.clip_gradients(self.critic_params)
        self.optimizers["critic"].step()

        # Actors against the updated critics; temperatures.
        freeze(self.critic_params, True)  # the actor loss trains the actors only
        actor_loss, alpha_loss, entropy = self.update_actors(batch)
        freeze(self.critic_params, False)
        self.update_targets([(self.target, self.critics)])
        return {
            "critic": critic_loss.detach(),
            "actor": actor_loss.detach(),
            "alpha": alpha_loss.detach(),
            "entropy": entropy,
            "grad_norm": grad,
        }

    compiled_regions = ("critic_loss", "actor_losses")

    def critic_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Both critics regress on the soft Bellman target (next actions from the current
        policies, the smaller target Q) at the stored joint action: their loss per seed."""
        S = len(self.seeds)
        b = flat_batch(batch)
        alpha, active, _, taken = self.actor_inputs(b)
        keep = 1.0 - b["terminated"].float()  # [S, X]
        with torch.no_grad():
            dists, samples = {}, {}
            for name, g in self.groups.items():
                next_obs = flat_obs(b[f"next_obs/{name}"], g)
                dists[name] = self.policy(name, next_obs, b.get(f"next_mask/{name}"))
                samples[name] = self.sample(name, dists[name])
            # Other agents' next actions enter as samples (one-hot for discrete groups): the
            # critics were trained on taken actions, never on probability vectors.
            joint = {
                name: s[1] if self.groups[name].discrete else s[0] for name, s in samples.items()
            }
            targets = {}
            for index, (name, g) in enumerate(self.groups.items()):
                a = per_seed(alpha[:, index], active[name])
                own = torch.zeros_like(joint[name]) if g.discrete else None
                q = self.q_values(self.target[name], name, b["next_state"], joint, own).amin(-2)
                if g.discrete:  # expectation over the agent's own next action
                    probs, log_probs = dists[name]
                    value = (probs * (q - a.unsqueeze(-1) * log_probs)).sum(-1)
                else:
                    value = q.squeeze(-1) - a * samples[name][1]
                bootstrap = keep.unsqueeze(-1) * b[f"next_active/{name}"].float()
                targets[name] = (
                    b[f"reward/{name}"] + b["discount"].unsqueeze(-1) * bootstrap * value
                )
        critic_loss = torch.zeros(S, device=self.device)
        for name, g in self.groups.items():
            own = torch.zeros_like(taken[name]) if g.discrete else None
            q = self.q_values(self.critics[name], name, b["state"], taken, own)
            if g.discrete:  # [S, X, n, 2, A] -> the taken action's
                index = b[f"action/{name}"][..., None, None].expand(*q.shape[:-1], 1)
                q = q.gather(-1, index)
            error = (q.squeeze(-1) - targets[name].unsqueeze(-1)) ** 2
            critic_loss = critic_loss + masked_mean(error.sum(-1), active[name])
        return critic_loss

    def actor_inputs(self, b: dict[str, torch.Tensor]):
        """From a flat batch (`flat_batch`): the temperatures `[S, G]` (detached), and per
        group the active flags, flat observations and taken actions as critics take them."""
        alpha = self.log_alpha.detach().exp()
        active = {name: b[f"active/{name}"].float() for name in self.groups}
        obs = {name: flat_obs(b[f"obs/{name}"], g) for name, g in self.groups.items()}
        taken = {
            name: self.critic_action(g, b[f"action/{name}"]) for name, g in self.groups.items()
        }
        return alpha, active, obs, taken

    def update_actors(self, batch: dict[str, torch.Tensor]):
        """One step of every actor against the critics, the other agents' actions as stored
        or, with `actor_joint_action: current`, drawn from their current policies, and of the
        temperatures; the actor loss, the temperature loss and the policies' entropy, per
        seed."""
        actor_loss, alpha_loss, entropy = self.actor_losses(batch)
        self.optimizers["actor"].zero_grad(set_to_none=True)
        total = actor_loss.sum()
        if self.cfg.autotune:
            # One backward for both: they share no parameter (the actor loss reads alpha
            # detached, the temperature loss the entropy detached), and a compiled region's
            # saved tensors serve a single backward.
            self.optimizers["alpha"].zero_grad(set_to_none=True)
            total = total + alpha_loss.sum()
        total.backward()
        self.clip_gradients(self.actor_params)
        self.optimizers["actor"].step()
        if self.cfg.autotune:
            self.optimizers["alpha"].step()
        return actor_loss, alpha_loss, entropy

    def step_temperature(self, alpha_loss: torch.Tensor) -> None:
        """A gradient step of the temperatures on their loss (`autotune`)."""
        if self.cfg.autotune:
            self.optimizers["alpha"].zero_grad(set_to_none=True)
            alpha_loss.sum().backward()
            self.optimizers["alpha"].step()

    def actor_losses(self, batch: dict[str, torch.Tensor]):
        """`update_actors`' three losses, the actor loss with gradient."""
        S = len(self.seeds)
        b = flat_batch(batch)
        alpha, active, obs, taken = self.actor_inputs(b)
        masks = {name: b.get(f"mask/{name}") for name in self.groups}
        joint, drawn = taken, dict.fromkeys(self.groups)
        if self.cfg.actor_joint_action == "current":
            for name in self.groups:
                dist = self.policy(name, obs[name], masks[name])
                drawn[name] = dist, self.sample(name, dist)
            # Continuous samples are reparameterised: each actor's gradient runs through
            # every agent's action. A discrete one-hot carries no gradient.
            joint = {
                name: sample[1] if self.groups[name].discrete else sample[0]
                for name, (_, sample) in drawn.items()
            }
        actor_loss = torch.zeros(S, device=self.device)
        alpha_loss = torch.zeros(S, device=self.device)
        entropy = torch.zeros(S, device=self.device)
        for index, name in enumerate(self.groups):
            loss, h, target = self.policy_loss(
                name, alpha[:, index], obs[name], masks[name], b["state"], joint,
                drawn=drawn[name],
            )  # fmt: skip
            actor_loss = actor_loss + masked_mean(loss, active[name])
            alpha_loss = alpha_loss + self.temperature_loss(index, h, target, active[name])
            entropy = entropy + masked_mean(h, active[name]) / len(self.groups)
        return actor_loss, alpha_loss, entropy

    def policy_loss(
        self,
        name: str,
        alpha: torch.Tensor,
        obs: torch.Tensor,
        mask: torch.Tensor | None,
        state: torch.Tensor,
        joint: dict[str, torch.Tensor],
        copy: torch.Tensor | None = None,
        drawn: tuple | None = None,
    ):
        """Group `name`'s soft policy loss per agent `[S, X, n]` against its critics, the
        other agents' actions from `joint`; the policy's entropy (detached) and the
        temperature's target entropy. `copy` `[S]`: agent `copy[s]` alone (obs and mask of
        that agent, `[S, X, 1, ...]`; loss `[S, X, 1]`). `drawn`: the group's policy and
        its sample (`sample`), already in `joint`; None = drawn here."""
        g = self.groups[name]
        a = per_seed(alpha, obs)
        dist = self.policy(name, obs, mask, copy) if drawn is None else drawn[0]
        critics = self.critics[name]
        if g.discrete:
            probs, log_probs = dist
            with torch.no_grad():  # Q does not depend on the policy here
                own = torch.zeros_like(joint[name])
                q = self.pick(self.q_values(critics, name, state, joint, own).amin(-2), copy)
            loss = (probs * (a * log_probs - q)).sum(-1)
            h = -(probs * log_probs).sum(-1).detach()
            # Max entropy is log(allowed actions): a fixed log(n) could be out of reach.
            allowed = math.log(g.n_actions) if mask is None else mask.sum(-1).clamp_min(1).log()
            return loss, h, self.cfg.target_entropy_scale * allowed
        if drawn is None:
            action, log_prob = self.sample(name, dist)
            own = action.expand_as(joint[name]) if copy is not None else action
        else:
            (_, log_prob), own = drawn[1], None
        q = self.pick(self.q_values(critics, name, state, joint, own).amin(-2), copy)
        return a.squeeze(-1) * log_prob - q.squeeze(-1), -log_prob.detach(), -float(g.n_actions)

    @staticmethod
    def pick(x: torch.Tensor, copy: torch.Tensor | None) -> torch.Tensor:
        """Agent `copy[s]`'s row of x `[S, X, n, ...]` (None: every row)."""
        if copy is None:
            return x
        index = copy.view(-1, 1, 1, *([1] * (x.dim() - 3)))
        return x.gather(2, index.expand(*x.shape[:2], 1, *x.shape[3:]))

    def temperature_loss(self, index: int, h: torch.Tensor, target, active: torch.Tensor):
        """d/d alpha of alpha * (H - target): alpha falls while the entropy is above target."""
        temperature = per_seed(self.log_alpha[:, index].exp(), h)
        return masked_mean(temperature * (h - target), active)

    def schedules(self) -> dict[str, torch.Tensor]:
        return {"train/alpha": self.log_alpha.detach().exp().mean(1)}


def flat_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sampled fields `[S, L, B, ...]` as `[S, L * B, ...]`."""
    return {k: v.flatten(1, 2) for k, v in batch.items()}
