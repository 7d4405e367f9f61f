"""nxrt_tvm.timing: the windows the real-model benchmark times its runtimes in."""

from __future__ import annotations

import time

from nxrt_tvm.timing import interleaved_medians, timed_windows


def test_windows_span_the_time_asked_and_the_best_is_the_fastest_window():
    calls = []

    def fn():  # the first window's calls are slow, as a neighbour's second of load makes them
        calls.append(None)
        time.sleep(0.004 if len(calls) <= 5 else 0.0)

    started = time.perf_counter()
    windows = timed_windows(fn, 5, span_s=0.05)
    assert time.perf_counter() - started >= 0.05
    assert len(calls) == 5 * len(windows.window_medians_s) and len(windows.window_medians_s) >= 2
    assert windows.window_medians_s[0] >= 0.004
    assert windows.best_s == min(windows.window_medians_s[1:]) < 0.004
    assert windows.best_s <= windows.median_s


def test_at_least_the_minimum_windows_however_short_the_span():
    windows = timed_windows(lambda: None, 3, span_s=0.0, min_windows=4)
    assert len(windows.window_medians_s) == 4


def test_interleaved_rounds_are_settled_before_they_are_timed():
    """Each round of a name runs untimed for `settle_s` first: a runtime just switched to is slowed by the
    other's spinning thread pool (here: its first 3 calls after the switch are slow)."""
    state = {"last": "", "run": 0}  # the name called last, and its calls since the switch to it

    def runtime(name: str):
        def fn():
            state["run"] = state["run"] + 1 if state["last"] == name else 1
            state["last"] = name
            time.sleep(0.003 if state["run"] <= 3 else 0.0)

        return fn

    unsettled = interleaved_medians({"a": runtime("a"), "b": runtime("b")}, 3, rounds=3)
    settled = interleaved_medians({"a": runtime("a"), "b": runtime("b")}, 3, rounds=3, settle_s=0.02)
    assert min(unsettled.values()) >= 0.003
    assert max(settled.values()) < 0.003
