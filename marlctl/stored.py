"""What a run keeps in the tracking store, read back: its seed runs, its spec's artifact
name, its policy weights, and which of a spec's seeds the store holds finished or stopped.
A leaf: evaluation, resuming, frozen opponents and cross-play read runs through it, and it
imports none of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from marlctl import tracking
from marlctl.errors import SpecError, one_line

SPEC_ARTIFACT = "spec.yaml"
CHECKPOINT = "checkpoints/latest.pt"
POLICY = "policy/final.pt"
LATEST = "latest"
PRUNED_TAG = "marlctl.pruned_at_step"
CHECKPOINT_STEP_TAG = "marlctl.checkpoint_step"  # the env step of the run's CHECKPOINT


def seed_runs(client, run) -> list:
    """The seed runs under `run` (experiment → seeds, study → trials → seeds), or `run`
    itself when it is one; those that finished training (not pruned), by seed."""
    role = run.data.tags.get("marlctl.role")
    if role == "seed" or (role is None and tracking.PARENT_TAG in run.data.tags):
        return [run]
    found, frontier = [], [run.info.run_id]
    while frontier:
        children = [
            child
            for parent in frontier
            for child in client.search_runs(
                [run.info.experiment_id], f"tags.`{tracking.PARENT_TAG}` = '{parent}'"
            )
        ]
        frontier = []
        for child in children:
            if child.data.tags.get("marlctl.role") in (None, "seed"):
                found.append(child)
            else:
                frontier.append(child.info.run_id)
    return sorted(
        (c for c in found if finished(c)),
        key=lambda c: (int(c.data.tags.get("marlctl.seed", 0)), c.info.start_time or 0),
    )


def finished(run) -> bool:
    """Whether a seed run trained to its budget: FINISHED, not pruned."""
    return run.info.status == "FINISHED" and PRUNED_TAG not in run.data.tags


def not_finished(run) -> str:
    """What to say of a seed run that failed, was killed, still runs or was pruned."""
    status = "PRUNED" if PRUNED_TAG in run.data.tags else run.info.status
    return f"run '{run.info.run_id}' did not finish training ({status}): name a finished run"


def load_tensors(path: str, artifact: str) -> Any:
    """A checkpoint's contents, read with `weights_only=True` (tensors and plain containers,
    never code); ValueError naming `artifact` when the file is not such a checkpoint."""
    import torch

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:
        # PyTorch's own message opens with advice to load the file unsafely: keep its reason.
        text = str(err).partition("WeightsUnpickler error:")[2] or str(err)
        why = one_line(text.split("Please use", 1)[0].split("Check the documentation", 1)[0])
        message = f"cannot load '{artifact}': not a PyTorch checkpoint of tensors"
        raise ValueError(f"{message} ({why or type(err).__name__})") from None


def policy_weights(
    client, run_id: str, checkpoint: str | None, tmp: str, files_too: bool = True
) -> tuple[dict, str]:
    """The policy weights to evaluate and where they came from. `files_too`: a checkpoint
    that is no artifact of the run may be a file on this machine (`eval --checkpoint`; a
    spec's `frozen` names the run's artifacts only)."""
    files = {
        f.path
        for folder in ("policy", "checkpoints")
        for f in client.list_artifacts(run_id, folder)
    }
    if checkpoint is None:
        artifact = POLICY if POLICY in files else CHECKPOINT if CHECKPOINT in files else None
        if artifact is None:
            raise SpecError.at("RUN_ID", f"run '{run_id}' has neither {POLICY} nor {CHECKPOINT}")
        source = client.download_artifacts(run_id, artifact, tmp)
    elif checkpoint == LATEST or checkpoint in files:
        artifact = CHECKPOINT if checkpoint == LATEST else checkpoint
        if artifact not in files:
            raise SpecError.at("--checkpoint", f"run '{run_id}' has no {artifact}")
        source = client.download_artifacts(run_id, artifact, tmp)
    elif files_too and Path(checkpoint).is_file():
        artifact = source = checkpoint
    else:
        known = ", ".join(sorted(files)) or "none"
        listed = f"an artifact of run '{run_id}' ({known})"
        what = f"neither {listed} nor a file" if files_too else f"not {listed}"
        raise SpecError.at("--checkpoint", f"'{checkpoint}' is {what}")
    try:
        state = load_tensors(source, artifact)
    except ValueError as err:
        raise SpecError.at("--checkpoint", str(err)) from None
    if isinstance(state, dict) and "policies" in state:
        return state["policies"], artifact
    trainer = state.get("trainer") if isinstance(state, dict) else None
    if isinstance(trainer, dict) and "policies" in trainer:
        return trainer["policies"], artifact
    raise SpecError.at("--checkpoint", f"'{artifact}' holds no marlctl policy weights")


def load_into(trainer, policies: Any, artifact: str) -> None:
    """Weights into the run's networks to act with, or exit 2 naming what does not fit.

    An on-policy critic (and its value normaliser) is not read for acting and is left out:
    a policy plays though its critic's network has changed since it was trained (a frame
    state that an MLP read before convolutions did)."""
    unread = acting_unread(trainer.policies)
    try:
        kept = {k: v for k, v in policies.items() if not k.startswith(unread)}
        missing, unexpected = trainer.policies.load_state_dict(kept, strict=False)
        missing = [k for k in missing if not k.startswith(unread)]
        if missing or unexpected:
            raise KeyError(f"missing keys {missing[:4]}, unexpected keys {unexpected[:4]}")
    except (RuntimeError, TypeError, AttributeError, KeyError, ValueError) as err:
        message = f"'{artifact}' does not fit this run's networks: {one_line(str(err))}"
        raise SpecError.at("--checkpoint", message) from None


def acting_unread(policies) -> tuple[str, ...]:
    """The key prefixes of `policies`' weights that acting does not read: those a module
    names in its `unread_for_acting` (an on-policy group's critic and value normaliser)."""
    return tuple(
        f"{name}.{part}."
        for name, module in policies.named_modules()
        for part in getattr(module, "unread_for_acting", ())
    )


def identity_tags(loaded) -> dict[str, str]:
    """What makes two runs of a spec the same experiment: the spec's hash (seeds aside), the
    versions of marlctl and torch, and the env package with its version."""
    from marlctl.envs.registry import env_package

    env = loaded.spec.env
    return {
        "marlctl.spec_hash": tracking.spec_hash(loaded.resolved),
        "marlctl.versions": tracking.package_versions(),
        tracking.ENV_PACKAGE_TAG: env_package(env.id, env.backend),
    }


def _seed_runs(loaded, plan, *statuses: str) -> list:
    """The seed runs of this spec (`identity_tags`) in its store with one of `statuses`,
    newest first."""
    client = tracking.client_for(loaded.spec.tracking.uri)
    experiment = client.get_experiment_by_name(plan.experiment)
    if experiment is None:
        return []
    query = " and ".join(f"tags.`{k}` = '{_quoted(v)}'" for k, v in identity_tags(loaded).items())
    found = [
        run
        for status in statuses
        for run in client.search_runs(
            [experiment.experiment_id], f"{query} and status = '{status}'"
        )
    ]
    return sorted(found, key=lambda run: -run.info.start_time)


def finished_seeds(loaded, plan, metric: str) -> dict[int, tuple[float, str]]:
    """The seeds of this spec (`identity_tags`) that finished in its store with a final
    `metric`, by seed: their value and run id, the newest run of a seed trained more than once."""
    found: dict[int, tuple[float, str]] = {}
    for run in _seed_runs(loaded, plan, "FINISHED"):
        seed, value = run.data.tags.get("marlctl.seed"), run.data.metrics.get(metric)
        if seed is not None and value is not None:
            found.setdefault(int(seed), (value, run.info.run_id))
    return found


class Stopped(NamedTuple):
    run_id: str  # the run `resume` continues
    parent: str  # its parent's id (its own where it has none)
    step: int  # the env step its checkpoint holds (0 where it saved none)


def stopped_seeds(loaded, plan) -> dict[int, Stopped]:
    """The seeds of this spec whose run in its store was stopped, by seed: the newest such
    run, which `resume` continues. Stopped: KILLED (Ctrl-C or SIGTERM, after a checkpoint),
    or left RUNNING by a process of this machine that has ended without a word
    (`marlctl.processes`); a run RUNNING elsewhere may be training: `run --resume`."""
    from marlctl.processes import PROCESS_TAG, ended

    found: dict[int, Stopped] = {}
    for run in _seed_runs(loaded, plan, "KILLED", "RUNNING"):
        if run.info.status == "RUNNING" and not ended(run.data.tags.get(PROCESS_TAG)):
            continue  # may be training still
        tags = run.data.tags
        seed, parent = tags.get("marlctl.seed"), tags.get(tracking.PARENT_TAG)
        if seed is not None:
            step = int(tags.get(CHECKPOINT_STEP_TAG, 0))
            found.setdefault(int(seed), Stopped(run.info.run_id, parent or run.info.run_id, step))
    return found


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")
