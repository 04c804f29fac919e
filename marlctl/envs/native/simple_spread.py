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


LOOKAHEAD_S = 0.1  # how far past the next step a scripted agent aims its position


def scripted_policy(obs: torch.Tensor, mask, group) -> torch.Tensor:
    """simple_spread played without training, from each agent's own observation (every
    landmark and agent seen, discrete actions): all agents' positions relative to it give the
    assignment of agents to landmarks of least total distance (all N! compared), and it takes
    the move whose velocity brings it closest to its landmark `LOOKAHEAD_S` past the next
    step. A suite's reference point (`package.module:callable` under `points`), on the
    native and the PettingZoo backend alike; obs [envs, N, obs_dim] -> actions [envs, N]."""
    import itertools

    from marlctl.envs.native.mpe import MOVES, _off_diagonal

    E, N, size = obs.shape
    if not group.discrete or size != 4 + 2 * N + 4 * (N - 1):
        raise ValueError(
            "the scripted simple_spread policy needs discrete actions and every landmark and "
            "agent observed (num_agent_neighbors and num_landmark_neighbors unset)"
        )
    obs = obs.to(torch.float32)
    vel = obs[..., :2]  # [E, N, 2]
    landmarks = obs[..., 4 : 4 + 2 * N].reshape(E, N, N, 2)  # [E, observer, landmark, 2]
    others = obs[..., 4 + 2 * N : 4 + 4 * N - 2].reshape(E, N, N - 1, 2)
    # Each observer's view of every agent in agent order, itself at the origin.
    everyone = torch.zeros(E, N * N, 2, dtype=obs.dtype, device=obs.device)
    everyone.index_copy_(1, _off_diagonal(N, obs.device), others.flatten(1, 2))  # `others`' inverse
    everyone = everyone.view(E, N, N, 2)
    distance = (everyone[:, :, :, None] - landmarks[:, :, None]).norm(dim=-1)  # [E, o, a, l]
    assignments = torch.tensor(list(itertools.permutations(range(N))), device=obs.device)
    cost = distance[:, :, torch.arange(N, device=obs.device), assignments].sum(-1)  # [E, o, P]
    mine = assignments[cost.argmin(-1)].diagonal(dim1=1, dim2=2)  # [E, N]: own landmark
    target = landmarks.gather(2, mine[:, :, None, None].expand(-1, -1, 1, 2))  # [E, N, 1, 2]
    moves = torch.tensor(MOVES, dtype=obs.dtype, device=obs.device)  # [5, 2]
    world = SimpleSpread
    accel = 5.0  # simple_spread's agents keep MPE's default sensitivity
    after = vel[:, :, None] * (1 - world.damping) + moves * accel * world.dt  # [E, N, 5, 2]
    future = world.dt * vel[:, :, None] + LOOKAHEAD_S * after  # relative to the agent
    return (future - target).norm(dim=-1).argmin(-1)
