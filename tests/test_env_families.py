"""Env families beyond MPE: level-based foraging and the robot warehouse (Gymnasium envs with
tuple spaces), each through its own package, trained by every algorithm that fits."""

from __future__ import annotations

import numpy as np
import pytest
from test_algorithms import QUICK
from test_training import client, run_json, write_spec

from marlctl.algos import registered_algos
from marlctl.envs.families import ENVS
from marlctl.envs.native import NATIVE, NATIVE_ONLY, native_class
from marlctl.envs.probe import probe
from marlctl.envs.registry import EnvLookupError, env_params, lookup

LBF = "lbf/Foraging-8x8-2p-2f-coop-v3"
RWARE = "rware/rware-tiny-2ag-v2"
# One task per family, with short episodes, for the training smoke test.
FAMILY_TASKS = {
    "lbf": (LBF, {"max_episode_steps": 10}),
    "rware": (RWARE, {"max_steps": 10}),
    "momaland": ("momaland/beach", {"num_agents": 6, "num_timesteps": 3}),
    "classic": ("classic/tictactoe", {}),
    "smax": ("smax/3m", {}),
}


def needs(env_id: str):
    entry = lookup(env_id)
    return pytest.mark.skipif(
        not entry.installed, reason=f"{env_id} is not installed: {entry.install_hint}"
    )


def make(env_id: str, **params):
    from marlctl.envs.registry import make_env

    return make_env(env_id, params)


def play(env, steps: int, seed: int = 0):
    """(rewards, terminations, truncations, infos) of each step of uniform legal actions."""
    rng = np.random.default_rng(seed)
    _, infos = env.reset(seed=seed)
    out = []
    for _ in range(steps):
        if not env.agents:
            _, infos = env.reset()
        actions = {}
        for agent in env.agents:
            mask = infos[agent].get("action_mask")
            n = env.action_space(agent).n
            legal = np.flatnonzero(mask) if mask is not None else np.arange(n)
            actions[agent] = int(rng.choice(legal))
        _, rewards, terms, truncs, infos = env.step(actions)
        out.append((rewards, terms, truncs, infos))
    return out


# ---------------------------------------------------------------- the adapter


@needs(LBF)
@pytest.mark.parametrize("scalarisation", ["sum", "mean"])
def test_a_common_reward_is_the_teams_sum_or_mean_of_the_agents_own(scalarisation):
    # Few food spawn per player: random players load some within 300 steps.
    own = play(make("lbf/Foraging-5x5-2p-1f-v3", max_episode_steps=20), 300)
    common = play(
        make(
            "lbf/Foraging-5x5-2p-1f-v3",
            max_episode_steps=20,
            common_reward=True,
            reward_scalarisation=scalarisation,
        ),
        300,
    )
    reduce = np.sum if scalarisation == "sum" else np.mean
    scored = 0
    for (mine, *_), (team, *_) in zip(own, common, strict=True):
        expected = reduce(list(mine.values()))
        assert list(team.values()) == pytest.approx([expected] * len(team))
        scored += expected != 0
    assert scored > 0, "no food was loaded: the test proves nothing"


@needs(LBF)
def test_foraging_masks_its_illegal_moves_and_ends_solved_episodes_as_terminated():
    env = make(LBF, max_episode_steps=15)
    steps = play(env, 60)
    masks = [info["action_mask"] for *_, infos in steps for info in infos.values()]
    assert all(m.dtype == bool and m.shape == (6,) and m[0] for m in masks)  # NONE is legal
    assert any(not m.all() for m in masks)  # walls, food and players block moves
    ends = [(any(t.values()), any(c.values())) for _, t, c, _ in steps]
    ends = [end for end in ends if any(end)]
    assert len(ends) == 4 and all(c and not t for t, c in ends)  # cut by the limit, food left
    # Once every food is collected the episode is over for good: terminated.
    env.reset(seed=1)
    env.env.field[:] = 0
    _, _, terms, truncs, _ = env.step({a: 0 for a in env.agents})
    assert all(terms.values()) and not any(truncs.values()) and env.agents == []


