"""Hyperparameters of their own for the rows of a batch.

A trainer trains its seeds as one batch: every weight, optimiser moment and random stream
has a leading row dimension. The rows may also differ in the continuous hyperparameters an
algorithm reads as numbers (a learning rate, a loss weight, a clip range, a discount): each
row then trains exactly as a run of its own values would, so that several trials of a sweep
train as one batch. `RowValues` holds those values; a trainer reads `values.of(name)`, which
is the config's float where no row names the field (the code path of an unbatched run) and a
tensor `[S]` where one does, and `RowAdam` steps each row with its own learning rate. A batch
of rows and a batch of one of them alone take the same code path, so that they compute the
same numbers; an unbatched run's fused Adam rounds a little differently from `RowAdam`.
"""

from __future__ import annotations

import torch

from marlctl.algos.ppo import PPOConfig
from marlctl.algos.qmix import QLearningConfig
from marlctl.train.core import per_seed

# What each trainer family reads per row, by the config field's name (its configs say).
ON_POLICY = PPOConfig.row_fields
Q_LEARNING = QLearningConfig.row_fields


class RowValues:
    """Per-row values of the hyperparameters `fields` of `config`: `rows[i]` overrides row
    i's (a field it does not name keeps the config's value)."""

    def __init__(
        self, config, fields: tuple[str, ...], rows: list[dict] | None, seeds: int, device
    ):
        self.config, self.seeds = config, seeds
        self._given: dict[str, list[float]] = {}  # the rows' values as given
        self._tensors: dict[tuple[str, torch.dtype], torch.Tensor] = {}  # made once each
        self._device = device
        if not rows:
            return
        if len(rows) != seeds:
            raise ValueError(f"{len(rows)} rows of hyperparameters for {seeds} seeds")
        named = {k for row in rows for k in row}
        unknown = sorted(named - set(fields))
        if unknown:
            raise ValueError(
                f"{type(config).__name__} does not take {', '.join(unknown)} per row; "
                f"it takes {', '.join(fields)}"
            )
        if "lr" in named and "critic_lr" in fields:
            named.add("critic_lr")  # null follows the actors' rate, row by row
        for name in fields:
            if name not in named:
                continue  # the config's, as unbatched
            own = [row.get(name, getattr(config, name)) for row in rows]
            if name == "critic_lr":
                own = [rate if rate is not None else row.get("lr", config.lr)
                       for rate, row in zip(own, rows, strict=True)]  # fmt: skip
            self._given[name] = [float(v) for v in own]
            self.tensor(name)  # made now, not inside a captured iteration

    def set(self, name: str, row: int, value: float) -> None:
        """Row `row`'s `name` is `value` from now on (population-based training), in place: a
        captured graph reads it. The actors' rate carries the critics' along where the
        critics' rate follows it."""
        if name not in self._given:
            raise ValueError(f"{name} is not a value of its own on every row")
        follows = (
            name == "lr"
            and "critic_lr" in self._given
            and getattr(self.config, "critic_lr", 0) is None
            and self._given["critic_lr"][row] == self._given["lr"][row]
        )
        for field in ("lr", "critic_lr") if follows else (name,):
            self._given[field][row] = float(value)
            for (key, _), tensor in self._tensors.items():
                if key == field:
                    tensor[row] = float(value)

    def keep(self, keep: list[int]) -> None:
        """Only rows `keep` go on (`marlctl.train.compact`): each keeps its values."""
        self.seeds = len(keep)
        self._given = {name: [own[i] for i in keep] for name, own in self._given.items()}
        index = torch.tensor(keep, device=self._device)
        self._tensors = {key: t.index_select(0, index) for key, t in self._tensors.items()}

    def differ(self, *names: str) -> bool:
        """Whether any row names any of `names` (then each row has its own value)."""
        return any(name in self._given for name in names)

    def of(self, name: str) -> float | torch.Tensor:
        """The config's value, or `[S]`: one per row where a row names the field."""
        if name not in self._given:
            return getattr(self.config, name)
        return self.tensor(name)

    def tensor(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """`[S]` on the device, one value per row (the config's on every row where no row
        names the field); made once: reading it copies nothing to the device."""
        key = (name, dtype)
        if key not in self._tensors:
            found = self._given.get(name, [getattr(self.config, name)] * self.seeds)
            self._tensors[key] = torch.tensor(found, dtype=dtype, device=self._device)
        return self._tensors[key]

    def along(self, name: str, like: torch.Tensor) -> float | torch.Tensor:
        """`of(name)`, shaped to broadcast against the row-first tensor `like`."""
        value = self.of(name)
        return value if isinstance(value, float | int) else per_seed(value, like)


class RowAdam(torch.optim.Optimizer):
    """Adam (Kingma & Ba 2015) with a learning rate per row: group `i`'s rows step with
    `rates[i]` `[S]`, kept in float64 so that a row's checkpoint names its rate as given. The
    update is torch's Adam's (bias-corrected moments, `eps` added to the corrected root), and
    the state keeps its names, so checkpoints load in either."""

    def __init__(
        self,
        groups: list[list[torch.Tensor]],
        rates: list[torch.Tensor],
        eps: float,
        betas: tuple[float, float] = (0.9, 0.999),
        names: tuple[str, ...] = ("lr",),
    ):
        # torch's Adam's settings beside the rates: a row's checkpoint loads into it.
        defaults = {
            "lr": 0.0,
            "betas": betas,
            "eps": eps,
            "weight_decay": 0.0,
            "amsgrad": False,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": None,
            "decoupled_weight_decay": False,
        }
        super().__init__(
            [{"params": params, "lr": float(rate[0])} for params, rate in zip(groups, rates,
                                                                              strict=True)],
            defaults,
        )  # fmt: skip
        self.rates = [rate.clone() for rate in rates]
        self.base = [rate.clone() for rate in rates]  # `scale` multiplies these
        self.fractions = [1.0] * len(rates)
        self.names = names  # the config field each group's rate is

    def row_groups(self, groups: list[dict], index: int) -> list[dict]:
        """Saved parameter groups `groups` as row `index` alone would have saved them: its
        own rates."""
        return [{**g, "lr": float(rate[index])} for g, rate in zip(groups, self.rates,
                                                                   strict=True)]  # fmt: skip

    def scale(self, index: int, fraction: float) -> None:
        """Group `index`'s rates at `fraction` of their starting values (a decay)."""
        self.fractions[index] = fraction
        self.rates[index].copy_(self.base[index] * fraction)

    def set_rate(self, name: str, row: int, rate: float) -> None:
        """Row `row`'s starting rate of the group whose rate is config field `name`."""
        if name in self.names:
            index = self.names.index(name)
            self.base[index][row] = rate
            self.rates[index][row] = rate * self.fractions[index]

    def keep(self, index: torch.Tensor) -> None:
        """Only rows `index` go on: the others' rates leave every group."""
        self.rates = [rate.index_select(0, index.to(rate.device)) for rate in self.rates]
        self.base = [rate.index_select(0, index.to(rate.device)) for rate in self.base]

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("RowAdam takes no closure")
        for group, rate in zip(self.param_groups, self.rates, strict=True):
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                # Tensors throughout, the step count too: no host sync (a CUDA graph replays
                # it); the bias corrections in float64, as torch's Adam takes them.
                state["step"] += 1
                t = state["step"].double()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.lerp_(p.grad, 1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (v.sqrt() / (1 - beta2**t).sqrt().to(p.dtype)).add_(group["eps"])
                size = per_seed((rate / (1 - beta1**t)).to(p.dtype), p)
                p.sub_(size * m / denom)
