"""The native Hanabi env against JaxMARL's Hanabi (jaxmarl 0.2.0, on JAX's CPU backend): from
the same deals, with the same actions, every step gives the same observations, legal-move
masks, rewards and episode ends, over whole games of every ending (life tokens out, deck
out, perfect score) on several env rows at once; and the native deal shuffles the deck
right."""

from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
pytest.importorskip("jaxmarl")
jax.config.update("jax_platforms", "cpu")

import jax.numpy as jnp  # noqa: E402
from jaxmarl.environments.hanabi.hanabi import HanabiEnv  # noqa: E402

from marlctl.envs.native import native_class  # noqa: E402

ENVS = 4


def _ids(cards: np.ndarray, K: int) -> np.ndarray:
    """One-hot cards `[..., C, R]` as card types (c * R + r), K for no card."""
    flat = cards.reshape(*cards.shape[:-2], -1)
    return np.where(flat.any(-1), flat.argmax(-1), K)


def _copy_into(env, row: int, state) -> None:
    """Put a JaxMARL Hanabi start state (row `row` of a batch of them) into row `row` of the
    native env."""
    s = jax.tree.map(lambda x: np.asarray(x[row]), state)
    assert int(s.step) == 0  # the last action's features are not in a state
    N, H, K = env.N, env.H, env.K
    hands = _ids(s.player_hands, K)  # [N, H]
    deck = _ids(s.deck, K)  # the dealt cards are zeroed: they are the hands, in order
    deck[: N * H] = hands.reshape(-1)
    env.deck[row] = torch.from_numpy(deck)
    env.hands[row] = torch.from_numpy(hands)
    env.know[row] = torch.from_numpy(s.card_knowledge > 0)
    env.shown_colors[row] = torch.from_numpy(s.colors_revealed > 0)
    env.shown_ranks[row] = torch.from_numpy(s.ranks_revealed > 0)
    env.fireworks[row] = torch.from_numpy(s.fireworks.sum(-1).astype(np.int64))
    env.discards[row] = torch.from_numpy(s.discard_pile.sum(0).reshape(-1).astype(np.int64))
    env.info_tokens[row] = int(s.info_tokens.sum())
    env.lives[row] = int(s.life_tokens.sum())
    env.dealt[row] = int(s.num_cards_dealt)
    env.mover[row] = int(s.cur_player_idx.argmax())
    env.last_round[row] = int(s.last_round_count)
    env.over[row] = bool(s.terminal)
    env.last[row] = 0.0
    env.steps[row] = 0


def _policy(rng, masks: np.ndarray, state, eps: list[float]) -> np.ndarray:
    """Per env row, the noop for the players not on turn; for the one on turn a uniformly
    random legal move with probability `eps[row]`, else an informed one that sees its own
    cards (a card that scores, a dead card's discard, then a hint before the discard of a
    card with copies left, or after it in the last row: that row's games run the deck out),
    so that games end in every way."""
    E, N, A = masks.shape
    hands = np.asarray(state.player_hands)  # [E, N, H, C, R]
    levels = np.asarray(state.fireworks).sum(-1)  # [E, C]
    gone = np.asarray(state.discard_pile).sum(1)  # [E, C, R]
    H, R = hands.shape[2], hands.shape[-1]
    copies = np.array([3, 2, 2, 2, 1])
    actions = np.full((E, N), A - 1)
    for i in range(E):
        p = int(np.asarray(state.cur_player_idx[i]).argmax())
        legal = np.flatnonzero(masks[i, p])
        actions[i, p] = rng.choice(legal)
        if rng.random() < eps[i]:
            continue
        held = [divmod(int(c.argmax()), R) if c.any() else (None, None) for c in hands[i, p]]
        cards = [(h, c, r) for h, (c, r) in enumerate(held) if (c, r) != (None, None)]
        scoring = [H + h for h, c, r in cards if levels[i, c] == r]
        dead = [h for h, c, r in cards if r < levels[i, c] and masks[i, p, h]]
        hints = [a for a in legal if 2 * H <= a < A - 1]
        spare = [h for h, c, r in cards if gone[i, c, r] + 1 < copies[r] and masks[i, p, h]]
        last = (spare, hints) if i == E - 1 else (hints, spare)
        for options in (scoring, dead, *last):
            if options:
                actions[i, p] = rng.choice(options)
                break
    return actions


def _where(done: np.ndarray, new, old):
    return jax.tree.map(
        lambda a, b: jnp.where(done.reshape(-1, *(1,) * (a.ndim - 1)), a, b), new, old
    )


