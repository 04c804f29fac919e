"""Self-play and population training: past snapshots of a group play it in some episodes
(the spec's `groups.NAME.pool`), and the tic-tac-toe opponents to measure it against."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from games import client, invoke, line_of, tag_spec, write
from torch import nn

from marlctl.envs.batch import Observation
from marlctl.spec.models import PoolSpec
from marlctl.train.pool import Pool, WithPool

# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("pool", "key", "message"),
    [
        (
            {"seats": "one"},
            "seats",
            "seats: one leaves the learner the other agents of group 'agent', which has only "
            "one; use seats: all",
        ),
        (
            {"share": 1.0},
            "share",
            "share: 1 with seats: all has snapshots play group 'agent' in every episode: it "
            "would never learn; lower share or use seats: one",
        ),
    ],
)
def test_a_pool_that_would_leave_a_group_nothing_to_learn_from_is_an_error(pool, key, message):
    path = write(tag_spec({"agent": {"pool": pool}}))
    code, out = invoke("validate", str(path))
    assert code == 2
    assert out["errors"] == [
        f"{path}:{line_of(path, f'{key}:')}: groups.agent.pool.{key}: {message}"
    ]


def test_a_pool_on_the_only_learning_group_must_leave_it_a_seat():
    body = tag_spec({"adversary": {"scripted": "random"}, "agent": {"pool": {"size": 4}}})
    path = write(body)
    code, out = invoke("validate", str(path))
    assert code == 2
    assert out["errors"] == [
        f"{path}:{line_of(path, 'pool:')}: groups.agent.pool: group 'agent' is the only one "
        "that learns: with seats: all a snapshot plays every learner in its episodes; use "
        "seats: one for self-play"
    ]


def test_a_scripted_group_keeps_no_pool_and_pool_fields_are_checked():
    path = write(tag_spec({"agent": {"scripted": "random", "pool": {}}}))
    code, out = invoke("validate", str(path))
    assert (
        code == 2
        and "a scripted or frozen group does not learn: it keeps no pool" in (out["errors"][0])
    )
    path = write(tag_spec({"agent": {"pool": {"sample": "elo", "size": 0}}}))
    code, out = invoke("validate", str(path))
    assert code == 2
    joined = " ".join(out["errors"])
    assert "groups.agent.pool.sample" in joined and "groups.agent.pool.size" in joined


def test_the_dry_run_says_a_snapshot_plays_part_of_the_episodes():
    pool = {"size": 4, "every": 100, "share": 0.25, "sample": "prioritised"}
    code, out = invoke("run", str(write(tag_spec({"agent": {"pool": pool}}))), "--dry-run")
    assert code == 0
    played = {g["name"]: g["played_by"] for g in out["plan"]["env"]["groups"]}
    assert played["agent"] == (
        "algo: mappo; 25% of episodes by a snapshot (prioritised, 4 kept, one per 100 steps)"
    )


# ---------------------------------------------------------------- the pool's mechanics


class Shadow:
    """Stands in for the snapshots' trainer: every agent of seed row i acts `w[i]`."""

    def __init__(self, rows: int, stateless: bool = True):
        self.policies = nn.Module()
        self.policies.register_buffer("w", torch.zeros(rows, 1))
        self.device = torch.device("cpu")
        self.stateless_acting = stateless
        self.calls: list[int] = []

    def act(self, ob: Observation, deterministic: bool, first=None):
        rows = ob.obs["g"].shape[0]
        self.calls.append(rows)
        per_seed_row = rows // self.policies.w.shape[0]
        value = self.policies.w.repeat_interleave(per_seed_row, 0)
        return {"g": value.expand(rows, ob.obs["g"].shape[1]).long()}


def live(values: list[float]) -> nn.Module:
    module = nn.Module()
    module.register_buffer("w", torch.tensor(values).unsqueeze(-1))
    return module


