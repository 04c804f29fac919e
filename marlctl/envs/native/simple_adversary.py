"""simple_adversary (mpe2 `simple_adversary_v3`): N good agents hide the goal from 1 adversary.

One of the N landmarks is the goal; the good agents know which, the adversary does not.
Reward: the adversary gets minus its distance to the goal; every good agent gets minus the
nearest good agent's distance to the goal plus the adversary's distance to it.
Observation: good agents [goal - pos, landmarks - pos, other agents - pos]; the adversary
[landmarks - pos, other agents - pos]. `num_landmark_neighbors` / `num_agent_neighbors`
keep only the nearest landmarks / agents, nearest first and zero-padded (never the goal).
"""

from __future__ import annotations

from typing import Any

import torch

from marlctl.envs.native.mpe import Body, Layout, MPEWorld

ADVERSARIES = 1


class SimpleAdversary(MPEWorld):
    env_id = "mpe/simple_adversary"

    def build(
        self,
        N: int = 2,
        num_agent_neighbors: int | None = None,
        num_landmark_neighbors: int | None = None,
    ) -> Layout:
        for key, value in (
            ("num_agent_neighbors", num_agent_neighbors),
            ("num_landmark_neighbors", num_landmark_neighbors),
        ):
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{key} must be a positive integer or None")
        self.N = N
        self.agent_k, self.landmark_k = num_agent_neighbors, num_landmark_neighbors
        names = [f"adversary_{i}" for i in range(ADVERSARIES)] + [f"agent_{i}" for i in range(N)]
        agents = [Body(name, size=0.15, movable=True, collide=False) for name in names]
        landmarks = [Body(f"landmark {i}", size=0.08, collide=False) for i in range(N)]
        seen_landmarks = N if num_landmark_neighbors is None else num_landmark_neighbors
        seen_agents = N if num_agent_neighbors is None else num_agent_neighbors
        adversary_dim = 2 * seen_landmarks + 2 * seen_agents
        obs_dims = {
            a.name: adversary_dim + (0 if i < ADVERSARIES else 2) for i, a in enumerate(agents)
        }
        return Layout(agents, landmarks, dim_c=2, obs_dims=obs_dims)

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        goal = self.randint(self.N, n)
        return {"goal": goal, "pos": self.rand(n, ADVERSARIES + 2 * self.N, 2)}

    def load_extra(self, worlds: list[Any]) -> None:
        goals = [
            next(i for i, lm in enumerate(w.landmarks) if lm is w.agents[0].goal_a) for w in worlds
        ]
        self.goal = torch.tensor(goals, dtype=torch.long, device=self.device)

    def _goal_pos(self) -> torch.Tensor:
        """[E, 2]."""
        index = self.goal.view(-1, 1, 1).expand(-1, 1, 2)
        return self.landmark_pos().gather(1, index).squeeze(1)

    def rewards(self) -> torch.Tensor:
        dist = (self.agent_pos() - self._goal_pos()[:, None]).square().sum(-1).sqrt()
        adversary, good = dist[:, :ADVERSARIES], dist[:, ADVERSARIES:]
        shared = -good.min(-1).values + adversary.sum(-1)
        return torch.cat([-adversary, shared[:, None].expand(-1, self.N)], dim=1)

    def observations(self) -> dict[str, torch.Tensor]:
        pos = self.agent_pos()
        landmarks = self.landmark_pos()[:, None] - pos[:, :, None]
        others = self.others(pos[:, None] - pos[:, :, None])
        (landmarks,) = self.nearest(landmarks, self.landmark_k)
        (others,) = self.nearest(others, self.agent_k)
        seen = torch.cat([landmarks.flatten(2), others.flatten(2)], dim=-1)
        goal = self._goal_pos()[:, None] - pos[:, ADVERSARIES:]
        return {
            "adversary": seen[:, :ADVERSARIES],
            "agent": torch.cat([goal, seen[:, ADVERSARIES:]], dim=-1),
        }
