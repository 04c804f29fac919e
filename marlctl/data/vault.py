"""Off-the-Grid MARL's datasets: flashbax Vaults read and converted into marlctl datasets.

A Vault (flashbax 0.1, format version 1.x) is a folder `<env>/<scenario>.vlt/<dataset>/`:
`metadata.json` holds the experience's structure (every leaf's shape and dtype), and each
leaf is a zarr array in a TensorStore OCDBT database in the folder, named by its path
(`observations.`, `infos.legals.`), shaped `[B, T, ...]`: B streams of steps, of which
the `vault_index` array says how many are written. Off-the-Grid MARL's leaves, per step and
agent: `observations` `[.., N, O]`, `actions` `[.., N]`, `rewards`, `terminals`,
`truncations` `[.., N]`, and `infos.legals` `[.., N, A]`, `infos.state` `[.., S]`.

An episode ends at a step whose terminal or truncation is set; the steps after the last
end in a stream (an unfinished episode) are left out. A Vault keeps no episode's final
observation: the last step's own stands in, so a learner should not bootstrap through the
time limit of a converted dataset (`algo.bootstrap_time_limit: false`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from marlctl.data.format import DatasetError, Manifest, Source, groups_of
from marlctl.data.writer import DatasetWriter
from marlctl.envs.info import EnvInfo

METADATA = "metadata.json"
REQUIRED = ("observations.", "actions.", "rewards.", "terminals.", "truncations.")


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """`{"infos": {"state": x}}` -> `{"infos.state.": x}`: flashbax's datastore names."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out |= _leaves(value, f"{prefix}{key}.")
    return out


def _spec(folder: Path, name: str) -> dict:
    return {
        "driver": "zarr",
        "kvstore": {"driver": "ocdbt", "base": f"file://{folder.resolve()}", "path": name},
    }


def read_vault(folder: Path) -> dict[str, np.ndarray]:
    """Every leaf of the Vault in `folder`, its written steps only: `name -> [B, T, ...]`."""
    try:
        import tensorstore as ts
    except ImportError:
        raise DatasetError(folder, "reading a Vault needs TensorStore: pip install "
                           "'marlctl[ogmarl]'") from None  # fmt: skip
    path = folder / METADATA
    if not path.is_file():
        raise DatasetError(folder, f"no {METADATA}: not a flashbax Vault")
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
        version = float(metadata["version"])
        names = list(_leaves(metadata["structure_shape"]))
    except (ValueError, KeyError, TypeError) as err:
        raise DatasetError(path, f"not a flashbax Vault's metadata: {err}") from None
    if int(version) != 1:
        raise DatasetError(path, f"Vault format version {version}; this reads version 1")
    missing = [n.rstrip(".") for n in REQUIRED if n not in names]
    if missing:
        raise DatasetError(path, f"no {', '.join(missing)}: not an Off-the-Grid MARL dataset")
    try:
        written = int(ts.open(_spec(folder, "vault_index")).result().read().result()[0])
        return {
            name: np.asarray(ts.open(_spec(folder, name)).result()[:, :written].read().result())
            for name in names
        }
    except Exception as err:  # TensorStore's own errors: a missing or damaged store
        raise DatasetError(folder, f"cannot read the Vault: {err}") from None


def _check_shapes(folder: Path, leaves: dict[str, np.ndarray], info: EnvInfo) -> None:
    """The Vault's agents and spaces against the env's single group."""
    if len(info.groups) != 1:
        raise DatasetError(folder, f"{info.id} has {len(info.groups)} agent groups; an "
                           "Off-the-Grid MARL dataset stores one")  # fmt: skip
    group = info.groups[0]
    obs = leaves["observations."]
    if obs.ndim != 4 or obs.shape[2] != group.n_agents or obs.shape[3] != group.obs_dim:
        raise DatasetError(folder, f"observations {tuple(obs.shape[2:])} per step; {info.id} "
                           f"has {group.n_agents} agents of {group.obs_dim} values")  # fmt: skip
    legals = leaves.get("infos.legals.")
    if legals is not None and legals.shape[-1] != group.n_actions:
        raise DatasetError(folder, f"{legals.shape[-1]} actions; {info.id} has "
                           f"{group.n_actions}")  # fmt: skip
    state = leaves.get("infos.state.")
    if state is not None and state.shape[-1] != info.state_dim:
        raise DatasetError(folder, f"a global state of {state.shape[-1]} values; {info.id} "
                           f"has {info.state_dim}")  # fmt: skip
    if state is None and info.state_dim != group.n_agents * group.obs_dim:
        raise DatasetError(folder, f"no infos.state, and {info.id}'s global state is not "
                           "its agents' observations side by side")  # fmt: skip


