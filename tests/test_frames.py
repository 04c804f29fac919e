"""Frames (image and grid observations) and the convolutional encoder (`model.encoder: cnn`):
each seed's and each agent's convolutions are its own, uint8 frames stay uint8 from the env to
the rollout and the replay buffer, every algorithm family trains on them, and a policy that
reads the frames learns what an agent must see to act."""

from __future__ import annotations

import statistics

import pytest
import torch
import torch.nn.functional as F
from test_training import run_json, write_spec

from marlctl.spec.sections import CnnSpec, ModelSpec
from marlctl.train.frames import BatchedCNN
from marlctl.train.networks import AgentNet

SMALL = {"channels": [4, 8], "kernels": [3, 3], "strides": [2, 1]}
SPOT = {"id": "toy_envs:spot_the_square", "params": {"size": 12, "agents": 2, "max_cycles": 8}}


def _alone(net: BatchedCNN, frames: torch.Tensor, s: int, k: int) -> torch.Tensor:
    """Seed `s`'s copy `k` of `net` on frames `[N, H, W, C]`, one plain convolution at a
    time: what the grouped convolutions must compute for it."""
    h = F.avg_pool2d(frames.permute(0, 3, 1, 2), net.downsample)
    layers = iter(zip(net.weights, net.biases, net.geometry, strict=True))

    def conv(h):
        weight, bias, (stride, padding) = next(layers)
        return F.conv2d(h, weight[s, k], bias[s, k], stride, padding)

    if not net.impala:
        for _ in net.geometry:
            h = F.relu(conv(h))
        return h.flatten(1)
    for _ in range(net.stacks):
        h = F.max_pool2d(conv(h), 3, 2, 1)
        for _ in range(2):
            h = h + conv(F.relu(conv(F.relu(h))))
    return F.relu(h).flatten(1)


@pytest.mark.parametrize(
    "cnn",
    [CnnSpec(**SMALL, downsample=2), CnnSpec(style="impala", channels=[4, 8], downsample=2)],
)
def test_each_seed_and_copy_convolves_with_its_own_weights(cnn):
    torch.manual_seed(0)
    generators = [torch.Generator().manual_seed(s) for s in range(3)]
    net = BatchedCNN(3, 2, (20, 16, 3), cnn, generators)
    x = torch.rand(3, 2, 5, 20, 16, 3)
    out = net(x)
    assert out.shape == (3, 2, 5, net.features)
    assert net.features == cnn.parameters((20, 16, 3))[1]
    assert sum(p.numel() for p in net.parameters()) == 6 * cnn.parameters((20, 16, 3))[0]
    for s in range(3):
        for k in range(2):
            assert torch.allclose(out[s, k], _alone(net, x[s, k], s, k), atol=1e-5), (s, k)


@pytest.mark.parametrize("sharing", ["shared", "independent"])
@pytest.mark.parametrize("recurrent", [None, "gru"])
def test_a_seed_s_network_reads_its_frames_as_it_does_alone(sharing, recurrent):
    model = ModelSpec(hidden=[16], encoder="cnn", cnn=CnnSpec(**SMALL), sharing=sharing,
                      recurrent=recurrent, activation="relu", layer_norm=False)  # fmt: skip

    def net(seeds):
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        return AgentNet(len(seeds), 3, 12 * 12 * 3, 4, model, sharing, generators,
                        frames=(12, 12, 3))  # fmt: skip

    frames = torch.randint(0, 256, (3, 5, 3, 12 * 12 * 3), dtype=torch.uint8)
    batched, alone = net((0, 1, 2)), net((1,))
    h = None if recurrent is None else torch.zeros(3, 5, 3, batched.hidden_size)
    out, _ = batched(frames, h)
    mine, _ = alone(frames[1:2], None if h is None else h[1:2])
    assert torch.allclose(out[1:2], mine, atol=1e-6)
    # uint8 frames read as the same frames scaled to [0, 1]
    assert torch.equal(out, batched(frames.float() / 255.0, h)[0])
    assert not torch.allclose(out[0], out[1])  # seeds differ


