"""nxrt_tvm.timing: the windows the real-model benchmark times its runtimes in, interleaved rounds."""

from __future__ import annotations

import time

from nxrt_tvm.timing import interleaved_medians, timed_window


def test_a_window_spans_the_time_asked_after_its_untimed_settling_calls():
    calls = []

    def fn():  # the first calls after a switch are slow, as another process's spinning pool makes them
        calls.append(None)
        time.sleep(0.004 if len(calls) <= 3 else 0.0)

    started = time.perf_counter()
    samples = timed_window(fn, 0.05, 2, settle_s=0.02)
    assert time.perf_counter() - started >= 0.05 + 0.012
    assert len(calls) > len(samples) >= 2  # the settling calls are not among the samples
    assert max(samples) < 0.004


def test_at_least_the_minimum_calls_however_short_the_span():
    assert len(timed_window(lambda: None, 0.0, 4)) == 4
    assert len(timed_window(lambda: None, 0.0)) == 1


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