@needs(LBF)
def test_foraging_masks_are_the_envs_own_legal_moves():
    env = make(LBF)
    _, infos = env.reset(seed=3)
    for agent, player in zip(env.possible_agents, env.env.players, strict=True):
        legal = sorted(a.value for a in env.env._valid_actions[player])
        assert np.flatnonzero(infos[agent]["action_mask"]).tolist() == legal


@needs(RWARE)
def test_a_warehouse_episode_is_always_cut_by_its_time_limit():
    steps = play(make(RWARE, max_steps=7), 21)
    ends = [i for i, (_, t, c, _) in enumerate(steps) if any(c.values())]
    assert ends == [6, 13, 20]
    assert not any(any(t.values()) for _, t, _, _ in steps)


@needs(RWARE)
def test_warehouse_enums_are_written_by_name():
    env = make(RWARE, reward_type="global", max_steps=50)
    assert env.env.reward_type.name == "GLOBAL"
    assert env_params(RWARE).defaults["reward_type"] == "INDIVIDUAL"
    with pytest.raises(ValueError, match="reward_type must be one of GLOBAL, INDIVIDUAL"):
        make(RWARE, reward_type="team")


# ---------------------------------------------------------------- ids and validation


def test_any_task_the_package_registers_is_found_and_others_are_unknown():
    entry = lookup("lbf/Foraging-2s-12x12-3p-4f-coop-v3")
    assert entry.suite == "lbf" and dict(entry.kwargs) == {
        "task": "Foraging-2s-12x12-3p-4f-coop-v3"
    }
    assert "12x12 grid, 3 players, 4 food, sight 2" in entry.summary
    assert "lbf/Foraging-2s-12x12-3p-4f-coop-v3" not in ENVS  # found, not listed
    assert lookup("rware/rware-medium-6ag-hard-v2").summary.startswith("robot warehouse: medium")
    with pytest.raises(EnvLookupError, match="unknown env 'lbf/Forage-8x8'"):
        lookup("lbf/Forage-8x8")


@needs(LBF)
def test_a_task_name_the_package_does_not_register_fails_validation(tmp_path):
    spec = write_spec(tmp_path, quick("mappo", "lbf/Foraging-8x8-2p-9f-v3", {}))
    out = run_json("validate", str(spec))
    assert out["exit_code"] == 2
    (error,) = out["errors"]
    assert error.startswith(f"{spec}:3: env: ")
    assert "lbforaging registers no task 'Foraging-8x8-2p-9f-v3'; did you mean 'lbf/" in error


@needs(LBF)
def test_a_bad_reward_option_is_reported_at_its_line(tmp_path):
    spec = write_spec(
        tmp_path, quick("mappo", LBF, {"common_reward": True, "reward_scalarisation": "max"})
    )
    out = run_json("validate", str(spec))
    assert out["exit_code"] == 2
    (error,) = out["errors"]
    line = spec.read_text().splitlines().index("    reward_scalarisation: max") + 1
    assert error == (
        f"{spec}:{line}: env.params.reward_scalarisation: "
        "reward_scalarisation must be one of sum, mean, not 'max'"
    )


@needs(LBF)
def test_the_description_has_one_group_masks_from_infos_and_concatenated_state():
    info = probe(LBF, {})
    (group,) = info.groups
    assert group.agents == ("agent_0", "agent_1") and group.n_actions == 6
    assert group.mask_source == "info" and group.discrete
    assert not info.state_from_env and info.state_dim == 2 * group.obs_dim


@pytest.mark.parametrize("env_id", [*sorted(NATIVE), LBF])
def test_a_native_env_declares_masks_exactly_where_it_gives_them(env_id):
    """Replay buffers and `list envs --describe` read a group's `mask_source`; the env's
    observations must agree with it."""
    env = native_class(env_id)({}, 2, "cpu")
    ob = env.reset(0)
    for g in env.info.groups:
        given = ob.masks.get(g.name) is not None
        assert given == (g.mask_source is not None), (env_id, g.name, g.mask_source)


