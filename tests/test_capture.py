"""Training iterations captured as CUDA graphs (`hardware.compile`), and what stays eager.

The CUDA tests run where a GPU is present; on a machine without one they are skipped, and
the tests of what a CPU run does instead still run.
"""

from __future__ import annotations

import pytest
import torch
from test_native_training import native_spec, no_host_sync
from test_training import client, random_policy_return, run_json, write_spec

from marlctl.envs.native import NATIVE
from marlctl.spec.models import Spec

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
NATIVE_IDS = sorted(NATIVE)


def _trainer(name: str, env_id: str, num_envs: int, seeds: tuple[int, ...], rows=None, **sections):
    from marlctl.algos import registered_algos
    from marlctl.envs.native import native_class
    from marlctl.train.runner import build_trainer

    if registered_algos()[name].on_policy:
        algo = {"rollout_steps": 8, "epochs": 2, "minibatches": 2}
    else:  # gradient steps from the third iteration on
        algo = {"batch_size": 32, "learning_starts": 64, "updates": 2}
    body = {
        "env": {"id": env_id, "backend": "native", **sections.get("env", {})},
        "algo": {"name": name, **algo, **sections.get("algo", {})},
        "model": sections.get("model", {}),
        "hardware": {"device": "cuda", **sections.get("hardware", {})},
    }
    spec = Spec.model_validate(body)
    device = torch.device("cuda")
    params = dict(spec.env.params)
    env = native_class(env_id)(params, num_envs * len(seeds), device, seeds=len(seeds))
    trainer = build_trainer(spec, env.info, num_envs, device, 100, seeds, rows)
    return trainer, env


CASES = {
    "mappo-spread-2-seeds": ("mappo", "mpe/simple_spread", (0, 1), {}),
    "ippo-recurrent": ("ippo", "mpe/simple_spread", (3,), {"model": {"recurrent": "gru"}}),
    "mappo-continuous": (
        "mappo",
        "mpe/simple_spread",
        (0,),
        {"env": {"params": {"continuous_actions": True}}},
    ),
    "mappo-speaker-listener": ("mappo", "mpe/simple_speaker_listener", (5, 6), {}),
    "a2c-climbing": ("mappo", "matrix/climbing", (0,), {"algo": {"epochs": 1, "minibatches": 1}}),
    # Replay-based: hard target copies every 3 gradient steps, so replays cross several.
    "qmix-2-seeds": ("qmix", "mpe/simple_spread", (0, 1), {"algo": {"target_update_every": 3}}),
    "vdn-recurrent": (
        "vdn",
        "mpe/simple_spread",
        (2,),
        {"model": {"recurrent": "gru"}, "algo": {"sequence_length": 4, "batch_size": 8}},
    ),
    "maddpg-speaker-listener": ("maddpg", "mpe/simple_speaker_listener", (0, 1), {}),
    "matd3-continuous": (
        "matd3",
        "mpe/simple_spread",
        (4,),
        {"env": {"params": {"continuous_actions": True}}},
    ),
    "masac": ("masac", "mpe/simple_spread", (0,), {}),
    # SMAX: action masks, a world-state critic, a heterogeneous team (2s3z), recurrent agents
    "mappo-2s3z-recurrent": ("mappo", "smax/2s3z", (0, 1), {"model": {"recurrent": "gru"}}),
    "qmix-3m": ("qmix", "smax/3m", (1,), {"algo": {"target_update_every": 3}}),
    "ippo-lbf": ("ippo", "lbf/Foraging-8x8-2p-2f-coop-v3", (0, 1), {}),
}


REPLAY_BASED = sorted(
    k for k, v in CASES.items() if v[0] in ("qmix", "vdn", "maddpg", "matd3", "masac")
)


