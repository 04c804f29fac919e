"""`marlctl eval`: load a finished run's policy and its spec, evaluate it on a chosen backend,
and optionally render episodes to a GIF or MP4.

Reads tracking only for the run's resolved spec and `policy/final.pt` (or a checkpoint); a
policy trained on `native` evaluates on `pettingzoo` and the other way round, and one trained
on a GPU evaluates on a CPU. By default it repeats the training run's final evaluation: the
same episodes, env layout and seed stream.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from marlctl import tracking
from marlctl.atomic import replacing
from marlctl.errors import SpecError
from marlctl.stored import load_into, policy_weights, seed_runs

VIDEO_SUFFIXES = (".gif", ".mp4")
MAX_FRAMES = 20_000  # an env that never ends an episode must not fill the memory


@dataclass
class EvalResult:
    run_id: str
    seed: int
    env_id: str
    backend: str
    episodes: int
    eval_seed: int
    return_mean: float | None
    returns: dict[str, float]
    checkpoint: str
    # the run's own final eval, for comparison: its sampled one where `sampled`
    logged_return: float | None = None
    video: str | None = None
    win_rate: float | None = None  # where the env says who won
    # A Melting Pot scenario the policy played as its focal population: `return_mean` is
    # then the focal per-capita return, logged to the run as `scenario/NAME`.
    scenario: str | None = None
    sampled: bool = False  # actions sampled as in training, not the most probable


@dataclass
class EvalSummary:
    runs: list[EvalResult]
    # `--record`: the dataset written, as `path`, `episodes` and `transitions`.
    dataset: dict | None = None

    def to_dict(self) -> dict:
        values = [r.return_mean for r in self.runs if r.return_mean is not None]
        mean = sum(values) / len(values) if values else None
        out = {"runs": [asdict(r) for r in self.runs], "return_mean": mean}
        return out | ({"dataset": self.dataset} if self.dataset else {})


@dataclass(frozen=True)
class Record:
    """Write the evaluated episodes to a new dataset folder `path`, each step as the policy
    took it."""

    path: Path


def check_record(path: str) -> Path:
    """Refuse a dataset folder that exists with files in it, or has no parent folder."""
    target = Path(path)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise SpecError.at("--record", f"'{path}' exists: name a new dataset folder")
    if not target.parent.is_dir():
        raise SpecError.at("--record", f"no folder '{target.parent}' for '{path}'")
    return target


class _Recorder:
    """One dataset for every seed run evaluated, each run a source of its own."""

    def __init__(self, record: Record, sampled: bool):
        self.record, self.sampled, self.writer = record, sampled, None

    def wrap(self, env, run, seed: int, spec, info, quota, checkpoint: str):
        import torch

        from marlctl.data.format import Manifest, Source, groups_of
        from marlctl.data.writer import DatasetWriter, EpisodeStager, Recording
        from marlctl.envs.registry import env_package

        mode = "sampled" if self.sampled else "deterministic"
        if self.writer is None:
            manifest = Manifest(
                spec.env.id, spec.env.backend, dict(spec.env.params),
                env_package(spec.env.id, spec.env.backend), groups_of(info), info.state_dim,
                note=f"recorded by marlctl eval, {mode} actions",
            )  # fmt: skip
            self.writer = DatasetWriter(self.record.path, manifest)
        sources = self.writer.manifest.sources
        sources.append(Source(run.info.run_id, seed, checkpoint, mode))
        index = torch.full((env.num_envs,), len(sources) - 1, dtype=torch.long)
        stager = EpisodeStager(env.num_envs, env.device, index, self.writer.add, quota)
        return Recording(env, info, stager)

    def close(self) -> dict:
        manifest = self.writer.close()
        path = str(self.record.path)
        return {"path": path, "episodes": manifest.episodes, "transitions": manifest.transitions}

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


@dataclass(frozen=True)
class Render:
    """Where and how to render: `episodes` episodes of the first env copy at `fps`."""

    path: Path
    episodes: int = 1
    fps: int = 10


def check_render(path: str) -> Path:
    """Refuse an unwritable or unsupported video path before any evaluation runs."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
        raise SpecError.at("--render", f"'{path}': write a .gif or an .mp4")
    if suffix == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise SpecError.at(
                "--render",
                "an .mp4 needs an ffmpeg writer: pip install imageio-ffmpeg (or render a .gif)",
            ) from None
    if not target.parent.is_dir():
        raise SpecError.at("--render", f"no folder '{target.parent}' for '{path}'")
    return target


