"""Template: the trainer of a new on-policy algorithm (copy to `marlctl/train/<name>.py`).

`OnPolicyTrainer` collects the rollouts, estimates advantages (GAE, standardised per seed)
and keeps the networks, optimiser, recurrent states and checkpoints. An algorithm writes
only `update`: what to learn from one rollout. Every tensor is seed first, `[S, ...]`:
seeds trained as one batch share no parameter, and each loss is per seed.
"""

from __future__ import annotations

import torch

from marlctl.train.actions import masked_mean
from marlctl.train.onpolicy import OnPolicyTrainer


class PGTrainer(OnPolicyTrainer):
    def update(self, data: dict[str, dict]) -> dict[str, torch.Tensor]:
        """One gradient step on the whole rollout; the logged loss terms, each `[S]`."""
        cfg, S = self.cfg, len(self.seeds)
        # ---- ALGO LOGIC: the rest of this method is the algorithm
        (idx,) = self.minibatches(data, 1)  # every sample, in one minibatch
        loss = torch.zeros(S, device=self.device)
        terms = {k: torch.zeros(S, device=self.device) for k in ("policy", "value", "entropy")}
        for name, pol in self.policies.items():
            mb = self.evaluate(pol, data[name], idx)  # this group's samples, `[S, B, n]`
            policy = -masked_mean(mb.log_prob * mb.adv, mb.active)
            value = masked_mean(self.value_error(mb.ret - mb.value), mb.active)
            entropy = masked_mean(mb.entropy, mb.active)
            loss = loss + policy + cfg.value_coef * value - cfg.entropy_coef * entropy
            for key, term in (("policy", policy), ("value", value), ("entropy", entropy)):
                terms[key] += term.detach() / len(self.policies)
        grad_norm = self.step(loss)  # backward, per-seed clipping, optimiser step
        # ---- end of ALGO LOGIC
        return terms | {"grad_norm": grad_norm}
