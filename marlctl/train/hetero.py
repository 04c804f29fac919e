"""HAPPO and HATRPO: heterogeneous-agent trust-region learning (config: `marlctl.algos.hetero`).

Zhong et al. 2024, "Heterogeneous-Agent Reinforcement Learning" (JMLR 25), as HARL's
`OnPolicyHARunner` runs it. Each iteration the agents update one after another in a random
order. Agent i_m's objective weights its advantage by the compounded ratio
M = prod_{j<m} pi_new^{i_j}(a^{i_j}|o) / pi_old^{i_j}(a^{i_j}|o) of the agents updated
before it, fixed while it updates:

- HAPPO: `epochs` passes of PPO's clipped surrogate, M * min(r A, clip(r) A);
- HATRPO: one natural-gradient step on M * r * A, sized so that the quadratic model of the
  KL reaches `kl_threshold` (conjugate gradient on Fisher-vector products), then a
  backtracking line search that keeps the first step whose KL is inside the bound and whose
  improvement is at least `accept_ratio` of the linear prediction; none: no step.

The centralised critic (one shared network per group, on the global state) trains after the
actors, `critic_epochs` passes. The unit that updates at once is an agent with its own
network (`model.sharing: independent`, the default here, as in HARL) or a group whose agents
share one, updated like a MAPPO group and passing on the product of its agents' ratios.

Rollouts and advantages are `OnPolicyTrainer`'s. Seeds trained as one batch each draw their
own order: at position m every seed updates its own m-th unit, a unit's forward pass runs
only that agent's network (`AgentNet.forward(copy=...)`), and `AgentAdam` moves only the
networks that updated, so no agent's Adam moments move while another one learns.
"""

from __future__ import annotations

import torch
from torch.distributions import Categorical, Normal, kl_divergence

from marlctl.algos.hetero import HAPPOConfig, HATRPOConfig, HeteroConfig
from marlctl.train.actions import TanhNormal, masked_mean
from marlctl.train.base import clip_grad_norm_per_seed
from marlctl.train.core import AgentAdam, adam, select_copy
from marlctl.train.onpolicy import OnPolicyTrainer, set_lr
from marlctl.train.policies import GroupPolicy, entropy, log_prob


def pick_agent(x: torch.Tensor, copy: torch.Tensor, dim: int) -> torch.Tensor:
    """Agent `copy[s]` of each seed along `dim` of x `[S, ...]`, kept as a dim of size 1."""
    shape = [-1] + [1] * (x.dim() - 1)
    index = copy.view(shape).expand(*x.shape[:dim], 1, *x.shape[dim + 1 :])
    return x.gather(dim, index)


def policy_kl(old, new) -> torch.Tensor:
    """KL(old || new) per agent, summed over action dimensions (tanh_normal: the Gaussians',
    which the squash, a bijection, leaves unchanged)."""
    if isinstance(old, Categorical):
        p, log_p, log_q = old.probs, old.logits, new.logits
        return torch.where(p > 0, p * (log_p - log_q), 0.0).sum(-1)
    if isinstance(old, TanhNormal):
        old, new = old.base, new.base
    return kl_divergence(old, new).sum(-1)


def detached(dist):
    """A copy of a policy distribution that no gradient flows through."""
    if isinstance(dist, Categorical):
        return Categorical(logits=dist.logits.detach())
    if isinstance(dist, TanhNormal):
        return TanhNormal(dist.base.loc.detach(), dist.base.scale.detach(), dist.bounds)
    return Normal(dist.loc.detach(), dist.scale.detach())


def units_of(actors) -> list[tuple[int, int | None]]:
    """(group index, copy) of every unit of the update order, given each group's actor
    `AgentNet`: an agent with its own network, or a group with one shared network (None)."""
    out = []
    for index, actor in enumerate(actors):
        copies = actor.copies
        out += [(index, None)] if copies == 1 else [(index, k) for k in range(copies)]
    return out


def draw_order(trainer, count: int, fixed: bool) -> torch.Tensor:
    """Each seed's update order `[S, count]`, from its own stream (a permutation by sorted
    random keys: no host sync); `fixed`: 0, 1, ... for every seed."""
    S = len(trainer.seeds)
    if fixed:
        return torch.arange(count, device=trainer.device).expand(S, count)
    return trainer.noise(torch.Size((S, count)), normal=False).argsort(-1)


def positions(trainer, actors, fixed: bool):
    """The update order: per position, per group `(index, on, copy)` with `on` `[S]` the seeds
    whose unit there is in that group and `copy` `[S]` its agent (None: a shared network)."""
    units = units_of(actors)
    groups = torch.tensor([g for g, _ in units], device=trainer.device)
    copies = torch.tensor([k or 0 for _, k in units], device=trainer.device)
    order = draw_order(trainer, len(units), fixed)
    for position in range(len(units)):
        chosen = order[:, position]
        entries = []
        for index, actor in enumerate(actors):
            on = groups[chosen] == index
            copy = None if actor.copies == 1 else torch.where(on, copies[chosen], 0)
            entries.append((index, on, copy))
        yield entries