# ---------------------------------------------------------------- every algorithm that fits


def quick(algo: str, env_id: str, params: dict) -> dict:
    info = registered_algos()[algo]
    backend = "native" if env_id in NATIVE_ONLY else "pettingzoo"
    return {
        "seeds": [0],
        "env": {"id": env_id, "backend": backend, "params": params},
        "algo": {"name": algo, **QUICK[info.on_policy]},
        "model": {"hidden": [16]},
        "train": {"total_env_steps": 120, "eval_every": 0, "eval_episodes": 2},
        "hardware": {"num_envs": 4},
    }


def _fits(env_id: str):
    """The algorithms that learn online whose capabilities fit the family's discrete actions
    (and turns); the offline ones train from a dataset (tests/test_offline.py)."""
    turns = lookup(env_id).suite == "classic"
    return [
        a
        for a, info in registered_algos().items()
        if "discrete" in info.action_kinds and (info.turn_based or not turns) and not info.offline
    ]


SMOKE = [
    pytest.param(algo, family, id=f"{family}-{algo}", marks=needs(env_id))
    for family, (env_id, _) in FAMILY_TASKS.items()
    for algo in _fits(env_id)
]


@pytest.mark.parametrize(("algo", "family"), SMOKE)
def test_every_algorithm_that_fits_trains_on_each_family(algo, family, tmp_path):
    env_id, params = FAMILY_TASKS[family]
    out = run_json("run", str(write_spec(tmp_path, quick(algo, env_id, params))))
    assert out["exit_code"] == 0, out
    (run,) = out["runs"]
    assert run["status"] == "FINISHED" and run["env_steps"] >= 120
    assert run["final_return"] is not None
    metrics = client().get_run(run["run_id"]).data.metrics
    assert any(key.startswith("loss/") for key in metrics)


# ---------------------------------------------------------------- turn-based (AEC) games


def test_turn_based_advantages_carry_a_turns_return_across_the_other_players_moves():
    import torch

    from marlctl.train.core import turn_gae

    # Two players alternate (first at even steps); the second wins on its move at t=3.
    rewards = torch.zeros(4, 2)
    rewards[3] = torch.tensor([-1.0, 1.0])
    values = torch.tensor([[0.1, 0.0], [0.0, 0.2], [0.3, 0.0], [0.0, 0.4]])
    active = torch.tensor([[1, 0], [0, 1], [1, 0], [0, 1]], dtype=torch.bool)
    dones = torch.tensor([False, False, False, True])
    adv, ret, counted = turn_gae(
        rewards, values, torch.zeros(2), active, torch.tensor([True, False]), dones, 0.9, 1.0
    )
    assert torch.equal(counted, active)
    # The first player's loss, received on the other's move, is its last turn's reward;
    # each return is discounted once per own turn.
    assert ret[:, 0][active[:, 0]].tolist() == pytest.approx([-0.9, -1.0])
    assert ret[:, 1][active[:, 1]].tolist() == pytest.approx([0.9, 1.0])
    assert adv[~active].abs().sum() == 0
    # A turn whose rest is not seen by the rollout's end is left out: here the first
    # player's move at t=2 when the episode has not ended and it is not to move next.
    adv, ret, counted = turn_gae(
        torch.zeros(3, 2), values[:3], torch.zeros(2), active[:3],
        torch.tensor([False, True]), torch.zeros(3, dtype=torch.bool), 0.9, 1.0,
    )  # fmt: skip
    assert counted.tolist() == [[True, False], [False, True], [False, False]]


