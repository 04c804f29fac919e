"""MAPPO / IPPO: clipped-surrogate PPO for agent groups (config: `marlctl.algos.ppo`).

MAPPO (Yu et al. 2021) gives each group's critic the global state; IPPO (de Witt et al.
2020) gives it the agent's own observation. Both use GAE, value normalisation, a clipped
value loss with Huber error, entropy bonus and per-network gradient clipping, as the MAPPO
paper does. Rollouts, advantages and minibatches are `OnPolicyTrainer`'s; this module is
PPO's update.
"""

from __future__ import annotations

import torch

from marlctl.algos.ppo import PPOConfig
from marlctl.train.actions import masked_mean
from marlctl.train.onpolicy import OnPolicyTrainer
from marlctl.train.policies import GroupPolicy, Minibatch
from marlctl.train.rows import ON_POLICY


class PPOTrainer(OnPolicyTrainer):
    """`epochs` passes of `minibatches` clipped-surrogate steps over each rollout."""

    cfg: PPOConfig
    row_fields = ON_POLICY
    compacts = True

    def update(self, data: dict[str, dict]) -> dict[str, torch.Tensor]:
        """Each loss term per seed, `[S]`, averaged over the minibatches."""
        cfg, S = self.cfg, len(self.seeds)
        value_coef, entropy_coef = self.values.of("value_coef"), self.values.of("entropy_coef")
        keys = ("policy", "value", "entropy", "approx_kl", "clip_frac", "grad_norm")
        totals = {k: torch.zeros(S, device=self.device) for k in keys}
        updates = 0
        for _ in range(cfg.epochs):
            for idx in self.minibatches(data, cfg.minibatches):
                loss = torch.zeros(S, device=self.device)
                for name, pol in self.policies.items():
                    parts = self.group_loss(pol, self.evaluate(pol, data[name], idx))
                    loss = (
                        loss
                        + parts["policy"]
                        + value_coef * parts["value"]
                        - entropy_coef * parts["entropy"]
                    )
                    for key in ("policy", "value", "entropy", "approx_kl", "clip_frac"):
                        totals[key] += parts[key].detach() / len(self.policies)
                totals["grad_norm"] += self.step(loss)
                updates += 1
        return {k: v / max(updates, 1) for k, v in totals.items()}

    def group_loss(self, pol: GroupPolicy, mb: Minibatch) -> dict[str, torch.Tensor]:
        """Loss terms per seed, `[S]`, of one group's minibatch."""
        cfg = self.cfg

        def mean(x: torch.Tensor) -> torch.Tensor:
            return masked_mean(x, mb.active)

        log_ratio = mb.log_prob - mb.old_log_prob
        ratio = log_ratio.exp()
        limit = self.values.along("clip", ratio)
        surrogate = torch.min(ratio * mb.adv, ratio.clamp(1 - limit, 1 + limit) * mb.adv)
        clip = self.values.along("clip", mb.value) if cfg.value_clip else None
        value_loss = self.value_loss(mb.value, mb.old_value, mb.ret, clip)
        with torch.no_grad():
            approx_kl = mean((ratio - 1) - log_ratio)
            clip_frac = mean(((ratio - 1).abs() > limit).float())
        return {
            "policy": -mean(surrogate),
            "value": mean(value_loss),
            "entropy": mean(mb.entropy),
            "approx_kl": approx_kl,
            "clip_frac": clip_frac,
        }
