"""simple_reference (mpe2 `simple_reference_v3`): two agents tell each other where to go.

Each agent has a goal landmark (one of 3, by colour) that only the *other* agent knows; both
move and speak (10 words) at once.
Reward: agent i gets minus the distance of the other agent to i's goal landmark (weight
local_ratio), and everyone shares the mean of those (weight 1 - local_ratio).
Observation: [own vel, landmarks - pos, colour of the goal landmark it knows, other's utterance].
"""

from __future__ import annotations

import torch

from marlctl.envs.native.mpe import Body, Layout, MPEWorld

N_AGENTS, N_LANDMARKS, DIM_C = 2, 3, 10
# Landmark i is 0.25 grey with 0.75 in channel i (`reset_world`).
COLORS = [[0.75 if j == i else 0.25 for j in range(3)] for i in range(N_LANDMARKS)]


class SimpleReference(MPEWorld):
    env_id = "mpe/simple_reference"

    def build(self, local_ratio: float = 0.5) -> Layout:
        if not 0.0 <= local_ratio <= 1.0:
            raise ValueError("local_ratio is a proportion. Must be between 0 and 1.")
        self.local_ratio = local_ratio
        self.colors = torch.tensor(COLORS, dtype=self.dtype, device=self.device)
        agents = [
            Body(f"agent_{i}", collide=False, movable=True, silent=False) for i in range(N_AGENTS)
        ]
        landmarks = [Body(f"landmark {i}", collide=False) for i in range(N_LANDMARKS)]
        obs_dim = 2 + 2 * N_LANDMARKS + 3 + DIM_C * (N_AGENTS - 1)
        return Layout(agents, landmarks, dim_c=DIM_C, obs_dims={a.name: obs_dim for a in agents})

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        # goal[:, i]: the landmark agent i wants the other agent at (its `goal_b`).
        goal = self.randint(N_LANDMARKS, n, N_AGENTS)
        return {"goal": goal, "pos": self.rand(n, N_AGENTS + N_LANDMARKS, 2)}

    def rewards(self) -> torch.Tensor:
        # agent i's goal_a is the other agent: `flip` swaps the two
        target = self.landmark_pos().gather(1, self.goal.unsqueeze(-1).expand(-1, -1, 2))
        return -(self.agent_pos().flip(1) - target).square().sum(-1).sqrt()

    def global_reward(self) -> torch.Tensor:
        return self.rewards().sum(-1) / N_AGENTS

    def observations(self) -> dict[str, torch.Tensor]:
        pos = self.agent_pos()
        landmarks = self.landmark_pos()[:, None] - pos[:, :, None]
        E = pos.shape[0]
        obs = torch.cat(
            [
                self.vel[:, :N_AGENTS],
                landmarks.reshape(E, N_AGENTS, -1),
                self.colors[self.goal],
                self.comm.flip(1),
            ],
            dim=-1,
        )
        return {"agent": obs}

    def load_extra(self, worlds) -> None:
        goal = [
            [next(j for j, lm in enumerate(w.landmarks) if lm is a.goal_b) for a in w.agents]
            for w in worlds
        ]
        self.goal = torch.tensor(goal, dtype=torch.long, device=self.device)