class Member:
    """Stands in for an included run's policy: every agent acts `value`."""

    def __init__(self, value: int):
        self.value = value
        self.firsts: list = []

    def act(self, ob: Observation, first, deterministic: bool) -> torch.Tensor:
        self.firsts.append(first)
        return torch.full(ob.obs["g"].shape[:2], self.value)


def make_pool(
    seats="all",
    sample="uniform",
    size=3,
    seeds=2,
    per_seed=4,
    n=2,
    share=1.0,
    stateless=True,
    members=(),
):
    include = [f"{i + 1:08x}" for i in range(len(members))]
    cfg = PoolSpec(size=size, every=10, seats=seats, sample=sample, share=share, include=include)
    shadow = Shadow(size * seeds, stateless)
    generator = torch.Generator().manual_seed(0)
    return Pool("g", cfg, n, shadow, seeds, seeds * per_seed, generator, list(members))


def observation(rows: int, n: int = 2) -> Observation:
    obs = {"g": torch.zeros(rows, n, 3)}
    return Observation(
        obs, torch.zeros(rows, 5), {"g": None}, {"g": torch.ones(rows, n, dtype=bool)}
    )


@pytest.mark.parametrize("stateless", [True, False])
def test_each_row_is_played_by_its_seeds_own_snapshot_in_one_batched_call(stateless):
    pool = make_pool(size=3, seeds=2, per_seed=4, stateless=stateless)
    pool.snapshot(live([10.0, 20.0]), 0)  # slot 0: seed 0 acts 10, seed 1 acts 20
    pool.snapshot(live([11.0, 21.0]), 10)  # slot 1
    assert (pool.filled, pool.newest, pool.taken, pool.next_snapshot) == (2, 1, [0, 10], 20)
    pool.slot = torch.tensor([0, 1, -1, 1, 1, -1, 0, 0])  # rows 0-3 seed 0, rows 4-7 seed 1
    own = torch.full((8, 2), 7)
    actions = pool.actions(observation(8), None, own)
    assert actions[:, 0].tolist() == [10, 11, 7, 11, 21, 7, 20, 20]
    # One call: each (snapshot, seed) on its own rows, padded to the most of them (2: seed
    # 0's rows 1 and 3 for slot 1); a policy with memory acts on every row in each.
    assert pool.shadow.calls == [3 * 2 * 2 if stateless else 3 * 8]
    # seats: one replaces only the seat a snapshot plays
    pool = make_pool(seats="one", size=1, seeds=1, per_seed=3)
    pool.snapshot(live([5.0]), 0)
    pool.slot, pool.seat = torch.tensor([0, 0, -1]), torch.tensor([1, 0, 1])
    actions = pool.actions(observation(3), None, torch.full((3, 2), 7))
    assert actions.tolist() == [[7, 5], [5, 7], [7, 7]]


def test_snapshots_acting_on_their_own_rows_act_as_they_would_on_every_row():
    """Real snapshots (MAPPO, different weights in every slot and seed): each acting on the
    rows it plays gives every row the action it gets when every snapshot acts on every row."""
    from marlctl.envs.native import native_class
    from marlctl.spec.models import Spec
    from marlctl.train.runner import build_trainer

    seeds, per_seed, size = (0, 1), 16, 5
    body = {"env": {"id": "mpe/simple_spread", "backend": "native"}, "algo": {"name": "mappo"}}
    spec = Spec.model_validate(body)
    env = native_class("mpe/simple_spread")({}, per_seed * len(seeds), "cpu", seeds=len(seeds))
    shadow = build_trainer(spec, env.info, per_seed, torch.device("cpu"), 1, seeds * size)
    assert shadow.stateless_acting
    cfg = PoolSpec(size=size, every=10, seats="all", sample="uniform", share=0.6)
    generator = torch.Generator().manual_seed(1)
    pool = Pool("agent", cfg, 3, shadow, len(seeds), per_seed * len(seeds), generator)
    for step in range(4):  # 4 of 5 slots filled, each from other weights
        live = build_trainer(spec, env.info, per_seed, torch.device("cpu"), 1, (step, 9 + step))
        pool.snapshot(live.policies, step * 10)
    ob = env.reset([0, 1])
    pool.draw(torch.ones(per_seed * len(seeds), dtype=torch.bool))
    assert (pool.slot >= 0).any() and (pool.slot < 0).any() and len(set(pool.slot.tolist())) > 3
    played = pool.slot >= 0
    compact = pool.played_rows(ob, deterministic=True)[played]
    every = pool.every_slot(ob, None, deterministic=True)[played]
    assert torch.equal(compact, every)


