"""Agent groups played by scripted and frozen policies (the spec's `groups`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from games import client, invoke, line_of, runner, tag_spec, write
from hypothesis import given, settings
from hypothesis import strategies as st

from marlctl.cli import app
from marlctl.envs.batch import Observation
from marlctl.envs.info import GroupInfo


@pytest.fixture(autouse=True)
def _untrusted(monkeypatch):
    """`--trust-factory` extends the process's trusted list: each test starts with none."""
    monkeypatch.setenv("MARLCTL_TRUSTED_FACTORIES", "")


def metric_keys(run_id: str) -> set[str]:
    return set(client().get_run(run_id).data.metrics)


# ---------------------------------------------------------------- validation


def test_a_group_the_env_lacks_and_a_spec_with_no_learner_are_errors_with_their_lines():
    path = write(tag_spec({"prey": {"scripted": "random"}}))
    code, out = invoke("validate", str(path))
    assert code == 2
    assert out["errors"] == [
        f"{path}:{line_of(path, 'prey:')}: groups.prey: no agent group 'prey' in env "
        "'mpe/simple_tag'; groups: adversary, agent"
    ]
    everyone = {"adversary": {"scripted": "random"}, "agent": {"scripted": "random"}}
    path = write(tag_spec(everyone))
    code, out = invoke("validate", str(path))
    assert code == 2
    assert out["errors"] == [
        f"{path}:{line_of(path, 'groups:')}: groups: every agent group of env 'mpe/simple_tag' "
        "is scripted or frozen: leave at least one to learn"
    ]


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ({"scripted": "random", "frozen": "abcd1234"}, "a group is scripted or frozen, not both"),
        ({"scripted": "greedy"}, "scripted: 'greedy' must be random or package.module:callable"),
        ({"frozen": "not-a-run"}, "frozen: 'not-a-run' must be RUN_ID[:CHECKPOINT]"),
        ({"frozen": "abcd1234:"}, "frozen: 'abcd1234:' names no checkpoint after ':'"),
    ],
)
def test_a_player_must_be_one_of_the_known_forms(group, message):
    path = write(tag_spec({"adversary": group}))
    code, out = invoke("validate", str(path))
    assert code == 2
    (error,) = out["errors"]
    assert error.startswith(f"{path}:{line_of(path, 'adversary:')}: groups.adversary")
    assert message in error


def test_the_algorithm_needs_to_fit_only_the_groups_that_learn():
    # QMIX takes discrete actions only; the continuous group is played by a script.
    body = tag_spec({"adversary": {"scripted": "random"}})
    body["env"]["params"]["continuous_actions"] = True
    body["algo"] = {"name": "qmix"}
    code, out = invoke("validate", str(write(body)))
    assert code == 2 and "does not support continuous actions" in " ".join(out["errors"])
    assert "group 'agent'" in " ".join(out["errors"])
    assert "group 'adversary'" not in " ".join(out["errors"])


def test_the_dry_run_says_who_plays_each_group():
    code, out = invoke("run", str(write(tag_spec({"agent": {"scripted": "random"}}))), "--dry-run")
    assert code == 0
    played = {g["name"]: g["played_by"] for g in out["plan"]["env"]["groups"]}
    assert played == {"adversary": "algo: mappo", "agent": "scripted: random"}


# ---------------------------------------------------------------- players


def group(discrete: bool = True, n: int = 2, actions: int = 3) -> GroupInfo:
    low, high = ((), ()) if discrete else ((-1.0,) * actions, (2.0,) * actions)
    return GroupInfo("g", ("a", "b")[:n], (4,), "float32", discrete, actions, low, high)


def observation(rows: int, g: GroupInfo, mask: torch.Tensor | None = None) -> Observation:
    return Observation(
        {g.name: torch.zeros(rows, g.n_agents, 4)},
        torch.zeros(rows, 8),
        {g.name: mask},
        {g.name: torch.ones(rows, g.n_agents, dtype=torch.bool)},
    )


