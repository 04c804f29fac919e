"""Timing a trainer's iterations as they run for the rest of training: filled until steady
(a replay buffer past `learning_starts`, a captured graph replaying), then timed with the device
synchronised around the timed block only. `marlctl bench` measures with these, and so does a
suite's dry run (`reproduce.estimate`)."""

from __future__ import annotations

import time
from collections.abc import Callable

# Iterations a bench point runs before it times any: enough for a replay buffer to reach
# `learning_starts` at the smallest sizes, not so many that a huge `learning_starts` stalls.
MAX_FILL_ITERATIONS = 10_000


def steady(trainer, graph: bool) -> bool:
    """Iterations now run as they will for the rest of training."""
    ready = getattr(trainer, "ready", None)
    if ready is not None and not ready():
        return False
    if graph:
        captured = trainer.graph
        return captured.graph is not None or captured.failed is not None
    return trainer.iteration > 0


def timed(
    fn: Callable[[], object], seconds: float, device, warmup: int = 3
) -> tuple[int, float, bool, float]:
    """Call `fn` for about `seconds` after `warmup` calls; (calls, elapsed, slow, warm-up
    seconds). Syncs the device only around the timed block, so asynchronous CUDA work is
    measured end to end. Slow: one call took longer than `seconds`, so one timed call is all
    there is."""
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    sync(device)
    warm = time.perf_counter() - start
    start = time.perf_counter()
    fn()
    sync(device)
    first = time.perf_counter() - start
    if first > seconds:
        return 1, first, True, warm
    calls = 1 + max(0, int((seconds - first) / max(first, 1e-9)))
    for _ in range(calls - 1):
        fn()
    sync(device)
    return calls, time.perf_counter() - start, False, warm


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
