"""Training iterations captured as one CUDA graph (`hardware.compile` on a GPU).

An on-policy iteration on a native env (rollout, advantages, every minibatch update) is
thousands of small kernels; launched one by one from Python the GPU idles between them.
Captured once, an iteration replays as one graph: its kernels run back to back, with no
launch gaps and no host involvement. What a capture needs, and how it is met:

- Fixed shapes and no host syncs: native envs step in their graph-safe mode (step counts on
  the device, ended envs restarted by a masked select), and nothing in an iteration reads
  a value back to the host.
- State that outlives an iteration keeps its address: every tensor attribute the iteration
  replaces (env state, the first-step flags, recurrent states) is copied back, inside the
  graph, into the tensor that held it before, which the next replay reads. Parameters,
  optimiser moments and running statistics are updated in place already.
- Random numbers: every seed's generators, the trainer's and the env's, are registered with
  the graph, so each replay draws the next numbers of each seed's own stream.
- Host-side counters the iteration advances (gradient steps) advance by the captured
  amount on each replay.

The first iteration runs eagerly on a side stream (it initialises cuBLAS, autograd and the
optimiser state); the second is captured, then replayed; every later one is a replay. The
outputs of `run` are the graph's own tensors: they hold until the next replay. A capture
that fails (an operation CUDA graphs do not allow) runs nothing: the host state is put
back, the iteration and every later one run eagerly, and `failed` says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

Slot = tuple[Any, str, Any, int | None]  # (owner, attribute, dict key or None, tuple index)


def _slots(roots: list[Any]) -> dict[Slot, torch.Tensor]:
    """Every tensor held by the roots' attributes, directly, in a dict, or in a tuple that
    is a dict value (recurrent states)."""
    found: dict[Slot, torch.Tensor] = {}
    for root in roots:
        for name, value in vars(root).items():
            if torch.is_tensor(value):
                found[(root, name, None, None)] = value
            elif isinstance(value, dict):
                for key, item in value.items():
                    if torch.is_tensor(item):
                        found[(root, name, key, None)] = item
                    elif isinstance(item, tuple) and all(torch.is_tensor(t) for t in item):
                        for index, t in enumerate(item):
                            found[(root, name, key, index)] = t
    return found


def _get(slot: Slot) -> torch.Tensor | None:
    owner, name, key, index = slot
    value = getattr(owner, name, None)
    if key is not None:
        value = value.get(key) if isinstance(value, dict) else None
    if index is not None:
        value = value[index] if isinstance(value, tuple) and len(value) > index else None
    return value if torch.is_tensor(value) else None


def _set(slot: Slot, tensor: torch.Tensor) -> None:
    owner, name, key, index = slot
    if key is None:
        setattr(owner, name, tensor)
        return
    holder = getattr(owner, name)
    if index is None:
        holder[key] = tensor
    else:
        items = list(holder[key])
        items[index] = tensor
        holder[key] = tuple(items)


class IterationGraph:
    """Runs an iteration function eagerly once, then as a captured CUDA graph.

    roots: the objects whose tensor attributes carry state between iterations (the trainer,
    its episode statistics, the env). counters: `(owner, attribute)` integers the iteration
    advances on the host.
    """

    def __init__(
        self,
        roots: list[Any],
        generators: list[torch.Generator],
        counters: list[tuple[Any, str]],
    ):
        self.roots, self.generators, self.counters = roots, generators, counters
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        self.calls = 0
        self.capture_seconds = 0.0  # wall-clock of the capture itself
        self.failed: str | None = None  # why the capture failed: iterations then run eagerly
        self._advance: list[int] = []

    def run(self, fn: Callable[[], Any]) -> Any:
        self.calls += 1
        if self.graph is not None:
            for (owner, name), step in zip(self.counters, self._advance, strict=True):
                setattr(owner, name, getattr(owner, name) + step)
            self.graph.replay()
            return self.outputs
        if self.calls == 1 or self.failed:
            return self._warm_up(fn)
        return self._capture(fn)

    def _warm_up(self, fn: Callable[[], Any]) -> Any:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = fn()
        torch.cuda.current_stream().wait_stream(side)
        return out

    def _capture(self, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the graph's pool cannot reuse blocks the eager run cached
        before = _slots(self.roots)
        counts = [getattr(owner, name) for owner, name in self.counters]
        graph = torch.cuda.CUDAGraph()
        for generator in self.generators:
            graph.register_generator_state(generator)

        def body() -> Any:
            out = fn()
            for slot, old in before.items():
                new = _get(slot)
                if new is None or new is old:
                    continue
                if new.shape != old.shape or new.dtype != old.dtype:
                    raise RuntimeError(f"{slot[1]} changed shape or type within an iteration")
                old.copy_(new)
            return out

        try:
            with torch.cuda.graph(graph):
                outputs = body()
        except Exception as error:  # nothing ran: put the host state back, go on eagerly
            self.failed = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            for (owner, name), count in zip(self.counters, counts, strict=True):
                setattr(owner, name, count)
            for slot, old in before.items():
                _set(slot, old)
            torch.cuda.synchronize()
            return self._warm_up(fn)
        for slot, old in before.items():  # the persistent tensors, which the graph updates
            _set(slot, old)
        self._advance = [
            getattr(owner, name) - count
            for (owner, name), count in zip(self.counters, counts, strict=True)
        ]
        self.graph, self.outputs = graph, outputs
        graph.replay()
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        return outputs
