"""simple_spread (mpe2 `simple_spread_v3`): N agents cover N landmarks without colliding.

Reward: every agent shares minus the sum over landmarks of the nearest agent's distance
(weight 1 - local_ratio) and pays 1 per agent it touches (weight local_ratio).
Observation: [own vel, own pos, landmarks - pos, other agents - pos, others' utterances].
"""

from __future__ import annotations

import torch

from marlctl.envs.native.mpe import Body, Layout, MPEWorld

CAPTURE_RADIUS = 0.1


class SimpleSpread(MPEWorld):
    env_id = "mpe/simple_spread"

    def build(
        self,
        N: int = 3,
        local_ratio: float = 0.5,
        terminate_on_success: bool = False,
        num_agent_neighbors: int | None = None,
        num_landmark_neighbors: int | None = None,
    ) -> Layout:
        self.N, self.local_ratio = N, local_ratio
        self.can_terminate = terminate_on_success
        self.agent_k, self.landmark_k = num_agent_neighbors, num_landmark_neighbors
        agents = [Body(f"agent_{i}", size=0.15, movable=True, silent=True) for i in range(N)]
        landmarks = [Body(f"landmark {i}", collide=False) for i in range(N)]
        seen_landmarks = N if num_landmark_neighbors is None else num_landmark_neighbors
        seen_agents = N - 1 if num_agent_neighbors is None else num_agent_neighbors
        obs_dim = 4 + 2 * seen_landmarks + 2 * seen_agents + 2 * seen_agents
        return Layout(agents, landmarks, dim_c=2, obs_dims={a.name: obs_dim for a in agents})

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        return {"pos": self.rand(n, 2 * self.N, 2)}

    def _landmark_distances(self) -> torch.Tensor:
        """[E, landmarks, agents]."""
        delta = self.agent_pos()[:, None] - self.landmark_pos()[:, :, None]
        return delta.square().sum(-1).sqrt()

    def global_reward(self) -> torch.Tensor:
        return -self._landmark_distances().min(-1).values.sum(-1)

    def rewards(self) -> torch.Tensor:
        pos = self.agent_pos()
        dist = (pos[:, :, None] - pos[:, None]).square().sum(-1).sqrt()
        touching = self.others(dist < self.sum_size[: self.N, : self.N])
        return -touching.sum(-1).to(self.dtype)

    def terminal(self) -> torch.Tensor | None:
        if not self.can_terminate:
            return None
        return (self._landmark_distances().min(-1).values < CAPTURE_RADIUS).all(-1)

    def observations(self) -> dict[str, torch.Tensor]:
        pos = self.agent_pos()
        landmarks = self.landmark_pos()[:, None] - pos[:, :, None]
        others = self.others(pos[:, None] - pos[:, :, None])
        comm = self.comm[:, None].expand(-1, self.N, -1, -1)
        comm = self.others(comm.contiguous())
        (landmarks,) = self.nearest(landmarks, self.landmark_k)
        others, comm = self.nearest(others, self.agent_k, comm)
        E = pos.shape[0]
        obs = torch.cat(
            [
                self.vel[:, : self.N],
                pos,
                landmarks.reshape(E, self.N, -1),
                others.reshape(E, self.N, -1),
                comm.reshape(E, self.N, -1),
            ],
            dim=-1,
        )
        return {"agent": obs}