def test_a_random_player_never_takes_a_masked_action_and_covers_the_allowed_ones():
    from marlctl.train.opponents import RandomPlayer

    g = group(actions=4)
    mask = torch.tensor([True, False, True, False]).expand(500, 2, 4)
    actions = RandomPlayer(g, [0], torch.device("cpu")).act(observation(500, g, mask), None, False)
    assert actions.shape == (500, 2)
    assert set(actions.unique().tolist()) == {0, 2}


def test_a_random_player_stays_in_the_action_box_and_draws_each_seed_as_alone():
    from marlctl.train.opponents import RandomPlayer

    g = group(discrete=False, actions=2)
    cpu = torch.device("cpu")
    batched = RandomPlayer(g, [3, 5], cpu).act(observation(20, g), None, False)
    assert batched.shape == (20, 2, 2)
    assert bool((batched >= -1.0).all()) and bool((batched <= 2.0).all())
    alone = RandomPlayer(g, [5], cpu).act(observation(10, g), None, False)
    torch.testing.assert_close(batched[10:], alone)
    assert not torch.equal(batched[:10], alone)


def test_a_scripted_policy_with_the_wrong_shape_is_a_clear_error():
    from toy_envs import wrong_shape

    from marlctl.train.opponents import ScriptedPlayer

    player = ScriptedPlayer(group(), wrong_shape, "toy_envs:wrong_shape")
    with pytest.raises(RuntimeError, match=r"returned actions of shape \(6,\); expected \(6, 2\)"):
        player.act(observation(6, group()), None, False)


def rows_of(values) -> st.SearchStrategy:
    """Six rows of two agents' actions."""
    return st.lists(st.lists(values, min_size=2, max_size=2), min_size=6, max_size=6)


ANY_RETURN = st.one_of(
    st.none(),
    st.text(max_size=3),
    st.integers(-3, 7),
    st.floats(allow_nan=True, allow_infinity=True),
    rows_of(st.integers(0, 2)),
    rows_of(st.sampled_from([0.0, 1.0, 2.0])),
    rows_of(st.one_of(st.integers(-3, 5), st.floats(-1, 4), st.just(float("nan")))),
)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(returned=ANY_RETURN)
def test_a_scripted_policy_plays_its_actions_as_they_are_or_fails_naming_itself(returned):
    """Whatever the function returns, the group plays exactly those actions (whole numbers
    of its action range, one per agent) or the step fails with a message naming the policy:
    nothing is truncated, wrapped round or passed on to fail inside the env."""
    from marlctl.train.opponents import ScriptedPlayer

    player = ScriptedPlayer(group(), lambda obs, mask, g: returned, "mine:policy")
    try:
        actions = player.act(observation(6, group()), None, False)
    except RuntimeError as err:
        assert str(err).startswith("scripted policy 'mine:policy' of group 'g' returned ")
    else:
        assert actions.dtype == torch.long and actions.shape == (6, 2)
        assert torch.equal(actions.double(), torch.as_tensor(returned, dtype=torch.double))
        assert bool(((actions >= 0) & (actions < 3)).all())


def test_a_scripted_policy_that_raises_or_exits_or_plays_nan_fails_naming_itself():
    from marlctl.train.opponents import ScriptedPlayer

    def raises(obs, mask, g):
        raise ValueError("no idea")

    def exits(obs, mask, g):
        raise SystemExit(3)

    for fn, why in ((raises, "ValueError: no idea"), (exits, "SystemExit: 3")):
        player = ScriptedPlayer(group(), fn, "mine:policy")
        with pytest.raises(RuntimeError) as caught:
            player.act(observation(6, group()), None, False)
        assert str(caught.value) == f"scripted policy 'mine:policy' of group 'g' raised {why}"
    box = group(discrete=False, actions=2)
    player = ScriptedPlayer(box, lambda obs, mask, g: torch.full((6, 2, 2), float("nan")), "m:p")
    with pytest.raises(RuntimeError, match="returned actions that are not finite numbers"):
        player.act(observation(6, box), None, False)


# ---------------------------------------------------------------- training against players


def seed_run_ids(summary: dict) -> list[str]:
    return [r["run_id"] for r in summary["runs"]]


