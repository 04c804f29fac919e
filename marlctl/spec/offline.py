"""The checks an offline spec needs: its algorithm, its budget in gradient steps, and its
dataset, which must exist whole and hold the spec's env, agent groups and spaces."""

from __future__ import annotations

from pathlib import Path

from marlctl.algos import registered_algos
from marlctl.data.format import DatasetError, chunk_on_disk, groups_of, read_manifest
from marlctl.envs.info import EnvInfo
from marlctl.errors import Problem
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
        why = dataset_mismatch(Path(spec.data), spec, info)
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


def dataset_mismatch(folder: Path, spec, info: EnvInfo) -> str | None:
    """Why the dataset in `folder` cannot train the spec's learners, or None. Reads the
    manifest and checks that every chunk is there at its size (not its checksum: training
    checks that as it reads)."""
    try:
        manifest = read_manifest(folder)
    except DatasetError as err:
        return str(err)
    if manifest.env_id != info.id:
        return f"{folder} holds episodes of {manifest.env_id}, not {info.id}"
    learners = learner_info(info, spec)
    if manifest.groups != groups_of(learners):
        want = ", ".join(f"{g.name} x{g.n_agents}" for g in learners.groups)
        have = ", ".join(f"{g['name']} x{len(g['agents'])}" for g in manifest.groups)
        return (f"{folder} holds groups {have}; the spec's learners are {want} (or their "
                "spaces differ: compare `marlctl data describe` with `marlctl list envs "
                "--describe`)")  # fmt: skip
    if manifest.state_dim != learners.state_dim:
        return (f"{folder} holds a global state of {manifest.state_dim} values; the env's "
                f"has {learners.state_dim}")  # fmt: skip
    if not manifest.chunks:
        return f"{folder}: its manifest lists no chunks"
    return next((p for c in manifest.chunks if (p := chunk_on_disk(folder, c))), None)
