"""simple_speaker_listener (mpe2 `simple_speaker_listener_v4`): a speaker guides a listener.

The speaker cannot move and sees only the colour of the goal landmark (one of 3); the silent
listener moves and hears the speaker's word (3 words).
Reward: both share minus the squared distance of the listener to the goal landmark.
Observation: speaker [goal colour]; listener [own vel, landmarks - pos, speaker's utterance].
"""

from __future__ import annotations

import torch

from marlctl.envs.native.mpe import Body, Layout, MPEWorld

N_LANDMARKS, DIM_C = 3, 3
SPEAKER, LISTENER = 0, 1
# Landmark i is 0.15 grey with 0.65 in channel i (`reset_world`).
COLORS = [[0.65 if j == i else 0.15 for j in range(3)] for i in range(N_LANDMARKS)]


class SimpleSpeakerListener(MPEWorld):
    env_id = "mpe/simple_speaker_listener"

    def build(self) -> Layout:
        # As the original emits them (its observations are float32): 0.65 is not a float32.
        colors = torch.tensor(COLORS, dtype=torch.float32, device=self.device)
        self.colors = colors.to(self.dtype)
        speaker = Body("speaker_0", size=0.075, collide=False, movable=False, silent=False)
        listener = Body("listener_0", size=0.075, collide=False, movable=True, silent=True)
        landmarks = [Body(f"landmark {i}", size=0.04, collide=False) for i in range(N_LANDMARKS)]
        obs_dims = {speaker.name: 3, listener.name: 2 + 2 * N_LANDMARKS + DIM_C}
        return Layout([speaker, listener], landmarks, dim_c=DIM_C, obs_dims=obs_dims)

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        goal = self.randint(N_LANDMARKS, n)
        return {"goal": goal, "pos": self.rand(n, 2 + N_LANDMARKS, 2)}

    def rewards(self) -> torch.Tensor:
        target = self.landmark_pos().gather(1, self.goal.view(-1, 1, 1).expand(-1, 1, 2))
        dist2 = (self.pos[:, LISTENER] - target[:, 0]).square().sum(-1)
        return (-dist2).unsqueeze(-1).expand(-1, 2)

    def observations(self) -> dict[str, torch.Tensor]:
        pos = self.pos[:, LISTENER]
        landmarks = self.landmark_pos() - pos[:, None]
        listener = torch.cat(
            [self.vel[:, LISTENER], landmarks.flatten(1), self.comm[:, SPEAKER]], dim=-1
        )
        return {"speaker": self.colors[self.goal][:, None], "listener": listener[:, None]}

    def load_extra(self, worlds) -> None:
        goal = [
            next(j for j, lm in enumerate(w.landmarks) if lm is w.agents[SPEAKER].goal_b)
            for w in worlds
        ]
        self.goal = torch.tensor(goal, dtype=torch.long, device=self.device)