@pytest.mark.parametrize("players, steps", [(2, 150), (3, 120)])
def test_native_hanabi_plays_as_jaxmarl(players, steps):
    theirs = HanabiEnv(num_agents=players)
    reset = jax.jit(jax.vmap(theirs.reset))
    step = jax.jit(jax.vmap(theirs.step_env))
    legal = jax.jit(jax.vmap(theirs.get_legal_moves))
    ours = native_class(f"hanabi/{players}p")({}, ENVS, "cpu")
    ours.reset(0)
    agents = theirs.agents
    A = ours.A
    assert (ours.obs_dim, A) == (theirs.obs_size, theirs.num_moves)
    _, states = reset(jax.random.split(jax.random.PRNGKey(players), ENVS))
    for i in range(ENVS):
        _copy_into(ours, i, states)
    rng = np.random.default_rng(players)
    eps = [0.5, 0.1, 0.0, 0.0]
    ends = {"lives": 0, "deck": 0, "perfect": 0}
    their_obs = None
    for t in range(steps):
        ob = ours._observation()
        masks = np.stack([np.asarray(m) for m in legal(states).values()], 1).astype(bool)
        assert np.array_equal(ob.masks["agent"].numpy(), masks), t
        if their_obs is not None:  # JaxMARL's reset observation is taken from its step
            mine = ob.obs["agent"].numpy()
            assert np.array_equal(mine, their_obs), (t, np.argwhere(mine != their_obs)[:5])
        mover = np.asarray(states.cur_player_idx).argmax(-1)
        assert np.array_equal(ob.active["agent"].numpy(), np.eye(players, dtype=bool)[mover])
        actions = _policy(rng, masks, states, eps)
        tr = ours.step({"agent": torch.from_numpy(actions)})
        joint = {a: jnp.asarray(actions[:, j], dtype=jnp.int32) for j, a in enumerate(agents)}
        keys = jax.random.split(jax.random.PRNGKey(1000 + t), ENVS)
        obs, states, rewards, dones, _ = step(keys, states, joint)
        their_obs = np.stack([np.asarray(obs[a]) for a in agents], 1)
        final = tr.final.obs["agent"].numpy()
        assert np.array_equal(final, their_obs), (t, np.argwhere(final != their_obs)[:5])
        reward = np.asarray(rewards["__all__"], dtype=np.float32)
        assert np.array_equal(tr.rewards["agent"].numpy(), np.repeat(reward[:, None], players, 1))
        done = np.asarray(dones["__all__"])
        assert not tr.truncated.any(), t
        assert np.array_equal(tr.terminated.numpy(), done), t
        if not done.any():
            continue
        s = jax.tree.map(np.asarray, states)
        for i in np.flatnonzero(done):
            if s.out_of_lives[i]:
                ends["lives"] += 1
            elif s.fireworks[i].sum() == ours.K:
                ends["perfect"] += 1
            else:
                ends["deck"] += 1
                assert s.last_round_count[i] == players + 1
        keys = jax.random.split(jax.random.PRNGKey(10_000 + t), ENVS)
        obs, fresh = reset(keys)
        states = _where(done, fresh, states)
        restarted = np.stack([np.asarray(obs[a]) for a in agents], 1)
        their_obs = np.where(done[:, None, None], restarted, their_obs)
        for i in np.flatnonzero(done):
            _copy_into(ours, i, states)
    assert min(ends.values()) >= 1, ends


@pytest.mark.parametrize("players", [2, 4])
def test_native_hanabi_deals_a_shuffled_deck(players):
    n = 8000
    env = native_class(f"hanabi/{players}p")({}, n, "cpu")
    env.reset(0)
    K, D, N, H = env.K, env.D, env.N, env.H
    deck = env.deck
    # Every deal holds each card of the deck once: 3 ones, 2 twos, ... of each color.
    counts = torch.nn.functional.one_hot(deck, K).sum(1)  # [n, K]
    expected = torch.tensor([3, 2, 2, 2, 1] * 5)
    assert (counts == expected).all()
    assert torch.equal(env.hands, deck[:, : N * H].view(n, N, H))
    assert (env.dealt == N * H).all() and (env.mover == 0).all()
    # Each position holds each card type as often as the deck holds it, within 5 standard
    # errors (a uniform permutation).
    freq = torch.nn.functional.one_hot(deck, K).float().mean(0)  # [D, K]
    p = expected.float() / D
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt()).all()
    # Seed blocks deal alike to the same seed alone, and differently to other seeds.
    blocks = native_class(f"hanabi/{players}p")({}, 8, "cpu", seeds=2)
    blocks.reset([0, 1])
    alone = native_class(f"hanabi/{players}p")({}, 4, "cpu")
    alone.reset(1)
    assert torch.equal(blocks.deck[4:], alone.deck) and not torch.equal(blocks.deck[:4], alone.deck)