def test_learners_train_against_a_scripted_group_and_log_only_their_own_returns():
    code, out = invoke("run", str(write(tag_spec({"agent": {"scripted": "toy_envs:still"}}))))
    assert code == 0, out
    (run_id,) = seed_run_ids(out)
    keys = metric_keys(run_id)
    assert "eval/return/adversary" in keys and "eval/return/agent" not in keys
    assert "loss/policy" in keys
    # The policy holds the adversaries' networks only.
    code, evaluated = invoke("eval", run_id, "--trust-factory", "toy_envs:still")
    assert code == 0, evaluated
    assert set(evaluated["runs"][0]["returns"]) == {"adversary"}


def test_a_scripted_policy_that_does_not_import_stops_the_run_before_it_starts():
    path = write(tag_spec({"agent": {"scripted": "toy_envs:no_such_policy"}}))
    code, out = invoke("run", str(path))
    assert code == 2
    assert out["errors"] == [
        f"{path}:{line_of(path, 'scripted:')}: groups.agent.scripted: 'toy_envs' has no "
        "attribute 'no_such_policy'"
    ]
    assert not client().search_experiments(filter_string="name = 'tag'")


def test_a_frozen_group_plays_the_policy_of_an_earlier_run_and_evaluates_with_it():
    code, first = invoke("run", str(write(tag_spec(), "first.yaml")))
    assert code == 0, first
    (trained,) = seed_run_ids(first)
    body = tag_spec({"agent": {"frozen": trained[:8]}}, name="against-frozen")
    code, second = invoke("run", str(write(body)))
    assert code == 0, second
    (run_id,) = seed_run_ids(second)
    assert "eval/return/agent" not in metric_keys(run_id)
    # The frozen prey is the first run's: evaluating the second run against it repeats its
    # final evaluation exactly.
    code, evaluated = invoke("eval", run_id)
    assert code == 0, evaluated
    result = evaluated["runs"][0]
    assert result["return_mean"] == pytest.approx(result["logged_return"], abs=1e-5)


def test_a_frozen_run_must_name_one_seed_on_the_same_env_with_the_same_group():
    code, first = invoke("run", str(write(tag_spec(seeds=[0, 1]), "first.yaml")))
    assert code == 0, first
    parent = first["parent_run_id"]
    path = write(tag_spec({"agent": {"frozen": parent}}, name="b"))
    code, out = invoke("run", str(path))
    assert code == 2
    (error,) = out["errors"]
    assert error.startswith(f"{path}:{line_of(path, 'frozen:')}: groups.agent.frozen: run")
    assert "has 2 finished seed runs; name one of them" in error
    for seed_run in seed_run_ids(first):
        assert seed_run in error

    seed_run = seed_run_ids(first)[0]
    other = tag_spec({"agent": {"frozen": seed_run}}, name="c")
    other["env"]["params"]["num_obstacles"] = 1  # the prey sees an obstacle more
    path = write(other)
    code, out = invoke("run", str(path))
    assert code == 2
    (error,) = out["errors"]
    assert "groups.agent.frozen" in error and "has other agents or spaces" in error

    spread = tag_spec({"agent": {"frozen": seed_run}}, name="d")
    spread["env"] = {"id": "mpe/simple_adversary", "backend": "native"}
    code, out = invoke("run", str(write(spread)))
    assert code == 2
    assert "trained on env 'mpe/simple_tag', not 'mpe/simple_adversary'" in out["errors"][0]


def replace_artifact(run_id: str, artifact: str, content: bytes | dict) -> None:
    """Overwrite `artifact` (folder/name) of a run with bytes, or with `torch.save`d data."""
    folder, _, name = artifact.rpartition("/")
    local = Path("replaced", run_id, name)
    local.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        local.write_bytes(content)
    else:
        torch.save(content, local)
    client().log_artifact(run_id, str(local), artifact_path=folder or None)