@pytest.mark.parametrize(
    "algo, model",
    [
        ("mappo", {}),
        ("ippo", {"sharing": "independent"}),
        ("ippo", {"recurrent": "gru"}),
        ("qmix", {}),
        ("iql", {"recurrent": "gru"}),
    ],
)
def test_every_family_trains_on_uint8_frames_kept_uint8(tmp_path, algo, model):
    from marlctl.envs.pettingzoo import PettingZooEnv
    from marlctl.envs.probe import probe
    from marlctl.train.replay import transition_fields

    info = probe(SPOT["id"], SPOT["params"])
    env = PettingZooEnv(SPOT["id"], SPOT["params"], info, 2, torch.device("cpu"))
    assert env.reset(0).obs["looker"].dtype == torch.uint8
    assert transition_fields(info)["obs/looker"].dtype == torch.uint8
    env.close()
    quick = {"rollout_steps": 8, "epochs": 1, "minibatches": 2}
    if algo in ("qmix", "iql"):
        quick = {"batch_size": 16, "learning_starts": 64, "sequence_length": 4}
    _trains(tmp_path, SPOT, {"name": algo, **quick}, model, 512)


def _trains(tmp_path, env: dict, algo: dict, model: dict, steps: int) -> None:
    """Two seeds of `algo` with a small cnn encoder on `env` train `steps` env steps."""
    body = {
        "seeds": [0, 1],
        "env": env,
        "algo": algo,
        "model": {"hidden": [16], "encoder": "cnn", "cnn": SMALL, **model},
        "train": {"total_env_steps": steps, "eval_every": 0, "eval_episodes": 2},
        "hardware": {"device": "cpu", "num_envs": 4},
    }
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    assert all(r["status"] == "FINISHED" for r in out["runs"])


def test_native_foraging_grids_train_channels_first_with_batched_seeds(tmp_path):
    body = {
        "seeds": [0, 1],
        "env": {
            "id": "lbf/Foraging-2s-8x8-2p-2f-coop-v3",
            "backend": "native",
            "params": {"grid_observation": True},
        },  # fmt: skip
        "algo": {"name": "mappo", "rollout_steps": 10, "epochs": 1, "minibatches": 2},
        "model": {
            "hidden": [16],
            "encoder": "cnn",
            "cnn": {"channels": [8], "kernels": [3], "strides": [1]},
        },  # fmt: skip
        "train": {"total_env_steps": 640, "eval_every": 0, "eval_episodes": 2},
        "hardware": {"device": "cpu", "num_envs": 16, "batch_seeds": True},
    }
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out


@pytest.mark.parametrize(
    "spec, overrides",
    [
        ("pistonball_ippo_cnn.yaml", ["env.params.n_pistons=3", "env.params.max_cycles=20",
                                      "model.cnn.downsample=3", "train.total_env_steps=96"]),
        ("pistonball_ippo_cnn.yaml", ["algos=mappo", "env.params.n_pistons=3",
                                      "env.params.max_cycles=20", "model.cnn.downsample=3",
                                      "train.total_env_steps=96"]),
        ("pursuit_ippo_cnn.yaml", ["env.params.max_cycles=20", "train.total_env_steps=160"]),
        ("pursuit_ippo_cnn.yaml", ["algos=mappo", "env.params.max_cycles=20",
                                   "train.total_env_steps=160"]),
        ("kaz_ippo_cnn.yaml", ["env.params.max_cycles=20", "train.total_env_steps=64"]),
    ],
)  # fmt: skip
def test_the_pixel_and_grid_example_specs_train(tmp_path, spec, overrides):
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "specs" / spec
    quick = ["seeds=[0]", "train.eval_every=0", "train.eval_episodes=1", "hardware.num_envs=2",
             "hardware.env_workers=0", "algo.rollout_steps=16", "algo.epochs=1",
             "algo.minibatches=1"]  # fmt: skip
    out = run_json("run", str(path), *quick, *overrides)
    assert out["exit_code"] == 0, out
    assert out["runs"][0]["status"] == "FINISHED"


