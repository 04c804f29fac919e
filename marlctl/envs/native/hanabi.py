"""Hanabi (Bard et al. 2020), JaxMARL's port of the Hanabi Learning Environment as batched
torch: `hanabi/2p` to `hanabi/5p` under `env.backend: native`.

Two to five players hold cards they cannot see: a deck of `num_colors` colors with
`num_cards_of_rank[r]` cards of each rank r (three 1s, two 2s, 3s and 4s, one 5 by
default), `hand_size` cards each (5, or 4 from four players on). Taking turns, a player
discards a card (earning back an info token, when fewer than `max_info_tokens` are left),
plays one (onto its color's firework if it is the next rank there; otherwise it is
discarded and a life token is lost), or spends an info token to hint a color or a rank to
another player, which shows that player every card of it in their hand. A played or
discarded card leaves its slot, the cards behind it move up one, and the deck's top card
takes the last slot; a completed firework earns back an info token. Everyone's reward is
the step's change in score (the cards on the fireworks), and losing the last life token
scores minus the fireworks' total, so a game lost that way returns 0. The game ends when
the life tokens run out, the fireworks are complete, or a full round after the deck ran out.

Actions, masks, observations and rules are JaxMARL's Hanabi (jaxmarl 0.2.0,
`jaxmarl/environments/hanabi`), value for value: a parity test holds the two to each other.
Actions are discard slot i, play slot i, hint color c to the k-th player after oneself,
hint rank r to the k-th player after oneself, and noop; the player on turn may take its
legal moves, every other player only the noop (JaxMARL's masks), and only the player on
turn is active (`EnvInfo.turn_based`). A player observes the others' hands, which hands miss
a card, the deck's size, the fireworks, the info and life tokens, the discards, the last
action's features and each player's card knowledge (what hints left possible, weighted by
the cards not yet seen discarded or played, and the hints themselves), players in turn
order from itself (JaxMARL's `get_obs`). The global state is every player's observation.

An illegal action (masked: only a caller that ignores masks takes one) passes the turn and
changes nothing else; JaxMARL leaves it undefined. JaxMARL's `shuffle_player_order` is not
offered: with it off (its default) seat i is agent i. A game of the default deck lasts at
most 92 steps (40 draws, 48 hints, a last round of 2; fewer with more players), so
`max_cycles` 100 never cuts one.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from marlctl.envs.batch import Observation
from marlctl.envs.native.base import NativeEnv, group
from marlctl.envs.native.params import integer
from marlctl.envs.signature import FactoryParams


class Hanabi(NativeEnv):
    env_id = "hanabi/2p"
    players = 2
    turn_based = True
    max_cycles = 100

    @classmethod
    def parameters(cls) -> FactoryParams:
        """`build`'s keywords, the hand size at its default for the number of players."""
        own = super().parameters()
        default_hand = 5 if cls.players < 4 else 4
        return FactoryParams({**own.defaults, "hand_size": default_hand}, own.open)

    def build(
        self,
        num_colors: int = 5,
        num_ranks: int = 5,
        hand_size: int | None = None,
        max_info_tokens: int = 8,
        max_life_tokens: int = 3,
        num_cards_of_rank: list[int] | tuple[int, ...] = (3, 2, 2, 2, 1),
    ):
        """JaxMARL's `HanabiEnv` keywords (`num_agents` is the id's number of players)."""
        N = self.N = self.players
        C = self.C = integer("num_colors", num_colors, 1)
        R = self.R = integer("num_ranks", num_ranks, 1)
        default_hand = 5 if N < 4 else 4
        H = self.H = integer("hand_size", default_hand if hand_size is None else hand_size, 1)
        self.max_info = integer("max_info_tokens", max_info_tokens, 0)
        self.max_life = integer("max_life_tokens", max_life_tokens, 1)
        if not isinstance(num_cards_of_rank, list | tuple) or len(num_cards_of_rank) != R:
            raise ValueError(
                f"num_cards_of_rank must be a list of {R} counts (one per rank), "
                f"not {num_cards_of_rank!r}"
            )
        per_rank = [integer("num_cards_of_rank", n, 1) for n in num_cards_of_rank]
        K = self.K = C * R  # card types, color-major: type c * R + r; K is "no card"
        D = self.D = C * sum(per_rank)
        if D < N * H:
            raise ValueError(f"hand_size {H}: {N} hands need {N * H} cards, the deck has {D}")
        dev = self.device
        self.A = 2 * H + (N - 1) * (C + R) + 1
        kinds = torch.arange(K, device=dev)
        self.base_deck = kinds.repeat_interleave(torch.tensor(per_rank * C, device=dev))
        self.full_count = torch.tensor(per_rank * C, device=dev)
        # A card type's color and rank; "no card" has neither (C, R match no hint).
        self.card_color = torch.cat([kinds // R, torch.tensor([C], device=dev)])
        self.card_rank = torch.cat([kinds % R, torch.tensor([R], device=dev)])
        self.entry_color, self.entry_rank = kinds // R, kinds % R
        # Player k after observer i (k = 0 is the observer): observations list players so.
        self.rel = (torch.arange(N).unsqueeze(1) + torch.arange(N)).remainder(N).to(dev)
        # The discards' features: per color, a count of each rank up to its number of cards.
        slots = [(r, s) for r, n in enumerate(per_rank) for s in range(n)]
        self.slot_rank, self.slot_index = torch.tensor(slots, device=dev).unbind(1)
        self.noop_only = torch.zeros(self.A, dtype=torch.bool, device=dev)
        self.noop_only[-1] = True
        self.last_dim = 2 * N + 4 + C + R + 2 * H + K + 2
        self.obs_dim = (
            (N - 1) * H * K + N  # the others' hands, which hands miss a card
            + (D - N * H) + K + self.max_info + self.max_life  # deck, fireworks, tokens
            + C * sum(per_rank)  # discards
            + self.last_dim
            + N * H * (K + C + R)  # card knowledge
        )  # fmt: skip
        # The env computes its own action masks (JaxMARL's `get_legal_moves`).
        agents = replace(group("agent", N, self.obs_dim, self.A), mask_source="env")
        return [agents], N * self.obs_dim

    # ------------------------------------------------------------ start states

    def start(self, n: int) -> dict[str, torch.Tensor]:
        """A shuffled deck per env (a uniform permutation: the order of uniform numbers),
        its first `hand_size` cards to the first player, the next to the second, ...; full
        tokens, and every card type possible for every card."""
        N, H, K, dev = self.N, self.H, self.K, self.device
        # float64 keys: a tie (which would bias the permutation) is all but impossible.
        keys = self._draw(torch.rand, (n, self.D), {"dtype": torch.float64, "device": dev})
        deck = self.base_deck[keys.argsort(1)]

        def zeros(*shape: int, dtype=torch.long) -> torch.Tensor:
            return torch.zeros(n, *shape, dtype=dtype, device=dev)

        return {
            "deck": deck,
            "hands": deck[:, : N * H].reshape(n, N, H),  # K where a slot holds no card
            "know": torch.ones(n, N, H, K, dtype=torch.bool, device=dev),
            "shown_colors": zeros(N, H, self.C, dtype=torch.bool),  # hinted to the holder
            "shown_ranks": zeros(N, H, self.R, dtype=torch.bool),
            "fireworks": zeros(self.C),  # the top rank played per color (0: none)
            "discards": zeros(K),  # discarded cards per type
            "info_tokens": torch.full((n,), self.max_info, device=dev),
            "lives": torch.full((n,), self.max_life, device=dev),
            "dealt": torch.full((n,), N * H, device=dev),  # the deck's top card
            "mover": zeros(),
            "last_round": zeros(),  # steps since the deck ran out
            "over": zeros(dtype=torch.bool),
            "last": zeros(N, self.last_dim, dtype=self.dtype),  # last action, per observer
        }

    # ------------------------------------------------------------ observations

    def observe(self):
        E, N = self.hands.shape[:2]
        own = self.rel[:, 1:]  # [N, N - 1]: the others, in turn order from each observer
        cards = self.hands.unsqueeze(-1) == torch.arange(self.K, device=self.device)
        others = cards[:, own].flatten(2)  # [E, N, (N - 1) * H * K]
        missing = (self.hands == self.K).any(-1)[:, self.rel]  # [E, N, N]
        shared = torch.cat([self._board(), self._discard_feats()], -1).unsqueeze(1)
        belief = self._knowledge()[:, self.rel].flatten(2)  # [E, N, N * H * (K + C + R)]
        obs = torch.cat(
            [others.to(self.dtype), missing.to(self.dtype), shared.expand(-1, N, -1),
             self.last, belief],
            -1,
        )  # fmt: skip
        return {"agent": obs}, obs.flatten(1), {"agent": self.legal()}

    def _board(self) -> torch.Tensor:
        """`[E, ...]`: the deck's size (thermometer), each color's top firework (one-hot),
        the info and life tokens (thermometers)."""
        dev, dtype = self.device, self.dtype
        left = (self.D - self.dealt).unsqueeze(-1)
        deck = torch.arange(self.D - self.N * self.H, device=dev) < left
        top = torch.arange(self.R, device=dev) == (self.fireworks - 1).unsqueeze(-1)
        info = torch.arange(self.max_info, device=dev) < self.info_tokens.unsqueeze(-1)
        lives = torch.arange(self.max_life, device=dev) < self.lives.unsqueeze(-1)
        return torch.cat([deck, top.flatten(1), info, lives], -1).to(dtype)

    def _discard_feats(self) -> torch.Tensor:
        """`[E, C * cards per color]`: per color and rank, a thermometer of its discards."""
        counts = self.discards.view(-1, self.C, self.R)[:, :, self.slot_rank]
        return (counts > self.slot_index).flatten(1).to(self.dtype)

    def _knowledge(self) -> torch.Tensor:
        """`[E, N, H, K + C + R]`: per card, the types its hints leave possible weighted by
        how many of each are neither discarded nor played, normalised (zero for no card);
        then the colors and ranks hinted."""
        played = torch.arange(self.R, device=self.device) < self.fireworks.unsqueeze(-1)
        count = (self.full_count - self.discards - played.flatten(1).long()).to(self.dtype)
        weights = self.know.to(self.dtype) * count[:, None, None]
        # A possible card's own type is always counted: the sum is 0 only for no card. Times
        # the sum's reciprocal, as XLA computes JaxMARL's division (to the last bit).
        total = weights.sum(-1, keepdim=True)
        weights = torch.where(total > 0, weights * (1.0 / total.clamp(min=1)), 0.0)
        return torch.cat(
            [weights, self.shown_colors.to(self.dtype), self.shown_ranks.to(self.dtype)], -1
        )

    def legal(self) -> torch.Tensor:
        """`[E, N, A]`: the legal moves of the player on turn; the noop for the others."""
        dev = self.device
        holding = self.hands != self.K  # [E, N, H]
        colors = self.card_color[self.hands].unsqueeze(-1) == torch.arange(self.C, device=dev)
        ranks = self.card_rank[self.hands].unsqueeze(-1) == torch.arange(self.R, device=dev)
        own = self.rel[:, 1:]
        can_hint = (self.info_tokens > 0).view(-1, 1, 1)
        moves = torch.cat(
            [
                holding & (self.info_tokens < self.max_info).view(-1, 1, 1),  # discard
                holding,  # play
                colors.any(2)[:, own].flatten(2) & can_hint,
                ranks.any(2)[:, own].flatten(2) & can_hint,
                torch.zeros_like(holding[..., :1]),  # noop
            ],
            -1,
        )
        return torch.where(self.to_move().unsqueeze(-1), moves, self.noop_only)

    def to_move(self) -> torch.Tensor:
        """`[E, N]`: the player on turn."""
        return torch.arange(self.N, device=self.device) == self.mover.unsqueeze(-1)

    def _observation(self, seen: tuple | None = None) -> Observation:
        ob = super()._observation(seen)
        # The player on turn, while its game goes on (a final observation has no one).
        return ob._replace(active={"agent": self.to_move() & ~self.over.unsqueeze(-1)})

    # ------------------------------------------------------------ a step

    def advance(self, actions: dict[str, torch.Tensor]):
        N, H, C = self.N, self.H, self.C
        p = self.mover
        a = actions["agent"].long().gather(1, p.unsqueeze(-1)).squeeze(-1)
        inside = a.clamp(0, self.A - 1)
        rows = torch.arange(p.shape[0], device=self.device)
        legal = self.legal()[rows, p].gather(1, inside.unsqueeze(-1)).squeeze(-1) & (a == inside)
        hints = 2 * H + (N - 1) * C  # the first rank hint
        kind = {
            "discard": legal & (a < H),
            "play": legal & (a >= H) & (a < 2 * H),
            "color": legal & (a >= 2 * H) & (a < hints),
            "rank": legal & (a >= hints) & (a < self.A - 1),
        }
        before, info_before = self.fireworks.sum(1), self.info_tokens
        slot, card = self._move_card(rows, p, inside % H, kind)
        hint = self._hint(rows, p, inside - 2 * H, kind)
        after = self.fireworks.sum(1)
        out = self.lives == 0
        # Losing the last life token takes the score back to 0.
        reward = torch.where(out, -after, after - before).to(self.dtype)
        self.last_round = self.last_round + (self.dealt >= self.D)
        self.over = out | (after == self.K) | (self.last_round == N + 1)
        added = kind["play"] & (self.info_tokens > info_before)
        self.last = self._last_action(p, kind, slot, card, hint, after != before, added)
        self.mover = (p + 1) % N
        return {"agent": reward.unsqueeze(-1).expand(-1, N)}, self.over

    def _move_card(
        self, rows: torch.Tensor, p: torch.Tensor, slot: torch.Tensor, kind: dict
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Discard or play the card in `slot` of player `p` where `kind` says so: the
        fireworks, discards and tokens change, the cards behind the slot move up and the
        deck's top card (none once it ran out) takes the last slot. The slot and card."""
        H, K, dev = self.H, self.K, self.device
        discard, play = kind["discard"], kind["play"]
        moved = discard | play
        card = self.hands[rows, p].gather(1, slot.unsqueeze(-1)).squeeze(-1)  # [E]
        color, rank = self.card_color[card], self.card_rank[card]
        level = self.fireworks.gather(1, color.clamp(max=self.C - 1).unsqueeze(-1)).squeeze(-1)
        scored = play & (rank == level)
        missed = play & (rank != level)
        info = self.info_tokens + (discard & (self.info_tokens < self.max_info))
        self.info_tokens = info + (scored & (rank == self.R - 1) & (info < self.max_info))
        same_color = torch.arange(self.C, device=dev) == color.unsqueeze(-1)
        self.fireworks = self.fireworks + (scored.unsqueeze(-1) & same_color)
        same_card = torch.arange(K, device=dev) == card.unsqueeze(-1)
        self.discards = self.discards + ((discard | missed).unsqueeze(-1) & same_card)
        self.lives = self.lives - missed.long()
        top = self.deck.gather(1, self.dealt.clamp(max=self.D - 1).unsqueeze(-1)).squeeze(-1)
        drawn = torch.where(self.dealt < self.D, top, K)
        # In the last round nothing is dealt, and the deck's top stays where it is.
        self.dealt = self.dealt + (moved & (self.last_round == 0))
        h = torch.arange(H, device=dev)
        source = (h + (h >= slot.unsqueeze(-1))).clamp(max=H - 1)  # [E, H]
        last = h == H - 1
        sel = moved.unsqueeze(-1) & (torch.arange(self.N, device=dev) == p.unsqueeze(-1))

        def shift(x: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            """`x` `[E, N, H, ...]` with player p's cards moved up and `new` last."""
            row = x[rows, p]  # [E, H, ...]
            tail = (1,) * (row.dim() - 2)
            moved_up = row.gather(1, source.view(*source.shape, *tail).expand_as(row))
            row = torch.where(last.view(1, H, *tail), new.view(-1, *(1,) * (row.dim() - 1)),
                              moved_up)  # fmt: skip
            return torch.where(sel.view(*sel.shape, 1, *tail), row.unsqueeze(1), x)

        self.hands = shift(self.hands, drawn)
        self.know = shift(self.know, drawn != K)
        no = torch.zeros_like(moved)
        self.shown_colors = shift(self.shown_colors, no)
        self.shown_ranks = shift(self.shown_ranks, no)
        return slot, card

    def _hint(
        self, rows: torch.Tensor, p: torch.Tensor, index: torch.Tensor, kind: dict
    ) -> dict[str, torch.Tensor]:
        """Give the hint `index` (the action less the discards and plays) where `kind` says
        so: the target's cards of the hinted color (rank) become known to be of it, the
        others known not to be, and an info token is spent. The target, the color `[E, C]`
        and rank `[E, R]` hinted (one-hot), and the cards `[E, H]` the hint showed."""
        N, C, R, dev = self.N, self.C, self.R, self.device
        is_color, is_rank = kind["color"], kind["rank"]
        by_rank = index - (N - 1) * C
        after = torch.where(is_color, index // C, by_rank // R)  # the k-th player after p
        hint = torch.where(is_color, index % C, by_rank % R)
        target = (p + 1 + after) % N
        cards = self.hands[rows, target]  # [E, H]
        hint_ = hint.unsqueeze(-1)
        match = torch.where(
            is_color.unsqueeze(-1), self.card_color[cards] == hint_, self.card_rank[cards] == hint_
        )
        entry = torch.where(
            is_color.unsqueeze(-1), self.entry_color == hint_, self.entry_rank == hint_
        )  # [E, K]: the card types of the hinted color (rank)
        keep = entry.unsqueeze(1) == match.unsqueeze(-1)  # [E, H, K]
        hinted = is_color | is_rank
        sel = hinted.unsqueeze(-1) & (torch.arange(N, device=dev) == target.unsqueeze(-1))
        self.know = self.know & (~sel.view(-1, N, 1, 1) | keep.unsqueeze(1))
        color = is_color.unsqueeze(-1) & (torch.arange(C, device=dev) == hint_)  # [E, C]
        rank = is_rank.unsqueeze(-1) & (torch.arange(R, device=dev) == hint_)  # [E, R]
        shown = (sel.unsqueeze(-1) & match.unsqueeze(1)).unsqueeze(-1)  # [E, N, H, 1]
        self.shown_colors = self.shown_colors | (shown & color.view(-1, 1, 1, C))
        self.shown_ranks = self.shown_ranks | (shown & rank.view(-1, 1, 1, R))
        self.info_tokens = self.info_tokens - hinted.long()
        return {
            "target": target,
            "color": color,
            "rank": rank,
            "shown": match & hinted.unsqueeze(-1),
        }

    def _last_action(
        self,
        p: torch.Tensor,
        kind: dict[str, torch.Tensor],
        slot: torch.Tensor,
        card: torch.Tensor,
        hint: dict[str, torch.Tensor],
        scored: torch.Tensor,
        added: torch.Tensor,
    ) -> torch.Tensor:
        """`[E, N, last_dim]`: JaxMARL's features of the action just taken, as each player
        observes them: who acted and whom it hinted (relative to the observer, one-hot), the
        kind of move, the color or rank hinted, the cards the hint showed, the slot and card
        played or discarded, whether the score changed and whether a play won an info token."""
        N, dev = self.N, self.device
        hinted = kind["color"] | kind["rank"]
        moved = kind["discard"] | kind["play"]
        seat = torch.arange(N, device=dev)
        actor = (p.unsqueeze(-1) - seat).remainder(N).unsqueeze(-1) == seat  # [E, N, N]
        aimed = (hint["target"].unsqueeze(-1) - seat).remainder(N).unsqueeze(-1) == seat
        aimed = aimed & hinted.view(-1, 1, 1)
        move = torch.stack([kind["play"], kind["discard"], kind["color"], kind["rank"]], -1)
        rest = torch.cat(
            [
                hint["color"],
                hint["rank"],
                hint["shown"],
                moved.unsqueeze(-1) & (torch.arange(self.H, device=dev) == slot.unsqueeze(-1)),
                moved.unsqueeze(-1) & (torch.arange(self.K, device=dev) == card.unsqueeze(-1)),
                scored.unsqueeze(-1),
                added.unsqueeze(-1),
            ],
            -1,
        )
        E = p.shape[0]
        feats = torch.cat(
            [actor, move.unsqueeze(1).expand(E, N, 4), aimed, rest.unsqueeze(1).expand(E, N, -1)],
            -1,
        )
        return feats.to(self.dtype)


# One class per number of players (`hanabi/2p` is `Hanabi_2p`), as the registry names
# native envs.
for _players in range(2, 6):
    _cls = type(
        f"Hanabi_{_players}p",
        (Hanabi,),
        {"env_id": f"hanabi/{_players}p", "players": _players, "__module__": __name__},
    )
    globals()[_cls.__name__] = _cls