class Unit:
    """One position of the update order for one group: which seeds update an agent of this
    group there (`on` `[S]`), which copy of the group's networks (`copy` `[S]`; None: the
    group's one shared network, all its agents), and the parameters that step."""

    def __init__(
        self,
        params: list[torch.Tensor],
        on: torch.Tensor,
        copy: torch.Tensor | None,
        pol: GroupPolicy | None = None,
    ):
        self.params, self.on, self.copy, self.pol = params, on, copy, pol
        self.weight = on.to(torch.float32)
        # The copy of every parameter the unit owns (a shared network's only one: 0).
        self.index = copy if copy is not None else torch.zeros_like(on, dtype=torch.long)
        # The copies each seed's step moves, `[S, copies]` per parameter (`AgentAdam`).
        self.moved = {}
        by_copies: dict[int, torch.Tensor] = {}  # a network's parameters share their copies
        for p in params:
            if p.shape[1] not in by_copies:
                mine = torch.arange(p.shape[1], device=p.device) == self.index.unsqueeze(1)
                by_copies[p.shape[1]] = on.unsqueeze(1) & mine
            self.moved[p] = by_copies[p.shape[1]]

    def flat(self, tensors) -> torch.Tensor:
        """This unit's slice of per-parameter tensors, `[S, N]` (a seed's row: its agent)."""
        return torch.cat([select_copy(t, self.index).flatten(1) for t in tensors], 1)

    @torch.no_grad()
    def assign(self, values: torch.Tensor, where: torch.Tensor) -> None:
        """Write `values` `[S, N]` into this unit's slice of its parameters, for the seeds
        `where` marks."""
        S, offset = values.shape[0], 0
        rows = torch.arange(S, device=values.device)
        for p in self.params:
            old = select_copy(p, self.index)
            size = old[0].numel()
            new = values[:, offset : offset + size].view_as(old)
            offset += size
            new = torch.where(where.view(S, *([1] * (old.dim() - 1))), new, old)
            if p.shape[1] == 1:
                p.copy_(new)
            else:
                p[rows, self.index] = new.squeeze(1)