@cuda
@pytest.mark.parametrize("case", sorted(CASES) + [f"{name}-compiled" for name in REPLAY_BASED])
def test_a_captured_iteration_computes_what_the_eager_one_computes(case):
    """Same seeds, same graph-safe env: the replayed graph and the eager code give the same
    parameters and losses, iteration after iteration (the optimiser's captured form may
    round differently in the last bits). `-compiled`: both with `hardware.compile: true`,
    whose replay-based gradient steps run compiled regions (`marlctl.train.regions`)."""
    algo, env_id, seeds, sections = CASES[case.removesuffix("-compiled")]
    if case.endswith("-compiled"):
        sections = {**sections, "hardware": {"compile": True}}
    runs = []
    for graph in (False, True):
        trainer, env = _trainer(algo, env_id, 32, seeds, **sections)
        if graph:
            assert trainer.capture(env) is None
        else:
            env.make_graph_safe()
        ob = env.reset(list(seeds) if len(seeds) > 1 else seeds[0])
        losses = []
        for _ in range(8):
            ob, loss = trainer.train_iteration(env, ob)
            losses.append({k: v.clone() for k, v in loss.items()})
        torch.cuda.synchronize()
        params = torch.cat([p.detach().flatten() for p in trainer.policies.parameters()])
        runs.append((params, losses, trainer.updates, trainer.stats.take()))
    (eager, eager_losses, eager_updates, _), (graph, graph_losses, graph_updates, _) = runs
    assert graph_updates == eager_updates
    assert torch.allclose(graph, eager, rtol=1e-4, atol=1e-5), (graph - eager).abs().max()
    for a, b in zip(eager_losses, graph_losses, strict=True):
        for key in a:
            assert torch.allclose(a[key], b[key], rtol=1e-3, atol=1e-5), (key, a[key], b[key])


OFFLINE = {
    "bc": {},
    "bc-recurrent": {"model": {"recurrent": "gru"}, "sequence_length": 4},
    "iql_cql": {"target_update_every": 3},
    "qmix_cql": {"target_update_every": 3},
    "qmix_cql-recurrent": {"model": {"recurrent": "gru"}, "sequence_length": 4,
                           "burn_in": 1, "target_update_every": 3},
    "maicq": {"target_update_every": 3},
    "maicq-recurrent": {"model": {"recurrent": "gru"}, "sequence_length": 4,
                        "target_update_every": 3},
    "maddpg_cql": {"ood_actions": 4},
}  # fmt: skip


def _offline(folder, case: str, seeds=(0, 1)):
    from test_offline import offline_trainer

    config = dict(OFFLINE[case])
    model = config.pop("model", None)
    algo = case.removesuffix("-recurrent")
    return offline_trainer(folder, algo, "cuda", seeds, model, updates=4, **config)[:2]


@cuda
@pytest.mark.parametrize("case", sorted(OFFLINE))
def test_a_captured_offline_iteration_computes_what_the_eager_one_computes(tmp_path, case):
    """An offline iteration (gradient steps on dataset batches, hard target copies crossing
    replays) computes the same parameters and losses captured as eagerly."""
    runs = []
    for graph in (False, True):
        trainer, env = _offline(tmp_path / str(graph), case)
        if graph:
            assert trainer.capture(env) is None
        losses = []
        for _ in range(6):
            _, loss = trainer.train_iteration(env, None)
            losses.append({k: v.clone() for k, v in loss.items()})
        torch.cuda.synchronize()
        assert not graph or trainer.graph.calls == 6 and trainer.graph.failed is None
        params = torch.cat([p.detach().flatten() for p in trainer.policies.parameters()])
        runs.append((params, losses, trainer.updates))
    (eager, eager_losses, eager_updates), (graph, graph_losses, graph_updates) = runs
    assert graph_updates == eager_updates == 24
    assert torch.allclose(graph, eager, rtol=1e-4, atol=1e-5), (graph - eager).abs().max()
    for a, b in zip(eager_losses, graph_losses, strict=True):
        for key in a:
            assert torch.allclose(a[key], b[key], rtol=1e-3, atol=1e-5), (key, a[key], b[key])


@cuda
@pytest.mark.parametrize("case", ["bc", "qmix_cql", "maicq", "maddpg_cql"])
def test_captured_offline_iterations_never_sync_with_the_host(tmp_path, case):
    trainer, env = _offline(tmp_path, case)
    assert trainer.capture(env) is None
    for _ in range(2):  # eager, then captured
        trainer.train_iteration(env, None)
    torch.cuda.synchronize()
    assert trainer.graph.graph is not None and trainer.graph.failed is None
    with no_host_sync():
        for _ in range(3):
            trainer.train_iteration(env, None)


def test_an_offline_trainer_on_a_cpu_is_not_captured_and_says_why(tmp_path):
    from test_offline import offline_trainer

    trainer, env, _ = offline_trainer(tmp_path, "qmix_cql")
    assert trainer.capture(env) == "CUDA graphs need a CUDA device"
    assert trainer.graph is None