def test_a_frozen_run_that_did_not_finish_or_whose_files_are_broken_is_refused_at_its_line():
    code, first = invoke("run", str(write(tag_spec(seeds=[0, 1, 2, 3]), "first.yaml")))
    assert code == 0, first
    failed, garbage, unfit, not_yaml = seed_run_ids(first)
    client().set_terminated(failed, "FAILED")
    replace_artifact(garbage, "policy/final.pt", b"not a checkpoint")
    replace_artifact(unfit, "policy/final.pt", {"policies": {"actor.w": torch.zeros(3)}})
    replace_artifact(not_yaml, "spec.yaml", b"env: [unclosed\n")
    elsewhere = Path("elsewhere.pt").resolve()
    torch.save({"policies": {}}, elsewhere)
    refused = {
        failed: f"run '{failed}' did not finish training (FAILED): name a finished run",
        garbage: f"run '{garbage}': cannot load 'policy/final.pt': not a PyTorch checkpoint",
        unfit: f"run '{unfit}': 'policy/final.pt' does not fit this run's networks",
        not_yaml: f"its stored spec does not load: run {not_yaml} spec.yaml:1: invalid YAML",
        # A spec names its run's artifacts, never a file of the machine that runs it.
        f"{unfit}:{elsewhere}": f"'{elsewhere}' is not an artifact of run '{unfit}' (",
    }
    for ref, message in refused.items():
        path = write(tag_spec({"agent": {"frozen": ref}}, name="against"))
        code, out = invoke("run", str(path))
        assert code == 2, out
        (error,) = out["errors"]
        where = f"{path}:{line_of(path, 'frozen:')}: groups.agent.frozen: "
        assert error.startswith(where + message), error
        assert "weights_only" not in error  # PyTorch's advice to load it unsafely
    assert not client().search_experiments(filter_string="name = 'against'")


def test_bench_checks_the_frozen_groups_before_it_measures():
    path = write(tag_spec({"agent": {"frozen": "abcd1234"}}))
    code, out = invoke("bench", str(path), "--num-envs", "4", "--seconds", "0.1")
    assert code == 2
    assert out["errors"] == [
        f"{path}:{line_of(path, 'frozen:')}: groups.agent.frozen: no run id starts with 'abcd1234'"
    ]


def test_validate_refuses_the_players_that_run_refuses():
    frozen = write(tag_spec({"agent": {"frozen": "abcd1234"}}))
    code, out = invoke("validate", str(frozen))
    assert code == 2
    assert out["errors"] == [
        f"{frozen}:{line_of(frozen, 'frozen:')}: groups.agent.frozen: no run id starts with "
        "'abcd1234'"
    ]
    scripted = write(tag_spec({"agent": {"scripted": "toy_envs:no_such_policy"}}), "other.yaml")
    code, out = invoke("validate", str(scripted))
    assert code == 2
    (error,) = out["errors"]
    assert error.startswith(f"{scripted}:{line_of(scripted, 'scripted:')}: groups.agent.scripted:")


def test_a_stored_spec_naming_a_scripted_policy_runs_it_only_where_it_is_trusted():
    code, out = invoke("run", str(write(tag_spec({"agent": {"scripted": "toy_envs:still"}}))))
    assert code == 0, out
    (run_id,) = seed_run_ids(out)
    code, refused = invoke("eval", run_id)
    assert code == 2
    (message,) = refused["errors"]
    assert "groups.agent.scripted" in message
    assert "--trust-factory toy_envs:still" in message
    code, trusted = invoke("eval", run_id, "--trust-factory", "toy_envs:still")
    assert code == 0, trusted


# ---------------------------------------------------------------- cross-play