def test_the_oldest_snapshot_leaves_a_full_pool():
    pool = make_pool(size=2, seeds=1)
    for step, value in enumerate([1.0, 2.0, 3.0]):
        pool.snapshot(live([value]), step * 10)
    assert pool.shadow.policies.w.view(-1).tolist() == [3.0, 2.0]
    assert (pool.filled, pool.newest, pool.taken) == (2, 0, [20, 10])


def test_the_agents_a_snapshot_plays_are_inactive_for_the_learners_and_redrawn_per_episode():
    class Env:
        num_envs, device = 4, torch.device("cpu")
        info = None

        def reset(self, seed):
            return observation(4)

        def step(self, actions):
            from marlctl.envs.batch import Transition

            self.actions = actions["g"]
            done = torch.tensor([True, False, False, False])
            nxt = observation(4)
            final = observation(4)._replace(obs={"g": torch.ones(4, 2, 3)})
            return Transition(
                nxt, {"g": torch.zeros(4, 2)}, done, torch.zeros(4, dtype=bool), final
            )

    pool = make_pool(size=1, seeds=1, per_seed=4, share=0.5)
    env = WithPool(Env(), [pool])
    pool.snapshot(live([3.0]), 0)
    ob = env.reset(0)
    played = pool.played()
    assert 0 < int(played[:, 0].sum()) < 4  # seed 0's draw: half the rows, more or less
    assert torch.equal(ob.active["g"], ~played)
    tr = env.step({"g": torch.full((4, 2), 9)})
    assert torch.equal(env.env.actions == 3, played)
    assert torch.equal(tr.final.active["g"], ~played)  # the ended episode as it was played
    assert torch.equal(tr.played["g"], ~played)  # whose returns are the learners'
    assert torch.equal(tr.next.active["g"], ~pool.played())  # the next as it is drawn
    assert torch.equal(pool.played()[1:], played[1:])  # episodes that go on keep their player


def test_a_groups_return_counts_only_the_agents_and_episodes_its_learners_played():
    from marlctl.train.core import EpisodeStats

    stats = EpisodeStats({"g": 2, "h": 1}, num_envs=3, device=torch.device("cpu"))
    rewards = {"g": torch.tensor([[[1.0, 5.0], [2.0, 4.0], [7.0, 7.0]]]), "h": torch.ones(1, 3, 1)}
    # Row 0: a snapshot plays agent 1; row 1: the learners play both; row 2: the snapshot both.
    played = {"g": torch.tensor([[[True, False], [True, True], [False, False]]])}
    stats.record(rewards, torch.ones(1, 3, dtype=bool), played=played)
    (result,) = stats.take()
    assert result["return/g"] == pytest.approx((1.0 + 3.0) / 2)  # rows 0 and 1
    assert result["return/h"] == pytest.approx(1.0)  # every row: h has no pool
    # Over the learners' agents: row 0 (1 + 1) / 2, row 1 (2 + 4 + 1) / 3, row 2 1 / 1.
    assert result["return_mean"] == pytest.approx((1.0 + 7.0 / 3.0 + 1.0) / 3)
    assert result["episodes"] == 3
    stats.record(rewards, torch.ones(1, 3, dtype=bool), played={"g": played["g"] & False})
    (result,) = stats.take()
    assert "return/g" not in result  # no episode of its learners ended
    assert result["return_mean"] == pytest.approx(1.0)