class HeteroTrainer(OnPolicyTrainer):
    """The sequential update shared by HAPPO and HATRPO; `update_unit` is each one's step."""

    cfg: HeteroConfig
    critic_sharing = "shared"  # one critic per group, as HARL's single V
    captured_by_default = False

    def make_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        cfg = self.cfg
        self.critic_optimizer = adam(self.critic_params, cfg.critic_lr or cfg.lr, cfg.adam_eps)
        return {"critic": self.critic_optimizer}

    def _set_lr(self, index: int, value: float) -> None:
        if index == 1:
            set_lr(self.critic_optimizer.param_groups[0], value)

    # ------------------------------------------------------------ units

    def unit_data(self, d: dict, copy: torch.Tensor | None) -> dict:
        """Group data `d` cut to agent `copy[s]` of each seed (None: every agent)."""
        if copy is None:
            return d
        agent = d["active"].dim() - 1

        def cut(x):
            return None if x is None else pick_agent(x, copy, agent)

        out = {k: cut(d[k]) for k in ("actor_in", "actions", "log_probs", "masks", "active")}
        out["adv"], out["first"] = cut(d["adv"]), d["first"]
        out["hidden"] = None if d["hidden"] is None else (pick_agent(d["hidden"][0], copy, 2),)
        return out

    def unit_policy(self, unit: Unit, ud: dict, idx: torch.Tensor | None):
        """The unit's action distribution on minibatch `idx`, and the log-probability of its
        stored actions under it."""
        take, flat = self.rows(idx)
        mask = None if ud["masks"] is None else flat(take(ud["masks"]))
        dist = self.actor_forward(unit.pol, ud, take, mask, unit.copy)
        return dist, log_prob(dist, flat(take(ud["actions"])), unit.pol.group.discrete)

    # ------------------------------------------------------------ one iteration

    def update(self, data: dict[str, dict]) -> dict[str, torch.Tensor]:
        pols = list(self.policies.values())
        actors = [pol.actor for pol in pols]
        first = next(iter(data.values()))["active"]
        factor = torch.ones(first.shape[:-1], device=self.device)  # M per sample
        totals: dict[str, torch.Tensor] = {}
        count = len(units_of(actors))
        for position in positions(self, actors, self.cfg.fixed_order):
            gain = torch.zeros_like(factor)  # log of this position's ratio product
            # Every group steps at every position, with zero weight in the seeds whose unit
            # is elsewhere: a seed draws the same random numbers batched as alone.
            for index, on, copy in position:
                pol = pols[index]
                params = list(pol.actor.parameters())
                params += [pol.log_std] if pol.log_std is not None else []
                unit = Unit(params, on, copy, pol)
                ud = self.unit_data(data[pol.group.name], copy)
                for key, value in self.update_unit(unit, ud, factor).items():
                    totals[key] = totals.get(key, 0) + value * unit.weight / count
                on_rows = unit.weight.view(-1, *([1] * (factor.dim() - 1)))
                gain = gain + self.log_ratio(unit, ud) * on_rows
            factor = factor * gain.exp()
        totals.update(self.update_critics(data))
        return totals

    @torch.no_grad()
    def log_ratio(self, unit: Unit, ud: dict) -> torch.Tensor:
        """log pi_new / pi_old of the unit's actions on every sample, summed over its agents
        that act, in the layout of the factor."""
        _, new = self.unit_policy(unit, ud, None)
        _, flat = self.rows(None)
        diff = (new - flat(ud["log_probs"])) * flat(ud["active"])
        return diff.sum(-1).view(ud["active"].shape[:-1])

    def update_unit(self, unit: Unit, ud: dict, factor: torch.Tensor) -> dict[str, torch.Tensor]:
        """Update one unit's actor against the compounded ratio `factor` of the units before
        it; its diagnostics per seed `[S]`."""
        raise NotImplementedError

    def update_critics(self, data: dict[str, dict]) -> dict[str, torch.Tensor]:
        """`critic_epochs` passes of the value loss over the rollout, every group at once."""
        cfg, S = self.cfg, len(self.seeds)
        total, grad, steps = torch.zeros(S, device=self.device), 0, 0
        for _ in range(cfg.critic_epochs):
            for idx in self.minibatches(data, cfg.minibatches):
                loss = torch.zeros(S, device=self.device)
                for name, pol in self.policies.items():
                    loss = loss + self.group_value_loss(pol, data[name], idx)
                self.critic_optimizer.zero_grad(set_to_none=True)
                (cfg.value_coef * loss).sum().backward()
                grad = grad + clip_grad_norm_per_seed(self.critic_params, cfg.max_grad_norm, S)
                self.critic_optimizer.step()
                total, steps = total + loss.detach(), steps + 1
        return {"value": total / steps, "critic_grad_norm": grad / steps}

    def group_value_loss(self, pol: GroupPolicy, d: dict, idx: torch.Tensor | None):
        """One group's value loss per seed on minibatch `idx`."""
        cfg = self.cfg
        take, flat = self.rows(idx)
        value = self.critic_forward(pol, d, take)
        ret, old = flat(take(d["ret"])), flat(take(d["values"]))
        if cfg.value_norm:
            ret = pol.value_norm.normalize(ret)
        loss = self.value_loss(value, old, ret, cfg.clip if cfg.value_clip else None)
        return masked_mean(loss, flat(take(d["active"])))