def test_cross_play_plays_each_seat_against_the_other_run_both_ways_and_stores_it():
    from marlctl.crossplay import stored_matches

    code, first = invoke("run", str(write(tag_spec(), "a.yaml")))
    assert code == 0, first
    code, second = invoke("run", str(write(tag_spec(name="tag-b", seeds=[1]), "b.yaml")))
    assert code == 0, second
    (a,), (b,) = seed_run_ids(first), seed_run_ids(second)
    code, out = invoke("eval", a, "--vs", b[:8])
    assert code == 0, out
    played = {(m["run_id"], m["seat"], m["opponent"]) for m in out["matches"]}
    assert played == {
        (a, "adversary", b), (a, "agent", b), (b, "adversary", a), (b, "agent", a)
    }  # fmt: skip
    for m in out["matches"]:
        assert m["opponent_groups"] == ["agent" if m["seat"] == "adversary" else "adversary"]
        assert m["score"] == m["returns"][m["seat"]]
    # Stored with the seat's run; playing the pair again reproduces every figure.
    stored = stored_matches(client(), a)
    assert {(m.seat, m.opponent) for m in stored} == {("adversary", b), ("agent", b)}
    again = {(m["run_id"], m["seat"]): m["score"] for m in out["matches"]}
    code, out = invoke("eval", a, "--vs", b)
    assert code == 0
    assert {(m["run_id"], m["seat"]): m["score"] for m in out["matches"]} == again


def test_cross_play_refuses_options_it_does_not_use_and_runs_it_cannot_play():
    code, first = invoke("run", str(write(tag_spec(), "a.yaml")))
    assert code == 0, first
    (a,) = seed_run_ids(first)
    code, out = invoke("eval", a, "--vs", a)
    assert code == 2
    assert out["errors"] == [
        "--vs: name at least one run other than RUN_ID's own seeds (its seeds play each other "
        "where it has two or more)"
    ]
    code, out = invoke("eval", a, "--vs", "ffff0000", "--seed", "3")
    assert code == 2 and out["errors"][0].startswith("--seed: cross-play plays")
    code, out = invoke("eval", a, "--vs", "ffff0000")
    assert code == 2 and out["errors"] == ["--vs: no run id starts with 'ffff0000'"]


def test_cross_play_reads_each_run_named_by_vs_once(monkeypatch):
    import marlctl.crossplay

    asked = []

    def cross_play(run_id, others, *rest):
        asked.append(others)
        return marlctl.crossplay.CrossPlay([])

    monkeypatch.setattr(marlctl.crossplay, "cross_play", cross_play)
    listed = ",".join([" abcd5678", "", "abcd5678 ", "ef01ab", "abcd5678"] * 500)
    code, _ = invoke("eval", "abcd1234", "--vs", listed)
    assert code == 0 and asked == [["abcd5678", "ef01ab"]]


def test_cross_play_names_the_run_that_cannot_play_and_refuses_runs_with_nothing_to_play():
    predators = tag_spec({"agent": {"scripted": "random"}}, seeds=[0, 1])
    code, first = invoke("run", str(write(predators, "a.yaml")))
    assert code == 0, first
    a, b = seed_run_ids(first)
    # Both learned the predators only: neither has a policy for the other group, and an
    # agent seat needs a group of two or more agents.
    code, out = invoke("eval", a, "--vs", b, "--seats", "groups")
    assert code == 2 and out["errors"][0].startswith("--vs: no match to play")
    solo = tag_spec({"adversary": {"scripted": "random"}}, name="solo", seeds=[0, 1])
    code, lone = invoke("run", str(write(solo, "solo.yaml")))
    assert code == 0, lone
    c, d = seed_run_ids(lone)
    code, out = invoke("eval", c, "--vs", d)
    assert code == 2
    assert out["errors"] == [
        "--vs: no match to play: each run learned only group agent; a match needs an "
        "opponent that learned a group other than the seat"
    ]
    code, out = invoke("eval", c, "--vs", d, "--seats", "agents")
    assert code == 2
    assert out["errors"] == [
        "--seats: no agent seat to play: the runs learned group agent; an agent seat needs a "
        "group of two or more agents that both runs learned"
    ]
    code, second = invoke("run", str(write(tag_spec(name="tag-b", seeds=[0, 1, 2]), "b.yaml")))
    assert code == 0, second
    broken, not_yaml, failed = seed_run_ids(second)
    replace_artifact(broken, "policy/final.pt", b"not a checkpoint")
    replace_artifact(not_yaml, "spec.yaml", b"env: [unclosed\n")
    client().set_terminated(failed, "FAILED")
    refused = {
        broken: f"--vs: group 'agent': run '{broken}': cannot load 'policy/final.pt': not a",
        not_yaml: f"run {not_yaml}:1: invalid YAML",  # the run, not the file it was read from
        failed: f"--vs: run '{failed}' did not finish training (FAILED): name a finished run",
    }
    for other, message in refused.items():
        code, out = invoke("eval", a, "--vs", other)
        assert code == 2, out
        (error,) = out["errors"]
        assert error.startswith(message), error
    assert not list(Path("mlruns").glob("**/crossplay/*.json"))