ROWS = {
    "mappo": [{"lr": 1e-3, "gamma": 0.99, "clip": 0.2}, {"lr": 3e-3, "gamma": 0.9, "clip": 0.1},
              {"lr": 5e-4, "gamma": 0.95, "clip": 0.3}],
    "qmix": [{"lr": 1e-3, "tau": 0.01, "epsilon_end": 0.05},
             {"lr": 3e-3, "tau": 0.05, "epsilon_end": 0.2},
             {"lr": 5e-4, "tau": 0.005, "epsilon_end": 0.1}],
}  # fmt: skip


def _captured_against_eager(algo: str, iterations: int, change) -> None:
    """A batch of rows with `ROWS[algo]`'s hyperparameters, trained eagerly and captured:
    `change(iteration, trainer, env, ob, graph)` acts between iterations and returns the
    observation to go on from; the two compute alike."""
    extra = {"algo": {"target_update_every": 0}} if algo == "qmix" else {}
    runs = []
    for graph in (False, True):
        trainer, env = _trainer(algo, "mpe/simple_spread", 32, (0, 1, 2), ROWS[algo], **extra)
        if graph:
            assert trainer.capture(env) is None
        else:
            env.make_graph_safe()
        ob = env.reset([0, 1, 2])
        losses = []
        for iteration in range(iterations):
            ob = change(iteration, trainer, env, ob, graph)
            ob, loss = trainer.train_iteration(env, ob)
            losses.append({k: v.clone() for k, v in loss.items()})
        torch.cuda.synchronize()
        assert not graph or trainer.graph.calls >= 2  # replayed
        params = torch.cat([p.detach().flatten() for p in trainer.policies.parameters()])
        runs.append((params, losses))
    (eager, eager_losses), (graph, graph_losses) = runs
    assert torch.allclose(graph, eager, rtol=1e-4, atol=1e-5), (graph - eager).abs().max()
    for a, b in zip(eager_losses, graph_losses, strict=True):
        for key in a:
            assert torch.allclose(a[key], b[key], rtol=1e-3, atol=1e-5), (key, a[key], b[key])


@cuda
@pytest.mark.parametrize("algo", sorted(ROWS))
def test_a_captured_batch_of_rows_computes_what_the_eager_one_computes(algo):
    """Rows with hyperparameters of their own (a batched sweep), and population-based
    training's changes between iterations (a row's values set, a row copied): a replay reads
    them as the eager code does."""
    from marlctl.train.population import copy_rows

    def exploit(iteration, trainer, env, ob, graph):
        if iteration == 5:
            copy_rows(trainer, [1], [2])
            for name, value in ROWS[algo][1].items():
                trainer.set_row_value(name, 2, value * 1.2)
        return ob

    _captured_against_eager(algo, 10, exploit)


@cuda
@pytest.mark.parametrize("algo", sorted(ROWS))
def test_a_captured_batch_whose_rows_leave_it_is_captured_anew_and_computes_alike(algo):
    """Rows cut out of a captured batch (a pruned trial's): the graph is captured again at
    the new shapes, and the rows that remain compute what the eager ones do."""
    from marlctl.train.compact import keep_observation, keep_rows

    def prune(iteration, trainer, env, ob, graph):
        if iteration != 6:
            return ob
        ob = keep_observation(ob, [0, 2], 3)
        keep_rows(trainer, [0, 2])
        env.keep_blocks([0, 2])
        if graph:
            trainer.graph = None
            assert trainer.capture(env) is None
        return ob

    _captured_against_eager(algo, 12, prune)


@cuda
@pytest.mark.parametrize("algo", ["mappo", "qmix", "maddpg", "masac"])
def test_replays_never_sync_with_the_host(algo):
    trainer, env = _trainer(algo, "mpe/simple_spread", 64, (0, 1))
    assert trainer.capture(env) is None
    ob = env.reset([0, 1])
    for _ in range(3):  # eager, then captured (replay-based: once gradient steps begin)
        ob, _ = trainer.train_iteration(env, ob)
    torch.cuda.synchronize()
    with no_host_sync():
        for _ in range(3):
            ob, _ = trainer.train_iteration(env, ob)


@cuda
def test_a_captured_run_learns_and_reports_its_capture(tmp_path):
    body = native_spec(tmp_path, hardware={"device": "cuda", "num_envs": 256})
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    (run,) = out["runs"]
    assert run["final_return"] > random_policy_return({"N": 2, "max_cycles": 10}) + 0.6, run
    data = client().get_run(run["run_id"]).data
    assert data.tags["marlctl.compile"] == "CUDA graph"
    assert 0 < data.metrics["perf/capture_s"] < 60


