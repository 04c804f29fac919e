"""Native tic-tac-toe and connect four against PettingZoo's (through the pettingzoo backend,
which presents each AEC game as one acting player per step): the same moves give the same
observations, global state, legal-move masks, players to move, rewards, episode ends and
final observations, over many games with their auto-resets."""

from __future__ import annotations

import pytest
import torch

from marlctl.envs.native import native_class
from marlctl.envs.pettingzoo import PettingZooEnv
from marlctl.envs.probe import probe

GAMES = ["classic/tictactoe", "classic/connect_four"]
PARAMS = {"opponent": None}


def _same(ours, theirs, what: str) -> None:
    for name in theirs.obs:
        torch.testing.assert_close(ours.obs[name], theirs.obs[name], msg=f"{what} obs")
        assert torch.equal(ours.masks[name], theirs.masks[name]), f"{what} masks"
        assert torch.equal(ours.active[name], theirs.active[name]), f"{what} active"
    torch.testing.assert_close(ours.state, theirs.state, msg=f"{what} state")


@pytest.mark.parametrize("env_id", GAMES)
def test_native_board_games_play_exactly_as_pettingzoo(env_id):
    envs = 16
    info = probe(env_id, PARAMS)
    theirs = PettingZooEnv(env_id, PARAMS, info, envs, torch.device("cpu"))
    ours = native_class(env_id)(PARAMS, envs, "cpu")
    assert ours.info.groups == info.groups and ours.info.state_dim == info.state_dim
    assert ours.info.turn_based and info.turn_based
    _same(ours.reset(0), theirs.reset(0), "reset")
    generator = torch.Generator().manual_seed(0)
    ob, results = ours.observe_now(), set()
    for step in range(600):
        # A random legal move for each board's player to move; the other's is ignored.
        masks = ob.masks["player"]
        weights = torch.where(masks.any(-1, keepdim=True), masks, True).flatten(0, 1).float()
        moves = torch.multinomial(weights, 1, generator=generator).view(envs, 2)
        a, b = ours.step({"player": moves}), theirs.step({"player": moves})
        done = b.terminated | b.truncated
        assert torch.equal(a.terminated, b.terminated) and not b.truncated.any(), step
        torch.testing.assert_close(a.rewards["player"], b.rewards["player"], msg=str(step))
        _same(a.next, b.next, f"step {step}")
        if done.any():
            for field, x, y in zip(a.final._fields, a.final, b.final, strict=True):
                if field == "state":
                    torch.testing.assert_close(x[done], y[done])
                    continue
                for name in y:
                    assert torch.equal(x[name][done].float(), y[name][done].float()), field
        results |= {tuple(r) for r in b.rewards["player"][done].tolist()}
        ob = a.next
    theirs.close()
    # Games were won by either side (and drawn, in tic-tac-toe).
    assert {(1.0, -1.0), (-1.0, 1.0)} <= results
    if env_id == "classic/tictactoe":
        assert (0.0, 0.0) in results


def _play(env, moves: list[int]):
    return [env.step({"player": torch.tensor([[m, m]])}) for m in moves]


def test_a_line_wins_for_its_player_and_a_full_board_draws():
    env = native_class("classic/tictactoe")(PARAMS, 1, "cpu")
    env.reset(0)
    # X: 0, 4, 8 (a diagonal); O: 1, 2.
    *_, last = _play(env, [0, 1, 4, 2, 8])
    assert last.terminated.tolist() == [True]
    assert last.rewards["player"].tolist() == [[1.0, -1.0]]
    assert not last.final.active["player"].any()
    assert last.next.active["player"].tolist() == [[True, False]]  # a new game
    # X: 0, 2, 3, 7, 8; O: 1, 4, 5, 6: no line; the board fills on move 9.
    steps = _play(env, [0, 1, 2, 4, 3, 5, 7, 6, 8])
    assert [s.terminated.item() for s in steps] == [False] * 8 + [True]
    assert all(s.rewards["player"].abs().sum() == 0 for s in steps)


def test_connect_four_discs_fall_and_four_in_a_column_wins():
    env = native_class("classic/connect_four")(PARAMS, 1, "cpu")
    env.reset(0)
    # The first player drops into column 3 four times, the second into column 4.
    steps = _play(env, [3, 4, 3, 4, 3, 4, 3])
    board = steps[-1].final.obs["player"][0, 0, :, :, 0]  # the first player's own discs
    assert board[:, 3].tolist() == [0, 0, 1, 1, 1, 1]  # stacked from the bottom row
    assert steps[-1].terminated.tolist() == [True]
    assert steps[-1].rewards["player"].tolist() == [[1.0, -1.0]]


def test_a_move_onto_a_full_cell_changes_nothing():
    env = native_class("classic/tictactoe")(PARAMS, 1, "cpu")
    env.reset(0)
    (first,) = _play(env, [4])
    (again,) = _play(env, [4])  # O plays X's square
    assert not again.terminated.any()
    assert torch.equal(again.next.obs["player"], first.next.obs["player"])
    assert again.next.active["player"].tolist() == [[False, True]]  # still O to move


def test_a_scripted_opponent_or_another_games_parameter_is_refused_natively():
    from games import invoke, write

    with pytest.raises(ValueError, match="pettingzoo"):
        native_class("classic/tictactoe")({"opponent": "random"}, 1, "cpu")
    with pytest.raises(ValueError, match="unknown parameter.*screen_scaling"):
        native_class("classic/tictactoe")({"screen_scaling": 9}, 1, "cpu")
    assert native_class("classic/connect_four").parameters().defaults == {
        "max_cycles": 42,
        "opponent": None,
        "screen_scaling": 9,
    }
    env = {"id": "classic/connect_four", "backend": "native", "params": {"opponent": "random"}}
    code, document = invoke("validate", str(write({"env": env, "algo": {"name": "mappo"}})))
    assert code == 2
    (error,) = document["errors"]
    assert "env.params.opponent" in error and "backend: pettingzoo" in error
