"""Wall time: the one timing loop the CLI, cost-aware claims and benchmarks share, and where compile time
goes.

Comparisons time their candidates in interleaved rounds (`interleaved_medians`): on a shared
machine the clock and the neighbours change over seconds, and timing one candidate after the
other puts that drift into the ratio.

`record_phases` collects, while it is active, the wall time of every `phase` (nested phases
under their parent's name: ``plan/build/codegen``) and how often each ran; `mark_phase` starts
the next of several consecutive steps inside one (the lowering pipeline's passes). Outside a
recording both cost nothing but a context-variable read.
"""

from __future__ import annotations

import contextvars
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

__all__ = [
    "median_by",
    "median_seconds",
    "warm_up",
    "interleaved_medians",
    "timed_window",
    "PhaseTimes",
    "record_phases",
    "phase",
    "mark_phase",
    "add_phases",
]


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


def timed_window(
    fn: Callable[[], object], span_s: float, min_calls: int = 1, *, settle_s: float = 0.0
) -> tuple[float, ...]:
    """Seconds of each call of one window: untimed calls for `settle_s` (at least one where it is set:
    the previous process's thread pool still spins, and its data left the caches), then timed calls
    until `span_s` has passed and at least `min_calls` ran."""
    if settle_s > 0:
        warm_up(fn, settle_s, 1)
    samples: list[float] = []
    deadline = time.perf_counter() + span_s
    while len(samples) < max(1, min_calls) or time.perf_counter() < deadline:
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return tuple(samples)


def median_by(items: Sequence[T], key: Callable[[T], float]) -> T:
    """The item whose `key` is the median (of an even count, the lower): of passes that time two sides in
    turn, the pass whose ratio is the median (each side's own median would pair different regimes)."""
    return sorted(items, key=key)[(len(items) - 1) // 2]


def interleaved_medians(
    fns: Mapping[str, Callable[[], object]],
    repeat: int = 20,
    *,
    rounds: int = 5,
    warmup: int = 1,
    budget_s: float | None = None,
    warmup_s: float = 0.0,
    settle_s: float = 0.0,
) -> dict[str, float]:
    """Per name, the median over `rounds` of its median of
    `repeat` calls; the rounds alternate between the names.

    With `budget_s`, each round of each name gets an equal share of it (see `median_seconds`).
    `warmup_s`: each name is first called, untimed, for that long (a fresh process ran its first ~100
    calls of a 0.3 ms model at up to 2x). `settle_s`: before each round, untimed calls for that long:
    the previous name's thread pool spins on after its last call and takes a core (the demo model on
    onnxruntime in two sessions, rounds of 20 calls: 1.5-1.8x between them; settled 50 ms: 1.0x).
    """
    for fn in fns.values():
        warm_up(fn, warmup_s)
    share = None if budget_s is None else budget_s / (rounds * max(len(fns), 1))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for k in range(rounds):
        for name, fn in fns.items():
            warm_up(fn, settle_s)
            samples[name].append(median_seconds(fn, repeat, warmup=warmup if k == 0 else 0, budget_s=share))
    return {name: statistics.median(values) for name, values in samples.items()}


def warm_up(fn: Callable[[], object], seconds: float, calls: int = 0) -> None:
    """Untimed calls of `fn` for at least `seconds` and at least `calls` calls (none where both are 0)."""
    deadline, made = time.perf_counter() + seconds, 0
    while time.perf_counter() < deadline or made < calls:
        fn()
        made += 1


@dataclass
class PhaseTimes:
    """Seconds and calls per phase path (``"plan/build/codegen"``), inclusive of the phases under it."""

    seconds: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)
    _stack: list[str] = field(default_factory=list, repr=False)
    _marked: list[tuple[str, float] | None] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, dict[str, float]]:
        return {p: {"seconds": round(s, 4), "calls": self.calls[p]} for p, s in sorted(self.seconds.items())}


_CLOCK: contextvars.ContextVar[PhaseTimes | None] = contextvars.ContextVar("nxrt_tvm_phases", default=None)


@contextmanager
def record_phases(times: PhaseTimes | None = None) -> Iterator[PhaseTimes]:
    """Collect the phases run inside the block (into `times`, or a new record)."""
    times = PhaseTimes() if times is None else times
    token = _CLOCK.set(times)
    try:
        yield times
    finally:
        _CLOCK.reset(token)


def _open(times: PhaseTimes, name: str) -> tuple[str, float]:
    times._stack.append(name)
    path = "/".join(times._stack)
    times.calls[path] += 1
    return path, time.perf_counter()


def _close_mark(times: PhaseTimes) -> None:
    marked = times._marked[-1] if times._marked else None
    if marked is not None:
        path, started = marked
        times.seconds[path] += time.perf_counter() - started
        times._stack.pop()
        times._marked[-1] = None


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as `name`, under the phase it runs in (nothing when no recording is active)."""
    times = _CLOCK.get()
    if times is None:
        yield
        return
    path, started = _open(times, name)
    times._marked.append(None)
    try:
        yield
    finally:
        _close_mark(times)
        times._marked.pop()
        times.seconds[path] += time.perf_counter() - started
        times._stack.pop()


def mark_phase(name: str) -> None:
    """End the current step of the enclosing phase and start step `name` (it ends with the phase)."""
    times = _CLOCK.get()
    if times is None or not times._marked:
        return
    _close_mark(times)
    times._marked[-1] = _open(times, name)


def add_phases(other: Mapping[str, tuple[float, int]]) -> None:
    """Add phases timed elsewhere (a forked build's), as ``{path: (seconds, calls)}``, under the current
    phase."""
    times = _CLOCK.get()
    if times is None:
        return
    prefix = "/".join(times._stack)
    for path, (seconds, calls) in other.items():
        key = f"{prefix}/{path}" if prefix else path
        times.seconds[key] += seconds
        times.calls[key] += calls