@pytest.mark.parametrize("tf32", [True, False])
def test_hardware_tf32_sets_the_float32_precision_of_cuda_matrix_products(tf32):
    from marlctl.train.build import set_float32_precision

    def spec(on: bool) -> Spec:
        body = {"env": {"id": "mpe/simple_spread"}, "algo": {"name": "mappo"}}
        return Spec.model_validate({**body, "hardware": {"tf32": on}})

    set_float32_precision(spec(tf32))
    try:
        want = "tf32" if tf32 else "ieee"
        assert torch.backends.cuda.matmul.fp32_precision == want
        assert torch.backends.cudnn.conv.fp32_precision == want
    finally:
        set_float32_precision(spec(False))  # the default, for the tests after this one


@cuda
def test_a_captured_run_in_tf32_learns(tmp_path):
    body = native_spec(tmp_path, hardware={"device": "cuda", "num_envs": 256, "tf32": True})
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    (run,) = out["runs"]
    assert run["final_return"] > random_policy_return({"N": 2, "max_cycles": 10}) + 0.6, run
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"  # the run trained in this process
    torch.backends.cuda.matmul.fp32_precision = "ieee"


@cuda
def test_a_captured_replay_based_run_finishes_and_says_so(tmp_path):
    body = native_spec(tmp_path, hardware={"device": "cuda", "num_envs": 64, "compile": True})
    body["algo"] = {"name": "qmix", "learning_starts": 256, "batch_size": 64}
    body["train"] = {"total_env_steps": 20_000, "eval_every": 10_000, "eval_episodes": 16}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    data = client().get_run(out["runs"][0]["run_id"]).data
    assert data.tags["marlctl.compile"] == "CUDA graph, torch.compile"
    assert data.metrics["perf/capture_s"] > 0


@cuda
def test_bench_on_a_fresh_cuda_process_compares_eager_and_graph(tmp_path):
    spec = write_spec(tmp_path, native_spec(tmp_path, hardware={"device": "cuda"}))
    data = run_json("bench", str(spec), "--num-envs", "64", "--seconds", "0.2")
    assert data["exit_code"] == 0, data
    modes = {(p["kind"], p["mode"]) for p in data["points"]}
    assert modes == {(k, m) for k in ("env", "train") for m in ("eager", "CUDA graph")}
    assert all(p["compile_s"] > 0 for p in data["points"] if p["mode"] == "CUDA graph")


def test_on_a_cpu_iterations_run_eagerly_and_say_so(tmp_path):
    body = native_spec(tmp_path)
    body["train"] = {"total_env_steps": 2_560, "eval_every": 0, "eval_episodes": 4}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    data = client().get_run(out["runs"][0]["run_id"]).data
    assert data.tags["marlctl.compile"] == "eager"
    assert "perf/capture_s" not in data.metrics


def test_why_a_run_is_not_captured():
    from marlctl.envs.native import native_class
    from marlctl.train.base import TrainerSetup
    from marlctl.train.ppo import PPOTrainer

    spec = Spec.model_validate({"env": {"id": "mpe/simple_spread"}, "algo": {"name": "mappo"}})
    env = native_class("mpe/simple_spread")({}, 4, "cpu")
    trainer = PPOTrainer(TrainerSetup(spec.algo, spec.model, env.info, 4, "cpu", 10, True))
    assert trainer.capture(env) == "CUDA graphs need a CUDA device"
    assert trainer.graph is None


def test_compile_takes_auto_true_or_false():
    from pydantic import ValidationError

    from marlctl.spec.models import HardwareSpec

    assert HardwareSpec().compile == "auto"
    for value in ("auto", True, False):
        assert HardwareSpec(compile=value).compile == value
    with pytest.raises(ValidationError):
        HardwareSpec(compile="maybe")