SPOT_STATE = {"id": SPOT["id"], "params": {**SPOT["params"], "state": True}}


def _state_critic_trainer(sharing: str = "shared", seeds=(0, 1)):
    from marlctl.envs.pettingzoo import PettingZooEnv
    from marlctl.envs.probe import probe
    from marlctl.spec.models import Spec
    from marlctl.train.runner import build_trainer

    info = probe(SPOT_STATE["id"], SPOT_STATE["params"])
    env = PettingZooEnv(SPOT_STATE["id"], SPOT_STATE["params"], info, 2 * len(seeds), "cpu")
    spec = Spec.model_validate({
        "env": SPOT_STATE,
        "algo": {"name": "mappo", "rollout_steps": 4, "epochs": 1, "minibatches": 1},
        "model": {"hidden": [16], "encoder": "cnn", "cnn": SMALL, "sharing": sharing},
    })  # fmt: skip
    return build_trainer(spec, info, 2, torch.device("cpu"), 10, seeds), env


def test_a_frame_state_travels_as_bytes_and_is_read_as_the_frames_scaled():
    from marlctl.envs.probe import probe

    info = probe(SPOT_STATE["id"], SPOT_STATE["params"])
    assert info.state_frame == (12, 24, 3) and info.state_storage == "uint8"
    assert probe(SPOT["id"], SPOT["params"]).state_frame is None  # no state of its own
    trainer, env = _state_critic_trainer()
    ob = env.reset(0)
    frames = torch.cat([ob.obs["looker"][:, 0], ob.obs["looker"][:, 1]], 2)  # [E, 12, 24, 3]
    assert ob.state.dtype == torch.float32
    assert torch.equal(ob.state, frames.flatten(1).float() / 255.0)
    trainer.restart_episodes()
    rollouts, _, _ = trainer.collect(env, ob)
    kept = rollouts["looker"].critic_in  # the rollout keeps the bytes, not floats
    assert kept.dtype == torch.uint8 and torch.equal(kept[0].flatten(0, 1), frames.flatten(1))
    env.close()


@pytest.mark.parametrize("sharing", ["shared", "independent"])
def test_a_centralised_critic_convolves_a_frame_state_once_for_its_agents(sharing):
    trainer, env = _state_critic_trainer(sharing)
    pol = trainer.policies["looker"]
    assert pol.critic.cnn is not None and pol.critic.cnn.shape == (12, 24, 3)
    assert pol.actor.cnn.shape == (12, 12, 3)  # the critic's convolutions are its own
    assert pol.state_once == (sharing == "shared")  # one network: the state convolved once
    state = torch.randint(0, 256, (2, 5, 12 * 24 * 3), dtype=torch.uint8)
    once, _ = pol.value(pol.per_agent(state))
    each, _ = pol.value(state.unsqueeze(-2).expand(2, 5, 2, -1))  # every agent's copy
    assert once.shape == each.shape == (2, 5, 2)
    assert torch.allclose(once, each, atol=1e-6)
    assert not torch.allclose(once[..., 0], once[..., 1])  # agent ids still tell them apart
    env.close()


def test_a_policy_whose_critic_has_changed_still_loads_to_act():
    # Weights of a run whose critic read the flat state with its hidden layers (before frame
    # states were convolved): acting reads none of the critic's, so they are left out.
    from marlctl.errors import SpecError
    from marlctl.stored import load_into

    trainer, env = _state_critic_trainer()
    env.close()
    saved = {k: v.clone() for k, v in trainer.policies.state_dict().items()}
    older = {k: v for k, v in saved.items() if ".critic." not in k}
    older["looker.critic.mlp.weights.0"] = torch.zeros(2, 1, 12 * 24 * 3 + 2, 16)
    for p in trainer.policies.parameters():
        p.data.zero_()
    load_into(trainer, older, "policy/final.pt")
    actor = {k: v for k, v in trainer.policies.state_dict().items() if ".actor." in k}
    assert actor and all(torch.equal(v, saved[k]) for k, v in actor.items())
    # The actor's weights must all be there and fit
    for broken in ({k: v for k, v in older.items() if ".actor." not in k},
                   older | {"looker.actor.mlp.weights.0": torch.zeros(3)}):  # fmt: skip
        with pytest.raises(SpecError, match="does not fit this run's networks"):
            load_into(trainer, broken, "policy/final.pt")


