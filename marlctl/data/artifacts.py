"""A dataset kept as a run's artifact, named as MLflow names artifacts: `runs:/RUN_ID/PATH`.

`marlctl data log DIR --run RUN_ID` puts a dataset there, checked chunk by chunk, the
manifest uploaded last (so a reader never sees a manifest whose chunks are not all there).
A spec's `data: runs:/RUN_ID/PATH` reads it back: from the artifact folder itself where the
store keeps artifacts as files on this machine, else from a copy downloaded once into the
dataset cache (`$MARLCTL_CACHE`, else `~/.cache/marlctl`, under `datasets/RUN_ID/PATH`),
whole or not at all, and reused while its manifest is the run's.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from marlctl.data.format import (
    MANIFEST,
    DatasetError,
    Manifest,
    chunk_on_disk,
    chunk_problem,
    manifest_text,
    read_manifest,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient

SCHEME = "runs:/"


def is_artifact(value: str) -> bool:
    return value.startswith(SCHEME)


def parse(uri: str) -> tuple[str, str]:
    """(run id, artifact path) of `runs:/RUN_ID/PATH`."""
    run_id, _, path = uri.removeprefix(SCHEME).strip("/").partition("/")
    if not re.fullmatch("[0-9a-f]{32}", run_id):
        raise DatasetError(uri, "name a run's dataset as runs:/RUN_ID/PATH, with the whole "
                           "32-digit run id (`marlctl data log` prints it)")  # fmt: skip
    return run_id, path.strip("/")


def artifact_uri(run_id: str, path: str) -> str:
    return f"{SCHEME}{run_id}/{path}" if path else f"{SCHEME}{run_id}"


def _joined(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


def remote_manifest(client: MlflowClient, uri: str) -> Manifest:
    """The manifest of the dataset at `uri`, read without its chunks."""
    from mlflow.exceptions import MlflowException

    run_id, path = parse(uri)
    try:
        client.get_run(run_id)
    except MlflowException:
        raise DatasetError(uri, f"no run {run_id} in the tracking store") from None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = client.download_artifacts(run_id, _joined(path, MANIFEST), tmp)
        except (MlflowException, OSError):
            why = f"run {run_id} holds no dataset at '{path}' (no {MANIFEST}): "
            raise DatasetError(uri, why + "`marlctl data log` puts one there") from None
        return Manifest.from_json(Path(local).read_text(encoding="utf-8"), f"{uri}/{MANIFEST}")


def remote_problem(client: MlflowClient, uri: str, manifest: Manifest) -> str | None:
    """What is wrong with the dataset's chunks in the store that their sizes show, or None."""
    run_id, path = parse(uri)
    sizes = {
        Path(f.path).name: f.file_size
        for f in client.list_artifacts(run_id, path or None)
        if not f.is_dir
    }
    for chunk in manifest.chunks:
        where = f"{uri}/{chunk.file}"
        if chunk.file not in sizes:
            return f"{where}: missing: the manifest lists it"
        if sizes[chunk.file] != chunk.bytes:
            return (f"{where}: {sizes[chunk.file]} bytes where the manifest says "
                    f"{chunk.bytes}: truncated or replaced")  # fmt: skip
    return None


def local_folder(client: MlflowClient, uri: str) -> Path:
    """The dataset at `uri` as a folder on this machine: the artifact folder itself where the
    store's artifacts are local files, else the cache's checked copy."""
    run_id, path = parse(uri)
    root = urlsplit(client.get_run(run_id).info.artifact_uri)
    if root.scheme in ("", "file"):
        return Path(unquote(root.path)) / path
    return cached_copy(client, uri, cache_root())


def cache_root() -> Path:
    base = os.environ.get("MARLCTL_CACHE") or Path.home() / ".cache" / "marlctl"
    return Path(base) / "datasets"


def cached_copy(client: MlflowClient, uri: str, cache: Path) -> Path:
    """The dataset downloaded into `cache/RUN_ID/PATH`, or the copy already there while its
    manifest is the store's. A download lands under a temporary name and is renamed whole:
    run processes that download together each land theirs, and one of them stays."""
    run_id, path = parse(uri)
    manifest = remote_manifest(client, uri)
    target = cache / run_id / (path or "_")
    if _same_copy(target, manifest):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        local = Path(client.download_artifacts(run_id, path, tmp))
        if not _same_copy(local, manifest):
            raise DatasetError(uri, "changed in the store while it was downloaded: run again")
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            local.rename(target)
        except OSError:  # another process put its copy there first
            if not _same_copy(target, manifest):
                raise
    return target


def _same_copy(folder: Path, manifest: Manifest) -> bool:
    try:
        here = read_manifest(folder)
    except DatasetError:
        return False
    return manifest_text(here) == manifest_text(manifest) and not any(
        chunk_on_disk(folder, c) for c in manifest.chunks
    )


def log_dataset(client: MlflowClient, run_id: str, folder: Path, path: str) -> str:
    """Put the dataset in `folder` into run `run_id`'s artifacts at `path`, every chunk
    checked against the manifest first, the manifest last; its `runs:/` URI."""
    manifest = read_manifest(folder)
    for chunk in manifest.chunks:
        problem = chunk_problem(folder, chunk)
        if problem is not None:
            raise DatasetError(folder, f"not logged: {problem}")
    uri = artifact_uri(run_id, path)
    if client.list_artifacts(run_id, path or None):
        raise DatasetError(uri, "the run already holds artifacts there: name another --path")
    for chunk in manifest.chunks:
        client.log_artifact(run_id, str(folder / chunk.file), artifact_path=path or None)
    client.log_artifact(run_id, str(folder / MANIFEST), artifact_path=path or None)
    return uri
