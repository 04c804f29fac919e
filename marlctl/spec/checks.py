"""The checks that need the env's info and the machine: what keeps a valid spec from
running here, each problem at its spec line. `check_spec` runs them all; `marlctl validate`,
`run`, `sweep` and `bench` go through it (by way of `marlctl.plan.compile_plan`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from marlctl.algos import registered_algos
from marlctl.errors import Problem, SpecError
from marlctl.spec.offline import offline_problems
from marlctl.spec.players import players_problems
from marlctl.spec.problems import env_problem
from marlctl.spec.provenance import LoadedSpec, Provenance, sort_problems
from marlctl.spec.teams import learning_teams, team_rollouts

if TYPE_CHECKING:
    from marlctl.envs.info import EnvInfo


def check_spec(loaded: LoadedSpec, env_info: EnvInfo | None, gpus: int) -> EnvInfo:
    """The env's info (probed unless given) once every check passes, on a machine with
    `gpus` visible CUDA devices; SpecError listing every problem otherwise. The players
    (scripted policies, frozen runs, runs a pool includes) are loaded last, once the rest
    is right: a frozen run takes seconds to read."""
    spec, prov = loaded.spec, loaded.provenance
    info = env_info if env_info is not None else probed_env(loaded)
    problems = [
        *_backend_problems(spec, prov, info),
        *_group_problems(spec, prov, info),
        *_reward_problems(spec, prov, info),
        *_sharing_problems(spec, prov, info),
        *_encoder_problems(spec, prov, info),
        *_rollout_problems(spec, prov, info),
        *_hardware_problems(spec, prov, gpus),
        *_schedule_problems(spec, prov, info),
        *offline_problems(spec, prov, info),
    ]
    if problems:
        raise SpecError(sort_problems(problems))
    problems = players_problems(loaded, info)
    if problems:
        raise SpecError(problems)
    return info


def probed_env(loaded: LoadedSpec) -> EnvInfo:
    """The spec's env, built, reset and stepped once; SpecError at its lines if it fails."""
    from marlctl.envs.native import described_natively, native_class
    from marlctl.envs.probe import probe

    spec, prov = loaded.spec, loaded.provenance
    params = dict(spec.env.params)
    problem = native_params_problem(spec.env.id, spec.env.backend, params, prov)
    if problem is not None:
        raise SpecError([problem])
    try:
        if spec.env.backend == "native" and described_natively(spec.env.id, params):
            from marlctl.envs.native.base import describe_native

            return describe_native(native_class(spec.env.id), params)
        return probe(spec.env.id, params)
    except Exception as err:
        raise SpecError([env_problem(spec.env.id, err, prov, params)]) from None


def _backend_problems(spec, prov: Provenance, info: EnvInfo) -> list[Problem]:
    from marlctl.envs.native import native_only_problem, native_problem

    problems = []
    problem = native_only_problem(info.id, spec.env.backend) or vmas_problem(
        spec.env.id, spec.env.backend, spec.hardware.env_workers
    )
    if problem is not None:
        problems.append(prov.problem(*problem))
    elif spec.env.backend == "native":
        problem = native_problem(info.id, dict(spec.env.params))
        if problem is not None:
            problems.append(prov.problem(*problem))
        if spec.hardware.env_workers:
            problems.append(
                prov.problem(
                    "hardware.env_workers",
                    "worker processes step PettingZoo envs only; backend: native steps every "
                    "env in one batch on the run's device (set env_workers: 0)",
                )
            )
    return problems


def _group_problems(spec, prov: Provenance, info: EnvInfo) -> list[Problem]:
    """Groups the env does not have, no group left to learn, pools and teams that cannot."""
    problems = []
    names = [g.name for g in info.groups]
    for key in spec.groups:
        if key not in names:
            problems.append(
                prov.problem(
                    f"groups.{key}",
                    f"no agent group '{key}' in env '{spec.env.id}'; groups: {', '.join(names)}",
                )
            )
    if names and set(names) <= set(spec.opponents):
        problems.append(
            prov.problem(
                "groups",
                f"every agent group of env '{spec.env.id}' is scripted or frozen: leave at "
                "least one to learn",
            )
        )
    problems += _pool_problems(prov, spec, info)
    for _, keys, algo_cfg, model, groups in learning_teams(spec, info):
        problems += _algo_problems(prov, spec.env.id, info, keys, algo_cfg, model, groups)
    return problems


