"""simple_push (mpe2 `simple_push_v3`): an adversary pushes the good agent off its goal.

Two landmarks, one of them the goal; the good agent knows which (its colour encodes it),
the adversary does not. Reward: the good agent gets minus its distance to the goal; the
adversary gets the good agent's distance to the goal minus its own.
Observation: the good agent [own vel, goal - pos, own colour, landmarks - pos, landmark
colours, adversary - pos]; the adversary [own vel, landmarks - pos, good agent - pos].
"""

from __future__ import annotations

from typing import Any

import torch

from marlctl.envs.native.mpe import Body, Layout, MPEWorld

LANDMARKS = 2
AGENT_GREY = 0.25


class SimplePush(MPEWorld):
    env_id = "mpe/simple_push"

    def build(self) -> Layout:
        agents = [Body("adversary_0", movable=True), Body("agent_0", movable=True)]
        landmarks = [Body(f"landmark {i}", collide=False) for i in range(LANDMARKS)]
        # reset_world: landmark i is grey 0.1 with channel i + 1 raised by 0.8.
        colors = torch.full((LANDMARKS, 3), 0.1, dtype=torch.float64)
        colors[torch.arange(LANDMARKS), torch.arange(LANDMARKS) + 1] += 0.8
        self.landmark_color = colors.to(**self._like)
        obs_dims = {"adversary_0": 2 + 2 * LANDMARKS + 2, "agent_0": 7 + 5 * LANDMARKS + 2}
        return Layout(agents, landmarks, dim_c=2, obs_dims=obs_dims)

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        goal = self.randint(LANDMARKS, n)
        # The good agent's colour: grey 0.25 with the goal's channel raised by 0.5.
        color = torch.full((n, 3), AGENT_GREY, **self._like)
        color = color + 0.5 * torch.nn.functional.one_hot(goal + 1, 3).to(self.dtype)
        return {"goal": goal, "color": color, "pos": self.rand(n, 2 + LANDMARKS, 2)}

    def load_extra(self, worlds: list[Any]) -> None:
        goals = [
            next(i for i, lm in enumerate(w.landmarks) if lm is w.agents[0].goal_a) for w in worlds
        ]
        self.goal = torch.tensor(goals, dtype=torch.long, device=self.device)
        self.color = torch.tensor([list(w.agents[1].color) for w in worlds], **self._like)

    def _goal_pos(self) -> torch.Tensor:
        """[E, 2]."""
        index = self.goal.view(-1, 1, 1).expand(-1, 1, 2)
        return self.landmark_pos().gather(1, index).squeeze(1)

    def rewards(self) -> torch.Tensor:
        dist = (self.agent_pos() - self._goal_pos()[:, None]).square().sum(-1).sqrt()
        adversary, good = dist[:, 0], dist[:, 1]
        return torch.stack([good - adversary, -good], dim=1)

    def observations(self) -> dict[str, torch.Tensor]:
        pos, vel = self.agent_pos(), self.vel[:, :2]
        E = pos.shape[0]
        landmarks = (self.landmark_pos()[:, None] - pos[:, :, None]).flatten(2)
        other = pos.flip(1) - pos
        adversary = torch.cat([vel[:, 0], landmarks[:, 0], other[:, 0]], dim=-1)
        agent = torch.cat(
            [
                vel[:, 1],
                self._goal_pos() - pos[:, 1],
                self.color,
                landmarks[:, 1],
                self.landmark_color.flatten().expand(E, -1),
                other[:, 1],
            ],
            dim=-1,
        )
        return {"adversary": adversary[:, None], "agent": agent[:, None]}
