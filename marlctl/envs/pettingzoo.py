"""The `pettingzoo` backend: `num_envs` copies of a ParallelEnv, in-process or in workers.

Copies are stepped in a Python loop (that is what a PettingZoo env is); agents that leave an
episode early get zero observations and rewards and `active=False` until the episode ends.

Armies (`EnvEntry.teams_by_name`: MAgent2's battles) say who won: at an episode's end the
group `wins_for` (the learners') won where more of its agents are left than of any other
group (`magent2.agents_left`: the engine's survivors, since the step that wipes out an army
terminates every agent). Equal numbers are not a win.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import numpy as np
import torch
from gymnasium.spaces import flatten

from marlctl.envs.batch import Observation, Transition
from marlctl.envs.info import EnvInfo
from marlctl.envs.magent2 import agents_left
from marlctl.envs.registry import make_env

Arrays = dict[str, np.ndarray]


class EnvSlice:
    """k env copies stepped in a loop, returning numpy arrays (used in-process and in workers)."""

    def __init__(
        self,
        env_id: str,
        params: dict[str, Any],
        info: EnvInfo,
        count: int,
        render_mode: str | None = None,
        state: bool = True,
        wins_for: str | None = None,
    ):
        """state: compute the global state (`env.state()`, or the observations side by
        side); without it the state stays zeros. wins_for: the group whose wins count."""
        self.info, self.state, self.wins_for = info, state, wins_for
        self.envs = [make_env(env_id, params, render_mode) for _ in range(count)]
        # With a render mode, the first copy's frames: every state, the final one included.
        self.frames: list | None = [] if render_mode else None
        self.k = count
        self.index = {
            a: (gi, g.agents.index(a)) for gi, g in enumerate(info.groups) for a in g.agents
        }
        # The spaces of the observations that are flattened (not a Box), by agent.
        self.flatten = {}
        for g in info.groups:
            if g.obs_flattened:
                for a in g.agents:
                    space = self.envs[0].observation_space(a)
                    self.flatten[a] = space["observation"] if g.mask_source == "obs" else space

    def _blank(self) -> Arrays:
        # Without `state` none is sent: the batched env fills zeros on its device.
        out: Arrays = {}
        if self.state:
            out["state"] = np.zeros((self.k, self.info.state_dim), self.info.state_storage)
        for g in self.info.groups:
            shape, dtype = (self.k, g.n_agents, *g.obs_shape), np.dtype(g.obs_storage)
            out[f"obs/{g.name}"] = np.zeros(shape, dtype)
            out[f"active/{g.name}"] = np.zeros((self.k, g.n_agents), bool)
            if g.mask_source:
                out[f"mask/{g.name}"] = np.ones((self.k, g.n_agents, g.n_actions), bool)
        return out

    def _write(self, out: Arrays, i: int, env: Any, obs: dict, infos: dict) -> None:
        groups = self.info.groups
        for agent, value in obs.items():
            gi, j = self.index[agent]
            g = groups[gi]
            if g.mask_source == "obs":
                out[f"mask/{g.name}"][i, j] = np.asarray(value["action_mask"], bool)
                value = value["observation"]
            elif g.mask_source == "info" and "action_mask" in infos.get(agent, {}):
                out[f"mask/{g.name}"][i, j] = np.asarray(infos[agent]["action_mask"], bool)
            if agent in self.flatten:
                value = flatten(self.flatten[agent], value)
            out[f"obs/{g.name}"][i, j] = value
            out[f"active/{g.name}"][i, j] = agent in env.agents
        if not self.state:
            return
        if self.info.state_from_env:
            state = np.asarray(env.state())
            if self.info.state_storage == "uint8" and state.dtype != np.uint8:
                raise ValueError(
                    f"env '{self.info.id}': state() returned {state.dtype} values, not the "
                    "uint8 of its state_space"
                )
            state = state.astype(self.info.state_storage, copy=False).ravel()
            if state.size != self.info.state_dim:
                raise ValueError(
                    f"env '{self.info.id}': state() returned {state.size} values, not the "
                    f"{self.info.state_dim} of its global state (its state_space's size, or "
                    "that of state() after a reset)"
                )
            out["state"][i] = state
        else:  # the observations side by side, frames scaled to [0, 1] as networks see them
            out["state"][i] = np.concatenate(
                [out[f"obs/{g.name}"][i].ravel() / (255 if g.obs_storage == "uint8" else 1)
                 for g in groups]
            )  # fmt: skip

    def reset(self, seed: int) -> Arrays:
        out = self._blank()
        for i, env in enumerate(self.envs):
            obs, infos = env.reset(seed=seed + i)
            self._write(out, i, env, obs, infos)
            self._frame(i, env)
        return out

    def _frame(self, i: int, env: Any) -> None:
        if self.frames is not None and i == 0:
            self.frames.append(env.render())

    def step(self, actions: Arrays) -> tuple[Arrays, Arrays, Arrays | None]:
        """(next observations, rewards and ends, the final observations of the episodes that
        ended: None where none did)."""
        nxt, final = self._blank(), None
        k = self.info.objectives  # a reward vector of k objectives per agent, or a scalar
        rew: Arrays = {
            f"rew/{g.name}": np.zeros((self.k, g.n_agents, *((k,) if k else ())), np.float32)
            for g in self.info.groups
        }
        rew["terminated"] = np.zeros(self.k, bool)
        rew["truncated"] = np.zeros(self.k, bool)
        rew["won"] = np.zeros(self.k, bool)
        groups = self.info.groups
        for i, env in enumerate(self.envs):
            joint = {}
            for agent in env.agents:
                gi, j = self.index[agent]
                joint[agent] = actions[groups[gi].name][i, j]
            obs, rewards, terms, truncs, infos = env.step(joint)
            self._frame(i, env)
            for agent, r in rewards.items():
                gi, j = self.index[agent]
                rew[f"rew/{groups[gi].name}"][i, j] = r
            if env.agents:
                self._write(nxt, i, env, obs, infos)
                continue
            final = self._blank() if final is None else final
            self._write(final, i, env, obs, infos)
            if self.wins_for is not None:
                rew["won"][i] = self._won(env, terms)
            if any(truncs.values()):
                rew["truncated"][i] = True
            else:
                rew["terminated"][i] = True
            obs, infos = env.reset()
            self._write(nxt, i, env, obs, infos)
            self._frame(i, env)
        return nxt, rew, final

    def _won(self, env: Any, terms: dict[str, bool]) -> bool:
        """Group `wins_for` has more agents left than any other at the episode's end."""
        left = dict.fromkeys((g.name for g in self.info.groups), 0)
        for agent in agents_left(env, terms):
            left[self.info.groups[self.index[agent][0]].name] += 1
        ours = left.pop(self.wins_for)
        return ours > max(left.values(), default=0)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _worker(
    remote, env_id: str, params: dict, info: EnvInfo, count: int, state: bool, wins_for
) -> None:
    torch.set_num_threads(1)
    envs = EnvSlice(env_id, params, info, count, state=state, wins_for=wins_for)
    try:
        while True:
            command, payload = remote.recv()
            if command == "step":
                remote.send(envs.step(payload))
            elif command == "reset":
                remote.send(envs.reset(payload))
            else:
                break
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        envs.close()
        remote.close()


