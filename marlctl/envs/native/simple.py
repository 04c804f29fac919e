"""simple (mpe2 `simple_v3`): one agent moves to one landmark (a debugging task).

Reward: minus the squared distance from the agent to the landmark.
Observation: [own vel, landmark - pos].
"""

from __future__ import annotations

import torch

from marlctl.envs.native.mpe import Body, Layout, MPEWorld


class Simple(MPEWorld):
    env_id = "mpe/simple"

    def build(self) -> Layout:
        agents = [Body("agent_0", movable=True, collide=False, silent=True)]
        landmarks = [Body("landmark 0", collide=False)]
        return Layout(agents, landmarks, dim_c=0, obs_dims={"agent_0": 4})

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        return {"pos": self.rand(n, 2, 2)}

    def rewards(self) -> torch.Tensor:
        delta = self.agent_pos() - self.landmark_pos()
        return -delta.square().sum(-1)

    def observations(self) -> dict[str, torch.Tensor]:
        pos = self.agent_pos()
        obs = torch.cat([self.vel[:, :1], self.landmark_pos() - pos], dim=-1)
        return {"agent": obs}