def test_sampling_schemes_draw_the_latest_any_kept_or_the_hardest_snapshot():
    counts = {}
    for sample in ("latest", "uniform", "prioritised"):
        pool = make_pool(sample=sample, size=4, seeds=1, per_seed=4000)
        for step in range(3):
            pool.snapshot(live([float(step)]), step)
        pool.win[0, :3] = torch.tensor([0.9, 0.5, 0.1])
        pool.draw(torch.ones(4000, dtype=bool))
        counts[sample] = torch.bincount(pool.slot, minlength=4).tolist()
    assert counts["latest"] == [0, 0, 4000, 0]
    assert counts["uniform"][3] == 0 and min(counts["uniform"][:3]) > 1200
    # weights (1 - x)^2: 0.01, 0.25, 0.81 of 1.07
    share = np.array(counts["prioritised"][:3]) / 4000
    assert np.allclose(share, [0.01 / 1.07, 0.25 / 1.07, 0.81 / 1.07], atol=0.03)
    assert counts["prioritised"][3] == 0


def test_who_won_a_game_against_a_snapshot_moves_its_win_rate():
    # seats: one (self-play): the learner's seat against the snapshot's, in the same episode
    pool = make_pool(seats="one", size=1, seeds=1, per_seed=2)
    pool.snapshot(live([0.0]), 0)
    pool.slot, pool.seat = torch.tensor([0, 0]), torch.tensor([0, 1])
    pool.record(torch.tensor([[1.0, -1.0], [1.0, -1.0]]), torch.tensor([True, True]))
    # row 0: the snapshot (seat 0) won; row 1: the learner (seat 0) won: one game each
    assert pool.games[0, 0] == 2 and pool.win[0, 0] == pytest.approx(0.5)
    pool.record(torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.tensor([True, True]))
    assert pool.win[0, 0] == pytest.approx(0.5 + 0.04 * (0.75 - 0.5))  # a win and a tie
    assert torch.all(pool.returns == 0)  # ended episodes start their sums afresh
    # seats: all: against the learner's own running return for the group
    pool = make_pool(size=1, seeds=1, per_seed=2)
    pool.snapshot(live([0.0]), 0)
    pool.slot = torch.tensor([-1, 0])
    pool.record(torch.tensor([[2.0, 2.0], [1.0, 1.0]]), torch.tensor([True, True]))
    assert pool.baseline.item() == 2.0  # the learner's first episode sets it
    assert pool.win[0, 0] == pytest.approx(0.5 + 0.02 * (1.0 - 0.5))  # the snapshot scored less


def test_a_pool_comes_back_from_its_checkpoint_state():
    pool = make_pool(size=3, seeds=2, sample="prioritised")
    pool.snapshot(live([1.0, 2.0]), 0)
    pool.snapshot(live([3.0, 4.0]), 10)
    pool.win[:, :2] = torch.tensor([[0.2, 0.3], [0.6, 0.7]])
    states = [pool.seed_state(i) for i in range(2)]
    assert states[1]["snapshots"]["w"].view(-1).tolist()[:2] == [2.0, 4.0]
    fresh = make_pool(size=3, seeds=2, sample="prioritised")
    fresh.generator.manual_seed(123)
    fresh.load_seed_states(states)
    assert torch.equal(fresh.shadow.policies.w, pool.shadow.policies.w)
    assert torch.equal(fresh.win, pool.win)
    assert (fresh.filled, fresh.newest, fresh.taken, fresh.next_snapshot) == (2, 1, [0, 10], 20)
    every = torch.ones(8, dtype=bool)
    pool.draw(every)
    fresh.draw(every)
    assert torch.equal(fresh.slot, pool.slot)  # the same stream of draws goes on