def _reward_problems(spec, prov: Provenance, info: EnvInfo) -> list[Problem]:
    weights, k = spec.env.reward_weights, info.objectives
    if weights is not None and not k:
        message = f"env '{spec.env.id}' has a scalar reward: there are no objectives to weigh"
        return [prov.problem("env.reward_weights", message)]
    if weights is not None and len(weights) != k:
        message = f"env '{spec.env.id}' has {k} objectives; give {k} weights, not {len(weights)}"
        return [prov.problem("env.reward_weights", message)]
    if k and spec.env.backend != "pettingzoo":
        return [prov.problem("env.backend", "multi-objective envs run on backend pettingzoo")]
    return []


def _sharing_problems(spec, prov: Provenance, info: EnvInfo) -> list[Problem]:
    sharing = spec.model.sharing
    if not isinstance(sharing, dict):
        return []
    names = [g.name for g in info.groups]
    return [
        prov.problem(
            f"model.sharing.{key}",
            f"no agent group '{key}' in env '{spec.env.id}'; groups: {', '.join(sorted(names))}",
        )
        for key in sharing
        if key not in names
    ]


def _encoder_problems(spec, prov: Provenance, info: EnvInfo) -> list[Problem]:
    """`model.encoder: cnn` for groups with frames, whose size the convolutions fit."""
    model, problems = spec.model, []
    groups = {g.name: g for g in info.groups}
    named = model.encoder if isinstance(model.encoder, dict) else {}
    for key in named:
        if key not in groups:
            message = f"no agent group '{key}' in env '{spec.env.id}'; groups: "
            problems.append(prov.problem(f"model.encoder.{key}", message + ", ".join(groups)))
    for name, group in groups.items():
        if model.encoder_for(name) != "cnn":
            continue
        where = f"model.encoder.{name}" if name in named else "model.encoder"
        frames = group.frame_shape
        if frames is None:
            message = (
                f"group {name}'s observations {list(group.obs_shape)} are not frames "
                "([H, W, C] or [H, W]); the cnn encoder reads frames"
            )
            problems.append(prov.problem(where, message))
        elif sizes := model.cnn.emptied(frames):
            message = f"the convolutions leave nothing of group {name}'s frames: {sizes}"
            problems.append(prov.problem("model.cnn", message))
    algo = registered_algos().get(spec.algo.name)
    frames = info.state_frame
    reads = algo is not None and algo.on_policy and algo.centralised_critic
    if reads and frames and any(model.encoder_for(g) == "cnn" for g in groups):
        if sizes := model.cnn.for_state().emptied(frames):
            message = (
                "the convolutions leave nothing of the global state's frame, which the "
                f"centralised critic reads: {sizes} (model.cnn.state_downsample pools it "
                "apart from the observations)"
            )
            problems.append(prov.problem("model.cnn", message))
    return problems


def _rollout_problems(spec, prov: Provenance, info: EnvInfo) -> list[Problem]:
    rounds = team_rollouts(spec, info)
    longest = max((steps for _, steps in rounds), default=1)
    return [
        prov.problem(
            f"{key}.rollout_steps",
            f"{steps} rollout steps do not divide the longest team's {longest}: the "
            "teams step one env together, so each team's rollout_steps must divide "
            "every longer one's",
        )
        for key, steps in rounds
        if longest % steps
    ]


def _schedule_problems(spec, prov: Provenance, info: EnvInfo) -> list[Problem]:
    """`train.schedule` changes only what a row of a batch may have of its own, to values
    its field takes, and the env params the env lets change during training."""
    from pydantic import ValidationError

    from marlctl.spec.sections import schedule_points

    fields, config = spec.row_fields, type(spec.algo)
    problems = []
    for key, entry in spec.train.schedule.items():
        where = f"train.schedule.{key}"
        section, _, name = key.partition(".")
        points, linear = schedule_points(entry)
        if section == "env":
            if name not in info.schedulable:
                able = ", ".join(f"env.{p}" for p in info.schedulable) or "none of its params"
                message = f"{info.id} lets a schedule change {able} during training"
                problems.append(prov.problem(where, message))
            continue
        if section != "algo" or name not in fields:
            able = ", ".join(f"algo.{f}" for f in fields) or f"nothing of {spec.algo.name}"
            message = f"a schedule changes only what a row may have of its own: {able}"
            problems.append(prov.problem(where, message + "; and env params the env names"))
            continue
        whole = isinstance(getattr(spec.algo, name), int)
        if linear and whole:
            message = f"algo.{name} takes whole numbers: give it [step, value] points"
            problems.append(prov.problem(where, message))
            continue
        for step, value in points:
            taken = int(value) if whole and float(value).is_integer() else value
            try:
                config.model_validate({**spec.algo.model_dump(), name: taken})
            except ValidationError as err:
                message = f"{value:g} from env step {step}: {err.errors()[0]['msg']}"
                problems.append(prov.problem(where, message))
                break
    return problems


