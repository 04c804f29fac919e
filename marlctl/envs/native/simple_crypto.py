"""simple_crypto (mpe2 `simple_crypto_v3`): alice sends bob a message past eavesdropping eve.

No agent moves; all three speak (4 channels) on a public channel. Each episode draws a goal
(the message, one of 2) and a private key (one of 2, shared by alice and bob), both one-hot
in 4 channels.
Reward: eve pays the squared error of her utterance to the goal; alice and bob both pay
bob's squared error and earn eve's. An all-zero utterance is not judged (scores 0).
Observation: eve [alice's utterance]; bob [key, alice's utterance]; alice [goal, key].
"""

from __future__ import annotations

import torch

from marlctl.envs.native.mpe import Body, Layout, MPEWorld

DIM_C, N_LANDMARKS = 4, 2
EVE, BOB, ALICE = 0, 1, 2


class SimpleCrypto(MPEWorld):
    env_id = "mpe/simple_crypto"

    def build(self) -> Layout:
        agents = [
            Body(f"{name}_0", collide=False, movable=False, silent=False)
            for name in ("eve", "bob", "alice")
        ]
        landmarks = [Body(f"landmark {i}", collide=False) for i in range(N_LANDMARKS)]
        obs_dims = {"eve_0": DIM_C, "bob_0": 2 * DIM_C, "alice_0": 2 * DIM_C}
        return Layout(agents, landmarks, dim_c=DIM_C, obs_dims=obs_dims)

    def _setup(self, layout: Layout) -> None:
        super()._setup(layout)
        # Landmark i's colour is one-hot i in DIM_C channels; goal and key are such colours.
        self.colors = torch.eye(N_LANDMARKS, DIM_C, dtype=self.dtype, device=self.device)
        order = {name: i for i, name in enumerate(self.info.agents)}
        self._members = {g.name: [order[a] for a in g.agents] for g in self.info.groups}

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        goal = self.randint(N_LANDMARKS, n)
        key = self.randint(N_LANDMARKS, n)
        return {"goal": goal, "key": key, "pos": self.rand(n, 3 + N_LANDMARKS, 2)}

    def rewards(self) -> torch.Tensor:
        goal = self.colors[self.goal]
        zero = torch.zeros((), dtype=self.dtype, device=self.device)

        def error(agent: int) -> torch.Tensor:
            said = self.comm[:, agent]
            wrong = (said - goal).square().sum(-1)
            return torch.where((said == 0).all(-1), zero, wrong)

        eve, bob = error(EVE), error(BOB)
        good = eve - bob
        return torch.stack([-eve, good, good], dim=-1)

    def observations(self) -> dict[str, torch.Tensor]:
        key, alice_says = self.colors[self.key], self.comm[:, ALICE]
        per_agent = {
            EVE: alice_says,
            BOB: torch.cat([key, alice_says], dim=-1),
            ALICE: torch.cat([self.colors[self.goal], key], dim=-1),
        }
        return {
            name: torch.stack([per_agent[i] for i in members], dim=1)
            for name, members in self._members.items()
        }

    def load_extra(self, worlds) -> None:
        goal, key = [], []
        for w in worlds:
            goal.append(next(j for j, lm in enumerate(w.landmarks) if lm is w.agents[0].goal_a))
            key.append(int(w.agents[ALICE].key.argmax()))
        self.goal = torch.tensor(goal, dtype=torch.long, device=self.device)
        self.key = torch.tensor(key, dtype=torch.long, device=self.device)
