"""A dataset on disk: a folder of chunk files and the manifest that lists them.

A chunk (`chunk-NNNNN.pt`, read with `torch.load(..., weights_only=True)`) holds whole
episodes, each one's steps consecutive, as flat tensors `[N, ...]` per field:

- per group g: `obs/g` `[N, n, *obs]`, `action/g` (`[N, n]` long, or `[N, n, A]` float),
  `reward/g` `[N, n]`, `active/g` `[N, n]` bool, and `mask/g` `[N, n, A]` bool where the
  group has action masks;
- per env: `state` `[N, D]`, `terminated` and `truncated` `[N]` bool;
- per episode (M of them): `episode/length`, `episode/source` (which of the manifest's
  `sources` played it) and `episode/return` (the mean over agents of each agent's summed
  reward, as `eval/return_mean` counts it), `episode/won` where the env says who won, and
  the observation after its last step: `final/obs/g`, `final/state`, `final/active/g`,
  `final/mask/g`.

The next observation of a step is the following step's, except at an episode's end, where
it is `final/...`: it is not stored twice. The manifest (`manifest.json`) is written last,
after every chunk, so a folder without one is a dataset whose writing did not finish; it
records each chunk's size and SHA-256, and a chunk that does not match is refused by path.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marlctl.atomic import replacing
from marlctl.envs.info import EnvInfo
from marlctl.errors import MarlctlError

if TYPE_CHECKING:  # torch loads only where chunks are read or written, not to validate
    import torch

FORMAT = "marlctl-dataset"
VERSION = 1
MANIFEST = "manifest.json"
CHUNK = "chunk-{:05d}.pt"


class DatasetError(MarlctlError):
    """A dataset that cannot be read as one: missing, unfinished, corrupt, or not what a
    spec needs (exit 2, like any other bad input)."""

    exit_code = 2

    def __init__(self, where: Path | str, message: str):
        self.where = str(where)
        super().__init__(f"{where}: {message}")


@dataclass
class Chunk:
    file: str
    transitions: int
    episodes: int
    bytes: int
    sha256: str


@dataclass
class Source:
    """What played a dataset's episodes: a run's policy (`run_id`, its `checkpoint`) or
    `random`, acting `deterministic`, `sampled` (as in training) or `training` (recorded while
    it trained)."""

    run_id: str | None
    seed: int | None
    checkpoint: str | None
    mode: str


@dataclass
class Manifest:
    env_id: str
    backend: str
    params: dict[str, Any]
    env_package: str
    groups: list[dict[str, Any]]  # `GroupInfo` fields
    state_dim: int
    sources: list[Source] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)  # every episode's, in order
    created: str = ""
    marlctl_version: str = ""
    note: str = ""  # how it was made: recorded, split from, merged from

    @property
    def transitions(self) -> int:
        return sum(c.transitions for c in self.chunks)

    @property
    def episodes(self) -> int:
        return len(self.returns)

    @classmethod
    def from_json(cls, text: str, where: Path) -> Manifest:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise DatasetError(where, f"not JSON: {err}") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise DatasetError(where, f"not a {FORMAT} manifest")
        if raw.get("version") != VERSION:
            raise DatasetError(where, f"format version {raw.get('version')!r}; this marlctl "
                               f"reads version {VERSION}")  # fmt: skip
        try:
            body = {k: v for k, v in raw.items() if k not in ("format", "version")}
            body["sources"] = [Source(**s) for s in body.get("sources", [])]
            body["chunks"] = [Chunk(**c) for c in body.get("chunks", [])]
            return cls(**body)
        except TypeError as err:
            raise DatasetError(where, f"malformed manifest: {err}") from None


def manifest_text(manifest: Manifest) -> str:
    body = {"format": FORMAT, "version": VERSION, **asdict(manifest)}
    return json.dumps(body, indent=1) + "\n"


def groups_of(info: EnvInfo) -> list[dict[str, Any]]:
    return [
        {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(g).items()}
        for g in info.groups
    ]


def read_manifest(folder: Path) -> Manifest:
    """The manifest of the dataset in `folder`; DatasetError where there is none."""
    if not folder.is_dir():
        raise DatasetError(folder, "no such dataset folder")
    path = folder / MANIFEST
    if not path.is_file():
        found = sorted(p.name for p in folder.glob("chunk-*.pt"))
        why = (
            f"no {MANIFEST} beside {len(found)} chunk file(s): its writing did not finish"
            if found
            else f"no {MANIFEST}: not a dataset"
        )
        raise DatasetError(folder, why)
    return Manifest.from_json(path.read_text(encoding="utf-8"), path)


def digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def chunk_on_disk(folder: Path, chunk: Chunk) -> str | None:
    """What is wrong with a chunk's file that its size shows (missing, truncated), or None:
    the check validation makes without reading the data."""
    path = folder / chunk.file
    if not path.is_file():
        return f"{path}: missing: the manifest lists it"
    size = path.stat().st_size
    if size != chunk.bytes:
        return f"{path}: {size} bytes where the manifest says {chunk.bytes}: truncated or replaced"
    return None


def chunk_problem(folder: Path, chunk: Chunk) -> str | None:
    """What is wrong with a chunk's file (missing, truncated, or bytes other than the
    manifest's SHA-256 says), or None."""
    problem = chunk_on_disk(folder, chunk)
    if problem is None and digest(folder / chunk.file) != chunk.sha256:
        return f"{folder / chunk.file}: its SHA-256 differs from the manifest's: corrupt"
    return problem


def read_chunk(folder: Path, chunk: Chunk) -> dict[str, torch.Tensor]:
    """One chunk's tensors, checked against the manifest: its size, its SHA-256, and the
    transition and episode counts it holds."""
    import torch

    path = folder / chunk.file
    problem = chunk_problem(folder, chunk)
    if problem is not None:
        raise DatasetError(path, problem.removeprefix(f"{path}: "))
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a chunk that matches its checksum but does not load
        raise DatasetError(path, f"does not load: {err}") from None
    lengths = data.get("episode/length") if isinstance(data, dict) else None
    if lengths is None or int(lengths.sum()) != chunk.transitions:
        raise DatasetError(path, f"holds other than the {chunk.transitions} transitions the "
                           "manifest lists")  # fmt: skip
    for key, value in data.items():
        rows = chunk.episodes if key.startswith(("episode/", "final/")) else chunk.transitions
        if not torch.is_tensor(value) or value.shape[0] != rows:
            raise DatasetError(path, f"field '{key}' does not have {rows} rows")
    return data


def write_chunk(folder: Path, index: int, data: dict[str, torch.Tensor]) -> Chunk:
    """Write `data` as chunk `index` (whole, under a temporary name until it is complete)."""
    import torch

    name = CHUNK.format(index)
    with replacing(folder / name) as tmp:
        torch.save(data, tmp)
    path = folder / name
    return Chunk(
        name,
        int(data["episode/length"].sum()),
        int(data["episode/length"].numel()),
        path.stat().st_size,
        digest(path),
    )


def write_manifest(folder: Path, manifest: Manifest) -> None:
    with replacing(folder / MANIFEST) as tmp:
        tmp.write_text(manifest_text(manifest), encoding="utf-8")
