"""simple_tag (mpe2 `simple_tag_v3`): slower adversaries chase faster good agents.

Obstacles (large landmarks) block the way. Reward: every adversary gets 10 per colliding
(good agent, adversary) pair; a good agent pays 10 per adversary it collides with plus a
boundary penalty per coordinate (0 below 0.9, 10 (|x| - 0.9) below 1, else
min(exp(2 |x| - 2), 10)). `terminate_on_success` ends the episode once every good agent
collides with some adversary.
Observation: [own vel, own pos, obstacles - pos, other agents - pos, other good agents'
vel]. `num_landmark_neighbors` / `num_agent_neighbors` keep only the nearest obstacles /
agents, nearest first and zero-padded; velocities then follow the agent slots (zero for
adversaries and padding).
"""

from __future__ import annotations

import torch

from marlctl.envs.native.mpe import Body, Layout, MPEWorld

CATCH_REWARD = 10.0


def _check_neighbors(**counts: int | None) -> None:
    for key, value in counts.items():
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ValueError(f"{key} must be a positive integer or None")


class SimpleTag(MPEWorld):
    env_id = "mpe/simple_tag"

    def build(
        self,
        num_good: int = 1,
        num_adversaries: int = 3,
        num_obstacles: int = 2,
        terminate_on_success: bool = False,
        num_agent_neighbors: int | None = None,
        num_landmark_neighbors: int | None = None,
    ) -> Layout:
        _check_neighbors(
            num_agent_neighbors=num_agent_neighbors, num_landmark_neighbors=num_landmark_neighbors
        )
        self.n_good, self.n_adv, self.n_obstacles = num_good, num_adversaries, num_obstacles
        self.can_terminate = terminate_on_success
        self.agent_k, self.landmark_k = num_agent_neighbors, num_landmark_neighbors
        adversaries = [
            Body(f"adversary_{i}", size=0.075, movable=True, max_speed=1.0, accel=3.0)
            for i in range(num_adversaries)
        ]
        good = [
            Body(f"agent_{i}", size=0.05, movable=True, max_speed=1.3, accel=4.0)
            for i in range(num_good)
        ]
        landmarks = [Body(f"landmark {i}", size=0.2) for i in range(num_obstacles)]
        n = num_adversaries + num_good
        seen_landmarks = num_obstacles if num_landmark_neighbors is None else num_landmark_neighbors
        common = 4 + 2 * seen_landmarks
        if num_agent_neighbors is None:
            adversary_dim = common + 2 * (n - 1) + 2 * num_good
            good_dim = common + 2 * (n - 1) + 2 * (num_good - 1)
        else:
            adversary_dim = good_dim = common + 4 * num_agent_neighbors
        self.is_good = torch.tensor([[False]] * num_adversaries + [[True]] * num_good)
        self.is_good = self.is_good.to(self.device)
        obs_dims = {a.name: adversary_dim for a in adversaries}
        obs_dims.update({a.name: good_dim for a in good})
        return Layout(adversaries + good, landmarks, dim_c=2, obs_dims=obs_dims)

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        agents = self.rand(n, self.n_agents, 2)
        obstacles = self.rand(n, self.n_obstacles, 2, low=-0.9, high=0.9)
        return {"pos": torch.cat([agents, obstacles], dim=1)}

    def _caught(self) -> torch.Tensor:
        """[E, good, adversaries] bool: the pair collides."""
        pos, A = self.agent_pos(), self.n_adv
        dist = (pos[:, A:, None] - pos[:, None, :A]).square().sum(-1).sqrt()
        return dist < self.sum_size[A : self.n_agents, :A]

    def rewards(self) -> torch.Tensor:
        caught = self._caught().to(self.dtype)
        E = caught.shape[0]
        adversary = (CATCH_REWARD * caught.sum((1, 2)))[:, None].expand(E, self.n_adv)
        x = self.agent_pos()[:, self.n_adv :].abs()
        edge = torch.where(x < 1.0, (x - 0.9) * 10, torch.exp(2 * x - 2).clamp(max=10.0))
        bound = torch.where(x < 0.9, torch.zeros_like(x), edge)
        good = -CATCH_REWARD * caught.sum(-1) - bound.sum(-1)
        return torch.cat([adversary, good], dim=1)

    def terminal(self) -> torch.Tensor | None:
        if not self.can_terminate:
            return None
        return self._caught().any(-1).all(-1)

    def observations(self) -> dict[str, torch.Tensor]:
        pos, vel = self.agent_pos(), self.vel[:, : self.n_agents]
        n, A = self.n_agents, self.n_adv
        landmarks = self.landmark_pos()[:, None] - pos[:, :, None]
        (landmarks,) = self.nearest(landmarks, self.landmark_k)
        others = self.others(pos[:, None] - pos[:, :, None])
        own = [vel, pos, landmarks.flatten(2)]
        if self.agent_k is not None:
            moving = (vel * self.is_good).unsqueeze(1).expand(-1, n, -1, -1).contiguous()
            others, moving = self.nearest(others, self.agent_k, self.others(moving))
            obs = torch.cat([*own, others.flatten(2), moving.flatten(2)], dim=-1)
            return {next(iter(self.group_index)): obs}
        seen = torch.cat([*own, others.flatten(2)], dim=-1)
        good_vel = vel[:, A:]
        G = good_vel.shape[1]
        to_adversaries = good_vel.flatten(1)[:, None].expand(-1, A, -1)
        to_good = self.others(good_vel[:, None].expand(-1, G, -1, -1).contiguous())
        parts = [
            torch.cat([seen[:, :A], to_adversaries], dim=-1),
            torch.cat([seen[:, A:], to_good.flatten(2)], dim=-1),
        ]
        parts = [p for p, count in zip(parts, (A, G), strict=True) if count]
        return dict(zip(self.group_index, parts, strict=True))