def test_an_aec_env_moves_one_agent_per_step_and_ends_when_the_game_does():
    from marlctl.envs.registry import make_env

    env = make_env("classic/tictactoe", {})
    _, _ = env.reset(seed=0)
    assert env.agents == ["player_1"]
    moves = [0, 3, 1, 4, 2]  # player_1 completes the top row on the fifth move
    for index, move in enumerate(moves):
        mover = env.agents[0]
        obs, rewards, terms, truncs, _ = env.step({mover: move})
        if index < len(moves) - 1:
            assert env.agents == ["player_2" if mover == "player_1" else "player_1"]
            assert not any(terms.values())
        assert set(obs) == {"player_1", "player_2"}
    assert rewards == {"player_1": 1.0, "player_2": -1.0}
    assert all(terms.values()) and not any(truncs.values()) and env.agents == []


def test_the_batched_backend_marks_the_waiting_player_inactive_with_no_legal_moves():
    import torch

    from marlctl.envs.pettingzoo import PettingZooEnv

    info = probe("classic/tictactoe", {})
    assert info.turn_based and info.groups[0].mask_source == "obs"
    env = PettingZooEnv("classic/tictactoe", {}, info, 2, torch.device("cpu"))
    ob = env.reset(0)
    assert ob.active["player"].tolist() == [[True, False], [True, False]]
    assert ob.masks["player"][:, 0].all() and not ob.masks["player"][:, 1].any()
    tr = env.step({"player": torch.tensor([[4, 0], [0, 0]])})
    assert tr.next.active["player"].tolist() == [[False, True], [False, True]]
    assert not tr.next.masks["player"][0, 1, 4]  # the centre is taken
    env.close()


def test_replay_based_learners_are_refused_on_turn_based_envs(tmp_path):
    out = run_json("validate", str(write_spec(tmp_path, quick("qmix", "classic/tictactoe", {}))))
    assert out["exit_code"] == 2
    assert "algorithm 'qmix' does not train on turn-based envs like 'classic/tictactoe'" in str(out)


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_a_turn_based_learner_credits_a_move_paid_on_the_other_players_turn(algo, tmp_path):
    """The signal game pays the first mover only on the second's move: both must pick 1.
    Ending the first mover's return at its own step would leave it at chance (0.5)."""
    body = quick(algo, "toy_envs:signal_game", {})
    body["env"].pop("backend")
    body["algo"] = {"name": algo, "rollout_steps": 8, "epochs": 4, "minibatches": 1, "lr": 3e-3}
    body["seeds"] = [0, 1, 2]
    body["train"] = {"total_env_steps": 4_000, "eval_every": 0, "eval_episodes": 32}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    returns = sorted(run["final_return"] for run in out["runs"])
    assert returns[1] > 0.9, returns


@pytest.mark.slow
def test_tictactoe_against_a_random_opponent_is_learned(tmp_path):
    """One learner, a random seat per game, against uniformly random legal moves: random
    play scores 0 on average; the median of three seeds must win most games."""
    body = quick("mappo", "classic/tictactoe", {"opponent": "random"})
    body["algo"] = {"name": "mappo", "rollout_steps": 16, "epochs": 4, "minibatches": 2}
    body["model"] = {"hidden": [64, 64]}
    body["seeds"] = [0, 1, 2]
    body["train"] = {"total_env_steps": 30_000, "eval_every": 0, "eval_episodes": 200}
    body["hardware"] = {"num_envs": 8, "parallel_runs": 2}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    returns = sorted(run["final_return"] for run in out["runs"])
    assert returns[1] > 0.6, returns


# ---------------------------------------------------------------- VMAS

NAVIGATION = "vmas/navigation"


def vmas_quick(algo: str, continuous: bool, env_id: str = NAVIGATION, **params) -> dict:
    body = quick(algo, env_id, {"max_steps": 10, "continuous_actions": continuous, **params})
    body["env"]["backend"] = "vmas"
    return body


def test_every_vmas_scenario_is_registered_with_a_vmas_preset():
    import vmas

    ids = {e for e in ENVS if e.startswith("vmas/")}
    every = [*vmas.scenarios, *vmas.mpe_scenarios, *vmas.debug_scenarios]
    assert ids == {f"vmas/{name}" for name in every}
    assert env_params(NAVIGATION).defaults["n_agents"] == 4  # read from make_world
    assert lookup(NAVIGATION).extra == "vmas"