def evaluate_runs(
    run_id: str,
    tracking_uri: str | None,
    backend: str | None,
    episodes: int | None,
    seed: int | None,
    device: str | None,
    checkpoint: str | None = None,
    render: Render | None = None,
    scenario: str | None = None,
    record: Record | None = None,
    sampled: bool = False,
) -> EvalSummary:
    """Evaluate one seed's run, or every finished seed of a parent run.

    `episodes` and `seed` default to the run's own final evaluation; `checkpoint` is
    `latest`, an artifact path of the run, or a local file (default: the final policy).
    `scenario`: a Melting Pot run plays that scenario of its substrate as the focal
    population; each seed's focal per-capita return is logged to it as `scenario/NAME`.
    `record`: every seed run's evaluated episodes go to one dataset, whole or not at all.
    `sampled`: the policies act as in training (sampled actions; epsilon-greedy for
    Q-learners), compared with the run's own sampled evaluation where it made one.
    """
    from mlflow.exceptions import MlflowException

    tracking.check_store(tracking_uri)
    client = tracking.client_for(tracking_uri)
    run_id = tracking.resolve_run_id(client, run_id, "RUN_ID")
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise SpecError.at(
            "RUN_ID", f"no run '{run_id}' in {tracking.resolve_uri(tracking_uri)}"
        ) from None
    targets = seed_runs(client, run)
    if not targets:
        raise SpecError.at("RUN_ID", f"run '{run_id}' has no finished seed runs to evaluate")
    results = []
    recorder = None if record is None else _Recorder(record, sampled)
    try:
        for target in targets:
            video = render
            if render is not None and len(targets) > 1:
                seed_of = target.data.tags.get("marlctl.seed", target.info.run_id[:8])
                name = f"{render.path.stem}-seed{seed_of}{render.path.suffix}"
                video = Render(render.path.with_name(name), render.episodes, render.fps)
            result = _evaluate_one(client, target, backend, episodes, seed, device, checkpoint,
                                   video, None, scenario, recorder, sampled=sampled)  # fmt: skip
            if scenario is not None and result.return_mean is not None:
                _log_scenario(client, target, scenario, result.return_mean)
            results.append(result)
        dataset = None if recorder is None else recorder.close()
    except BaseException:
        if recorder is not None:
            recorder.abort()
        raise
    return EvalSummary(results, dataset)


def _log_scenario(client, run, scenario: str, score: float) -> None:
    """The focal per-capita return as the run's `scenario/NAME`, at its last logged step."""
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "eval/return_mean")]
    client.log_metric(run.info.run_id, f"scenario/{scenario}", score, step=max(steps, default=0))


def _device(run, device: str | None) -> str:
    """`--device`, or the device the run trained on where this machine has it, else the CPU.
    Native envs draw their episodes from a generator on the run's device, so only the
    same kind of device repeats the run's evaluation exactly."""
    if device is not None:
        return device
    trained = run.data.tags.get("marlctl.device", "cpu")
    if trained.startswith("cuda"):
        import torch

        index = int(trained.partition(":")[2] or 0)
        if torch.cuda.is_available() and index < torch.cuda.device_count():
            return trained
    return "cpu"