@pytest.mark.parametrize("stateless", [True, False])
def test_an_included_runs_policy_plays_the_rows_drawn_for_it_beside_the_snapshots(stateless):
    members = [Member(50), Member(60)]
    pool = make_pool(size=3, seeds=2, per_seed=4, stateless=stateless, members=members)
    pool.snapshot(live([10.0, 20.0]), 0)
    # slot 0 a snapshot, slots 3 and 4 the included runs (after the 3 snapshot slots)
    pool.slot = torch.tensor([0, 3, -1, 4, 4, -1, 0, 3])
    first = torch.tensor([True, False, False, True, False, False, True, False])
    actions = pool.actions(observation(8), first, torch.full((8, 2), 7))
    assert actions[:, 0].tolist() == [10, 50, 7, 60, 60, 7, 20, 50]
    # an included policy acts on every row each step, so that one with memory keeps it
    assert all(torch.equal(m.firsts[0], first) for m in members)


def test_included_runs_are_drawn_with_the_snapshots_and_never_leave():
    for sample, expect in (("latest", {1, 3}), ("uniform", {0, 1, 3}), ("prioritised", {1, 3})):
        pool = make_pool(sample=sample, size=3, seeds=1, per_seed=3000, members=[Member(5)])
        if sample == "prioritised":
            pool.snapshot(live([0.0]), 0)
            pool.snapshot(live([1.0]), 10)
            pool.win[0, :2] = torch.tensor([1.0, 0.5])  # slot 0 always beaten: never drawn
        else:
            for step in range(2):
                pool.snapshot(live([float(step)]), step * 10)
        pool.draw(torch.ones(3000, dtype=bool))
        counts = torch.bincount(pool.slot, minlength=4).tolist()
        assert {k for k, c in enumerate(counts) if c > 5} == expect, (sample, counts)
    assert pool.metrics()[0]["pool/size/g"] == 3.0  # two snapshots and the included run
    for step in range(2, 6):  # the snapshots turn over; the included run stays
        pool.snapshot(live([float(step)]), step * 10)
    assert pool.kept().tolist() == [True, True, True, True]
    # a game against the included run moves its own win rate
    pool.slot = torch.full((3000,), 3)
    pool.baseline_seen[:] = True
    before = pool.win[0, 3].item()
    pool.record(torch.full((3000, 2), -1.0), torch.ones(3000, dtype=bool))
    assert pool.win[0, 3].item() > before and pool.games[0, 3] == 3000


def test_a_pool_of_included_runs_alone_draws_before_its_first_snapshot():
    pool = make_pool(size=2, seeds=1, per_seed=8, members=[Member(5)])
    pool.draw(torch.ones(8, dtype=bool))
    assert pool.slot.tolist() == [2] * 8


# ---------------------------------------------------------------- runs with a pool


def test_population_training_runs_logs_the_pool_and_checkpoints_its_snapshots():
    body = tag_spec(
        {"agent": {"pool": {"size": 2, "every": 100, "sample": "prioritised"}}},
        seeds=[0, 1],
        train={"checkpoint_every": 400, "log_every": 100},
    )
    code, out = invoke("run", str(write(body)))
    assert code == 0, out
    runs = out["runs"]
    metrics = client().get_run(runs[0]["run_id"]).data.metrics
    assert metrics["pool/size/agent"] == 2.0
    assert 0.0 <= metrics["pool/win_rate/agent"] <= 1.0
    from marlctl.stored import CHECKPOINT

    path = client().download_artifacts(runs[1]["run_id"], CHECKPOINT, ".")
    state = torch.load(path, weights_only=True)
    pool = state["pool"]["agent"]
    assert pool["taken"] == [400, 300] and pool["filled"] == 2 and pool["next_snapshot"] == 500
    assert all(v.shape[0] == 2 for v in pool["snapshots"].values())  # two snapshots of seed 1