def test_a_checkpoint_of_a_captured_optimiser_loads_anywhere():
    """A captured optimiser keeps its learning rate in a tensor: the saved state has a float,
    and an eager optimiser on the CPU loads it and steps."""
    from marlctl.train.base import portable

    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([param], lr=0.1)
    param.grad = torch.ones(3)
    optimizer.step()
    optimizer.param_groups[0]["lr"] = torch.tensor(0.05)
    optimizer.param_groups[0]["capturable"] = True
    saved = portable(optimizer.state_dict())
    assert saved["param_groups"][0]["lr"] == pytest.approx(0.05)
    assert saved["param_groups"][0]["capturable"] is False
    other = torch.nn.Parameter(torch.ones(3))
    fresh = torch.optim.Adam([other], lr=1.0)
    fresh.load_state_dict(saved)
    other.grad = torch.ones(3)
    fresh.step()
    assert fresh.param_groups[0]["lr"] == pytest.approx(0.05)
    assert torch.all(other < 1.0)


DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]


def _copy_state(source, target) -> None:
    """Every tensor `source` holds (as a captured iteration finds its state) into `target`."""
    from marlctl.train.capture import _set, _slots

    for (_, name, key, index), tensor in _slots([source]).items():
        _set((target, name, key, index), tensor.clone())


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("env_id", NATIVE_IDS)
def test_a_compiled_env_steps_like_the_eager_one(env_id, device):
    """`hardware.compile=true` compiles the env's random-free step methods: same seed, same
    actions, the same observations and rewards (to float rounding), for every native env.
    Each step starts from the eager env's state: fused kernels sum in another order, and
    where units collide (SMAX) a last-bit difference grows over an episode."""
    from marlctl.bench import _random_actions
    from marlctl.envs.native import native_class

    device = torch.device(device)
    envs = [native_class(env_id)({}, 64, device) for _ in range(2)]
    envs[1].compile()
    obs = []
    for env in envs:
        env.make_graph_safe()
        env.reset(7)
    torch.manual_seed(0)
    for _ in range(30):
        actions = _random_actions(envs[0].info, 64, device)
        steps = [env.step(actions) for env in envs]
        for name in steps[0].rewards:
            a, b = (s.rewards[name] for s in steps)
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (name, (a - b).abs().max())
        obs.append([s.next.state for s in steps])
        _copy_state(envs[0], envs[1])
    for a, b in obs:
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a - b).abs().max()


@pytest.mark.parametrize("length", [1, 3])
def test_replay_counters_on_the_device_add_and_sample_as_the_host_ones_do(length):
    """A GPU's replay buffer keeps its write position and fill level on the device, where a
    captured graph reads them; the same bookkeeping, run on the CPU here."""
    from marlctl.train.replay import Field, ReplayBuffer

    def make(on_device: bool) -> ReplayBuffer:
        generators = [torch.Generator().manual_seed(seed) for seed in (0, 1)]
        fields = {"t": Field((), torch.long)}
        return ReplayBuffer(fields, 2, 3, 12, "cpu", generators, counters_on_device=on_device)

    host, device = make(False), make(True)  # a ring of 4 steps of 3 envs, per seed
    for step in range(10):
        for buffer in (host, device):
            buffer.add(t=torch.full((2, 3), step))
        assert host.head == device.head == int(device._head_t)
        if step + 1 < length:
            continue
        stored = range(max(0, step - 3), step + 1)
        for buffer in (host, device):
            t = buffer.sample(512, length)["t"]  # [S, L, B]
            assert ((t[:, 1:] - t[:, :-1]) == 1).all()  # consecutive steps, never across the head
            starts = set(t[:, 0].unique().tolist())
            assert starts == set(stored[: len(stored) - length + 1]), (step, starts)
    restored = make(True)
    restored.load_state_dicts([device.state_dict()])
    assert restored.head == int(restored._head_t) and restored.written == device.written
    assert set(restored.sample(512, length)["t"][:, 0].unique().tolist()) == set(
        range(6, 10 - length + 1)
    )


@cuda
def test_a_capture_that_fails_runs_eagerly_and_says_why():
    from marlctl.train.capture import IterationGraph

    class State:  # a root, as the trainer is: hashable, by identity
        def __init__(self):
            self.x = torch.zeros(3, device="cuda")
            self.count = 0

    state = State()

    def step() -> torch.Tensor:
        state.count += 1
        state.x = state.x + 1
        if state.x.sum().item() < 0:  # reads a value back: CUDA graphs cannot capture it
            state.x.zero_()
        return state.x

    graph = IterationGraph([state], [], [(state, "count")])
    values = [graph.run(step)[0].item() for _ in range(4)]
    assert graph.failed and graph.graph is None
    assert values == [1.0, 2.0, 3.0, 4.0] and state.count == 4