@pytest.mark.parametrize(
    "algo, model",
    [("mappo", {"recurrent": "gru"}), ("mappo", {"sharing": "independent"}), ("happo", {})],
)
def test_centralised_critics_train_on_a_frame_state(tmp_path, algo, model):
    quick = {"name": algo, "rollout_steps": 8, "epochs": 1, "minibatches": 2}
    _trains(tmp_path, SPOT_STATE, quick, model, 256)


def test_a_frame_state_the_convolutions_leave_nothing_of_is_exit_2_at_model_cnn(tmp_path):
    body = {
        "env": SPOT_STATE,
        "algo": {"name": "mappo"},
        "model": {"encoder": "cnn", "cnn": {**SMALL, "state_downsample": 8}},  # 12x24 -> 1x3
    }
    out = run_json("validate", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 2, out
    assert "model.cnn" in str(out) and "global state's frame" in str(out), out
    body["algo"] = {"name": "ippo"}  # no centralised critic: the state is not read
    assert run_json("validate", str(write_spec(tmp_path, body)))["exit_code"] == 0


@pytest.mark.parametrize("preset", ["nature_cnn", "impala_cnn"])
def test_the_model_presets_compose_and_train(tmp_path, preset):
    body = {
        "env": SPOT,
        "algo": {"name": "ippo", "rollout_steps": 8, "epochs": 1, "minibatches": 1},
        "train": {"total_env_steps": 64, "eval_every": 0, "eval_episodes": 1},
        "hardware": {"device": "cpu", "num_envs": 2},
    }
    # 12x12 frames: the Nature stack's 8x8 kernels need 36x36 at least, pooled by 1
    small = ["model.cnn.kernels=[3,3,3]", "model.cnn.strides=[1,1,1]"]
    overrides = small if preset == "nature_cnn" else ["model.cnn.channels=[4,8]"]
    out = run_json("run", str(write_spec(tmp_path, body)), f"+models={preset}", *overrides)
    assert out["exit_code"] == 0, out


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ippo", "mappo"])
def test_a_policy_that_reads_the_frames_learns_to_spot_the_square(tmp_path, algo):
    # Random play names the right quadrant on a quarter of the 8 steps: a return of 2.
    # MAPPO's critic convolves the global state: every agent's frame side by side.
    finals = []
    for seed in (0, 1, 2):
        body = {
            "seeds": [seed],
            "env": SPOT if algo == "ippo" else SPOT_STATE,
            "algo": {"name": algo, "rollout_steps": 16, "epochs": 4, "minibatches": 2,
                     "lr": 1.0e-3},  # fmt: skip
            "model": {"hidden": [64], "encoder": "cnn",
                      "cnn": {"channels": [16, 32], "kernels": [3, 3], "strides": [2, 1]}},
            "train": {"total_env_steps": 6000, "eval_every": 0, "eval_episodes": 32},
            "hardware": {"device": "cpu", "num_envs": 16},
        }  # fmt: skip
        out = run_json("run", str(write_spec(tmp_path, body, f"spot{seed}.yaml")))
        finals.append(out["runs"][0]["final_return"])
    assert statistics.median(finals) >= 6.0, finals


@pytest.mark.parametrize(
    "model, where, message",
    [
        ({"encoder": "cnn"}, "model.encoder", "are not frames"),
        ({"encoder": {"agent": "cnn", "pilot": "cnn"}}, "model.encoder.pilot",
         "no agent group 'pilot'"),
    ],
)  # fmt: skip
def test_a_cnn_for_what_is_not_frames_is_exit_2_at_its_line(tmp_path, model, where, message):
    body = {
        "env": {"id": "mpe/simple_spread", "backend": "native"},
        "algo": {"name": "mappo"},
        "model": model,
    }
    out = run_json("validate", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 2, out
    text = str(out)
    assert where in text and message in text, text


def test_convolutions_larger_than_the_frames_are_exit_2_at_model_cnn(tmp_path):
    body = {
        "env": SPOT,
        "algo": {"name": "ippo"},
        "model": {"encoder": "cnn"},  # the Nature DQN's 8x8 kernels, stride 4: 12 -> 2 -> 0
    }
    out = run_json("validate", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 2, out
    assert "model.cnn" in str(out) and "leave nothing" in str(out), out


def test_the_memory_estimate_counts_uint8_frames_as_a_quarter():
    from types import SimpleNamespace

    from marlctl.envs.info import EnvInfo, GroupInfo
    from marlctl.plan import _estimate_memory_mb
    from marlctl.spec.models import Spec

    spec = Spec.model_validate({"env": {"id": "x:y"}, "algo": {"name": "ippo"}})

    def estimate(dtype: str) -> float:
        group = GroupInfo("looker", ("a", "b"), (64, 64, 3), dtype, True, 4)
        info = EnvInfo("x", "x:y", (group,), 16, True)
        return _estimate_memory_mb(SimpleNamespace(spec=spec), info, 128)

    assert estimate("uint8") < 0.4 * estimate("float32")

    # MAPPO's rollout keeps a uint8 frame state as bytes too
    mappo = Spec.model_validate(
        {"env": {"id": "x:y"}, "algo": {"name": "mappo"}, "model": {"encoder": "cnn"}}
    )

    def with_state(dtype: str) -> float:
        group = GroupInfo("looker", ("a", "b"), (64, 64, 3), "uint8", True, 4)
        info = EnvInfo("x", "x:y", (group,), 128 * 128 * 3, True, state_shape=(128, 128, 3),
                       state_dtype=dtype)  # fmt: skip
        return _estimate_memory_mb(SimpleNamespace(spec=mappo), info, 128)

    assert with_state("uint8") < 0.6 * with_state("float32")


@pytest.mark.parametrize(
    "env_id, params",
    [
        ("butterfly/pistonball", {"n_pistons": 8, "continuous": False, "max_cycles": 40}),
        (
            "pettingzoo.butterfly.pistonball_v6:parallel_env",  # the factory named directly
            {"n_pistons": 8, "continuous": False, "max_cycles": 40},
        ),
        ("butterfly/cooperative_pong", {"max_cycles": 40}),
        ("butterfly/knights_archers_zombies", {"obs_method": "image", "max_cycles": 40}),
    ],
)
def test_the_frames_an_agent_sees_move_with_the_episode(env_id, params):
    # Pistonball and cooperative pong draw their screen only under a render mode: made
    # without one, their agents would see the reset frame for the whole episode.
    from marlctl.envs.pettingzoo import PettingZooEnv
    from marlctl.envs.probe import probe

    pytest.importorskip("pygame")
    info = probe(env_id, params)
    env = PettingZooEnv(env_id, params, info, 1, torch.device("cpu"))
    first = env.reset(0)
    generator = torch.Generator().manual_seed(0)
    moved = dict.fromkeys(first.obs, 0)
    ob = first
    for _ in range(12):
        actions = {g.name: torch.randint(g.n_actions, (1, g.n_agents), generator=generator)
                   for g in info.groups}  # fmt: skip
        step = env.step(actions)
        if (step.terminated | step.truncated).any():  # the next frames are a new episode's
            break
        for name, frames in step.next.obs.items():
            assert frames.dtype == torch.uint8 and frames.dim() == 5, name  # [E, n, H, W, C]
            moved[name] += not torch.equal(frames, ob.obs[name])
        ob = step.next
    env.close()
    assert all(count >= 3 for count in moved.values()), moved  # steps whose frames changed