class PettingZooEnv:
    """BatchedEnv over PettingZoo copies; `workers` > 0 steps them in that many processes."""

    def __init__(
        self,
        env_id: str,
        params: dict[str, Any],
        info: EnvInfo,
        num_envs: int,
        device: torch.device,
        workers: int = 0,
        render_mode: str | None = None,
        reward_weights: list[float] | None = None,
        state: bool = True,
        wins_for: str | None = None,
    ):
        """reward_weights: a multi-objective env's weights of its objectives (default: equal
        weights summing to 1), which scalarise each agent's reward vector. Without `state`
        the global state is left zeros: for trainers that read none (`Trainer.reads_state`),
        where `env.state()` costs as much as a step (pistonball renders a frame for it).
        wins_for: the group whose wins each ended episode reports (`Transition.won`), for
        armies; None for an env without winners."""
        self.wins_for = wins_for
        self.info, self.num_envs, self.device = info, num_envs, torch.device(device)
        k = info.objectives
        weights = reward_weights if reward_weights is not None else [1.0 / k] * k if k else []
        self.weights = torch.tensor(weights, dtype=torch.float32, device=self.device)
        self._local: EnvSlice | None = None
        self._remotes: list = []
        self._procs: list = []
        if render_mode is not None and workers > 0:
            raise ValueError("rendering needs the envs in this process (workers=0)")
        if workers <= 0:
            self._local = EnvSlice(env_id, params, info, num_envs, render_mode, state, wins_for)
            self._offsets = [0]
        else:
            ctx = mp.get_context("forkserver")
            sizes = [len(c) for c in np.array_split(np.arange(num_envs), workers)]
            self._offsets = [int(o) for o in np.cumsum([0, *sizes[:-1]])]
            for size in sizes:
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=_worker,
                    args=(child, env_id, params, info, size, state, wins_for),
                    daemon=True,
                )
                proc.start()
                child.close()
                self._remotes.append(parent)
                self._procs.append(proc)

    @property
    def frames(self) -> list | None:
        """Frames of the first env copy so far, when made with a render mode."""
        return self._local.frames if self._local is not None else None

    def _gather(self, command: str, payloads: list) -> list:
        if self._local is not None:
            method = getattr(self._local, command)
            return [method(payloads[0])]
        try:
            for remote, payload in zip(self._remotes, payloads, strict=True):
                remote.send((command, payload))
            return [remote.recv() for remote in self._remotes]
        except (EOFError, OSError) as err:
            codes = [p.exitcode for p in self._procs]
            raise RuntimeError(
                f"an env worker process died (exit codes {codes}): {err!r}"
            ) from None

    def _observation(self, parts: list[Arrays]) -> Observation:
        def cat(key: str) -> torch.Tensor:
            array = parts[0][key] if len(parts) == 1 else np.concatenate([p[key] for p in parts])
            return torch.from_numpy(array).to(self.device)

        groups = self.info.groups
        if "state" in parts[0]:
            state = cat("state")
            if state.dtype == torch.uint8:  # a frame travels as bytes; trainers read [0, 1]
                state = state.float() / 255.0
        else:  # not computed (`state=False`): zeros, never sent between processes
            state = torch.zeros(self.num_envs, self.info.state_dim, device=self.device)
        return Observation(
            obs={g.name: cat(f"obs/{g.name}") for g in groups},
            state=state,
            masks={g.name: cat(f"mask/{g.name}") if g.mask_source else None for g in groups},
            active={g.name: cat(f"active/{g.name}") for g in groups},
        )

    def reset(self, seed: int) -> Observation:
        return self._observation(self._gather("reset", [seed + o for o in self._offsets]))

    def step(self, actions: dict[str, torch.Tensor]) -> Transition:
        host = {}
        for g in self.info.groups:
            a = actions[g.name].detach().cpu().numpy()
            if not g.discrete:
                a = np.clip(a, g.action_low, g.action_high).astype(np.float32)
            host[g.name] = a
        bounds = [*self._offsets[1:], self.num_envs]
        payloads = [
            {k: v[s:e] for k, v in host.items()} for s, e in zip(self._offsets, bounds, strict=True)
        ]
        results = self._gather("step", payloads)
        nxt = self._observation([r[0] for r in results])
        # A slice where no episode ended sends no final observations: its rows are read only
        # where an episode ended, so the next ones stand in for them.
        ended = [r[2] for r in results]
        if all(part is None for part in ended):
            final = nxt
        else:
            parts = [r[0] if f is None else f for r, f in zip(results, ended, strict=True)]
            final = self._observation(parts)
        rew = [r[1] for r in results]

        def cat(key: str) -> torch.Tensor:
            return torch.from_numpy(np.concatenate([r[key] for r in rew])).to(self.device)

        rewards = {g.name: cat(f"rew/{g.name}") for g in self.info.groups}
        objectives = None
        if self.info.objectives:  # [E, n, k] per group: scalarised, and kept per objective
            objectives = torch.cat(list(rewards.values()), 1).mean(1)
            rewards = {name: r @ self.weights for name, r in rewards.items()}
        won = cat("won") if self.wins_for is not None else None
        return Transition(nxt, rewards, cat("terminated"), cat("truncated"), final, objectives, won)

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
        for remote in self._remotes:
            try:
                remote.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