def test_the_report_adds_the_cross_play_matrix_and_ratings_in_every_format():
    code, first = invoke("run", str(write(tag_spec(), "a.yaml")))
    assert code == 0, first
    code, second = invoke("run", str(write(tag_spec(name="tag-b", seeds=[1]), "b.yaml")))
    assert code == 0, second
    (a,), (b,) = seed_run_ids(first), seed_run_ids(second)
    code, played = invoke("eval", a, "--vs", b)
    assert code == 0, played
    # Records edited by hand are left out, not read halfway: a score that is text or no
    # number, a record that claims the seat of another run than the one it is stored with.
    first_match = played["matches"][0]
    seat_run = first_match["run_id"]
    other = b if seat_run == a else a
    forged = [
        dict(first_match, score="high"),
        dict(first_match, score=float("nan")),
        dict(first_match, run_id="0" * 32),
        dict(first_match, run_id=other, opponent=seat_run),
    ]
    for index, record in enumerate(forged):
        Path(f"tampered{index}.json").write_text(json.dumps([record]))
        client().log_artifact(seat_run, f"tampered{index}.json", artifact_path="crossplay")
    code, report = invoke("report")
    assert code == 0, report
    crossplay = report["crossplay"]
    assert len(crossplay["matches"]) == 4
    ratings = {r["run_id"]: r for r in crossplay["ratings"]}
    assert set(ratings) == {a, b}
    # Two seats, one game on each: every game is won, drawn or lost by both sides.
    for rating in ratings.values():
        assert rating["games"] == 2
    assert ratings[a]["wins"] == ratings[b]["losses"]
    assert ratings[a]["draws"] == ratings[b]["draws"]
    scores = {(m["run_id"], m["seat"]): m["score"] for m in crossplay["matches"]}
    a_wins = sum(scores[(a, seat)] > scores[(b, seat)] for seat in ("adversary", "agent"))
    assert ratings[a]["wins"] == a_wins
    best = crossplay["ratings"][0]
    assert best["ordinal"] >= crossplay["ratings"][1]["ordinal"]

    result = runner.invoke(app, ["report", "--out", "report.md"])
    assert result.exit_code == 0, result.output
    text = Path("report.md").read_text()
    assert "## Cross-play" in text and "Thurstone-Mosteller" in text
    assert f"tag · seed 0 · {a[:8]}" in text
    result = runner.invoke(app, ["report", "--out", "report.html"])
    assert result.exit_code == 0, result.output
    assert "<h2>Cross-play</h2>" in Path("report.html").read_text()
    result = runner.invoke(app, ["report", "--out", "report.csv"])
    assert result.exit_code == 0, result.output
    rows = Path("report_crossplay.csv").read_text().splitlines()
    assert rows[0].startswith("kind,seat,run_id")
    assert sum(r.startswith("match,") for r in rows) == 4
    assert sum(r.startswith("rating,") for r in rows) == 2


# ---------------------------------------------------------------- zero-shot coordination


