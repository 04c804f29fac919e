"""Agent networks under a parameter-sharing mode, feed-forward or recurrent.

Every algorithm builds its per-group networks here, so `model.sharing` and
`model.recurrent` mean the same thing for all of them:

- shared: one network for the group's agents, the agent's one-hot id appended to its input.
  Fewest parameters and the most data per weight; agents can still act differently.
- independent: one network per agent. No interference between agents' roles; n times the
  parameters and each network sees 1/n of the data.
- federated: one network per agent, replaced by the agents' average every
  `model.federated_every` updates (federated averaging, McMahan et al. 2017, applied across
  agents as in federated MARL): agents never pool raw experience, only weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from marlctl.spec.models import ModelSpec
from marlctl.spec.sections import CnnSpec
from marlctl.train.core import ACTIVATIONS, BatchedMLP, batched_linear, one_hot_ids, select_copy
from marlctl.train.frames import BatchedCNN, scaled


def sharing_of(model: ModelSpec, group: str) -> str:
    sharing = model.sharing
    if isinstance(sharing, dict):
        return sharing.get(group, "shared")
    return sharing or "shared"


class BatchedGRU(nn.Module):
    """`seeds` × `copies` GRU cells (Cho et al. 2014) in batched matmuls, like `BatchedMLP`."""

    def __init__(
        self,
        seeds: int,
        copies: int,
        n_in: int,
        size: int,
        generators: list[torch.Generator],
        init: str = "orthogonal",
    ):
        """init: orthogonal gates and zero biases, or torch (`nn.GRUCell`'s default: every
        weight and bias uniform in ±1/sqrt(size))."""
        super().__init__()
        self.size = size
        w_in = torch.empty(seeds, copies, 3 * size, n_in)
        w_hid = torch.empty(seeds, copies, 3 * size, size)
        b_in = torch.zeros(seeds, copies, 3 * size)
        b_hid = torch.zeros(seeds, copies, 3 * size)
        bound = 1 / math.sqrt(size)
        for s in range(seeds):
            for k in range(copies):
                if init == "torch":
                    for t in (w_in[s, k], w_hid[s, k], b_in[s, k], b_hid[s, k]):
                        nn.init.uniform_(t, -bound, bound, generator=generators[s])
                    continue
                for gate in range(3):
                    rows = slice(gate * size, (gate + 1) * size)
                    nn.init.orthogonal_(w_in[s, k, rows], 1.0, generator=generators[s])
                    nn.init.orthogonal_(w_hid[s, k, rows], 1.0, generator=generators[s])
        self.w_in = nn.Parameter(w_in.transpose(-1, -2).contiguous())
        self.w_hid = nn.Parameter(w_hid.transpose(-1, -2).contiguous())
        self.b_in = nn.Parameter(b_in)
        self.b_hid = nn.Parameter(b_hid)

    def forward(
        self, x: torch.Tensor, h: torch.Tensor, copy: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x `[S, ..., n, in]`, h `[S, ..., n, H]` -> the next h; `copy` as `BatchedMLP`'s."""
        return self.cell(self.input_gates(x, copy), h, copy)

    def input_gates(self, x: torch.Tensor, copy: torch.Tensor | None = None) -> torch.Tensor:
        """The input's share of the gates, `[S, ..., n, 3H]`: it does not depend on the
        state, so a sequence's can be computed for every step at once."""
        return self._linear(x, self.w_in, self.b_in, copy)

    def cell(
        self, gi: torch.Tensor, h: torch.Tensor, copy: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The next state from the input's gates `gi` (`input_gates`) and the state h."""
        gh = self._linear(h, self.w_hid, self.b_hid, copy)
        i_r, i_z, i_n = gi.chunk(3, -1)
        h_r, h_z, h_n = gh.chunk(3, -1)
        reset = torch.sigmoid(i_r + h_r)
        update = torch.sigmoid(i_z + h_z)
        candidate = torch.tanh(i_n + reset * h_n)
        return (1 - update) * candidate + update * h

    def _linear(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, copy: torch.Tensor | None
    ) -> torch.Tensor:
        S, lead, n = x.shape[0], x.shape[1:-2], x.shape[-2]
        if copy is not None:
            w, b = select_copy(w, copy), select_copy(b, copy)
        if w.shape[1] == 1:
            rows = x.reshape(S, -1, x.shape[-1])
        else:
            rows = x.reshape(S, -1, n, x.shape[-1])
        return batched_linear(rows, w, b).view(S, *lead, n, -1)


class AgentNet(nn.Module):
    """The network of one agent group: `[S, ..., n, in]` -> `[S, ..., n, out]`; an input
    every agent shares may come once, `[S, ..., 1, in]` (`_inputs`).

    Recurrent (`model.recurrent: gru`): MLP encoder, GRU cell of the last hidden width, linear
    head, as in the DRQN agents of QMIX (Rashid et al. 2018). `ensemble` > 1 keeps K
    sub-networks per agent (MADDPG's policy ensembles); `member` `[S, ..., n]` picks one.
    """

    def __init__(
        self,
        seeds: int,
        n_agents: int,
        n_in: int,
        n_out: int,
        model: ModelSpec,
        sharing: str,
        generators: list[torch.Generator],
        out_gain: float = 1.0,
        ensemble: int = 1,
        recurrent: bool | None = None,
        frames: tuple[int, int, int] | None = None,
        channels_first: bool = False,
        cnn: CnnSpec | None = None,
    ):
        """frames: `(H, W, C)` of the input (`[C, H, W]` where `channels_first`), which
        `cnn`'s convolutions (default `model.cnn`) read first (`model.encoder: cnn`); None:
        the input goes to the hidden layers as it is."""
        super().__init__()
        self.sharing, self.n, self.ensemble = sharing, n_agents, ensemble
        shared = sharing == "shared"
        self.id_dim = n_agents if shared and n_agents > 1 and model.agent_ids else 0
        self.copies = (1 if shared else n_agents) * ensemble
        self.recurrent = model.recurrent is not None if recurrent is None else recurrent
        hidden, act = list(model.hidden), model.activation
        common = {"activation": act, "generators": generators, "init": model.init}
        self.cnn = None
        if frames is not None:
            if ensemble > 1:
                raise ValueError("model.encoder cnn: not with policy ensembles")
            self.cnn = BatchedCNN(
                seeds, self.copies, frames, cnn or model.cnn, generators, model.init,
                channels_first,
            )  # fmt: skip
            n_in = self.cnn.features
        n_in += self.id_dim
        if self.recurrent:
            size = hidden[-1]
            self.activation = ACTIVATIONS[act]
            self.encoder = BatchedMLP(
                seeds, self.copies, n_in, hidden[:-1], size, layer_norm=model.layer_norm,
                out_gain=math.sqrt(2), **common,
            )  # fmt: skip
            self.gru = BatchedGRU(seeds, self.copies, size, size, generators, model.init)
            self.head = BatchedMLP(
                seeds, self.copies, size, [], n_out, layer_norm=False, out_gain=out_gain, **common
            )
            self.hidden_size = size
        else:
            self.mlp = BatchedMLP(
                seeds, self.copies, n_in, hidden, n_out, layer_norm=model.layer_norm,
                out_gain=out_gain, **common,
            )  # fmt: skip
            self.hidden_size = 0

    @property
    def same_for_every_agent(self) -> bool:
        """One network, no agent ids, no memory: equal inputs give every agent the same
        output, so a caller whose input is every agent's can run it once and broadcast."""
        return self.sharing == "shared" and not self.id_dim and not self.recurrent

    @property
    def convolves_once(self) -> bool:
        """One network with convolutions: an input every agent shares, given once as
        `[S, ..., 1, in]`, is convolved once and its features go to each agent (unless the
        network is `same_for_every_agent`: then its output stays `[S, ..., 1, out]`)."""
        return self.cnn is not None and self.copies == 1

    def initial_state(self, seeds: int, *lead: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(seeds, *lead, self.n, self.hidden_size, device=device)

    def forward(
        self,
        x: torch.Tensor,
        h: torch.Tensor | None = None,
        member: torch.Tensor | None = None,
        copy: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One step: output, and the next hidden state (None when feed-forward).

        `copy` `[S]` (a network per agent): only agent `copy[s]`'s network of each seed, on
        that agent's input `[S, ..., 1, in]`, as where agents update one at a time.
        """
        copy = self._own_copy(copy)
        x = self._inputs(x, copy)
        if self.ensemble > 1:
            return self._ensemble(x, member), None
        if not self.recurrent:
            return self.mlp(x, copy), None
        h = self.gru(self.activation(self.encoder(x, copy)), h, copy)
        return self.head(h, copy), h

    def sequence(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        first: torch.Tensor,
        copy: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A recurrent network through whole sequences: x `[S, B, T, n, in]` from state h
        `[S, B, n, H]`, zeroed where `first` `[S, B, T]` starts an episode -> the outputs
        `[S, B, T, n, out]`, as `forward` step by step. The encoder, the GRU's input gates
        and the head run on every step at once; only the state's product is per step."""
        copy = self._own_copy(copy)
        gi = self.gru.input_gates(self.activation(self.encoder(self._inputs(x, copy), copy)), copy)
        states = []
        # unbind: one gradient for all the steps' slices (indexing step by step would give
        # each slice's backward a zeroed tensor the size of the whole sequence)
        for gi_t, first_t in zip(gi.unbind(2), first.unbind(2), strict=True):
            h = self.gru.cell(gi_t, reset_where(h, first_t), copy)
            states.append(h)
        return self.head(torch.stack(states, 2), copy)

    def _own_copy(self, copy: torch.Tensor | None) -> torch.Tensor | None:
        """`copy` where the agents have networks of their own; None where one serves all."""
        return None if self.copies == 1 else copy

    def _inputs(self, x: torch.Tensor, copy: torch.Tensor | None = None) -> torch.Tensor:
        """What the hidden layers take: frames scaled and through the convolutions, then
        the agent ids. An input `[S, ..., 1, in]` without `copy` is one every agent shares
        (the global state): it goes to each of the n agents, after the convolutions where
        one network has them (`convolves_once`), before them where each has its own."""
        x = scaled(x)
        shared = copy is None and x.shape[-2] == 1 < self.n and not self.same_for_every_agent
        if shared and not self.convolves_once:
            x = self._each_agent(x)
        if self.cnn is not None:
            x = self._convolved(x, copy)
        if shared:
            x = self._each_agent(x)  # as it is where it went to each agent already
        return self._with_ids(x)

    def _each_agent(self, x: torch.Tensor) -> torch.Tensor:
        """`[S, ..., 1, F]` as each agent's, `[S, ..., n, F]` (a view)."""
        return x.expand(*x.shape[:-2], self.n, x.shape[-1])

    def _convolved(self, x: torch.Tensor, copy: torch.Tensor | None) -> torch.Tensor:
        """Flattened frames `[S, ..., n, H * W * C]` -> features `[S, ..., n, F]`: each agent's
        through its own network, or every agent's through the one they share."""
        S, lead, n = x.shape[0], x.shape[1:-2], x.shape[-2]
        frames = x.reshape(S, -1, n, x.shape[-1])  # [S, B, n, frame]
        if self.copies == 1 or copy is not None:
            pick = None if copy is None else (lambda p: select_copy(p, copy))
            out = self.cnn(frames.reshape(S, 1, -1, x.shape[-1]), pick)
            return out.reshape(S, *lead, n, -1)
        out = self.cnn(frames.transpose(1, 2))  # [S, n, B, F]
        return out.transpose(1, 2).reshape(S, *lead, n, -1)

    def _with_ids(self, x: torch.Tensor) -> torch.Tensor:
        if not self.id_dim:
            return x
        ids = one_hot_ids(self.id_dim, x.device).expand(*x.shape[:-2], -1, -1)
        return torch.cat([x, ids], dim=-1)

    def every_member(self, x: torch.Tensor) -> torch.Tensor:
        """Feed-forward ensembles: every member's output `[S, ..., n, K, out]` in one call
        (e.g. twin critics)."""
        return self._members(self._inputs(x))

    def every_member_once(self, x: torch.Tensor) -> torch.Tensor:
        """`every_member` for an input `[S, ..., in]` that every agent shares, on a network
        `same_for_every_agent`: one pass, broadcast to `[S, ..., n, K, out]`."""
        out = self.every_member(x.unsqueeze(-2))
        return out.expand(*out.shape[:-3], self.n, *out.shape[-2:])

    def _members(self, x: torch.Tensor) -> torch.Tensor:
        K, n = self.ensemble, self.n
        x = x.unsqueeze(-2).expand(*x.shape[:-1], K, x.shape[-1])  # [S, ..., n, K, in]
        if self.sharing == "shared":
            return self.mlp(x)
        # copies are agent-major: agent * K + k
        return self.mlp(x.flatten(-3, -2)).view(*x.shape[:-3], n, K, -1)

    def _ensemble(self, x: torch.Tensor, member: torch.Tensor | None) -> torch.Tensor:
        out = self._members(x)
        if member is None:
            member = torch.zeros(out.shape[:-2], dtype=torch.long, device=out.device)
        index = member[..., None, None].expand(*member.shape, 1, out.shape[-1])
        return out.gather(-2, index).squeeze(-2)

    @torch.no_grad()
    def average_agents(self) -> None:
        """Federated averaging: every agent's network becomes the agents' mean."""
        if self.sharing == "shared" or self.n == 1:
            return
        for p in self.parameters():
            grouped = p.view(p.shape[0], self.n, self.ensemble, *p.shape[2:])
            p.copy_(grouped.mean(1, keepdim=True).expand_as(grouped).reshape(p.shape))


def reset_where(h: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Zero the hidden state `[S, ..., n, H]` where a new episode starts (`first` `[S, ...]`)."""
    keep = (~first).to(h.dtype)
    return h * keep.view(*keep.shape, *([1] * (h.dim() - keep.dim())))