def _hardware_problems(spec, prov: Provenance, gpus: int) -> list[Problem]:
    hw, train = spec.hardware, spec.train
    problems = []
    pool = list(hw.devices) if hw.devices else [resolve_device(hw.device, gpus)]
    for index, device in enumerate(pool):
        if not device.startswith("cuda"):
            continue
        ordinal = int(device.split(":")[1]) if ":" in device else 0
        if ordinal >= gpus:
            key = f"hardware.devices.{index}" if hw.devices else "hardware.device"
            asked = hw.devices[index] if hw.devices else hw.device
            message = f"{asked} requested but this machine has {gpus} visible CUDA device(s)"
            problems.append(prov.problem(key, message))
    if hw.devices and hw.device not in ("auto", *hw.devices):
        problems.append(
            prov.problem(
                "hardware.device",
                f"'{hw.device}' conflicts with hardware.devices {hw.devices}; "
                "set device: auto or list it in hardware.devices",
            )
        )
    if hw.tf32 and all(d == "cpu" for d in (hw.devices or [hw.device])):
        problems.append(
            prov.problem(
                "hardware.tf32",
                "TF32 is a precision of CUDA devices and this run trains on the CPU; drop "
                "tf32 or train on cuda",
            )
        )
    if hw.batch_seeds and spec.env.backend not in ("native", "vmas"):
        problems.append(
            prov.problem(
                "hardware.batch_seeds",
                "seeds are batched on env.backend: native or vmas only (PettingZoo envs step "
                "one at a time in Python)",
            )
        )
    if hw.env_workers > hw.num_envs:
        problems.append(
            prov.problem(
                "hardware.env_workers",
                f"{hw.env_workers} workers for hardware.num_envs={hw.num_envs} environments; "
                "use at most one worker per environment",
            )
        )
    if train.eval_every > train.budget:
        budget = "total_updates" if train.total_updates else "total_env_steps"
        problems.append(
            prov.problem(
                "train.eval_every",
                f"{train.eval_every} exceeds train.{budget}={train.budget}; no evaluation "
                "would run before the end",
            )
        )
    return problems


def resolve_device(device: str, gpus: int) -> str:
    """The device `hardware.device` names on a machine with `gpus` visible CUDA devices."""
    if device == "auto":
        return "cuda:0" if gpus > 0 else "cpu"
    return "cuda:0" if device == "cuda" else device


def _pool_problems(prov, spec, info: EnvInfo) -> list:
    """What keeps a group's pool of snapshots from leaving anyone to learn."""
    problems = []
    sizes = {g.name: g.n_agents for g in info.groups}
    learning = [name for name in sizes if name not in spec.opponents]
    for name, pool in spec.pools.items():
        if name not in sizes:
            continue  # reported as an unknown group
        where = f"groups.{name}.pool"
        if pool.seats == "one":
            if sizes[name] < 2:
                problems.append(
                    prov.problem(
                        f"{where}.seats",
                        f"seats: one leaves the learner the other agents of group '{name}', "
                        f"which has only one; use seats: all",
                    )
                )
            continue
        if pool.share >= 1.0:
            problems.append(
                prov.problem(
                    f"{where}.share",
                    f"share: 1 with seats: all has snapshots play group '{name}' in every "
                    "episode: it would never learn; lower share or use seats: one",
                )
            )
        elif learning == [name]:
            problems.append(
                prov.problem(
                    where,
                    f"group '{name}' is the only one that learns: with seats: all a snapshot "
                    "plays every learner in its episodes; use seats: one for self-play",
                )
            )
    return problems