def test_a_partner_replaces_only_its_agents_actions_from_the_observation_the_env_gave():
    from types import SimpleNamespace

    from marlctl.envs.batch import Transition
    from marlctl.train.opponents import WithOpponents

    g = GroupInfo("g", ("a", "b", "c"), (4,), "float32", True, 5)
    rows = 2

    class Env:
        num_envs, device, info = rows, torch.device("cpu"), None

        def __init__(self):
            self.played, self.t = [], 0

        def reset(self, seed):
            return observation(rows, g)

        def step(self, actions):
            self.played.append(actions["g"].clone())
            self.t += 1
            ob = observation(rows, g)
            ob.obs["g"].fill_(self.t)
            ended = torch.tensor([self.t == 1, False])
            return Transition(ob, {"g": torch.zeros(rows, 3)}, ended, ended.clone(), ob)

    class Partner:
        def __init__(self):
            self.seen = []

        def act(self, ob, first, deterministic):
            self.seen.append((ob.obs["g"][0, 0, 0].item(), first, deterministic))
            return torch.tensor([[1, 2, 3], [4, 3, 2]])

    env, partner = Env(), Partner()
    wrapped = WithOpponents(
        env, SimpleNamespace(groups=[g]), {}, True, partners={"g": (partner, [0, 2])}
    )
    wrapped.reset(0)
    learners = {"g": torch.zeros(rows, 3, dtype=torch.long)}  # the learners' actions
    wrapped.step(learners)
    wrapped.step(learners)
    for played in env.played:
        assert played.tolist() == [[1, 0, 3], [4, 0, 2]]
    assert learners["g"].tolist() == [[0, 0, 0], [0, 0, 0]]  # the learners' own untouched
    # The partner acts on the env's last observation, told where episodes began.
    assert partner.seen[0][0] == 0 and partner.seen[0][1] is None and partner.seen[0][2]
    assert partner.seen[1][0] == 1 and partner.seen[1][1].tolist() == [True, False]


def predators_of_two_seeds() -> tuple[dict, str, str]:
    """A run whose two seeds learned the predators, the prey random: its summary, its seed runs."""
    predators = tag_spec({"agent": {"scripted": "random"}}, seeds=[0, 1])
    code, first = invoke("run", str(write(predators, "a.yaml")))
    assert code == 0, first
    a, b = seed_run_ids(first)
    return first, a, b


def test_coordination_averages_each_pair_both_ways_with_self_play_on_the_diagonal():
    from marlctl.crossplay import Match, coordination

    def match(run, other, score, agent="p0", seat="team"):
        return Match(run, 0, seat, other, 0, [seat], 4, 0, score, {seat: score}, None, agent)

    matches = [
        match("a", "b", 10.0, "p0"), match("a", "b", 20.0, "p1"),
        match("b", "a", 30.0, "p0"), match("b", "a", 40.0, "p1"),
        match("a", "a", 50.0, None), match("b", "b", 70.0, None),
        match("a", "b", 999.0, None, seat="other"),  # a group seat: not coordination
    ]  # fmt: skip
    (found,) = coordination(matches)
    assert found.seat == "team" and found.runs == ["a", "b"]
    assert found.cells == {("a", "b"): 25.0, ("b", "a"): 25.0, ("a", "a"): 50.0, ("b", "b"): 70.0}
    assert found.self_play == 60.0 and found.cross_play == 25.0


def test_agent_seats_pair_a_runs_own_seeds_and_play_self_play_beside_them():
    first, a, b = predators_of_two_seeds()
    parent = first["parent_run_id"]
    # The parent against itself: its two seeds play each other, one agent at a time.
    code, out = invoke("eval", parent, "--vs", parent)
    assert code == 0, out
    seats = {(m["run_id"], m["agent"], m["opponent"]) for m in out["matches"]}
    assert seats == {
        (a, "adversary_0", b), (a, "adversary_1", b), (b, "adversary_0", a),
        (b, "adversary_1", a), (a, None, a), (b, None, b),
    }  # fmt: skip
    for m in out["matches"]:
        assert m["seat"] == "adversary" and m["score"] == m["returns"]["adversary"]
        assert m["opponent_groups"] == ([] if m["agent"] is None else ["adversary"])
    # Self-play repeats the run's own evaluation.
    code, alone = invoke("eval", a)
    assert code == 0, alone
    own = next(m for m in out["matches"] if m["run_id"] == a and m["agent"] is None)
    assert own["score"] == pytest.approx(alone["runs"][0]["returns"]["adversary"], abs=1e-6)
    (found,) = out["coordination"]
    assert found["seat"] == "adversary" and sorted(found["runs"]) == sorted([a, b])
    # Group seats only: nothing to play, and the error says what would be.
    code, out = invoke("eval", a, "--vs", b, "--seats", "groups")
    assert code == 2
    (error,) = out["errors"]
    assert error.startswith("--vs: no match to play: each run learned only group adversary")
    assert error.endswith("--seats agents plays one agent of a group beside the other run's others")
    code, out = invoke("eval", a, "--seats", "agents")
    assert code == 2 and out["errors"] == ["--seats: it chooses the seats of cross-play: add --vs"]