def test_a_pool_includes_the_policies_of_other_runs():
    code, first = invoke("run", str(write(tag_spec(seeds=[5]), "first.yaml")))
    assert code == 0, first
    prey = first["runs"][0]["run_id"]
    pool = {"size": 2, "every": 100, "include": [prey[:8], f"{prey}:latest"]}
    path = write(tag_spec({"agent": {"pool": pool}}, name="league"))
    code, out = invoke("run", str(path), "--dry-run")
    assert code == 0, out
    played = {g["name"]: g["played_by"] for g in out["plan"]["env"]["groups"]}
    assert played["agent"].endswith("one per 100 steps, and 2 included runs)")
    code, out = invoke("run", str(path))
    assert code == 0, out
    metrics = client().get_run(out["runs"][0]["run_id"]).data.metrics
    assert metrics["pool/size/agent"] == 4.0  # two snapshots and the two included policies


def test_a_pools_included_runs_are_checked_before_any_run_starts():
    path = write(tag_spec({"agent": {"pool": {"include": ["abcd1234", "not-a-run"]}}}))
    code, out = invoke("validate", str(path))
    assert code == 2
    (error,) = out["errors"]
    assert error.startswith(f"{path}:{line_of(path, 'include:')}: groups.agent.pool.include")
    assert "include: 'not-a-run' must be RUN_ID[:CHECKPOINT]" in error
    code, out = invoke(
        "validate", str(write(tag_spec({"agent": {"pool": {"include": ["abcd1234"] * 2}}})))
    )
    assert code == 2 and "names a run twice" in out["errors"][0]

    path = write(tag_spec({"agent": {"pool": {"include": ["abcd1234"]}}}, name="nothing"))
    code, out = invoke("run", str(path))
    assert code == 2
    assert out["errors"] == [
        f"{path}:{line_of(path, '- abcd1234')}: groups.agent.pool.include.0: no run id starts "
        "with 'abcd1234'"
    ]
    assert not client().search_experiments(filter_string="name = 'nothing'")
    # a run that also trained a group this run does not let learn
    adversary = {"env": {"id": "mpe/simple_adversary", "backend": "native", "params": {}}}
    code, first = invoke("run", str(write(tag_spec(**adversary), "first.yaml")))
    assert code == 0, first
    agents = first["runs"][0]["run_id"]
    pool = {"seats": "one", "include": [agents]}
    body = tag_spec({"adversary": {"scripted": "random"}, "agent": {"pool": pool}}, **adversary)
    code, out = invoke("run", str(write(body)))
    assert code == 2, out
    assert "also trained group(s) adversary, which do not learn here" in " ".join(out["errors"])