def _evaluate_one(
    client,
    run,
    backend: str | None,
    episodes: int | None,
    seed: int | None,
    device: str | None,
    checkpoint: str | None,
    render: Render | None,
    against: dict[str, str] | None = None,
    scenario: str | None = None,
    recorder: _Recorder | None = None,
    partners: dict[str, tuple[str, list[str]]] | None = None,
    sampled: bool = False,
) -> EvalResult:
    """`against`: groups played by another run's policy instead (group -> its seed run);
    `partners`: some agents of a group played by another run's policy (group -> its seed run
    and the agents); `sampled`: every policy acts as in training, not deterministically;
    `scenario`: the Melting Pot scenario played instead of the run's substrate; `recorder`:
    where the episodes played are recorded."""
    import torch

    from marlctl.plan import compile_plan, learner_info
    from marlctl.spec import load_spec
    from marlctl.stored import SPEC_ARTIFACT
    from marlctl.train.build import build_trainer
    from marlctl.train.opponents import with_opponents
    from marlctl.train.runner import make_env
    from marlctl.train.scores import EVAL_ENVS, episode_quota, eval_seed, evaluate

    run_id = run.info.run_id
    with tempfile.TemporaryDirectory() as tmp:
        try:
            spec_path = client.download_artifacts(run_id, SPEC_ARTIFACT, tmp)
        except Exception:
            raise SpecError.at(
                "RUN_ID", f"run '{run_id}' has no {SPEC_ARTIFACT} artifact"
            ) from None
        overrides = [f"hardware.device={_device(run, device)}", "hardware.devices=null"]
        if backend is not None:
            overrides.append(f"env.backend={backend}")
        if backend == "native":
            overrides.append("hardware.env_workers=0")
        if scenario is not None:
            played = load_spec(spec_path, overrides, stored=f"run {run_id}")
            overrides += _scenario_overrides(played, scenario, render)
        loaded = load_spec(spec_path, overrides, stored=f"run {run_id}")
        plan = compile_plan(loaded)
        policies, artifact = policy_weights(client, run_id, checkpoint, tmp)
    spec = loaded.spec
    run_seed = int(run.data.tags.get("marlctl.seed", loaded.spec.seeds[0]))
    episodes = episodes or spec.train.eval_episodes
    chosen_seed = eval_seed(run_seed) if seed is None else seed
    torch_device = torch.device(plan.runs[0].device)
    # The layout of training's evaluation env: the same episodes land on the same copies.
    num_envs = min(episodes, EVAL_ENVS)
    learners = learner_info(plan.env, spec)
    trainer = build_trainer(spec, learners, num_envs, torch_device, total_iterations=1)
    load_into(trainer, policies, artifact)
    env = make_env(spec, plan.env, num_envs, torch_device, state=recorder is not None)
    try:
        env = with_opponents(
            env,
            spec,
            plan.env,
            client,
            [chosen_seed],
            deterministic=not sampled,
            against=against,
            partners=partners,
        )
    except ValueError as err:
        env.close()
        raise SpecError.at("RUN_ID", f"run '{run_id}': its opponents: {err}") from None
    except SpecError:
        env.close()
        raise
    try:
        if recorder is not None:
            quota = episode_quota(episodes, 1, num_envs, torch_device)
            env = recorder.wrap(env, run, run_seed, spec, learners, quota, artifact)
        (result,) = evaluate(trainer, env, episodes, [chosen_seed], not sampled)
    finally:
        env.close()
    video = None
    if render is not None:
        video = str(_render(client, spec, plan, policies, torch_device, render, chosen_seed))
    returns = {k.removeprefix("return/"): v for k, v in result.items() if k.startswith("return/")}
    return EvalResult(
        run_id,
        run_seed,
        plan.env.id,
        spec.env.backend,
        episodes,
        chosen_seed,
        result.get("return_mean"),
        returns,
        artifact,
        run.data.metrics.get("eval_sampled/return_mean" if sampled else "eval/return_mean"),
        video,
        result.get("win_rate"),
        scenario,
        sampled,
    )


def _scenario_overrides(loaded, scenario: str, render: Render | None) -> list[str]:
    """The overrides that play `scenario` in place of the run's substrate, or exit 2 where
    the run's env has no scenarios or its policy cannot play fewer players."""
    from marlctl.envs.registry import lookup

    spec = loaded.spec
    if lookup(spec.env.id).suite != "meltingpot":
        raise SpecError.at(
            "--scenario", f"{spec.env.id} has no scenarios: only Melting Pot substrates do"
        )
    if render is not None:
        raise SpecError.at("--scenario", "a scenario's episodes are not rendered: drop --render")
    sharing = spec.model.sharing
    modes = set(sharing.values()) if isinstance(sharing, dict) else {sharing or "shared"}
    # Melting Pot puts focal players in any of a substrate's slots, fewer than it has: a
    # policy plays them when it is one network for the group that ignores the slot.
    if modes != {"shared"} or spec.model.agent_ids:
        raise SpecError.at(
            "--scenario",
            "a scenario's focal players are some of the substrate's players, in any of its "
            "slots: it plays a policy the group shares that does not read the agent's index "
            "(model.sharing: shared, model.agent_ids: false); this run's has "
            f"sharing {sharing or 'the algorithm default'}, agent_ids {spec.model.agent_ids}",
        )
    return [f"++env.params.scenario={scenario}"]