def _algo_problems(prov, env_id: str, info: EnvInfo, keys, cfg, model, groups) -> list:
    """What keeps algorithm `cfg` with `model` (at spec `keys`) from training `groups`."""
    algo = registered_algos()[cfg.name]
    key, model_key = keys
    problems = []
    for group in groups:
        kind = "discrete" if group.discrete else "continuous"
        if kind not in algo.action_kinds:
            problems.append(
                prov.problem(
                    f"{key}.name",
                    f"algorithm '{algo.name}' does not support {kind} actions, which env "
                    f"'{env_id}' group '{group.name}' has (env.id)",
                )
            )
    if info.turn_based and not algo.turn_based:
        able = ", ".join(name for name, a in registered_algos().items() if a.turn_based)
        problems.append(
            prov.problem(
                f"{key}.name",
                f"algorithm '{algo.name}' does not train on turn-based envs like "
                f"'{env_id}' (one player moves per step): its transitions are single "
                f"steps; use one of {able}",
            )
        )
    dist = model.action_dist
    if dist is not None and dist not in algo.action_dists:
        able = ", ".join(name for name, a in registered_algos().items() if dist in a.action_dists)
        problems.append(
            prov.problem(
                f"{model_key}.action_dist",
                f"algorithm '{algo.name}' has no '{dist}' policy"
                + (
                    f" (its continuous policies: {', '.join(algo.action_dists)})"
                    if algo.action_dists
                    else " (its continuous actions are deterministic or it has none)"
                )
                + f"; set {model_key}.action_dist: null or use one of {able}",
            )
        )
    if model.recurrent is not None and not algo.recurrent:
        able = ", ".join(name for name, a in registered_algos().items() if a.recurrent)
        problems.append(
            prov.problem(
                f"{model_key}.recurrent",
                f"algorithm '{algo.name}' has no recurrent agents (env '{env_id}'): it "
                f"trains on single transitions; set {model_key}.recurrent: null or use one "
                f"of {able}",
            )
        )
    elif model.recurrent is not None and getattr(cfg, "n_step", 1) > 1:
        problems.append(
            prov.problem(
                f"{key}.n_step",
                f"n-step returns ({cfg.n_step}) need feed-forward agents: recurrent ones "
                f"train on sequences; set {key}.n_step: 1 or {model_key}.recurrent: null",
            )
        )
    return problems


def vmas_problem(env_id: str, backend: str, workers: int) -> tuple[str, str] | None:
    """(key, message) when a VMAS scenario and the vmas backend are not asked for together."""
    from marlctl.envs.registry import lookup

    vmas = lookup(env_id).suite == "vmas"
    if vmas and backend != "vmas":
        return "env.backend", f"'{env_id}' is a VMAS scenario; set env.backend: vmas"
    if backend == "vmas" and not vmas:
        return (
            "env.backend",
            f"'{env_id}' is not a VMAS scenario (vmas/...): backend vmas runs those",
        )
    if backend == "vmas" and workers:
        return (
            "hardware.env_workers",
            "VMAS steps every env in one batch on the run's device (set env_workers: 0)",
        )
    return None


def probe_problems(data: dict[str, Any], provenance: Provenance) -> list[Problem]:
    """Probe the env even when other keys are invalid, so its problems are listed too."""
    env = data.get("env")
    if not isinstance(env, dict) or not isinstance(env.get("id"), str):
        return []
    params = env.get("params", {})
    if not isinstance(params, dict):
        return []
    problem = native_params_problem(env["id"], env.get("backend"), params, provenance)
    if problem is not None:
        return [problem]
    from marlctl.envs.probe import probe

    try:
        probe(env["id"], params)
    except Exception as err:
        return [env_problem(env["id"], err, provenance, params)]
    return []


def native_params_problem(
    env_id: str, backend: Any, params: dict[str, Any], provenance: Provenance
) -> Problem | None:
    """What keeps a native env from running with `params`, found before the env is probed:
    an `lbf/` task is probed through its package, which takes values the native env cannot
    (and fails on some with the package's own words)."""
    from marlctl.envs.native import is_native, native_problem

    if backend != "native" or not is_native(env_id):
        return None
    problem = native_problem(env_id, params)
    return None if problem is None else provenance.problem(*problem)


def tracking_problem(loaded: LoadedSpec) -> Problem | None:
    """An http(s) `tracking.uri` where no server answers, at its line: found in about two
    seconds here, where MLflow would retry it for long after the runs started."""
    from marlctl.redact import redact
    from marlctl.servers import server_silence

    uri = loaded.spec.tracking.uri
    if uri is None or uri.split("://", 1)[0].lower() not in ("http", "https"):
        return None
    reason = server_silence(uri)
    if reason is None:
        return None
    message = f"no MLflow server answers at {redact(uri)} ({reason})"
    return loaded.provenance.problem("tracking.uri", message)
