"""`train.record`: every transition a run's training collects, as one dataset per seed run
(`RECORD/seed-N`), written whole when training ends and removed if it fails."""

from __future__ import annotations

from pathlib import Path

import torch

from marlctl.data.format import DatasetError, Manifest, Source, groups_of
from marlctl.data.writer import DatasetWriter, EpisodeStager, Recording, select_episodes
from marlctl.envs.info import EnvInfo
from marlctl.envs.registry import env_package


class TrainingRecorder:
    """The training env of a batch of seed runs (`requests`), wrapped to record it."""

    def __init__(self, spec, requests, env, info: EnvInfo):
        folder = Path(spec.train.record).expanduser().absolute()
        package = env_package(spec.env.id, spec.env.backend)
        self.writers = []
        for request in requests:
            seed = request.run.seed
            manifest = Manifest(
                spec.env.id, spec.env.backend, dict(spec.env.params), package,
                groups_of(info), info.state_dim,
                sources=[Source(request.run_id, seed, None, "training")],
                note=f"recorded while run {request.run_id} (seed {seed}) trained",
            )  # fmt: skip
            self.writers.append(DatasetWriter(folder / f"seed-{seed}", manifest))
        per_seed = env.num_envs // len(requests)
        sources = torch.arange(len(requests)).repeat_interleave(per_seed)
        stager = EpisodeStager(env.num_envs, env.device, sources, self._route)
        self.env = Recording(env, info, stager)

    def _route(self, data: dict[str, torch.Tensor]) -> None:
        """Each seed run's episodes to its own dataset."""
        source = data["episode/source"]
        for index, writer in enumerate(self.writers):
            keep = source == index
            if bool(keep.any()):
                part = select_episodes(data, keep)
                part["episode/source"] = torch.zeros_like(part["episode/source"])
                writer.add(part)

    def close(self) -> None:
        for writer in self.writers:
            try:
                writer.close()
            except DatasetError:  # no episode ended in the run: nothing to write
                writer.abort()

    def abort(self) -> None:
        for writer in self.writers:
            writer.abort()