def _render(client, spec, plan, policies: dict, device, render: Render, seed: int) -> Path:
    """Play `render.episodes` episodes in one PettingZoo env in `rgb_array` mode and write
    its frames; a native-backend run renders through its PettingZoo original, a VMAS run
    through VMAS's own renderer."""
    import numpy as np
    import torch

    from marlctl.envs.native import NATIVE_ONLY
    from marlctl.envs.pettingzoo import PettingZooEnv
    from marlctl.plan import learner_info
    from marlctl.train.build import build_trainer
    from marlctl.train.opponents import with_opponents

    if spec.env.id in NATIVE_ONLY:
        raise SpecError.at(
            "--render", f"{spec.env.id} exists only natively and has no renderer to draw frames"
        )
    trainer = build_trainer(spec, learner_info(plan.env, spec), 1, device, total_iterations=1)
    load_into(trainer, policies, "the checkpoint")
    try:
        if spec.env.backend == "vmas":  # VMAS draws its own batch's first env
            from marlctl.envs.registry import lookup
            from marlctl.envs.vmas import VmasEnv

            scenario = dict(lookup(spec.env.id).kwargs)["scenario"]
            params = dict(spec.env.params)
            env = VmasEnv(spec.env.id, scenario, params, 1, device, render_mode="rgb_array")
        else:
            env = PettingZooEnv(
                spec.env.id,
                dict(spec.env.params),
                plan.env,
                1,
                device,
                render_mode="rgb_array",
                reward_weights=spec.env.reward_weights,
            )
    except Exception as err:
        raise SpecError.at(
            "--render", f"{spec.env.id} cannot render rgb_array frames: {err}"
        ) from None
    try:
        env = with_opponents(env, spec, plan.env, client, [seed], deterministic=True)
    except ValueError as err:
        env.close()
        raise SpecError.at("RUN_ID", f"its opponents: {err}") from None
    try:
        ob, first, done = env.reset(seed), None, 0
        with torch.no_grad():
            while done < render.episodes:
                if len(env.frames or []) > MAX_FRAMES:
                    raise SpecError.at(
                        "--render-episodes",
                        f"{render.episodes} episode(s) took more than {MAX_FRAMES} steps; "
                        "render fewer",
                    )
                tr = env.step(trainer.act(ob, deterministic=True, first=first))
                first = tr.terminated | tr.truncated
                done += int(first.sum())
                ob = tr.next
        frames = env.frames or []
    finally:
        env.close()
    # The auto-reset after the last episode adds a frame of the next one.
    frames = [np.asarray(f, dtype=np.uint8) for f in frames[:-1] if f is not None]
    if not frames:
        raise SpecError.at("--render", f"{spec.env.id} returned no rgb_array frames")
    _write_video(frames, render.path, render.fps)
    return render.path


def _write_video(frames: list, path: Path, fps: int) -> None:
    with replacing(path) as tmp:
        if path.suffix.lower() == ".gif":
            from PIL import Image

            images = [Image.fromarray(f) for f in frames]
            duration = max(1, round(1000 / fps))
            images[0].save(tmp, save_all=True, append_images=images[1:], duration=duration, loop=0)
        else:
            import imageio_ffmpeg
            import numpy as np

            height, width = frames[0].shape[:2]
            writer = imageio_ffmpeg.write_frames(
                str(tmp), (width, height), fps=fps, macro_block_size=2, ffmpeg_log_level="error"
            )
            writer.send(None)
            for frame in frames:
                writer.send(np.ascontiguousarray(frame[..., :3]))
            writer.close()
