"""nxrt_tvm.timing: the windows the real-model benchmark times its runtimes in."""

from __future__ import annotations

import time

from nxrt_tvm.timing import timed_windows


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
