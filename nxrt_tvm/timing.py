"""Median wall time of a call: the one timing loop the CLI, cost-aware claims and benchmarks share."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["median_seconds"]


def median_seconds(fn: Callable[[], object], repeat: int = 20, *, warmup: int = 1, budget_s: float | None = None) -> float:
    """Median of up to `repeat` timed calls after `warmup` untimed ones.

    With `budget_s`, stops early once that much time has passed (but after at least 3 calls).
    """
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    while len(samples) < max(1, repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
        if deadline is not None and len(samples) >= 3 and time.perf_counter() > deadline:
            break
    return statistics.median(samples)
