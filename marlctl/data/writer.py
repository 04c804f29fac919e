"""Writing a dataset: whole episodes out of a batched env's steps, into chunks.

`EpisodeStager` keeps every env's steps on the env's device in one time-major block, written
one step for all envs at once; where episodes end, it takes those envs' steps out as whole
episodes, each one's steps consecutive. `DatasetWriter` gathers them into chunks on disk and
writes the manifest when it is closed; `Recording` is a batched env that stages every step
it passes on.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import torch

from marlctl.data.format import DatasetError, Manifest, write_chunk, write_manifest
from marlctl.envs.batch import Observation, Transition, Wrapper
from marlctl.envs.info import EnvInfo

CHUNK_TRANSITIONS = 100_000  # transitions a chunk holds at least (but the last)
STAGE_STEPS = 64  # time steps staged at first; doubled for longer episodes


def cat_episodes(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


def select_episodes(data: dict[str, torch.Tensor], keep: torch.Tensor) -> dict:
    """The episodes of a block of whole episodes where `keep` (`[M]` bool) holds."""
    lengths = data["episode/length"]
    steps = torch.repeat_interleave(keep.to(lengths.device), lengths)
    return {
        key: value[keep] if key.startswith(("episode/", "final/")) else value[steps]
        for key, value in data.items()
    }


def first_episodes(data: dict[str, torch.Tensor], count: int) -> dict[str, torch.Tensor]:
    """The first `count` episodes of a block of whole episodes."""
    steps = int(data["episode/length"][:count].sum())
    return {
        key: value[:count] if key.startswith(("episode/", "final/")) else value[:steps]
        for key, value in data.items()
    }


class DatasetWriter:
    """Whole episodes into a new dataset folder, at most `limit` of them; `close` writes the
    manifest, `abort` removes what was written."""

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        limit: int | None = None,
        chunk_transitions: int | None = None,
    ):
        self.folder = Path(folder)
        if self.folder.exists() and any(self.folder.iterdir()):
            raise DatasetError(self.folder, "exists and is not empty: name a new folder")
        self.manifest = manifest
        self.limit = limit
        self.chunk_transitions = chunk_transitions or CHUNK_TRANSITIONS
        self.pending: list[dict[str, torch.Tensor]] = []
        self.pending_steps = 0
        self.created = False

    @property
    def episodes(self) -> int:
        return self.manifest.episodes

    @property
    def full(self) -> bool:
        return self.limit is not None and self.episodes >= self.limit

    def add(self, data: dict[str, torch.Tensor]) -> None:
        """Whole episodes (the chunk fields, on any device); those past `limit` are left."""
        count = int(data["episode/length"].numel())
        if self.limit is not None:
            count = min(count, self.limit - self.episodes)
            data = first_episodes(data, count)
        if count <= 0:
            return
        data = {k: v.cpu() for k, v in data.items()}
        self.manifest.returns.extend(float(r) for r in data["episode/return"])
        self.pending.append(data)
        self.pending_steps += int(data["episode/length"].sum())
        if self.pending_steps >= self.chunk_transitions:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        if not self.created:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.created = True
        chunk = write_chunk(self.folder, len(self.manifest.chunks), cat_episodes(self.pending))
        self.manifest.chunks.append(chunk)
        self.pending, self.pending_steps = [], 0

    def close(self) -> Manifest:
        if self.episodes == 0:
            raise DatasetError(self.folder, "no episode ended: nothing to write")
        self._flush()
        self.manifest.created = datetime.now(UTC).isoformat(timespec="seconds")
        self.manifest.marlctl_version = metadata.version("marlctl")
        write_manifest(self.folder, self.manifest)
        return self.manifest

    def abort(self) -> None:
        if self.created:
            shutil.rmtree(self.folder, ignore_errors=True)


def _step_fields(ob: Observation, actions: dict[str, torch.Tensor], tr: Transition) -> dict:
    step = {"state": ob.state, "terminated": tr.terminated, "truncated": tr.truncated}
    for name, obs in ob.obs.items():
        step[f"obs/{name}"] = obs
        step[f"action/{name}"] = actions[name]
        step[f"reward/{name}"] = tr.rewards[name]
        step[f"active/{name}"] = ob.active[name]
        if ob.masks.get(name) is not None:
            step[f"mask/{name}"] = ob.masks[name]
    return step


def _final_fields(final: Observation, done: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {"final/state": final.state[done]}
    for name, obs in final.obs.items():
        out[f"final/obs/{name}"] = obs[done]
        out[f"final/active/{name}"] = final.active[name][done]
        if final.masks.get(name) is not None:
            out[f"final/mask/{name}"] = final.masks[name][done]
    return out


class EpisodeStager:
    """The steps of `num_envs` envs, handed to `sink` as whole episodes where they end.

    `sources[e]`: which of the dataset's sources plays env e; `quota[e]`: the most episodes
    taken from env e (default: every one), as an evaluation counts them."""

    def __init__(
        self,
        num_envs: int,
        device: torch.device,
        sources: torch.Tensor,
        sink,
        quota: torch.Tensor | None = None,
    ):
        self.num_envs, self.device, self.sink = num_envs, torch.device(device), sink
        self.sources = sources.to(self.device)
        self.quota = None if quota is None else quota.to(self.device).flatten()
        self.taken = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.stage: dict[str, torch.Tensor] = {}
        self.t = 0  # the next time step to write
        self.start = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.returns: torch.Tensor | None = None  # [E, agents]: each agent's running return

    def restart(self) -> None:
        """Every env begins a new episode now (a reset): the steps staged are dropped."""
        self.start.fill_(self.t)
        if self.returns is not None:
            self.returns.zero_()

    def record(self, ob: Observation, actions: dict[str, torch.Tensor], tr: Transition) -> None:
        step = _step_fields(ob, actions, tr)
        if not self.stage:
            self.stage = {
                k: torch.zeros(STAGE_STEPS, *v.shape, dtype=v.dtype, device=self.device)
                for k, v in step.items()
            }
        for key, value in step.items():
            self.stage[key][self.t].copy_(value)
        rewards = torch.cat([tr.rewards[name] for name in ob.obs], -1)
        self.returns = rewards.clone() if self.returns is None else self.returns + rewards
        done = tr.terminated | tr.truncated
        if bool(done.any()):
            self._take(done, tr)
            self.taken += done.long()
        self.t += 1
        if self.t == len(self.stage["state"]):
            self._make_room()

    def _take(self, done: torch.Tensor, tr: Transition) -> None:
        kept = done if self.quota is None else done & (self.taken < self.quota)
        if bool(kept.any()):
            steps = torch.arange(self.t + 1, device=self.device)
            mine = kept[:, None] & (steps[None, :] >= self.start[:, None])  # [E, t + 1]
            data = {k: v[: self.t + 1].transpose(0, 1)[mine] for k, v in self.stage.items()}
            data["episode/length"] = (self.t + 1 - self.start)[kept]
            data["episode/source"] = self.sources[kept]
            data["episode/return"] = self.returns[kept].mean(-1)
            if tr.won is not None:
                data["episode/won"] = tr.won[kept]
            data |= _final_fields(tr.final, kept)
            self.sink(data)
        self.start[done] = self.t + 1
        self.returns[done] = 0.0

    def _make_room(self) -> None:
        """The block is full: move every env's unfinished episode to its front, or double the
        block where one episode fills it."""
        shift = int(self.start.min())
        if shift == 0:
            self.stage = {k: torch.cat([v, torch.zeros_like(v)]) for k, v in self.stage.items()}
            return
        for value in self.stage.values():
            value[: self.t - shift] = value[shift : self.t].clone()
        self.start -= shift
        self.t -= shift


class Recording(Wrapper):
    """A batched env that stages every step it passes on (`EpisodeStager`)."""

    graph_blocker = "a recorded env stages every step from the host"

    def __init__(self, env, info: EnvInfo, stager: EpisodeStager):
        super().__init__(env)
        self.info, self.stager = info, stager
        self._ob: Observation | None = None

    def reset(self, seed) -> Observation:
        self._ob = self.env.reset(seed)
        self.stager.restart()
        return self._ob

    def step(self, actions: dict[str, torch.Tensor]) -> Transition:
        tr = self.env.step(actions)
        assert self._ob is not None, "reset the env before stepping it"
        self.stager.record(self._ob, actions, tr)
        self._ob = tr.next
        return tr
