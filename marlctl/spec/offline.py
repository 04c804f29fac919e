"""The checks an offline spec needs: its algorithm, its budget in gradient steps, and its
dataset (a folder, or a run's artifact in the tracking store), which must exist whole and
hold the spec's env, agent groups and spaces."""

from __future__ import annotations

from pathlib import Path

from marlctl.algos import registered_algos
from marlctl.data import artifacts
from marlctl.data.format import DatasetError, Manifest, chunk_on_disk, groups_of, read_manifest
from marlctl.envs.info import EnvInfo
from marlctl.errors import MarlctlError, Problem
from marlctl.spec.provenance import Provenance
from marlctl.spec.teams import learner_info


def offline_problems(spec, prov: Provenance, info: EnvInfo) -> list[Problem]:
    offline = registered_algos()[spec.algo.name].offline
    names = ", ".join(n for n, a in registered_algos().items() if a.offline)
    problems = []
    if offline and spec.data is None:
        problems.append(prov.problem("algo.name", f"{spec.algo.name} trains offline, from a "
                                     "recorded dataset: set `data: PATH`"))  # fmt: skip
    if not offline and spec.data is not None:
        message = f"{spec.algo.name} learns from the env: only offline algorithms ({names}) "
        problems.append(prov.problem("data", message + "train from a dataset"))
    if offline and spec.train.total_updates is None:
        problems.append(prov.problem("train", f"{spec.algo.name} counts gradient steps: set "
                                     "train.total_updates"))  # fmt: skip
    if not offline and spec.train.total_updates is not None:
        message = "counts an offline algorithm's gradient steps; an online run counts "
        problems.append(prov.problem("train.total_updates", message + "total_env_steps"))
    if offline and spec.data is not None:
        why = dataset_mismatch(spec.data, spec, info)
        if why is not None:
            problems.append(prov.problem("data", why))
    if spec.train.record is not None:
        problems += _record_problems(spec, prov, offline)
    return problems


def _record_problems(spec, prov: Provenance, offline: bool) -> list[Problem]:
    if offline:
        message = f"{spec.algo.name} trains from a dataset and collects nothing to record"
        return [prov.problem("train.record", message)]
    folder = Path(spec.train.record).expanduser()
    used = [
        str(folder / f"seed-{seed}")
        for seed in spec.seeds
        if (folder / f"seed-{seed}").exists() and any((folder / f"seed-{seed}").iterdir())
    ]
    if used:
        message = f"{', '.join(used)} exist(s): name a new folder (a run writes RECORD/seed-N)"
        return [prov.problem("train.record", message)]
    return []


def dataset_mismatch(data: str, spec, info: EnvInfo) -> str | None:
    """Why the dataset `data` names (a folder, or `runs:/RUN_ID/PATH`) cannot train the
    spec's learners, or None. Reads the manifest and checks that every chunk is there at its
    size (not its checksum: training checks that as it reads)."""
    try:
        if artifacts.is_artifact(data):
            client = _store_client(spec.tracking.uri, data)
            manifest = artifacts.remote_manifest(client, data)
        else:
            manifest = read_manifest(Path(data))
    except DatasetError as err:
        return str(err)
    why = manifest_mismatch(manifest, data, spec, info)
    if why is not None:
        return why
    if artifacts.is_artifact(data):
        return artifacts.remote_problem(client, data, manifest)
    folder = Path(data)
    return next((p for c in manifest.chunks if (p := chunk_on_disk(folder, c))), None)


def _store_client(uri: str | None, data: str):
    from marlctl import tracking

    try:
        tracking.check_store(uri)
    except MarlctlError as err:
        raise DatasetError(data, f"the tracking store holding the run: {err}") from None
    return tracking.client_for(uri)


def manifest_mismatch(manifest: Manifest, where: str, spec, info: EnvInfo) -> str | None:
    if manifest.env_id != info.id:
        return f"{where} holds episodes of {manifest.env_id}, not {info.id}"
    learners = learner_info(info, spec)
    if manifest.groups != groups_of(learners):
        want = ", ".join(f"{g.name} x{g.n_agents}" for g in learners.groups)
        have = ", ".join(f"{g['name']} x{len(g['agents'])}" for g in manifest.groups)
        return (f"{where} holds groups {have}; the spec's learners are {want} (or their "
                "spaces differ: compare `marlctl data describe` with `marlctl list envs "
                "--describe`)")  # fmt: skip
    if manifest.state_dim != learners.state_dim:
        return (f"{where} holds a global state of {manifest.state_dim} values; the env's "
                f"has {learners.state_dim}")  # fmt: skip
    if not manifest.chunks:
        return f"{where}: its manifest lists no chunks"
    return None