class HAPPOTrainer(HeteroTrainer):
    """HAPPO: each unit takes `epochs` × `minibatches` clipped-surrogate Adam steps."""

    cfg: HAPPOConfig

    def make_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        optimizers = super().make_optimizers()
        self.actor_optimizer = AgentAdam(self.actor_params, self.cfg.lr, self.cfg.adam_eps)
        return {"actor": self.actor_optimizer, **optimizers}

    def _set_lr(self, index: int, value: float) -> None:
        if index == 0:
            set_lr(self.actor_optimizer.param_groups[0], value)
        super()._set_lr(index, value)

    def update_unit(self, unit: Unit, ud: dict, factor: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg, S = self.cfg, len(self.seeds)
        keys = ("policy", "entropy", "approx_kl", "clip_frac", "grad_norm")
        sums = {k: torch.zeros(S, device=self.device) for k in keys}
        steps = 0
        for _ in range(cfg.epochs):
            for idx in self.minibatches({"unit": ud}, cfg.minibatches):
                take, flat = self.rows(idx)
                dist, new = self.unit_policy(unit, ud, idx)
                active, adv = flat(take(ud["active"])), flat(take(ud["adv"]))
                log_ratio = new - flat(take(ud["log_probs"]))
                ratio = log_ratio.exp()
                clipped = ratio.clamp(1 - cfg.clip, 1 + cfg.clip)
                weight = flat(take(factor)).unsqueeze(-1)
                policy = -masked_mean(weight * torch.min(ratio * adv, clipped * adv), active)
                ent = masked_mean(entropy(dist, unit.pol.group.discrete, self.noise), active)
                loss = unit.weight * (policy - cfg.entropy_coef * ent)
                self.actor_optimizer.zero_grad(set_to_none=True)
                loss.sum().backward()
                grad = clip_grad_norm_per_seed(unit.params, cfg.max_grad_norm, S)
                self.actor_optimizer.step(unit.moved)
                self.after_update()
                with torch.no_grad():
                    sums["policy"] += policy
                    sums["entropy"] += ent
                    sums["approx_kl"] += masked_mean((ratio - 1) - log_ratio, active)
                    sums["clip_frac"] += masked_mean(((ratio - 1).abs() > cfg.clip).float(), active)
                    sums["grad_norm"] += grad
                steps += 1
        return {k: v.detach() / steps for k, v in sums.items()}


class HATRPOTrainer(HeteroTrainer):
    """HATRPO: each unit takes one KL-bounded natural-gradient step with a line search."""

    cfg: HATRPOConfig

    def update_unit(self, unit: Unit, ud: dict, factor: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg, S = self.cfg, len(self.seeds)
        _, flat = self.rows(None)
        active, adv = flat(ud["active"]), flat(ud["adv"])
        old_log_prob, weight = flat(ud["log_probs"]), flat(factor).unsqueeze(-1)
        discrete = unit.pol.group.discrete
        draws: dict[tuple, torch.Tensor] = {}  # one entropy sample, the same at every point

        def noise(shape, normal):
            return draws.setdefault(tuple(shape), self.noise(shape, normal=normal))

        def surrogate():
            dist, new = self.unit_policy(unit, ud, None)
            value = masked_mean(weight * (new - old_log_prob).exp() * adv, active)
            if cfg.entropy_coef:
                value = value + cfg.entropy_coef * masked_mean(
                    entropy(dist, discrete, noise), active
                )
            return dist, value

        dist, before = surrogate()
        grad = unit.flat(
            torch.autograd.grad((unit.weight * before).sum(), unit.params, retain_graph=True)
        )
        old = detached(dist)
        # The KL's gradient at the current policy, kept differentiable: Hessian-vector
        # products (the Fisher's) are its gradients along v.
        kl_grad = unit.flat(
            torch.autograd.grad(
                (unit.weight * masked_mean(policy_kl(old, dist), active)).sum(),
                unit.params,
                create_graph=True,
            )
        )

        def fisher(v: torch.Tensor) -> torch.Tensor:
            hv = torch.autograd.grad((kl_grad * v).sum(), unit.params, retain_graph=True)
            return unit.flat(hv) + cfg.cg_damping * v

        direction = conjugate_gradient(fisher, grad, cfg.cg_steps)
        curvature = (direction * fisher(direction)).sum(-1, keepdim=True)
        step = direction * (2 * cfg.kl_threshold / curvature.clamp_min(1e-12)).sqrt()
        expected = (grad * step).sum(-1)
        start = unit.flat([p.detach() for p in unit.params])
        accepted = torch.zeros(S, dtype=torch.bool, device=self.device)
        fraction, kl = 1.0, torch.zeros(S, device=self.device)
        with torch.no_grad():
            for _ in range(cfg.line_search_steps):
                pending = unit.on & ~accepted
                unit.assign(start + fraction * step, pending)
                dist, after = surrogate()
                trial_kl = masked_mean(policy_kl(old, dist), active)
                gain = after - before.detach()
                good = (trial_kl < cfg.kl_threshold) & (gain > 0)
                good &= gain > cfg.accept_ratio * fraction * expected
                kl = torch.where(pending, trial_kl, kl)
                accepted |= pending & good
                fraction *= cfg.backtrack_coef
            unit.assign(start, unit.on & ~accepted)  # no acceptable step: keep the policy
        self.after_update()
        return {
            "policy": -before.detach(),
            "approx_kl": torch.where(accepted, kl, 0.0),
            "accepted": accepted.float(),
            "grad_norm": grad.norm(dim=-1),
        }


def conjugate_gradient(product, b: torch.Tensor, steps: int, tol: float = 1e-10) -> torch.Tensor:
    """x with product(x) = b, per seed (rows of `b` `[S, N]`): `steps` conjugate-gradient
    iterations (OpenAI Baselines' `cg`), a seed stopping once its residual is below `tol`."""
    x, r, p = torch.zeros_like(b), b.clone(), b.clone()
    rr = (r * r).sum(-1, keepdim=True)
    for _ in range(steps):
        ap = product(p)
        alpha = rr / (p * ap).sum(-1, keepdim=True).clamp_min(1e-20)
        alpha = torch.where(rr < tol, 0.0, alpha)
        x = x + alpha * p
        r = r - alpha * ap
        new = (r * r).sum(-1, keepdim=True)
        p = r + (new / rr.clamp_min(1e-20)) * p
        rr = new
    return x
