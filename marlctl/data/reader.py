"""Reading a dataset: its chunks checked and joined, each step with its next observation.

`load_transitions` gives the fields of `marlctl.train.replay.transition_fields` (what an
off-policy learner samples), flat `[N, ...]` with every episode's steps consecutive: the
stored fields, `next_obs/g`, `next_active/g`, `next_mask/g` and `next_state` (the following
step's, or the episode's final observation at its end) and `first` (an episode starts).
"""

from __future__ import annotations

from pathlib import Path

import torch

from marlctl.data.format import DatasetError, Manifest, read_chunk, read_manifest

NEXT = ("obs/", "active/", "mask/")


def with_next(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One chunk's steps with their next observations and episode starts."""
    lengths = data["episode/length"]
    ends = torch.cumsum(lengths, 0) - 1  # each episode's last step
    out = {k: v for k, v in data.items() if not k.startswith(("episode/", "final/"))}
    first = torch.zeros(int(lengths.sum()), dtype=torch.bool)
    first[ends - lengths + 1] = True
    out["first"] = first
    names = ["state"] + [k for k in out if k.startswith(NEXT)]
    for key in names:
        value = out[key]
        nxt = torch.roll(value, -1, 0).clone()
        nxt[ends] = data[f"final/{key}"]
        out[f"next_{key}"] = nxt
    return out


def load_transitions(
    folder: Path, manifest: Manifest | None = None
) -> tuple[Manifest, dict[str, torch.Tensor]]:
    """Every chunk of the dataset in `folder`, checked, as one block of transitions."""
    folder = Path(folder)
    manifest = manifest or read_manifest(folder)
    if not manifest.chunks:
        raise DatasetError(folder, "its manifest lists no chunks")
    parts = [with_next(read_chunk(folder, chunk)) for chunk in manifest.chunks]
    keys = set(parts[0])
    for chunk, part in zip(manifest.chunks, parts, strict=True):
        if set(part) != keys:
            raise DatasetError(folder / chunk.file, "holds other fields than the first chunk")
    return manifest, {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


def load_named(data: str, client) -> tuple[Manifest, dict[str, torch.Tensor]]:
    """The dataset a spec's `data` names, as `load_transitions` gives it: a folder, or a
    run's artifact (`runs:/RUN_ID/PATH`) in the store `client` opens."""
    from marlctl.data import artifacts

    if artifacts.is_artifact(data):
        return load_transitions(artifacts.local_folder(client, data))
    return load_transitions(Path(data))