def test_agent_seats_beside_a_copy_of_the_same_policy_score_its_self_play():
    # Two runs of one spec and seed train the same weights: every agent seat of one beside
    # the other plays exactly the policy's self-play, on the same episodes.
    predators = tag_spec({"agent": {"scripted": "random"}}, seeds=[3])
    code, first = invoke("run", str(write(predators, "a.yaml")))
    assert code == 0, first
    code, second = invoke("run", str(write(dict(predators, name="tag-b"), "b.yaml")))
    assert code == 0, second
    (a,), (b,) = seed_run_ids(first), seed_run_ids(second)
    code, out = invoke("eval", a, "--vs", b, "--seats", "agents")
    assert code == 0, out
    scores = {m["score"] for m in out["matches"]}
    assert len(out["matches"]) == 6 and len(scores) == 1


def test_the_report_adds_the_coordination_matrix_in_every_format():
    _, a, b = predators_of_two_seeds()
    code, played = invoke("eval", a, "--vs", b)
    assert code == 0, played
    code, report = invoke("report")
    assert code == 0, report
    crossplay = report["crossplay"]
    assert len(crossplay["matches"]) == 6 and crossplay["ratings"] == []
    (found,) = crossplay["coordination"]
    cells = {(c["run"], c["with"]): c["score"] for c in found["cells"]}
    scores = {(m["run_id"], m["agent"], m["opponent"]): m["score"] for m in played["matches"]}
    pair = [v for (run, agent, other), v in scores.items() if agent is not None]
    assert cells[(a, b)] == cells[(b, a)] == pytest.approx(sum(pair) / len(pair))
    assert cells[(a, a)] == scores[(a, None, a)] and found["self_play"] == pytest.approx(
        (scores[(a, None, a)] + scores[(b, None, b)]) / 2
    )
    result = runner.invoke(app, ["report", "--out", "report.md"])
    assert result.exit_code == 0, result.output
    text = Path("report.md").read_text()
    assert "Zero-shot coordination, group adversary" in text
    assert "cross-play / self-play" in text
    result = runner.invoke(app, ["report", "--out", "report.csv"])
    assert result.exit_code == 0, result.output
    rows = Path("report_crossplay.csv").read_text().splitlines()
    assert rows[0].endswith(",agent")
    assert sum(r.startswith("match,") and r.endswith(",adversary_0") for r in rows) == 2
    result = runner.invoke(app, ["report"])
    assert result.exit_code == 0, result.output
    assert "zero-shot coordination" in result.output


def test_sampled_cross_play_is_its_own_seat_and_plays_the_same_episodes_again():
    _, a, b = predators_of_two_seeds()
    code, greedy = invoke("eval", a, "--vs", b)
    assert code == 0, greedy
    code, sampled = invoke("eval", a, "--vs", b, "--sampled")
    assert code == 0, sampled
    assert {m["sampled"] for m in greedy["matches"]} == {False}
    assert {m["sampled"] for m in sampled["matches"]} == {True}
    code, again = invoke("eval", a, "--vs", b, "--sampled")
    assert code == 0, again
    assert [m["score"] for m in again["matches"]] == [m["score"] for m in sampled["matches"]]
    # Both kinds stay stored side by side; the report keeps them apart.
    code, report = invoke("report")
    assert code == 0, report
    kinds = {(c["seat"], c["sampled"]) for c in report["crossplay"]["coordination"]}
    assert kinds == {("adversary", False), ("adversary", True)}
    code, out = invoke("eval", a, "--vs", b, "--record", "data")
    assert code == 2 and out["errors"] == [
        "--record: cross-play is not recorded: leave it out with --vs"
    ]
