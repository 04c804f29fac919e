"""`marlctl eval`: load a finished run's policy and its spec, evaluate it on a chosen backend.

Reads tracking only for the run's resolved spec and `policy/final.pt` (or the latest
checkpoint); a policy trained on `native` evaluates on `pettingzoo` and the other way round.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass

from marlctl import tracking
from marlctl.errors import Problem, SpecError


@dataclass
class EvalResult:
    run_id: str
    seed: int
    env_id: str
    backend: str
    episodes: int
    return_mean: float | None
    returns: dict[str, float]
    checkpoint: str


@dataclass
class EvalSummary:
    runs: list[EvalResult]

    def to_dict(self) -> dict:
        values = [r.return_mean for r in self.runs if r.return_mean is not None]
        mean = sum(values) / len(values) if values else None
        return {"runs": [asdict(r) for r in self.runs], "return_mean": mean}


def _problem(message: str) -> SpecError:
    return SpecError([Problem("RUN_ID", None, "", message)])


def evaluate_runs(
    run_id: str,
    tracking_uri: str | None,
    backend: str | None,
    episodes: int,
    seed: int,
    device: str,
) -> EvalSummary:
    """Evaluate one seed's run, or every finished seed of a parent run."""
    from mlflow.exceptions import MlflowException

    client = tracking.client_for(tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise _problem(f"no run '{run_id}' in {tracking.resolve_uri(tracking_uri)}") from None
    if tracking.PARENT_TAG in run.data.tags:
        targets = [run]
    else:
        children = client.search_runs(
            [run.info.experiment_id], f"tags.`{tracking.PARENT_TAG}` = '{run_id}'"
        )
        targets = sorted(
            (c for c in children if c.info.status == "FINISHED"),
            key=lambda c: int(c.data.tags.get("marlctl.seed", 0)),
        )
        if not targets:
            raise _problem(f"run '{run_id}' has no finished seed runs to evaluate")
    return EvalSummary([_evaluate_one(client, r, backend, episodes, seed, device) for r in targets])


def _evaluate_one(client, run, backend: str | None, episodes: int, seed: int, device: str):
    import torch

    from marlctl.launch import SPEC_ARTIFACT
    from marlctl.plan import compile_plan
    from marlctl.spec import load_spec
    from marlctl.train.runner import (
        CHECKPOINT,
        EVAL_ENVS,
        POLICY,
        build_trainer,
        evaluate,
        make_env,
    )

    run_id = run.info.run_id
    with tempfile.TemporaryDirectory() as tmp:
        try:
            spec_path = client.download_artifacts(run_id, SPEC_ARTIFACT, tmp)
        except Exception:
            raise _problem(f"run '{run_id}' has no {SPEC_ARTIFACT} artifact") from None
        overrides = [f"hardware.device={device}", "hardware.devices=null"]
        if backend is not None:
            overrides.append(f"env.backend={backend}")
        if backend == "native":
            overrides.append("hardware.env_workers=0")
        loaded = load_spec(spec_path, overrides)
        plan = compile_plan(loaded)
        files = {f.path for f in client.list_artifacts(run_id, "policy")}
        files |= {f.path for f in client.list_artifacts(run_id, "checkpoints")}
        artifact = POLICY if POLICY in files else CHECKPOINT if CHECKPOINT in files else None
        if artifact is None:
            raise _problem(f"run '{run_id}' has neither {POLICY} nor {CHECKPOINT}")
        state = torch.load(
            client.download_artifacts(run_id, artifact, tmp), weights_only=True, map_location="cpu"
        )
    spec = loaded.spec
    policies = state["policies"] if artifact == POLICY else state["trainer"]["policies"]
    torch_device = torch.device(plan.runs[0].device)
    # Native envs run every episode at once; PettingZoo ones step in Python, a few at a time.
    num_envs = episodes if spec.env.backend == "native" else min(episodes, EVAL_ENVS)
    trainer = build_trainer(spec, plan.env, num_envs, torch_device, total_iterations=1)
    trainer.policies.load_state_dict(policies)
    env = make_env(spec, plan.env, num_envs, torch_device)
    try:
        (result,) = evaluate(trainer, env, episodes, [seed])
    finally:
        env.close()
    returns = {k.removeprefix("return/"): v for k, v in result.items() if k.startswith("return/")}
    return EvalResult(
        run_id,
        int(run.data.tags.get("marlctl.seed", -1)),
        plan.env.id,
        spec.env.backend,
        episodes,
        result.get("return_mean"),
        returns,
        artifact,
    )
