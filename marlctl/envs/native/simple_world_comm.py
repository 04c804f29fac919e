"""simple_world_comm (mpe2 `simple_world_comm_v3`): a talking leader's pack hunts in forests.

Adversaries (slower, bigger) chase good agents among obstacles; good agents also seek food.
Forests hide whoever is inside from everyone outside that forest, except from the lead
adversary, who sees everything and speaks (4 channels) to all.
Reward: good agents pay 5 per touching adversary, 2 x `bound` per coordinate near or past
the edge, earn 2 per food touched, and pay 0.05 x the distance to the nearest food.
Adversaries earn 5 per touching (good, adversary) pair and pay 0.1 x their distance to the
nearest good agent.
Observation: adversaries and leader [own vel, own pos, landmarks - pos, others - pos, good
others' vel, in each forest (+-1), leader's utterance]; good agents [own vel, own pos,
landmarks - pos, others - pos, in each forest, good others' vel]. Hidden others read 0.
Landmarks are obstacles, then food, then forests.
"""

from __future__ import annotations

import torch

from marlctl.envs.native.mpe import Body, Layout, MPEWorld

DIM_C = 4
LEADER = 0


def _count(name: str, value: int, least: int) -> int:
    if int(value) != value or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return int(value)


class SimpleWorldComm(MPEWorld):
    env_id = "mpe/simple_world_comm"

    def build(
        self,
        num_good: int = 2,
        num_adversaries: int = 4,
        num_obstacles: int = 1,
        num_food: int = 2,
        num_forests: int = 2,
    ) -> Layout:
        # The original's rewards take minima over good agents and over food: both nonempty.
        G = self.num_good = _count("num_good", num_good, 1)
        A = self.num_adversaries = _count("num_adversaries", num_adversaries, 0)
        self.num_obstacles = _count("num_obstacles", num_obstacles, 0)
        self.num_food = _count("num_food", num_food, 1)
        self.num_forests = _count("num_forests", num_forests, 0)
        N = A + G
        agents = []
        for i in range(N):
            adversary = i < A
            index = max(i - 1, 0) if adversary else i - A
            base = "leadadversary" if i == LEADER else ("adversary" if adversary else "agent")
            agents.append(
                Body(
                    f"{base}_{index}",
                    size=0.075 if adversary else 0.045,
                    movable=True,
                    collide=True,
                    max_speed=1.0 if adversary else 1.3,
                    accel=3.0 if adversary else 4.0,
                    silent=i != LEADER,
                )
            )
        landmarks = (
            [Body(f"landmark {i}", size=0.2, collide=True) for i in range(self.num_obstacles)]
            + [Body(f"food {i}", size=0.03, collide=False) for i in range(self.num_food)]
            + [Body(f"forest {i}", size=0.3, collide=False) for i in range(self.num_forests)]
        )
        L = len(landmarks)
        # Adversaries and the leader see the leader's utterance; everyone sees good others' vel.
        self._full_view = [i < A or i == LEADER for i in range(N)]
        obs_dims = {}
        for i, agent in enumerate(agents):
            good_others = G - (0 if i < A else 1)
            extra = DIM_C if self._full_view[i] else 0
            obs_dims[agent.name] = (
                4 + 2 * L + 2 * (N - 1) + 2 * good_others + self.num_forests + extra
            )
        return Layout(agents, landmarks, dim_c=DIM_C, obs_dims=obs_dims)

    def _setup(self, layout: Layout) -> None:
        super()._setup(layout)
        N, A = self.n_agents, self.num_adversaries
        lm0 = N + self.num_obstacles
        self._food = slice(lm0, lm0 + self.num_food)
        self._forests = slice(lm0 + self.num_food, self.n_entities)
        adversary = [i < A for i in range(N)]
        self.adversary = torch.tensor(adversary, device=self.device)
        self.leader = torch.arange(N, device=self.device) == LEADER
        order = {name: i for i, name in enumerate(self.info.agents)}

        def index(rows: list[list[int]]) -> torch.Tensor:
            return torch.tensor(rows, dtype=torch.long, device=self.device)

        self._views = []  # per group: name, full view?, members, their others, good others
        for group in self.info.groups:
            members = [order[a] for a in group.agents]
            full = {self._full_view[i] for i in members}
            if len(full) != 1:
                raise ValueError(f"agents {group.agents} share spaces but not observations")
            others = [[j for j in range(N) if j != i] for i in members]
            good = [[j for j in range(N) if j != i and not adversary[j]] for i in members]
            self._views.append(
                (
                    group.name,
                    full.pop(),
                    index([[i] for i in members]),
                    index(others),
                    index(good),
                )
            )

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        agents = self.rand(n, self.n_agents, 2)
        landmarks = self.rand(n, self.n_entities - self.n_agents, 2, low=-0.9, high=0.9)
        return {"pos": torch.cat([agents, landmarks], dim=1)}

    def _distances(self, entities: slice) -> torch.Tensor:
        """[E, agents, entities] distances from each agent."""
        delta = self.agent_pos()[:, :, None] - self.pos[:, None, entities]
        return delta.square().sum(-1).sqrt()

    def rewards(self) -> torch.Tensor:
        N = self.n_agents
        adversary, good = self.adversary, ~self.adversary
        dist = self._distances(slice(0, N))
        touch = dist < self.sum_size[:N, :N]
        # good agents
        caught = (touch & adversary).sum(-1).to(self.dtype)
        x = self.agent_pos().abs()
        edge = torch.where(
            x < 0.9,
            torch.zeros_like(x),
            torch.where(x < 1.0, (x - 0.9) * 10, torch.exp(2 * x - 2).clamp(max=10.0)),
        )
        food = self._distances(self._food)
        eaten = (food < self.sum_size[:N, self._food]).sum(-1).to(self.dtype)
        rew = -5 * caught - 2 * edge[..., 0] - 2 * edge[..., 1] + 2.0 * eaten
        rew = rew - 0.05 * food.min(-1).values
        # adversaries
        inf = torch.full_like(dist, float("inf"))
        nearest = torch.where(good, dist, inf).min(-1).values
        pairs = (touch & good[:, None] & adversary).sum((1, 2)).to(self.dtype)
        chase = -0.1 * nearest + 5 * pairs[:, None]
        return torch.where(adversary, chase, rew)

    def observations(self) -> dict[str, torch.Tensor]:
        N = self.n_agents
        pos, vel = self.agent_pos(), self.vel[:, :N]
        E = pos.shape[0]
        landmarks = (self.landmark_pos()[:, None] - pos[:, :, None]).flatten(2)
        inside = self._distances(self._forests) < self.sum_size[:N, self._forests]
        in_forest = torch.where(inside, 1.0, -1.0).to(self.dtype)
        outside = ~inside.any(-1)
        same_forest = (inside[:, :, None] & inside[:, None]).any(-1)
        seen = same_forest | (outside[:, :, None] & outside[:, None]) | self.leader[:, None]
        seen = seen[..., None]  # [E, observer, other, 1]
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        rel = torch.where(seen, pos[:, None] - pos[:, :, None], zero)
        other_vel = torch.where(seen, vel[:, None], zero)
        said = self.comm[:, LEADER]
        obs = {}
        for name, full, members, others, good in self._views:
            m = members.shape[0]
            own = members[:, 0]
            parts = [
                vel[:, own],
                pos[:, own],
                landmarks[:, own],
                rel[:, members, others].reshape(E, m, -1),
            ]
            velocities = other_vel[:, members, good].reshape(E, m, -1)
            if full:
                parts += [velocities, in_forest[:, own], said[:, None].expand(-1, m, -1)]
            else:
                parts += [in_forest[:, own], velocities]
            obs[name] = torch.cat(parts, dim=-1)
        return obs
