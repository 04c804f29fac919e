"""Compiled regions: the loss computations of a gradient step, each one `torch.compile`d graph.

A region is a trainer method that computes losses from a sampled batch (`hardware.compile:
true` on a replay-based trainer). Compiled whole, its forward pass runs as a few fused
kernels and AOTAutograd compiles its backward the same way: a QMIX gradient step dispatches
65 operators instead of 440 eagerly (`bench/results/ops.md`), and on a GPU the launches of
those operators are most of its time.

Random numbers are what would break such a region apart: a draw from a `torch.Generator`
cannot be traced, and every seed of a run has its own. So a region's first call runs eagerly
and records the draws it makes (`Trainer.noise`: shape, uniform or normal, type); every later
call makes the same draws, from the same generators in the same order, *before* the region,
and the traced region reads them back in order. The numbers are the ones an eager step would
have drawn, and a CUDA graph that captures the step replays the draws as it does any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class Region:
    """`fn`, a method of `trainer`, compiled; the trainer's random draws made ahead of it."""

    def __init__(self, trainer, fn: Callable[..., Any]):
        self.trainer, self.fn = trainer, fn
        self.draws: list[tuple[torch.Size, bool, torch.dtype]] | None = None
        # Compiled as itself: each region is its own code object, with its own cache.
        self.compiled = torch.compile(fn, dynamic=False)

    def __call__(self, *args: Any) -> Any:
        trainer = self.trainer
        if self.draws is None:  # the first call: eager, recording its draws
            trainer._draws = []
            try:
                out = self.fn(*args)
            finally:
                self.draws, trainer._draws = trainer._draws, None
            self._warm_up(args)
            return out
        return self._taped(args)

    def _warm_up(self, args: tuple) -> None:
        """Compile now, on a call whose result is dropped and whose draws are put back: the
        next call may be inside a CUDA graph's capture, where compiling must not happen."""
        generators = self.trainer.generators
        states = [g.get_state() for g in generators]
        try:
            self._taped(args)
        finally:
            for generator, state in zip(generators, states, strict=True):
                generator.set_state(state)

    def _taped(self, args: tuple) -> Any:
        """The compiled call, `noise` handing out numbers drawn just before it."""
        trainer = self.trainer
        trainer._tape = [trainer.noise(*draw) for draw in self.draws]
        try:
            return self.compiled(*args)
        finally:
            trainer._tape = None