@needs("vmas/het_mass")
def test_vmas_debug_scenarios_name_their_groups_by_kind():
    # het_mass: two agents that differ only in mass, so one group named without the space
    # and number of `agent 0`; kinematic_bicycle: two kinds of dynamics, two groups.
    het = probe("vmas/het_mass", {})
    assert [(g.name, g.agents) for g in het.groups] == [("agent", ("agent 0", "agent 1"))]
    bicycle = probe("vmas/kinematic_bicycle", {"continuous_actions": True})
    assert [g.name for g in bicycle.groups] == ["bicycle", "holo_rot"]
    assert [g.n_actions for g in bicycle.groups] == [2, 3]


@needs(NAVIGATION)
def test_vmas_ids_and_the_vmas_backend_go_together(tmp_path):
    body = vmas_quick("mappo", False)
    body["env"]["backend"] = "pettingzoo"
    out = run_json("validate", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 2
    assert "'vmas/navigation' is a VMAS scenario; set env.backend: vmas" in str(out)
    body = quick("mappo", "mpe/simple_spread", {})
    body["env"]["backend"] = "vmas"
    out = run_json("validate", str(write_spec(tmp_path, body, "b.yaml")))
    assert out["exit_code"] == 2 and "is not a VMAS scenario" in str(out)
    body = vmas_quick("mappo", False, n_agentz=3)
    out = run_json("validate", str(write_spec(tmp_path, body, "c.yaml")))
    assert out["exit_code"] == 2 and "takes no parameter 'n_agentz'" in str(out)


@needs(NAVIGATION)
def test_the_vmas_env_is_batched_on_its_device_with_groups_and_resets_ended_envs():
    import torch

    from marlctl.envs.vmas import VmasEnv

    env = VmasEnv(
        "vmas/simple_speaker_listener", "simple_speaker_listener", {"max_steps": 3}, 5, "cpu"
    )
    assert [g.agents for g in env.info.groups] == [("speaker_0",), ("listener_0",)]
    ob = env.reset(7)
    again = VmasEnv(
        "vmas/simple_speaker_listener", "simple_speaker_listener", {"max_steps": 3}, 5, "cpu"
    ).reset(7)
    for name in ob.obs:  # seeded start states
        assert torch.equal(ob.obs[name], again.obs[name]) and ob.obs[name].shape[0] == 5
    actions = {g.name: torch.zeros(5, 1, dtype=torch.long) for g in env.info.groups}
    for _ in range(3):
        tr = env.step(actions)
    assert tr.truncated.all() and not tr.terminated.any()  # the time limit cut all five
    assert not torch.equal(tr.final.obs["listener"], tr.next.obs["listener"])


@needs(NAVIGATION)
def test_each_vmas_env_draws_from_its_own_random_state():
    """VMAS shares one random state per process: an env stepped between another's steps
    must not change what that one draws (resets of ended envs are random)."""
    import torch

    from marlctl.envs.vmas import VmasEnv

    def episode(interleaved: bool) -> list[torch.Tensor]:
        args = ("vmas/navigation", "navigation", {"max_steps": 2, "n_agents": 2}, 3, "cpu")
        env, other = VmasEnv(*args), VmasEnv(*args)
        out = [env.reset(7).state]
        if interleaved:
            other.reset(9)
        actions = {g.name: torch.zeros(3, g.n_agents, dtype=torch.long) for g in env.info.groups}
        for _ in range(5):  # the time limit resets every env twice
            out.append(env.step(actions).next.state)
            if interleaved:
                other.step(actions)
                torch.rand(4)  # the process's own stream moves too
        return out

    alone, beside = episode(False), episode(True)
    assert len({tuple(s.flatten().tolist()) for s in alone}) > 2  # episodes start afresh
    assert all(torch.equal(a, b) for a, b in zip(alone, beside, strict=True))


@needs(NAVIGATION)
def test_batched_vmas_seeds_compute_what_each_seed_computes_alone(tmp_path):
    from test_native_training import batched_and_alone

    body = vmas_quick("mappo", True, n_agents=2)
    body["seeds"] = [0, 1]
    body["train"] = {"total_env_steps": 200, "eval_every": 100, "eval_episodes": 4}
    body["hardware"] = {"num_envs": 4, "batch_seeds": True, "threads_per_run": 1}
    runs = batched_and_alone(tmp_path, body)["runs"]
    assert runs[0]["final_return"] != runs[1]["final_return"]  # seeds differ


SMOKE_VMAS = [
    pytest.param(algo, kind, id=f"vmas-{algo}-{kind}", marks=needs(NAVIGATION))
    for algo, info in registered_algos().items()
    if not info.offline
    for kind in info.action_kinds
]


@pytest.mark.parametrize(("algo", "kind"), SMOKE_VMAS)
def test_every_algorithm_trains_on_vmas(algo, kind, tmp_path):
    body = vmas_quick(algo, kind == "continuous", n_agents=2)
    body["train"]["eval_every"] = 60
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    (run,) = out["runs"]
    assert run["status"] == "FINISHED" and run["final_return"] is not None


@needs(NAVIGATION)
def test_a_heterogeneous_vmas_run_evaluates_and_renders(tmp_path):
    body = vmas_quick("mappo", False, "vmas/simple_speaker_listener")
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    run_id = out["runs"][0]["run_id"]
    metrics = client().get_run(run_id).data.metrics
    assert {"eval/return/speaker", "eval/return/listener"} <= set(metrics)
    result = run_json("eval", run_id, "--episodes", "4", "--render", str(tmp_path / "play.gif"))
    assert result["exit_code"] == 0, result
    assert (tmp_path / "play.gif").stat().st_size > 0


# ---------------------------------------------------------------- multi-objective (MOMAland)

BEACH = "momaland/beach"


@needs(BEACH)
def test_reward_vectors_are_scalarised_by_the_weights_and_kept_per_objective():
    import torch

    from marlctl.envs.pettingzoo import PettingZooEnv

    params = {"num_agents": 6, "num_timesteps": 3}
    info = probe(BEACH, params)
    assert info.objectives == 2
    steps = {}
    for weights in ([1.0, 0.0], [0.0, 1.0], None):
        env = PettingZooEnv(BEACH, params, info, 3, torch.device("cpu"), reward_weights=weights)
        env.reset(0)
        actions = {"agent": torch.ones(3, 6, dtype=torch.long)}
        steps[str(weights)] = env.step(actions)
        env.close()
    first, second, equal = steps["[1.0, 0.0]"], steps["[0.0, 1.0]"], steps["None"]
    assert torch.equal(first.objectives, equal.objectives)  # same seed, same moves
    assert torch.allclose(first.rewards["agent"].mean(1), first.objectives[:, 0])
    assert torch.allclose(second.rewards["agent"].mean(1), second.objectives[:, 1])
    both = (first.rewards["agent"] + second.rewards["agent"]) / 2
    assert torch.allclose(equal.rewards["agent"], both)  # default: equal weights summing to 1


@needs(BEACH)
def test_every_objective_is_logged_for_training_and_evaluation(tmp_path):
    body = quick("mappo", BEACH, {"num_agents": 6, "num_timesteps": 3})
    body["env"]["reward_weights"] = [0.7, 0.3]
    body["train"] = {"total_env_steps": 2_400, "eval_every": 1_200, "eval_episodes": 8}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    metrics = client().get_run(out["runs"][0]["run_id"]).data.metrics
    for phase in ("train", "eval"):
        assert {f"{phase}/objective/0", f"{phase}/objective/1"} <= set(metrics), metrics
    from marlctl.report.labels import metric

    assert metric("eval/objective/1") == "Evaluation return of objective 1 (mean per agent)"


@needs(BEACH)
def test_reward_weights_are_checked_against_the_envs_objectives(tmp_path):
    body = quick("mappo", BEACH, {"num_agents": 6})
    body["env"]["reward_weights"] = [1.0, 2.0, 3.0]
    out = run_json("validate", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 2
    assert "env 'momaland/beach' has 2 objectives; give 2 weights, not 3" in str(out)
    body = quick("mappo", LBF, {})
    body["env"]["reward_weights"] = [1.0]
    out = run_json("validate", str(write_spec(tmp_path, body, "b.yaml")))
    assert out["exit_code"] == 2 and "has a scalar reward" in str(out)


@needs("momaland/catch")
def test_drones_with_two_objectives_train_a_few_thousand_steps(tmp_path):
    body = quick("mappo", "momaland/catch", {})
    body["train"] = {"total_env_steps": 4_000, "eval_every": 2_000, "eval_episodes": 4}
    out = run_json("run", str(write_spec(tmp_path, body)))
    assert out["exit_code"] == 0, out
    assert out["runs"][0]["env_steps"] >= 4_000


# ---------------------------------------------------------------- listing


def test_list_envs_describes_agents_spaces_and_groups_of_the_new_families():
    out = run_json("list", "envs", "--match", "vmas/simple_speaker", "--describe")
    (row,) = out["envs"]
    assert row["backends"] == ["vmas"] and row["preset"] == "vmas_simple_speaker_listener"
    groups = {g["name"]: g for g in row["description"]["groups"]}
    assert set(groups) == {"speaker", "listener"}
    assert groups["speaker"]["agents"] == ["speaker_0"]
    out = run_json("list", "envs", "--match", "classic/tictactoe", "--describe")
    (row,) = out["envs"]
    description = row["description"]
    assert description["turn_based"] and description["groups"][0]["action_mask"]
    assert description["groups"][0]["obs_shape"] == [3, 3, 2]


CYCLED = [
    ("sisl/pursuit", {"max_cycles": 30}),
    ("sisl/multiwalker", {"max_cycles": 30}),
    ("butterfly/knights_archers_zombies", {"max_cycles": 60, "spawn_delay": 2}),
    ("butterfly/pistonball", {"max_cycles": 30, "continuous": False}),
    ("butterfly/cooperative_pong", {"max_cycles": 30}),
]


@pytest.mark.parametrize(("env_id", "params"), CYCLED)
def test_the_cycle_conversion_and_the_shared_screen_step_exactly_as_pettingzoos_own(env_id, params):
    from marlctl.envs.registry import factory_kwargs, lookup, make_env, resolve_factory
    from marlctl.envs.turns import CycleParallel

    entry = lookup(env_id)
    ours = make_env(env_id, params)
    theirs = resolve_factory(entry)(**factory_kwargs(entry, params))
    assert type(ours) is CycleParallel and type(theirs) is not CycleParallel
    steps = 0
    for episode in range(2):  # the second after a whole episode: resets match too
        a, b = ours.reset(seed=episode), theirs.reset(seed=episode)
        for x, y in zip(a, b, strict=True):
            assert x.keys() == y.keys()
        draw = np.random.default_rng(episode)
        while theirs.agents:
            assert ours.agents == theirs.agents
            actions = {}
            for agent in theirs.agents:
                space = theirs.action_space(agent)
                space.seed(int(draw.integers(2**31)))
                actions[agent] = space.sample()
            mine, want = ours.step(actions), theirs.step(actions)
            for x, y in zip(mine[:4], want[:4], strict=True):
                assert x.keys() == y.keys()
                for agent in y:
                    np.testing.assert_array_equal(x[agent], y[agent])
            if env_id == "butterfly/pistonball":  # its state is the screen read once too
                np.testing.assert_array_equal(ours.state(), theirs.state())
            steps += 1
        assert not ours.agents
    assert steps >= 2 * 10
