"""`marlctl data`: find datasets, describe one, split one by episode quality, merge several.

Splitting follows Off-the-Grid MARL's quality levels: a dataset's episodes ranked by return
(ties in the order they were played) and cut at quantiles of that ranking (by default in
thirds: `poor`, `medium`, `good`), each level a dataset of its own with the episodes it
holds, whole and in their order.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from marlctl.data.format import MANIFEST, DatasetError, Manifest, read_chunk, read_manifest
from marlctl.data.writer import DatasetWriter, select_episodes

LEVELS = ("poor", "medium", "good")
HISTOGRAM_BINS = 10


@dataclass
class Description:
    path: str
    env_id: str
    backend: str
    env_package: str
    groups: list[dict[str, Any]]
    episodes: int
    transitions: int
    bytes: int
    chunks: int
    return_mean: float
    return_std: float
    return_min: float
    return_max: float
    quantiles: dict[str, float]  # `q25`, `q50`, `q75`
    histogram: list[dict[str, float]]  # bins: `low`, `high`, `episodes`
    sources: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""


def describe(folder: Path) -> Description:
    """What a dataset holds, from its manifest (no chunk is read)."""
    manifest = read_manifest(Path(folder))
    returns = torch.tensor(manifest.returns, dtype=torch.float64)
    if returns.numel() == 0:
        raise DatasetError(folder, "holds no episodes")
    low, high = float(returns.min()), float(returns.max())
    width = (high - low) / HISTOGRAM_BINS or 1.0
    counts = torch.histc(returns, HISTOGRAM_BINS, low, low + width * HISTOGRAM_BINS)
    histogram = [
        {"low": low + i * width, "high": low + (i + 1) * width, "episodes": int(c)}
        for i, c in enumerate(counts.tolist())
    ]
    quantiles = torch.quantile(returns, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return Description(
        str(folder),
        manifest.env_id,
        manifest.backend,
        manifest.env_package,
        manifest.groups,
        manifest.episodes,
        manifest.transitions,
        sum(c.bytes for c in manifest.chunks),
        len(manifest.chunks),
        float(returns.mean()),
        float(returns.std()) if returns.numel() > 1 else 0.0,
        low,
        high,
        dict(zip(("q25", "q50", "q75"), quantiles.tolist(), strict=True)),
        histogram,
        [vars(s) for s in manifest.sources],
        manifest.note,
    )


def find(root: Path) -> list[Description]:
    """Every dataset under `root` (itself included), by path."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(root, "no such folder")
    return [describe(p.parent) for p in sorted(root.rglob(MANIFEST))]


def _empty_like(manifest: Manifest, note: str) -> Manifest:
    out = copy.deepcopy(manifest)
    out.chunks, out.returns, out.note = [], [], note
    return out


def split(
    folder: Path, out: Path, cuts: tuple[float, ...] = (1 / 3, 2 / 3), names=LEVELS
) -> dict[str, Manifest]:
    """Write one dataset per quality level into `out/NAME`: the episodes whose rank by return
    falls between the quantiles `cuts` (the lowest level below the first cut, the highest at
    or above the last)."""
    folder, out = Path(folder), Path(out)
    if len(names) != len(cuts) + 1:
        raise DatasetError(out, f"{len(cuts)} cuts make {len(cuts) + 1} levels, not "
                           f"{len(names)}")  # fmt: skip
    if list(cuts) != sorted(set(cuts)) or not all(0 < c < 1 for c in cuts):
        raise DatasetError(out, "cuts: increasing quantiles between 0 and 1")
    manifest = read_manifest(folder)
    returns = torch.tensor(manifest.returns, dtype=torch.float64)
    order = torch.argsort(returns, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    edges = torch.tensor(cuts, dtype=torch.float64)
    level = torch.bucketize(rank / len(rank), edges, right=True)  # per episode
    writers = {}
    for index, name in enumerate(names):
        low, high = ([0.0, *cuts][index], [*cuts, 1.0][index])
        note = f"{name}: the episodes of {folder} ranked by return from {low:.0%} to {high:.0%}"
        writers[name] = DatasetWriter(out / name, _empty_like(manifest, note))
    try:
        seen = 0
        for chunk in manifest.chunks:
            data = read_chunk(folder, chunk)
            mine = level[seen : seen + chunk.episodes]
            seen += chunk.episodes
            for index, name in enumerate(names):
                keep = mine == index
                if bool(keep.any()):
                    writers[name].add(select_episodes(data, keep))
        return {name: w.close() for name, w in writers.items() if w.episodes}
    except BaseException:
        for w in writers.values():
            w.abort()
        raise


def merge(folders: list[Path], out: Path) -> Manifest:
    """One dataset of every episode of `folders` (same env, groups and spaces), in order."""
    manifests = [read_manifest(Path(f)) for f in folders]
    first = manifests[0]
    for folder, manifest in zip(folders[1:], manifests[1:], strict=True):
        why = mismatch(first, manifest)
        if why:
            raise DatasetError(folder, f"cannot merge with {folders[0]}: {why}")
    note = "merged from " + ", ".join(str(f) for f in folders)
    writer = DatasetWriter(Path(out), _empty_like(first, note))
    try:
        for folder, manifest in zip(folders, manifests, strict=True):
            offset = len(writer.manifest.sources)
            writer.manifest.sources.extend(manifest.sources)
            for chunk in manifest.chunks:
                data = read_chunk(Path(folder), chunk)
                data["episode/source"] = data["episode/source"] + offset
                writer.add(data)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def mismatch(a: Manifest, b: Manifest) -> str | None:
    """Why datasets `a` and `b` cannot hold one learner's data, or None."""
    if a.env_id != b.env_id:
        return f"env '{b.env_id}', not '{a.env_id}'"
    if a.groups != b.groups:
        return "other agent groups or spaces"
    if a.state_dim != b.state_dim:
        return f"a global state of {b.state_dim} values, not {a.state_dim}"
    return None


def size_text(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    power = min(int(math.log(nbytes, 1024)), 4)
    return f"{nbytes / 1024**power:.1f} {'BKMGT'[power]}iB".replace("BiB", "B")