def _episodes(leaves: dict[str, np.ndarray], name: str, row: int) -> dict | None:
    """Stream `row`'s whole episodes as chunk fields; None where none ends in it."""
    import torch

    ended = (leaves["terminals."][row] > 0).any(-1) | (leaves["truncations."][row] > 0).any(-1)
    ends = np.flatnonzero(ended)
    if len(ends) == 0:
        return None
    steps = ends[-1] + 1  # the unfinished episode after the last end is left out
    obs = torch.as_tensor(leaves["observations."][row, :steps], dtype=torch.float32)
    state = leaves.get("infos.state.")
    state = obs.flatten(1) if state is None else torch.as_tensor(state[row, :steps]).float()
    rewards = torch.as_tensor(leaves["rewards."][row, :steps], dtype=torch.float32)
    lengths = torch.as_tensor(np.diff(np.concatenate([[-1], ends])))
    per_episode = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    summed = torch.zeros(len(lengths), rewards.shape[1]).index_add_(0, per_episode, rewards)
    last = torch.as_tensor(ends)
    terminated = torch.as_tensor((leaves["terminals."][row, :steps] > 0).any(-1))
    data = {
        f"obs/{name}": obs,
        f"action/{name}": torch.as_tensor(leaves["actions."][row, :steps]).long(),
        f"reward/{name}": rewards,
        f"active/{name}": torch.ones(obs.shape[:2], dtype=torch.bool),
        "state": state,
        "terminated": terminated,
        "truncated": torch.as_tensor(ended[:steps]) & ~terminated,
        "episode/length": lengths,
        "episode/source": torch.zeros(len(lengths), dtype=torch.long),
        "episode/return": summed.mean(-1),
        f"final/obs/{name}": obs[last],
        f"final/active/{name}": torch.ones(len(last), obs.shape[1], dtype=torch.bool),
        "final/state": state[last],
    }
    legals = leaves.get("infos.legals.")
    if legals is not None:
        mask = torch.as_tensor(legals[row, :steps] > 0)
        data[f"mask/{name}"], data[f"final/mask/{name}"] = mask, mask[last]
    return data


def convert_vault(folder: Path, out: Path, info: EnvInfo, params: dict | None = None) -> Manifest:
    """The Vault in `folder` as a marlctl dataset in `out`, for env `info` (its one group:
    the Vault's agents in order)."""
    folder = Path(folder)
    leaves = read_vault(folder)
    _check_shapes(folder, leaves, info)
    group = info.groups[0]
    if group.mask_source is not None and "infos.legals." not in leaves:
        raise DatasetError(folder, f"{info.id} masks actions and the Vault has no infos.legals")
    note = (f"converted from the Vault {folder}: it keeps no final observation, so the last "
            "step's stands in (train with algo.bootstrap_time_limit: false)")  # fmt: skip
    manifest = Manifest(info.id, "pettingzoo", dict(params or {}), "og-marl vault",
                        groups_of(info), info.state_dim,
                        sources=[Source(None, None, str(folder), "vault")], note=note)  # fmt: skip
    writer = DatasetWriter(Path(out), manifest)
    try:
        for row in range(leaves["observations."].shape[0]):
            data = _episodes(leaves, group.name, row)
            if data is not None:
                if group.mask_source is None:
                    data = {k: v for k, v in data.items() if "mask/" not in k}
                writer.add(data)
        return writer.close()
    except BaseException:
        writer.abort()
        raise
