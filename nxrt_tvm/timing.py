"""Median wall time of a call: the one timing loop the CLI, cost-aware claims and benchmarks share.

Comparisons time their candidates in interleaved rounds (`interleaved_medians`): on a shared
machine the clock and the neighbours change over seconds, and timing one candidate after the
other puts that drift into the ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

__all__ = ["median_seconds", "interleaved_medians"]


def median_seconds(
    fn: Callable[[], object], repeat: int = 20, *, warmup: int = 1, budget_s: float | None = None
) -> float:
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


def interleaved_medians(
    fns: Mapping[str, Callable[[], object]],
    repeat: int = 20,
    *,
    rounds: int = 5,
    warmup: int = 1,
    budget_s: float | None = None,
) -> dict[str, float]:
    """Per name, the median over `rounds` of its median of
    `repeat` calls; the rounds alternate between the names.

    With `budget_s`, each round of each name gets an equal share of it (see `median_seconds`).
    """
    share = None if budget_s is None else budget_s / (rounds * max(len(fns), 1))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for k in range(rounds):
        for name, fn in fns.items():
            samples[name].append(median_seconds(fn, repeat, warmup=warmup if k == 0 else 0, budget_s=share))
    return {name: statistics.median(values) for name, values in samples.items()}