def test_a_killed_run_resumes_with_the_pool_it_had(tmp_path, monkeypatch):
    import signal
    import subprocess
    import sys
    import time

    from marlctl.stored import CHECKPOINT

    monkeypatch.chdir(tmp_path)
    body = tag_spec(
        {"agent": {"pool": {"size": 64, "every": 500}}},
        train={"total_env_steps": 12_000, "checkpoint_every": 3_000, "eval_every": 6_000},
        tracking={"flush_every_s": 0.1},
    )
    spec = write(body)
    proc = subprocess.Popen(
        [sys.executable, "-m", "marlctl", "run", str(spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("mlruns/**/checkpoints/latest.pt")):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    (seed,) = [
        r
        for e in client().search_experiments()
        for r in client().search_runs([e.experiment_id])
        if r.data.tags.get("marlctl.role") == "seed"
    ]
    assert seed.info.status == "RUNNING"
    code, out = invoke("run", "--resume", seed.info.run_id)
    assert code == 0, out
    resumed = int(client().get_run(seed.info.run_id).data.tags["marlctl.resumed_from_step"])
    assert 3_000 <= resumed < 12_000
    path = client().download_artifacts(seed.info.run_id, CHECKPOINT, str(tmp_path))
    pool = torch.load(path, weights_only=True)["pool"]["agent"]
    # every snapshot since the start: those taken before the kill came back with the run
    assert pool["taken"] == list(range(0, 12_001, 500))


def test_resuming_from_a_corrupt_checkpoint_or_pool_state_fails_saying_what_is_wrong():
    from pathlib import Path

    from marlctl.stored import CHECKPOINT

    body = tag_spec(
        {"agent": {"pool": {"size": 2, "every": 100}}},
        seeds=[0, 1],
        train={"checkpoint_every": 400},
    )
    code, out = invoke("run", str(write(body)))
    assert code == 0, out
    corrupt, broken = (r["run_id"] for r in out["runs"])
    store = client()
    state = torch.load(store.download_artifacts(broken, CHECKPOINT, "."), weights_only=True)
    state["pool"]["agent"]["snapshots"] = "none"
    for run_id, name in ((corrupt, "a"), (broken, "b")):
        local = Path(name, "latest.pt")
        local.parent.mkdir()
        if run_id == corrupt:
            local.write_bytes(b"not a checkpoint")
        else:
            torch.save(state, local)
        store.log_artifact(run_id, str(local), artifact_path="checkpoints")
    reasons = {
        corrupt: "ValueError: cannot load 'checkpoints/latest.pt': not a PyTorch checkpoint of "
        "tensors (",
        broken: "ValueError: the pools' state in checkpoints/latest.pt does not fit this run's "
        "pools: ",
    }
    for run_id, reason in reasons.items():
        store.set_terminated(run_id, "KILLED")  # as a killed run is left
        code, out = invoke("run", "--resume", run_id)
        assert code == 1, out
        (resumed,) = [r for r in out["runs"] if r["run_id"] == run_id]
        assert resumed["status"] == "FAILED" and resumed["error"].startswith(reason)
        assert "weights_only" not in resumed["error"]


def test_self_play_on_tic_tac_toe_keeps_one_seat_for_the_learner():
    body = {
        "name": "ttt",
        "seeds": [0],
        "env": {"id": "classic/tictactoe"},
        "algo": {"name": "mappo", "rollout_steps": 16, "epochs": 1, "minibatches": 1},
        "model": {"hidden": [16]},
        "groups": {"player": {"pool": {"size": 2, "every": 64, "seats": "one"}}},
        "train": {"total_env_steps": 256, "eval_every": 0, "eval_episodes": 4},
        "hardware": {"device": "cpu", "num_envs": 4},
    }
    code, out = invoke("run", str(write(body)))
    assert code == 0, out
    metrics = client().get_run(out["runs"][0]["run_id"]).data.metrics
    assert metrics["pool/size/player"] == 2.0


# ---------------------------------------------------------------- tic-tac-toe's solver


def test_minimax_never_loses_and_random_play_against_it_never_wins():
    from marlctl.envs.turns import best_moves, classic, solve

    assert solve(0, 0) == 0  # perfect play draws
    assert best_moves(0b000_000_011, 0b000_011_000) == [2]  # win now, over blocking
    assert best_moves(0b000_010_000, 0b000_000_011) == [2]  # block the line
    env = classic("tictactoe_v3", opponent="minimax")
    rng = np.random.default_rng(0)
    outcomes = []
    for game in range(60):
        obs, _ = env.reset(seed=game)
        total, done = 0.0, False
        while not done:
            mask = np.asarray(obs["player"]["action_mask"], bool)
            obs, rewards, terms, truncs, _ = env.step(
                {"player": int(rng.choice(np.flatnonzero(mask)))}
            )
            total += rewards["player"]
            done = terms["player"] or truncs["player"]
        outcomes.append(total)
    assert max(outcomes) <= 0 and outcomes.count(-1) > 40  # random loses most games, wins none


def test_minimax_is_refused_for_a_game_it_does_not_solve():
    from marlctl.envs.turns import classic

    with pytest.raises(ValueError, match="opponent minimax plays tictactoe only, not connect_four"):
        classic("connect_four_v3", opponent="minimax")
